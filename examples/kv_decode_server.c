/* SPDX-License-Identifier: MIT */
/* The decode half of the pair (with kv_prefill_server.c): it opens the prefill server's shared
 * pool as a participant of its own, sends a prompt over the prefill server's UNIX socket, gets
 * back a 48-byte handle, imports the sequence and reads every block in place (no copy), then
 * says DONE. Here "decoding" is a toy attention pass over layer 0's keys of every token.
 *   kv_decode_server SOCKET DEVICE "PROMPT" */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"

static int fail(const char* what) {
  fprintf(stderr, "kv_decode_server: %s: %s\n", what, cxlpool_last_error_message());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: kv_decode_server SOCKET DEVICE PROMPT\n");
    return 2;
  }
  cxlpool_shared_pool_t* pool = NULL;
  if (cxlpool_shared_pool_open(argv[2], NULL, &pool) != CXLPOOL_OK) return fail(argv[2]);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
  if (s < 0 || connect(s, (struct sockaddr*)&sa, sizeof sa) != 0) {
    perror("kv_decode_server: connect");
    return 1;
  }
  FILE* in = fdopen(s, "r");
  FILE* out = fdopen(dup(s), "w"); /* one stream per direction: a socket cannot seek */
  if (!in || !out) return fail("fdopen");
  fprintf(out, "%s\n", argv[3]);
  fflush(out);
  char line[256] = "";
  cxlpool_kv_handle_t h;
  if (!fgets(line, sizeof line, in) || strncmp(line, "HANDLE ", 7) != 0) {
    fprintf(stderr, "kv_decode_server: prefill answered %s", line);
    return 1;
  }
  unsigned char* p = (unsigned char*)&h;
  for (size_t i = 0; i < sizeof h; ++i) {
    unsigned v = 0;
    if (sscanf(line + 7 + 2 * i, "%2x", &v) != 1) return fprintf(stderr, "kv_decode_server: bad handle\n"), 1;
    p[i] = (unsigned char)v;
  }
  cxlpool_kv_geometry_t expected;
  cxlpool_kv_geometry_preset("llama-3-8b", 16, &expected);
  cxlpool_kv_view_t* view = NULL;
  if (cxlpool_kv_import(&pool, 1, &expected, &h, &view) != CXLPOOL_OK) return fail("import");
  cxlpool_kv_view_info_t info;
  cxlpool_kv_view_info(view, &info);
  /* Toy attention over layer 0: the keys of every token, read where prefill wrote them. */
  double score = 0;
  const size_t per_token_keys = (size_t)info.geometry.kv_heads * info.geometry.head_dim;
  for (uint64_t t = 0; t < info.tokens; ++t) {
    const void* block = NULL;
    uint64_t offset = 0;
    cxlpool_kv_view_block(view, t / info.geometry.tokens_per_block, &block);
    cxlpool_kv_block_offset(&info.geometry, 0, 0, (uint32_t)(t % info.geometry.tokens_per_block), &offset);
    const uint16_t* k = (const uint16_t*)((const char*)block + offset);
    for (size_t i = 0; i < per_token_keys; ++i) score += k[i] * 1e-6;
  }
  printf("decode: read %llu tokens in place (%llu blocks of %llu bytes), layer-0 key score %.3f\n",
         (unsigned long long)info.tokens, (unsigned long long)info.blocks, (unsigned long long)info.bytes_per_block,
         score);
  cxlpool_kv_view_release(view);
  fprintf(out, "DONE\n");
  fclose(out);
  fclose(in);
  cxlpool_shared_pool_close(pool);
  return 0;
}

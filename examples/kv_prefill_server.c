/* SPDX-License-Identifier: MIT */
/* The prefill half of a disaggregated inference pair (with kv_decode_server.c): it owns a
 * shared pool and a KV block arena, and for every decode server that connects to its UNIX
 * socket it "prefills" the prompt it is sent (a toy tokenizer: one token per byte; toy keys
 * and values derived from the tokens) into KV blocks, exports the sequence and answers with the
 * 48-byte handle (as hex). The decode server reads the blocks in place and says DONE; then the
 * sequence is destroyed (the decode server's leases would keep the blocks alive anyway).
 *   kv_prefill_server SOCKET DEVICE REQUESTS   e.g. /tmp/kv.sock shm:kv-example 2
 * Prefix caching is on: a prompt that starts like an earlier one reuses its whole blocks. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"

static int fail(const char* what) {
  fprintf(stderr, "kv_prefill_server: %s: %s\n", what, cxlpool_last_error_message());
  return 1;
}

/* Toy "prefill": every element of block b of layer l is derived from the tokens it holds. */
static void prefill_block(void* data, uint64_t bytes, const int32_t* tokens, size_t n) {
  uint16_t* e = (uint16_t*)data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ (uint64_t)tokens[i]) * 1099511628211ull;
  for (uint64_t i = 0; i < bytes / 2; ++i) e[i] = (uint16_t)((h >> (i % 48)) + i);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: kv_prefill_server SOCKET DEVICE REQUESTS\n");
    return 2;
  }
  const char* sock_path = argv[1];
  const char* device = argv[2];
  int requests = atoi(argv[3]);
  /* A small GQA model keeps the example light: Llama-3-8B, 128 KiB per token. */
  cxlpool_kv_geometry_t g;
  if (cxlpool_kv_geometry_preset("llama-3-8b", 16, &g) != CXLPOOL_OK) return fail("geometry");
  uint64_t per_token = 0, per_block = 0;
  cxlpool_kv_geometry_sizes(&g, &per_token, &per_block);
  cxlpool_shared_params_t* params = NULL;
  cxlpool_shared_pool_t* pool = NULL;
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK ||
      cxlpool_shared_params_set_size(params, 512ull << 20) != CXLPOOL_OK ||
      cxlpool_shared_pool_create(device, params, 0, &pool) != CXLPOOL_OK)
    return fail(device); /* an existing pool of that name is refused, never taken over */
  cxlpool_shared_params_destroy(params);
  cxlpool_kv_arena_t* arena = NULL;
  if (cxlpool_kv_arena_create(&g, &pool, 1, NULL, &arena) != CXLPOOL_OK) return fail("arena");

  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(sock_path) >= sizeof sa.sun_path) { /* cut short, it would name another file */
    fprintf(stderr, "kv_prefill_server: socket path longer than %zu bytes\n", sizeof sa.sun_path - 1);
    cxlpool_kv_arena_destroy(arena);
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(device); /* ours: made above */
    return 2;
  }
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  /* bind never replaces an existing name (EADDRINUSE); the socket's identity is kept so that
     only it is removed at the end, not whatever has its name by then. */
  struct stat bound;
  if (ls < 0 || bind(ls, (struct sockaddr*)&sa, sizeof sa) != 0 || lstat(sock_path, &bound) != 0 ||
      listen(ls, 4) != 0) {
    perror("kv_prefill_server: socket");
    cxlpool_kv_arena_destroy(arena);
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(device); /* ours: made above */
    return 1;
  }
  printf("prefill: pool %s, %s-like geometry (%llu bytes per token), listening on %s\n", device, "llama-3-8b",
         (unsigned long long)per_token, sock_path);
  fflush(stdout);
  for (int r = 0; r < requests; ++r) {
    int c = accept(ls, NULL, NULL);
    if (c < 0) continue;
    FILE* in = fdopen(c, "r");
    FILE* out = fdopen(dup(c), "w"); /* one stream per direction: a socket cannot seek */
    char prompt[4096];
    if (!in || !out || !fgets(prompt, sizeof prompt, in)) {
      if (in) fclose(in);
      if (out) fclose(out);
      continue;
    }
    size_t n = strcspn(prompt, "\n"); /* at most 4095 tokens: the buffer */
    int32_t tokens[4096];
    for (size_t i = 0; i < n; ++i) tokens[i] = (unsigned char)prompt[i];
    cxlpool_kv_seq_t* seq = NULL;
    size_t reused = 0;
    cxlpool_kv_seq_info_t info;
    if (n == 0 || cxlpool_kv_seq_create(arena, &seq) != CXLPOOL_OK ||
        cxlpool_kv_seq_append(seq, tokens, n, &reused) != CXLPOOL_OK || cxlpool_kv_seq_info(seq, &info) != CXLPOOL_OK) {
      fprintf(out, "ERROR %s\n", n ? cxlpool_last_error_message() : "empty prompt");
      if (seq) cxlpool_kv_seq_destroy(seq);
      fclose(in);
      fclose(out);
      continue;
    }
    for (uint64_t b = reused / g.tokens_per_block; b < info.blocks; ++b) { /* shared blocks are sealed */
      void* data = NULL;
      cxlpool_kv_seq_block(seq, b, &data, NULL);
      size_t first = (size_t)(b * g.tokens_per_block);
      size_t count = n - first < g.tokens_per_block ? n - first : g.tokens_per_block;
      prefill_block(data, per_block, tokens + first, count);
    }
    cxlpool_kv_handle_t h;
    if (cxlpool_kv_seq_seal(seq, n) != CXLPOOL_OK || cxlpool_kv_seq_export(seq, 0, &h) != CXLPOOL_OK) {
      fprintf(out, "ERROR %s\n", cxlpool_last_error_message());
    } else {
      fprintf(out, "HANDLE ");
      const unsigned char* p = (const unsigned char*)&h;
      for (size_t i = 0; i < sizeof h; ++i) fprintf(out, "%02x", p[i]);
      fprintf(out, "\n");
      fflush(out);
      printf("prefill: %zu tokens (%zu reused from the prefix cache) in %llu blocks, handle sent\n", n, reused,
             (unsigned long long)info.blocks);
      fflush(stdout);
      char line[64];
      if (fgets(line, sizeof line, in)) printf("prefill: decode said %s", line);
    }
    cxlpool_kv_seq_destroy(seq);
    fclose(in);
    fclose(out);
  }
  close(ls);
  struct stat now;
  if (lstat(sock_path, &now) == 0 && S_ISSOCK(now.st_mode) && now.st_dev == bound.st_dev && now.st_ino == bound.st_ino)
    unlink(sock_path);
  cxlpool_kv_arena_destroy(arena);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device);
  return 0;
}

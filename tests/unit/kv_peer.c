/* SPDX-License-Identifier: MIT */
/* The consumer process of the KV cache handoff tests (C, public API only):
 *   kv_peer DEVICE serve     opens the shared pool DEVICE; for each line "H <handle hex>
 *                            <checksum hex>" on stdin imports the sequence, checks the FNV-1a
 *                            checksum of its blocks' bytes, releases it and answers "ok" or
 *                            "bad <status> <message>"; "Q" ends it
 *   kv_peer DEVICE hold HEX  imports the sequence, answers "held", then waits to be killed
 *   kv_peer DEVICE late HEX  imports the sequence, answers "held", waits for a line on stdin,
 *                            then answers the status of reading block 0 of its view */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"
#include "kv_hex.h"

static int import(cxlpool_shared_pool_t* pool, const char* hex, cxlpool_kv_view_t** view) {
  cxlpool_kv_handle_t h;
  if (from_hex(hex, &h, sizeof h)) return -100;
  return cxlpool_kv_import(&pool, 1, NULL, &h, view);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: kv_peer DEVICE serve | kv_peer DEVICE hold|late HEX\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  cxlpool_shared_pool_t* pool = NULL;
  if (cxlpool_shared_pool_open(argv[1], NULL, &pool) != CXLPOOL_OK) {
    printf("bad open %s\n", cxlpool_last_error_message());
    return 3;
  }
  const int hold = strcmp(argv[2], "hold") == 0, late = strcmp(argv[2], "late") == 0;
  if ((hold || late) && argc == 4) {
    cxlpool_kv_view_t* view = NULL;
    int st = import(pool, argv[3], &view);
    if (st) {
      printf("bad %d %s\n", st, cxlpool_last_error_message());
      return 4;
    }
    printf("held\n");
    if (hold)
      for (;;) pause();
    char go[16];
    if (!fgets(go, sizeof go, stdin)) return 5;
    const void* data = NULL;
    st = cxlpool_kv_view_block(view, 0, &data);
    printf("%d %s\n", st, st ? cxlpool_last_error_message() : "ok");
    return 0;
  }
  char line[4096];
  while (fgets(line, sizeof line, stdin)) {
    if (line[0] == 'Q') break;
    char hex[512], sum_hex[64];
    if (sscanf(line, "H %511s %63s", hex, sum_hex) != 2) {
      printf("bad -100 unreadable line\n");
      continue;
    }
    cxlpool_kv_view_t* view = NULL;
    int st = import(pool, hex, &view);
    if (st) {
      printf("bad %d %s\n", st, cxlpool_last_error_message());
      continue;
    }
    cxlpool_kv_view_info_t info;
    cxlpool_kv_view_info(view, &info);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < info.blocks; ++i) {
      const void* data = NULL;
      cxlpool_kv_view_block(view, i, &data);
      h = fnv(data, (size_t)info.bytes_per_block, h);
    }
    cxlpool_kv_view_release(view);
    char mine[32];
    snprintf(mine, sizeof mine, "%016llx", (unsigned long long)h);
    if (strcmp(mine, sum_hex) == 0)
      printf("ok\n");
    else
      printf("bad -200 checksum %s, expected %s\n", mine, sum_hex);
  }
  cxlpool_shared_pool_close(pool);
  return 0;
}

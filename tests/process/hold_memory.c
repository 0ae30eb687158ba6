/* SPDX-License-Identifier: MIT */
/* A preloaded program holding memory: `hold_memory MIB [--wait]` writes MIB MiB in 1 MiB
 * blocks plus 4096 small ones and prints "ready"; with --wait it keeps them until stdin closes,
 * then checks nobody else changed them. stdout is the same under glibc and cxlpool-run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t word(size_t block, size_t i) { return ((uint64_t)block << 32) ^ (i * 0x9E3779B1u) ^ 0x5a5a; }

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 16;
  int wait = argc > 2 && strcmp(argv[2], "--wait") == 0;
  size_t n = mib + 4096;
  uint64_t** blocks = malloc(n * sizeof *blocks);
  size_t* sizes = malloc(n * sizeof *sizes);
  if (!blocks || !sizes) return 3;
  for (size_t b = 0; b < n; ++b) {
    sizes[b] = b < mib ? (size_t)1 << 20 : 16 + (b % 13) * 24;
    blocks[b] = malloc(sizes[b]);
    if (!blocks[b]) {
      printf("allocation %zu failed\n", b);
      return 1;
    }
    for (size_t i = 0; i < sizes[b] / 8; ++i) blocks[b][i] = word(b, i);
  }
  printf("ready\n");
  fflush(stdout);
  if (wait) {
    char buf[256];
    while (read(0, buf, sizeof buf) > 0) {
    }
  }
  size_t wrong = 0;
  for (size_t b = 0; b < n; ++b) {
    for (size_t i = 0; i < sizes[b] / 8; ++i)
      if (blocks[b][i] != word(b, i)) {
        ++wrong;
        break;
      }
    free(blocks[b]);
  }
  free(blocks);
  free(sizes);
  printf("%zu blocks (%zu MiB) intact: %s\n", n, mib, wrong ? "WRONG" : "ok");
  return wrong ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/* Under a virtual-memory limit (ulimit -v): malloc 16 MiB blocks until NULL (at most 1024),
 * free them all, do it again, then small blocks. Must fail cleanly (NULL + ENOMEM), never
 * abort; stdout is the same under glibc and cxlpool-run, counts go to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX = 1024, BLOCK = 16 << 20 };

static int exhaust(char** blocks, int* enomem) {
  int n = 0;
  *enomem = 1;
  for (; n < MAX; ++n) {
    errno = 0;
    blocks[n] = malloc(BLOCK);
    if (!blocks[n]) {
      *enomem = errno == ENOMEM;
      break;
    }
    blocks[n][0] = (char)n;
    blocks[n][BLOCK - 1] = (char)n;
  }
  return n;
}

int main(void) {
  static char* blocks[MAX];
  int enomem1 = 0, enomem2 = 0;
  int first = exhaust(blocks, &enomem1);
  for (int i = 0; i < first; ++i) free(blocks[i]);
  int second = exhaust(blocks, &enomem2);
  for (int i = 0; i < second; ++i) free(blocks[i]);
  fprintf(stderr, "malloc_exhaust: %d then %d blocks of 16 MiB\n", first, second);
  printf("first round ended with NULL + ENOMEM: %s\n", first < MAX && enomem1 ? "yes" : "no");
  printf("second round ended with NULL + ENOMEM: %s\n", second < MAX && enomem2 ? "yes" : "no");
  printf("memory came back after free: %s\n", second >= first - 2 && second > 0 ? "yes" : "no");
  int small = 0;
  for (int i = 0; i < 100000; ++i) {
    char* p = malloc(16 + i % 2000);
    if (p) {
      memset(p, 1, 16);
      ++small;
    }
    free(p);
  }
  printf("small blocks after that: %d of 100000\n", small);
  return 0;
}

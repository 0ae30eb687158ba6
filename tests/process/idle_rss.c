/* SPDX-License-Identifier: MIT */
/* Idle memory returns: `idle_rss BYTES [--trim | --until KIB]` allocates a mixed working set of
 * BYTES (by bytes: 60% blocks of 16 B .. 1 KiB, 30% of 1 KiB .. 256 KiB, 10% of 1 .. 4 MiB),
 * touches every block, frees all in random order (fixed seed), sleeps 1.5 s without allocating
 * and prints VmRSS in KiB. --trim calls malloc_trim(0) before the sleep: the allocator's floor.
 * --until keeps sleeping (polling every 100 ms, at most 60 s) until VmRSS is at most KIB: memory
 * returned by a background purger arrives later on a slower or busier machine, and the claim is
 * that it arrives, not how fast this machine runs; the wait is printed. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t rng = 0x853c49e6748fea9bULL;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static long field_kib(const char* name) {
  FILE* f = fopen("/proc/self/status", "re");
  char line[256];
  long v = -1;
  size_t len = strlen(name);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, name, len) == 0) v = strtol(line + len, NULL, 10);
  if (f) fclose(f);
  return v;
}

int main(int argc, char** argv) {
  uint64_t total = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)2 << 30;
  struct {
    uint64_t budget;
    size_t lo, hi;
  } classes[3] = {{total / 10 * 6, 16, 1023}, {total / 10 * 3, 1024, 256 << 10}, {total / 10, 1 << 20, 4 << 20}};
  /* Bookkeeping outside malloc, and gone before the measurement. */
  size_t cap = (size_t)(total / 16) + 16;
  void** blocks = mmap(NULL, cap * sizeof *blocks, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (blocks == MAP_FAILED) return 3;
  size_t n = 0;
  uint64_t used[3] = {0, 0, 0};
  for (int done = 0; !done;) {
    done = 1;
    for (int c = 0; c < 3; ++c) {
      if (used[c] >= classes[c].budget) continue;
      done = 0;
      size_t size = classes[c].lo + (size_t)(next() % (classes[c].hi - classes[c].lo + 1));
      char* p = malloc(size);
      if (!p) {
        fprintf(stderr, "idle_rss: allocation of %zu bytes failed after %zu blocks\n", size, n);
        return 1;
      }
      memset(p, (int)(n & 0xff), size);
      blocks[n++] = p;
      used[c] += size;
      /* keep the classes interleaved in time: several small ones per medium per large */
      if (c == 0)
        for (int k = 0; k < 400 && used[0] < classes[0].budget; ++k) {
          size = classes[0].lo + (size_t)(next() % (classes[0].hi - classes[0].lo + 1));
          p = malloc(size);
          if (!p) {
            fprintf(stderr, "idle_rss: allocation of %zu bytes failed after %zu blocks\n", size, n);
            return 1;
          }
          memset(p, 1, size);
          blocks[n++] = p;
          used[0] += size;
        }
    }
  }
  long peak = field_kib("VmRSS:");
  for (size_t i = n - 1; i > 0; --i) {
    size_t j = (size_t)(next() % (i + 1));
    void* t = blocks[i];
    blocks[i] = blocks[j];
    blocks[j] = t;
  }
  for (size_t i = 0; i < n; ++i) free(blocks[i]);
  munmap(blocks, cap * sizeof *blocks);
  if (argc > 2 && strcmp(argv[2], "--trim") == 0) malloc_trim(0);
  long until = argc > 3 && strcmp(argv[2], "--until") == 0 ? strtol(argv[3], NULL, 10) : -1;
  struct timespec ts = {1, 500000000};
  nanosleep(&ts, NULL);
  long waited_ms = 1500, idle = field_kib("VmRSS:");
  for (; until >= 0 && idle > until && waited_ms < 60000; waited_ms += 100) {
    struct timespec poll = {0, 100000000};
    nanosleep(&poll, NULL);
    idle = field_kib("VmRSS:");
  }
  printf("blocks %zu peak_kib %ld idle_kib %ld after_ms %ld\n", n, peak, idle, waited_ms);
  return 0;
}

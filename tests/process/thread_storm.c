// SPDX-License-Identifier: MIT
// Many threads at once, each keeping up to 64 blocks of 1 B .. 2^MAXBITS B (log-uniform),
// freeing and replacing them OPS times, then freeing all. Prints a digest of what the threads
// read back, the threads started and the NULL mallocs (stdout: identical to glibc's when
// nothing failed), and its peak RSS (stderr). With --together every thread waits for all the
// others before it frees its blocks: the peak then holds every thread's blocks at once, on any
// machine, whatever its speed.
// Usage: thread_storm THREADS OPS MAXBITS [--together]
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int ops;
static int max_bits;
static int together;
static pthread_barrier_t all_done;
static atomic_long nulls, digest, bad_bytes;

static uint64_t next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static long take_back(const unsigned char* p, size_t n) {
  if (p[0] != (unsigned char)n || p[n - 1] != (unsigned char)n || p[n / 2] != (unsigned char)n)
    atomic_fetch_add(&bad_bytes, 1);
  return p[0] + (long)n;
}

static void* worker(void* arg) {
  uint64_t s = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  unsigned char* slot[64] = {0};
  size_t len[64] = {0};
  long sum = 0, miss = 0;
  for (int i = 0; i < ops; ++i) {
    int k = (int)(next(&s) % 64);
    if (slot[k]) {
      sum += take_back(slot[k], len[k]);
      free(slot[k]);
      slot[k] = NULL;
    }
    int bits = (int)(next(&s) % (uint64_t)(max_bits + 1));
    size_t n = 1 + next(&s) % ((size_t)1 << bits);
    unsigned char* p = malloc(n);
    if (!p) {
      ++miss;
      continue;
    }
    memset(p, (int)(n & 0xff), n);
    slot[k] = p;
    len[k] = n;
  }
  if (together) pthread_barrier_wait(&all_done);
  for (int k = 0; k < 64; ++k)
    if (slot[k]) {
      sum += take_back(slot[k], len[k]);
      free(slot[k]);
    }
  atomic_fetch_add(&nulls, miss);
  atomic_fetch_add(&digest, sum);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: thread_storm THREADS OPS MAXBITS [--together]\n");
    return 2;
  }
  const int n = atoi(argv[1]);
  ops = atoi(argv[2]);
  max_bits = atoi(argv[3]);
  together = argc > 4 && strcmp(argv[4], "--together") == 0;
  if (n < 1 || ops < 0 || max_bits < 0 || max_bits > 24) return 2;
  if (together) pthread_barrier_init(&all_done, NULL, (unsigned)n);
  pthread_t* t = calloc((size_t)n, sizeof *t);
  if (!t) return 3;
  int started = 0;
  for (int i = 0; i < n; ++i) {
    int rc = pthread_create(&t[i], NULL, worker, (void*)(uintptr_t)i);
    if (rc) {
      // Nothing to wait for at the barrier then: say so and stop (the test fails on it).
      printf("pthread_create %d: %s\n", i, strerror(rc));
      fflush(stdout);
      _exit(4);
    }
    ++started;
  }
  for (int i = 0; i < n; ++i) pthread_join(t[i], NULL);
  free(t);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("threads %d started %d nulls %ld digest %ld bad %ld\n", n, started, (long)nulls, (long)digest,
         (long)bad_bytes);
  fprintf(stderr, "peak_kib %ld\n", ru.ru_maxrss);
  return 0;
}

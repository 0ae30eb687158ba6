/* SPDX-License-Identifier: MIT */
/* Under a virtual-memory limit: 4 threads allocate blocks of every kind (small, medium,
 * huge) until malloc returns NULL, touch them, free them all, 4 rounds each, at the same time.
 * Every failure must be NULL + ENOMEM and nothing may crash; afterwards a 16 MiB block fits
 * again (the address space came back). Prints "enomem-only yes|no" and "room after yes|no". */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX = 100000, ROUNDS = 4, THREADS = 4 };

static void* worker(void* arg) {
  unsigned seed = (unsigned)(size_t)arg;
  void** blocks = NULL;
  while (!(blocks = malloc(MAX * sizeof(void*)))) sched_yield(); /* the others may hold it all */
  long wrong = 0;
  for (int round = 0; round < ROUNDS; ++round) {
    int n = 0;
    for (; n < MAX; ++n) {
      unsigned r = (unsigned)rand_r(&seed) % 100;
      size_t size = r < 70   ? 16 + (unsigned)rand_r(&seed) % 1000
                    : r < 95 ? 4096 + (unsigned)rand_r(&seed) % 300000
                             : (1u << 20) + (unsigned)rand_r(&seed) % (8u << 20);
      errno = 0;
      blocks[n] = malloc(size);
      if (!blocks[n]) {
        wrong += errno != ENOMEM;
        break;
      }
      memset(blocks[n], round, size < 4096 ? size : 4096);
    }
    for (int i = 0; i < n; ++i) free(blocks[i]);
  }
  free(blocks);
  return (void*)wrong;
}

int main(void) {
  pthread_t threads[THREADS];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20); /* 8 MiB stacks would not fit a small limit */
  int made = 0;
  for (long i = 0; i < THREADS; ++i)
    if (pthread_create(&threads[made], &attr, worker, (void*)(i + 1)) == 0) ++made;
  long wrong = 0;
  for (int i = 0; i < made; ++i) {
    void* r;
    pthread_join(threads[i], &r);
    wrong += (long)r;
  }
  void* big = malloc(16 << 20);
  printf("threads %d\n", made);
  printf("enomem-only %s\n", wrong == 0 ? "yes" : "no");
  printf("room after %s\n", big ? "yes" : "no");
  free(big);
  return 0;
}

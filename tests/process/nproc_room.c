/* SPDX-License-Identifier: MIT */
/* A program at its RLIMIT_NPROC: HOLD threads wait while the main thread, ROUNDS times, fills
 * and frees 64 MiB (work for the allocator's purger), then starts one more thread and forks
 * one child. With the limit at HOLD + 2 (main, the holders, the extra one) both must succeed
 * as they do under glibc: a thread of the allocator's own must not have taken the slot.
 *   nproc_room HOLD ROUNDS   prints "thread_failures N fork_failures M of ROUNDS" */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done;

static void* hold(void* arg) {
  pthread_mutex_lock(&mu);
  while (!done) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return arg;
}

static void* nothing(void* arg) { return arg; }

/* A joined thread or a reaped child still counts against the limit for a moment after
 * pthread_join/waitpid return (the kernel lets go of the task just after), as under glibc: so
 * EAGAIN is retried for up to 20 ms, far less than the purger's delay (250 ms) before its first
 * pass, or the stats publisher's whole life. */
static int start_extra(void) {
  for (int tries = 0;; ++tries) {
    pthread_t extra;
    int e = pthread_create(&extra, NULL, nothing, NULL);
    if (e == 0) return pthread_join(extra, NULL);
    if (e != EAGAIN || tries == 20) return e;
    usleep(1000);
  }
}

static pid_t fork_retrying(void) {
  for (int tries = 0;; ++tries) {
    pid_t child = fork();
    if (child >= 0 || errno != EAGAIN || tries == 20) return child;
    usleep(1000);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: nproc_room HOLD ROUNDS\n");
    return 2;
  }
  const int n = atoi(argv[1]), rounds = atoi(argv[2]);
  pthread_t* held = calloc((size_t)n, sizeof *held);
  if (!held) return 1;
  for (int i = 0; i < n; ++i) {
    int e = pthread_create(&held[i], NULL, hold, NULL);
    if (e) {
      printf("holder %d of %d: pthread_create: %s\n", i, n, strerror(e));
      return 1;
    }
  }
  int thread_failures = 0, fork_failures = 0;
  enum { kBlocks = 1024, kBlock = 64 << 10 };
  static void* blocks[kBlocks];
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < kBlocks; ++i) {
      blocks[i] = malloc(kBlock);
      if (!blocks[i]) {
        printf("malloc returned NULL\n");
        return 1;
      }
      memset(blocks[i], r + 1, kBlock);
    }
    for (int i = 0; i < kBlocks; ++i) free(blocks[i]);
    if (start_extra() != 0) ++thread_failures;
    pid_t child = fork_retrying();
    if (child < 0) {
      ++fork_failures;
    } else if (child == 0) {
      _exit(0);
    } else {
      int status = 0;
      while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  pthread_mutex_lock(&mu);
  done = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < n; ++i) pthread_join(held[i], NULL);
  printf("thread_failures %d fork_failures %d of %d\n", thread_failures, fork_failures, rounds);
  return 0;
}

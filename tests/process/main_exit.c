/* SPDX-License-Identifier: MIT */
/* A program whose main thread leaves through pthread_exit ends when its last thread ends, as
 * glibc ends it (exit(0): atexit handlers run, stdio is flushed), although cxlpool's own
 * threads still run (os/own_threads.hpp). stdout is fully buffered: a process that ended
 * without exit() loses its lines, and one that ended early loses the worker's.
 *   main_exit leave           a worker sleeps 300 ms, allocates, prints, returns
 *   main_exit status N        the worker calls exit(N) instead of returning
 *   main_exit chain N         N threads in a row, each starting the next and ending at once
 *                             (at no moment is there a program thread that has not yet
 *                             started its successor, unless it is the last): prints "chain end"
 *   main_exit hold            the worker prints "ready", then waits for stdin to close
 *   main_exit fork            a second thread forks once the main thread has ended; in the
 *                             child (whose main thread it now is) the same as leave; the
 *                             parent's thread waits for the child and prints its status
 *   main_exit shared DEVICE   (built with the C API) first creates a shared pool on DEVICE
 *                             (its heartbeat and watch threads), starts the tiering engine
 *                             and keeps both; the worker allocates from the pool */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef MAIN_EXIT_CAPI
#include "cxlpool/cxlpool.h"
static cxlpool_shared_pool_t* pool;
#endif

static int exit_with = -1;

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static void* worker(void* arg) {
  (void)arg;
  sleep_ms(300);
  size_t total = 0;
  for (int i = 0; i < 1000; ++i) {
    char* p = malloc((size_t)(i % 64 + 1) * 100);
    if (!p) {
      printf("worker: malloc failed\n");
      break;
    }
    memset(p, i, (size_t)(i % 64 + 1) * 100);
    total += (size_t)(i % 64 + 1) * 100;
    free(p);
  }
#ifdef MAIN_EXIT_CAPI
  if (pool) {
    void* b = NULL;
    cxlpool_status_t st = cxlpool_shared_alloc(pool, 4096, &b);
    if (st != CXLPOOL_OK) {
      printf("worker: shared alloc: %s\n", cxlpool_status_str(st));
    } else {
      memset(b, 1, 4096);
      cxlpool_shared_free(pool, b);
      printf("worker: shared block ok\n");
    }
  }
#endif
  printf("worker done: %zu bytes\n", total);
  if (exit_with >= 0) exit(exit_with);
  return NULL;
}

static long chain_left;
static void* chain_link(void* arg) {
  (void)arg;
  if (--chain_left == 0) {
    printf("chain end\n");
    return NULL;
  }
  pthread_t next;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&next, &attr, chain_link, NULL) != 0) {
    printf("chain: pthread_create failed with %ld left\n", chain_left);
    exit(3);
  }
  pthread_attr_destroy(&attr);
  return NULL;
}

static void* holder(void* arg) {
  (void)arg;
  printf("ready\n");
  fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof buf) > 0) {
  }
  char* p = malloc(4096);
  printf("worker done: %d\n", p != NULL);
  free(p);
  return NULL;
}

static void leave_with(void* (*fn)(void*), int announce) {
  pthread_t t;
  if (pthread_create(&t, NULL, fn, NULL) != 0) {
    perror("pthread_create");
    exit(2);
  }
  if (announce) printf("main leaves\n");
  pthread_exit(NULL);
}

static void leave(void) { leave_with(worker, 1); }

/* Waits until the main thread has ended (the leader is a zombie). Its pthread_exit loads
 * libgcc_s for the unwind; a fork while that dlopen is under way hands the child a half-loaded
 * library, and the child's own pthread_exit then crashes in it (glibc alone: SIGSEGV or SIGABRT
 * in about 1 run of 100). The claim is about a fork after main left, not during its exit. */
static void wait_for_main_to_end(void) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
  for (;;) {
    FILE* f = fopen(path, "re");
    if (!f) return; /* gone: reaped with its thread group's end, or no /proc to tell */
    char line[512] = {0};
    const int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    const char* close_paren = got ? strrchr(line, ')') : NULL;
    if (!close_paren || close_paren[1] != ' ' || close_paren[2] == 'Z' || close_paren[2] == 'X') return;
    sleep_ms(1);
  }
}

static void* forker(void* arg) {
  (void)arg;
  wait_for_main_to_end();
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    exit(2);
  }
  if (child == 0) {
    printf("child: ");
    leave(); /* this thread is the child's main thread */
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) {
    perror("waitpid");
    exit(2);
  }
  printf("child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return NULL;
}

int main(int argc, char** argv) {
  static char buffer[1 << 16];
  setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "leave") == 0) leave();
  if (strcmp(mode, "status") == 0 && argc > 2) {
    exit_with = atoi(argv[2]);
    leave();
  }
  if (strcmp(mode, "chain") == 0 && argc > 2) {
    chain_left = atol(argv[2]);
    leave_with(chain_link, 1);
  }
  if (strcmp(mode, "hold") == 0) leave_with(holder, 0); /* "ready" is the first line */
  if (strcmp(mode, "fork") == 0) {
    pthread_t t;
    printf("main leaves\n"); /* before the forker starts: no fork while main holds stdout's lock */
    if (pthread_create(&t, NULL, forker, NULL) != 0) return 2;
    pthread_exit(NULL);
  }
#ifdef MAIN_EXIT_CAPI
  if (strcmp(mode, "shared") == 0 && argc > 2) {
    cxlpool_shared_params_t* params = NULL;
    cxlpool_status_t st = cxlpool_shared_params_create(&params);
    if (st == CXLPOOL_OK) st = cxlpool_shared_params_set_size(params, (uint64_t)64 << 20);
    if (st == CXLPOOL_OK) st = cxlpool_shared_pool_create(argv[2], params, 0, &pool);
    cxlpool_shared_params_destroy(params);
    if (st != CXLPOOL_OK) {
      fprintf(stderr, "shared pool on %s: %s: %s\n", argv[2], cxlpool_status_str(st), cxlpool_last_error_message());
      return 2;
    }
    st = cxlpool_tiering_start("");
    if (st != CXLPOOL_OK) {
      fprintf(stderr, "tiering: %s: %s\n", cxlpool_status_str(st), cxlpool_last_error_message());
      return 2;
    }
    leave();
  }
#endif
  fprintf(stderr, "usage: main_exit leave | status N | chain N | hold | fork%s\n",
#ifdef MAIN_EXIT_CAPI
          " | shared DEVICE"
#else
          ""
#endif
  );
  return 2;
}

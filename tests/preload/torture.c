/* SPDX-License-Identifier: MIT */
/* Fork and thread-exit torture for the interposer (after glibc's tst-malloc-fork-deadlock):
 *   fork:   4 threads allocate and free while 2 threads fork; each child allocates, frees and
 *           _exit(17)s; a child that hangs more than 5 s or exits otherwise is a failure.
 *   threads: thousands of short threads allocate in thread_local destructors and in
 *           pthread_key destructors registered after the allocator's, and exit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_int bad_children, forks;

static void* allocator(void* arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void* keep[64] = {0};
  while (!atomic_load(&stop)) {
    int i = rand_r(&seed) % 64;
    free(keep[i]);
    keep[i] = malloc(1 + rand_r(&seed) % 5000);
    if (keep[i]) memset(keep[i], 1, 1);
  }
  for (int i = 0; i < 64; ++i) free(keep[i]);
  return NULL;
}

static void* forker(void* arg) {
  (void)arg;
  for (int n = 0; n < 100; ++n) {
    pid_t pid = fork();
    if (pid == 0) {
      for (int i = 0; i < 1000; ++i) free(malloc(16 + i));
      void* big = malloc(3 << 20);
      free(big);
      _exit(17);
    }
    if (pid < 0) continue;
    atomic_fetch_add(&forks, 1);
    int status = 0;
    for (int waited = 0;; waited += 10) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (waited > 5000) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        atomic_fetch_add(&bad_children, 1);
        fprintf(stderr, "child %d hung\n", pid);
        break;
      }
      usleep(10000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 17) atomic_fetch_add(&bad_children, 1);
  }
  return NULL;
}

static pthread_key_t key;
static void key_destructor(void* p) {
  free(p);
  free(malloc(100)); /* allocate inside a TSD destructor */
}
static __thread char* tls_block;
static void* short_thread(void* arg) {
  (void)arg;
  pthread_setspecific(key, malloc(64));
  tls_block = malloc(128);
  free(tls_block);
  return malloc(32); /* freed by the joiner: a cross-thread free */
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "fork";
  if (!strcmp(mode, "fork")) {
    pthread_t a[4], f[2];
    for (int i = 0; i < 4; ++i) pthread_create(&a[i], NULL, allocator, (void*)(uintptr_t)(i + 1));
    for (int i = 0; i < 2; ++i) pthread_create(&f[i], NULL, forker, NULL);
    for (int i = 0; i < 2; ++i) pthread_join(f[i], NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; ++i) pthread_join(a[i], NULL);
    printf("fork torture: %d forks, %d bad children\n", atomic_load(&forks), atomic_load(&bad_children));
    return atomic_load(&bad_children) ? 1 : 0;
  }
  pthread_key_create(&key, key_destructor);
  int n = 0;
  for (int round = 0; round < 200; ++round) {
    pthread_t t[16];
    for (int i = 0; i < 16; ++i) pthread_create(&t[i], NULL, short_thread, NULL);
    for (int i = 0; i < 16; ++i) {
      void* r = NULL;
      pthread_join(t[i], &r);
      free(r);
      ++n;
    }
  }
  printf("thread-exit torture: %d threads\n", n);
  return 0;
}

/* SPDX-License-Identifier: MIT */
/* What a fork child gives back: `fork_child_rss MIB` has three threads each fill MIB MiB with
 * 1 KiB blocks, free them all and stay alive; then the main thread forks. The child allocates
 * one small block every 100 ms and frees nothing, polling its VmRSS for at most 60 s until it is
 * within one third of the 3 x MIB freed of the process's VmRSS before the threads filled anything
 * (how much the parent had given back before fork() varies, so the target is not relative to the
 * child's start); it prints its VmRSS at the start and at the end and exits 0 when it got there. Under glibc the freed
 * memory stays in its arenas, shared with the parent; under cxlpool the parent purges its copy, so the child must purge
 * its own. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pthread_barrier_t filled, finish;
static size_t per_thread;

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "re");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) v = strtol(line + 6, NULL, 10);
  if (f) fclose(f);
  return v;
}

static void* fill(void* arg) {
  (void)arg;
  size_t n = per_thread / 1024;
  void** v = malloc(n * sizeof *v);
  if (!v) return (void*)1;
  for (size_t i = 0; i < n; ++i) {
    v[i] = malloc(1024);
    if (v[i]) memset(v[i], 1, 1024);
  }
  for (size_t i = 0; i < n; ++i) free(v[i]);
  free(v);
  pthread_barrier_wait(&filled);
  pthread_barrier_wait(&finish);
  return NULL;
}

int main(int argc, char** argv) {
  long mib = argc > 1 ? atol(argv[1]) : 64;
  per_thread = (size_t)mib << 20;
  const long baseline = rss_kib();
  pthread_t t[3];
  pthread_barrier_init(&filled, NULL, 4);
  pthread_barrier_init(&finish, NULL, 4);
  for (int i = 0; i < 3; ++i)
    if (pthread_create(&t[i], NULL, fill, NULL) != 0) return 3;
  pthread_barrier_wait(&filled);
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) return 3;
  if (child == 0) {
    long start = rss_kib(), now = start, target = baseline + mib * 1024;
    int waited = 0;
    for (; waited <= 60000 && now > target; waited += 100) {
      void* p = malloc(64);
      if (p) memset(p, 2, 64);
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
      now = rss_kib();
    }
    printf("child_start_kib %ld child_end_kib %ld target_kib %ld after_ms %d\n", start, now, target, waited);
    fflush(stdout);
    _exit(now <= target ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  pthread_barrier_wait(&finish);
  for (int i = 0; i < 3; ++i) pthread_join(t[i], NULL);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

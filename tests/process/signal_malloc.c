/* SPDX-License-Identifier: MIT */
/* malloc and free re-entered from a signal handler (not async-signal-safe, but programs do
 * it): SIGALRM 50 us after the main thread's round that follows the previous signal, while
 * the main thread allocates and frees; the handler allocates, checks and frees small and
 * large blocks of its own and frees a block the main thread left for it. The timer is armed
 * again only once the handler has run, so the main thread makes progress however long a
 * handler takes on this machine (a periodic timer could keep it in handlers forever). Must
 * neither hang (the test has a timeout) nor corrupt: every block keeps its pattern. Prints
 * "signals N, corrupted 0" and exits 0 when all is well. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static volatile sig_atomic_t signals, corrupted, fired;
static void* volatile handoff;

static void on_alarm(int sig) {
  (void)sig;
  ++signals;
  size_t n = (signals % 3 == 0) ? (2u << 20) : 24 + (size_t)(signals % 500);
  unsigned char* p = malloc(n);
  if (p) {
    memset(p, 0xA5, n);
    if (p[0] != 0xA5 || p[n - 1] != 0xA5) corrupted = 1;
    free(p);
  }
  void* q = handoff;
  handoff = NULL;
  free(q); /* a block the main thread allocated */
  fired = 1;
}

static void arm(void) {
  struct itimerval it = {{0, 0}, {0, 50}};
  setitimer(ITIMER_REAL, &it, NULL);
}

int main(int argc, char** argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 200000;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  arm();
  enum { kLive = 256 };
  unsigned char* live[kLive] = {0};
  size_t size[kLive] = {0};
  for (long r = 0; r < rounds; ++r) {
    int i = (int)(r % kLive);
    if (live[i]) {
      for (size_t k = 0; k < size[i]; k += 97)
        if (live[i][k] != (unsigned char)(i + size[i])) corrupted = 1;
      free(live[i]);
    }
    size[i] = (r % 101 == 0) ? (1u << 20) + (size_t)r % 4096 : 16 + (size_t)(r * 7) % 2000;
    live[i] = malloc(size[i]);
    if (!live[i]) {
      printf("malloc failed at round %ld\n", r);
      return 1;
    }
    memset(live[i], (unsigned char)(i + size[i]), size[i]);
    if (!handoff) handoff = malloc(64);
    if (fired) {
      fired = 0;
      arm();
    }
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  for (int i = 0; i < kLive; ++i) free(live[i]);
  printf("signals %d, corrupted %d\n", (int)signals, (int)corrupted);
  return corrupted ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/* fork() under conditions that break naive fork handling, on a copy-mode device (a file:
 * device: the child copies its private memory before fork returns). One case per run:
 *   fds N        the descriptor table full but for N slots when fork is called: the parent
 *                must still wait for the child's copy (0 and 1 free slots were broken)
 *   closerange   the program closes every descriptor it did not open (close_range), then
 *                allocates (fresh device storage) and forks: blocks from before and after must
 *                stay distinct in the child
 *   sigfork      fork() from a SIGALRM handler while the main thread mallocs and frees (the
 *                handler may interrupt cxlpool holding its locks): no deadlock, children run.
 *                The timer is one-shot, re-armed when the handler returns, so the main loop
 *                runs between forks however long a fork takes (a periodic timer shorter than
 *                one copy-fork kept a signal pending for ever: a livelock of the test itself)
 *   sigfork-threads  the same with three threads that malloc, tag, check and free blocks (a
 *                third of them freed by another thread), the handler running on whichever
 *                thread the alarm finds, two timers so handlers on two threads fork at
 *                once: the parent's blocks keep their tags, children run
 *   sigfork-kill three threads malloc and free blocks of up to 100 kB (slow paths that hold a
 *                pool's lock) while the main thread sends them SIGUSR1, whose handler forks:
 *                1,000 forks, none waiting for another (with libcxlpool.so linked as well, a
 *                handler that interrupted the interposer once waited for the linked copy's
 *                locks, which a fork on another thread held while it waited for the interposer)
 *   signal-in-fork  four threads fork in a loop while another sends them SIGUSR2, whose
 *                handler mallocs and frees: a signal that lands between cxlpool's fork handlers
 *                (its locks taken) on the forking thread must not wait for those locks
 *   signal-after-fork  the main thread only forks while another thread queues real-time
 *                signals at it: a signal held back during the fork must run after cxlpool's
 *                handlers have left the interposer's internal scope (its handler asks the
 *                interposer, cxlpool_preload_inside, and must never be told "inside")
 *   fork-mask    the signal mask, set with the raw system call (glibc's own signals 32 and 33
 *                and real-time signals blocked), is the same after fork in parent and child
 * In each, the parent writes right after fork returns; the child must see only the values at
 * fork time. Exit 0 when everything held. Built a second time linked with libcxlpool.so
 * (FORK_HOSTILE_LINKED): under the interposer, two copies of the library with fork handlers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef FORK_HOSTILE_LINKED
#include "cxlpool/cxlpool.h"
#endif
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N (16u << 20)

static int child_status(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int fds(int leave) {
  unsigned char* a = malloc(N);
  memset(a, 'A', N);
  struct rlimit rl = {256, 256};
  setrlimit(RLIMIT_NOFILE, &rl);
  int last[8], n = 0, fd;
  while ((fd = open("/dev/null", O_RDONLY)) >= 0) last[n++ % 8] = fd;
  for (int i = 0; i < leave; i++) close(last[(n - 1 - i) % 8]);
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) bad += a[i] != 'A';
    printf("child: %zu of %u bytes changed after fork\n", bad, N);
    fflush(stdout);
    _exit(bad ? 1 : 0);
  }
  for (long off = N - 4096; off >= 0; off -= 4096) memset(a + off, 'B', 4096);
  int rc = child_status(pid);
  printf("fds %d: child status %d\n", leave, rc);
  return rc;
}

static int closerange(void) {
  char* small[256];
  for (int i = 0; i < 256; i++) {
    small[i] = malloc(1000);
    memset(small[i], 'S', 1000);
  }
  syscall(SYS_close_range, 3, ~0U, 0);
  char* b = malloc(N);
  memset(b, 'Q', N);
  pid_t pid = fork();
  if (pid == 0) {
    size_t wrong = 0, hit = 0;
    for (size_t i = 0; i < N; i++) wrong += b[i] != 'Q';
    for (int i = 0; i < 256; i++)
      for (int j = 0; j < 1000; j++) wrong += small[i][j] != 'S';
    for (int i = 0; i < 2000; i++) memset(malloc(1000), 'N', 1000);
    for (size_t i = 0; i < N; i++) hit += b[i] == 'N';
    printf("child: %zu bytes wrong, %zu bytes of a live block overwritten by new blocks\n", wrong, hit);
    fflush(stdout);
    _exit(wrong || hit ? 1 : 0);
  }
  memset(b, 'P', N);
  int rc = child_status(pid);
  printf("closerange: child status %d\n", rc);
  return rc;
}

/* From a signal handler: forks a child that waits child_ns, mallocs, frees and exits, and
 * reaps it. -1 when fork failed, 1 when the child did not exit 0, else 0. */
static int fork_and_reap(long child_ns) {
  pid_t pid = fork();
  if (pid == 0) {
    struct timespec ts = {0, child_ns};
    if (child_ns) nanosleep(&ts, NULL);
    void* p = malloc(100);
    free(p);
    _exit(p ? 0 : 1);
  }
  if (pid < 0) return -1;
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* Installs handler for each signal in sigs (0-terminated), with SA_RESTART, masking them all
 * while it runs. */
static void on_signal(void (*handler)(int), const int* sigs) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (const int* s = sigs; *s; ++s) sigaddset(&sa.sa_mask, *s);
  for (const int* s = sigs; *s; ++s) sigaction(*s, &sa, NULL);
}

static volatile sig_atomic_t forks, bad_children, stopping;
static void arm_alarm(void) {
  struct itimerval it = {{0, 0}, {0, 2000}};
  setitimer(ITIMER_REAL, &it, NULL);
}
static void on_alarm(int sig) {
  (void)sig;
  int saved = errno;
  int r = fork_and_reap(0);
  if (r >= 0) {
    ++forks;
    if (r) ++bad_children;
  }
  if (!stopping) arm_alarm();
  errno = saved;
}

static int sigfork(void) {
  on_signal(on_alarm, (const int[]){SIGALRM, 0});
  arm_alarm();
  /* Stop on work done and forks seen, not on time: on a fast machine 400k operations may end
   * before the first alarm, on a slow one a fork may outlast many intervals. */
  for (long i = 0; i < 400000 || forks < 5; ++i) {
    void* p = malloc(16 + (size_t)(i % 3000));
    memset(p, 1, 16);
    free(p);
  }
  stopping = 1;
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("sigfork: %d forks from the handler, %d bad children\n", (int)forks, (int)bad_children);
  return forks > 0 && !bad_children ? 0 : 1;
}

static atomic_long mt_forks, mt_bad_children, mt_corrupt, mt_ops;
static atomic_int mt_stop;
static _Atomic(uintptr_t) mt_exchange[256];
/* Two one-shot timers (real and virtual time), each re-armed when its handler returns: two
 * handlers can fork at once on two threads, and a thread a handler interrupted always runs
 * again before its own timer can fire (a timer re-armed inside the handler could keep
 * interrupting a thread that holds a lock the others wait for: a livelock of the test). */
static void mt_arm(int which) {
  struct itimerval it = {{0, 0}, {0, 1000}};
  setitimer(which, &it, NULL);
}
static void mt_on_alarm(int sig) {
  int saved = errno;
  /* A child that lives 3 ms keeps this handler waiting, so the other timer's handler forks on
   * another thread meanwhile. */
  int r = fork_and_reap(3000000);
  if (r >= 0) {
    atomic_fetch_add(&mt_forks, 1);
    if (r) atomic_fetch_add(&mt_bad_children, 1);
  }
  if (!atomic_load(&mt_stop)) mt_arm(sig == SIGALRM ? ITIMER_REAL : ITIMER_VIRTUAL);
  errno = saved;
}
static uint64_t mt_tag(const void* p, size_t n) { return (uintptr_t)p * 0x9E3779B97F4A7C15ull ^ n; }
static void mt_release(unsigned char* p) {
  size_t n;
  uint64_t a, b;
  memcpy(&n, p, sizeof n);
  memcpy(&a, p + 8, 8);
  memcpy(&b, p + n - 8, 8);
  if (a != mt_tag(p, n) || b != mt_tag(p, n)) atomic_fetch_add(&mt_corrupt, 1);
  free(p);
}
static void* mt_worker(void* arg) {
  uint64_t s = (uintptr_t)arg * 0x2545F4914F6CDD1Dull + 1;
  unsigned char* held[128] = {0};
  while (!atomic_load(&mt_stop)) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    unsigned k = (unsigned)(s % 128);
    if (held[k]) {
      if (s >> 60 < 5) { /* about a third go to another thread's free */
        uintptr_t old = atomic_exchange(&mt_exchange[(s >> 20) % 256], (uintptr_t)held[k]);
        if (old) mt_release((unsigned char*)old);
      } else {
        mt_release(held[k]);
      }
    }
    size_t n = 24 + (size_t)((s >> 8) % ((s >> 40) % 8 == 0 ? 200000 : 2000));
    unsigned char* p = malloc(n);
    held[k] = p;
    if (!p) continue;
    uint64_t t = mt_tag(p, n);
    memcpy(p, &n, sizeof n);
    memcpy(p + 8, &t, 8);
    memcpy(p + n - 8, &t, 8);
    atomic_fetch_add(&mt_ops, 1);
  }
  for (unsigned k = 0; k < 128; ++k)
    if (held[k]) mt_release(held[k]);
  return NULL;
}
static int sigfork_threads(void) {
  on_signal(mt_on_alarm, (const int[]){SIGALRM, SIGVTALRM, 0});
  pthread_t t[3];
  for (int i = 0; i < 3; ++i) pthread_create(&t[i], NULL, mt_worker, (void*)(uintptr_t)(i + 1));
  mt_arm(ITIMER_REAL);
  mt_arm(ITIMER_VIRTUAL);
  /* Work done and forks seen, not time, end the run. */
  while (atomic_load(&mt_ops) < 200000 || atomic_load(&mt_forks) < 400) {
    void* p = malloc(64);
    free(p);
  }
  atomic_store(&mt_stop, 1);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  setitimer(ITIMER_VIRTUAL, &off, NULL);
  for (int i = 0; i < 3; ++i) pthread_join(t[i], NULL);
  for (unsigned i = 0; i < 256; ++i)
    if (mt_exchange[i]) mt_release((unsigned char*)mt_exchange[i]);
  printf("sigfork-threads: %ld forks from handlers, %ld bad children, %ld blocks changed under their owner\n",
         (long)mt_forks, (long)mt_bad_children, (long)mt_corrupt);
  return mt_forks > 0 && !mt_bad_children && !mt_corrupt ? 0 : 1;
}

static atomic_long kill_forks;
static atomic_int kill_stop, kill_pending[3];
static __thread int kill_index = -1;
static void kill_on_usr1(int sig) {
  (void)sig;
  int saved = errno;
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  if (pid > 0) atomic_fetch_add(&kill_forks, 1);
  if (kill_index >= 0) atomic_store(&kill_pending[kill_index], 0);
  errno = saved;
}
static void* kill_worker(void* arg) {
  kill_index = (int)(uintptr_t)arg;
  /* Started with SIGUSR1 blocked (sigfork_kill): a signal sent before kill_index was set would
   * run a handler that cannot clear its thread's pending flag, and no signal would be sent to
   * the thread again (three such threads at start-up: no fork ever, a hang of the test). */
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
  uint64_t s = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  void* held[64] = {0};
  while (!atomic_load(&kill_stop)) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    unsigned k = (unsigned)(s % 64);
    free(held[k]);
    held[k] = malloc((size_t)((s >> 16) % 100000));
  }
  for (unsigned k = 0; k < 64; ++k) free(held[k]);
  return NULL;
}
static int sigfork_kill(void) {
  on_signal(kill_on_usr1, (const int[]){SIGUSR1, 0});
  signal(SIGCHLD, SIG_IGN); /* children reaped by the kernel */
  pthread_t t[3];
  sigset_t usr1, before;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, &before); /* inherited by the workers until they are ready */
  for (int i = 0; i < 3; ++i) pthread_create(&t[i], NULL, kill_worker, (void*)(uintptr_t)i);
  pthread_sigmask(SIG_SETMASK, &before, NULL);
  /* Forks seen, not time, end the run. Each thread gets its next signal once it handled the
   * last (a signal sent while one is pending would merge with it), so handlers on two or three
   * threads fork at once. */
  for (unsigned i = 0; atomic_load(&kill_forks) < 1000; ++i) {
    if (!atomic_load(&kill_pending[i % 3])) {
      atomic_store(&kill_pending[i % 3], 1);
      pthread_kill(t[i % 3], SIGUSR1);
    }
    struct timespec ts = {0, 300000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&kill_stop, 1);
  for (int i = 0; i < 3; ++i) pthread_join(t[i], NULL);
  printf("sigfork-kill: %ld forks from handlers\n", (long)atomic_load(&kill_forks));
  return 0;
}

static atomic_long sif_forks, sif_signals;
static atomic_int sif_pending[4], sif_done;
static __thread int sif_index = -1;
static void sif_on_usr2(int sig) {
  (void)sig;
  int saved = errno;
  long n = atomic_fetch_add(&sif_signals, 1);
  unsigned char* p = malloc(64 + (size_t)(n % 4000));
  if (p) {
    memset(p, 1, 64);
    free(p);
  }
  if (sif_index >= 0) atomic_store(&sif_pending[sif_index], 0);
  errno = saved;
}
static void* sif_forker(void* arg) {
  sif_index = (int)(uintptr_t)arg;
  for (int i = 0; i < 300; ++i) {
    void* x = malloc(100 + (size_t)i);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) child_status(pid);
    free(x);
    atomic_fetch_add(&sif_forks, 1);
  }
  atomic_fetch_add(&sif_done, 1);
  return NULL;
}
static int signal_in_fork(void) {
  on_signal(sif_on_usr2, (const int[]){SIGUSR2, 0});
  pthread_t t[4];
  for (int i = 0; i < 4; ++i) pthread_create(&t[i], NULL, sif_forker, (void*)(uintptr_t)i);
  /* Each thread gets its next signal once it handled the last (a signal sent while one is
   * pending would merge with it); forks done, not time, end the run. */
  for (unsigned i = 0; atomic_load(&sif_done) < 4; ++i) {
    const unsigned k = i % 4;
    if (!atomic_load(&sif_pending[k]) && atomic_load(&sif_done) < 4) {
      atomic_store(&sif_pending[k], 1);
      if (pthread_kill(t[k], SIGUSR2) != 0) atomic_store(&sif_pending[k], 0);
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < 4; ++i) pthread_join(t[i], NULL);
  printf("signal-in-fork: %ld forks, %ld signals handled\n", (long)atomic_load(&sif_forks),
         (long)atomic_load(&sif_signals));
  return 0;
}

static int (*saf_inside)(void);
static atomic_long saf_handled, saf_inside_count;
static atomic_int saf_stop;
static pthread_t saf_main;
static void saf_on_signal(int sig) {
  (void)sig;
  atomic_fetch_add(&saf_handled, 1);
  if (saf_inside && saf_inside()) atomic_fetch_add(&saf_inside_count, 1);
}
static void* saf_sender(void* arg) {
  (void)arg;
  union sigval v = {0};
  while (!atomic_load(&saf_stop)) {
    pthread_sigqueue(saf_main, SIGRTMIN + 1, v);
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}
static int signal_after_fork(void) {
  saf_inside = (int (*)(void))dlsym(RTLD_DEFAULT, "cxlpool_preload_inside");
  on_signal(saf_on_signal, (const int[]){SIGRTMIN + 1, 0});
  saf_main = pthread_self();
  pthread_t t;
  pthread_create(&t, NULL, saf_sender, NULL);
  /* The main thread calls nothing of cxlpool's between forks: a handler told "inside" ran in
   * cxlpool's fork handlers. */
  for (int i = 0; i < 1000 || atomic_load(&saf_handled) < 100; ++i) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid > 0) child_status(pid);
  }
  atomic_store(&saf_stop, 1);
  pthread_join(t, NULL);
  printf("signal-after-fork: %ld handled, %ld inside cxlpool (interposer %s)\n", (long)atomic_load(&saf_handled),
         (long)atomic_load(&saf_inside_count), saf_inside ? "present" : "absent");
  return atomic_load(&saf_inside_count) == 0 ? 0 : 1;
}

/* The raw kernel mask (glibc's pthread_sigmask hides its own signals 32 and 33). */
static uint64_t raw_mask(void) {
  uint64_t m = 0;
  syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &m, sizeof m);
  return m;
}
static int fork_mask(void) {
  uint64_t want = 0;
  const int blocked[] = {SIGUSR2, SIGHUP, 32, 33, 40, 64};
  for (size_t i = 0; i < sizeof blocked / sizeof blocked[0]; ++i) want |= 1ull << (blocked[i] - 1);
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &want, NULL, sizeof want);
  want = raw_mask();
  int fds[2];
  if (pipe(fds) != 0) return 2;
  pid_t pid = fork();
  if (pid == 0) {
    uint64_t got = raw_mask();
    ssize_t n = write(fds[1], &got, sizeof got);
    _exit(n == (ssize_t)sizeof got ? 0 : 1);
  }
  const uint64_t parent = raw_mask();
  uint64_t child = 0;
  ssize_t n = read(fds[0], &child, sizeof child);
  int rc = child_status(pid);
  printf("fork-mask: before %016llx, parent %016llx, child %016llx\n", (unsigned long long)want,
         (unsigned long long)parent, (unsigned long long)child);
  return rc == 0 && n == (ssize_t)sizeof child && parent == want && child == want ? 0 : 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef FORK_HOSTILE_LINKED
  if (!cxlpool_status_str(CXLPOOL_OK)) return 2; /* libcxlpool.so is loaded, and its fork handlers registered */
#endif
  if (argc == 3 && strcmp(argv[1], "fds") == 0) return fds(atoi(argv[2]));
  if (argc == 2 && strcmp(argv[1], "closerange") == 0) return closerange();
  if (argc == 2 && strcmp(argv[1], "sigfork") == 0) return sigfork();
  if (argc == 2 && strcmp(argv[1], "sigfork-threads") == 0) return sigfork_threads();
  if (argc == 2 && strcmp(argv[1], "sigfork-kill") == 0) return sigfork_kill();
  if (argc == 2 && strcmp(argv[1], "signal-in-fork") == 0) return signal_in_fork();
  if (argc == 2 && strcmp(argv[1], "signal-after-fork") == 0) return signal_after_fork();
  if (argc == 2 && strcmp(argv[1], "fork-mask") == 0) return fork_mask();
  fprintf(stderr,
          "usage: fork_hostile fds N | closerange | sigfork | sigfork-threads | sigfork-kill | signal-in-fork | "
          "signal-after-fork | fork-mask\n");
  return 2;
}

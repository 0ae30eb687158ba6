// SPDX-License-Identifier: MIT
// OwnThread and the watcher (own_threads.hpp). The main thread's leaving is seen through a
// thread-specific key whose destructor only the main thread has a value for: key destructors
// run on pthread_exit, never on exit() or a return from main, so the common case costs
// nothing. From then on, while a thread of ours lives, the watcher looks at /proc every
// 100 ms and calls exit(0), as glibc's last thread would have, once the main thread is a
// zombie and every other thread is named "cxlpool/...". It allocates nothing itself: it may
// look while another thread is inside the allocator. It takes the main thread's signal mask.
#include "os/own_threads.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "os/os.hpp"
#include "os/prim.hpp"

namespace cxlpool::os {
namespace {

constexpr char kWatcherName[] = "cxlpool/end";
constexpr long kLookEveryNs = 100'000'000;
// Keys below this index live in the thread descriptor itself: setting one allocates nothing,
// which a fork child handler needs (glibc's first-level block of thread-specific data).
constexpr unsigned kKeysWithoutAllocation = 32;

pthread_key_t g_key;
bool g_key_made = false;
std::atomic<int> g_live{0};  // threads of this copy marked now
std::atomic<bool> g_main_left{false};
std::atomic<bool> g_watcher_started{false};
// The main thread's signal mask as it left: the watcher takes it over, so that a signal sent to
// the process (SIGTERM from kill or timeout) is still delivered once no program thread is left
// to take it; with every thread blocking it the process could only be ended by SIGKILL.
alignas(8) unsigned char g_main_mask[prim::kSignalMaskBytes];
std::atomic<bool> g_main_mask_saved{false};

size_t put_uint(char* at, unsigned v) {
  char digits[12];
  size_t n = 0;
  do digits[n++] = char('0' + v % 10);
  while ((v /= 10) != 0);
  for (size_t i = 0; i < n; ++i) at[i] = digits[n - 1 - i];
  return n;
}

// Reads /proc/self/task/TID/LEAF into buf (NUL-terminated); the byte count, or -1 with errno.
ssize_t read_task_file(unsigned tid, const char* leaf, char* buf, size_t cap) {
  char path[64] = "/proc/self/task/";
  size_t n = std::strlen(path);
  n += put_uint(path + n, tid);
  path[n++] = '/';
  std::strcpy(path + n, leaf);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  ssize_t got = ::read(fd, buf, cap - 1);
  const int err = errno;
  ::close(fd);
  if (got < 0) {
    errno = err;
    return -1;
  }
  buf[got] = 0;
  return got;
}

enum class Task { kGone, kOurs, kOurWatcher, kProgram };

Task classify(unsigned tid) {
  char comm[32];
  if (read_task_file(tid, "comm", comm, sizeof comm) < 0)
    return errno == ENOENT || errno == ESRCH ? Task::kGone : Task::kProgram;  // unreadable: assume the program's
  if (std::strncmp(comm, kOwnThreadPrefix, sizeof kOwnThreadPrefix - 1) != 0) return Task::kProgram;
  const size_t w = sizeof kWatcherName - 1;
  return std::strncmp(comm, kWatcherName, w) == 0 && (comm[w] == '\n' || comm[w] == 0) ? Task::kOurWatcher
                                                                                       : Task::kOurs;
}

// The main thread has ended: a zombie (Z), dying (X), or gone.
bool main_thread_ended(unsigned pid) {
  char stat[512];
  if (read_task_file(pid, "stat", stat, sizeof stat) < 0) return errno == ENOENT || errno == ESRCH;
  const char* close = std::strrchr(stat, ')');  // the command may hold spaces and parentheses
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

// The process's thread count (num_threads in stat, the kernel's own count), or -1.
int thread_count(unsigned pid) {
  char stat[512];
  if (read_task_file(pid, "stat", stat, sizeof stat) < 0) return -1;
  const char* at = std::strrchr(stat, ')');
  if (!at) return -1;
  // Fields after the command: state is field 3, num_threads field 20.
  for (int field = 2; field < 20; ++field) {
    at = std::strchr(at + 1, ' ');
    if (!at) return -1;
  }
  return std::atoi(at + 1);
}

// The thread ids in /proc/self/task but pid, into ids; their number, or -1 when the directory
// cannot be read or holds more than cap.
int list_tasks(unsigned pid, unsigned* ids, int cap) {
  int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return -1;
  int count = 0;
  alignas(8) char buf[2048];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) count = -1;
    if (n <= 0) break;
    for (long at = 0; at < n && count >= 0;) {
      unsigned short reclen = 0;  // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      const char* name = buf + at + 19;
      at += reclen;
      unsigned tid = 0;
      bool number = *name != 0;
      for (const char* c = name; *c; ++c) {
        if (*c < '0' || *c > '9') number = false;
        tid = tid * 10 + unsigned(*c - '0');
      }
      if (!number || tid == pid) continue;
      if (count == cap)
        count = -1;
      else
        ids[count++] = tid;
    }
    if (count < 0) break;
  }
  ::close(dir);
  return count;
}

// True when the main thread has ended and every other thread is ours. Two listings of the
// threads bracket the look at each: a program thread that started another and then ended
// between the first listing and its own look would be taken for gone while its successor,
// missing from the first listing, runs on; the second listing shows that successor (any
// program thread alive at the second listing is either new, or was alive, and seen, at its look).
// A listing is not a snapshot: when the thread it stands on exits, the kernel resumes by
// position and skips the thread that took its place (a chain of threads each starting the
// next), so the second listing counts only when it holds as many threads as the kernel's count
// before and after it.
// With `decide`, true only for the watcher of the lowest thread id: a second copy of the
// library runs its own watcher, and exit() must not run twice at once.
bool only_ours(bool decide) noexcept {
  const int saved_errno = errno;
  const unsigned pid = unsigned(::getpid());
  const unsigned self = unsigned(thread_id());
  constexpr int kMost = 256;  // more threads than that: some are the program's
  unsigned first[kMost], second[kMost];
  bool result = main_thread_ended(pid);
  const int n1 = result ? list_tasks(pid, first, kMost) : -1;
  unsigned lowest_watcher = UINT32_MAX;
  for (int i = 0; i < n1 && result; ++i) {
    switch (classify(first[i])) {
      case Task::kGone:
        first[i] = 0;  // listed again below: a reused id, not ours
        break;
      case Task::kOurs:
        break;
      case Task::kOurWatcher:
        lowest_watcher = std::min(lowest_watcher, first[i]);
        break;
      case Task::kProgram:
        result = false;
        break;
    }
  }
  const int before = result ? thread_count(pid) : -1;
  const int n2 = result && n1 >= 0 ? list_tasks(pid, second, kMost) : -1;
  const int after = n2 >= 0 ? thread_count(pid) : -1;
  // list_tasks leaves pid out: the count has it (a zombie leader is still a thread).
  if (n1 < 0 || n2 < 0 || before != n2 + 1 || after != n2 + 1) result = false;
  for (int i = 0; i < n2 && result; ++i) {
    bool seen = false;
    for (int j = 0; j < n1 && !seen; ++j) seen = first[j] == second[i];
    result = seen;
  }
  if (result && decide && lowest_watcher != self) result = false;
  errno = saved_errno;
  return result;
}

// Says once that the watcher cannot work here (no /proc: a sandbox or chroot without it).
void say_cannot_watch() noexcept {
  const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::close(dir);
    return;
  }
  prim::write_stderr(
      "cxlpool: the main thread left through pthread_exit and /proc/self/task cannot be read: cxlpool "
      "cannot tell when the program's last thread ends, and its own threads keep the process alive after "
      "that; mount /proc for the program, or end main with exit() or a return\n");
}

void* watcher_main(void*) {
  if (g_main_mask_saved.load())
    prim::restore_signals(g_main_mask);  // the main thread's role for signals sent to the process
  else
    prim::block_async_signals(nullptr);
  ::prctl(PR_SET_NAME, kWatcherName, 0, 0, 0);
  say_cannot_watch();
  for (;;) {
    timespec ts{0, kLookEveryNs};
    while (::nanosleep(&ts, &ts) != 0) {
    }
    if (only_ours(true)) std::exit(0);  // what glibc's last thread does: atexit handlers, flushed stdio
  }
}

void start_watcher() noexcept {
  if (g_watcher_started.exchange(true)) return;
  unsigned long id = 0;
  if (prim::start_thread(watcher_main, nullptr, size_t(64) << 10, true, &id) != 0)
    g_watcher_started.store(false);  // the next thread of ours to start tries again
}

void on_main_thread_exit(void*) {
  if (thread_id() != ::getpid()) return;  // only the main thread has a value; be sure
  prim::block_signals(g_main_mask);       // reads the mask as it is ...
  prim::restore_signals(g_main_mask);     // ... and keeps it
  g_main_mask_saved.store(true);
  g_main_left.store(true);
  if (g_live.load() > 0) start_watcher();
}

}  // namespace

void watch_main_thread() noexcept {
  // Loaded by dlopen on another thread: the main thread's leaving is not seen (documented).
  if (g_key_made || thread_id() != ::getpid()) return;
  if (pthread_key_create(&g_key, on_main_thread_exit) != 0) return;
  g_key_made = true;
  pthread_setspecific(g_key, &g_key);
}

void own_threads_after_fork_child() noexcept {
  // The child's one thread is its main thread now; none of ours came along.
  g_live.store(0);
  g_main_left.store(false);
  g_main_mask_saved.store(false);
  g_watcher_started.store(false);
  if (g_key_made && unsigned(g_key) < kKeysWithoutAllocation) pthread_setspecific(g_key, &g_key);
}

OwnThread::OwnThread(const char* name) noexcept {
  ::prctl(PR_SET_NAME, name, 0, 0, 0);
  g_live.fetch_add(1);
  if (g_main_left.load()) start_watcher();
}

OwnThread::~OwnThread() { g_live.fetch_sub(1); }

bool only_own_threads_remain() noexcept { return only_ours(false); }

namespace {
std::atomic<void (*)() noexcept> g_enter_internal{nullptr};
std::atomic<void (*)() noexcept> g_leave_internal{nullptr};
}  // namespace

void set_internal_scope_hooks(void (*enter)() noexcept, void (*leave)() noexcept) noexcept {
  g_leave_internal.store(leave);
  g_enter_internal.store(enter);
}
void enter_internal_scope() noexcept {
  if (auto f = g_enter_internal.load()) f();
}
void leave_internal_scope() noexcept {
  if (auto f = g_leave_internal.load()) f();
}

}  // namespace cxlpool::os

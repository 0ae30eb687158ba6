// SPDX-License-Identifier: MIT
// Linux implementation of the core primitives (prim.hpp): raw system calls, no allocation,
// errno values returned instead of thrown.
#include <elf.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "os/prim.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MPOL_BIND
#define MPOL_BIND 2
#endif

namespace cxlpool::os::prim {

namespace {
size_t system_page() noexcept {
  static const size_t ps = size_t(sysconf(_SC_PAGESIZE));
  return ps;
}
}  // namespace

int reserve(size_t size, size_t alignment, void** out) noexcept {
  size_t ps = system_page();
  if (alignment < ps) alignment = ps;
  if (size == 0 || (alignment & (alignment - 1))) return EINVAL;
  // The exact size first: often aligned already, and no transient excess of address space
  // (which an RLIMIT_AS may not allow). Otherwise over-reserve and trim.
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void* exact = mmap(nullptr, size, PROT_NONE, kFlags, -1, 0);
  if (exact != MAP_FAILED) {
    const auto at = reinterpret_cast<uintptr_t>(exact);
    if ((at & (alignment - 1)) == 0) {
      *out = exact;
      return 0;
    }
    munmap(exact, size);
    // The aligned addresses just below and just above where the kernel found room are often
    // free too: no excess at all. MAP_FIXED_NOREPLACE never replaces a mapping (a kernel
    // before 4.17 takes the address as a hint: anything else it returns is given back).
    const uintptr_t below = at & ~(uintptr_t(alignment) - 1);
    for (uintptr_t want : {below, below + alignment}) {
      if (want == 0) continue;
      void* p = mmap(reinterpret_cast<void*>(want), size, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
      if (p == reinterpret_cast<void*>(want)) {
        *out = p;
        return 0;
      }
      if (p != MAP_FAILED) munmap(p, size);
    }
  }
  size_t span = size + alignment - ps;
  if (span < size) return ENOMEM;
  void* p = mmap(nullptr, span, PROT_NONE, kFlags, -1, 0);
  if (p == MAP_FAILED) return errno;
  auto base = reinterpret_cast<uintptr_t>(p);
  uintptr_t aligned = (base + alignment - 1) & ~(uintptr_t(alignment) - 1);
  if (aligned > base) munmap(p, aligned - base);
  size_t tail = (base + span) - (aligned + size);
  if (tail) munmap(reinterpret_cast<void*>(aligned + size), tail);
  *out = reinterpret_cast<void*>(aligned);
  return 0;
}

int unmap(void* addr, size_t size) noexcept { return munmap(addr, size) == 0 ? 0 : errno; }

int map_anonymous_fixed(void* addr, size_t size, bool shared, bool read_write) noexcept {
  int flags = (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE;
  return mmap(addr, size, read_write ? PROT_READ | PROT_WRITE : PROT_NONE, flags, -1, 0) == MAP_FAILED ? errno : 0;
}

int map_fd_fixed(void* addr, size_t size, int fd, uint64_t offset, bool shared) noexcept {
  int flags = (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_FIXED | (shared ? 0 : MAP_NORESERVE);
  return mmap(addr, size, PROT_NONE, flags, fd, off_t(offset)) == MAP_FAILED ? errno : 0;
}

int protect(void* addr, size_t size, bool read_write) noexcept {
  return mprotect(addr, size, read_write ? PROT_READ | PROT_WRITE : PROT_NONE) == 0 ? 0 : errno;
}

int protect_read_only(void* addr, size_t size) noexcept { return mprotect(addr, size, PROT_READ) == 0 ? 0 : errno; }

int copy_checked(void* dst, const void* src, size_t len) noexcept {
  auto* d = static_cast<char*>(dst);
  auto* sp = static_cast<const char*>(src);
  while (len) {
    iovec local{d, len}, remote{const_cast<char*>(sp), len};
    // By thread id: the process id names the main thread, whose memory is gone once it exited.
    ssize_t n = process_vm_readv(pid_t(syscall(SYS_gettid)), &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    d += n;
    sp += n;
    len -= size_t(n);
  }
  return 0;
}

int advise_thp(void* addr, size_t size, bool huge) noexcept {
  return madvise(addr, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0 ? 0 : errno;
}

int protect_prot(void* addr, size_t size, int prot) noexcept {
  const int p = (prot & 1 ? PROT_READ : 0) | (prot & 2 ? PROT_WRITE : 0) | (prot & 4 ? PROT_EXEC : 0);
  return mprotect(addr, size, p) == 0 ? 0 : errno;
}

int advise_dontneed(void* addr, size_t size) noexcept { return madvise(addr, size, MADV_DONTNEED) == 0 ? 0 : errno; }
int advise_remove(void* addr, size_t size) noexcept { return madvise(addr, size, MADV_REMOVE) == 0 ? 0 : errno; }
int populate_write(void* addr, size_t size) noexcept {
  return madvise(addr, size, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
}

int bind_node(void* addr, size_t size, int node) noexcept {
  constexpr int kMaxNodes = 4096;  // the kernel's MAX_NUMNODES on the largest configurations
  if (node < 0 || node >= kMaxNodes) return EINVAL;
  unsigned long mask[kMaxNodes / 64 + 1] = {};
  mask[unsigned(node) / 64] |= 1UL << (unsigned(node) % 64);
  // The mask length the kernel accepts is bounded by its own MAX_NUMNODES; pass just enough
  // words for this node (plus one: the length is "maxnode" = highest bit + 1, inclusive).
  unsigned long maxnode = (unsigned long)(node / 64 + 1) * 64 + 1;
  long r = syscall(SYS_mbind, addr, size, MPOL_BIND, mask, maxnode, 0U);
  return r == 0 ? 0 : errno;
}

int move_to_node(void* addr, size_t size, int node, size_t* elsewhere) noexcept {
  constexpr int kMaxNodes = 4096;
  if (node < 0 || node >= kMaxNodes) return EINVAL;
  unsigned long mask[kMaxNodes / 64 + 1] = {};
  mask[unsigned(node) / 64] |= 1UL << (unsigned(node) % 64);
  unsigned long maxnode = (unsigned long)(node / 64 + 1) * 64 + 1;
  *elsewhere = 0;
  const size_t ps = size_t(sysconf(_SC_PAGESIZE));
  constexpr size_t kBatch = 512;
  void* pages[kBatch];
  int status[kBatch];
  int nodes[kBatch];
  // Counts the present pages not on node (move_pages with nodes = NULL only queries); with
  // push, asks move_pages to move them there: unlike mbind without MPOL_MF_STRICT, it reports
  // a node without room for them (ENOMEM). Busy pages (pinned, or being migrated by someone
  // else) are only counted.
  auto sweep = [&](bool push, size_t* left) -> int {
    *left = 0;
    for (size_t done = 0; done < size; done += kBatch * ps) {
      size_t n = std::min(kBatch, (size - done) / ps);
      for (size_t i = 0; i < n; ++i) pages[i] = static_cast<char*>(addr) + done + i * ps;
      if (syscall(SYS_move_pages, 0, n, pages, nullptr, status, 0) != 0) return errno;
      size_t k = 0;
      for (size_t i = 0; i < n; ++i)
        if (status[i] >= 0 && status[i] != node) pages[k++] = pages[i];  // negative: absent (ENOENT, EFAULT)
      *left += k;
      if (push && k) {
        for (size_t i = 0; i < k; ++i) nodes[i] = node;
        if (syscall(SYS_move_pages, 0, k, pages, nodes, status, 0) < 0 && errno == ENOMEM) return ENOMEM;
      }
    }
    return 0;
  };
  for (int attempt = 0;; ++attempt) {
    // MPOL_MF_MOVE = 1 << 1: moves the pages only this process maps (no root needed). Without
    // MPOL_MF_STRICT the kernel returns 0 whatever it could not move, a full node included.
    long r = syscall(SYS_mbind, addr, size, MPOL_BIND, mask, maxnode, 2U);
    if (r != 0 && errno != EIO) return errno;  // EIO: some pages could not be moved; counted below
    size_t left = 0;
    if (int e = sweep(false, &left)) return e;
    *elsewhere = left;
    if (left == 0 || attempt == 3) return 0;  // the caller decides what pages left behind mean
    if (int e = sweep(true, &left)) return e;
  }
}

int clear_policy(void* addr, size_t size) noexcept {
  return syscall(SYS_mbind, addr, size, 0 /* MPOL_DEFAULT */, nullptr, 0UL, 0U) == 0 ? 0 : errno;
}

int move_mapping(void* from, size_t size, void* to) noexcept {
  return mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED ? errno : 0;
}

int punch_hole(int fd, uint64_t offset, size_t size) noexcept {
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(size)) == 0 ? 0 : errno;
}

int zero_range(int fd, uint64_t offset, size_t size) noexcept {
  static const char kZeros[65536] = {};
  while (size > 0) {
    const ssize_t n = pwrite(fd, kZeros, size < sizeof kZeros ? size : sizeof kZeros, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    offset += uint64_t(n);
    size -= size_t(n);
  }
  return 0;
}

int truncate_fd(int fd, uint64_t size) noexcept {
  for (;;) {
    if (ftruncate(fd, off_t(size)) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

int allocate_range(int fd, uint64_t offset, size_t size) noexcept {
  for (;;) {
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(size)) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

int file_policy(int fd, MemPolicy* out) noexcept {
  const size_t ps = system_page();
  void* probe = mmap(nullptr, ps, PROT_NONE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (probe == MAP_FAILED) return errno;
  MemPolicy p;
  // MPOL_F_ADDR (1 << 1): the policy of the mapping at probe, which for shmem is the file's own.
  long r = syscall(SYS_get_mempolicy, &p.mode, p.nodes, (unsigned long)kPolicyMaxNodes, probe, 2UL);
  const int err = r == 0 ? 0 : errno;
  munmap(probe, ps);
  if (err == 0) *out = p;
  return err;
}

int apply_policy(void* addr, size_t size, const MemPolicy& policy) noexcept {
  if (policy.mode == 0) return 0;
  // maxnode counts one more bit than the mask holds (the kernel's get_nodes drops one).
  long r = syscall(SYS_mbind, addr, size, policy.mode, policy.nodes, (unsigned long)kPolicyMaxNodes + 1, 0U);
  return r == 0 ? 0 : errno;
}

int file_id(int fd, FileId* out) noexcept {
  struct stat st {};
  if (fstat(fd, &st) != 0) return errno;
  out->dev = uint64_t(st.st_dev);
  out->ino = uint64_t(st.st_ino);
  return 0;
}

int move_fd_high(int fd) noexcept {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur < 64) return fd;
  // Well above what programs open themselves, below the limit; F_DUPFD takes the lowest free
  // number at or above the hint.
  long hint = long(rl.rlim_cur) - 32;
  if (hint > INT_MAX - 1) hint = INT_MAX - 1;
  if (hint <= fd) return fd;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, int(hint));
  if (high < 0) return fd;
  close(fd);
  return high;
}

void close_fd(int fd) noexcept {
  if (fd >= 0) close(fd);
}

int pwrite_all(int fd, const void* buf, size_t len, uint64_t off) noexcept {
  const char* p = static_cast<const char*>(buf);
  while (len) {
    ssize_t n = pwrite(fd, p, len, off_t(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    off += uint64_t(n);
    len -= size_t(n);
  }
  return 0;
}

void* map_shared_page() noexcept {
  void* p = mmap(nullptr, system_page(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_page(void* page) noexcept { munmap(page, system_page()); }

void sleep_ms(unsigned ms) noexcept {
  timespec ts{time_t(ms / 1000), long(ms % 1000) * 1'000'000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void futex_wait(const uint32_t* word, uint32_t expected, int timeout_ms) noexcept {
  struct timespec ts {
    time_t(timeout_ms / 1000), long(timeout_ms % 1000) * 1000000L
  };
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(uint32_t* word) noexcept { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

bool child_gone(int pid) noexcept {
  siginfo_t info{};
  if (waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  return info.si_pid == pid;  // exited, still waitable by the program
}

void block_signals(void* saved) noexcept {
  static_assert(sizeof(sigset_t) <= kSignalMaskBytes, "mask storage");
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, static_cast<sigset_t*>(saved));
}

void restore_signals(const void* saved) noexcept {
  pthread_sigmask(SIG_SETMASK, static_cast<const sigset_t*>(saved), nullptr);
}

void block_async_signals(void* saved) noexcept {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, static_cast<sigset_t*>(saved));
}

void unblock_async_signals_since(const void* saved) noexcept {
  const auto* before = static_cast<const sigset_t*>(saved);
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&set, sig);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(before, sig) == 1) sigdelset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

int replace_with_private_copy(void* addr, size_t len) noexcept {
  void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return errno;
  std::memcpy(tmp, addr, len);
  if (mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr) == MAP_FAILED) {
    int err = errno;
    munmap(tmp, len);
    return err;
  }
  return 0;
}

int copy_range(int in_fd, int out_fd, uint64_t off, size_t len) noexcept {
  loff_t in = loff_t(off), out = loff_t(off);
  while (len) {
    ssize_t n = copy_file_range(in_fd, &in, out_fd, &out, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    len -= size_t(n);
  }
  return 0;
}

int start_thread(void* (*fn)(void*), void* arg, size_t stack_bytes, bool detached, unsigned long* id) noexcept {
  constexpr size_t kMost = size_t(8) << 20;
  size_t stack = std::max<size_t>(stack_bytes, size_t(PTHREAD_STACK_MIN));
  for (;;) {
    pthread_attr_t attr;
    if (int e = pthread_attr_init(&attr)) return e;
    int e = pthread_attr_setstacksize(&attr, stack);
    if (!e && detached) e = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t tid{};
    if (!e) e = pthread_create(&tid, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (e == EINVAL && stack < kMost) {  // too small for the guard and the static TLS
      stack *= 2;
      continue;
    }
    if (!e) *id = static_cast<unsigned long>(tid);
    return e;
  }
}

int join_thread(unsigned long id) noexcept { return pthread_join(static_cast<pthread_t>(id), nullptr); }

namespace {

// Reads up to len-1 bytes of a small file (/proc) into buf, NUL-terminated. Bytes read, or -1.
ssize_t read_small(const char* path, char* buf, size_t len) noexcept {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n;
  do {
    n = read(fd, buf, len - 1);
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n < 0) return -1;
  buf[n] = 0;
  return n;
}

// The decimal number after the first occurrence of key in text (0 when there is none).
uint64_t number_after(const char* text, const char* key) noexcept {
  const char* at = std::strstr(text, key);
  if (!at) return 0;
  at += std::strlen(key);
  while (*at == ' ' || *at == '\t') ++at;
  uint64_t v = 0;
  for (; *at >= '0' && *at <= '9' && v < (uint64_t(1) << 40); ++at) v = v * 10 + uint64_t(*at - '0');
  return v;
}

// Threads of the processes whose real uid is uid, from /proc/PID/status, counting stops at
// enough. -1 when /proc cannot be listed.
int64_t user_tasks(uid_t uid, uint64_t enough) noexcept {
  const int dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return -1;
  uint64_t tasks = 0;
  alignas(8) char ents[4096];
  char path[48], status[4096];
  for (;;) {
    const long n = syscall(SYS_getdents64, dir, ents, sizeof ents);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct Dirent64 {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* e = reinterpret_cast<const Dirent64*>(ents + off);
      off += e->reclen;
      if (e->name[0] < '1' || e->name[0] > '9' || std::strlen(e->name) > 20) continue;
      std::snprintf(path, sizeof path, "/proc/%s/status", e->name);
      if (read_small(path, status, sizeof status) <= 0) continue;  // gone, or hidden (another user's)
      const char* uid_line = std::strstr(status, "\nUid:");
      if (!uid_line || number_after(uid_line, "\nUid:") != uint64_t(uid)) continue;
      tasks += std::max<uint64_t>(1, number_after(status, "\nThreads:"));
      if (tasks >= enough) break;
    }
    if (tasks >= enough) break;
  }
  close(dir);
  return int64_t(tasks);
}

std::atomic<uint64_t> g_headroom_until_ns{0};  // the scan's verdict holds until then
std::atomic<bool> g_headroom_verdict{false};
constexpr uint64_t kHeadroomScanEveryNs = 10'000'000'000;

}  // namespace

bool thread_headroom() noexcept {
  constexpr uint64_t margin = 64;  // threads left to the user's programs
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NPROC, &rl) != 0) return false;
  if (rl.rlim_cur == RLIM_INFINITY) return true;
  const uint64_t limit = rl.rlim_cur;
  // "0.12 0.34 0.56 2/345 6789": the fourth field is running/total tasks of the machine, a
  // bound on the user's that costs one read.
  char buf[128];
  if (read_small("/proc/loadavg", buf, sizeof buf) > 0) {
    const char* slash = std::strchr(buf, '/');
    if (slash && number_after(slash, "/") + margin < limit) return true;
  }
  // A tight limit, or a busy machine: count the user's own threads, at most every 10 s (a
  // scan of /proc reads one file per process).
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const uint64_t now = uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
  if (now < g_headroom_until_ns.load(std::memory_order_acquire))
    return g_headroom_verdict.load(std::memory_order_relaxed);
  const int64_t tasks = user_tasks(getuid(), limit);
  const bool room = tasks >= 0 && uint64_t(tasks) + margin < limit;
  g_headroom_verdict.store(room, std::memory_order_relaxed);
  g_headroom_until_ns.store(now + kHeadroomScanEveryNs, std::memory_order_release);
  return room;
}

int loader_range(uintptr_t* lo, uintptr_t* hi) noexcept {
  const uintptr_t base = getauxval(AT_BASE);
  if (base == 0) return ENOENT;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_phentsize != sizeof(Elf64_Phdr)) return ENOENT;
  const auto* ph = reinterpret_cast<const Elf64_Phdr*>(base + eh->e_phoff);
  uintptr_t end = 0;
  for (unsigned i = 0; i < eh->e_phnum; ++i)
    if (ph[i].p_type == PT_LOAD) end = std::max<uintptr_t>(end, ph[i].p_vaddr + ph[i].p_memsz);
  if (end == 0) return ENOENT;
  *lo = base;
  *hi = base + end;
  return 0;
}

int process_id() noexcept { return int(syscall(SYS_getpid)); }

size_t address_space_headroom() noexcept {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  // /proc/self/statm: first field is the total program size in pages.
  int fd = open("/proc/thread-self/statm", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return size_t(rl.rlim_cur) / 2;  // unknown use: assume half is taken
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return size_t(rl.rlim_cur) / 2;
  buf[n] = 0;
  uint64_t pages = 0;
  for (const char* c = buf; *c >= '0' && *c <= '9'; ++c) pages = pages * 10 + uint64_t(*c - '0');
  uint64_t used = pages * system_page();
  return used >= rl.rlim_cur ? 0 : size_t(rl.rlim_cur - used);
}

size_t address_space_limit() noexcept {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return size_t(rl.rlim_cur);
}

unsigned online_cpus() noexcept {
  static const unsigned n = [] {
    const long v = sysconf(_SC_NPROCESSORS_ONLN);
    return v > 0 ? unsigned(v) : 1u;
  }();
  return n;
}

void write_stderr(const char* text) noexcept {
  size_t len = std::strlen(text);
  while (len) {
    ssize_t n = write(2, text, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    len -= size_t(n);
  }
}

void exit_now(int status) noexcept { _exit(status); }

}  // namespace cxlpool::os::prim

// SPDX-License-Identifier: MIT
// Kernel-held I/O memory of this process (io_pins.hpp): io_uring registered buffers (the
// descriptors found in /proc/self/fd, each ring's /proc/self/fdinfo read in pieces through a
// small line parser: a ring may list up to 16,384 buffers) and the read system calls its
// threads are blocked in (/proc/self/task/*/syscall). Descriptors are listed through
// /proc/thread-self: once the main thread has exited, /proc/self's fd and fdinfo list nothing
// (and an empty listing is taken for an unreadable one, never for "no ring").
#include "os/io_pins.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "os/os.hpp"
#include "os/prim.hpp"

namespace cxlpool::os::io_pins {
namespace {

constexpr char kRingLink[] = "anon_inode:[io_uring]";

// Lines of one ring's fdinfo: "UserBufs:\t<n>", then n lines "<index>: 0x<addr>/<len>" or
// "<index>: <none>" (a sparse table's empty slot).
class Parser {
 public:
  Parser(uintptr_t begin, uintptr_t end) : begin_(begin), end_(end) {}

  void line(const char* s, size_t n) noexcept {
    if (state_ == kBefore) {
      constexpr char kKey[] = "UserBufs:";
      if (n >= sizeof kKey - 1 && std::memcmp(s, kKey, sizeof kKey - 1) == 0) {
        expected_ = number(s + sizeof kKey - 1, n - (sizeof kKey - 1), 10, nullptr);
        state_ = kEntries;
      }
      return;
    }
    if (state_ != kEntries) return;
    // "%5u: ..." : optional spaces, digits, a colon, a space.
    size_t i = 0;
    while (i < n && s[i] == ' ') ++i;
    const size_t digits = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == digits || i + 1 >= n || s[i] != ':' || s[i + 1] != ' ') {
      state_ = kAfter;
      return;
    }
    i += 2;
    ++seen_;
    if (n - i >= 2 && s[i] == '0' && s[i + 1] == 'x') {
      size_t used = 0;
      const uint64_t addr = number(s + i + 2, n - i - 2, 16, &used);
      const size_t slash = i + 2 + used;
      if (slash < n && s[slash] == '/') {
        const uint64_t len = number(s + slash + 1, n - slash - 1, 10, nullptr);
        if (addr < end_ && begin_ < addr + len && !overlap_) {
          overlap_ = true;
          hit_begin_ = uintptr_t(addr);
          hit_end_ = uintptr_t(addr + len);
        }
      } else {
        malformed_ = true;
      }
    } else if (!(n - i >= 6 && std::memcmp(s + i, "<none>", 6) == 0)) {
      malformed_ = true;
    }
  }

  Verdict verdict(uintptr_t* hb, uintptr_t* he) const noexcept {
    if (overlap_) {
      *hb = hit_begin_;
      *he = hit_end_;
      return Verdict::kOverlap;
    }
    if (state_ == kBefore || seen_ < expected_ || malformed_) return Verdict::kUnknown;
    return Verdict::kClear;
  }

 private:
  static uint64_t number(const char* s, size_t n, int base, size_t* used) noexcept {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) ++i;
    uint64_t v = 0;
    const size_t first = i;
    for (; i < n; ++i) {
      int d = -1;
      if (s[i] >= '0' && s[i] <= '9')
        d = s[i] - '0';
      else if (base == 16 && s[i] >= 'a' && s[i] <= 'f')
        d = s[i] - 'a' + 10;
      if (d < 0) break;
      v = v * uint64_t(base) + uint64_t(d);
    }
    if (used) *used = i - first;
    return v;
  }

  enum State { kBefore, kEntries, kAfter };
  uintptr_t begin_, end_;
  State state_ = kBefore;
  uint64_t expected_ = 0, seen_ = 0;
  bool overlap_ = false, malformed_ = false;
  uintptr_t hit_begin_ = 0, hit_end_ = 0;
};

// Feeds the parser whole lines from pieces of text; a line longer than the buffer (none in
// a ring's fdinfo) is cut.
class Lines {
 public:
  explicit Lines(Parser& p) : p_(p) {}
  void feed(const char* s, size_t n) noexcept {
    for (size_t i = 0; i < n; ++i) {
      if (s[i] == '\n') {
        p_.line(buf_, len_);
        len_ = 0;
      } else if (len_ < sizeof buf_) {
        buf_[len_++] = s[i];
      }
    }
  }
  void finish() noexcept {
    if (len_) p_.line(buf_, len_);
    len_ = 0;
  }

 private:
  Parser& p_;
  char buf_[256];
  size_t len_ = 0;
};

// One ring's buffers against the range.
Verdict check_ring(int proc_fdinfo, const char* name, uintptr_t begin, uintptr_t end, uintptr_t* hb, uintptr_t* he,
                   int* err) noexcept {
  const int fd = openat(proc_fdinfo, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return errno == ENOENT ? Verdict::kClear : Verdict::kUnknown;  // closed meanwhile: no ring there
  }
  Parser parser(begin, end);
  Lines lines(parser);
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      close(fd);
      return Verdict::kUnknown;
    }
    if (n == 0) break;
    lines.feed(chunk, size_t(n));
  }
  close(fd);
  lines.finish();
  return parser.verdict(hb, he);
}

struct LinuxDirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

// Calls visit(name, number) for each entry of dir whose name is a number (a descriptor, a
// thread), with getdents64 into a stack buffer: no allocation, usable under the fence. visit
// returns true to stop. Returns 0, or the errno of a failed read of the directory.
template <class Visit>
int for_each_numbered(int dir, Visit&& visit) noexcept {
  alignas(8) char buf[4096];
  for (;;) {
    const long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) return errno;
    if (n == 0) return 0;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
      off += d->d_reclen;
      if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
      if (visit(d->d_name, std::strtol(d->d_name, nullptr, 10))) return 0;
    }
  }
}

}  // namespace

Verdict parse_fdinfo(const char* text, size_t len, uintptr_t begin, uintptr_t end, uintptr_t* hit_begin,
                     uintptr_t* hit_end) noexcept {
  Parser parser(begin, end);
  Lines lines(parser);
  lines.feed(text, len);
  lines.finish();
  return parser.verdict(hit_begin, hit_end);
}

namespace {

Result scan_once(uintptr_t begin, uintptr_t end) noexcept {
  Result r;
  const int dir = open("/proc/thread-self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    r.error = errno;
    return r;
  }
  const int info = open("/proc/thread-self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (info < 0) {
    r.error = errno;
    close(dir);
    return r;
  }
  r.verdict = Verdict::kClear;
  bool saw_own = false;  // the listing must show the descriptor it is read through
  const int failed = for_each_numbered(dir, [&](const char* name, long number) {
    const int fd = int(number);
    saw_own |= fd == dir;
    if (fd == dir || fd == info) return false;
    // Only anonymous inodes (no file type: eventfd, epoll, io_uring, ...) can be rings; one
    // fstat rules out files, sockets and pipes far more cheaply than a readlink in /proc.
    struct stat st {};
    // Through the directory entry (the same open file): the descriptor itself is the program's.
    if (fstatat(dir, name, &st, 0) != 0 || (st.st_mode & S_IFMT) != 0) return false;
    char link[sizeof kRingLink + 1];
    const ssize_t k = readlinkat(dir, name, link, sizeof link);
    if (k != ssize_t(sizeof kRingLink - 1) || std::memcmp(link, kRingLink, sizeof kRingLink - 1) != 0) return false;
    uintptr_t hb = 0, he = 0;
    int err = 0;
    const Verdict v = check_ring(info, name, begin, end, &hb, &he, &err);
    if (v == Verdict::kOverlap) {
      r.verdict = v;
      r.ring_fd = fd;
      r.begin = hb;
      r.end = he;
      return true;
    }
    if (v == Verdict::kUnknown && r.verdict == Verdict::kClear) {
      r.verdict = v;
      r.ring_fd = fd;
      r.error = err;
    }
    return false;
  });
  // An empty listing is no listing: unknown, never clear (a ring found proves it is not empty;
  // the walk stops there, maybe before our own descriptor).
  if (failed != 0 || (!saw_own && r.verdict != Verdict::kOverlap)) {
    r = Result{};
    r.error = failed != 0 ? failed : EIO;
  }
  close(info);
  close(dir);
  return r;
}

}  // namespace

bool parse_syscall_line(const char* text, size_t len, long* nr, uint64_t args[6]) noexcept {
  // "<nr> 0x<arg1> ... 0x<arg6> 0x<sp> 0x<pc>", "-1 0x<sp> 0x<pc>" (blocked outside a system
  // call) or "running".
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < len && text[i] == ' ') ++i;
  };
  skip_spaces();
  if (i >= len || text[i] < '0' || text[i] > '9') return false;
  long n = 0;
  while (i < len && text[i] >= '0' && text[i] <= '9') n = n * 10 + (text[i++] - '0');
  for (int a = 0; a < 6; ++a) {
    skip_spaces();
    if (i + 2 > len || text[i] != '0' || text[i + 1] != 'x') return false;
    i += 2;
    uint64_t v = 0;
    size_t digits = 0;
    for (; i < len; ++i, ++digits) {
      const char c = text[i];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) break;
      v = v * 16 + uint64_t(d);
    }
    if (!digits) return false;
    args[a] = v;
  }
  *nr = n;
  return true;
}

namespace {

bool overlaps(uint64_t b, uint64_t len, uintptr_t begin, uintptr_t end) noexcept {
  return len && b < end && begin < b + len;
}

// Whether a read system call with these arguments writes into [begin, end); -1 when its
// vector cannot be read. *hb, *he: the overlapping destination.
int read_overlaps(long nr, const uint64_t args[6], uintptr_t begin, uintptr_t end, uintptr_t* hb,
                  uintptr_t* he) noexcept {
  if (nr == SYS_read || nr == SYS_pread64) {
    if (!overlaps(args[1], args[2], begin, end)) return 0;
    *hb = uintptr_t(args[1]);
    *he = uintptr_t(args[1] + args[2]);
    return 1;
  }
  if (nr != SYS_readv && nr != SYS_preadv && nr != SYS_preadv2) return 0;
  // The vector is in our own memory; read it as the kernel would (it may be gone by now).
  iovec iov[64];
  const uint64_t count = args[2] > 1024 ? 1024 : args[2];
  for (uint64_t at = 0; at < count; at += 64) {
    const size_t k = size_t(count - at < 64 ? count - at : 64);
    if (prim::copy_checked(iov, reinterpret_cast<const void*>(args[1] + at * sizeof(iovec)), k * sizeof(iovec)))
      return -1;
    for (size_t j = 0; j < k; ++j)
      if (overlaps(reinterpret_cast<uintptr_t>(iov[j].iov_base), iov[j].iov_len, begin, end)) {
        *hb = reinterpret_cast<uintptr_t>(iov[j].iov_base);
        *he = *hb + iov[j].iov_len;
        return 1;
      }
  }
  return 0;
}

// Whether a read from fd may hold the destination's pages pinned while the device writes them:
// a file or a device (O_DIRECT, FUSE direct I/O, ...). Pipes, sockets and anonymous inodes
// copy with copy_to_user, which a fence holds; a descriptor already gone counts (it may
// have been a file a moment ago).
bool may_pin(int fd) noexcept {
  char name[24], link[8];
  std::snprintf(name, sizeof name, "/proc/thread-self/fd/%d", fd);
  const ssize_t n = readlink(name, link, sizeof link);
  return n <= 0 || link[0] == '/';
}

}  // namespace

namespace {
// What thread tid's syscall file says now: 1 inside a read into [begin, end) that may pin,
// -1 inside one whose vector cannot be read, 0 elsewhere (or gone); kRunning: on a CPU or
// runnable, so the kernel shows no system call.
constexpr int kRunning = 2;
int look_at_thread(int dir, const char* name, uintptr_t begin, uintptr_t end, uintptr_t* hb, uintptr_t* he) noexcept {
  char path[64];
  std::snprintf(path, sizeof path, "%s/syscall", name);
  const int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;  // the thread is gone
  char line[256];
  const ssize_t k = read(fd, line, sizeof line - 1);
  close(fd);
  if (k >= 7 && std::memcmp(line, "running", 7) == 0) return kRunning;
  long nr = -1;
  uint64_t args[6] = {};
  if (k <= 0 || !parse_syscall_line(line, size_t(k), &nr, args)) return 0;
  const int v = read_overlaps(nr, args, begin, end, hb, he);
  return v != 0 && may_pin(int(args[0])) ? v : 0;
}

// How long threads seen running are looked at again, for a sign that no read they began
// before the fence is still running: asleep (its system call is shown then), or a read system
// call of theirs completed since (syscr in /proc/self/task/TID/io: a thread runs one call at a
// time, so the one it was inside has returned, its I/O done). Kernel code between pinning a
// read's pages and sleeping runs for microseconds once on a CPU; a thread preempted there
// (runnable) waits for a CPU. One still running, with no read completed, after this may be
// computing in user space or may be such a read: the move is not made.
constexpr uint64_t kRunningLookNs = 5000000;
constexpr int kMinRunningLooks = 3;
constexpr int kMaxRunning = 256;

// Whether any descriptor of the process is open with O_DIRECT (the "flags:" line of its
// /proc/self/fdinfo entry): 1 yes, 0 no, -errno when the directory cannot be read. Only such
// reads pin their destination for the device to write; buffered reads copy under the fence.
int direct_io_open() noexcept {
  const int dir = open("/proc/thread-self/fdinfo", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return -errno;
  bool found = false, saw_own = false;  // the listing must show the descriptor it is read through
  const int failed = for_each_numbered(dir, [&](const char* name, long number) {
    saw_own |= number == dir;
    const int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;  // closed meanwhile
    char text[128];
    const ssize_t k = read(fd, text, sizeof text - 1);
    close(fd);
    if (k <= 0) return false;
    text[k] = 0;
    const char* flags = std::strstr(text, "flags:");
    found = flags && (std::strtoul(flags + 6, nullptr, 8) & O_DIRECT) != 0;
    return found;
  });
  close(dir);
  if (failed == 0 && !found && !saw_own) return -EIO;
  return failed != 0 ? -failed : found ? 1 : 0;
}

// Read system calls thread `name` has completed (syscr); UINT64_MAX when it cannot be read.
uint64_t reads_done(int dir, const char* name) noexcept {
  char path[64], text[512];
  std::snprintf(path, sizeof path, "%s/io", name);
  const int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return UINT64_MAX;
  const ssize_t k = read(fd, text, sizeof text - 1);
  close(fd);
  if (k <= 0) return UINT64_MAX;
  text[k] = 0;
  const char* p = std::strstr(text, "syscr:");
  return p ? std::strtoull(p + 6, nullptr, 10) : UINT64_MAX;
}

}  // namespace

Result reads_in_flight(uintptr_t begin, uintptr_t end) noexcept {
  Result r;
  const int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    r.error = errno;
    return r;
  }
  const long me = syscall(SYS_gettid);
  r.verdict = Verdict::kClear;
  // Threads seen running, by name (a decimal tid), to be looked at again, with the reads they
  // had completed then.
  char running[kMaxRunning][16];
  uint64_t reads0[kMaxRunning];
  int n_running = 0;
  bool too_many = false;
  auto judge = [&](int v, long tid, uintptr_t hb, uintptr_t he) {
    r.tid = int(tid);
    if (v < 0) {
      r.verdict = Verdict::kUnknown;
      return false;
    }
    r.verdict = Verdict::kOverlap;
    r.begin = hb;
    r.end = he;
    return true;
  };
  const int failed = for_each_numbered(dir, [&](const char* name, long tid) {
    if (tid == me) return false;
    uintptr_t hb = 0, he = 0;
    const int v = look_at_thread(dir, name, begin, end, &hb, &he);
    if (v == kRunning) {
      if (n_running < kMaxRunning) {
        std::snprintf(running[n_running], sizeof running[0], "%ld", tid);
        reads0[n_running++] = reads_done(dir, name);
      } else {
        too_many = true;
      }
      return false;
    }
    return v != 0 && judge(v, tid, hb, he);
  });
  if (failed != 0) {
    r = Result{};
    r.error = failed;
  }
  // Threads seen running matter only if a read of theirs can pin: with no descriptor open
  // for direct I/O, none can.
  if (failed == 0 && r.verdict == Verdict::kClear && n_running > 0 && !too_many) {
    const int direct = direct_io_open();
    if (direct < 0) {
      r.verdict = Verdict::kUnknown;
      r.error = -direct;
      close(dir);
      return r;
    }
    if (direct == 0) n_running = 0;
  }
  const uint64_t until = monotonic_ns() + kRunningLookNs;
  for (int look = 0; failed == 0 && r.verdict != Verdict::kOverlap && n_running > 0 &&
                     (look < kMinRunningLooks || monotonic_ns() < until);
       ++look) {
    sched_yield();  // on a busy CPU, lets a thread waiting for it get to its sleep
    for (int i = 0; i < n_running;) {
      uintptr_t hb = 0, he = 0;
      const int v = look_at_thread(dir, running[i], begin, end, &hb, &he);
      if (v == kRunning) {
        const uint64_t now = reads_done(dir, running[i]);
        if (reads0[i] == UINT64_MAX || now == UINT64_MAX || now == reads0[i]) {
          ++i;
          continue;
        }
      } else if (v != 0 && judge(v, std::strtol(running[i], nullptr, 10), hb, he)) {
        break;
      }
      --n_running;  // settled
      std::memcpy(running[i], running[n_running], sizeof running[0]);
      reads0[i] = reads0[n_running];
    }
  }
  // A thread that ran through every look (or more running threads than can be followed): it
  // may be inside a read begun before the fence.
  if ((too_many || n_running > 0) && r.verdict == Verdict::kClear) {
    r.verdict = Verdict::kUnknown;
    r.error = EAGAIN;
    r.tid = n_running > 0 ? int(std::strtol(running[0], nullptr, 10)) : -1;
  }
  close(dir);
  return r;
}

Result registered_buffers(uintptr_t begin, uintptr_t end, int attempts) noexcept {
  Result r = scan_once(begin, end);
  for (int i = 1; i < attempts && r.verdict == Verdict::kUnknown; ++i) {
    sched_yield();
    r = scan_once(begin, end);
  }
  return r;
}

}  // namespace cxlpool::os::io_pins

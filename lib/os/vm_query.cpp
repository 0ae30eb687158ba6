// SPDX-License-Identifier: MIT
// /proc/self/maps protection runs, a PMU probe and capability checks (vm_query.hpp).
#include "os/vm_query.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cxlpool::os::vm_query {
namespace {

bool parse_hex(const char*& p, const char* end, uintptr_t* out) noexcept {
  uintptr_t v = 0;
  const char* start = p;
  for (; p < end; ++p) {
    char c = *p;
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = (v << 4) | uintptr_t(d);
  }
  *out = v;
  return p != start;
}

// Calls line(begin, end) for every line of the file at path (without its newline), in order;
// line returns false to stop. 0 or an errno.
template <class Line>
int for_each_line(const char* path, Line&& line) noexcept {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[16384];
  size_t have = 0;
  int result = 0;
  bool done = false, eof = false;
  while (!done) {
    if (!eof && have < sizeof buf) {
      ssize_t r = read(fd, buf + have, sizeof buf - have);
      if (r < 0) {
        if (errno == EINTR) continue;
        result = errno;
        break;
      }
      if (r == 0) eof = true;
      have += size_t(r);
    }
    // Whole lines in buf[0, have).
    size_t used = 0;
    for (;;) {
      const char* l = buf + used;
      const char* nl = static_cast<const char*>(memchr(l, '\n', have - used));
      if (!nl) {
        if (eof && used < have)
          nl = buf + have;  // a last line without its newline
        else
          break;
      }
      used = size_t(nl - buf) + (nl < buf + have ? 1 : 0);
      if (!line(l, nl)) {
        done = true;
        break;
      }
      if (used >= have) break;
    }
    if (done) break;
    memmove(buf, buf + used, have - used);
    have -= used;
    if (eof && have == 0) break;
    if (have == sizeof buf) {  // a line longer than the buffer (a long path): skip to its end
      have = 0;
    }
  }
  close(fd);
  return result;
}

// A mapping's header line of /proc/self/maps or smaps: "lo-hi perms ...". perms points at
// its 4-letter "rwxp" field.
bool parse_mapping(const char* p, const char* nl, uintptr_t* lo, uintptr_t* hi, const char** perms) noexcept {
  bool ok = parse_hex(p, nl, lo) && p < nl && *p++ == '-' && parse_hex(p, nl, hi) && p + 5 <= nl && *p++ == ' ';
  *perms = p;
  return ok;
}

// Calls each(lo, hi, perms) for every mapping of /proc/self/maps that overlaps [begin, end),
// in ascending order, clipped to it; each returns false to stop. 0 or an errno.
template <class Each>
int for_each_mapping(uintptr_t begin, uintptr_t end, Each&& each) noexcept {
  return for_each_line("/proc/thread-self/maps", [&](const char* p, const char* nl) {
    uintptr_t lo = 0, hi = 0;
    const char* perms = nullptr;
    if (!parse_mapping(p, nl, &lo, &hi, &perms)) return true;
    if (lo >= end) return false;
    return hi <= begin || each(lo < begin ? begin : lo, hi > end ? end : hi, perms);
  });
}

}  // namespace

int vma_flags(uintptr_t begin, uintptr_t end, unsigned* out) noexcept {
  *out = 0;
  bool inside = false;
  return for_each_line("/proc/thread-self/smaps", [&](const char* p, const char* nl) {
    uintptr_t lo = 0, hi = 0;
    const char* perms = nullptr;
    if (parse_mapping(p, nl, &lo, &hi, &perms)) {
      if (lo >= end) return false;
      inside = hi > begin;
      return true;
    }
    if (!inside || nl - p < 8 || memcmp(p, "VmFlags:", 8) != 0) return true;
    for (const char* c = p + 8; c + 2 <= nl; ++c) {
      if (c[0] == ' ') continue;
      struct Code {
        char a, b;
        unsigned flag;
      };
      static constexpr Code kCodes[] = {{'l', 'o', kVmLocked},   {'d', 'd', kVmDontDump},   {'w', 'f', kVmWipeOnFork},
                                        {'d', 'c', kVmDontCopy}, {'n', 'h', kVmNoHugePage}, {'h', 'g', kVmHugePage}};
      for (const Code& k : kCodes)
        if (c[0] == k.a && c[1] == k.b && (c + 2 == nl || c[2] == ' ')) *out |= k.flag;
      while (c < nl && *c != ' ') ++c;
    }
    return true;
  });
}

int read_write_runs(uintptr_t begin, uintptr_t end, Run* out, size_t cap, size_t* n) noexcept {
  *n = 0;
  int result = 0;
  int e = for_each_mapping(begin, end, [&](uintptr_t b, uintptr_t e2, const char* perms) {
    if (perms[0] != 'r' || perms[1] != 'w') return true;
    if (*n && out[*n - 1].end == b) {
      out[*n - 1].end = e2;
    } else if (*n == cap) {
      result = ENOSPC;
      return false;
    } else {
      out[(*n)++] = Run{b, e2};
    }
    return true;
  });
  return e ? e : result;
}

int protection_runs(uintptr_t begin, uintptr_t end, ProtRun* out, size_t cap, size_t* n) noexcept {
  *n = 0;
  int result = 0;
  uintptr_t at = begin;
  auto add = [&](uintptr_t b, uintptr_t e2, int prot) {
    if (*n && out[*n - 1].end == b && out[*n - 1].prot == prot) {
      out[*n - 1].end = e2;
      return true;
    }
    if (*n == cap) {
      result = ENOSPC;
      return false;
    }
    out[(*n)++] = ProtRun{b, e2, prot};
    return true;
  };
  int e = for_each_mapping(begin, end, [&](uintptr_t b, uintptr_t e2, const char* perms) {
    if (b > at && !add(at, b, kUnmapped)) return false;
    at = e2;
    return add(b, e2, (perms[0] == 'r' ? kRead : 0) | (perms[1] == 'w' ? kWrite : 0) | (perms[2] == 'x' ? kExec : 0));
  });
  if (!e && !result && at < end) add(at, end, kUnmapped);
  return e ? e : result;
}

int probe_hw_cycles() noexcept {
  perf_event_attr a{};
  a.size = sizeof a;
  a.type = PERF_TYPE_HARDWARE;
  a.config = PERF_COUNT_HW_CPU_CYCLES;
  a.disabled = 1;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) return errno;
  close(int(fd));
  return 0;
}

bool has_capability(int cap) noexcept {
  __user_cap_header_struct h{};
  __user_cap_data_struct d[2]{};
  h.version = _LINUX_CAPABILITY_VERSION_3;
  h.pid = 0;
  if (syscall(SYS_capget, &h, d) != 0) return false;
  if (cap < 0 || cap >= 64) return false;
  return (d[cap / 32].effective >> (cap % 32)) & 1u;
}

}  // namespace cxlpool::os::vm_query

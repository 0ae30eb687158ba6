// SPDX-License-Identifier: MIT
// Room for a device's memory (room.hpp): statvfs, the huge-page pool in sysfs, and the memory
// cgroup's limit and usage read along the process's cgroup path up to the root.
#include "os/room.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace cxlpool::os {
namespace {

constexpr long kHugetlbfsMagic = 0x958458f6;

// The first line of a small pseudo file, without its newline; "" when unreadable.
std::string first_line(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n;
  do {
    n = read(fd, buf, sizeof buf - 1);
  } while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  return s.substr(0, s.find('\n'));
}

// A decimal number, or false for anything else ("max", "", garbage).
bool number(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + uint64_t(c - '0');
  }
  *out = v;
  return true;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Walks dir and its parents up to root; keeps the cgroup with the least room under its limit.
void walk(const std::string& root, std::string dir, const char* limit_file, const char* usage_file, CgroupRoom* best,
          bool* found) {
  constexpr uint64_t kUnlimited = uint64_t(1) << 62;  // v1 reports "no limit" as ~2^63
  for (;;) {
    uint64_t limit = 0, usage = 0;
    const std::string at = root + dir;
    if (number(first_line(at + "/" + limit_file), &limit) && limit < kUnlimited) {
      if (!number(first_line(at + "/" + usage_file), &usage)) usage = 0;
      const uint64_t room = usage >= limit ? 0 : limit - usage;
      const uint64_t best_room = best->usage >= best->limit ? 0 : best->limit - best->usage;
      if (!*found || room < best_room) {
        best->limit = limit;
        best->usage = usage;
        best->path = at + "/" + limit_file;
        *found = true;
      }
    }
    if (dir.empty() || dir == "/") return;
    const size_t slash = dir.find_last_of('/');
    dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
  }
}

}  // namespace

bool filesystem_room(const std::string& dir, FsRoom* out) noexcept {
  try {
    struct statfs sfs {};
    if (statfs(dir.c_str(), &sfs) != 0) return false;
    FsRoom r;
    if (sfs.f_type != kHugetlbfsMagic) {
      struct statvfs sv {};
      if (statvfs(dir.c_str(), &sv) != 0) return false;
      r.bytes = uint64_t(sv.f_bavail) * sv.f_frsize;
      *out = r;
      return true;
    }
    // hugetlbfs: pages come from the pool of its page size; a mount with size= (or
    // nr_inodes/min_size) reports its own limit through statfs, an unlimited one reports 0.
    r.huge_page = size_t(sfs.f_bsize);
    const std::string pool = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(r.huge_page >> 10) + "kB/";
    uint64_t free_pages = 0, reserved = 0;
    if (!number(first_line(pool + "free_hugepages"), &free_pages)) return false;
    if (!number(first_line(pool + "resv_hugepages"), &reserved)) reserved = 0;
    uint64_t pages = free_pages > reserved ? free_pages - reserved : 0;
    if (sfs.f_blocks > 0) pages = std::min<uint64_t>(pages, uint64_t(sfs.f_bavail));
    r.bytes = pages * r.huge_page;
    *out = r;
    return true;
  } catch (...) {
    return false;
  }
}

bool memory_cgroup_room(CgroupRoom* out, const std::string& proc_cgroup, const std::string& cgroupfs) noexcept {
  try {
    // /proc/self/cgroup: "0::/path" for the unified (v2) hierarchy, "N:...memory...:/path" for
    // v1's memory controller; paths are relative to the cgroup namespace's root, which is what
    // /sys/fs/cgroup shows.
    int fd = open(proc_cgroup.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || text.size() > (64u << 10)) break;
      text.append(buf, size_t(n));
    }
    close(fd);
    CgroupRoom best;
    bool found = false;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      const size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
      if (c2 == std::string::npos) continue;
      const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
      if (path.find("/..") != std::string::npos) continue;  // never leave the cgroup mount
      if (line.compare(0, c1, "0") == 0 && controllers.empty()) {
        const std::string root = exists(cgroupfs + "/cgroup.controllers") ? cgroupfs : cgroupfs + "/unified";
        walk(root, path, "memory.max", "memory.current", &best, &found);
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        walk(cgroupfs + "/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes", &best, &found);
      }
    }
    if (found) *out = best;
    return found;
  } catch (...) {
    return false;
  }
}

}  // namespace cxlpool::os

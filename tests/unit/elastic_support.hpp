// SPDX-License-Identifier: MIT
// What the elastic-capacity tests share (elastic_test.cpp, dcd_test.cpp): a topology of
// declared devices, blocks whose bytes can be checked, and the device's figures.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace cxlpool_test::elastic {

constexpr uint64_t kMiB = 1024 * 1024;

struct Topo : cxlpool_test::CapiTopology {
  explicit Topo(const std::string& devices)
      : CapiTopology(devices, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) {}
};

// Moves between devices that copy need a write fence that holds system calls: a userfaultfd
// that handles kernel faults (root, vm.unprivileged_userfaultfd=1, or /dev/userfaultfd open to
// the user). Without one a withdrawal that must move is BUSY.
inline bool copies_fenced() {
  int fd = int(syscall(SYS_userfaultfd, O_CLOEXEC));
  if (fd < 0) fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  close(fd);
  return true;
}

struct Block {
  unsigned char* p;
  size_t n;
  unsigned seed;
};

inline void fill(const Block& b) {
  for (size_t i = 0; i < b.n; i += 256) b.p[i] = static_cast<unsigned char>(b.seed + i / 256);
  b.p[b.n - 1] = static_cast<unsigned char>(b.seed);
}
inline bool intact(const Block& b) {
  for (size_t i = 0; i < b.n; i += 256)
    if (b.p[i] != static_cast<unsigned char>(b.seed + i / 256)) return false;
  return b.p[b.n - 1] == static_cast<unsigned char>(b.seed);
}

// Blocks of 1 KiB to 8 MiB (small classes, multi-slice pages, huge spans) until the pool's
// device `dev` holds about `bytes`.
inline std::vector<Block> allocate_until(cxlpool_pool_t* pool, int dev, uint64_t bytes) {
  std::vector<Block> out;
  const size_t sizes[] = {1000, 4096, 30000, 200000, 900000, 3 * kMiB, 8 * kMiB};
  for (unsigned i = 0;; ++i) {
    cxlpool_stats_t s{};
    REQUIRE(cxlpool_pool_get_stats(pool, dev, &s) == CXLPOOL_OK);
    if (s.resident_bytes >= bytes) return out;
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, sizes[i % 7])), sizes[i % 7], i};
    REQUIRE(b.p != nullptr);
    fill(b);
    out.push_back(b);
  }
}

inline bool all_intact(const std::vector<Block>& blocks) {
  for (const Block& b : blocks)
    if (!intact(b)) return false;
  return true;
}

// Destroys the pool however the test ends: a pool left open keeps its devices open, and a
// later test's device of the same name would then be ambiguous.
struct PoolGuard {
  cxlpool_pool_t* pool;
  ~PoolGuard() { cxlpool_pool_destroy(pool); }
};

// A raw backing on the topology's target `name`.
inline cxlpool_backing_t* open_backing(const Topo& t, const char* name) {
  size_t index = 0;
  REQUIRE(cxlpool_topology_find_target(t.topo, name, &index) == CXLPOOL_OK);
  cxlpool_backing_t* b = nullptr;
  REQUIRE(cxlpool_backing_open(t.topo, index, &b) == CXLPOOL_OK);
  return b;
}

inline cxlpool_device_capacity_t capacity_of(const char* device) {
  cxlpool_device_capacity_t c{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_get_capacity(device, &c) == CXLPOOL_OK);
  return c;
}

inline cxlpool_stats_t stats_of(cxlpool_pool_t* pool, int dev) {
  cxlpool_stats_t s{};
  REQUIRE(cxlpool_pool_get_stats(pool, dev, &s) == CXLPOOL_OK);
  return s;
}

// The length and allocated bytes of a device's unnamed files: those whose /proc/self/fd link
// starts with prefix (O_TMPFILE files show as "dir/#inode (deleted)", memfds as
// "/memfd:cxlpool:NAME (deleted)").
struct FileUse {
  uint64_t size = 0, allocated = 0;
  int files = 0;
};
inline FileUse files_in(const std::string& prefix) {
  FileUse u;
  DIR* d = opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    char link[4096];
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = 0;
    if (std::strncmp(link, prefix.c_str(), prefix.size()) != 0) continue;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) continue;
    u.size = std::max<uint64_t>(u.size, uint64_t(st.st_size));
    u.allocated += uint64_t(st.st_blocks) * 512;
    ++u.files;
  }
  closedir(d);
  return u;
}

}  // namespace cxlpool_test::elastic

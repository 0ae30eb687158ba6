// SPDX-License-Identifier: MIT
// Storage creation (memfd, O_TMPFILE in a device's directory, device-DAX with an exclusive
// lock, anonymous NUMA memory), identity-checked mapping, and the offset allocator.
#include "backing/storage.hpp"

#include <cerrno>

#include "common/error.hpp"
#include "os/os.hpp"

namespace cxlpool::detail {

ForkMode effective_fork_mode(const BackingSpec& spec) {
  if (spec.kind == CXLPOOL_BACKING_DEVDAX) return ForkMode::kCopy;
  if (spec.fork_mode != ForkMode::kDefault) return spec.fork_mode;
  return spec.kind == CXLPOOL_BACKING_FILE ? ForkMode::kCopy : ForkMode::kCopyOnWrite;
}

cxlpool_backing_caps_t describe_backing(const BackingSpec& spec) {
  cxlpool_backing_caps_t c{};
  c.kind = spec.kind;
  c.numa_node = spec.kind == CXLPOOL_BACKING_NUMA ? spec.numa_node : -1;
  c.shareable = spec.kind != CXLPOOL_BACKING_NUMA;
  c.kernel_migratable = spec.kind == CXLPOOL_BACKING_NUMA;
  c.decommit_frees_memory = spec.kind != CXLPOOL_BACKING_DEVDAX;
  c.page_size = spec.page_size ? spec.page_size : os::page_size();
  c.capacity_bytes = spec.capacity;
  return c;
}

std::shared_ptr<Storage> Storage::create(const BackingSpec& spec, bool fork_copy) {
  std::shared_ptr<Storage> s(new Storage());
  s->size_ = spec.capacity;
  s->page_size_ = spec.page_size ? spec.page_size : os::page_size();
  const std::string dev = "device '" + spec.device_name + "'";
  if (spec.kind == CXLPOOL_BACKING_NUMA) {
    s->numa_node_ = spec.numa_node;
    s->description_ = "anonymous memory bound to node " + std::to_string(spec.numa_node);
    return s;
  }
  int fd = -1;
  switch (spec.kind) {
    case CXLPOOL_BACKING_SHM:
      // Never the name itself: an unnamed file in the same tmpfs, gone with the last mapping.
      fd = os::open_tmpfile("/dev/shm", dev);
      s->description_ = "unnamed file in /dev/shm";
      break;
    case CXLPOOL_BACKING_FILE: {
      std::string dir = os::parent_dir(spec.path);
      fd = os::open_tmpfile(dir, dev);
      s->description_ = "unnamed file in " + dir;
      break;
    }
    case CXLPOOL_BACKING_DEVDAX:
      if (!fork_copy) {
        fd = os::open_char_device(spec.path);
        try {
          os::lock_exclusive(fd, dev + ": devdax:" + spec.path);
        } catch (...) {
          os::close_fd(fd);
          throw;
        }
        s->description_ = spec.path;
        break;
      }
      [[fallthrough]];  // a fork child's copy of device-DAX memory lives in a memfd
    default:
      fd = os::memfd_create("cxlpool:" + spec.device_name);
      s->description_ = "memfd";
      break;
  }
  s->fd_ = fd;
  try {
    if (spec.kind != CXLPOOL_BACKING_DEVDAX || fork_copy) os::truncate_fd(fd, spec.capacity);
    if (int err = os::prim::file_id(fd, &s->id_)) fail_os(dev + ": fstat of its storage", err);
  } catch (...) {
    os::close_fd(fd);
    s->fd_ = -1;
    throw;
  }
  s->fd_ = os::prim::move_fd_high(fd);
  s->free_.emplace(0, spec.capacity);
  return s;
}

Storage::~Storage() { os::prim::close_fd(fd_); }

int Storage::check_identity() noexcept {
  if (lost_) return EBADF;
  os::prim::FileId now;
  if (os::prim::file_id(fd_, &now) != 0 || !(now == id_)) {
    lost_ = true;  // never touch that descriptor again: it may be one of the program's files
    fd_ = -1;
    return EBADF;
  }
  return 0;
}

int Storage::map(void* addr, size_t len, uint64_t offset, bool shared) noexcept {
  if (fd_ < 0 && !lost_) {
    if (int err = os::prim::map_anonymous_fixed(addr, len, shared)) return err;
    return os::prim::bind_node(addr, len, numa_node_);
  }
  if (int err = check_identity()) return err;
  return os::prim::map_fd_fixed(addr, len, fd_, offset, shared);
}

int Storage::take_range(size_t size, size_t alignment, uint64_t* offset, uint64_t* largest) noexcept {
  if (alignment < page_size_) alignment = page_size_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    uint64_t start = (it->first + alignment - 1) & ~uint64_t(alignment - 1);
    if (start >= it->second || it->second - start < size) continue;
    uint64_t lo = it->first, hi = it->second;
    try {
      free_.erase(it);
      if (lo < start) free_.emplace(lo, start);
      if (start + size < hi) free_.emplace(start + size, hi);
    } catch (...) {
      return ENOMEM;
    }
    *offset = start;
    return 0;
  }
  uint64_t best = 0;
  for (auto& [lo, hi] : free_) best = std::max(best, hi - lo);
  *largest = best;
  return ENOSPC;
}

void Storage::take_exact(uint64_t offset, size_t size) noexcept {
  uint64_t end = offset + size;
  auto it = free_.upper_bound(offset);
  if (it != free_.begin()) --it;
  while (it != free_.end() && it->first < end) {
    uint64_t lo = it->first, hi = it->second;
    if (hi <= offset) {
      ++it;
      continue;
    }
    it = free_.erase(it);
    try {
      if (lo < offset) free_.emplace(lo, offset);
      if (hi > end) free_.emplace(end, hi);
    } catch (...) {
    }
  }
}

void Storage::give_back_range(uint64_t offset, size_t size) noexcept {
  uint64_t start = offset, end = offset + size;
  auto next = free_.lower_bound(start);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  next = free_.lower_bound(end);
  if (next != free_.end() && next->first == end) {
    end = next->second;
    free_.erase(next);
  }
  try {
    free_.emplace(start, end);
  } catch (...) {
    // Out of host memory for one map node: the range is lost to this process, nothing else.
  }
}

}  // namespace cxlpool::detail

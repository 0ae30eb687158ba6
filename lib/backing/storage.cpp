// SPDX-License-Identifier: MIT
// Storage creation (what to open is the device's provider's: backing/provider.hpp),
// identity-checked mapping, and the offset allocator.
#include "backing/storage.hpp"

#include <algorithm>
#include <cerrno>

#include "backing/provider.hpp"
#include "common/error.hpp"
#include "os/os.hpp"

namespace cxlpool::detail {

std::shared_ptr<Storage> Storage::create(const BackingSpec& spec, bool fork_copy) {
  const Provider* provider = provider_for(spec.kind);
  const std::string dev = "device '" + spec.device_name + "'";
  if (!provider) fail(CXLPOOL_E_CONFIG, dev + ": no provider for backing kind " + std::to_string(spec.kind));
  std::shared_ptr<Storage> s(new Storage());
  s->size_ = spec.capacity;
  s->page_size_ = spec.page_size ? spec.page_size : os::page_size();
  StorageOpen opened;
  provider->open_storage(spec, fork_copy, &opened);
  s->description_ = opened.description;
  s->state_ = std::move(opened.state);
  if (opened.fd < 0) {
    s->numa_node_ = opened.numa_node;
    return s;
  }
  const int fd = opened.fd;
  try {
    if (opened.sized_by_cxlpool) os::truncate_fd(fd, spec.capacity);
    if (int err = os::prim::file_id(fd, &s->id_)) fail_os(dev + ": fstat of its storage", err);
  } catch (...) {
    os::close_fd(fd);
    throw;
  }
  s->fd_ = os::prim::move_fd_high(fd);
  s->placement_in_storage_ = opened.filesystem_file && os::fd_needs_shared_mapping(s->fd_);
  s->hugetlbfs_ = opened.filesystem_file && os::fd_on_hugetlbfs(s->fd_);
  s->room_limited_ = opened.room_limited;
  s->resizable_ = opened.sized_by_cxlpool;
  // Where the file has a policy of its own (a tmpfs mounted with mpol=), its private pages
  // are placed by it, as the kernel places a private copy-on-write copy of a tmpfs page.
  if (!s->hugetlbfs_ && opened.sized_by_cxlpool)
    os::prim::file_policy(s->fd_, &s->policy_);  // none when it cannot be read: default placement
  if (opened.space == 0) {
    s->free_.insert(0, spec.capacity);
    return s;
  }
  s->size_ = opened.space;  // borrowed capacity: only the online ranges are offsets to hand out
  s->borrowed_ = true;
  s->online_at_open_ = std::move(opened.online);
  s->refusal_at_open_ = std::move(opened.refusal);
  for (auto& [lo, hi] : s->online_at_open_) s->free_.insert(lo, hi);
  return s;
}

std::shared_ptr<Storage> Storage::anonymous_copy() noexcept {
  try {
    std::shared_ptr<Storage> s(new Storage());
    s->description_ = "anonymous memory (a fork child's copy)";
    return s;
  } catch (...) {
    return nullptr;
  }
}

// Closes the descriptor only while it is ours: a program may have closed it and opened a
// file of its own on the same number.
Storage::~Storage() {
  if (fd_ >= 0 && check_identity() == 0) os::prim::close_fd(fd_);
}

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
    return numa_node_ < 0 ? 0 : os::prim::bind_node(addr, len, numa_node_);
  }
  if (!shared && !hugetlbfs_) {
    // Private pages of a file device are anonymous memory (storage.hpp): the descriptor is
    // not needed, and a placement the file's policy cannot get is no reason to refuse memory.
    if (int err = os::prim::map_anonymous_fixed(addr, len, false)) return err;
    os::prim::apply_policy(addr, len, policy_);
    return 0;
  }
  if (int err = check_identity()) return err;
  return os::prim::map_fd_fixed(addr, len, fd_, offset, shared);
}

int Storage::reserve_room(void* addr, uint64_t offset, size_t len) noexcept {
  if (!room_limited_) return 0;  // memfd: no filesystem to fill (a memory cgroup's limit: docs/backing.md)
  int e = check_identity() == 0 ? os::prim::allocate_range(fd_, offset, len) : EOPNOTSUPP;
  if (e == EOPNOTSUPP || e == ENOSYS) {
    // No fallocate here (or no descriptor): writing the pages in through the shared mapping
    // takes their room, as a program's first touch would (EFAULT where that would SIGBUS).
    e = os::prim::populate_write(addr, len);
    if (e == EFAULT) e = ENOSPC;
    if (e == EINVAL) e = 0;  // a kernel before 5.14: nothing better to be had
  }
  return e;
}

int Storage::take_range(size_t size, size_t alignment, uint64_t* offset, uint64_t* largest) noexcept {
  if (alignment < page_size_) alignment = page_size_;
  uint64_t found = 0, best = 0;
  bool ok = free_.find_if([&](uint64_t lo, uint64_t hi) {
    uint64_t start = (lo + alignment - 1) & ~uint64_t(alignment - 1);
    best = std::max(best, hi - lo);
    if (start >= hi || hi - start < size) return false;
    found = start;
    return true;
  });
  if (!ok) {
    *largest = best;
    return ENOSPC;
  }
  try {
    free_.erase(found, found + size);
  } catch (...) {
    return ENOMEM;  // splitting a range needs one map node
  }
  *offset = found;
  return 0;
}

int Storage::take_mappable_range(size_t size, size_t address_alignment, uint64_t* offset, uint64_t* largest) noexcept {
  constexpr size_t kHugeOffset = size_t(2) << 20;
  const size_t preferred = size % kHugeOffset == 0 ? std::min(std::max(address_alignment, page_size_), kHugeOffset) : 0;
  if (preferred > page_size_) {
    const int e = take_range(size, preferred, offset, largest);
    if (e != ENOSPC) return e;
  }
  return take_range(size, page_size_, offset, largest);
}

bool Storage::take_exact(uint64_t offset, size_t size) noexcept {
  try {
    free_.erase(offset, offset + size);
    return true;
  } catch (...) {
    return false;  // out of host memory for one map node
  }
}

void Storage::give_back_range(uint64_t offset, size_t size) noexcept {
  try {
    if (withheld_.empty() || !withheld_.covered(offset, offset + size)) {
      free_.insert(offset, offset + size);
      return;
    }
    withheld_.for_each_gap(offset, offset + size, [&](uint64_t lo, uint64_t hi) { free_.insert(lo, hi); });
  } catch (...) {
    // Out of host memory for one map node: the range is lost to this process, nothing else.
  }
}

bool Storage::withhold(uint64_t lo, uint64_t hi) noexcept {
  try {
    withheld_.insert(lo, hi);
    free_.erase(lo, hi);
    return true;
  } catch (...) {
    return false;
  }
}

void Storage::restore(uint64_t lo, uint64_t hi, const IntervalSet& in_use) noexcept {
  try {
    withheld_.erase(lo, hi);
    in_use.for_each_gap(lo, hi, [&](uint64_t a, uint64_t b) { free_.insert(a, b); });
  } catch (...) {
  }
}

int Storage::grow_to(uint64_t size) noexcept {
  if (size <= size_) return 0;
  if (resizable()) {
    if (int e = check_identity()) return e;
    if (int e = os::prim::truncate_fd(fd_, size)) return e;
  }
  size_ = size;
  return 0;
}

int Storage::drop_range(uint64_t lo, uint64_t hi, uint64_t new_end) noexcept {
  if (!resizable() || check_identity() != 0) return 0;  // device-DAX keeps its memory; a lost fd is not ours
  int e = os::prim::punch_hole(fd_, lo, hi - lo);
  if (e == EOPNOTSUPP) e = 0;  // the truncation below frees a range at the end anyway
  if (hi >= size_ && new_end < size_) {
    if (int t = os::prim::truncate_fd(fd_, new_end)) return t;
    size_ = new_end;
  }
  return e;
}

}  // namespace cxlpool::detail

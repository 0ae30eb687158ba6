// SPDX-License-Identifier: MIT
// Backing bookkeeping (reservations, committed-byte accounting, argument checks) and the two
// implementations: NumaBacking (anonymous + mbind) and FdBacking (memfd, shm, file, devdax).
#include "backing/backing.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "common/error.hpp"
#include "common/parse.hpp"
#include "os/os.hpp"

namespace cxlpool::detail {
namespace {

std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

bool is_pow2(size_t v) { return v && !(v & (v - 1)); }

// ---- Anonymous memory bound to one NUMA node ---------------------------------------------
class NumaBacking final : public Backing {
 public:
  explicit NumaBacking(BackingSpec spec) : Backing(std::move(spec)) {}

 protected:
  std::pair<void*, uint64_t> create_reservation(size_t size, size_t alignment, size_t span) override {
    void* addr = os::reserve_address_space(span, alignment);
    try {
      os::bind_to_node(addr, size, spec_.numa_node);
    } catch (...) {
      os::unmap(addr, span);
      throw;
    }
    return {addr, reinterpret_cast<uintptr_t>(addr)};
  }
  void* create_mapping(uint64_t, size_t) override {
    fail(CXLPOOL_E_NOT_SUPPORTED, "device '" + name() + "': map() needs a shareable backing; numa:" +
                                      std::to_string(spec_.numa_node) + " is private anonymous memory");
  }
  void destroy(const Reservation& r) noexcept override { os::unmap(reinterpret_cast<void*>(r.addr), r.span); }
  void on_commit(void* addr, size_t len, uint64_t) override { os::protect_rw(addr, len); }
  void on_decommit(void* addr, size_t len, uint64_t, bool) override {
    os::discard(addr, len);
    os::protect_none(addr, len);
  }
};

// ---- fd-backed memory: memfd, named shm, file, devdax ---------------------------------------
class FdBacking final : public Backing {
 public:
  FdBacking(BackingSpec spec, int fd, bool unlink_on_close)
      : Backing(std::move(spec)), fd_(fd), unlink_on_close_(unlink_on_close) {
    bool devdax = spec_.kind == CXLPOOL_BACKING_DEVDAX;
    can_fallocate_ = !devdax;
    can_punch_ = !devdax;
    free_.emplace(0, caps_.capacity_bytes);
  }
  ~FdBacking() override {
    os::close_fd(fd_);
    if (unlink_on_close_) os::shm_unlink(spec_.path);
  }
  int fd() const override { return fd_; }

 protected:
  std::pair<void*, uint64_t> create_reservation(size_t size, size_t alignment, size_t span) override {
    uint64_t offset = take_range(size, std::min<size_t>(alignment, size_t(2) << 20));
    try {
      void* addr = os::reserve_address_space(span, alignment);
      try {
        os::map_fd_fixed(addr, size, fd_, offset);
      } catch (...) {
        os::unmap(addr, span);
        throw;
      }
      return {addr, offset};
    } catch (...) {
      give_back_range(offset, size);
      throw;
    }
  }
  void* create_mapping(uint64_t offset, size_t size) override {
    void* addr = os::reserve_address_space(size, caps_.page_size);
    try {
      os::map_fd_fixed(addr, size, fd_, offset);
    } catch (...) {
      os::unmap(addr, size);
      throw;
    }
    return addr;
  }
  void destroy(const Reservation& r) noexcept override {
    os::unmap(reinterpret_cast<void*>(r.addr), r.span);
    if (r.owns_range) give_back_range(r.offset, r.size);
  }
  void on_commit(void* addr, size_t len, uint64_t offset) override {
    // Allocate blocks now so a full filesystem is an error here instead of SIGBUS later.
    if (can_fallocate_ && !os::allocate_range(fd_, offset, len)) can_fallocate_ = false;
    os::protect_rw(addr, len);
  }
  void on_decommit(void* addr, size_t len, uint64_t offset, bool release_memory) override {
    bool punched = release_memory && can_punch_ && os::punch_hole(fd_, offset, len);
    if (release_memory && can_punch_ && !punched) can_punch_ = false;
    os::discard(addr, len);
    os::protect_none(addr, len);
  }

 private:
  // First-fit allocation of device offsets; free_ maps start -> end of free ranges.
  uint64_t take_range(size_t size, size_t alignment) {
    if (alignment < caps_.page_size) alignment = caps_.page_size;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      uint64_t start = (it->first + alignment - 1) & ~uint64_t(alignment - 1);
      if (start >= it->second || it->second - start < size) continue;
      uint64_t lo = it->first, hi = it->second;
      free_.erase(it);
      if (lo < start) free_.emplace(lo, start);
      if (start + size < hi) free_.emplace(start + size, hi);
      return start;
    }
    uint64_t largest = 0;
    for (auto& [lo, hi] : free_) largest = std::max(largest, hi - lo);
    fail(CXLPOOL_E_CAPACITY, "device '" + name() + "': cannot reserve " + format_bytes(size) +
                                 ": the largest free range is " + format_bytes(largest) + " of " +
                                 format_bytes(caps_.capacity_bytes) + " capacity");
  }
  void give_back_range(uint64_t offset, size_t size) noexcept {
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
    free_.emplace(start, end);
  }

  int fd_;
  bool unlink_on_close_;
  bool can_fallocate_ = true;
  bool can_punch_ = true;
  std::map<uint64_t, uint64_t> free_;
};

uint64_t round_up_to(uint64_t v, uint64_t granule) { return (v + granule - 1) / granule * granule; }

}  // namespace

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

Backing::Backing(BackingSpec spec) : spec_(std::move(spec)), caps_(describe_backing(spec_)) {}
Backing::~Backing() = default;

std::unique_ptr<Backing> Backing::open(const BackingSpec& in) {
  BackingSpec spec = in;
  const std::string dev = "device '" + spec.device_name + "'";
  if (spec.kind == CXLPOOL_BACKING_NUMA) {
    if (spec.numa_node < 0) fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": numa backing without a node");
    if (spec.capacity == 0)
      fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": capacity of node " + std::to_string(spec.numa_node) + " is unknown");
    return std::unique_ptr<Backing>(new NumaBacking(spec));
  }

  int fd = -1;
  bool created = false;
  bool unlink_on_close = false;
  switch (spec.kind) {
    case CXLPOOL_BACKING_MEMFD:
      fd = os::memfd_create("cxlpool:" + spec.device_name);
      created = true;
      break;
    case CXLPOOL_BACKING_SHM:
      fd = os::shm_open_owned(spec.path, created);
      unlink_on_close = created;
      break;
    case CXLPOOL_BACKING_FILE:
      if (!os::is_directory(os::parent_dir(spec.path)))
        fail(CXLPOOL_E_NOT_FOUND, dev + ": directory of file:" + spec.path + " does not exist");
      fd = os::open_file(spec.path, true, created);
      break;
    case CXLPOOL_BACKING_DEVDAX:
      fd = os::open_char_device(spec.path);
      break;
    default:
      fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": unknown backing kind " + std::to_string(int(spec.kind)));
  }
  // Undo what this call created if anything below fails: nothing is half-created.
  auto undo = [&] {
    os::close_fd(fd);
    if (created && spec.kind == CXLPOOL_BACKING_SHM) os::shm_unlink(spec.path);
    if (created && spec.kind == CXLPOOL_BACKING_FILE) os::unlink_file(spec.path);
  };
  try {
    if (spec.page_size == 0 && spec.kind != CXLPOOL_BACKING_DEVDAX) spec.page_size = os::fd_page_size(fd);
    if (spec.page_size == 0) spec.page_size = os::page_size();
    if (spec.kind != CXLPOOL_BACKING_DEVDAX) {
      uint64_t existing = os::fd_size(fd);
      if (spec.capacity == 0) spec.capacity = existing;
      if (spec.capacity == 0)
        fail(CXLPOOL_E_CONFIG, dev + ": " + (spec.kind == CXLPOOL_BACKING_FILE ? "file:" : "shm:") + spec.path +
                                   " is empty and no size= was given");
      spec.capacity = round_up_to(spec.capacity, spec.page_size);
      if (existing < spec.capacity) os::truncate_fd(fd, spec.capacity);
    } else if (spec.capacity == 0) {
      fail(CXLPOOL_E_CONFIG, dev + ": the size of devdax:" + spec.path + " is unknown; give size=");
    } else {
      spec.capacity = spec.capacity / spec.page_size * spec.page_size;
    }
    return std::unique_ptr<Backing>(new FdBacking(spec, fd, unlink_on_close));
  } catch (...) {
    undo();
    throw;
  }
}

cxlpool_backing_usage_t Backing::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  cxlpool_backing_usage_t u{};
  u.capacity_bytes = caps_.capacity_bytes;
  u.reserved_bytes = reserved_bytes_;
  u.committed_bytes = committed_.total();
  u.peak_committed_bytes = peak_committed_;
  u.reservations = reservations_.size();
  return u;
}

bool Backing::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !reservations_.empty();
}

size_t Backing::round_up(size_t n) const {
  size_t ps = caps_.page_size;
  if (n > SIZE_MAX - ps)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "device '" + name() + "': size " + std::to_string(n) + " overflows");
  return (n + ps - 1) / ps * ps;
}

void* Backing::reserve(size_t size, size_t alignment, size_t address_span) {
  if (size == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, "device '" + name() + "': reserve of 0 bytes");
  if (alignment != 0 && !is_pow2(alignment))
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         "device '" + name() + "': alignment " + std::to_string(alignment) + " is not a power of two");
  size = round_up(size);
  alignment = std::max(alignment, caps_.page_size);
  size_t span = std::max(size, round_up(address_span));
  std::lock_guard<std::mutex> lock(mu_);
  auto [addr, offset] = create_reservation(size, alignment, span);
  Reservation r{reinterpret_cast<uintptr_t>(addr), size, offset, span, true};
  reservations_.emplace(r.addr, r);
  reserved_bytes_ += size;
  return addr;
}

void* Backing::map(uint64_t offset, size_t size) {
  if (size == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, "device '" + name() + "': map of 0 bytes");
  if (offset % caps_.page_size)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "device '" + name() + "': offset " + std::to_string(offset) +
                                         " is not a multiple of the page size " + std::to_string(caps_.page_size));
  size = round_up(size);
  if (offset > caps_.capacity_bytes || caps_.capacity_bytes - offset < size)
    fail(CXLPOOL_E_CAPACITY, "device '" + name() + "': range [" + std::to_string(offset) + ", +" +
                                 std::to_string(size) + ") extends past the capacity " +
                                 std::to_string(caps_.capacity_bytes));
  std::lock_guard<std::mutex> lock(mu_);
  void* addr = create_mapping(offset, size);
  Reservation r{reinterpret_cast<uintptr_t>(addr), size, offset, size, false};
  reservations_.emplace(r.addr, r);
  return addr;
}

void Backing::check_range_args(const void* addr, size_t len, const char* op) const {
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (!addr || len == 0 || a % caps_.page_size || len % caps_.page_size)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         std::string(op) + "(" + ptr_str(addr) + ", " + std::to_string(len) + "): device '" + name() +
             "' needs a non-empty range aligned to its page size " + std::to_string(caps_.page_size));
}

Backing::Reservation& Backing::find(const void* addr, size_t len, const char* op) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto it = reservations_.upper_bound(a);
  if (it != reservations_.begin()) {
    --it;
    Reservation& r = it->second;
    if (a >= r.addr && a - r.addr < r.size && len <= r.size - (a - r.addr)) return r;
  }
  fail(CXLPOOL_E_NOT_FOUND, std::string(op) + "(" + ptr_str(addr) + ", " + std::to_string(len) +
                                "): range is not inside one reservation of device '" + name() + "'");
}

const Backing::Reservation* Backing::find_const(const void* addr) const {
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto it = reservations_.upper_bound(a);
  if (it == reservations_.begin()) return nullptr;
  --it;
  const Reservation& r = it->second;
  return a - r.addr < r.size ? &r : nullptr;
}

void Backing::commit(void* addr, size_t len, uint32_t flags) {
  check_range_args(addr, len, "commit");
  if (flags & ~uint32_t(CXLPOOL_COMMIT_POPULATE))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "commit: unknown flags " + std::to_string(flags));
  std::lock_guard<std::mutex> lock(mu_);
  Reservation& r = find(addr, len, "commit");
  uint64_t offset = r.offset + (reinterpret_cast<uintptr_t>(addr) - r.addr);
  uint64_t added = len - committed_.covered(offset, offset + len);
  if (committed_.total() + added > caps_.capacity_bytes)
    fail(CXLPOOL_E_CAPACITY, "device '" + name() + "': committing " + format_bytes(added) +
                                 " more would exceed its capacity (" + format_bytes(committed_.total()) + " of " +
                                 format_bytes(caps_.capacity_bytes) + " committed)");
  on_commit(addr, len, offset);
  if (flags & CXLPOOL_COMMIT_POPULATE) {
    try {
      os::populate_write(addr, len);
    } catch (...) {
      on_decommit(addr, len, offset, true);
      throw;
    }
  }
  committed_.insert(offset, offset + len);
  peak_committed_ = std::max(peak_committed_, committed_.total());
}

void Backing::decommit(void* addr, size_t len) {
  check_range_args(addr, len, "decommit");
  std::lock_guard<std::mutex> lock(mu_);
  Reservation& r = find(addr, len, "decommit");
  uint64_t offset = r.offset + (reinterpret_cast<uintptr_t>(addr) - r.addr);
  on_decommit(addr, len, offset, true);
  committed_.erase(offset, offset + len);
}

void Backing::release(void* addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == reservations_.end())
    fail(CXLPOOL_E_NOT_FOUND,
         "release(" + ptr_str(addr) + "): not the start of a reservation of device '" + name() + "'");
  Reservation r = it->second;
  if (r.owns_range) {
    if (committed_.covered(r.offset, r.offset + r.size)) {
      try {
        on_decommit(reinterpret_cast<void*>(r.addr), r.size, r.offset, true);
      } catch (const Failure&) {
        // The range is unmapped below either way; its device blocks stay allocated, which is
        // only wasted space, so release still succeeds.
      }
    }
    committed_.erase(r.offset, r.offset + r.size);
    reserved_bytes_ -= r.size;
  } else {
    // A mapping of someone else's range: keep the data, forget offsets no other live
    // reservation of this backing still covers.
    IntervalSet orphaned;
    orphaned.insert(r.offset, r.offset + r.size);
    for (auto& [a, other] : reservations_)
      if (a != r.addr) orphaned.erase(other.offset, other.offset + other.size);
    orphaned.for_each([&](uint64_t lo, uint64_t hi) { committed_.erase(lo, hi); });
  }
  reservations_.erase(it);
  destroy(r);
}

uint64_t Backing::offset_of(const void* addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Reservation* r = find_const(addr);
  if (!r)
    fail(CXLPOOL_E_NOT_FOUND, "offset_of(" + ptr_str(addr) + "): not inside a reservation of device '" + name() + "'");
  return r->offset + (reinterpret_cast<uintptr_t>(addr) - r->addr);
}

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// Backings: reserve/commit/decommit/release pages of one memory device with exact capacity
// accounting. Two implementations share the bookkeeping here: anonymous memory bound to a
// NUMA node (mbind), and fd-backed memory (memfd, named shm, file, devdax).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/interval_set.hpp"
#include "cxlpool/backing.h"

namespace cxlpool::detail {

// What topology hands to a backing: everything needed to open one device.
struct BackingSpec {
  std::string device_name;  // for messages
  cxlpool_backing_kind_t kind = CXLPOOL_BACKING_MEMFD;
  int numa_node = -1;
  std::string path;       // shm name, file path or devdax path
  uint64_t capacity = 0;  // bytes; 0 = take it from the object (existing file size)
  size_t page_size = 0;   // 0 = derive (system page, hugetlbfs block, devdax align)
};

// Static capabilities of a backing kind (before anything is opened).
cxlpool_backing_caps_t describe_backing(const BackingSpec& spec);

class Backing {
 public:
  static std::unique_ptr<Backing> open(const BackingSpec& spec);
  virtual ~Backing();
  Backing(const Backing&) = delete;
  Backing& operator=(const Backing&) = delete;

  cxlpool_backing_caps_t caps() const { return caps_; }
  cxlpool_backing_usage_t usage() const;
  const std::string& name() const { return spec_.device_name; }
  virtual int fd() const { return -1; }

  // Reserves size bytes of the device at an address aligned to alignment. address_span > size
  // reserves that much address space with only the first size bytes mapped to the device
  // (the rest stays inaccessible), so a large alignment does not consume device capacity.
  void* reserve(size_t size, size_t alignment, size_t address_span = 0);
  void* map(uint64_t offset, size_t size);
  void commit(void* addr, size_t len, uint32_t flags);
  void decommit(void* addr, size_t len);
  void release(void* addr);
  uint64_t offset_of(const void* addr) const;
  bool busy() const;
  // fork(): the interposer holds every allocator lock across fork so the child never inherits
  // a lock held by a thread that does not exist there.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

 protected:
  struct Reservation {
    uintptr_t addr = 0;
    size_t size = 0;
    uint64_t offset = 0;     // device offset of addr (anonymous: the address itself)
    size_t span = 0;         // address space reserved from addr (>= size)
    bool owns_range = true;  // false for map(): the device range belongs to someone else
  };
  explicit Backing(BackingSpec spec);

  // Kind-specific steps, called with mu_ held. create_reservation returns the address and the
  // device offset of a new reservation; the rest act on ranges already validated.
  virtual std::pair<void*, uint64_t> create_reservation(size_t size, size_t alignment, size_t span) = 0;
  virtual void* create_mapping(uint64_t offset, size_t size) = 0;
  virtual void destroy(const Reservation& r) noexcept = 0;
  virtual void on_commit(void* addr, size_t len, uint64_t offset) = 0;
  // release_memory: give the pages back to the device (punch/discard), not only unmap access.
  virtual void on_decommit(void* addr, size_t len, uint64_t offset, bool release_memory) = 0;

  BackingSpec spec_;
  cxlpool_backing_caps_t caps_{};

 private:
  Reservation& find(const void* addr, size_t len, const char* op);
  const Reservation* find_const(const void* addr) const;
  size_t round_up(size_t n) const;
  void check_range_args(const void* addr, size_t len, const char* op) const;

  mutable std::mutex mu_;
  std::map<uintptr_t, Reservation> reservations_;  // by address
  IntervalSet committed_;                          // device offsets committed
  uint64_t reserved_bytes_ = 0;
  uint64_t peak_committed_ = 0;
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// Storage: one place where a device's bytes live in this process — anonymous memory bound to
// a NUMA node, or one file descriptor (memfd, an unnamed file in a shm/file device's
// directory, a device-DAX character device) with a first-fit allocator of its offsets. Every
// descriptor is created by cxlpool itself (O_TMPFILE, memfd, O_EXCL), kept at a high number,
// and its identity is checked before each mmap, so a program that closes or reuses descriptor
// numbers can never make cxlpool map one of the program's own files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backing/backing_spec.hpp"
#include "common/interval_set.hpp"
#include "os/internal_heap.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail {

// The device layer's range sets. Commits fill them on the program's threads, so their nodes
// come from the internal heap (os/internal_heap.hpp), never from the program's malloc.
using IntervalSet = BasicIntervalSet<os::InternalAllocator<std::pair<const uint64_t, uint64_t>>>;

class Storage {
 public:
  // Opens the storage of spec for this process (cold path; throws Failure naming the device).
  // fork_copy: fresh storage for a forked child's copy of a private range; a device-DAX
  // device cannot be duplicated, so the child's copy goes to a memfd (kept in DRAM).
  static std::shared_ptr<Storage> create(const BackingSpec& spec, bool fork_copy = false);
  // Private anonymous memory, bound to no node: where a fork child keeps its copy when it
  // cannot open device storage (no descriptor left, a full filesystem). noexcept: no I/O.
  static std::shared_ptr<Storage> anonymous_copy() noexcept;
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  bool anonymous() const { return fd_ < 0 && !lost_; }
  int fd() const { return fd_; }
  // The descriptor if it still is ours (identity checked), else -1 and the storage is lost.
  int valid_fd() noexcept { return check_identity() == 0 ? fd_ : -1; }
  int numa_node() const { return numa_node_; }
  // Memory written here must stay in this storage to be placed where the user chose: a file
  // on a DAX filesystem (STATX_ATTR_DAX) or on hugetlbfs.
  bool placement_in_storage() const { return placement_in_storage_; }
  uint64_t size() const { return size_; }
  // Storage of borrowed capacity (StorageOpen::space): only ranges of its offset space are
  // capacity, those online when it was opened given here.
  bool borrowed() const { return borrowed_; }
  const std::vector<std::pair<uint64_t, uint64_t>>& online_at_open() const { return online_at_open_; }
  // Why less than the capacity asked for was online at open ("": all of it was).
  const std::string& refusal_at_open() const { return refusal_at_open_; }
  const void* provider_state() const { return state_.get(); }  // StorageOpen::state
  const std::string& description() const { return description_; }

  // Maps [offset, offset+len) of the storage over addr (PROT_NONE), privately (kernel
  // copy-on-write) or shared. Anonymous storage ignores offset and binds to its node. A
  // private mapping of a file (memfd, /dev/shm, any filesystem but hugetlbfs) is private
  // anonymous memory under the file's own memory policy: the file holds only zeros, and a
  // private mapping of a tmpfs file would allocate every page it faults twice, once in the
  // file (SIGBUS when the tmpfs is full) and once as the private copy (docs/backing.md).
  // Returns 0 or an errno; EBADF when the descriptor was closed or replaced by the program
  // (the storage is then marked lost and maps nothing any more).
  int map(void* addr, size_t len, uint64_t offset, bool shared) noexcept;

  // Takes the room for [offset, offset+len) of a storage whose filesystem can run out (a file,
  // /dev/shm, hugetlbfs), mapped shared at addr: fallocate, or where that cannot be had
  // (a filesystem without it, a descriptor the program took away) faulting the pages in
  // through addr. After it, writes there cannot SIGBUS for lack of room, whoever fills the
  // filesystem. 0 (also for storages that cannot run out: memfd, device-DAX), or ENOSPC,
  // EDQUOT, ENOMEM, ... with nothing of the range kept.
  int reserve_room(void* addr, uint64_t offset, size_t len) noexcept;
  // Private pages of this storage must be faulted in at commit to be had at all (hugetlbfs:
  // a huge page missing at fault time is SIGBUS).
  bool private_needs_populate() const { return hugetlbfs_; }
  // Private pages are anonymous memory (storage.hpp's map): their offsets here are bookkeeping
  // only, so a private range can take other offsets without its bytes moving.
  bool private_anonymous() const { return fd_ < 0 || !hugetlbfs_; }
  // A descriptor of a file cxlpool created and may resize (not a device-DAX node).
  bool resizable() const { return fd_ >= 0 && resizable_; }

  // First-fit allocation of offsets (fd storage). Returns 0, or ENOSPC with the largest free
  // range in *largest.
  int take_range(size_t size, size_t alignment, uint64_t* offset, uint64_t* largest) noexcept;
  // Offsets for a range that will be mapped at an address aligned to address_alignment: 2 MiB-
  // aligned when the range is a multiple of 2 MiB (huge pages can then map all of it, and it
  // strands nothing between such ranges), else the page size (a 320 KiB block would strand the
  // rest of its 2 MiB, a 2.1 MB one nearly 2 MiB). The huge-page alignment is a preference:
  // when the free offsets are too fragmented for it, the page size's alignment is taken.
  int take_mappable_range(size_t size, size_t address_alignment, uint64_t* offset, uint64_t* largest) noexcept;
  // Offsets withheld (elastic capacity: a withdrawn extent) are never given back here.
  void give_back_range(uint64_t offset, size_t size) noexcept;
  // Elastic capacity: withholds [lo, hi) from the offset allocator (what is free there stops
  // being handed out; what is in use stays until given back, then stays withheld).
  bool withhold(uint64_t lo, uint64_t hi) noexcept;
  // Undoes withhold for [lo, hi) except `in_use` (offsets reservations still hold).
  void restore(uint64_t lo, uint64_t hi, const IntervalSet& in_use) noexcept;
  // The file grows to size (resizable storages; others only note the size). 0 or an errno.
  int grow_to(uint64_t size) noexcept;
  // Frees the memory of [lo, hi) (withheld, held by no reservation): file pages punched out;
  // when hi is the file's end, the file is shortened to new_end. 0 or an errno.
  int drop_range(uint64_t lo, uint64_t hi, uint64_t new_end) noexcept;
  // Marks [offset, offset+size) as taken (a fork child's copy keeps its offsets); false
  // without host memory for it.
  bool take_exact(uint64_t offset, size_t size) noexcept;

  // The program closed or replaced the descriptor: new reservations need a fresh storage.
  bool lost() const { return lost_; }
  // Offsets committed through any mapping of this storage (addresses for anonymous storage),
  // kept by the device under its lock.
  IntervalSet committed;
  // A fork child's view of the parent's storage: no new reservations here.
  bool retired() const { return retired_; }
  void retire() { retired_ = true; }

 private:
  Storage() = default;
  int check_identity() noexcept;

  int fd_ = -1;
  os::prim::FileId id_{};
  int numa_node_ = -1;
  uint64_t size_ = 0;
  size_t page_size_ = 0;
  bool lost_ = false;
  bool placement_in_storage_ = false;
  bool retired_ = false;
  bool hugetlbfs_ = false;
  bool room_limited_ = false;   // a file or /dev/shm: its filesystem can fill up
  bool resizable_ = false;      // a file or memfd cxlpool made (not device-DAX)
  os::prim::MemPolicy policy_;  // the file's memory policy, for its private (anonymous) pages
  std::string description_;     // for messages: "memfd", "O_TMPFILE in /dev/shm", ...
  IntervalSet free_;            // free offset ranges
  std::vector<std::pair<uint64_t, uint64_t>> online_at_open_;
  std::string refusal_at_open_;
  bool borrowed_ = false;  // opened with a space of its own (StorageOpen::space)
  std::shared_ptr<void> state_;
  IntervalSet withheld_;  // offsets of withdrawn extents (elastic capacity)
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// A Device: one topology target opened once per process (see registry.hpp), shared by every
// pool and raw backing that uses it. It owns the target's storages, every reservation made
// on it, and one capacity ledger (committed bytes counted once per storage offset, with
// per-client attribution), and it implements the target's fork semantics. All operations on
// allocation paths are noexcept and return a status; messages are built only by the cold
// describe() helper.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backing/backing_spec.hpp"
#include "backing/claim.hpp"
#include "backing/provider.hpp"
#include "backing/storage.hpp"
#include "common/interval_set.hpp"
#include "common/metric.hpp"
#include "cxlpool/common.h"

namespace cxlpool::detail {

// Ledger clients: pools use their index (0..63), raw backings 64..127.
inline constexpr int kMaxLedgerClients = 128;
inline constexpr int kFirstRawClient = 64;

// Whose memory a reservation is across fork(): kPrivate ranges follow the device's fork
// mode (the child gets a copy); kShared ranges stay shared with forked children (raw
// backings, shared pools).
enum class Sharing : uint8_t { kPrivate, kShared };

// What went wrong in a noexcept operation, for describe().
struct DeviceError {
  cxlpool_status_t status = CXLPOOL_OK;
  int os_errno = 0;
  const char* call = "";  // the primitive that failed, e.g. "mmap", "madvise(POPULATE_WRITE)"
  uint64_t detail = 0;    // e.g. the largest free range on a capacity failure
};

// Records a failure in *err (when given) and returns its status: every noexcept device
// operation ends its failure paths with it.
inline cxlpool_status_t device_failure(DeviceError* err, cxlpool_status_t status, int os_errno, const char* call,
                                       uint64_t detail = 0) noexcept {
  if (err) {
    err->status = status;
    err->os_errno = os_errno;
    err->call = call;
    err->detail = detail;
  }
  return status;
}

// The process's mappings (VMAs) made by cxlpool's devices, against one budget: half of
// vm.max_map_count, so the program keeps the other half. Each reservation's mapping count is
// modelled exactly (a run of pages with one protection is one VMA); commit may exceed the
// budget (refusing it would fail an allocation the kernel allows), decommit and moves do not:
// a decommit that would split a mapping past the budget frees the pages but keeps them
// accessible and committed (BUSY), a move that needs a staging mapping past it is CAPACITY.
struct VmaUse {
  uint64_t vmas = 0;      // mappings cxlpool's reservations hold now
  uint64_t budget = 0;    // the limit decommit and move respect
  uint64_t refusals = 0;  // decommits and moves refused for the budget
};
VmaUse vma_use() noexcept;
struct VmaField {
  MetricDesc desc;
  uint64_t VmaUse::*member;
};
inline constexpr VmaField kVmaFields[] = {
    {{"vmas", MetricKind::kGauge, "count", "mappings cxlpool's devices hold"}, &VmaUse::vmas},
    {{"vma_budget", MetricKind::kGauge, "count", "their limit: half of vm.max_map_count"}, &VmaUse::budget},
    {{"vma_refusals", MetricKind::kCounter, "events", "decommits and moves refused for the budget"}, &VmaUse::refusals},
};
// Whether `more` mappings fit the budget now; counts a refusal when they do not.
bool vma_room_for(int64_t more) noexcept;
// Sets the budget (tests; a value <= 0 restores half of vm.max_map_count).
void set_vma_budget(int64_t budget) noexcept;

// What elastic capacity did on a device (elastic.cpp and the allocator's evacuation).
struct ElasticCounters {
  std::atomic<uint64_t> grows{0};                                // extents added
  std::atomic<uint64_t> shrinks{0};                              // withdrawals finished
  std::atomic<uint64_t> refusals{0};                             // withdrawals given up (BUSY): the range stayed
  std::atomic<uint64_t> relocated{0};                            // reservations given offsets outside a withdrawn range
  std::atomic<uint64_t> evacuated_units{0}, evacuated_bytes{0};  // moved to another device
  std::atomic<uint64_t> forced{0};                               // forced releases (also counted in shrinks)
  std::atomic<uint64_t> lost_units{0}, lost_bytes{0};            // what forced releases took: committed bytes
  std::atomic<uint64_t> borrow_refusals{0};  // borrowed capacity asked for and refused (quota or pool full)
};

struct Ledger {
  // The device's capacity now: read here and nowhere else (Device::capacity()), changed only
  // by the elastic operations (elastic.cpp).
  std::atomic<uint64_t> capacity{0};
  std::atomic<uint64_t> committed{0};
  std::atomic<uint64_t> peak{0};
  std::atomic<uint64_t> by_client[kMaxLedgerClients] = {};
  ElasticCounters elastic;
};

class Device {
 public:
  // Opens spec for this process: claims a named device (BUSY naming the holder's pid) and
  // opens its private storage. Throws Failure. Use Registry::acquire, not this.
  explicit Device(const BackingSpec& spec);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const BackingSpec& spec() const { return spec_; }
  // The spec the device was opened with, before derived values (a file's page size) were
  // filled in: what the registry matches later requests against.
  const BackingSpec& requested_spec() const { return requested_; }
  const std::string& name() const { return spec_.device_name; }
  const cxlpool_backing_caps_t& caps() const { return caps_; }
  ForkMode fork_mode() const { return fork_mode_; }
  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }
  uint64_t committed() const { return ledger_.committed.load(std::memory_order_relaxed); }
  uint64_t capacity() const noexcept { return ledger_.capacity.load(std::memory_order_relaxed); }

  // ---- Elastic capacity (elastic.cpp; docs/devices.md) ------------------------------------
  // A device has an offset space [0, space) of which the online extents are its capacity
  // (numa devices: the same arithmetic, no storage behind the offsets). Extents are added at
  // once; taking one away is a withdrawal: begin, evacuate what the allocator can move, end.
  struct Extent {
    uint64_t lo, hi;
  };
  std::vector<Extent> online_extents() const;
  // End of the offset space (the length of the device's files).
  uint64_t space() const;
  // Adds [lo, hi) (page-aligned, not online, no withdrawal of it in progress) to the capacity;
  // files grow to hi. Statuses: OK; INVALID_ARGUMENT; CAPACITY (past the end of a devdax
  // device); OS (the file could not grow).
  // NOT_SUPPORTED for a device of borrowed capacity (it grows by borrowing: grow_on_request).
  cxlpool_status_t add_extent(uint64_t lo, uint64_t hi, DeviceError* err) noexcept;
  // Capacity on request from the provider (Provider::grow) for a reservation of bytes: true
  // when some was added. Caller holds no lock of the device.
  bool grow_on_request(uint64_t bytes) noexcept;
  // Whether the device may get capacity on request (its provider borrows it): a capacity
  // check before a reservation then is no reason to refuse.
  bool grows_on_request() const noexcept { return provider_->grow != nullptr; }
  // Whether no reservation holds an offset of [lo, hi) (a borrowed range that can go back
  // without moving anything).
  bool range_unreserved(uint64_t lo, uint64_t hi) const;
  // Bytes of [lo, hi) online (nonzero too while a withdrawal of part of it is in progress).
  uint64_t online_in(uint64_t lo, uint64_t hi) const;
  // Why the provider last refused to grow the device ("" when it never did), into out (len
  // bytes, NUL terminated; no allocation: allocation failures report it).
  void grow_refusal(char* out, size_t len) const noexcept;
  // The provider's state kept by the device's storage (StorageOpen::state), nullptr when none.
  const void* provider_state() const;
  // Starts taking the online [lo, hi) away: the capacity drops by its size now (commits past
  // it are CAPACITY), its free offsets are withheld, and reservations in it whose pages are
  // private anonymous memory (their offsets are bookkeeping only) get offsets elsewhere when
  // there is room. What still holds part of it is listed by occupants(). One withdrawal at a
  // time. Statuses: OK; INVALID_ARGUMENT (not page-aligned or not online); BUSY (another
  // withdrawal in progress).
  cxlpool_status_t begin_withdraw(uint64_t lo, uint64_t hi, DeviceError* err) noexcept;
  struct Occupant {
    uintptr_t addr = 0;  // the reservation
    size_t size = 0;
    uint64_t lo = 0, hi = 0;  // the offsets it holds in the withdrawal
    int client = 0;
    bool shared = false;  // shared with forked children or other processes (never moves)
    bool mapped = false;  // a range mapped with map_range (a raw backing's view): never moves
  };
  // The reservations still holding part of the withdrawal in progress (none when none is).
  std::vector<Occupant> occupants() const;
  // Ends the withdrawal. finish: needs no occupant and no more committed than the capacity
  // (BUSY otherwise, and nothing changes: end it again, or cancel); then the range's memory is
  // freed (file pages punched out; a file that the range ended is shortened). !finish: the
  // range is online again.
  cxlpool_status_t end_withdraw(bool finish, DeviceError* err) noexcept;
  // Counts n evacuated units of bytes (the allocator's evacuation).
  void note_evacuated(uint64_t units, uint64_t bytes) noexcept;
  // What a forced release took from one reservation: the addresses that held its range.
  struct Lost {
    uintptr_t addr = 0;          // the first byte lost (inside the reservation at `base`)
    size_t len = 0;              // bytes of address space whose memory went with the range
    uintptr_t base = 0;          // the reservation
    uint64_t committed = 0;      // committed bytes among them: the data lost
    int client = 0;              // ledger client (pool index, or a raw backing's)
    bool shared = false;         // shared with forked children or other processes
    bool mapped = false;         // a raw backing's mapping of a device range
    bool contents_kept = false;  // could not be zeroed (device DAX, hugetlbfs, mlock, a fork child's view of
                                 // its parent's memory): undefined now
  };
  // Ends the withdrawal in progress whatever still holds the range (a forced release: the
  // device took the range back). Moves of reservations in the range finish first. Reservations
  // still holding part of it lose that part: it reads as zeros (private pages discarded;
  // committed pages mapped shared from the file zeroed in place, so a touch never needs the
  // filesystem again; the rest punched out), or keeps undefined bytes where it cannot be
  // zeroed (Lost::contents_kept); the addresses stay mapped and valid, and its offsets stay theirs, never handed out
  // again, while commits on them are CAPACITY until the range is online again. Committed bytes
  // may exceed the capacity afterwards; new commits then wait for frees. Each loss is listed
  // in *lost. Statuses: OK; INVALID_ARGUMENT (no withdrawal in progress); NO_MEMORY (the
  // extent table or the list; the withdrawal stays in progress); OS (pages could not be
  // punched out: the range is gone all the same).
  // backing_gone: the memory behind the range failed (a borrowed device's shared pool: its
  // file truncated or replaced, the device declared failed, or this participant evicted and
  // its extents someone else's). Nothing of the storage is read, written or punched: what
  // the range held is replaced by private anonymous memory (zeros; committed pages stay
  // readable and writable), so the program's next touch neither faults on memory that is
  // gone nor writes into another's.
  cxlpool_status_t force_withdraw(std::vector<Lost>* lost, DeviceError* err, bool backing_gone = false) noexcept;
  // How far the offset space can grow (add_extent past it is CAPACITY): a devdax device's
  // size, or the spec's max_size.
  uint64_t max_space() const noexcept { return max_space_; }

  // Reserves size bytes (rounded up to the page size) of the device at an address aligned
  // to alignment; span > size reserves that much address space of which only the first
  // size bytes are device memory. Inaccessible until committed.
  // Statuses: OK, INVALID_ARGUMENT, CAPACITY (no device range), NO_MEMORY (address space), OS.
  cxlpool_status_t reserve(size_t size, size_t alignment, size_t span, Sharing sharing, int client, void** out,
                           DeviceError* err) noexcept;
  // Maps an existing range of the device's shared storage (raw backings).
  cxlpool_status_t map_range(uint64_t offset, size_t size, int client, void** out, DeviceError* err) noexcept;
  // Makes [addr, addr+len) readable/writable and backed; populate faults it in now. Committing
  // committed pages is allowed and not counted twice. Statuses: OK, INVALID_ARGUMENT,
  // NOT_FOUND (not inside one reservation), CAPACITY, OS.
  cxlpool_status_t commit(void* addr, size_t len, bool populate, int client, DeviceError* err) noexcept;
  // Returns the pages' memory and makes them inaccessible.
  cxlpool_status_t decommit(void* addr, size_t len, int client, DeviceError* err) noexcept;
  // Releases a whole reservation (addr = what reserve/map_range returned).
  cxlpool_status_t release(void* addr, int client, DeviceError* err) noexcept;
  cxlpool_status_t offset_of(const void* addr, uint64_t* out) const noexcept;

  // Moves a whole reservation of this device (addr = what reserve() returned) to device to,
  // under the same address (rebind.cpp): NUMA node to NUMA node by the kernel (mbind
  // MPOL_MF_MOVE, verified page by page); otherwise its committed bytes are copied into to's
  // storage mapped at a staging address, which then replaces the old mapping in one mremap.
  // While the bytes are copied writers wait in a write fence (os/write_fence.hpp): no write is
  // lost; the program's protections are kept, and ranges it made unreadable, registered with a
  // userfaultfd of its own, or gave attributes a new mapping would lose (mlock, DONTDUMP,
  // WIPEONFORK, DONTFORK) are NOT_SUPPORTED, as is a move the program disturbed (closed the
  // fence's descriptor, changed protections). Capacity moves from this ledger to to's; the
  // reservation then belongs to to (commit, decommit, release go there). Statuses: OK;
  // NOT_FOUND (addr does not start a reservation here); NOT_SUPPORTED (memory shared with
  // other processes or forked children, ranges mapped with map_range, this device = to);
  // INVALID_ARGUMENT (to's page size does not divide the reservation); CAPACITY (to is full:
  // ledger, offsets, a full filesystem, or a NUMA node without room: undone); NO_MEMORY
  // (address space); OS (e.g. EFAULT: a hole unmapped in the range; nothing changed).
  // Neither device's lock is held while the bytes move: the target's capacity is taken first
  // (both ledgers count the bytes until the move ends), and commit, decommit and release of the
  // range itself wait for the move; every other operation on either device goes on.
  struct MoveReport {
    uint64_t bytes = 0;            // committed bytes moved
    bool by_kernel = false;        // migrated in place (NUMA to NUMA)
    size_t pages_left_behind = 0;  // by_kernel: present pages the kernel could not move
  };
  cxlpool_status_t move_reservation(void* addr, Device& to, MoveReport* report, DeviceError* err) noexcept;
  // Whether a copy of this device's (private) memory can be write-fenced (os/write_fence.hpp):
  // anonymous memory, which is what private ranges of numa, memfd, shm and file devices are
  // on any filesystem (hugetlbfs: its own pages, covered too); not devdax.
  bool copy_fenceable() const;

  // The descriptor of the shared storage (raw backings hand it to other processes); -1 for
  // anonymous (numa) devices. Throws Failure when the storage cannot be opened.
  int shared_fd();
  size_t reservations_of(int client) const;
  uint64_t reserved_bytes() const;
  size_t reservation_count() const;
  // Human-readable account of a failed operation, naming the device.
  std::string describe(const char* op, const void* addr, size_t len, const DeviceError& err) const;

  // Moves run their copy without either device's lock (rebind.cpp); fork() waits for moves in
  // flight before it locks any device (move_gate.hpp).
  // Called by every move once its bytes are about to move, with no device lock held (tests
  // use it to show that; nullptr: none).
  using MoveHook = void (*)(void* ctx);
  static void set_move_hook(MoveHook hook, void* ctx) noexcept;

  // fork(): prepare locks the device; parent/child unlock. In the child, before unlocking,
  // child_after_fork() gives every private copy-mode range its own copy and retires storages
  // the parent keeps using. Returns false (with a message) when the copy failed.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }
  void reset_lock_in_child() noexcept {
    new (&mu_) std::mutex();
    new (&moved_) std::condition_variable();
  }
  bool child_after_fork(char* message, size_t message_size) noexcept;
  // True when fork() must wait for a child's copy (private copy-mode memory is committed).
  bool fork_needs_copy() const noexcept;

 private:
  struct Run {
    uint64_t lo, hi;  // byte offsets inside a reservation
  };
  struct Reservation;
  // The copy half of move_reservation (rebind.cpp): stages, fences, copies, swaps.
  cxlpool_status_t staged_copy(const Reservation& r, const std::vector<Run>& runs, Storage& dst, uint64_t new_offset,
                               bool shared_mapping, size_t to_ps, DeviceError* err) noexcept;
  struct Reservation {
    uintptr_t addr = 0;
    size_t size = 0;  // device bytes mapped from addr
    size_t span = 0;  // address space reserved from addr (>= size)
    uint64_t offset = 0;
    std::shared_ptr<Storage> storage;
    Sharing sharing = Sharing::kPrivate;
    bool owns_range = true;  // false for map_range(): the range belongs to the device
    bool inherited = false;  // a shared range a fork child inherited: the parent's memory too
    int client = 0;
    int64_t vmas = 0;  // mappings the reservation holds (see VmaUse)
    // A move in flight (rebind.cpp): the source's entry is leaving, the target's is arriving
    // (not the target's yet: skipped by its counts). Operations on the range wait for the move.
    bool leaving = false, arriving = false;
  };
  // Waits, mu_ held in lock, until the reservation holding addr is not moving; false when none
  // holds it any more.
  bool wait_unless_moving(std::unique_lock<std::mutex>& lock, const void* addr) noexcept;
  // How many mappings r gains (negative: loses) when the storage offsets [lo, hi) inside it
  // become committed (read-write) or not (inaccessible); mu_ held.
  int64_t vma_delta(const Reservation& r, uint64_t lo, uint64_t hi, bool to_committed) const noexcept;
  bool mapped_shared(const Reservation& r) const;
  Reservation* find(const void* addr, size_t len) noexcept;
  // The reservation holding a page-aligned [addr, addr+len) (mu_ held), or nullptr with the
  // status (INVALID_ARGUMENT, NOT_FOUND) in *status.
  Reservation* range_of(const void* addr, size_t len, const char* op, DeviceError* err,
                        cxlpool_status_t* status) noexcept;
  const Reservation* find_const(const void* addr) const noexcept;
  // force_withdraw with backing_gone: x's addresses get private anonymous memory, committed
  // pages read-write; false when the mapping could not be replaced (contents undefined).
  bool replace_lost(Reservation& r, const Lost& x) noexcept;
  cxlpool_status_t storage_for(Sharing sharing, std::shared_ptr<Storage>& out, DeviceError* err) noexcept;
  void account(Storage& s, uint64_t added, uint64_t removed, int client) noexcept;
  int copy_to_fresh(Reservation& r, const std::shared_ptr<Storage>& fresh) noexcept;
  int copy_to_anonymous(Reservation& r, const std::shared_ptr<Storage>& anon) noexcept;
  // The committed offsets of r's storage inside r.
  IntervalSet committed_in(const Reservation& r) const;
  // Gives a fresh storage the offset space of the device (elastic.cpp): its file as long as
  // the space, offsets outside the online extents withheld. 0 or an errno.
  int conform(Storage& s) noexcept;
  // The offsets of the withdrawal in progress that r holds, as [*lo, *hi); false if none.
  cxlpool_status_t add_range(uint64_t lo, uint64_t hi, DeviceError* err) noexcept;  // add_extent's work
  bool holds_withdrawn(const Reservation& r, uint64_t* lo, uint64_t* hi) const noexcept;
  // Gives r offsets outside the withdrawal (pages that are private anonymous memory only).
  bool relocate_bookkeeping(Reservation& r) noexcept;
  // Puts the withdrawal in progress back online (mu_ held).
  void cancel_withdraw_locked() noexcept;
  // The offsets of st in [lo, hi) that reservations hold (mu_ held; throws bad_alloc).
  IntervalSet held_in(const Storage* st, uint64_t lo, uint64_t hi) const;
  // The storages whose offsets a withdrawal applies to: the device's own, and any other that
  // a reservation still uses (mu_ held).
  std::vector<std::shared_ptr<Storage>> offset_storages() const;

  BackingSpec requested_;
  BackingSpec spec_;
  const Provider* provider_ = nullptr;  // spec_.kind's (backing/provider.hpp)
  cxlpool_backing_caps_t caps_{};
  ForkMode fork_mode_ = ForkMode::kCopyOnWrite;
  std::unique_ptr<DeviceClaim> claim_;
  mutable std::mutex mu_;
  char grow_refusal_[256] = "";               // (mu_) the provider's last refusal, for allocation failures
  std::condition_variable moved_;             // a move in which this device took part ended (mu_)
  std::shared_ptr<Storage> private_storage_;  // private ranges
  std::shared_ptr<Storage> shared_storage_;   // shared ranges; lazily opened
  // Filled on the program's threads (a new segment, a huge block): nodes from the internal heap.
  std::map<uintptr_t, Reservation, std::less<uintptr_t>, os::InternalAllocator<std::pair<const uintptr_t, Reservation>>>
      reservations_;
  uint64_t reserved_bytes_ = 0;
  bool forked_child_ = false;
  IntervalSet online_;                                 // the offsets that are capacity (mu_)
  uint64_t space_ = 0;                                 // end of the offset space (mu_)
  uint64_t max_space_ = 0;                             // how far it can grow: a devdax device's size; files: unbounded
  Extent withdrawing_{0, 0};                           // the withdrawal in progress; empty when none (mu_)
  std::vector<std::shared_ptr<Storage>> withheld_in_;  // storages it withholds offsets of (mu_)
  Ledger ledger_;
};

}  // namespace cxlpool::detail

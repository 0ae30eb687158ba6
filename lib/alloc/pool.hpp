// SPDX-License-Identifier: MIT
// Pools and the tiered allocator: the internal API the C ABI and the interposer use. A pool
// borrows its devices from the process's device registry (one Device per target, shared by
// every pool) and carves their address space into 4 MiB segments of 64 KiB slices; pages of
// one size class live in runs of slices; requests above 1 MiB get whole segments. Threads
// allocate from their own heap without locks; frees from other threads go through per-page
// atomic bitmaps. All allocator metadata lives in DRAM, never in device memory. Nothing here
// throws on an allocation path. Design: docs/allocator.md; file map: docs/architecture.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/metric.hpp"
#include "device/device.hpp"
#include "topology/model.hpp"

namespace cxlpool::detail::alloc {

class Pool;
inline constexpr int kMaxDevices = 8;
inline constexpr int kMaxPools = 64;

struct PoolOptions {
  std::vector<size_t> targets;  // topology target indices; empty = every target, in tier order
  std::string policy;           // placement policy text (docs/policy.md); empty = bind:near
  std::string name;
  Sharing sharing = Sharing::kPrivate;  // what a forked child gets: copies, or the same memory
};

struct DeviceStats {
  uint64_t allocated_bytes = 0;  // bytes in live blocks (block sizes)
  uint64_t active_bytes = 0;     // bytes of slices carved into pages or huge spans
  uint64_t resident_bytes = 0;   // bytes committed on the device by this pool
  uint64_t peak_resident_bytes = 0;
  uint64_t allocations = 0;  // successful allocations placed on this device
  uint64_t frees = 0;
  uint64_t fallbacks = 0;  // allocations placed here because the policy's first choice was full
  uint64_t failures = 0;   // allocations whose policy devices were all full (NULL + ENOMEM)
  uint64_t capacity_bytes = 0;
  uint64_t device_committed_bytes = 0;  // committed on the device by every pool and backing
  uint64_t double_frees = 0;            // frees of blocks already free: ignored
  uint64_t invalid_frees = 0;           // frees of pointers that start no block: ignored
  uint64_t capacity_changes = 0;        // extents added and withdrawn (elastic capacity)
  uint64_t capacity_refusals = 0;       // withdrawals refused (BUSY)
  uint64_t evacuated_bytes = 0;         // moved off the device by withdrawals
  uint64_t lost_bytes = 0;              // committed bytes forced releases took (docs/devices.md)
  uint64_t borrow_refusals = 0;         // borrowed capacity refused by its shared pool (docs/compose.md)
};

// Every DeviceStats figure with its description: the one list pool_stats_json, the stats page
// (lib/stats) and cxlpool-stat render. per_device: a figure of the device itself (the same in
// every pool on it), not summed over pools.
struct DeviceStatField {
  MetricDesc desc;
  uint64_t DeviceStats::*member;
  bool per_device;
};
inline constexpr DeviceStatField kDeviceStatFields[] = {
    {{"allocated_bytes", MetricKind::kGauge, "bytes", "bytes in live blocks"}, &DeviceStats::allocated_bytes, false},
    {{"active_bytes", MetricKind::kGauge, "bytes", "bytes of slices carved into pages or huge spans"},
     &DeviceStats::active_bytes,
     false},
    {{"resident_bytes", MetricKind::kGauge, "bytes", "bytes committed on the device by the pools"},
     &DeviceStats::resident_bytes,
     false},
    {{"peak_resident_bytes", MetricKind::kGauge, "bytes", "highest resident_bytes (sum of the pools' peaks)"},
     &DeviceStats::peak_resident_bytes,
     false},
    {{"capacity_bytes", MetricKind::kGauge, "bytes", "the device's capacity"}, &DeviceStats::capacity_bytes, true},
    {{"device_committed_bytes", MetricKind::kGauge, "bytes", "committed on the device by every pool and backing"},
     &DeviceStats::device_committed_bytes,
     true},
    {{"allocations", MetricKind::kCounter, "events", "allocations placed on the device"},
     &DeviceStats::allocations,
     false},
    {{"frees", MetricKind::kCounter, "events", "frees of blocks on the device"}, &DeviceStats::frees, false},
    {{"fallbacks", MetricKind::kCounter, "events", "allocations placed here because the first choice was full"},
     &DeviceStats::fallbacks,
     false},
    {{"failures", MetricKind::kCounter, "events", "allocations that failed: every policy device full"},
     &DeviceStats::failures,
     false},
    {{"double_frees", MetricKind::kCounter, "events", "frees of blocks already free (ignored)"},
     &DeviceStats::double_frees,
     false},
    {{"invalid_frees", MetricKind::kCounter, "events", "frees of pointers that start no block (ignored)"},
     &DeviceStats::invalid_frees,
     false},
    {{"capacity_changes", MetricKind::kCounter, "events", "extents added to or withdrawn from the device"},
     &DeviceStats::capacity_changes,
     true},
    {{"capacity_refusals", MetricKind::kCounter, "events",
      "withdrawals refused: something in the range could not move"},
     &DeviceStats::capacity_refusals,
     true},
    {{"evacuated_bytes", MetricKind::kCounter, "bytes", "committed bytes moved off the device by withdrawals"},
     &DeviceStats::evacuated_bytes,
     true},
    {{"lost_bytes", MetricKind::kCounter, "bytes", "committed bytes forced releases took: data lost"},
     &DeviceStats::lost_bytes,
     true},
    {{"borrow_refusals", MetricKind::kCounter, "events", "borrowed capacity refused: quota grant or pool full"},
     &DeviceStats::borrow_refusals,
     true},
};

// One device of the process (a Device is shared by every pool on its target) with the sum of
// the live pools' figures on it.
struct DeviceTotals {
  const void* identity = nullptr;  // the Device
  char name[48] = {};
  int kind = 0;  // cxlpool_backing_kind_t
  int tier = 0;
  int numa_node = -1;
  int pools = 0;
  DeviceStats stats;
};
// Fills out[0..max) with the process's devices that have a live pool, in first-seen order;
// returns how many. Runs under the pool registry's lock and neither allocates nor calls out:
// fork() under a sanitizer takes the sanitizer's allocator lock before our fork handlers.
size_t collect_device_totals(DeviceTotals* out, size_t max) noexcept;

struct PtrInfo {
  Pool* pool = nullptr;
  int device = -1;       // index in the pool of the device holding the bytes (resident)
  int home_device = -1;  // the device whose lists the block belongs to (differs once tiering moved it)
  size_t target = 0;     // topology target index
  int tier = 0;
  size_t block_size = 0;  // size of the block holding the pointer
  size_t usable = 0;      // bytes from the pointer to the end of its block
  bool huge = false;
};

Pool* pool_create(const Topology& topo, const PoolOptions& options);  // throws Failure
void pool_destroy(Pool* pool) noexcept;
// While a PoolsAlive exists no pool is destroyed (pool_destroy waits for it): what the
// tiering engine holds while it uses the Pool pointers of the units it listed, and pin()
// while it moves units. Shared among holders; not held across fork() (the child resets it).
class PoolsAlive {
 public:
  PoolsAlive() noexcept;
  ~PoolsAlive();
  PoolsAlive(const PoolsAlive&) = delete;
  PoolsAlive& operator=(const PoolsAlive&) = delete;
};
// A pool over every target of topo with the policy of CXLPOOL_POLICY (default bind:near): the
// process default pool and the interposer's. A bad policy is CXLPOOL_E_CONFIG naming the
// variable and the token.
Pool* pool_create_from_environment(const Topology& topo, const std::string& name);
// Applies process-wide options from the environment (CXLPOOL_PURGE_DELAY_MS,
// CXLPOOL_NODE_WATCH_MS). Throws Failure(CXLPOOL_E_CONFIG) naming every bad variable and its
// token; the good ones take effect, the bad ones keep their defaults.
void configure_from_environment();

// The malloc contract: NULL with errno = ENOMEM on failure; hint: CXLPOOL_HINT_* bits;
// device >= 0 overrides the policy for this call.
void* pool_malloc(Pool* pool, size_t size) noexcept;
void* pool_malloc(Pool* pool, size_t size, uint32_t hint, int device) noexcept;
void* pool_aligned(Pool* pool, size_t alignment, size_t size, uint32_t hint = 0, int device = -1) noexcept;
void* pool_realloc(Pool* pool, void* p, size_t size) noexcept;
// Frees a block of any pool. Returns false (and does nothing) for pointers outside every
// cxlpool arena; an interior pointer or a second free of a block is counted and ignored.
bool free_any(void* p) noexcept;
// free() from a context that may have interrupted this thread inside the allocator (a signal
// handler): small blocks go through the lock-free remote path; a huge block is left
// allocated, because freeing it takes a lock the interrupted code may hold.
bool free_any_reentrant(void* p) noexcept;
// Usable bytes of the block p starts; 0 for foreign and interior pointers.
size_t usable_size(const void* p) noexcept;
bool owns(const void* p) noexcept;
// The block holding p (p may point inside it).
bool ptr_info(const void* p, PtrInfo* out) noexcept;
// Returns empty pages, free slices and cached spans to the devices; bytes decommitted.
uint64_t pool_trim(Pool* pool) noexcept;

// Whether the allocator spends address space as under an RLIMIT_AS (docs/allocator.md,
// "Address space"): read from the limit once; tests set it (1 or 0; -1 reads the limit again).
bool address_space_limited() noexcept;
void set_address_space_limited(int limited) noexcept;

// Purging: free committed memory goes back to its device once idle for about twice this
// delay (a short-lived purger thread runs while anything is pending); 0 purges at once.
void set_purge_delay_ms(uint64_t ms) noexcept;
uint64_t purge_delay_ms() noexcept;

// ---- Residency (residency.cpp): the tiering engine's hook ----------------------------------
// A unit is what moves between devices: a region of small segments or a huge span, each one
// device reservation. Its home (which pool lists it is on) never changes; its resident device
// (where its bytes are) does.
//
// Regions made from now on have n segments (1..16; default 16 = 64 MiB): the tiering engine
// asks for 1 so that 4 MiB segments move one by one.
void set_region_segments(size_t n) noexcept;
size_t region_segments() noexcept;

struct UnitRef {
  uint32_t pool_index = 0, pool_generation = 0;
  uintptr_t base = 0;
  uint64_t serial = 0;  // tells a unit from a later one at the same address
  int home = 0;         // the device whose lists hold it (fixed for the unit's life)
};
struct Unit {
  UnitRef ref;
  Pool* pool = nullptr;
  size_t size = 0;         // device bytes mapped from ref.base
  uint64_t committed = 0;  // bytes committed (what a move copies)
  int home = 0, resident = 0;
  bool huge = false;
  bool moving = false;  // a move of it runs: resident is where it was, not where it will be
};
// Calls fn for every unit of every pool that may move: private pools of two devices or more
// (not detached fork views). fn runs with the unit's home PoolDevice::mu held: it must not
// call back into the allocator. Returns the number of units visited.
size_t for_each_unit(void (*fn)(void* ctx, const Unit& unit), void* ctx) noexcept;
// Runs fn with the unit's home lock held if the unit still exists (same pool incarnation,
// base and serial); false when it is gone. What the engine uses to arm monitors on memory it
// knows is still ours.
bool with_unit(const UnitRef& ref, void (*fn)(void* ctx, const Unit& unit), void* ctx) noexcept;
// Told before a unit's reservation is released: hook(base, size) runs with the unit's home
// lock held, before the memory stops being the pool's (the tiering engine's monitors stop
// watching it there; later would be too late: the address may be someone else's). One hook
// per process, nullptr clears it; it must not call into the allocator.
using UnitReleaseHook = void (*)(uintptr_t base, size_t size) noexcept;
void set_unit_release_hook(UnitReleaseHook hook) noexcept;
// Moves a unit's bytes to device `to` of its pool (Device::move_reservation) under the unit's
// home lock; on success the unit's segments (or span) and the pool's per-device resident
// figures follow. Statuses: OK; NOT_FOUND (the unit is gone); NOT_SUPPORTED (already there,
// shared memory, or devices of different page sizes); INVALID_ARGUMENT (no device `to`);
// and the move's own (CAPACITY, NO_MEMORY, OS). *message (when given) says why, on failure.
struct UnitMove {
  bool declined = false;  // the hook declined it before anything was done (NOT_SUPPORTED)
  bool moving = false;    // BUSY because the unit is being moved already (that move will end)
  bool already = false;   // NOT_SUPPORTED because the unit is on `to` already (moved there meanwhile)
  bool freed = false;     // NOT_FOUND because the unit was a freed huge span: released, not moved
  uint64_t bytes = 0;
  bool by_kernel = false;
  size_t pages_left_behind = 0;
  int from = -1;
};
// hook (when given) runs under the same lock just before the move (after = false) and after
// it (after = true, with the status): the engine disarms and re-arms its monitors there. A
// hook that returns false before the move declines it (NOT_SUPPORTED, UnitMove::declined, no
// after call): the engine checks pins there, atomically with the unit's becoming moving (it
// must not block: it runs under the home lock). The lock is not held while the bytes move:
// the unit is marked moving instead (Region::moving), so the pool's other units allocate and
// free meanwhile; a second move of it is BUSY (UnitMove::moving). Free memory is not copied:
// a region's free committed slices are decommitted first, and a freed huge span the cache
// keeps is released instead (NOT_FOUND, UnitMove::freed). The caller holds a PoolsAlive.
using UnitHook = bool (*)(void* ctx, const Unit& unit, bool after, cxlpool_status_t status);
cxlpool_status_t move_unit(const UnitRef& ref, int to, UnitMove* out, std::string* message, UnitHook hook = nullptr,
                           void* hook_ctx = nullptr) noexcept;
// Moves made outside the tiering engine (a withdrawal's evacuation: elastic.cpp) while it
// runs: its monitors arm units in ways a move would refuse as the program's (a userfaultfd,
// pages made PROT_NONE), so they must stop watching a unit while it moves, as for its own
// moves. begin returns true with the hook to pass to move_unit and keeps the engine alive until
// end; false when no engine runs. Installed by the engine (one pair per process).
using OutsideMoveBegin = bool (*)(UnitHook* hook, void** ctx) noexcept;
using OutsideMoveEnd = void (*)() noexcept;
void set_outside_moves(OutsideMoveBegin begin, OutsideMoveEnd end) noexcept;
// Whether a unit's pin (kept by the tiering layer) lets it move to device `to` of its pool:
// what a withdrawal asks before it brings a unit back to the device it evacuated, so a unit
// pinned elsewhere since stays. Runs under the unit's home lock: it must not wait (false when
// it cannot tell at once; the next growth asks again). Installed by the tiering layer on its
// first pin; none installed means no pins.
using PinCheck = bool (*)(const Unit& unit, int to) noexcept;
void set_pin_check(PinCheck check) noexcept;
// The Device behind a pool device (shared by every pool on its target) and its declared read
// bandwidth (MB/s, 0 when unknown).
const Device& pool_device_of(const Pool* pool, int device) noexcept;
uint64_t pool_device_read_bandwidth(const Pool* pool, int device) noexcept;
// Runs the interposer's internal-scope hooks (set_internal_scope_hooks) on the calling
// thread: a cxlpool background thread's own allocations then go to the internal heap.
void enter_internal_scope() noexcept;
void leave_internal_scope() noexcept;
// The unit holding p, if p is in a movable pool's memory (any unit, live block or not).
bool unit_of(const void* p, Unit* out) noexcept;
// The interposer marks threads that run inside cxlpool (the purger) so their own
// allocations go to its internal heap.
void set_internal_scope_hooks(void (*enter)() noexcept, void (*leave)() noexcept) noexcept;
// While set on the calling thread, freeing never starts the purger thread (the request stays:
// the next free that may start it does). The interposer sets it around frees that come from
// the dynamic loader: glibc frees a thread's TLS under its stack-cache lock (pthread_join, a
// detached thread's end) and dlclose frees under the loader's lock, and pthread_create takes
// both.
void set_thread_start_deferred(bool deferred) noexcept;

// ---- Elastic capacity (elastic.cpp; docs/devices.md) ---------------------------------------
// The capacity of a device open in this process changes while its pools allocate. Growing is
// immediate. Withdrawing an extent gives back the pools' free memory first, then moves what
// they hold in the extent, or past the new capacity, under the same addresses: to other
// offsets of the device where the pages are private anonymous memory (no bytes move),
// otherwise to another device of the unit's pool in the order its policy names them. What
// cannot move (a pool with one device or shared memory, a raw backing's range, a move the
// program's use of the range refuses) makes it BUSY, with a message naming it; the extent
// then stays online, and units that had moved stay where they went. A withdrawal that cannot
// succeed (what must leave cannot move, or the pools' other devices lack the room) is refused
// before anything moves. When the device grows again, the units withdrawals moved off it go
// home while it has room for them (a bind policy places on its device again).
struct CapacityReport {
  uint64_t capacity_before = 0, capacity_after = 0;
  uint64_t trimmed_bytes = 0;                         // free memory of the pools given back first
  uint64_t relocated = 0;                             // reservations given other offsets of the device (no bytes moved)
  uint64_t evacuated_units = 0, evacuated_bytes = 0;  // moved to other devices of their pools
  uint64_t returned_units = 0, returned_bytes = 0;    // moved back home after the device grew
  uint64_t lost_units = 0, lost_bytes = 0;            // forced release: reservations that lost memory, committed bytes
  uint64_t attempts = 0;                              // release: withdrawals tried
};
// The open device named name (the registry's), or nullptr with *status NOT_FOUND (none open in
// this process) or BUSY (two topologies opened a target of that name) and *message saying so.
std::shared_ptr<Device> find_device(const std::string& name, cxlpool_status_t* status, std::string* message);
// Statuses: OK; NOT_FOUND (no device of that name open here); INVALID_ARGUMENT (not
// page-aligned, not online / already online, below 4 MiB); CAPACITY (past a devdax device's
// end); BUSY (something in the range cannot move, or another withdrawal is running); OS.
cxlpool_status_t device_add_extent(const std::string& name, uint64_t offset, uint64_t length, CapacityReport* report,
                                   std::string* message) noexcept;
cxlpool_status_t device_withdraw_extent(const std::string& name, uint64_t offset, uint64_t length,
                                        CapacityReport* report, std::string* message) noexcept;
// Sets the capacity: grows into holes of the offset space first, then past its end; shrinks
// by withdrawing from the top (the offsets handed out last).
cxlpool_status_t device_resize(const std::string& name, uint64_t capacity, CapacityReport* report,
                               std::string* message) noexcept;

// Dynamic capacity (CXL 3.x DCD semantics, docs/devices.md). An offer: each extent is
// accepted (added) or rejected on its own, verdicts[i] its status; returns OK when all were
// accepted, else the first rejection's status, with every rejection in *message.
cxlpool_status_t device_offer_extents(const std::string& name, const std::vector<Device::Extent>& extents,
                                      std::vector<cxlpool_status_t>* verdicts, CapacityReport* report,
                                      std::string* message) noexcept;
// A release the device asks for: the withdrawal is tried until it succeeds or deadline_ms
// passes (0: once); what holds the range may be freed or unpinned meanwhile. At the deadline
// the range stays (BUSY) unless force: then it goes whatever holds it, everything that can move
// having moved, and the rest loses its memory (Device::force_withdraw), listed in *lost (may be
// null) and passed to the lost handler. OK when the range is gone (report.lost_units says
// whether anything was lost).
struct LostRange {
  std::string device;
  uintptr_t addr = 0;
  size_t len = 0;
  uint64_t committed = 0;
  std::string holder;  // "pool 'name'", "a raw backing", ...
  bool contents_kept = false;
};
cxlpool_status_t device_release_extent(const std::string& name, uint64_t offset, uint64_t length, uint64_t deadline_ms,
                                       bool force, CapacityReport* report, std::vector<LostRange>* lost,
                                       std::string* message) noexcept;
// The memory behind the online [offset, offset+length) of device name failed (a borrowed
// device's shared pool: failed, or this participant evicted); failure says how, for messages.
// A forced release that moves nothing: nothing there is read, written or freed (it may fault,
// or be another's now); what held part of it gets zeroed private memory at the same addresses
// and is reported as lost (*lost, the lost handler, stderr, the device's counters). OK when the
// range is gone.
cxlpool_status_t device_lose_extent(const std::string& name, uint64_t offset, uint64_t length,
                                    const std::string& failure, CapacityReport* report, std::vector<LostRange>* lost,
                                    std::string* message) noexcept;
// Called once per lost range after a forced release, on the releasing thread, with no lock of
// cxlpool held (nullptr: none).
using LostHandler = void (*)(const char* device, void* addr, size_t len, uint64_t committed, void* ctx);
void set_lost_handler(LostHandler handler, void* ctx) noexcept;
// Brings dev's capacity to `capacity` (rounded down to its page size; any size, 0 included)
// because the memory under it changed: grows as device_resize does; shrinks from the top by
// forced releases (what can move does; the rest is lost and listed in *lost, which must be
// given). The lost handler is the caller's to call.
cxlpool_status_t device_follow(Device& dev, uint64_t capacity, CapacityReport* report, std::vector<LostRange>* lost,
                               std::string* message) noexcept;

// Memory hot-remove and hot-add under numa devices (node_watch.cpp, docs/devices.md): every
// numa device a pool opens is watched; once a pass finds its node's MemTotal (under the sysfs
// root of the topology the pool came from) changed since the device opened, it brings the
// device's capacity to the smaller of it and the capacity the device had otherwise (its
// declared size, or what a capacity change set since); a discovered node target (whole_node)
// follows the node's memory itself, growth past its first size included, until a capacity
// change sets its own. A thread runs a pass every node_watch_ms (CXLPOOL_NODE_WATCH_MS;
// default 1000; 0: none, passes only when the program asks). Returns the devices changed.
void node_watch_add(const std::shared_ptr<Device>& dev, const std::string& sysfs_root, bool whole_node) noexcept;
size_t node_watch_pass() noexcept;
// The memory of the node under a watched numa device now (its MemTotal, read under the sysfs
// root its pool's topology came from); nullopt for other devices or when it cannot be read.
// A capacity change never takes a numa device past it.
std::optional<uint64_t> node_memory_of(const Device& dev) noexcept;
void set_node_watch_ms(uint64_t ms) noexcept;
// fork(): the watched list's lock is held across it (alloc/fork.cpp's order, last); the child
// gets fresh pass locks and a watcher thread of its own (none under g++'s sanitizers, as the
// purger: passes there run when asked).
void node_watch_lock_for_fork() noexcept;
void node_watch_unlock_after_fork() noexcept;
void node_watch_reset_lock_in_child() noexcept;  // a fork from a signal handler (fork.cpp)
void node_watch_reset_after_fork() noexcept;

// The allocator's fork hooks (called by lib/lifecycle's one pthread_atfork registration, in
// the order written there): prepare takes every allocator and device lock in the order written
// at the top of fork.cpp; parent and child release them; the child first gets its own copy of
// private memory that the kernel does not copy-on-write, and its inherited shared pools
// become read/write views it cannot allocate from.
void fork_prepare() noexcept;
void fork_parent() noexcept;
void fork_child() noexcept;
// In the child of a fork() made from a signal handler that interrupted cxlpool (no lock was
// taken before it; the interrupted code may hold some): re-creates every lock, then runs the
// child's fork handling as if prepare had run. The allocator may be mid-update there, as
// glibc's may be in the same case.
void fork_child_after_reentrant_fork() noexcept;

int pool_device_count(const Pool* pool) noexcept;
const std::string& pool_device_name(const Pool* pool, int device) noexcept;
size_t pool_device_target(const Pool* pool, int device) noexcept;
int pool_device_tier(const Pool* pool, int device) noexcept;
int pool_find_device(const Pool* pool, const std::string& name) noexcept;
const std::string& pool_policy_text(const Pool* pool) noexcept;
const std::string& pool_name(const Pool* pool) noexcept;
Sharing pool_sharing(const Pool* pool) noexcept;
DeviceStats pool_device_stats(const Pool* pool, int device) noexcept;
std::string pool_stats_json(const Pool* pool);

}  // namespace cxlpool::detail::alloc

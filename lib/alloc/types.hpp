// SPDX-License-Identifier: MIT
// The private heap's data structures and tunables, shared by the allocator's files:
//
//   pool device (a borrowed Device)  regions reserved from it, 4 MiB aligned
//   region                           up to 64 segments of 4 MiB
//   segment (small)                  64 slices of 64 KiB; a page is a run of slices of one class
//   huge span                        whole segments of address space for one block above 1 MiB
//
// Every structure here lives in DRAM (metadata mappings), never in device memory. Which lock
// guards what is written at each field; the lock order is at the top of fork.cpp.
#pragma once

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "alloc/pagemap.hpp"
#include "alloc/pool.hpp"
#include "alloc/route.hpp"
#include "alloc/size_class.hpp"
#include "device/device.hpp"
#include "os/internal_heap.hpp"
#include "placement/policy.hpp"

namespace cxlpool::detail::alloc {

inline constexpr size_t kRegionSegments = 16;              // 64 MiB regions when address space allows
inline constexpr uint64_t kMaxFreeCommitted = 1ull << 30;  // free committed bytes per pool device beyond
                                                           // which retired pages are decommitted at once
// Under an RLIMIT_AS, blocks above this are huge: a reservation of exactly their size (to the
// page), where a class page would hold up to 25% more for the class and its slices.
inline constexpr size_t kLimitedSpanMin = size_t(32) << 10;
// Devices below this capacity (16 segments) get pages of the fewest slices that hold their
// blocks (size_class.hpp, class_slices_tight), as under an RLIMIT_AS.
inline constexpr uint64_t kTightPagesBelow = uint64_t(64) << 20;
inline constexpr size_t kHugeCacheEntries = 4;
inline constexpr uint64_t kHugeCacheBytes = 64ull << 20;
inline constexpr int kAdoptScan = 8;
inline constexpr int kCentralHeaps = 4;  // per pool, picked by the CPU a thread runs on
// A thread's first allocations of a class come from a central heap; from this many on, from a
// page of its own (docs/allocator.md, "Threads"). Pages of classes above kThreadMaxSize are
// 8+ such blocks, so a thread takes one only when it allocates that class a lot.
inline constexpr uint8_t kWarmAllocations = 32;
inline constexpr uint8_t kWarmLargeAllocations = 255;
inline constexpr uint8_t warm_limit(unsigned cls) {
  return cls < kFirstCentralClass ? kWarmAllocations : kWarmLargeAllocations;
}

enum PageState : uint8_t { kUnused, kActive, kFull, kAbandoned };

struct Heap;
struct Segment;

// Owner-written bitmap words that other threads may read (double-free checks): relaxed
// atomic accesses, which compile to plain loads and stores.
inline uint64_t load_bits(const uint64_t* w) noexcept { return __atomic_load_n(w, __ATOMIC_RELAXED); }
inline void store_bits(uint64_t* w, uint64_t v) noexcept { __atomic_store_n(w, v, __ATOMIC_RELAXED); }

struct alignas(64) Page {
  // First cache line: everything malloc and free touch.
  std::atomic<Heap*> owner{nullptr};
  // Two bitmaps, word w of each side by side (bits[2w], bits[2w + 1]) so a free touches one
  // cache line: blocks malloc may hand out now, and blocks the owner freed since the last fold.
  // malloc never hands out a block its owner freed before the page's remote frees have been
  // folded in next to it, so two frees of one block that race (the owner's and another
  // thread's, each unaware of the other) always meet in the fold and count once.
  uint64_t* bits = nullptr;
  uintptr_t start = 0, commit_end = 0, end = 0;
  uint32_t block_size = 0;
  uint32_t used = 0;  // live blocks: handed out, less the owner's frees and the remote frees folded in
  uint32_t cursor = 0, words = 0;
  std::atomic<uint8_t> state{kUnused};  // owner writes; others only read (relaxed)
  uint8_t cls = 0, device = 0, first_slice = 0, slices = 0;
  // Second line: the bitmaps of pages with at most 256 blocks (most classes), next to the hot
  // line so a free touches one adjacent pair of lines.
  alignas(64) uint64_t inline_bits[2 * kInlineWords] = {};
  // Third line: slow paths.
  uint64_t reciprocal = 0;
  uint32_t capacity = 0;
  std::atomic<int32_t> remote_count{0};
  std::atomic<uint64_t>* remote_bits = nullptr;
  Page* next = nullptr;
  Page* prev = nullptr;
  Segment* segment = nullptr;
};
static_assert(offsetof(Page, inline_bits) == 64, "hot page fields fit one cache line");

// Word w of a page's two bitmaps: blocks free now, and blocks the owner freed since the fold.
inline uint64_t* free_word(Page* pg, uint32_t w) noexcept { return &pg->bits[2 * size_t(w)]; }
inline uint64_t* freed_word(Page* pg, uint32_t w) noexcept { return &pg->bits[2 * size_t(w) + 1]; }

struct Segment : SegmentHeader {
  uintptr_t base = 0;
  // Bit per page slot: the page may hold remote frees not folded in yet. In the cache line
  // free() loads anyway, so the owner's double-free check reads the remote bitmap only when
  // one of these is set. Set by remote frees; cleared (then re-checked) when a page's remote
  // count drops to zero.
  std::atomic<uint64_t> remote_pending{0};
  uint64_t free_slices = ~uint64_t(0);  // pool device mutex
  uint64_t committed_slices = 0;        // pool device mutex
  uint64_t purge_mark = 0;              // free and committed at the last purge pass
  Segment* next_partial = nullptr;
  Segment* prev_partial = nullptr;
  bool in_partial = false;
  // Part of its range was taken by a forced release (elastic.cpp, mark_lost): no new page is
  // carved from it and its pages hand out nothing more; it goes back when its blocks are freed.
  std::atomic<bool> lost{false};
  size_t region = 0;
  // Per slice: the page (slot = its first slice) and its size class, so free() can find the
  // block's bitmap word without first loading the page descriptor.
  struct SliceInfo {
    uint8_t slot, cls;
  } slice[kSlicesPerSegment] = {};
  Page pages[kSlicesPerSegment];
  uint64_t local_bits[kSlicesPerSegment][2 * kBitmapWords];  // Page::bits of larger pages
  std::atomic<uint64_t> remote_bits[kSlicesPerSegment][kBitmapWords];
};

// A block above 1 MiB (or aligned beyond a slice): a reservation of its own, `segments`
// segments of address space of which the first `block` bytes are device memory. Under an
// RLIMIT_AS only the block's bytes are reserved (`reserved`): the rest of the last segment is
// left to the program (its page map entry still names the span; huge_reserves() tells).
struct HugeSpan : SegmentHeader {
  uintptr_t base = 0;
  uintptr_t user = 0;  // the pointer handed out (base, or aligned inside the span)
  size_t segments = 0;
  size_t reserved = 0;     // address space from base: segments * 4 MiB, or block
  size_t block = 0;        // device bytes mapped from base
  uint64_t committed = 0;  // bytes committed from base
  uint64_t cached_at = 0;  // purge pass count when it entered the cache
  uint64_t serial = 0;     // next_unit_serial()
  bool cached = false;
  bool lost = false;         // a forced release took part of its range: released when freed, never cached
  bool moving = false;       // move_unit copies it now (home mutex): see Region::moving
  HugeSpan* next = nullptr;  // live list or cache list of the pool device
  HugeSpan* prev = nullptr;
};

// One reservation of a pool device for small segments. Its bytes live on the resident
// device (the home, until the tiering engine moves the region); commit, decommit and release
// go there.
struct Region {
  uintptr_t base = 0;
  size_t segments = 0;  // 0 once released
  uint64_t used = 0;    // bit per segment (regions of <= 64 segments)
  uint64_t lost = 0;    // segments whose range a forced release took: never handed out again
  uint64_t serial = 0;  // next_unit_serial()
  int resident = 0;
  // move_unit copies it to another device now, with the home mutex released (residency.cpp):
  // nothing commits, decommits or releases in it until the move ends. New pages and segments
  // go elsewhere, purges and trims pass it by, and a page growing its commit waits
  // (PoolDevice::unit_moved).
  bool moving = false;
};

// Single-writer counters readable by other threads (relaxed atomics, no RMW on the hot path).
struct Counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

// Per pool device, counted by size class (one counter per malloc and per free; bytes derived).
struct HeapCounters {
  Counter allocs[kNumClasses], frees[kNumClasses];
  Counter huge_allocs, huge_frees, fallbacks, failures, double_frees, invalid_frees;
};

// What a heap keeps for one pool device, together: a thread allocating from one device writes
// its row and no other (a heap lives in zero pages; with thousands of threads alive, every
// page a heap writes is resident memory: rows per field spread one device's writes over 6 of
// a heap's 9 pages, a row per device keeps them on 2).
struct HeapRow {
  Page* head[kNumClasses] = {};
  Page* tail[kNumClasses] = {};
  Page* full[kNumClasses] = {};
  std::atomic<uint8_t> full_dirty[kNumClasses] = {};
  HeapCounters counters;
};

struct alignas(64) Heap {
  Pool* pool = nullptr;
  bool live = false;    // pool heaps_mu
  int8_t central = -1;  // a central heap's index in Pool::central (its lock guards it); -1: a thread's
  Heap* next_in_pool = nullptr;
  Heap* next_free = nullptr;         // Pool::free_heaps (heaps_mu)
  int16_t page_device[kNumClasses];  // per-page routes: device of the current page per class
  uint8_t warm[kNumClasses];         // a thread's allocations per class, up to warm_limit(class)
  HeapRow row[kMaxDevices];
};

// A pool's use of one device: everything here is per pool, the Device is shared.
struct PoolDevice {
  std::shared_ptr<Device> device;
  std::string name;
  size_t target = 0;
  int tier = 0;
  uint64_t read_bandwidth = 0;
  // Pages larger than a slice (device-DAX at 2 MiB): whole segments are committed at once and
  // stay committed until the segment is freed (device-DAX memory is not returned anyway).
  bool coarse = false;
  size_t page_size = 0;
  std::mutex mu;                                               // everything below that is not atomic
  std::condition_variable unit_moved;                          // a move of a unit homed here ended (mu)
  std::vector<Region, os::InternalAllocator<Region>> regions;  // grown on the program's threads
  Segment* partial = nullptr;
  Page* abandoned[kNumClasses] = {};
  HugeSpan* huge_cache = nullptr;
  HugeSpan* huge_live = nullptr;
  size_t huge_cache_count = 0;
  uint64_t huge_cache_bytes = 0;
  uint64_t free_committed = 0;  // bytes of free but committed slices
  uint64_t purge_passes = 0;    // passes run over this pool device
  uint64_t last_purge_ns = 0;
  std::atomic<uint64_t> resident{0}, peak_resident{0}, active{0};
  std::atomic<uint64_t> orphan_frees[kNumClasses] = {};  // frees by threads without a heap
  // Remote frees found to be double frees only when folded in (they were counted as frees).
  std::atomic<uint64_t> late_double_frees[kNumClasses] = {};
  std::atomic<uint64_t> orphan_huge_frees{0}, orphan_double_frees{0}, orphan_invalid_frees{0};
  std::atomic<uint64_t> huge_live_bytes{0};
};

class Pool {
 public:
  uint32_t index = 0;
  uint32_t generation = 0;
  std::string name;
  Policy policy;
  Sharing sharing = Sharing::kPrivate;
  bool detached = false;  // a shared pool inherited by a fork child: no allocation here
  ClassRoute routes[kNumClasses];
  int ndev = 0;
  PoolDevice dev[kMaxDevices];
  std::vector<uint8_t> interleave_sequence;  // per-page interleave: device per counter step
  std::atomic<uint64_t> interleave_counter{0};
  std::mutex heaps_mu;
  Heap* heaps = nullptr;                  // every heap ever created (reused after thread exit), central ones too
  Heap* free_heaps = nullptr;             // heaps of exited threads, for the next thread (heaps_mu)
  std::atomic<uint32_t> thread_heaps{0};  // heaps live threads hold (written under heaps_mu)
  // Heaps shared by all threads for their first blocks of each class: each under its lock,
  // made on first use (central.cpp: only once threads contend for one already made). Lock
  // order: a central heap's lock before any PoolDevice::mu.
  struct Central {
    std::mutex mu;
    std::atomic<Heap*> heap{nullptr};  // written once, under mu
  } central[kCentralHeaps];
};

// free() must not change errno; the system calls of its slow paths could.
struct ErrnoGuard {
  int saved = errno;
  ~ErrnoGuard() { errno = saved; }
};

inline uint64_t run_mask(unsigned first, unsigned count) {
  return (count == 64 ? ~uint64_t(0) : ((uint64_t(1) << count) - 1)) << first;
}

}  // namespace cxlpool::detail::alloc

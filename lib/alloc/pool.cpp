// SPDX-License-Identifier: MIT
// The tiered allocator (see pool.hpp for the shape, docs/allocator.md for the design).
//
//   device address space  = regions (reserved from the device's backing, 4 MiB aligned)
//   region                = up to 64 segments of 4 MiB
//   segment (small)       = 64 slices of 64 KiB; a page is a run of slices of one size class
//   segment run (huge)    = n contiguous segments for one allocation above 1 MiB
//
// Metadata: a global page map (address >> 22 -> segment descriptor), segment descriptors
// holding 64 page descriptors and their free bitmaps, heaps: all anonymous DRAM mappings.
// The device memory itself is never written by the allocator.
//
// Threads: each thread has one heap per pool (thread-local). A heap owns pages; the owner
// allocates and frees with plain loads/stores on the page's free bitmap. Another thread's
// free sets the bit in the page's remote bitmap (atomic OR) and bumps remote_count; the
// owner folds remote bits in when the page runs dry, and a full page's remote free raises
// the heap's full_dirty flag for that class so the owner rescans its full pages. A thread
// that exits abandons its pages to the pool; other threads adopt them.
#include "alloc/pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>

#include "alloc/size_class.hpp"
#include "backing/backing.hpp"
#include "common/error.hpp"
#include "common/json.hpp"
#include "config/options.hpp"
#include "os/os.hpp"
#include "placement/policy.hpp"

namespace cxlpool::detail::alloc {
namespace {

constexpr int kAddressBits = 47;
constexpr size_t kPagemapEntries = size_t(1) << (kAddressBits - kSegmentShift);
constexpr size_t kRegionSegments = 16;  // 64 MiB regions by default
// Free slices stay committed (reuse without page faults) until a purge pass finds them still
// free kPurgeDelayNs after the previous pass; beyond kMaxFreeCommitted they go at once.
constexpr uint64_t kPurgeDelayNs = 100'000'000;
constexpr uint64_t kMaxFreeCommitted = 1ull << 30;
constexpr size_t kHugeCacheEntries = 4;
constexpr uint64_t kHugeCacheBytes = 64ull << 20;
constexpr int kAdoptScan = 8;

enum class SegKind : uint8_t { kSmall, kHuge };
enum PageState : uint8_t { kUnused, kActive, kFull, kAbandoned };

struct Heap;
struct Segment;

struct SegmentHeader {
  Pool* pool = nullptr;
  uint32_t pool_index = 0;       // copies of the pool's, so free() finds the thread's heap
  uint32_t pool_generation = 0;  // with one load less
  uint8_t device = 0;
  SegKind kind = SegKind::kSmall;
};

struct alignas(64) Page {
  // First cache line: everything malloc and free touch.
  std::atomic<Heap*> owner{nullptr};
  uint64_t* free_bits = nullptr;
  uintptr_t start = 0, commit_end = 0, end = 0;
  uint32_t block_size = 0, used = 0, cursor = 0, words = 0;
  std::atomic<uint8_t> state{kUnused};  // owner writes; others only read (relaxed)
  uint8_t cls = 0, device = 0, first_slice = 0, slices = 0;
  // Second line: the free bitmap of pages with at most 512 blocks (most classes), next to the
  // hot line so a free touches one adjacent pair of lines.
  alignas(64) uint64_t inline_bits[8] = {};
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
constexpr unsigned kInlineWords = 8;

struct Segment : SegmentHeader {
  uintptr_t base = 0;
  uint64_t free_slices = ~uint64_t(0);  // device mutex
  uint64_t committed_slices = 0;        // device mutex
  uint64_t purge_mark = 0;              // free and committed at the last purge pass
  Segment* next_partial = nullptr;
  Segment* prev_partial = nullptr;
  bool in_partial = false;
  size_t region = 0;
  // Per slice: the page (slot = its first slice) and its size class, so free() can find the
  // block's bitmap word without first loading the page descriptor.
  struct SliceInfo {
    uint8_t slot, cls;
  } slice[kSlicesPerSegment] = {};
  Page pages[kSlicesPerSegment];
  uint64_t local_bits[kSlicesPerSegment][kBitmapWords];
  std::atomic<uint64_t> remote_bits[kSlicesPerSegment][kBitmapWords];
};

// A block above 1 MiB: a reservation of its own, `segments` segments of address space of
// which the first `block` bytes are device memory.
struct HugeSpan : SegmentHeader {
  uintptr_t base = 0;
  size_t segments = 0;
  size_t block = 0;        // device bytes mapped from base (usable)
  uint64_t committed = 0;  // bytes committed from base
  bool cached = false;
  HugeSpan* next = nullptr;  // live list or cache list of the device
  HugeSpan* prev = nullptr;
};

struct Region {
  uintptr_t base = 0;
  size_t segments = 0;  // 0 once released
  uint64_t used = 0;    // bit per segment (regions of <= 64 segments)
};

// Single-writer counters readable by other threads (relaxed atomics, no RMW on the hot path).
struct Counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

// Per device, counted by size class (one counter per malloc and per free; bytes are derived).
struct HeapCounters {
  Counter allocs[kNumClasses], frees[kNumClasses];
  Counter huge_allocs, huge_frees, fallbacks, failures;
};

struct alignas(64) Heap {
  Pool* pool = nullptr;
  bool live = false;
  Heap* next_in_pool = nullptr;
  Page* head[kMaxDevices][kNumClasses] = {};
  Page* tail[kMaxDevices][kNumClasses] = {};
  Page* full[kMaxDevices][kNumClasses] = {};
  std::atomic<uint8_t> full_dirty[kMaxDevices][kNumClasses] = {};
  int16_t page_device[kNumClasses];  // per-page policies: device of the current page per class
  HeapCounters counters[kMaxDevices];
};

struct DeviceState {
  std::unique_ptr<Backing> backing;
  std::string name;
  size_t target = 0;
  int tier = 0;
  uint64_t capacity = 0;
  uint64_t read_bandwidth = 0;
  std::mutex mu;  // everything below that is not atomic
  std::vector<Region> regions;
  Segment* partial = nullptr;
  Page* abandoned[kNumClasses] = {};
  HugeSpan* huge_cache = nullptr;
  HugeSpan* huge_live = nullptr;
  size_t huge_cache_count = 0;
  uint64_t huge_cache_bytes = 0;
  uint64_t free_committed = 0;  // bytes of free but committed slices
  uint64_t last_purge_ns = 0;
  std::atomic<uint64_t> resident{0}, peak_resident{0}, active{0};
  std::atomic<uint64_t> orphan_frees[kNumClasses] = {};  // frees by threads without a heap
  std::atomic<uint64_t> orphan_huge_frees{0};
  std::atomic<uint64_t> huge_live_bytes{0};
};

}  // namespace

class Pool {
 public:
  uint32_t index = 0;
  uint32_t generation = 0;
  std::string name;
  Policy policy;
  int fixed_device = -1;  // single bind rule: the device, no evaluation needed
  int ndev = 0;
  DeviceState dev[kMaxDevices];
  std::vector<uint8_t> interleave_sequence;  // per-page interleave: device per counter step
  std::atomic<uint64_t> interleave_counter{0};
  std::mutex heaps_mu;
  Heap* heaps = nullptr;  // every heap ever created (reused after thread exit)
};

namespace {

// ---- Global page map and pool registry -----------------------------------------------------
std::atomic<std::atomic<SegmentHeader*>*> g_pagemap{nullptr};
std::once_flag g_pagemap_once;

struct RegistryEntry {
  Pool* pool = nullptr;
  uint32_t generation = 0;
};
std::mutex g_registry_mu;
RegistryEntry g_registry[kMaxPools];
uint32_t g_generation = 0;

struct TlsEntry {
  Heap* heap;
  uint32_t generation;
};
// One initial-exec TLS pointer per thread (no __tls_get_addr call on the hot path) to a
// block holding the thread's heap of every pool, mapped on the thread's first allocation.
struct ThreadState {
  TlsEntry heaps[kMaxPools];
};
thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec"))) = nullptr;
pthread_key_t g_exit_key;
std::once_flag g_exit_key_once;

inline SegmentHeader* lookup(const void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a >> kAddressBits) return nullptr;
  std::atomic<SegmentHeader*>* map = g_pagemap.load(std::memory_order_acquire);
  if (!map) return nullptr;
  return map[a >> kSegmentShift].load(std::memory_order_acquire);
}

void pagemap_set(uintptr_t base, size_t segments, SegmentHeader* h) noexcept {
  std::atomic<SegmentHeader*>* map = g_pagemap.load(std::memory_order_acquire);
  for (size_t i = 0; i < segments; ++i) map[(base >> kSegmentShift) + i].store(h, std::memory_order_release);
}

template <class T>
T* meta_new() {
  void* p = os::map_metadata(sizeof(T));
  return new (p) T();
}

// Segment descriptors come from 2 MiB chunks advised for transparent huge pages, so the
// descriptors of a large heap share few TLB entries. Freed descriptors are reused.
class SegmentArena {
 public:
  Segment* take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_) {
      void* p = free_;
      free_ = *static_cast<void**>(p);
      return static_cast<Segment*>(p);
    }
    if (left_ < kSlot) {
      constexpr size_t kChunk = size_t(32) << 20;  // 16 huge pages
      void* raw = os::map_metadata(kChunk + (size_t(2) << 20));
      uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);
      os::advise_hugepages(reinterpret_cast<void*>(aligned), kChunk);
      next_ = reinterpret_cast<char*>(aligned);
      left_ = kChunk;
    }
    void* p = next_;
    next_ += kSlot;
    left_ -= kSlot;
    return static_cast<Segment*>(p);
  }
  void give(Segment* s) {
    std::lock_guard<std::mutex> lock(mu_);
    *reinterpret_cast<void**>(s) = free_;
    free_ = s;
  }
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  static constexpr size_t kSlot = (sizeof(Segment) + 4095) & ~size_t(4095);
  std::mutex mu_;
  void* free_ = nullptr;
  char* next_ = nullptr;
  size_t left_ = 0;
};
SegmentArena g_segment_arena;

Segment* segment_new() {
  Segment* s = g_segment_arena.take();
  return new (s) Segment();
}
void segment_delete(Segment* s) noexcept {
  s->~Segment();
  g_segment_arena.give(s);
}
template <class T>
void meta_delete(T* p) noexcept {
  p->~T();
  os::unmap(p, sizeof(T));
}

inline Heap* tls_heap(const Pool* pool) noexcept {
  ThreadState* ts = tls_state;
  if (__builtin_expect(!ts, 0)) return nullptr;
  const TlsEntry& e = ts->heaps[pool->index];
  return e.generation == pool->generation ? e.heap : nullptr;
}

inline Heap* tls_heap(const SegmentHeader* hdr) noexcept {
  ThreadState* ts = tls_state;
  if (__builtin_expect(!ts, 0)) return nullptr;
  const TlsEntry& e = ts->heaps[hdr->pool_index];
  return e.generation == hdr->pool_generation ? e.heap : nullptr;
}

// ---- Page lists (owner thread only) -----------------------------------------------------------
void list_push_back(Page*& head, Page*& tail, Page* pg) {
  pg->next = nullptr;
  pg->prev = tail;
  if (tail)
    tail->next = pg;
  else
    head = pg;
  tail = pg;
}
void list_remove(Page*& head, Page*& tail, Page* pg) {
  if (pg->prev)
    pg->prev->next = pg->next;
  else
    head = pg->next;
  if (pg->next)
    pg->next->prev = pg->prev;
  else
    tail = pg->prev;
  pg->next = pg->prev = nullptr;
}
// Intrusive doubly linked stacks of pages and huge spans (members next/prev).
template <class T>
void stack_push(T*& head, T* x) {
  x->prev = nullptr;
  x->next = head;
  if (head) head->prev = x;
  head = x;
}
template <class T>
void stack_remove(T*& head, T* x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    head = x->next;
  if (x->next) x->next->prev = x->prev;
  x->next = x->prev = nullptr;
}

// ---- Device commit/decommit with accounting -------------------------------------------------
// free() must not change errno; the system calls of its slow paths could.
struct ErrnoGuard {
  int saved = errno;
  ~ErrnoGuard() { errno = saved; }
};

void device_commit(DeviceState& d, uintptr_t addr, size_t len) {
  d.backing->commit(reinterpret_cast<void*>(addr), len, 0);
  uint64_t now = d.resident.fetch_add(len, std::memory_order_relaxed) + len;
  uint64_t peak = d.peak_resident.load(std::memory_order_relaxed);
  while (now > peak && !d.peak_resident.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void device_decommit(DeviceState& d, uintptr_t addr, size_t len) noexcept {
  ErrnoGuard keep_errno;
  try {
    d.backing->decommit(reinterpret_cast<void*>(addr), len);
  } catch (const Failure&) {
    return;  // the range stays committed and counted
  }
  d.resident.fetch_sub(len, std::memory_order_relaxed);
}

// Commits slices [first, first+count) of a segment that are not committed yet (device mutex).
void commit_slices(DeviceState& d, Segment* seg, unsigned first, unsigned count) {
  unsigned i = first, end = first + count;
  while (i < end) {
    if (seg->committed_slices >> i & 1) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j < end && !(seg->committed_slices >> j & 1)) ++j;
    device_commit(d, seg->base + (uintptr_t(i) << kSliceShift), size_t(j - i) << kSliceShift);
    for (unsigned k = i; k < j; ++k) seg->committed_slices |= uint64_t(1) << k;
    i = j;
  }
}

// Reserves a new region for small segments (device mutex). Returns its index. fd devices
// get regions of at most 1/8 of their capacity so huge blocks still find device offsets.
size_t new_region(DeviceState& d) {
  size_t want = kRegionSegments;
  if (d.backing->caps().kind != CXLPOOL_BACKING_NUMA) {
    auto u = d.backing->usage();
    uint64_t left = (u.capacity_bytes - std::min(u.capacity_bytes, u.reserved_bytes)) / kSegmentSize;
    want = std::min<size_t>(want, std::max<uint64_t>(1, u.capacity_bytes / 8 / kSegmentSize));
    want = std::max<size_t>(1, std::min<size_t>(want, left));
  }
  void* base = d.backing->reserve(want * kSegmentSize, kSegmentSize);
  Region r;
  r.base = reinterpret_cast<uintptr_t>(base);
  r.segments = want;
  d.regions.push_back(r);
  return d.regions.size() - 1;
}

// A free segment slot in some region, reserving a new region if needed (device mutex).
uintptr_t take_segment(DeviceState& d, size_t& region_out) {
  for (size_t ri = 0; ri < d.regions.size(); ++ri) {
    Region& r = d.regions[ri];
    for (size_t s = 0; s < r.segments; ++s)
      if (!(r.used >> s & 1)) {
        r.used |= uint64_t(1) << s;
        region_out = ri;
        return r.base + s * kSegmentSize;
      }
  }
  size_t ri = new_region(d);
  d.regions[ri].used |= 1;
  region_out = ri;
  return d.regions[ri].base;
}

void give_back_segment(DeviceState& d, size_t ri, uintptr_t base) noexcept {
  Region& r = d.regions[ri];
  r.used &= ~(uint64_t(1) << ((base - r.base) / kSegmentSize));
  if (!r.used) {  // the whole region is free: return its address space and device range
    d.backing->release(reinterpret_cast<void*>(r.base));
    r.segments = 0;
  }
}

// What free() needs to find a block's pool, heap and device from the page map.
void init_header(SegmentHeader* h, Pool* pool, int di, SegKind kind) {
  h->pool = pool;
  h->pool_index = pool->index;
  h->pool_generation = pool->generation;
  h->device = uint8_t(di);
  h->kind = kind;
}

Segment* new_segment(Pool* pool, int di) {
  DeviceState& d = pool->dev[di];
  size_t ri = 0;
  uintptr_t base = take_segment(d, ri);
  Segment* seg;
  try {
    seg = segment_new();
  } catch (...) {
    give_back_segment(d, ri, base);
    throw;
  }
  init_header(seg, pool, di, SegKind::kSmall);
  seg->base = base;
  seg->region = ri;
  for (unsigned i = 0; i < kSlicesPerSegment; ++i) {
    seg->pages[i].segment = seg;
    seg->pages[i].remote_bits = seg->remote_bits[i];
  }
  pagemap_set(base, 1, seg);
  return seg;
}

void partial_add(DeviceState& d, Segment* s) {
  if (s->in_partial) return;
  s->prev_partial = nullptr;
  s->next_partial = d.partial;
  if (d.partial) d.partial->prev_partial = s;
  d.partial = s;
  s->in_partial = true;
}
void partial_remove(DeviceState& d, Segment* s) {
  if (!s->in_partial) return;
  if (s->prev_partial)
    s->prev_partial->next_partial = s->next_partial;
  else
    d.partial = s->next_partial;
  if (s->next_partial) s->next_partial->prev_partial = s->prev_partial;
  s->in_partial = false;
}

int find_run(uint64_t free_mask, unsigned k) {
  uint64_t m = free_mask;
  for (unsigned i = 1; i < k && m; ++i) m &= free_mask >> i;
  return m ? __builtin_ctzll(m) : -1;
}

// Carves a page of class `cls` from device `di` (device mutex taken here). nullptr when the
// device is full.
Page* new_page(Pool* pool, int di, unsigned cls) {
  DeviceState& d = pool->dev[di];
  const unsigned k = class_slices(cls);
  const size_t bsize = class_to_size(cls);
  std::lock_guard<std::mutex> lock(d.mu);
  Segment* seg = nullptr;
  int first = -1;
  try {
    // Free slices that are still committed first: no page faults, no commit.
    for (int pass = 0; pass < 2 && !seg; ++pass)
      for (Segment* s = d.partial; s; s = s->next_partial)
        if ((first = find_run(pass == 0 ? s->free_slices & s->committed_slices : s->free_slices, k)) >= 0) {
          seg = s;
          break;
        }
    if (!seg) {
      seg = new_segment(pool, di);
      partial_add(d, seg);
      first = 0;
    }
    // Commit what the first block needs (multi-slice pages grow their commit lazily).
    unsigned need = unsigned((bsize + kSliceSize - 1) >> kSliceShift);
    uint64_t reused = 0;
    for (unsigned i = 0; i < k; ++i) reused += seg->committed_slices >> (first + i) & 1;
    commit_slices(d, seg, unsigned(first), std::min(need, k));
    d.free_committed -= std::min<uint64_t>(d.free_committed, reused << kSliceShift);
    seg->purge_mark &= ~((k == 64 ? ~uint64_t(0) : ((uint64_t(1) << k) - 1)) << first);
  } catch (const Failure&) {
    return nullptr;
  }
  uint64_t mask = (k == 64 ? ~uint64_t(0) : ((uint64_t(1) << k) - 1)) << first;
  seg->free_slices &= ~mask;
  if (!seg->free_slices) partial_remove(d, seg);
  for (unsigned i = 0; i < k; ++i) seg->slice[first + i] = {uint8_t(first), uint8_t(cls)};
  d.active.fetch_add(uint64_t(k) << kSliceShift, std::memory_order_relaxed);

  Page* pg = &seg->pages[first];
  pg->start = seg->base + (uintptr_t(first) << kSliceShift);
  pg->block_size = uint32_t(bsize);
  pg->capacity = class_capacity(cls);
  pg->end = pg->start + uintptr_t(pg->capacity) * bsize;
  uintptr_t committed = pg->start;
  for (unsigned i = 0; i < k && (seg->committed_slices >> (first + i) & 1); ++i) committed += kSliceSize;
  pg->commit_end = committed;
  pg->reciprocal = class_reciprocal(cls);
  pg->words = (pg->capacity + 63) / 64;
  pg->free_bits = pg->words <= kInlineWords ? pg->inline_bits : seg->local_bits[first];
  pg->used = 0;
  pg->cursor = 0;
  pg->cls = uint8_t(cls);
  pg->device = uint8_t(di);
  pg->first_slice = uint8_t(first);
  pg->slices = uint8_t(k);
  for (uint32_t w = 0; w < pg->words; ++w) {
    uint32_t bits = std::min<uint32_t>(64, pg->capacity - w * 64);
    pg->free_bits[w] = bits == 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1);
    pg->remote_bits[w].store(0, std::memory_order_relaxed);
  }
  pg->remote_count.store(0, std::memory_order_relaxed);
  return pg;
}

// Decommits the free committed slices of a segment selected by mask (device mutex).
void decommit_slices(DeviceState& d, Segment* seg, uint64_t mask) noexcept {
  for (unsigned i = 0; i < kSlicesPerSegment;) {
    if (!(mask >> i & 1)) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j < kSlicesPerSegment && (mask >> j & 1)) ++j;
    device_decommit(d, seg->base + (uintptr_t(i) << kSliceShift), size_t(j - i) << kSliceShift);
    uint64_t run = (j - i == 64 ? ~uint64_t(0) : ((uint64_t(1) << (j - i)) - 1)) << i;
    seg->committed_slices &= ~run;
    seg->purge_mark &= ~run;
    d.free_committed -= std::min<uint64_t>(d.free_committed, uint64_t(j - i) << kSliceShift);
    i = j;
  }
}

// Purge pass (device mutex): slices that were free and committed at the previous pass and
// still are get decommitted; the rest are marked for the next pass.
void maybe_purge(DeviceState& d) noexcept {
  uint64_t now = os::coarse_now_ns();
  if (now - d.last_purge_ns < kPurgeDelayNs) return;
  d.last_purge_ns = now;
  for (Segment* s = d.partial; s; s = s->next_partial) {
    uint64_t idle = s->free_slices & s->committed_slices;
    decommit_slices(d, s, idle & s->purge_mark);
    s->purge_mark = s->free_slices & s->committed_slices;
  }
}

// Returns a page's slices to its segment (device mutex taken here).
void release_page(Pool* pool, Page* pg) {
  ErrnoGuard keep_errno;
  DeviceState& d = pool->dev[pg->device];
  Segment* seg = pg->segment;
  std::lock_guard<std::mutex> lock(d.mu);
  unsigned first = pg->first_slice, k = pg->slices;
  uint64_t mask = (k == 64 ? ~uint64_t(0) : ((uint64_t(1) << k) - 1)) << first;
  seg->free_slices |= mask;
  partial_add(d, seg);
  d.active.fetch_sub(uint64_t(k) << kSliceShift, std::memory_order_relaxed);
  d.free_committed += uint64_t(__builtin_popcountll(seg->committed_slices & mask)) << kSliceShift;
  if (d.free_committed > kMaxFreeCommitted) decommit_slices(d, seg, seg->committed_slices & mask);
  maybe_purge(d);
  pg->state.store(kUnused, std::memory_order_relaxed);
  pg->end = 0;
  pg->owner.store(nullptr, std::memory_order_relaxed);
}

// Folds remote frees into the local bitmap (owner or adopter under the device mutex).
void collect_remote(Page* pg) {
  if (pg->remote_count.load(std::memory_order_acquire) <= 0) return;
  int32_t freed = 0;
  for (uint32_t w = 0; w < pg->words; ++w) {
    if (!pg->remote_bits[w].load(std::memory_order_relaxed)) continue;
    uint64_t x = pg->remote_bits[w].exchange(0, std::memory_order_acq_rel);
    pg->free_bits[w] |= x;
    freed += __builtin_popcountll(x);
  }
  pg->used -= uint32_t(freed);
  pg->remote_count.fetch_sub(freed, std::memory_order_acq_rel);
}

// True when the page has a free block; leaves the cursor on its bitmap word. Frees do not move
// the cursor back (one store less on the free path): words below it are found when the scan
// wraps around, after remote frees have been folded in.
bool page_has_free(Page* pg) {
  for (uint32_t w = pg->cursor; w < pg->words; ++w)
    if (pg->free_bits[w]) {
      pg->cursor = w;
      return true;
    }
  collect_remote(pg);
  for (uint32_t w = 0; w < pg->words; ++w)
    if (pg->free_bits[w]) {
      pg->cursor = w;
      return true;
    }
  pg->cursor = pg->words;
  return false;
}

// Extends a multi-slice page's committed range to cover [.., upto) (device mutex).
bool extend_commit(Pool* pool, Page* pg, uintptr_t upto) {
  DeviceState& d = pool->dev[pg->device];
  std::lock_guard<std::mutex> lock(d.mu);
  Segment* seg = pg->segment;
  unsigned from = unsigned((pg->commit_end - seg->base) >> kSliceShift);
  unsigned to = unsigned((upto - seg->base + kSliceSize - 1) >> kSliceShift);
  try {
    commit_slices(d, seg, from, to - from);
  } catch (const Failure&) {
    return false;
  }
  pg->commit_end = seg->base + (uintptr_t(to) << kSliceShift);
  return true;
}

// ---- Heaps --------------------------------------------------------------------------------
void abandon_heap(Heap* h) noexcept;

void thread_exit(void*) {
  ThreadState* ts = tls_state;
  if (!ts) return;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    for (int i = 0; i < kMaxPools; ++i) {
      TlsEntry& e = ts->heaps[i];
      if (e.heap && g_registry[i].pool && g_registry[i].generation == e.generation) abandon_heap(e.heap);
    }
  }
  tls_state = nullptr;
  meta_delete(ts);
}

Heap* heap_slow(Pool* pool) noexcept {
  std::call_once(g_exit_key_once, [] { pthread_key_create(&g_exit_key, thread_exit); });
  Heap* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool->heaps_mu);
    for (Heap* x = pool->heaps; x; x = x->next_in_pool)
      if (!x->live) {
        h = x;
        break;
      }
    if (!h) {
      try {
        h = meta_new<Heap>();
      } catch (...) {
        return nullptr;
      }
      h->pool = pool;
      h->next_in_pool = pool->heaps;
      pool->heaps = h;
    }
    h->live = true;
    std::memset(h->page_device, -1, sizeof h->page_device);
  }
  if (!tls_state) {
    try {
      tls_state = meta_new<ThreadState>();
    } catch (...) {
      std::lock_guard<std::mutex> lock(pool->heaps_mu);
      h->live = false;
      return nullptr;
    }
  }
  tls_state->heaps[pool->index] = {h, pool->generation};
  pthread_setspecific(g_exit_key, reinterpret_cast<void*>(1));
  return h;
}

inline Heap* heap_of(Pool* pool) noexcept {
  Heap* h = tls_heap(pool);
  return h ? h : heap_slow(pool);
}

void abandon_heap(Heap* h) noexcept {
  Pool* pool = h->pool;
  for (int di = 0; di < pool->ndev; ++di) {
    DeviceState& d = pool->dev[di];
    std::lock_guard<std::mutex> lock(d.mu);
    for (unsigned c = 0; c < kNumClasses; ++c) {
      for (Page** list : {&h->head[di][c], &h->full[di][c]}) {
        while (Page* pg = *list) {
          *list = pg->next;
          pg->owner.store(nullptr, std::memory_order_release);
          pg->state.store(kAbandoned, std::memory_order_relaxed);
          stack_push(d.abandoned[c], pg);
        }
      }
      h->tail[di][c] = nullptr;
      h->full_dirty[di][c].store(0, std::memory_order_relaxed);
    }
  }
  std::lock_guard<std::mutex> lock(pool->heaps_mu);
  h->live = false;
}

// Adopts an abandoned page of (di, cls) with free blocks; retires empty ones.
Page* adopt(Heap* h, int di, unsigned cls) {
  Pool* pool = h->pool;
  DeviceState& d = pool->dev[di];
  Page* found = nullptr;
  std::vector<Page*> empty;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Page* pg = d.abandoned[cls];
    for (int scanned = 0; pg && scanned < kAdoptScan && !found; ++scanned) {
      Page* next = pg->next;
      collect_remote(pg);
      if (pg->used == 0) {
        stack_remove(d.abandoned[cls], pg);
        empty.push_back(pg);
      } else {
        pg->cursor = 0;
        if (page_has_free(pg)) {
          stack_remove(d.abandoned[cls], pg);
          found = pg;
        }
      }
      pg = next;
    }
  }
  for (Page* e : empty) release_page(pool, e);
  if (found) {
    found->owner.store(h, std::memory_order_release);
    found->state.store(kActive, std::memory_order_relaxed);
    list_push_back(h->head[di][cls], h->tail[di][cls], found);
  }
  return found;
}

// Makes (di, cls)'s head page one with a free block at its cursor; nullptr if the device is full.
Page* refill(Heap* h, int di, unsigned cls) {
  Page*& head = h->head[di][cls];
  Page*& tail = h->tail[di][cls];
  while (Page* pg = head) {
    if (page_has_free(pg)) return pg;
    list_remove(head, tail, pg);
    pg->state.store(kFull, std::memory_order_relaxed);
    stack_push(h->full[di][cls], pg);
  }
  if (h->full_dirty[di][cls].load(std::memory_order_relaxed) &&
      h->full_dirty[di][cls].exchange(0, std::memory_order_acquire)) {
    Page* pg = h->full[di][cls];
    while (pg) {
      Page* next = pg->next;
      if (pg->remote_count.load(std::memory_order_acquire) > 0) {
        collect_remote(pg);
        stack_remove(h->full[di][cls], pg);
        pg->state.store(kActive, std::memory_order_relaxed);
        list_push_back(head, tail, pg);
      }
      pg = next;
    }
    while (Page* p2 = head) {
      if (page_has_free(p2)) return p2;
      list_remove(head, tail, p2);
      p2->state.store(kFull, std::memory_order_relaxed);
      stack_push(h->full[di][cls], p2);
    }
  }
  if (Page* pg = adopt(h, di, cls)) return pg;
  Page* pg = new_page(h->pool, di, cls);
  if (!pg) return nullptr;
  pg->owner.store(h, std::memory_order_release);
  pg->state.store(kActive, std::memory_order_relaxed);
  list_push_back(head, tail, pg);
  return pg;
}

// ---- Huge allocations ---------------------------------------------------------------------
void huge_release_span(DeviceState& d, HugeSpan* span) noexcept {
  pagemap_set(span->base, span->segments, nullptr);
  d.resident.fetch_sub(span->committed, std::memory_order_relaxed);
  try {
    d.backing->release(reinterpret_cast<void*>(span->base));  // decommits as well
  } catch (const Failure&) {
  }
  meta_delete(span);
}

void* huge_alloc(Pool* pool, int di, size_t size, size_t alignment) {
  DeviceState& d = pool->dev[di];
  size_t extra = alignment > kSegmentSize ? alignment - kSegmentSize : 0;
  if (size > (size_t(1) << 46) || extra > (size_t(1) << 46)) return nullptr;
  size_t bytes = size + extra;
  size_t n = (bytes + kSegmentSize - 1) / kSegmentSize;
  size_t device_bytes = (bytes + kSliceSize - 1) & ~(kSliceSize - 1);
  std::lock_guard<std::mutex> lock(d.mu);
  HugeSpan* span = nullptr;
  for (HugeSpan* c = d.huge_cache; c; c = c->next)
    if (c->segments == n && c->block >= device_bytes) {
      span = c;
      stack_remove(d.huge_cache, c);
      --d.huge_cache_count;
      d.huge_cache_bytes -= span->committed;
      break;
    }
  try {
    if (!span) {
      void* base = d.backing->reserve(device_bytes, kSegmentSize, n * kSegmentSize);
      try {
        span = meta_new<HugeSpan>();
      } catch (...) {
        d.backing->release(base);
        throw;
      }
      init_header(span, pool, di, SegKind::kHuge);
      span->base = reinterpret_cast<uintptr_t>(base);
      span->segments = n;
      span->block = device_bytes;
      pagemap_set(span->base, n, span);
    }
    if (span->committed < device_bytes) {
      device_commit(d, span->base + span->committed, size_t(device_bytes - span->committed));
      span->committed = device_bytes;
    }
  } catch (const Failure&) {
    if (span) {  // consistent: keep it cached for a later request
      span->cached = true;
      stack_push(d.huge_cache, span);
      ++d.huge_cache_count;
      d.huge_cache_bytes += span->committed;
    }
    return nullptr;
  }
  span->cached = false;
  stack_push(d.huge_live, span);
  d.active.fetch_add(span->block, std::memory_order_relaxed);
  d.huge_live_bytes.fetch_add(span->block, std::memory_order_relaxed);
  uintptr_t p = span->base;
  if (alignment > kSegmentSize) p = (p + alignment - 1) & ~uintptr_t(alignment - 1);
  return reinterpret_cast<void*>(p);
}

void huge_free(HugeSpan* span) noexcept {
  ErrnoGuard keep_errno;
  Pool* pool = span->pool;
  DeviceState& d = pool->dev[span->device];
  std::lock_guard<std::mutex> lock(d.mu);
  if (span->cached) return;  // double free of a huge block: ignore
  stack_remove(d.huge_live, span);
  d.active.fetch_sub(span->block, std::memory_order_relaxed);
  d.huge_live_bytes.fetch_sub(span->block, std::memory_order_relaxed);
  if (d.huge_cache_count < kHugeCacheEntries && d.huge_cache_bytes + span->committed <= kHugeCacheBytes) {
    span->cached = true;
    stack_push(d.huge_cache, span);
    ++d.huge_cache_count;
    d.huge_cache_bytes += span->committed;
    return;
  }
  huge_release_span(d, span);
}

// ---- Placement ----------------------------------------------------------------------------
int next_interleave(Pool* pool) noexcept {
  uint64_t n = pool->interleave_counter.fetch_add(1, std::memory_order_relaxed);
  return pool->interleave_sequence[n % pool->interleave_sequence.size()];
}

int next_ratio(Pool* pool, const Rule& r) noexcept {
  int best = r.devices[0];
  double best_share = -1;
  for (size_t i = 0; i < r.devices.size(); ++i) {
    double share = double(pool->dev[r.devices[i]].active.load(std::memory_order_relaxed)) / r.weights[i];
    if (best_share < 0 || share < best_share) {
      best_share = share;
      best = r.devices[i];
    }
  }
  return best;
}

// The rule that decides an allocation, and its first-choice device. per_page: the device was
// chosen for the heap's current page of this class (ratio/interleave).
const Rule* choose(Pool* pool, Heap* h, size_t size, uint32_t hint, unsigned cls, bool huge, int& device) noexcept {
  for (const Rule& r : pool->policy.rules) {
    switch (r.kind) {
      case RuleKind::kBind:
      case RuleKind::kPreferred:
        device = r.devices[0];
        return &r;
      case RuleKind::kSpill: {
        const DeviceState& near = pool->dev[r.devices[0]];
        bool over = near.resident.load(std::memory_order_relaxed) * 100 >= uint64_t(r.watermark_pct) * near.capacity;
        device = r.devices[over ? 1 : 0];
        return &r;
      }
      case RuleKind::kThreshold:
        if (size >= r.min_size) {
          device = r.devices[0];
          return &r;
        }
        break;
      case RuleKind::kHint:
        for (int b = 0; b < 4; ++b)
          if ((hint >> b & 1) && r.hint_device[b] >= 0) {
            device = r.hint_device[b];
            return &r;
          }
        break;
      case RuleKind::kRatio:
      case RuleKind::kInterleave:
        if (huge || !h)
          device = r.kind == RuleKind::kRatio ? next_ratio(pool, r) : next_interleave(pool);
        else {
          if (h->page_device[cls] < 0)
            h->page_device[cls] = int16_t(r.kind == RuleKind::kRatio ? next_ratio(pool, r) : next_interleave(pool));
          device = h->page_device[cls];
        }
        return &r;
    }
  }
  device = 0;
  return nullptr;
}

inline void* alloc_block(Heap* h, int di, unsigned cls) noexcept {
  Page* pg = h->head[di][cls];
  if (__builtin_expect(pg != nullptr, 1)) {
    uint32_t c = pg->cursor;
    if (__builtin_expect(c < pg->words, 1)) {
      uint64_t w = pg->free_bits[c];
      if (__builtin_expect(w != 0, 1)) {
        unsigned bit = unsigned(__builtin_ctzll(w));
        uintptr_t p = pg->start + ((uintptr_t(c) << 6) + bit) * pg->block_size;
        if (__builtin_expect(p + pg->block_size <= pg->commit_end, 1)) {
          pg->free_bits[c] = w & (w - 1);
          ++pg->used;
          return reinterpret_cast<void*>(p);
        }
      }
    }
  }
  return nullptr;
}

// Slow path of a small allocation on device di: refill, lazy commit.
void* alloc_block_slow(Heap* h, int di, unsigned cls) noexcept {
  for (;;) {
    Page* pg = refill(h, di, cls);
    if (!pg) return nullptr;
    uint32_t c = pg->cursor;
    uint64_t w = pg->free_bits[c];
    unsigned bit = unsigned(__builtin_ctzll(w));
    uintptr_t p = pg->start + ((uintptr_t(c) << 6) + bit) * pg->block_size;
    if (p + pg->block_size > pg->commit_end && !extend_commit(h->pool, pg, p + pg->block_size)) return nullptr;
    pg->free_bits[c] = w & (w - 1);
    ++pg->used;
    return reinterpret_cast<void*>(p);
  }
}

void* alloc_on(Pool* pool, Heap* h, int di, size_t size, size_t alignment, unsigned cls, bool huge) noexcept {
  if (huge) {
    try {
      return huge_alloc(pool, di, size, alignment);
    } catch (...) {
      return nullptr;
    }
  }
  void* p = alloc_block(h, di, cls);
  if (!p) {
    try {
      p = alloc_block_slow(h, di, cls);
    } catch (...) {
      p = nullptr;
    }
  }
  return p;
}

void* allocate(Pool* pool, size_t size, size_t alignment, uint32_t hint, int forced) noexcept {
  // Alignments up to 16 come free; larger ones up to a slice are served from a bigger block
  // and an interior pointer; beyond that, from a huge span.
  size_t request = size;
  if (alignment > 16 && alignment <= kSliceSize) {
    if (__builtin_add_overflow(size, alignment - 1, &request)) {
      errno = ENOMEM;
      return nullptr;
    }
  }
  bool huge = request > kMaxClassSize || alignment > kSliceSize;
  unsigned cls = huge ? 0 : size_to_class(request);
  Heap* h = heap_of(pool);
  if (!h) {
    errno = ENOMEM;
    return nullptr;
  }
  int di;
  const Rule* rule = nullptr;
  if (forced >= 0)
    di = forced;
  else if (pool->fixed_device >= 0)
    di = pool->fixed_device;
  else
    rule = choose(pool, h, size, hint, cls, huge, di);

  void* p = alloc_on(pool, h, di, request, alignment, cls, huge);
  int used = di;
  if (!p && rule) {
    for (int fb : rule->fallback) {
      if (fb == di) continue;
      p = alloc_on(pool, h, fb, request, alignment, cls, huge);
      if (p) {
        used = fb;
        h->counters[fb].fallbacks.add(1);
        if (rule->kind == RuleKind::kRatio || rule->kind == RuleKind::kInterleave) {
          if (!huge) h->page_device[cls] = int16_t(fb);
        }
        break;
      }
    }
  }
  if (!p) {
    h->counters[di].failures.add(1);
    errno = ENOMEM;
    return nullptr;
  }
  if (!huge && rule && (rule->kind == RuleKind::kRatio || rule->kind == RuleKind::kInterleave)) {
    // Per-page policies move on to the next device when the current page fills up.
    Page* head = h->head[used][cls];
    if (!head || head->cursor >= head->words || (head->free_bits[head->cursor] == 0 && !page_has_free(head)))
      h->page_device[cls] = -1;
  }
  HeapCounters& ctr = h->counters[used];
  if (huge)
    ctr.huge_allocs.add(1);
  else
    ctr.allocs[cls].add(1);
  if (alignment > 16 && alignment <= kSliceSize)
    p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + alignment - 1) & ~uintptr_t(alignment - 1));
  return p;
}

inline Page* page_of(Segment* seg, uintptr_t a) noexcept {
  return &seg->pages[seg->slice[(a - seg->base) >> kSliceShift].slot];
}

// Reciprocals of the class sizes (see size_class.hpp), for index computations off the page.
constexpr auto kReciprocals = [] {
  std::array<uint64_t, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = class_reciprocal(c);
  return r;
}();
constexpr auto kClassSizes = [] {
  std::array<uint32_t, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = uint32_t(class_to_size(c));
  return r;
}();
constexpr auto kInlineBitmap = [] {
  std::array<bool, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = (class_capacity(c) + 63) / 64 <= kInlineWords;
  return r;
}();

inline uint32_t block_index(const Page* pg, uintptr_t a) noexcept {
  return uint32_t(((a - pg->start) * pg->reciprocal) >> kReciprocalShift);
}

void retire_if_empty(Heap* h, Page* pg) {
  if (pg->used != 0 || h->head[pg->device][pg->cls] == pg) return;
  if (pg->state.load(std::memory_order_relaxed) == kFull)
    stack_remove(h->full[pg->device][pg->cls], pg);
  else
    list_remove(h->head[pg->device][pg->cls], h->tail[pg->device][pg->cls], pg);
  release_page(h->pool, pg);
}

// After a local free: a full page becomes allocatable again, an empty one may be retired.
[[gnu::noinline]] void local_free_followup(Heap* me, Page* pg) noexcept {
  if (pg->state.load(std::memory_order_relaxed) == kFull) {
    stack_remove(me->full[pg->device][pg->cls], pg);
    pg->state.store(kActive, std::memory_order_relaxed);
    list_push_back(me->head[pg->device][pg->cls], me->tail[pg->device][pg->cls], pg);
  }
  if (pg->used == 0) {
    try {
      retire_if_empty(me, pg);
    } catch (...) {
    }
  }
}

// A free by a thread that does not own the page (or a page without owner).
[[gnu::noinline]] void remote_free(Segment* seg, Page* pg, Heap* me, uint32_t w, uint64_t bit) noexcept {
  // Read the page's fields before publishing the free: once the bit is visible the owner may
  // collect it, find the page empty and recycle it for another class.
  const uint8_t device = pg->device, cls = pg->cls;
  uint64_t old = pg->remote_bits[w].fetch_or(bit, std::memory_order_acq_rel);
  if (old & bit) return;  // double free: ignored
  pg->remote_count.fetch_add(1, std::memory_order_release);
  if (me)
    me->counters[device].frees[cls].add(1);
  else
    seg->pool->dev[device].orphan_frees[cls].fetch_add(1, std::memory_order_relaxed);
  // Tell the owner that a page it may hold as full has free blocks again. If the page was
  // recycled meanwhile this only causes a harmless rescan.
  if (Heap* owner = pg->owner.load(std::memory_order_acquire))
    owner->full_dirty[device][cls].store(1, std::memory_order_release);
}

// The free fast path: kept small so it inlines into cxlpool_free and many frees fit the
// out-of-order window at once (their cache misses overlap).
inline void free_small(Segment* seg, void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p);
  // The slot, class and block index come from the segment header, so the bitmap word and the
  // page descriptor are two independent loads (their cache misses overlap).
  const Segment::SliceInfo si = seg->slice[(a - seg->base) >> kSliceShift];
  const uintptr_t start = seg->base + (uintptr_t(si.slot) << kSliceShift);
  const uint32_t idx = uint32_t(((a - start) * kReciprocals[si.cls]) >> kReciprocalShift);
  const uint32_t w = idx >> 6;
  const uint64_t bit = uint64_t(1) << (idx & 63);
  Page* pg = &seg->pages[si.slot];
  uint64_t* word = kInlineBitmap[si.cls] ? &pg->inline_bits[w] : &seg->local_bits[si.slot][w];
  Heap* me = tls_heap(static_cast<const SegmentHeader*>(seg));
  if (__builtin_expect(a >= pg->end, 0)) return;  // not a block (end is 0 for unused slots)
  if (__builtin_expect(pg->owner.load(std::memory_order_relaxed) != me || !me, 0)) {
    remote_free(seg, pg, me, w, bit);
    return;
  }
  uint64_t old = *word;
  if (__builtin_expect(old & bit, 0)) return;  // double free: ignored
  *word = old | bit;
  // Counter addresses come from the segment header and the class table, never from the page
  // descriptor: otherwise every free's counter update would wait for that free's page miss,
  // and the next free for it (store forwarding), serializing the misses.
  me->counters[seg->device].frees[si.cls].add(1);
  if (__builtin_expect(--pg->used == 0 || pg->state.load(std::memory_order_relaxed) == kFull, 0))
    local_free_followup(me, pg);
}

[[gnu::noinline]] void free_huge(HugeSpan* span) noexcept {
  Pool* pool = span->pool;
  if (Heap* me = tls_heap(pool))
    me->counters[span->device].huge_frees.add(1);
  else
    pool->dev[span->device].orphan_huge_frees.fetch_add(1, std::memory_order_relaxed);
  huge_free(span);
}

}  // namespace

// ---- Public internal API ---------------------------------------------------------------------
Pool* pool_create(const Topology& topo, const PoolOptions& options) {
  std::call_once(g_pagemap_once, [] {
    void* map = os::map_metadata(kPagemapEntries * sizeof(std::atomic<SegmentHeader*>), true);
    g_pagemap.store(static_cast<std::atomic<SegmentHeader*>*>(map), std::memory_order_release);
  });
  std::vector<size_t> targets = options.targets;
  if (targets.empty()) {
    for (size_t i = 0; i < topo.targets.size(); ++i) targets.push_back(i);
    std::stable_sort(targets.begin(), targets.end(),
                     [&](size_t a, size_t b) { return topo.targets[a].tier.value < topo.targets[b].tier.value; });
  }
  if (targets.size() > size_t(kMaxDevices)) {
    // Every target of a large machine: keep the fastest kMaxDevices.
    if (!options.targets.empty())
      fail(CXLPOOL_E_INVALID_ARGUMENT, "pool: " + std::to_string(targets.size()) + " devices given; at most " +
                                           std::to_string(kMaxDevices) + " per pool");
    targets.resize(kMaxDevices);
  }
  auto pool = std::make_unique<Pool>();
  pool->name = options.name.empty() ? "pool" : options.name;
  PolicyDevices pd;
  for (size_t t : targets) {
    if (t >= topo.targets.size())
      fail(CXLPOOL_E_NOT_FOUND, "pool: target index " + std::to_string(t) + " out of range");
    for (int j = 0; j < pool->ndev; ++j)
      if (pool->dev[j].target == t)
        fail(CXLPOOL_E_INVALID_ARGUMENT, "pool: device '" + topo.targets[t].name + "' listed twice");
    const Target& tg = topo.targets[t];
    DeviceState& d = pool->dev[pool->ndev++];
    d.name = tg.name;
    d.target = t;
    d.tier = tg.tier.value;
    d.read_bandwidth = tg.read_bandwidth_mbps.known() ? tg.read_bandwidth_mbps.value : 0;
    pd.names.push_back(tg.name);
    pd.tiers.push_back(d.tier);
    pd.read_bandwidth_mbps.push_back(d.read_bandwidth);
  }
  pool->policy = parse_policy(options.policy, pd, "policy");
  for (int i = 0; i < pool->ndev; ++i) {
    DeviceState& d = pool->dev[i];
    d.backing = Backing::open(topo.targets[d.target].backing);
    d.capacity = d.backing->caps().capacity_bytes;
    if (d.backing->caps().page_size > kSliceSize)
      fail(CXLPOOL_E_NOT_SUPPORTED, "pool: device '" + d.name + "' has " + std::to_string(d.backing->caps().page_size) +
                                        "-byte pages; the allocator needs pages of at most 64 KiB");
  }
  const auto& rules = pool->policy.rules;
  if (rules.size() == 1 && rules[0].kind == RuleKind::kBind) pool->fixed_device = rules[0].devices[0];
  for (const Rule& r : rules)
    if (r.kind == RuleKind::kInterleave) {
      // Smooth weighted round robin over one period (sum of weights).
      uint32_t total = 0;
      for (uint32_t w : r.weights) total += w;
      std::vector<int64_t> current(r.devices.size(), 0);
      for (uint32_t step = 0; step < total; ++step) {
        size_t best = 0;
        for (size_t i = 0; i < r.devices.size(); ++i) {
          current[i] += r.weights[i];
          if (current[i] > current[best]) best = i;
        }
        current[best] -= total;
        pool->interleave_sequence.push_back(uint8_t(r.devices[best]));
      }
    }

  std::lock_guard<std::mutex> lock(g_registry_mu);
  int slot = -1;
  for (int i = 0; i < kMaxPools; ++i)
    if (!g_registry[i].pool) {
      slot = i;
      break;
    }
  if (slot < 0) fail(CXLPOOL_E_NO_MEMORY, "pool: " + std::to_string(kMaxPools) + " pools exist already");
  pool->index = uint32_t(slot);
  pool->generation = ++g_generation;
  g_registry[slot] = {pool.get(), pool->generation};
  return pool.release();
}

void pool_destroy(Pool* pool) noexcept {
  if (!pool) return;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_registry[pool->index] = {};
  }
  for (int di = 0; di < pool->ndev; ++di) {
    DeviceState& d = pool->dev[di];
    std::lock_guard<std::mutex> lock(d.mu);
    for (HugeSpan** list : {&d.huge_live, &d.huge_cache})
      while (HugeSpan* span = *list) {
        stack_remove(*list, span);
        huge_release_span(d, span);
      }
    for (Region& r : d.regions) {
      if (!r.segments) continue;
      for (size_t s = 0; s < r.segments; ++s) {
        SegmentHeader* hdr = lookup(reinterpret_cast<void*>(r.base + s * kSegmentSize));
        if (!hdr) continue;
        pagemap_set(r.base + s * kSegmentSize, 1, nullptr);
        segment_delete(static_cast<Segment*>(hdr));
      }
      d.backing->release(reinterpret_cast<void*>(r.base));
    }
    d.regions.clear();
  }
  Heap* h = pool->heaps;
  while (h) {
    Heap* next = h->next_in_pool;
    meta_delete(h);
    h = next;
  }
  for (int di = 0; di < pool->ndev; ++di) pool->dev[di].backing.reset();
  delete pool;
}

namespace {
[[gnu::noinline]] void* pool_malloc_slow(Pool* pool, size_t size, uint32_t hint, int device) noexcept {
  if (size > (size_t(1) << 46)) {
    errno = ENOMEM;
    return nullptr;
  }
  return allocate(pool, size, 0, hint, device);
}
}  // namespace

void* pool_malloc(Pool* pool, size_t size, uint32_t hint, int device) noexcept {
  // Fast path: one bind rule, a class size, the thread's heap ready, a page with a free block.
  if (__builtin_expect(device < 0 && pool->fixed_device >= 0 && size <= kMaxClassSize, 1)) {
    if (Heap* h = tls_heap(pool)) {
      unsigned cls = size_to_class(size);
      if (void* p = alloc_block(h, pool->fixed_device, cls)) {
        h->counters[pool->fixed_device].allocs[cls].add(1);
        return p;
      }
    }
  }
  return pool_malloc_slow(pool, size, hint, device);
}

void* pool_aligned(Pool* pool, size_t alignment, size_t size, uint32_t hint, int device) noexcept {
  if (alignment == 0 || (alignment & (alignment - 1))) {
    errno = EINVAL;
    return nullptr;
  }
  if (size > (size_t(1) << 46) || alignment > (size_t(1) << 40)) {
    errno = ENOMEM;
    return nullptr;
  }
  return allocate(pool, size, alignment, hint, device);
}

bool owns(const void* p) noexcept { return lookup(p) != nullptr; }

size_t usable_size(const void* p) noexcept {
  SegmentHeader* hdr = lookup(p);
  if (!hdr) return 0;
  auto a = reinterpret_cast<uintptr_t>(p);
  if (hdr->kind == SegKind::kHuge) {
    auto* span = static_cast<HugeSpan*>(hdr);
    return span->base + span->block - a;
  }
  auto* seg = static_cast<Segment*>(hdr);
  Page* pg = page_of(seg, a);
  if (pg->state.load(std::memory_order_relaxed) == kUnused || a < pg->start || a >= pg->end) return 0;
  uintptr_t block_start = pg->start + uintptr_t(block_index(pg, a)) * pg->block_size;
  return block_start + pg->block_size - a;
}

bool free_any(void* p) noexcept {
  SegmentHeader* hdr = lookup(p);
  if (!hdr) return false;
  if (__builtin_expect(hdr->kind == SegKind::kHuge, 0))
    free_huge(static_cast<HugeSpan*>(hdr));
  else
    free_small(static_cast<Segment*>(hdr), p);
  return true;
}

void* pool_realloc(Pool* pool, void* p, size_t size) noexcept {
  if (!p) return pool_malloc(pool, size);
  size_t usable = usable_size(p);
  if (usable == 0) {
    errno = EINVAL;
    return nullptr;
  }
  // Stay in place when the block fits and is not more than twice too big.
  if (size <= usable && (size >= usable / 2 || usable <= 16)) return p;
  SegmentHeader* hdr = lookup(p);
  void* q = pool_malloc(hdr->pool, size);
  if (!q) return nullptr;
  std::memcpy(q, p, std::min(size, usable));
  free_any(p);
  return q;
}

bool ptr_info(const void* p, PtrInfo* out) noexcept {
  SegmentHeader* hdr = lookup(p);
  if (!hdr) return false;
  PtrInfo info;
  info.pool = hdr->pool;
  info.device = hdr->device;
  info.target = hdr->pool->dev[hdr->device].target;
  info.tier = hdr->pool->dev[hdr->device].tier;
  info.huge = hdr->kind == SegKind::kHuge;
  info.usable = usable_size(p);
  if (info.huge)
    info.block_size = static_cast<HugeSpan*>(hdr)->block;
  else {
    Page* pg = page_of(static_cast<Segment*>(hdr), reinterpret_cast<uintptr_t>(p));
    if (pg->state.load(std::memory_order_relaxed) == kUnused) return false;
    info.block_size = pg->block_size;
  }
  *out = info;
  return true;
}

uint64_t pool_trim(Pool* pool) noexcept {
  uint64_t released = 0;
  for (int di = 0; di < pool->ndev; ++di) {
    DeviceState& d = pool->dev[di];
    // Abandoned pages that remote frees emptied go back to their segments first.
    std::vector<Page*> empty;
    try {
      std::lock_guard<std::mutex> lock(d.mu);
      for (unsigned c = 0; c < kNumClasses; ++c)
        for (Page* pg = d.abandoned[c]; pg;) {
          Page* next = pg->next;
          collect_remote(pg);
          if (pg->used == 0) {
            stack_remove(d.abandoned[c], pg);
            empty.push_back(pg);
          }
          pg = next;
        }
    } catch (const std::bad_alloc&) {
      // Out of host memory for the list: release what was collected so far.
    }
    for (Page* pg : empty) release_page(pool, pg);
    std::lock_guard<std::mutex> lock(d.mu);
    while (HugeSpan* span = d.huge_cache) {
      stack_remove(d.huge_cache, span);
      released += span->committed;
      huge_release_span(d, span);
    }
    d.huge_cache_count = 0;
    d.huge_cache_bytes = 0;
    for (Segment* s = d.partial; s;) {
      Segment* next = s->next_partial;
      uint64_t idle = s->free_slices & s->committed_slices;
      released += uint64_t(__builtin_popcountll(idle)) << kSliceShift;
      decommit_slices(d, s, idle);
      if (s->free_slices == ~uint64_t(0)) {  // an empty segment goes back to its region
        partial_remove(d, s);
        pagemap_set(s->base, 1, nullptr);
        give_back_segment(d, s->region, s->base);
        segment_delete(s);
      }
      s = next;
    }
    d.free_committed = 0;
  }
  return released;
}

void fork_prepare() noexcept {
  g_registry_mu.lock();
  for (auto& e : g_registry) {
    if (!e.pool) continue;
    e.pool->heaps_mu.lock();
    for (int di = 0; di < e.pool->ndev; ++di) {
      e.pool->dev[di].mu.lock();
      e.pool->dev[di].backing->lock_for_fork();
    }
  }
  g_segment_arena.lock();
}

static void fork_release() noexcept {
  g_segment_arena.unlock();
  for (auto& e : g_registry) {
    if (!e.pool) continue;
    for (int di = e.pool->ndev - 1; di >= 0; --di) {
      e.pool->dev[di].backing->unlock_after_fork();
      e.pool->dev[di].mu.unlock();
    }
    e.pool->heaps_mu.unlock();
  }
  g_registry_mu.unlock();
}

void fork_parent() noexcept { fork_release(); }
void fork_child() noexcept { fork_release(); }

Pool* pool_create_from_environment(const Topology& topo, const std::string& name) {
  PoolOptions o;
  o.name = name;
  if (const char* policy = option_value(Option::kPolicy)) o.policy = policy;
  try {
    return pool_create(topo, o);
  } catch (const Failure& f) {
    // Policy errors carry the parser's "policy:" origin; say which variable held the text.
    if (f.status() == CXLPOOL_E_CONFIG && std::string(f.what()).rfind("policy:", 0) == 0)
      fail(CXLPOOL_E_CONFIG, std::string("CXLPOOL_POLICY: ") + f.what());
    throw;
  }
}

int pool_device_count(const Pool* pool) noexcept { return pool->ndev; }
const std::string& pool_device_name(const Pool* pool, int device) noexcept { return pool->dev[device].name; }
size_t pool_device_target(const Pool* pool, int device) noexcept { return pool->dev[device].target; }
int pool_device_tier(const Pool* pool, int device) noexcept { return pool->dev[device].tier; }
int pool_find_device(const Pool* pool, const std::string& name) noexcept {
  for (int i = 0; i < pool->ndev; ++i)
    if (pool->dev[i].name == name) return i;
  return -1;
}
const std::string& pool_policy_text(const Pool* pool) noexcept { return pool->policy.text; }
const std::string& pool_name(const Pool* pool) noexcept { return pool->name; }

DeviceStats pool_device_stats(const Pool* pool, int di) noexcept {
  DeviceStats s;
  const DeviceState& d = pool->dev[di];
  uint64_t alloc_bytes = 0, free_bytes = 0;
  auto count = [&](const Counter* allocs, const Counter* frees) {
    for (unsigned c = 0; c < kNumClasses; ++c) {
      uint64_t a = allocs ? allocs[c].get() : 0, f = frees[c].get();
      s.allocations += a;
      s.frees += f;
      alloc_bytes += a * kClassSizes[c];
      free_bytes += f * kClassSizes[c];
    }
  };
  {
    std::lock_guard<std::mutex> lock(const_cast<Pool*>(pool)->heaps_mu);
    for (Heap* h = pool->heaps; h; h = h->next_in_pool) {
      const HeapCounters& c = h->counters[di];
      count(c.allocs, c.frees);
      s.allocations += c.huge_allocs.get();
      s.frees += c.huge_frees.get();
      s.fallbacks += c.fallbacks.get();
      s.failures += c.failures.get();
    }
  }
  for (unsigned c = 0; c < kNumClasses; ++c) {
    uint64_t f = d.orphan_frees[c].load(std::memory_order_relaxed);
    s.frees += f;
    free_bytes += f * kClassSizes[c];
  }
  s.frees += d.orphan_huge_frees.load(std::memory_order_relaxed);
  s.allocated_bytes =
      (alloc_bytes > free_bytes ? alloc_bytes - free_bytes : 0) + d.huge_live_bytes.load(std::memory_order_relaxed);
  s.active_bytes = d.active.load(std::memory_order_relaxed);
  s.resident_bytes = d.resident.load(std::memory_order_relaxed);
  s.peak_resident_bytes = d.peak_resident.load(std::memory_order_relaxed);
  s.capacity_bytes = d.capacity;
  return s;
}

std::string pool_stats_json(const Pool* pool) {
  JsonWriter j;
  j.begin_object().key("pool").value(pool->name).key("policy").value(pool->policy.text).key("devices").begin_array();
  DeviceStats total;
  for (int di = 0; di < pool->ndev; ++di) {
    DeviceStats s = pool_device_stats(pool, di);
    j.begin_object().key("device").value(pool->dev[di].name).key("tier").value(pool->dev[di].tier);
    j.key("allocated_bytes").value(s.allocated_bytes).key("active_bytes").value(s.active_bytes);
    j.key("resident_bytes").value(s.resident_bytes).key("peak_resident_bytes").value(s.peak_resident_bytes);
    j.key("capacity_bytes").value(s.capacity_bytes).key("allocations").value(s.allocations);
    j.key("frees").value(s.frees).key("fallbacks").value(s.fallbacks).key("failures").value(s.failures);
    j.end_object();
    total.allocated_bytes += s.allocated_bytes;
    total.resident_bytes += s.resident_bytes;
    total.allocations += s.allocations;
    total.frees += s.frees;
  }
  j.end_array().key("totals").begin_object();
  j.key("allocated_bytes").value(total.allocated_bytes).key("resident_bytes").value(total.resident_bytes);
  j.key("allocations").value(total.allocations).key("frees").value(total.frees).end_object();
  j.end_object();
  return j.str() + "\n";
}

}  // namespace cxlpool::detail::alloc

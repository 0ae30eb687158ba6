// SPDX-License-Identifier: MIT
// Regions and segments of a pool device, commit/decommit of slices with accounting, and
// purging: free slices stay committed (reuse without page faults) until a purge pass finds
// them idle at two passes in a row. Passes run on page retirement when the delay has passed
// and, while anything is left to purge, on a short-lived purger thread, so memory a program
// freed returns within about twice the delay even if it never calls malloc again.
#include <time.h>

#include <algorithm>

#include "alloc/internal.hpp"
#include "common/intrusive_list.hpp"
#include "os/own_threads.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::alloc {

namespace {
std::atomic<uint64_t> g_purge_delay_ns{250'000'000};
}  // namespace

namespace {
std::atomic<int> g_limited{-1};
std::atomic<size_t> g_region_segments{kRegionSegments};
std::atomic<uint64_t> g_unit_serial{0};
}  // namespace

uint64_t next_unit_serial() noexcept { return g_unit_serial.fetch_add(1, std::memory_order_relaxed) + 1; }
void set_region_segments(size_t n) noexcept {
  g_region_segments.store(std::clamp<size_t>(n, 1, kRegionSegments), std::memory_order_relaxed);
}
size_t region_segments() noexcept { return g_region_segments.load(std::memory_order_relaxed); }

bool address_space_limited() noexcept {
  int v = g_limited.load(std::memory_order_relaxed);
  if (v < 0) {
    v = os::prim::address_space_headroom() != SIZE_MAX;
    g_limited.store(v, std::memory_order_relaxed);
  }
  return v != 0;
}
void set_address_space_limited(int limited) noexcept {
  g_limited.store(limited < 0 ? -1 : limited != 0, std::memory_order_relaxed);
}

void set_purge_delay_ms(uint64_t ms) noexcept { g_purge_delay_ns.store(ms * 1'000'000, std::memory_order_relaxed); }
uint64_t purge_delay_ms() noexcept { return g_purge_delay_ns.load(std::memory_order_relaxed) / 1'000'000; }
void enter_internal_scope() noexcept { os::enter_internal_scope(); }
void leave_internal_scope() noexcept { os::leave_internal_scope(); }
void set_internal_scope_hooks(void (*enter)() noexcept, void (*leave)() noexcept) noexcept {
  os::set_internal_scope_hooks(enter, leave);
}

bool device_commit(Pool* pool, PoolDevice& d, uintptr_t addr, size_t len) noexcept {
  if (d.device->commit(reinterpret_cast<void*>(addr), len, false, int(pool->index), nullptr) != CXLPOOL_OK)
    return false;
  uint64_t now = d.resident.fetch_add(len, std::memory_order_relaxed) + len;
  uint64_t peak = d.peak_resident.load(std::memory_order_relaxed);
  while (now > peak && !d.peak_resident.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return true;
}

// False when the device kept the range committed (its pages may be freed: the VMA budget);
// it stays committed and counted here too.
bool device_decommit(Pool* pool, PoolDevice& d, uintptr_t addr, size_t len) noexcept {
  ErrnoGuard keep_errno;
  if (d.device->decommit(reinterpret_cast<void*>(addr), len, int(pool->index), nullptr) != CXLPOOL_OK) return false;
  d.resident.fetch_sub(len, std::memory_order_relaxed);
  return true;
}

// Commits slices [first, first+count) of a segment that are not committed yet (mutex held).
// A coarse device commits the whole segment the first time.
bool commit_slices(Pool* pool, PoolDevice& d, Segment* seg, unsigned first, unsigned count) noexcept {
  PoolDevice& at = pool->dev[seg->resident];  // where the segment's bytes live
  if (d.coarse) {
    if (seg->committed_slices == ~uint64_t(0)) return true;
    if (!device_commit(pool, at, seg->base, kSegmentSize)) return false;
    seg->committed_slices = ~uint64_t(0);
    return true;
  }
  unsigned i = first, end = first + count;
  while (i < end) {
    if (seg->committed_slices >> i & 1) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j < end && !(seg->committed_slices >> j & 1)) ++j;
    if (!device_commit(pool, at, seg->base + (uintptr_t(i) << kSliceShift), size_t(j - i) << kSliceShift)) return false;
    seg->committed_slices |= run_mask(i, j - i);
    i = j;
  }
  return true;
}

// Decommits the free committed slices of a segment selected by mask (mutex held). A coarse
// device decommits only a whole segment (mask all ones, from free_segment).
void decommit_slices(Pool* pool, PoolDevice& d, Segment* seg, uint64_t mask) noexcept {
  if (segment_moving(d, seg)) return;  // stays committed: a later pass decommits it
  PoolDevice& at = pool->dev[seg->resident];
  if (d.coarse) {
    if (mask == ~uint64_t(0) && seg->committed_slices == ~uint64_t(0) &&
        device_decommit(pool, at, seg->base, kSegmentSize))
      seg->committed_slices = 0;
    seg->purge_mark = 0;
    return;
  }
  for (unsigned i = 0; i < kSlicesPerSegment;) {
    if (!(mask >> i & 1)) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j < kSlicesPerSegment && (mask >> j & 1)) ++j;
    const uint64_t run = run_mask(i, j - i);
    seg->purge_mark &= ~run;  // not retried until freed again
    if (device_decommit(pool, at, seg->base + (uintptr_t(i) << kSliceShift), size_t(j - i) << kSliceShift)) {
      seg->committed_slices &= ~run;
      d.free_committed -= std::min<uint64_t>(d.free_committed, uint64_t(j - i) << kSliceShift);
    }
    i = j;
  }
}

namespace {

// Reserves a new region for small segments (mutex held); its index, or -1. fd devices get
// regions of at most 1/8 of their capacity and 1/4 of their free offsets, so huge blocks
// still find device offsets; under an RLIMIT_AS, regions shrink to 1/64 of what is left (a
// free segment of a region in use holds its address space).
long new_region(Pool* pool, PoolDevice& d) noexcept {
  size_t want = std::min(kRegionSegments, region_segments());
  if (d.device->caps().kind != CXLPOOL_BACKING_NUMA) {
    uint64_t cap = d.device->capacity(), reserved = d.device->reserved_bytes();
    uint64_t left = (cap - std::min(cap, reserved)) / kSegmentSize;
    // The free segments of a region hold device offsets a huge block may need.
    want = std::min<size_t>(want, std::max<uint64_t>(1, cap / 8 / kSegmentSize));
    want = std::max<size_t>(1, std::min<size_t>(want, left / 4));
  }
  size_t headroom = os::prim::address_space_headroom();
  if (headroom != SIZE_MAX) want = std::clamp<size_t>(headroom / 64 / kSegmentSize, 1, want);
  void* base = nullptr;
  if (d.device->reserve(want * kSegmentSize, kSegmentSize, 0, pool->sharing, int(pool->index), &base, nullptr))
    return -1;
  Region r;
  r.base = reinterpret_cast<uintptr_t>(base);
  r.segments = want;
  r.serial = next_unit_serial();
  r.resident = int(&d - pool->dev);
  try {
    d.regions.push_back(r);
  } catch (...) {
    d.device->release(base, int(pool->index), nullptr);
    return -1;
  }
  return long(d.regions.size() - 1);
}

// A free segment slot in some region, reserving a new region if needed (mutex held).
uintptr_t take_segment(Pool* pool, PoolDevice& d, size_t& region_out) noexcept {
  for (size_t ri = 0; ri < d.regions.size(); ++ri) {
    Region& r = d.regions[ri];
    if (r.moving) continue;  // its segments would commit on the device it is leaving
    for (size_t s = 0; s < r.segments; ++s)
      if (!((r.used | r.lost) >> s & 1)) {
        r.used |= uint64_t(1) << s;
        region_out = ri;
        return r.base + s * kSegmentSize;
      }
  }
  long ri = new_region(pool, d);
  if (ri < 0) return 0;
  d.regions[size_t(ri)].used |= 1;
  region_out = size_t(ri);
  return d.regions[size_t(ri)].base;
}

void give_back_segment(Pool* pool, PoolDevice& d, size_t ri, uintptr_t base) noexcept {
  Region& r = d.regions[ri];
  r.used &= ~(uint64_t(1) << ((base - r.base) / kSegmentSize));
  if (!r.used) {  // the whole region is free: return its address space and device range
    unit_released(pool, r.base, r.segments * kSegmentSize);
    pool->dev[r.resident].device->release(reinterpret_cast<void*>(r.base), int(pool->index), nullptr);
    r.segments = 0;
  }
}

}  // namespace

Segment* new_segment(Pool* pool, int di) noexcept {
  PoolDevice& d = pool->dev[di];
  size_t ri = 0;
  uintptr_t base = take_segment(pool, d, ri);
  if (!base) return nullptr;
  Segment* seg = segment_new();
  if (!seg) {
    give_back_segment(pool, d, ri, base);
    return nullptr;
  }
  init_header(seg, pool, di, ArenaKind::kHeapSmall);
  seg->base = base;
  seg->region = ri;
  seg->resident = uint8_t(d.regions[ri].resident);
  for (unsigned i = 0; i < kSlicesPerSegment; ++i) {
    seg->pages[i].segment = seg;
    seg->pages[i].remote_bits = seg->remote_bits[i];
  }
  if (!pagemap_set(base, 1, seg)) {
    segment_delete(seg);
    give_back_segment(pool, d, ri, base);
    return nullptr;
  }
  return seg;
}

void partial_add(PoolDevice& d, Segment* s) noexcept {
  if (s->in_partial) return;
  s->prev_partial = nullptr;
  s->next_partial = d.partial;
  if (d.partial) d.partial->prev_partial = s;
  d.partial = s;
  s->in_partial = true;
}

void partial_remove(PoolDevice& d, Segment* s) noexcept {
  if (!s->in_partial) return;
  if (s->prev_partial)
    s->prev_partial->next_partial = s->next_partial;
  else
    d.partial = s->next_partial;
  if (s->next_partial) s->next_partial->prev_partial = s->prev_partial;
  s->in_partial = false;
}

void free_segment(Pool* pool, PoolDevice& d, Segment* s) noexcept {
  if (segment_moving(d, s)) return;  // its region is not released mid-move: a later pass frees it
  decommit_slices(pool, d, s, d.coarse ? ~uint64_t(0) : s->committed_slices);
  partial_remove(d, s);
  pagemap_release(s->base, 1);
  give_back_segment(pool, d, s->region, s->base);
  segment_delete(s);
}

void release_regions(Pool* pool, PoolDevice& d) noexcept {
  for (Region& r : d.regions) {
    if (!r.segments) continue;
    for (size_t s = 0; s < r.segments; ++s) {
      SegmentHeader* hdr = pagemap_lookup(reinterpret_cast<void*>(r.base + s * kSegmentSize));
      if (!hdr || hdr->kind != ArenaKind::kHeapSmall) continue;
      pagemap_release(r.base + s * kSegmentSize, 1);
      segment_delete(static_cast<Segment*>(hdr));
    }
    unit_released(pool, r.base, r.segments * kSegmentSize);
    pool->dev[r.resident].device->release(reinterpret_cast<void*>(r.base), int(pool->index), nullptr);
    r.segments = 0;
  }
  d.regions.clear();
  d.partial = nullptr;
}

bool purge_pass(Pool* pool, PoolDevice& d) noexcept {
  d.last_purge_ns = os::coarse_now_ns();
  ++d.purge_passes;
  bool pending = false;
  // Pages of exited threads that other threads' frees emptied: nobody else would retire them.
  for (unsigned c = 0; c < kNumClasses; ++c)
    for (Page* pg = d.abandoned[c]; pg;) {
      Page* next = pg->next;
      if (pg->remote_count.load(std::memory_order_acquire) > 0) fold_frees(d, pg);
      if (pg->used == 0) {
        list_remove(d.abandoned[c], pg);
        release_page_locked(pool, d, pg);
        pending = true;  // its slices are free and committed now
      }
      pg = next;
    }
  for (Segment* s = d.partial; s;) {
    Segment* next = s->next_partial;
    if (segment_moving(d, s)) {  // the next pass, after the move
      pending = true;
      s = next;
      continue;
    }
    if (d.coarse) {
      // Whole segments only: one that stayed empty for a pass goes back to its region.
      if (s->free_slices == ~uint64_t(0) && s->purge_mark)
        free_segment(pool, d, s);
      else if (s->free_slices == ~uint64_t(0))
        pending = (s->purge_mark = 1) != 0;
      s = next;
      continue;
    }
    uint64_t idle = s->free_slices & s->committed_slices;
    decommit_slices(pool, d, s, idle & s->purge_mark);
    s->purge_mark = s->free_slices & s->committed_slices;
    if (s->free_slices == ~uint64_t(0) && !s->committed_slices)
      free_segment(pool, d, s);  // nothing left in it: give its address space back too
    else
      pending |= s->purge_mark != 0;
    s = next;
  }
  for (HugeSpan* span = d.huge_cache; span;) {
    HugeSpan* next = span->next;
    if (span->cached_at + 1 < d.purge_passes && !span->moving) {
      d.huge_cache_bytes -= span->committed;
      --d.huge_cache_count;
      list_remove(d.huge_cache, span);
      huge_release_span(pool, d, span);
    } else {
      pending = true;
    }
    span = next;
  }
  return pending;
}

namespace {

std::atomic<bool> g_purger_running{false};
std::atomic<bool> g_purge_requested{false};
thread_local bool tl_start_deferred __attribute__((tls_model("initial-exec"))) = false;

// One pass over every pool device of every pool; true while something is left.
bool purge_everything() noexcept {
  bool pending = false;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (auto& e : g_registry) {
    if (!e.pool || e.pool->detached) continue;
    for (int di = 0; di < e.pool->ndev; ++di) {
      PoolDevice& d = e.pool->dev[di];
      std::lock_guard<std::mutex> dlock(d.mu);
      pending |= purge_pass(e.pool, d);
    }
  }
  return pending;
}

void* purger_main(void*) {
  os::OwnThread mark("cxlpool/purge");
  os::prim::block_async_signals(nullptr);  // the program's handlers run on its own threads
  os::enter_internal_scope();              // the interposer: our own allocations are internal
  for (;;) {
    g_purge_requested.store(false, std::memory_order_relaxed);
    uint64_t ns = g_purge_delay_ns.load(std::memory_order_relaxed);
    struct timespec ts {
      time_t(ns / 1'000'000'000), long(ns % 1'000'000'000)
    };
    while (nanosleep(&ts, &ts) != 0) {
    }
    if (purge_everything() || g_purge_requested.load(std::memory_order_acquire)) continue;
    g_purger_running.store(false, std::memory_order_release);
    // A request that arrived after the check above found the purger still running.
    if (g_purge_requested.load(std::memory_order_acquire) && !g_purger_running.exchange(true)) continue;
    break;
  }
  os::leave_internal_scope();
  return nullptr;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// g++ 12's ASan and TSan keep their allocators' locks out of fork(): in the child of a
// multi-threaded process a new thread's first allocation (from an empty cache) can wait for
// ever on a lock a thread of the parent held. Sanitized builds purge inline in fork children.
constexpr bool kNoThreadsInForkChildren = true;
#else
constexpr bool kNoThreadsInForkChildren = false;
#endif
}  // namespace

void set_thread_start_deferred(bool deferred) noexcept { tl_start_deferred = deferred; }

bool start_background_thread(std::atomic<bool>& running, void* (*fn)(void*)) noexcept {
  if (tl_start_deferred) return false;
  if (kNoThreadsInForkChildren && os::fork_generation() > 0) return false;
  if (running.load(std::memory_order_acquire) || running.exchange(true)) return false;
  // Under a tight RLIMIT_NPROC the thread could take the program's last one (EAGAIN for the
  // program's own pthread_create): then its work is done inline or when asked.
  if (!os::prim::thread_headroom()) {
    running.store(false, std::memory_order_release);
    return false;
  }
  unsigned long tid = 0;
  if (os::prim::start_thread(fn, nullptr, size_t(64) << 10, true, &tid) != 0) {
    running.store(false, std::memory_order_release);
    return false;
  }
  return true;
}

void purge_soon(Pool*, PoolDevice&) noexcept {
  if (g_purge_delay_ns.load(std::memory_order_relaxed) == 0) return;  // purged at retirement
  g_purge_requested.store(true, std::memory_order_release);
  // Without the purger, memory is purged inline, when pages are released after the delay
  // (docs/allocator.md).
  start_background_thread(g_purger_running, purger_main);
}

void purger_reset_after_fork() noexcept {
  g_purger_running.store(false, std::memory_order_relaxed);  // the purger thread is not in the child
  g_purge_requested.store(false, std::memory_order_relaxed);
}

}  // namespace cxlpool::detail::alloc

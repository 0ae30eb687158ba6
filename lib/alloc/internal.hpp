// SPDX-License-Identifier: MIT
// Functions the allocator's files call in each other, grouped by the file that defines them.
// Nothing here throws: failures are nullptr / false / a status.
#pragma once

#include <new>

#include "alloc/types.hpp"
#include "os/os.hpp"

namespace cxlpool::detail::alloc {

// ---- meta.cpp: metadata memory (DRAM, never device memory) ----------------------------------
Segment* segment_new() noexcept;
void segment_delete(Segment* s) noexcept;
HugeSpan* span_new() noexcept;
void span_delete(HugeSpan* s) noexcept;
template <class T>
T* meta_new() noexcept {
  void* p = os::try_map_metadata(sizeof(T));
  return p ? new (p) T() : nullptr;
}
template <class T>
void meta_delete(T* p) noexcept {
  p->~T();
  os::unmap(p, sizeof(T));
}
void meta_lock_for_fork() noexcept;
void meta_unlock_after_fork() noexcept;
void meta_reset_lock_in_child() noexcept;

// What free() needs to find a block's arena, pool, heap and home device from the page map.
inline void init_header(SegmentHeader* h, Pool* pool, int di, ArenaKind kind) noexcept {
  h->kind = kind;
  h->pool = pool;
  h->pool_index = pool->index;
  h->pool_generation = pool->generation;
  h->device = uint8_t(di);
  h->resident = uint8_t(di);
}
// The device holding an arena's bytes, for readers without the home's lock.
inline int resident_of(const SegmentHeader* h) noexcept { return __atomic_load_n(&h->resident, __ATOMIC_RELAXED); }
inline void set_resident(SegmentHeader* h, int di) noexcept {
  __atomic_store_n(&h->resident, uint8_t(di), __ATOMIC_RELAXED);
}
// A fresh serial number for a region or huge span (tiering tells reused addresses apart).
uint64_t next_unit_serial() noexcept;
// A unit's reservation [base, base+size) is about to be released (home mutex held): runs the
// release hook (set_unit_release_hook) when the pool's units can move. residency.cpp.
void unit_released(const Pool* pool, uintptr_t base, size_t size) noexcept;

// ---- segment.cpp: regions, segments, commit/decommit of slices, purge passes ---------------
bool device_commit(Pool* pool, PoolDevice& d, uintptr_t addr, size_t len) noexcept;
bool device_decommit(Pool* pool, PoolDevice& d, uintptr_t addr, size_t len) noexcept;
bool commit_slices(Pool* pool, PoolDevice& d, Segment* seg, unsigned first, unsigned count) noexcept;
void decommit_slices(Pool* pool, PoolDevice& d, Segment* seg, uint64_t mask) noexcept;
// Whether seg's region is being moved now (d: its home, mutex held): Region::moving.
inline bool segment_moving(const PoolDevice& d, const Segment* seg) noexcept { return d.regions[seg->region].moving; }
Segment* new_segment(Pool* pool, int di) noexcept;  // pool device mutex held
void partial_add(PoolDevice& d, Segment* s) noexcept;
void partial_remove(PoolDevice& d, Segment* s) noexcept;
void free_segment(Pool* pool, PoolDevice& d, Segment* s) noexcept;  // empty segment back to its region
void release_regions(Pool* pool, PoolDevice& d) noexcept;
// One purge pass over a pool device (mutex held): decommits slices and cached huge spans that
// were idle at the previous pass too. Returns true while something is left to purge later.
bool purge_pass(Pool* pool, PoolDevice& d) noexcept;
// A retired page or cached span left free committed memory: purge it within the delay.
void purge_soon(Pool* pool, PoolDevice& d) noexcept;

// ---- page.cpp: pages of one size class --------------------------------------------------------
// A page of cls from a segment with room; without room, a new segment when may_add_segment
// (nullptr otherwise).
Page* new_page(Pool* pool, int di, unsigned cls, bool may_add_segment = true) noexcept;
void release_page(Pool* pool, Page* pg) noexcept;
void release_page_locked(Pool* pool, PoolDevice& d, Page* pg) noexcept;  // d.mu held
// Returns the owner's frees and other threads' frees of the page to malloc (used drops by
// them, double frees that raced are found and counted once). Only the page's owner calls it,
// or for a page without one, the holder of d.mu.
void fold_frees(PoolDevice& d, Page* pg) noexcept;
bool page_has_free(Page* pg) noexcept;
bool extend_commit(Pool* pool, Page* pg, uintptr_t upto) noexcept;

// ---- heap.cpp: thread heaps, abandonment and adoption -----------------------------------------
Heap* heap_slow(Pool* pool) noexcept;
void abandon_heap(Heap* h) noexcept;
Page* refill(Heap* h, int di, unsigned cls) noexcept;
void retire_empty_pages(Heap* h, int di) noexcept;
Heap* current_heap_of(const Pool* pool) noexcept;  // the calling thread's heap, if any
void forget_thread_heap(const Pool* pool) noexcept;

// ---- central.cpp: heaps shared by threads, for their first blocks of each class -------------
// The central heap the calling thread uses now, its lock taken into *held.
Pool::Central& lock_central(Pool* pool, std::unique_lock<std::mutex>* held) noexcept;
Heap* central_heap(Pool* pool, Pool::Central& c) noexcept;  // c.mu held; made on first use
void central_trim(Pool* pool) noexcept;                     // empty pages back to their segments

// ---- huge.cpp: blocks with address space of their own -----------------------------------------
void* huge_alloc(Pool* pool, int di, size_t size, size_t alignment) noexcept;
// Whether p is in the address space span reserved (not in the rest of its last segment,
// which under an RLIMIT_AS is left to others: a pointer there is foreign). Lock-free: span
// descriptors are type-stable, and a recycled one never covers a pointer that is not its own.
inline bool huge_reserves(const HugeSpan* span, const void* p) noexcept {
  const uintptr_t base = __atomic_load_n(&span->base, __ATOMIC_RELAXED);
  return reinterpret_cast<uintptr_t>(p) - base < __atomic_load_n(&span->reserved, __ATOMIC_RELAXED);
}
void huge_release_span(Pool* pool, PoolDevice& d, HugeSpan* span) noexcept;
extern const ArenaOps kHugeOps;

// ---- placement.cpp: compiled routes and the rule chain -----------------------------------------
void compile_routes(Pool* pool);
// The first-choice device of an allocation the fast path could not route, and its rule.
int choose(Pool* pool, Heap* h, size_t size, uint32_t hint, unsigned cls, bool huge, const Rule** rule) noexcept;

// ---- free.cpp -----------------------------------------------------------------------------------
extern const ArenaOps kSmallOps;

// ---- pool.cpp: the pool registry ---------------------------------------------------------------
struct RegistryEntry {
  Pool* pool = nullptr;
  uint32_t generation = 0;
};
extern std::mutex g_registry_mu;
// pool.cpp: PoolsAlive's lock, fresh in a fork child (the threads holding it are not there).
void reset_pools_alive_in_child() noexcept;
extern RegistryEntry g_registry[kMaxPools];

// ---- fork.cpp ------------------------------------------------------------------------------------
void purger_reset_after_fork() noexcept;
// Starts fn on a detached thread of cxlpool's own (64 KiB of stack), one at a time per
// `running` flag, which the thread clears when it ends: not while the calling thread defers
// thread starts (set_thread_start_deferred), not in a fork child of a sanitized build (their
// allocators' locks may be held there), not under a tight RLIMIT_NPROC. True when started.
bool start_background_thread(std::atomic<bool>& running, void* (*fn)(void*)) noexcept;
// ---- elastic.cpp ---------------------------------------------------------------------------------
// A capacity change the parent had running is not the child's (its thread is not here; the
// device cancelled the withdrawal): the lock that serialises them is fresh.
void elastic_reset_after_fork() noexcept;

}  // namespace cxlpool::detail::alloc

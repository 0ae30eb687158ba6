// SPDX-License-Identifier: MIT
// Pages: a run of slices holding blocks of one size class, with a free bitmap kept by the
// owning thread and a remote bitmap other threads set with an atomic OR. Carving a page from
// a segment, retiring an empty one, folding remote frees in (double frees are masked out
// and counted, never freed twice), and growing a multi-slice page's commit.
#include <algorithm>

#include "alloc/internal.hpp"

namespace cxlpool::detail::alloc {

namespace {
int find_run(uint64_t free_mask, unsigned k) {
  uint64_t m = free_mask;
  for (unsigned i = 1; i < k && m; ++i) m &= free_mask >> i;
  return m ? __builtin_ctzll(m) : -1;
}
}  // namespace

Page* new_page(Pool* pool, int di, unsigned cls, bool may_add_segment) noexcept {
  PoolDevice& d = pool->dev[di];
  // Pages of the fewest slices that hold a block well under an RLIMIT_AS, and on a device of a
  // few segments, where a page of eight 600 KB blocks (a whole segment) would hold most of it.
  const bool tight = address_space_limited() || d.device->capacity() < kTightPagesBelow;
  unsigned k = tight ? class_slices_tight(cls) : class_slices(cls);
  const size_t bsize = class_to_size(cls);
  std::lock_guard<std::mutex> lock(d.mu);
  Segment* seg = nullptr;
  int first = -1;
  auto any_segment = [&](unsigned slices) {
    for (int pass = 0; pass < 2 && !seg; ++pass)
      for (Segment* s = d.partial; s; s = s->next_partial)
        if (!s->lost.load(std::memory_order_relaxed) && !segment_moving(d, s) &&
            (first = find_run(pass == 0 ? s->free_slices & s->committed_slices : s->free_slices, slices)) >= 0) {
          seg = s;
          break;
        }
  };
  if (address_space_limited()) {
    // Under an RLIMIT_AS, the fullest segment with room: the emptier ones drain and give
    // their address space back (pool_trim, or a failing allocation's retry).
    int fewest = kSlicesPerSegment + 1;
    for (Segment* s = d.partial; s; s = s->next_partial) {
      const int free_count = __builtin_popcountll(s->free_slices);
      if (free_count >= fewest || s->lost.load(std::memory_order_relaxed) || segment_moving(d, s)) continue;
      if (int f = find_run(s->free_slices, k); f >= 0) {
        seg = s;
        first = f;
        fewest = free_count;
      }
    }
  } else {
    any_segment(k);  // free slices that are still committed first: no page faults, no commit
  }
  if (!seg && may_add_segment && (seg = new_segment(pool, di))) {
    partial_add(d, seg);
    first = 0;
  }
  if (!seg && k > class_slices_fewest(cls)) {
    // No run of k free slices and no new segment (the device's offsets are all taken): a page
    // of the fewest slices fits where the free slices are scattered.
    k = class_slices_fewest(cls);
    any_segment(k);
  }
  if (!seg) return nullptr;
  // Commit what the first block needs (multi-slice pages grow their commit lazily).
  unsigned need = unsigned((bsize + kSliceSize - 1) >> kSliceShift);
  uint64_t reused = 0;
  for (unsigned i = 0; i < k; ++i) reused += seg->committed_slices >> (first + i) & 1;
  if (!commit_slices(pool, d, seg, unsigned(first), std::min(need, k))) return nullptr;
  d.free_committed -= std::min<uint64_t>(d.free_committed, reused << kSliceShift);
  uint64_t mask = run_mask(unsigned(first), k);
  seg->purge_mark &= d.coarse ? 0 : ~mask;
  seg->free_slices &= ~mask;
  if (!seg->free_slices) partial_remove(d, seg);
  for (unsigned i = 0; i < k; ++i) seg->slice[first + i] = {uint8_t(first), uint8_t(cls)};
  d.active.fetch_add(uint64_t(k) << kSliceShift, std::memory_order_relaxed);

  Page* pg = &seg->pages[first];
  pg->start = seg->base + (uintptr_t(first) << kSliceShift);
  pg->block_size = uint32_t(bsize);
  pg->capacity = unsigned(k * kSliceSize / bsize);
  pg->end = pg->start + uintptr_t(pg->capacity) * bsize;
  uintptr_t committed = pg->start;
  for (unsigned i = 0; i < k && (seg->committed_slices >> (first + i) & 1); ++i) committed += kSliceSize;
  pg->commit_end = committed;
  pg->reciprocal = class_reciprocal(cls);
  pg->words = (pg->capacity + 63) / 64;
  pg->bits = pg->words <= kInlineWords ? pg->inline_bits : seg->local_bits[first];
  pg->used = 0;
  pg->cursor = 0;
  pg->cls = uint8_t(cls);
  pg->device = uint8_t(di);
  pg->first_slice = uint8_t(first);
  pg->slices = uint8_t(k);
  for (uint32_t w = 0; w < pg->words; ++w) {
    uint32_t bits = std::min<uint32_t>(64, pg->capacity - w * 64);
    store_bits(free_word(pg, w), bits == 64 ? ~uint64_t(0) : ((uint64_t(1) << bits) - 1));
    store_bits(freed_word(pg, w), 0);
    pg->remote_bits[w].store(0, std::memory_order_relaxed);
  }
  pg->remote_count.store(0, std::memory_order_relaxed);
  seg->remote_pending.fetch_and(~(uint64_t(1) << first), std::memory_order_relaxed);
  return pg;
}

void release_page_locked(Pool* pool, PoolDevice& d, Page* pg) noexcept {
  Segment* seg = pg->segment;
  uint64_t mask = run_mask(pg->first_slice, pg->slices);
  seg->free_slices |= mask;
  partial_add(d, seg);
  d.active.fetch_sub(uint64_t(pg->slices) << kSliceShift, std::memory_order_relaxed);
  if (!d.coarse) d.free_committed += uint64_t(__builtin_popcountll(seg->committed_slices & mask)) << kSliceShift;
  pg->state.store(kUnused, std::memory_order_relaxed);
  pg->end = 0;
  pg->owner.store(nullptr, std::memory_order_relaxed);
  if (purge_delay_ms() == 0 || d.free_committed > kMaxFreeCommitted)
    decommit_slices(pool, d, seg, seg->committed_slices & mask);
}

void release_page(Pool* pool, Page* pg) noexcept {
  ErrnoGuard keep_errno;
  PoolDevice& d = pool->dev[pg->device];
  Segment* seg = pg->segment;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    release_page_locked(pool, d, pg);
    uint64_t delay_ns = purge_delay_ms() * 1'000'000;
    if (delay_ns && os::coarse_now_ns() - d.last_purge_ns >= delay_ns) purge_pass(pool, d);
    if (!d.free_committed && !(d.coarse && seg->free_slices == ~uint64_t(0))) return;
  }
  purge_soon(pool, d);
}

void fold_frees(PoolDevice& d, Page* pg) noexcept {
  // The owner's frees first. Each word goes free-now before freed is cleared (release): a
  // remote free reads freed before free-now (remote_free), so it sees the block free on one
  // side or the other, never on neither. The cursor moves back to the lowest word that gained
  // blocks: malloc reuses a page's lowest blocks first, so what a page touches stays close to
  // what is live.
  uint32_t low = pg->words;
  for (uint32_t w = 0; w < pg->words; ++w) {
    uint64_t f = *freed_word(pg, w);
    if (!f) continue;
    store_bits(free_word(pg, w), *free_word(pg, w) | f);
    __atomic_store_n(freed_word(pg, w), 0, __ATOMIC_RELEASE);
    low = std::min(low, w);
  }
  if (low < pg->cursor) pg->cursor = low;
  if (pg->remote_count.load(std::memory_order_acquire) <= 0) return;
  int32_t freed = 0, doubles = 0;
  for (uint32_t w = 0; w < pg->words; ++w) {
    if (!pg->remote_bits[w].load(std::memory_order_relaxed)) continue;
    uint64_t x = pg->remote_bits[w].exchange(0, std::memory_order_acq_rel);
    // A block freed remotely while it was free locally was freed twice (a race in the
    // program, or the owner's free and this one racing unseen): it stays free once, and the
    // second free is not counted as one.
    uint64_t twice = x & *free_word(pg, w);
    x &= ~twice;
    store_bits(free_word(pg, w), *free_word(pg, w) | x);
    freed += __builtin_popcountll(x);
    doubles += __builtin_popcountll(twice);
    if (x && w < pg->cursor) pg->cursor = w;
  }
  pg->used -= uint32_t(freed);
  if (pg->remote_count.fetch_sub(freed + doubles, std::memory_order_seq_cst) == freed + doubles) {
    // Nothing pending any more: clear the page's hint, then look again, as a remote free may
    // have counted itself between the two (it sets the hint after counting).
    Segment* seg = pg->segment;
    const uint64_t bit = uint64_t(1) << pg->first_slice;
    seg->remote_pending.fetch_and(~bit, std::memory_order_seq_cst);
    if (pg->remote_count.load(std::memory_order_seq_cst) > 0)
      seg->remote_pending.fetch_or(bit, std::memory_order_seq_cst);
  }
  if (doubles) d.late_double_frees[pg->cls].fetch_add(uint64_t(doubles), std::memory_order_relaxed);
}

bool page_has_free(Page* pg) noexcept {
  if (pg->segment->lost.load(std::memory_order_relaxed)) {  // its memory was taken: nothing more from it
    pg->cursor = pg->words;
    return false;
  }
  // The owner's frees come back as soon as malloc gets here (the current word ran dry, or
  // holds some that alloc_block left while remote frees wait), with the remote frees folded
  // in next to them. Remote frees alone wait until the page has nothing else: folding them at
  // every word would contend with the threads still freeing into the page.
  for (uint32_t w = 0; w < pg->words; ++w)
    if (*freed_word(pg, w)) {
      fold_frees(pg->segment->pool->dev[pg->device], pg);
      break;
    }
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t w = pg->cursor; w < pg->words; ++w)
      if (*free_word(pg, w)) {
        pg->cursor = w;
        return true;
      }
    if (pass == 0) fold_frees(pg->segment->pool->dev[pg->device], pg);
  }
  pg->cursor = pg->words;
  return false;
}

bool extend_commit(Pool* pool, Page* pg, uintptr_t upto) noexcept {
  PoolDevice& d = pool->dev[pg->device];
  std::unique_lock<std::mutex> lock(d.mu);
  Segment* seg = pg->segment;
  // The page is this thread's: a move of its region ends before it commits more (on the
  // device the region lives on then).
  d.unit_moved.wait(lock, [&] { return !segment_moving(d, seg); });
  unsigned from = unsigned((pg->commit_end - seg->base) >> kSliceShift);
  unsigned to = unsigned((upto - seg->base + kSliceSize - 1) >> kSliceShift);
  if (!commit_slices(pool, d, seg, from, to - from)) return false;
  pg->commit_end = seg->base + (uintptr_t(to) << kSliceShift);
  return true;
}

}  // namespace cxlpool::detail::alloc

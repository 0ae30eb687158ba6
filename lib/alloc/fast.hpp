// SPDX-License-Identifier: MIT
// The allocator's fast paths, inline so the C entry points (and the interposer) get them
// without a call: the thread's heap lookup, taking a block from the current page, and the
// owner-thread free. Everything slower is out of line in the other files.
#pragma once

#include <algorithm>
#include <array>

#include "alloc/internal.hpp"

namespace cxlpool::detail::alloc {

struct TlsEntry {
  Heap* heap;
  uint32_t generation;
};

// Where the thread's last block from malloc's fast path lives, so that freeing it (the
// commonest free: a temporary) skips the lookup chain free() otherwise walks (page map root and
// leaf, segment, slice, class reciprocal, the thread's heap). A cache, nothing more: a free
// uses it only while the page is still the heap's (owner check), the heap still the thread's
// for that pool, and the pool alive (registry generation), and then runs the same owner free,
// double-free checks included. A heap gains pages only in refill(), which clears it, so a
// page the heap owns now has been its own since the block was handed out: its class and the
// block's bit are as recorded. Clearing it is always safe.
struct LastBlock {
  void* ptr = nullptr;
  Page* pg = nullptr;
  uint32_t idx = 0;  // the block's index in its page
  uint32_t pool = 0, generation = 0;
  uint8_t device = 0, cls = 0;  // the page's (counters are found without loading it)
};

// One initial-exec TLS pointer per thread (no __tls_get_addr call on the hot path) to a
// block holding the thread's heap of every pool, mapped on the thread's first allocation.
struct ThreadState {
  LastBlock last;
  TlsEntry heaps[kMaxPools];
};
// constinit: no dynamic initialisation, so no TLS wrapper call on the hot path.
extern constinit thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec")));

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

// Class tables for computations off the page descriptor.
inline constexpr auto kReciprocals = [] {
  std::array<uint64_t, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = class_reciprocal(c);
  return r;
}();
inline constexpr auto kClassSizes = [] {
  std::array<uint32_t, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = uint32_t(class_to_size(c));
  return r;
}();
inline constexpr auto kInlineBitmap = [] {
  std::array<bool, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = (class_capacity(c) + 63) / 64 <= kInlineWords;
  return r;
}();

// The segment holding a page descriptor: arithmetic, no load (Segment is not standard layout,
// but its layout is fixed: no virtual functions, one base).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
inline Segment* segment_of(Page* pg) noexcept {
  return reinterpret_cast<Segment*>(reinterpret_cast<char*>(pg - pg->first_slice) - offsetof(Segment, pages));
}
#pragma GCC diagnostic pop

inline void remember(ThreadState* ts, const Pool* pool, Page* pg, uint32_t idx, int di, unsigned cls,
                     void* p) noexcept {
  LastBlock& m = ts->last;
  m.pg = pg;
  m.idx = idx;
  m.device = uint8_t(di);
  m.cls = uint8_t(cls);
  m.pool = pool->index;
  m.generation = pool->generation;
  // A signal handler that frees through the interposer never uses this (it takes the
  // lock-free path), but the pointer is still written last.
  std::atomic_signal_fence(std::memory_order_release);
  m.ptr = p;
}

inline constexpr auto kLastWord = [] {
  std::array<uint32_t, kNumClasses> r{};
  for (unsigned c = 0; c < kNumClasses; ++c) r[c] = (kInlineBitmap[c] ? kInlineWords : kBitmapWords) - 1;
  return r;
}();

// A block of class cls from the heap's current page on device di, or nullptr. With ts (the
// calling thread's own heap, on malloc's fast path), the block is remembered in ts->last.
template <bool kRemember = false>
inline void* alloc_block(Heap* h, int di, unsigned cls, ThreadState* ts = nullptr,
                         const Pool* pool = nullptr) noexcept {
  Page* pg = h->row[di].head[cls];
  if (__builtin_expect(pg != nullptr, 1)) {
    uint32_t c = pg->cursor;
    if (__builtin_expect(c < pg->words, 1)) {
      uint64_t w = *free_word(pg, c);
      // Blocks the owner freed in this word come back before a higher one is taken, so a
      // page touches what is live, not every block it has. Here only while no remote free
      // waits: those must be folded in with them (page_has_free does), or two racing frees
      // of a block would not meet.
      if (uint64_t f = *freed_word(pg, c)) {
        if (pg->remote_count.load(std::memory_order_acquire) > 0) return nullptr;
        w |= f;
        store_bits(free_word(pg, c), w);
        __atomic_store_n(freed_word(pg, c), 0, __ATOMIC_RELEASE);
      }
      if (__builtin_expect(w != 0, 1)) {
        const uintptr_t idx = (uintptr_t(c) << 6) + uintptr_t(__builtin_ctzll(w));
        const uintptr_t bsize = pg->block_size;
        uintptr_t p = pg->start + idx * bsize;
        if (__builtin_expect(p + bsize <= pg->commit_end, 1)) {
          store_bits(free_word(pg, c), w & (w - 1));
          ++pg->used;
          if constexpr (kRemember) remember(ts, pool, pg, uint32_t(idx), di, cls, reinterpret_cast<void*>(p));
          return reinterpret_cast<void*>(p);
        }
      }
    }
  }
  return nullptr;
}

// Out-of-line parts of a small free.
void local_free_followup(Heap* me, Page* pg) noexcept;
// A free of a block whose page is not the calling thread's: a central heap's (under its lock)
// or another thread's (remote_free). Scalars, not a BlockRef: the fast path keeps them in
// registers.
void nonlocal_free(Segment* seg, void* p, Heap* me, Page* pg, uint64_t* word, uint32_t w, uint64_t bit) noexcept;
void remote_free(Segment* seg, Page* pg, Heap* me, uint64_t* local_word, uint32_t w, uint64_t bit) noexcept;
void count_invalid_free(Segment* seg, Heap* me) noexcept;
void count_double_free(Segment* seg, Heap* me) noexcept;

// Where a small block's free bit lives. valid is false for a pointer that starts no live
// block (inside a block, or in a slice that holds no page: end is 0 there).
struct BlockRef {
  Page* pg;
  uint64_t* word;  // the page's pair of bitmap words (free now, freed by the owner)
  uint32_t w;
  uint64_t bit;
  uint8_t slot, cls;
  bool valid;
};

inline BlockRef locate_block(Segment* seg, uintptr_t a) noexcept {
  // The slot, class and block index come from the segment header, so the bitmap word and the
  // page descriptor are two independent loads (their cache misses overlap).
  const Segment::SliceInfo si = seg->slice[(a - seg->base) >> kSliceShift];
  const uintptr_t start = seg->base + (uintptr_t(si.slot) << kSliceShift);
  const uint32_t idx = uint32_t(((a - start) * kReciprocals[si.cls]) >> kReciprocalShift);
  // A pointer into a slice that holds no page (its entry names slot 0, or a page that was
  // there) can give any index: the word is kept inside the bitmap it would be read from, and
  // such a pointer is never valid below.
  const uint32_t w = std::min(idx >> 6, kLastWord[si.cls]);
  Page* pg = &seg->pages[si.slot];
  uint64_t* word = kInlineBitmap[si.cls] ? &pg->inline_bits[2 * size_t(w)] : &seg->local_bits[si.slot][2 * size_t(w)];
  // Only the first byte of a live block frees it.
  bool valid = a < pg->end && a == start + uintptr_t(idx) * kClassSizes[si.cls];
  return {pg, word, w, uint64_t(1) << (idx & 63), si.slot, si.cls, valid};
}

// The free of a valid block by its page's owner (the owning thread, or whoever holds a
// central heap's lock). The block goes to the owner's freed bitmap, not back to malloc: the
// next fold (page.cpp) returns it, and meets there any free of it by another thread that
// raced this one unseen (the owner's store here is not fenced, so neither side is sure to see
// the other's bit in time).
inline void local_free(Segment* seg, const BlockRef& b, Heap* me, unsigned device) noexcept {
  const uint64_t now = b.word[0], freed = b.word[1];
  // Free already (here, or by another thread: its bit waits in the remote bitmap): a double
  // free, counted and ignored.
  if (__builtin_expect(
          ((now | freed) & b.bit) || ((seg->remote_pending.load(std::memory_order_relaxed) >> b.slot & 1) &&
                                      (seg->remote_bits[b.slot][b.w].load(std::memory_order_relaxed) & b.bit)),
          0)) {
    count_double_free(seg, me);
    return;
  }
  store_bits(&b.word[1], freed | b.bit);
  // Counter addresses come from the segment header and the class table, never from the page
  // descriptor: otherwise every free's counter update would wait for that free's page miss,
  // and the next free for it (store forwarding), serializing the misses.
  me->row[device].counters.frees[b.cls].add(1);
  // A page that empties is retired unless it is the heap's current one for its class (and
  // then the follow-up is only needed for its large-class rule under an RLIMIT_AS).
  const uint32_t used = --b.pg->used;
  if (__builtin_expect((used == 0 && (me->row[device].head[b.cls] != b.pg || kClassSizes[b.cls] > kSliceSize / 8)) ||
                           b.pg->state.load(std::memory_order_relaxed) == kFull,
                       0))
    local_free_followup(me, b.pg);
}

// The free of the thread's last block from malloc's fast path, when it still is what
// ts->last says (see LastBlock); false sends the caller down the lookup chain.
inline bool free_last(void* p) noexcept {
  ThreadState* ts = tls_state;
  if (__builtin_expect(!ts || ts->last.ptr != p, 0)) return false;
  const LastBlock m = ts->last;
  const TlsEntry e = ts->heaps[m.pool];
  if (__builtin_expect(!e.heap || e.generation != m.generation || g_registry[m.pool].generation != m.generation, 0))
    return false;
  Page* pg = m.pg;
  if (__builtin_expect(pg->owner.load(std::memory_order_relaxed) != e.heap, 0)) return false;
  ts->last.ptr = nullptr;
  const uint32_t w = m.idx >> 6;
  local_free(segment_of(pg),
             BlockRef{pg, free_word(pg, w), w, uint64_t(1) << (m.idx & 63), pg->first_slice, m.cls, true}, e.heap,
             m.device);
  return true;
}

// The free fast path: kept small so it inlines into cxlpool_free and many frees fit the
// out-of-order window at once (their cache misses overlap).
inline void free_small(Segment* seg, void* p) noexcept {
  const BlockRef b = locate_block(seg, reinterpret_cast<uintptr_t>(p));
  Heap* me = tls_heap(static_cast<const SegmentHeader*>(seg));
  if (__builtin_expect(!b.valid, 0)) {
    count_invalid_free(seg, me);
    return;
  }
  if (__builtin_expect(b.pg->owner.load(std::memory_order_relaxed) != me || !me, 0)) {
    nonlocal_free(seg, p, me, b.pg, b.word, b.w, b.bit);
    return;
  }
  local_free(seg, b, me, seg->device);
}

}  // namespace cxlpool::detail::alloc

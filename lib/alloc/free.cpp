// SPDX-License-Identifier: MIT
// free() and pointer queries for every arena kind: the page map finds a pointer's arena, its
// kind picks the ops (the small-block fast path is inline in fast.hpp). Interior pointers
// and double frees never release a block: they are counted per device and ignored, in every
// order of local and remote frees.
#include "alloc/fast.hpp"
#include "common/intrusive_list.hpp"

namespace cxlpool::detail::alloc {

namespace {

// An empty page goes back to its segment, except the thread's current page of its class
// (a malloc/free loop would carve and retire it every time) — which under an RLIMIT_AS goes
// back too when its blocks are above 8 KiB: a growing buffer walks through many such classes,
// and their empty pages would hold slices that smaller pages then cannot reuse.
void retire_if_empty(Heap* h, Page* pg) noexcept {
  if (pg->used != 0) return;
  if (h->row[pg->device].head[pg->cls] == pg && (kClassSizes[pg->cls] <= kSliceSize / 8 || !address_space_limited()))
    return;
  if (pg->state.load(std::memory_order_relaxed) == kFull)
    list_remove(h->row[pg->device].full[pg->cls], pg);
  else
    queue_remove(h->row[pg->device].head[pg->cls], h->row[pg->device].tail[pg->cls], pg);
  release_page(h->pool, pg);
}

// The block is free on the owner's side: freed by the owner and not folded yet, or free to
// malloc. Read in that order: a fold sets free-now before it clears freed, so a block being
// folded shows on one side or the other.
inline bool free_on_owner_side(uint64_t* pair, uint64_t bit) noexcept {
  if (__atomic_load_n(&pair[1], __ATOMIC_ACQUIRE) & bit) return true;
  return __atomic_load_n(&pair[0], __ATOMIC_RELAXED) & bit;
}

inline Page* page_of(Segment* seg, uintptr_t a) noexcept {
  return &seg->pages[seg->slice[(a - seg->base) >> kSliceShift].slot];
}

// The start of the live block of a small segment that p points into, or 0.
uintptr_t block_start(Segment* seg, uintptr_t a) noexcept {
  Page* pg = page_of(seg, a);
  if (pg->state.load(std::memory_order_relaxed) == kUnused || a < pg->start || a >= pg->end) return 0;
  uint32_t idx = uint32_t(((a - pg->start) * pg->reciprocal) >> kReciprocalShift);
  return pg->start + uintptr_t(idx) * pg->block_size;
}

void small_free(SegmentHeader* hdr, void* p) noexcept { free_small(static_cast<Segment*>(hdr), p); }

size_t small_usable_size(SegmentHeader* hdr, const void* p) noexcept {
  auto* seg = static_cast<Segment*>(hdr);
  auto a = reinterpret_cast<uintptr_t>(p);
  if (block_start(seg, a) != a) return 0;
  return page_of(seg, a)->block_size;
}

bool small_info(SegmentHeader* hdr, const void* p, PtrInfo* out) noexcept {
  auto* seg = static_cast<Segment*>(hdr);
  auto a = reinterpret_cast<uintptr_t>(p);
  uintptr_t start = block_start(seg, a);
  if (!start) return false;
  Page* pg = page_of(seg, a);
  out->block_size = pg->block_size;
  out->usable = start + pg->block_size - a;
  out->huge = false;
  return true;
}

// Frees of blocks whose memory was already given back: late second frees, ignored.
std::atomic<uint64_t> g_released_frees{0};
void released_free(SegmentHeader*, void*) noexcept { g_released_frees.fetch_add(1, std::memory_order_relaxed); }
size_t released_usable_size(SegmentHeader*, const void*) noexcept { return 0; }
bool released_info(SegmentHeader*, const void*, PtrInfo*) noexcept { return false; }
const ArenaOps kReleasedOps = {released_free, released_usable_size, released_info};

}  // namespace

const ArenaOps kSmallOps = {small_free, small_usable_size, small_info};
const ArenaOps* const g_arena_ops[size_t(ArenaKind::kCount)] = {&kSmallOps, &kHugeOps, &kReleasedOps};

void local_free_followup(Heap* me, Page* pg) noexcept {
  if (pg->state.load(std::memory_order_relaxed) == kFull) {
    list_remove(me->row[pg->device].full[pg->cls], pg);
    pg->state.store(kActive, std::memory_order_relaxed);
    queue_push_back(me->row[pg->device].head[pg->cls], me->row[pg->device].tail[pg->cls], pg);
  }
  if (pg->used == 0) retire_if_empty(me, pg);
}

void remote_free(Segment* seg, Page* pg, Heap* me, uint64_t* local_word, uint32_t w, uint64_t bit) noexcept {
  // Read the page's fields before publishing the free: once the bit is visible the owner may
  // collect it, find the page empty and recycle it for another class.
  const uint8_t device = pg->device, cls = pg->cls;
  const uint64_t slot_bit = uint64_t(1) << (pg - seg->pages);
  // Free already on the owner's side (freed there first): a double free. The owner may be
  // writing those words concurrently; plain reads are enough, as only a block that is free
  // can have its bit set there.
  if (free_on_owner_side(local_word, bit)) {
    count_double_free(seg, me);
    return;
  }
  uint64_t old = pg->remote_bits[w].fetch_or(bit, std::memory_order_acq_rel);
  if (old & bit) {  // freed remotely already and not folded in yet
    count_double_free(seg, me);
    return;
  }
  pg->remote_count.fetch_add(1, std::memory_order_seq_cst);
  // Set the page's hint unless it is set: no write (and no cache-line transfer) per remote
  // free. A hint being cleared right now is re-set by the collector, which re-reads the count
  // this free has already raised.
  if (!(seg->remote_pending.load(std::memory_order_seq_cst) & slot_bit))
    seg->remote_pending.fetch_or(slot_bit, std::memory_order_seq_cst);
  // Free on the owner's side now while this bit still waits: the owner freed it too, racing
  // this free (both saw it live): step back, so the block is free once. Where neither saw the
  // other, both bits stay and the owner's next fold counts the block once. A bit already
  // folded in is a free like any other (the fold found any double itself).
  if (free_on_owner_side(local_word, bit) && (pg->remote_bits[w].fetch_and(~bit, std::memory_order_acq_rel) & bit)) {
    pg->remote_count.fetch_sub(1, std::memory_order_seq_cst);
    count_double_free(seg, me);
    return;
  }
  if (me)
    me->row[device].counters.frees[cls].add(1);
  else
    seg->pool->dev[device].orphan_frees[cls].fetch_add(1, std::memory_order_relaxed);
  // Tell the owner that a page it may hold as full has free blocks again. If the page was
  // recycled meanwhile this only causes a harmless rescan.
  if (Heap* owner = pg->owner.load(std::memory_order_acquire))
    owner->row[device].full_dirty[cls].store(1, std::memory_order_release);
  else  // an exited thread's page: only a purge pass retires it once it is empty
    purge_soon(seg->pool, seg->pool->dev[device]);
}

void count_invalid_free(Segment* seg, Heap* me) noexcept {
  if (me)
    me->row[seg->device].counters.invalid_frees.add(1);
  else
    seg->pool->dev[seg->device].orphan_invalid_frees.fetch_add(1, std::memory_order_relaxed);
}

void count_double_free(Segment* seg, Heap* me) noexcept {
  if (me)
    me->row[seg->device].counters.double_frees.add(1);
  else
    seg->pool->dev[seg->device].orphan_double_frees.fetch_add(1, std::memory_order_relaxed);
}

bool owns(const void* p) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  if (!hdr || hdr->kind == ArenaKind::kReleased) return false;
  return hdr->kind != ArenaKind::kHeapHuge || huge_reserves(static_cast<HugeSpan*>(hdr), p);
}

size_t usable_size(const void* p) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  if (!hdr) return 0;
  return g_arena_ops[size_t(hdr->kind)]->usable_size(hdr, p);
}

bool ptr_info(const void* p, PtrInfo* out) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  if (!hdr) return false;
  PtrInfo info;
  if (!g_arena_ops[size_t(hdr->kind)]->info(hdr, p, &info)) return false;
  info.pool = hdr->pool;
  info.home_device = hdr->device;
  info.device = resident_of(hdr);
  info.target = hdr->pool->dev[info.device].target;
  info.tier = hdr->pool->dev[info.device].tier;
  *out = info;
  return true;
}

}  // namespace cxlpool::detail::alloc

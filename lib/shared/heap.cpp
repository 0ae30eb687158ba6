// SPDX-License-Identifier: MIT
// The shared heap of one participant: extents claimed from the pool (Dekker-style claims, no
// cross-host read-modify-write), small blocks carved from an extent by size class, large
// blocks of whole extents, and the handle protocol: export, import under a lease, release.
//
// Every state change is one 64-bit store by the single writer of that word (layout.hpp), so
// an allocation or free either happened or did not. The two races between participants are
// closed by store-fence-load handshakes (each side writes, fences, then reads the other):
//   importer: write lease, fence, read block state  |  owner: write "released", fence, read leases
//   claimer : write claim, fence, read claims       |  (every other claimer the same)
// At least one side of each pair sees the other's write, so a block is never freed under a
// lease and no extent has two owners.
#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "common/error.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

using detail::fail;

// ---- Claims ------------------------------------------------------------------------------

bool SharedPool::claim(ClaimKind kind, uint32_t first, uint32_t count, uint32_t quota_plus_one) {
  const uint64_t salt = view_.salt();
  view_.store(view_.slot_word(slot_, 2, 1), encode_quota_claim(quota_plus_one, slot_, salt));
  view_.store(view_.slot_word(slot_, 2, 0), encode_claim(kind, first, count, slot_, salt));
  PoolView::fence();
  for (uint32_t s = 0; s < view_.slot_count(); ++s) {
    // The dead hold no claims, nor does a joiner whose words are still its predecessor's. An
    // evicted participant still does until its recovery ends: recovery waits for a process of
    // its host that is inside an operation (stopped in it), and the stores its claim covers
    // (extent words, grants) are part of that operation: were its claim ignored meanwhile,
    // another claimer could take the same extents and the stopped one, resumed, overwrite them.
    if (s == slot_ || !view_.slot_tables_current(s) || !(view_.slot_live(s) || view_.slot_recovering(s))) continue;
    ClaimKind k{};
    uint32_t f = 0, c = 0, q = 0;
    if (!decode_claim(view_.load(view_.slot_word(s, 2, 0)), s, salt, &k, &f, &c)) continue;
    const bool overlap = k == kind && (kind == kClaimRecover ? f == first : (f < first + count && first < f + c));
    // Whatever their kinds: a composer lowering a quota's grant and that quota's claimers.
    const bool same_quota = quota_plus_one != 0 &&
                            decode_quota_claim(view_.load(view_.slot_word(s, 2, 1)), s, salt, &q) &&
                            q == quota_plus_one;
    if (overlap || same_quota) {
      unclaim();
      return false;
    }
  }
  return true;
}

void SharedPool::unclaim() {
  view_.store(view_.slot_word(slot_, 2, 0), 0);
  view_.store(view_.slot_word(slot_, 2, 1), 0);
}

uint64_t SharedPool::quota_use(uint32_t quota) const {
  uint64_t used = 0;
  for (uint64_t e = 0; e < view_.extent_count(); ++e) {
    ExtentWord w;
    if (!view_.extent(e, &w)) {
      ++used;  // unreadable: counted against every quota rather than handed out twice
      continue;
    }
    if (w.kind != kExtentFree && w.quota == quota) ++used;
  }
  return used;
}

// ---- Extents -----------------------------------------------------------------------------

bool SharedPool::grab_extents(uint32_t count, ExtentKind kind, uint32_t cls, uint64_t* first_out) {
  const uint64_t n = view_.extent_count();
  if (count == 0 || count > n || count > kMaxSpan) return false;
  const uint64_t salt = view_.salt();
  std::minstd_rand rng(static_cast<uint32_t>(slot_ * 7919 + incarnation_));
  for (int round = 0; round < 8; ++round) {
    bool conflicted = false;
    uint64_t run = 0;
    // From the hint to the end, then the whole table from 0: a run that starts before the hint
    // and ends after it is found too.
    const uint64_t hint = extent_hint_ % n;
    const uint64_t steps = hint == 0 ? n : 2 * n - hint;
    for (uint64_t k = 0; k < steps; ++k) {
      const uint64_t e = (hint + k) % n;
      if (e == 0) run = 0;  // runs do not wrap around the end
      ExtentWord w;
      const bool ok = view_.extent(e, &w);
      run = (ok && w.kind == kExtentFree) ? run + 1 : 0;
      if (run < count) continue;
      const uint64_t first = e + 1 - count;
      run = 0;
      if (!claim(kClaimExtents, static_cast<uint32_t>(first), count, quota_ + 1)) {
        conflicted = true;
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
        continue;
      }
      // Under the quota claim no other participant of our quota is counting or claiming, and
      // no composer is lowering its grant.
      const Grant g = grant(quota_);
      if (!g.readable || quota_use(quota_) + count > g.extents) {
        unclaim();
        quota_full_ = true;
        grant_damaged_ = !g.readable;
        note_demand(count);  // for a composer's policy (compose.cpp)
        return false;
      }
      bool still_free = true;  // someone may have finished a claim between our scan and claim
      for (uint64_t i = first; i < first + count && still_free; ++i)
        still_free = view_.load(&view_.extent_entry(i)->word) == 0;
      if (!still_free) {
        unclaim();
        continue;
      }
      if (kind == kExtentLargeHead) {
        for (uint32_t i = 1; i < count; ++i)
          view_.store(&view_.extent_entry(first + i)->word,
                      encode_extent({slot_, incarnation_, kExtentLargeTail, 0, i, quota_}, first + i, salt));
        const uint32_t gen = static_cast<uint32_t>(view_.load(&view_.extent_entry(first)->next_generation)) + 1;
        view_.store(&view_.extent_entry(first)->large_state,
                    encode_block({gen, kBlockAllocated}, view_.extent_offset(first), salt));
        view_.store(&view_.extent_entry(first)->word,
                    encode_extent({slot_, incarnation_, kExtentLargeHead, 0, count, quota_}, first, salt));
        Owned& o = owned_[first];
        o.cls = view_.sb().class_count;
        o.span = count;
        o.used = 1;
        o.max_gen = gen;
      } else {
        view_.store(&view_.extent_entry(first)->word,
                    encode_extent({slot_, incarnation_, kExtentFormatting, cls, 1, quota_}, first, salt));
      }
      unclaim();
      if (demand_raw_ != 0) note_demand(0);
      extent_lines_handover(first, count);  // no stale line of a previous owner survives in our caches
      extent_hint_ = (first + count) % n;
      *first_out = first;
      return true;
    }
    if (!conflicted) break;
  }
  note_demand(count);  // the pool is full (or contended): a composer may move capacity here
  return false;
}

void SharedPool::format_small(uint64_t e, uint32_t cls, uint32_t start_gen) {
  const uint64_t salt = view_.salt();
  const SmallGeometry& g = view_.geometry(cls);
  Owned& o = owned_[e];
  o.cls = cls;
  o.span = 1;
  o.used = 0;
  o.max_gen = start_gen;
  o.free_blocks.resize(g.blocks);
  o.app.assign(g.blocks, kNotHeld);
  for (uint64_t b = 0; b < g.blocks; ++b) {
    view_.store(view_.block_word(e, b), encode_block({start_gen, kBlockFree}, view_.block_offset(e, cls, b), salt));
    o.free_blocks[g.blocks - 1 - b] = static_cast<uint32_t>(b);  // pop gives the lowest first
  }
  view_.store(&view_.extent_entry(e)->word,
              encode_extent({slot_, incarnation_, kExtentSmall, cls, 1, quota_}, e, salt));
  partial_[cls].push_back(e);
}

void SharedPool::release_extents(uint64_t first, uint32_t count, uint32_t next_gen) {
  extent_lines_handover(first, count);  // our dirty lines reach the device before anyone reuses it
  ExtentEntry* head = view_.extent_entry(first);
  if (next_gen > view_.load(&head->next_generation)) view_.store(&head->next_generation, next_gen);
  for (uint32_t i = count; i-- > 0;)
    view_.store(&view_.extent_entry(first + i)->word, 0);  // tails first, the head last
}

// ---- Blocks ------------------------------------------------------------------------------

// One block of class cls allocated in the pool (its state word says so), not yet handed out.
// may_grab: take a new extent when the owned ones are full (not for filling the cache).
bool SharedPool::alloc_small(uint32_t cls, bool may_grab, CachedBlock* out) {
  const uint64_t salt = view_.salt();
  for (;;) {
    if (partial_[cls].empty()) {
      uint64_t e = 0;
      if (!may_grab || !grab_extents(1, kExtentFormatting, cls, &e)) return false;
      format_small(e, cls, static_cast<uint32_t>(view_.load(&view_.extent_entry(e)->next_generation)));
    }
    const uint64_t e = partial_[cls].back();
    Owned& o = owned_[e];
    if (o.free_blocks.empty()) {
      partial_[cls].pop_back();
      continue;
    }
    const uint32_t b = o.free_blocks.back();
    o.free_blocks.pop_back();
    if (o.free_blocks.empty()) partial_[cls].pop_back();
    const uint64_t offset = view_.block_offset(e, cls, b);
    BlockWord bw;
    if (!decode_block(view_.load(view_.block_word(e, b)), offset, salt, &bw) || bw.state != kBlockFree) {
      ++corrupt_words_;  // scribbled: never hand it out
      continue;
    }
    uint32_t gen = std::max(bw.generation, o.max_gen) + 1;
    if (gen == 0) gen = 1;
    view_.store(view_.block_word(e, b), encode_block({gen, kBlockAllocated}, offset, salt));
    o.max_gen = gen;
    ++o.used;
    in_use_add(view_.class_size(cls));
    *out = CachedBlock{e, b};
    return true;
  }
}

uint64_t SharedPool::cache_cap(uint32_t cls) const {
  const uint64_t cap = std::min<uint64_t>(kCacheMaxBlocks, kCacheBytes / view_.class_size(cls));
  return cap >= 2 ? cap : 0;  // classes too big for two blocks in the budget are not cached
}

bool SharedPool::fast_path_usable() const {
  // What ensure_usable checks, without the fence: the slot's eviction word is the one it was
  // when we joined (any eviction rewrites it; a writing Op decodes it after its fence), and
  // the heartbeat is recent, so this process was not stalled past the lease unawares.
  return joined_ && !evicted_.load(std::memory_order_relaxed) && !failed_.load(std::memory_order_relaxed) &&
         view_.load(view_.slot_word(slot_, 1, 0)) == eviction_raw_ &&
         os::coarse_now_ns() - last_beat_ns_.load(std::memory_order_relaxed) <= timeout_ns_ / 2;
}

void* SharedPool::hand_out(uint32_t cls, CachedBlock c) {
  owned_[c.extent].app[c.block] = kHeld;
  return user_ptr(view_.block_offset(c.extent, cls, c.block));
}

// A block allocated in the pool and not held by the application goes back to the pool (caller
// holds an Op).
void SharedPool::give_back_block(uint32_t cls, CachedBlock c) {
  BlockRef at;
  at.extent = c.extent;
  at.block = c.block;
  at.offset = view_.block_offset(c.extent, cls, c.block);
  at.state = view_.block_word(c.extent, c.block);
  BlockWord bw;
  if (!decode_block(view_.load(at.state), at.offset, view_.salt(), &bw) || bw.state != kBlockAllocated) {
    ++corrupt_words_;  // scribbled while cached: quarantined with its extent, never reused
    return;
  }
  view_.store(at.state, encode_block({bw.generation, kBlockFree}, at.offset, view_.salt()));
  try_finish_release(at, bw);
}

// Gives cached blocks of class cls back to the pool until keep are left (caller holds an Op).
void SharedPool::flush_cache(uint32_t cls, uint64_t keep) {
  auto& cache = cache_[cls];
  while (cache.size() > keep) {
    const CachedBlock c = cache.back();
    cache.pop_back();
    give_back_block(cls, c);
  }
}

// Before reporting a capacity failure: every cached block back to the pool, and the empty
// extents kept for speed (one per class) back to the others.
void SharedPool::trim() {
  for (uint32_t cls = 0; cls < cache_.size(); ++cls) trim_class(cls);
}

// One class's cached blocks back to the pool, and its empty extents back to the others.
void SharedPool::trim_class(uint32_t cls) {
  flush_cache(cls, 0);
  auto& list = partial_[cls];
  for (auto it = list.begin(); it != list.end();) {
    Owned* o = owned_.find(*it);
    if (o == nullptr || o->used != 0) {
      ++it;
      continue;
    }
    release_extents(*it, 1, o->max_gen + 1);
    owned_.erase(*it);
    it = list.erase(it);
  }
}

// Called by the watch, holding mu_ and marked: a class this participant has not allocated
// from for a second gives back what it kept for speed (its cached blocks, its empty extent),
// so capacity that another participant needs is never held by an idle one for long.
void SharedPool::trim_idle_classes() {
  const uint64_t per_second = heartbeat_ns_ ? std::max<uint64_t>(1, 1000000000u / heartbeat_ns_) : 1;
  for (uint32_t cls = 0; cls < idle_ticks_.size(); ++cls) {
    if (++idle_ticks_[cls] != per_second) continue;  // once per idle spell
    trim_class(cls);
  }
}

uint64_t SharedPool::cached_bytes() const {
  uint64_t bytes = 0;
  for (uint32_t cls = 0; cls < cache_.size(); ++cls) bytes += cache_[cls].size() * view_.class_size(cls);
  return bytes;
}

void* SharedPool::alloc_large(uint64_t size) {
  const uint64_t es = view_.extent_size();
  const uint64_t count = size / es + (size % es != 0);  // no overflow near SIZE_MAX
  if (count == 0 || count > kMaxSpan || count > view_.extent_count()) return nullptr;
  uint64_t first = 0;
  if (!grab_extents(static_cast<uint32_t>(count), kExtentLargeHead, 0, &first)) return nullptr;
  in_use_add(count * es);
  return user_ptr(view_.extent_offset(first));
}

void* SharedPool::alloc(size_t size, unsigned flags) {
  if (size == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_alloc: size is 0");
  if (flags != 0 && view_.noncoherent())
    fail(CXLPOOL_E_NOT_SUPPORTED,
         what_ + " has coherence none: an object " +
             ((flags & CXLPOOL_SHARED_LOCK_BEARING) ? "holding locks or atomics used by several participants"
                                                    : "written by several participants") +
             " needs a coherent pool (host, or fabric for CXL 3.x hardware coherence); on none each object has one "
             "writer, which publishes, and readers acquire");
  const uint32_t cls = view_.class_for(size);
  const bool small = cls < view_.sb().class_count;
  if (small && !in_fork_child()) {  // a forked child's mu_ may be a held copy: the Op refuses it
    std::lock_guard<HeapLock> lock(mu_);
    if (fast_path_usable() && !cache_[cls].empty()) {
      const CachedBlock c = cache_[cls].back();
      cache_[cls].pop_back();
      idle_ticks_[cls] = 0;
      return hand_out(cls, c);
    }
  }
  Op op(*this);
  if (small) idle_ticks_[cls] = 0;
  void* p = nullptr;
  for (int attempt = 0; attempt < 2 && !p; ++attempt) {
    if (attempt == 1) trim();  // cached blocks and kept empty extents may be what is missing
    quota_full_ = false;
    CachedBlock c{};
    if (!small) {
      p = alloc_large(size);
    } else if (!cache_[cls].empty()) {  // another thread refilled it meanwhile
      c = cache_[cls].back();
      cache_[cls].pop_back();
      p = hand_out(cls, c);
    } else if (alloc_small(cls, true, &c)) {
      // The cache holds blocks of one extent per class, the one allocations come from (kept
      // owned anyway): it never pins an extent that would otherwise go back to the pool.
      cache_extent_[cls] = c.extent;
      p = hand_out(cls, c);
      for (uint64_t refill = cache_cap(cls) / 2; refill > 0; --refill) {
        if (partial_[cls].empty() || partial_[cls].back() != c.extent) break;
        CachedBlock more{};
        if (!alloc_small(cls, false, &more)) break;
        if (more.extent != c.extent) {  // the extent ran out on a quarantined block
          give_back_block(cls, more);
          break;
        }
        cache_[cls].push_back(more);
      }
    }
  }
  if (!p && quota_full_ && grant_damaged_)
    fail(CXLPOOL_E_CORRUPT, what_ + ": the grant word of quota \"" + std::string(view_.sb().quotas[quota_].name) +
                                "\" is damaged, so the quota may not grow; cxlpool-pool check --repair resets it");
  if (!p && quota_full_)
    fail(CXLPOOL_E_CAPACITY, what_ + ": quota \"" + std::string(view_.sb().quotas[quota_].name) + "\" is full (" +
                                 std::to_string(grant(quota_).extents) + " extents of " +
                                 std::to_string(view_.extent_size()) + " bytes granted); " + std::to_string(size) +
                                 " bytes do not fit");
  if (!p)
    fail(CXLPOOL_E_CAPACITY, what_ + ": no room for " + std::to_string(size) + " bytes (" +
                                 std::to_string(view_.extent_count()) + " extents of " +
                                 std::to_string(view_.extent_size()) + " bytes)");
  return p;
}

// The block of this participant that ptr starts (fn names the caller in messages); *owned is
// its extent's bookkeeping.
BlockRef SharedPool::own_block(const void* ptr, const char* fn, Owned** owned) {
  uint64_t offset = 0;
  if (!user_offset(ptr, &offset)) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": pointer is not in " + what_);
  BlockRef at;
  ExtentWord w;
  if (!view_.locate(offset, &at, &w))
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": pointer is not a block start");
  *owned = owned_.find(at.extent);
  if (w.owner_slot != slot_ || w.owner_inc != owner_word_inc() || *owned == nullptr)
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) +
                                         ": block belongs to another participant (only the participant that allocated "
                                         "a block frees or exports it; imported blocks are given back with "
                                         "cxlpool_shared_release)");
  return at;
}

void SharedPool::free(void* ptr) {
  uint64_t offset = 0;
  if (!in_fork_child() && user_offset(ptr, &offset) && offset >= view_.sb().data_offset) {
    std::unique_lock<HeapLock> lock(mu_);
    const uint64_t e = (offset - view_.sb().data_offset) / view_.extent_size();
    Owned* o = owned_.find(e);
    if (fast_path_usable() && o != nullptr && o->cls < view_.sb().class_count && cache_cap(o->cls) > 0 &&
        cache_extent_[o->cls] == e) {
      const uint64_t first = view_.block_offset(e, o->cls, 0);
      const uint64_t size = view_.class_size(o->cls);
      const uint64_t b = (offset - first) / size;
      if (offset >= first && (offset - first) % size == 0 && b < o->app.size() && o->app[b] == kHeld) {
        o->app[b] = kNotHeld;
        const uint32_t cls = o->cls;
        cache_[cls].push_back(CachedBlock{e, b});
        if (cache_[cls].size() <= cache_cap(cls)) return;
        lock.unlock();
        try {  // the free happened; giving blocks back to the pool can wait for the next one
          Op op(*this);
          flush_cache(cls, cache_cap(cls) / 2);
        } catch (const Failure&) {
        }
        return;
      }
    }
  }
  free_slow(ptr);
}

void SharedPool::free_slow(void* ptr) {
  Op op(*this);
  Owned* o = nullptr;
  const BlockRef at = own_block(ptr, "cxlpool_shared_free", &o);
  const uint64_t offset = at.offset;
  BlockWord bw;
  if (!decode_block(view_.load(at.state), offset, view_.salt(), &bw)) {
    ++corrupt_words_;
    fail(CXLPOOL_E_CORRUPT, what_ + ": block state word at offset " + std::to_string(offset) + " fails its check");
  }
  const bool small = o->cls < view_.sb().class_count;
  const bool held = !small || (at.block < o->app.size() && o->app[at.block] != kNotHeld);
  if (!held || bw.state == kBlockFree || bw.state == kBlockReleased)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         "cxlpool_shared_free: double free of the block at offset " + std::to_string(offset));
  if (small) o->app[at.block] = kNotHeld;
  if (bw.state == kBlockExported) {
    let_go(at, bw);
    return;
  }
  view_.store(at.state, encode_block({bw.generation, kBlockFree}, offset, view_.salt()));
  try_finish_release(at, bw);
}

// The owner lets go of an exported block: it lives on while any lease holds it.
void SharedPool::let_go(const BlockRef& at, BlockWord bw) {
  view_.store(at.state, encode_block({bw.generation, kBlockReleased}, at.offset, view_.salt()));
  PoolView::fence();
  if (view_.anyone_holds(at.offset, bw.generation)) {
    released_pending_.push_back(at.offset);
    return;
  }
  view_.store(at.state, encode_block({bw.generation, kBlockFree}, at.offset, view_.salt()));
  try_finish_release(at, bw);
}

// Bookkeeping after a block's state became free: back on the free list, extents given back.
bool SharedPool::try_finish_release(const BlockRef& at, BlockWord bw) {
  Owned* found = owned_.find(at.extent);
  if (found == nullptr) return false;
  Owned& o = *found;
  o.max_gen = std::max(o.max_gen, bw.generation);
  if (o.cls >= view_.sb().class_count) {  // large: the extents go back to the pool
    in_use_sub(uint64_t{o.span} * view_.extent_size());
    release_extents(at.extent, o.span, o.max_gen + 1);
    owned_.erase(at.extent);
    return true;
  }
  in_use_sub(view_.class_size(o.cls));
  if (o.free_blocks.empty()) partial_[o.cls].push_back(at.extent);
  o.free_blocks.push_back(static_cast<uint32_t>(at.block));
  // Keep one extent per class for the next allocations (the cache's, or one empty one); give
  // back the rest.
  const uint64_t cached_in = cache_extent_[o.cls];
  const bool other_kept = partial_[o.cls].size() > 1 || (cached_in != at.extent && owned_.find(cached_in) != nullptr);
  if (--o.used == 0 && other_kept) {
    auto& list = partial_[o.cls];
    list.erase(std::remove(list.begin(), list.end(), at.extent), list.end());
    release_extents(at.extent, 1, o.max_gen + 1);
    owned_.erase(at.extent);
  }
  return true;
}

void SharedPool::recheck_released() {
  std::vector<uint64_t> still;
  for (uint64_t offset : released_pending_) {
    BlockRef at;
    ExtentWord w;
    BlockWord bw;
    if (!view_.locate(offset, &at, &w) || w.owner_slot != slot_ || !owned_.find(at.extent)) continue;
    if (!decode_block(view_.load(at.state), offset, view_.salt(), &bw) || bw.state != kBlockReleased) continue;
    if (view_.anyone_holds(offset, bw.generation)) {
      still.push_back(offset);
      continue;
    }
    view_.store(at.state, encode_block({bw.generation, kBlockFree}, offset, view_.salt()));
    try_finish_release(at, bw);
  }
  released_pending_.swap(still);
}

// ---- Handles and leases ------------------------------------------------------------------

namespace {
uint32_t handle_check(const cxlpool_shared_handle_t& h) {
  return crc32c(&h, offsetof(cxlpool_shared_handle_t, check), 0x48414e44u);
}
}  // namespace

cxlpool_shared_handle_t SharedPool::export_block(const void* ptr) {
  Op op(*this);
  Owned* o = nullptr;
  const BlockRef at = own_block(ptr, "cxlpool_shared_export", &o);
  const uint64_t offset = at.offset;
  BlockWord bw;
  if (!decode_block(view_.load(at.state), offset, view_.salt(), &bw))
    fail(CXLPOOL_E_CORRUPT, what_ + ": block state word at offset " + std::to_string(offset) + " fails its check");
  const bool small = o->cls < view_.sb().class_count;
  if (small && (at.block >= o->app.size() || o->app[at.block] == kNotHeld))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_export: the block is not allocated");
  if (bw.state == kBlockAllocated)
    view_.store(at.state, encode_block({bw.generation, kBlockExported}, offset, view_.salt()));
  else if (bw.state != kBlockExported)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_export: the block is not allocated");
  if (small) o->app[at.block] = kHeldExported;
  cxlpool_shared_handle_t h{};
  h.pool_id[0] = view_.sb().pool_id[0];
  h.pool_id[1] = view_.sb().pool_id[1];
  h.offset = offset;
  h.generation = bw.generation;
  h.check = handle_check(h);
  return h;
}

void* SharedPool::import_block(const cxlpool_shared_handle_t& h, size_t* size_out) {
  if (h.check != handle_check(h)) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_import: damaged handle (check)");
  if (h.pool_id[0] != view_.sb().pool_id[0] || h.pool_id[1] != view_.sb().pool_id[1])
    fail(CXLPOOL_E_NOT_FOUND, "cxlpool_shared_import: the handle names another pool than " + what_);
  const Superblock& sb = view_.sb();
  if (h.offset < sb.data_offset || h.offset >= sb.data_offset + sb.extent_count * sb.extent_size ||
      h.offset % kMinBlock != 0)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_import: offset " + std::to_string(h.offset) +
                                         " is outside the pool's blocks or misaligned (forged or damaged handle)");
  Op op(*this);
  // The extent may be given back and formatted anew by another participant while we look:
  // every read of a block's state is bracketed by two reads of its extent's word.
  const uint64_t* extent_word = &view_.extent_entry((h.offset - sb.data_offset) / sb.extent_size)->word;
  const uint64_t extent_raw = view_.load(extent_word);
  BlockRef at;
  ExtentWord w;
  if (!view_.locate(h.offset, &at, &w))
    fail(CXLPOOL_E_STALE, "cxlpool_shared_import: no block starts at offset " + std::to_string(h.offset) + " any more");
  auto state_now = [&](BlockWord* bw) {
    const bool ok = decode_block(view_.load(at.state), h.offset, view_.salt(), bw);
    if (view_.load(extent_word) != extent_raw) return false;  // reformatted under us: stale
    if (!ok)
      fail(CXLPOOL_E_CORRUPT, what_ + ": block state word at offset " + std::to_string(h.offset) + " fails its check");
    return bw->state == kBlockExported && bw->generation == h.generation;
  };
  BlockWord bw;
  auto held = leases_.find(h.offset);
  if (held != leases_.end() && held->second.generation == h.generation) {
    ++held->second.count;  // our lease already keeps it
  } else {
    if (!state_now(&bw)) fail(CXLPOOL_E_STALE, "cxlpool_shared_import: the block was freed or reused");
    if (held != leases_.end())
      fail(CXLPOOL_E_BUSY, "cxlpool_shared_import: an older generation of this block is still imported here");
    lease_insert(h.offset, h.generation);
    PoolView::fence();
    if (!state_now(&bw)) {  // the owner let go meanwhile: it may not have seen our lease
      lease_remove(h.offset, h.generation);
      fail(CXLPOOL_E_STALE, "cxlpool_shared_import: the block was freed while importing");
    }
    leases_[h.offset] = Lease{h.generation, 1};
  }
  if (size_out) *size_out = at.bytes;
  return user_ptr(h.offset);
}

void SharedPool::release(void* ptr) {
  Op op(*this);
  uint64_t offset = 0;
  if (!user_offset(ptr, &offset))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_release: pointer is not in " + what_);
  auto it = leases_.find(offset);
  if (it == leases_.end())
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_release: this participant holds no lease on that block");
  if (--it->second.count > 0) return;
  lease_remove(offset, it->second.generation);
  leases_.erase(it);
}

void SharedPool::lease_insert(uint64_t offset, uint32_t gen) {
  LeaseEntry* table = view_.lease_table(slot_);
  const uint64_t mask = view_.sb().lease_entries - 1;
  for (uint64_t i = 0, h = view_.lease_hash(offset); i <= mask; ++i) {
    LeaseEntry* e = &table[(h + i) & mask];
    const uint64_t off = view_.load(&e->offset);
    if (off != 0 && off != kLeaseTombstone) continue;
    view_.store(&e->gen_check, lease_gen_check(offset, gen, slot_, view_.salt()));
    view_.store(&e->offset, offset);
    return;
  }
  fail(CXLPOOL_E_CAPACITY, what_ + ": lease table full (" + std::to_string(mask + 1) + " blocks imported at once)");
}

void SharedPool::lease_remove(uint64_t offset, uint32_t gen) {
  LeaseEntry* table = view_.lease_table(slot_);
  const uint64_t mask = view_.sb().lease_entries - 1;
  const uint64_t want = lease_gen_check(offset, gen, slot_, view_.salt());
  for (uint64_t i = 0, h = view_.lease_hash(offset); i <= mask; ++i) {
    LeaseEntry* e = &table[(h + i) & mask];
    const uint64_t off = view_.load(&e->offset);
    if (off == 0) return;
    if (off == offset && view_.load(&e->gen_check) == want) {
      view_.store(&e->offset, kLeaseTombstone);
      return;
    }
  }
}

}  // namespace cxlpool::detail::shared

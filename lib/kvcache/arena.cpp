// SPDX-License-Identifier: MIT
// The KV block arena (arena.hpp): blocks, the prefix cache, idle lists and eviction, and the
// export of a sequence's block table (its layout is handoff.hpp's).
#include "kvcache/arena.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "kvcache/handoff.hpp"

namespace cxlpool::detail::kv {

Arena::Arena(const Geometry& g, std::vector<shared::SharedPool*> tiers, const ArenaParams& params)
    : g_(g), tiers_(std::move(tiers)), params_(params) {}

Arena::~Arena() {
  for (auto& [id, b] : blocks_) {
    if (!b.data || !tiers_[size_t(b.tier)]) continue;  // its pool was closed: nothing to free
    try {
      tiers_[size_t(b.tier)]->free(b.data);
    } catch (...) {  // a failed or evicted pool: its memory is not ours to free any more
    }
  }
}

void Arena::pool_gone(const shared::SharedPool* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t] != p) continue;
    tiers_[t] = nullptr;
    for (auto& [id, b] : blocks_) {
      if (b.tier != int(t) || !b.data) continue;
      if (b.is_idle) idle_[t].erase(b.idle);
      b.is_idle = false;
      if (b.cached) {
        auto it = prefix_.find(b.hash);
        if (it != prefix_.end() && it->second == id) prefix_.erase(it);
        b.cached = false;
      }
      b.data = nullptr;
    }
    count_[t] = 0;
    for (Sequence* s : seqs_)
      s->exports.erase(
          std::remove_if(s->exports.begin(), s->exports.end(), [&](const Sequence::Export& e) { return e.pool == p; }),
          s->exports.end());
  }
  // Blocks of the gone pool that nobody holds any more are dropped now.
  for (auto it = blocks_.begin(); it != blocks_.end();)
    it = !it->second.data && it->second.refs == 0 ? blocks_.erase(it) : std::next(it);
}

Sequence* Arena::create_sequence() {
  std::lock_guard<std::mutex> lock(mu_);
  auto* s = new Sequence;
  s->arena = this;
  try {
    seqs_.insert(s);
  } catch (...) {
    delete s;
    throw;
  }
  ++stats_.sequences;
  return s;
}

bool Arena::owns(const Sequence* s) {
  std::lock_guard<std::mutex> lock(mu_);
  return seqs_.count(const_cast<Sequence*>(s)) != 0;
}

size_t Arena::sequences() {
  std::lock_guard<std::mutex> lock(mu_);
  return seqs_.size();
}

void Arena::destroy_sequence(Sequence* s) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  withdraw_exports(s);
  for (uint32_t id : s->blocks) drop(id);
  seqs_.erase(s);
  --stats_.sequences;
  delete s;
}

void* Arena::try_alloc(int tier) {
  if (!tiers_[size_t(tier)]) return nullptr;  // closed
  if (params_.max_blocks[tier] && count_[tier] >= params_.max_blocks[tier]) return nullptr;
  try {
    return tiers_[size_t(tier)]->alloc(g_.block_bytes);
  } catch (const Failure& f) {
    if (f.status() == CXLPOOL_E_CAPACITY) return nullptr;
    throw;
  }
}

void* Arena::alloc_in(int tier, bool may_evict) {
  for (;;) {
    if (void* p = try_alloc(tier)) return p;
    if (!may_evict || idle_[tier].empty()) return nullptr;
    demote_oldest(tier);
  }
}

bool Arena::demote_oldest(int tier) {
  const uint32_t id = idle_[tier].front();
  if (tier + 1 < int(tiers_.size())) {
    if (void* dst = alloc_in(tier + 1, true)) {
      move_block(id, tier + 1, dst);
      ++stats_.demotions;
      return true;
    }
  }
  free_block(id);
  ++stats_.evictions;
  return true;
}

void Arena::move_block(uint32_t id, int to, void* dst) {
  Block& b = blocks_.at(id);  // a block with data: only live pools' blocks are idle
  std::memcpy(dst, b.data, g_.block_bytes);
  try {
    tiers_[size_t(b.tier)]->free(b.data);  // importers holding a lease keep the old copy
  } catch (...) {
  }
  --count_[b.tier];
  ++count_[to];
  if (b.is_idle) {
    idle_[b.tier].erase(b.idle);
    // Idle lists stay in order of last use: the block keeps its age in the farther tier.
    auto at = idle_[to].begin();
    while (at != idle_[to].end() && blocks_.at(*at).used <= b.used) ++at;
    b.idle = idle_[to].insert(at, id);
  }
  b.data = dst;
  b.tier = to;
}

void Arena::free_block(uint32_t id) noexcept {
  auto it = blocks_.find(id);
  if (it == blocks_.end()) return;
  Block& b = it->second;
  if (b.data && tiers_[size_t(b.tier)]) {
    try {
      tiers_[size_t(b.tier)]->free(b.data);
    } catch (...) {
    }
  }
  if (!b.data) {  // its pool was closed: nothing of it is in the lists or the counts
    blocks_.erase(it);
    return;
  }
  if (b.is_idle) idle_[b.tier].erase(b.idle);
  if (b.cached) {
    auto p = prefix_.find(b.hash);
    if (p != prefix_.end() && p->second == id) prefix_.erase(p);
  }
  --count_[b.tier];
  blocks_.erase(it);
}

void Arena::hold(uint32_t id) {
  Block& b = blocks_.at(id);
  if (b.is_idle) {
    idle_[b.tier].erase(b.idle);
    b.is_idle = false;
  }
  ++b.refs;
  b.used = ++clock_;
}

void Arena::drop(uint32_t id) noexcept {
  Block& b = blocks_.at(id);
  if (--b.refs > 0) return;
  if (!b.cached) {
    free_block(id);
    return;
  }
  b.used = ++clock_;
  try {
    b.idle = idle_[b.tier].insert(idle_[b.tier].end(), id);
    b.is_idle = true;
  } catch (...) {
    free_block(id);  // no room to remember it: it is not kept
  }
}

size_t Arena::held_blocks() const noexcept {
  size_t n = 0;
  for (const auto& [id, b] : blocks_) n += b.refs > 0;
  return n;
}

uint32_t Arena::new_block() {
  for (int t = 0; t < int(tiers_.size()); ++t) {
    void* p = alloc_in(t, true);
    if (!p) continue;
    const uint32_t id = next_id_++;
    try {
      Block& b = blocks_[id];
      b.data = p;
      b.tier = t;
      b.refs = 1;
      b.used = ++clock_;
    } catch (...) {
      tiers_[size_t(t)]->free(p);
      throw;
    }
    ++count_[t];
    return id;
  }
  fail(CXLPOOL_E_CAPACITY, "cxlpool_kv_seq_append: no pool of the arena has room for a block of " +
                               std::to_string(g_.block_bytes) + " bytes, and no cached block is idle to make room (" +
                               std::to_string(blocks_.size()) + " blocks held by sequences)");
}

void Arena::promote_if_room(uint32_t id) {
  Block& b = blocks_.at(id);
  for (int t = 0; t < b.tier; ++t)
    if (void* dst = try_alloc(t)) {
      move_block(id, t, dst);
      ++stats_.promotions;
      return;
    }
}

size_t Arena::append(Sequence* s, const int32_t* tokens, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t T = g_.c.tokens_per_block;
  const uint64_t old = s->ids.size();
  if (n >= (uint64_t(1) << 32) || old + n >= (uint64_t(1) << 32))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_append: a sequence holds fewer than 2^32 tokens (" +
                                         std::to_string(old) + " now, " + std::to_string(n) + " more asked)");
  const uint64_t total = old + n;
  const size_t old_blocks = s->blocks.size(), old_hashes = s->hashes.size();
  // In place, undone on failure: the sequence is unchanged unless the whole call succeeds.
  bool own = s->own_block;
  size_t reused = 0, hits = 0, misses = 0;
  try {
    s->ids.insert(s->ids.end(), tokens, tokens + n);
    // A partial last block that becomes whole gets its hash now.
    for (uint64_t b = s->hashes.size(); b < old_blocks && (b + 1) * T <= total; ++b)
      s->hashes.push_back(chain_hash(b ? s->hashes[b - 1] : Hash128{}, s->ids.data() + b * T, T));
    const uint64_t need = (total + T - 1) / T;
    for (uint64_t b = old_blocks; b < need; ++b) {
      const bool whole = (b + 1) * T <= total;
      Hash128 h{};
      if (whole) {
        h = chain_hash(b ? s->hashes[b - 1] : Hash128{}, s->ids.data() + b * T, T);
        s->hashes.push_back(h);
      }
      if (whole && !own && params_.prefix_caching) {
        auto it = prefix_.find(h);
        if (it != prefix_.end()) {
          Block& c = blocks_.at(it->second);
          // Exact: the same tokens after the very same block (the prefix is all shared so far,
          // so by induction the whole prefix is the same), never the hash alone.
          const uint32_t parent = b ? s->blocks.back() : 0;
          if (c.data && c.parent == parent &&
              std::equal(c.tokens.begin(), c.tokens.end(), s->ids.begin() + ptrdiff_t(b * T))) {
            tiers_[size_t(c.tier)]->check_usable();  // a pointer into the pool is handed out
            const bool was_idle = c.refs == 0;
            hold(it->second);
            s->blocks.push_back(it->second);
            if (was_idle && c.tier > 0) promote_if_room(it->second);
            reused += size_t(T);  // a whole block past the old end: all of it is this call's
            ++hits;
            continue;
          }
        }
      }
      s->blocks.push_back(new_block());
      own = true;
      misses += whole;
    }
  } catch (...) {
    for (size_t i = old_blocks; i < s->blocks.size(); ++i) drop(s->blocks[i]);
    s->blocks.resize(old_blocks);
    s->hashes.resize(old_hashes);
    s->ids.resize(old);
    throw;
  }
  s->own_block = own;
  s->shared += hits;
  stats_.prefix_hits += hits;
  stats_.prefix_misses += misses;
  return reused;
}

void Arena::seal(Sequence* s, uint64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tokens > s->ids.size())
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_seal: " + std::to_string(tokens) +
                                         " tokens, but the sequence has " + std::to_string(s->ids.size()));
  s->sealed = std::max(s->sealed, tokens);
  if (!params_.prefix_caching) return;
  const uint64_t T = g_.c.tokens_per_block;
  // Only the blocks sealed since the last call (each block is offered to the cache once).
  for (uint64_t b = s->sealed_blocks; (b + 1) * T <= s->sealed; ++b) {
    s->sealed_blocks = b + 1;
    Block& blk = blocks_.at(s->blocks[b]);
    if (blk.cached || !blk.data || prefix_.count(s->hashes[b])) continue;
    blk.tokens.assign(s->ids.begin() + ptrdiff_t(b * T), s->ids.begin() + ptrdiff_t((b + 1) * T));
    blk.hash = s->hashes[b];
    blk.parent = b ? s->blocks[b - 1] : 0;
    prefix_.emplace(blk.hash, s->blocks[b]);
    blk.cached = true;
  }
}

void* Arena::block(Sequence* s, uint64_t index, uint32_t* tier) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index >= s->blocks.size())
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_block: index " + std::to_string(index) + " of " +
                                         std::to_string(s->blocks.size()) + " blocks");
  const Block& b = blocks_.at(s->blocks[index]);
  if (!b.data) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_block: the block's pool was closed");
  tiers_[size_t(b.tier)]->check_usable();  // EVICTED or DEVICE_FAILED: the memory is not ours to hand out
  if (tier) *tier = uint32_t(b.tier);
  return b.data;
}

cxlpool_kv_seq_info_t Arena::info(Sequence* s) {
  std::lock_guard<std::mutex> lock(mu_);
  cxlpool_kv_seq_info_t i{};
  i.tokens = s->ids.size();
  i.blocks = s->blocks.size();
  i.sealed_tokens = s->sealed;
  i.shared_blocks = s->shared;
  return i;
}

void Arena::withdraw_exports(Sequence* s) noexcept {
  for (const Sequence::Export& e : s->exports) {
    try {
      e.pool->free(e.table);
    } catch (...) {
    }
  }
  s->exports.clear();
}

cxlpool_kv_handle_t Arena::export_sequence(Sequence* s, uint64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tokens == 0) tokens = s->ids.size();
  if (tokens == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_export: the sequence has no tokens");
  if (tokens > s->sealed)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_export: " + std::to_string(tokens) + " tokens, but only " +
                                         std::to_string(s->sealed) + " are sealed (cxlpool_kv_seq_seal)");
  // The same tokens exported again: the same table (handles given out before stay valid).
  for (const Sequence::Export& e : s->exports)
    if (e.tokens == tokens) return e.handle;
  const uint64_t T = g_.c.tokens_per_block;
  const uint64_t n = (tokens + T - 1) / T;
  std::vector<cxlpool_shared_handle_t> handles(n);
  for (uint64_t i = 0; i < n; ++i) {
    const Block& b = blocks_.at(s->blocks[i]);
    if (!b.data)
      fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_seq_export: block " + std::to_string(i) + "'s pool was closed");
    handles[i] = tiers_[size_t(b.tier)]->export_block(b.data);
  }
  TableHeader h = make_table_header(g_, tokens, n, handles.data());
  const size_t bytes = sizeof h + n * sizeof(cxlpool_shared_handle_t);
  // The table goes to the nearest pool with room, idle cached blocks making room as for blocks.
  void* table = nullptr;
  shared::SharedPool* pool = nullptr;
  for (int t = 0; t < int(tiers_.size()) && !table; ++t) {
    if (!tiers_[size_t(t)]) continue;
    for (;;) {
      try {
        table = tiers_[size_t(t)]->alloc(bytes);
        pool = tiers_[size_t(t)];
        break;
      } catch (const Failure& f) {
        if (f.status() != CXLPOOL_E_CAPACITY) throw;
      }
      if (idle_[t].empty()) break;
      demote_oldest(t);
    }
  }
  if (!table)
    fail(CXLPOOL_E_CAPACITY, "cxlpool_kv_seq_export: no pool has room for a block table of " + std::to_string(bytes) +
                                 " bytes, and no cached block is idle to make room");
  cxlpool_kv_handle_t out{};
  try {
    std::memcpy(table, &h, sizeof h);
    std::memcpy(static_cast<char*>(table) + sizeof h, handles.data(), n * sizeof(cxlpool_shared_handle_t));
    for (uint64_t i = 0; i < n; ++i) {
      const Block& b = blocks_.at(s->blocks[i]);
      tiers_[size_t(b.tier)]->publish(b.data, g_.block_bytes);
    }
    pool->publish(table, bytes);
    out.descriptor = pool->export_block(table);
  } catch (...) {
    pool->free(table);
    throw;
  }
  out.tokens = tokens;
  out.blocks = uint32_t(n);
  out.check = handle_check(out);
  try {
    s->exports.push_back(Sequence::Export{tokens, pool, table, out});
  } catch (...) {
    pool->free(table);
    throw;
  }
  ++stats_.exports;
  return out;
}

cxlpool_kv_stats_t Arena::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  cxlpool_kv_stats_t out = stats_;
  for (int t = 0; t < kMaxTiers; ++t) out.blocks[t] = count_[t];
  out.cached_blocks = prefix_.size();
  out.idle_blocks = 0;
  for (const auto& l : idle_) out.idle_blocks += l.size();
  return out;
}

}  // namespace cxlpool::detail::kv

// SPDX-License-Identifier: MIT
// The KV block arena: fixed-size blocks of one geometry in up to four shared pools (tiers,
// nearest first), sequences with block tables, the prefix cache (a block is named by its
// tokens after its prefix: chain_hash, checked exactly on every hit), LRU eviction of idle
// cached blocks from a tier to the next farther one and out of the farthest, promotion of a
// far hit into a nearer tier with room, and export of a sequence's block table for import by
// another process (handoff.hpp). One mutex per arena; the pools' own locks are taken inside it.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cxlpool/kvcache.h"
#include "kvcache/geometry.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::kv {

constexpr int kMaxTiers = 4;

struct ArenaParams {
  uint64_t max_blocks[kMaxTiers] = {};  // 0: the pool's capacity only
  bool prefix_caching = true;
};

class Arena;

struct Sequence {
  Arena* arena = nullptr;
  std::vector<uint32_t> blocks;  // block ids, in order
  std::vector<int32_t> ids;      // every token id so far (the cache's keys)
  std::vector<Hash128> hashes;   // chain hash of each whole block
  uint64_t sealed = 0, shared = 0;
  uint64_t sealed_blocks = 0;  // blocks [0, sealed_blocks) were offered to the prefix cache
  bool own_block = false;      // a block of its own past the start: no more prefix reuse
  // Exports: block tables in a pool, one per token count exported (withdrawn with the
  // sequence).
  struct Export {
    uint64_t tokens;
    shared::SharedPool* pool;
    void* table;
    cxlpool_kv_handle_t handle;
  };
  std::vector<Export> exports;
};

class Arena {
 public:
  Arena(const Geometry& g, std::vector<shared::SharedPool*> tiers, const ArenaParams& params);
  ~Arena();  // frees every block (no sequence may be left: the C ABI checks)
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  const Geometry& geometry() const { return g_; }
  Sequence* create_sequence();
  void destroy_sequence(Sequence* s) noexcept;
  size_t sequences();
  // cxlpool_kv_seq_append: returns the leading tokens of this call that were found cached.
  size_t append(Sequence* s, const int32_t* tokens, size_t n);
  void seal(Sequence* s, uint64_t tokens);
  void* block(Sequence* s, uint64_t index, uint32_t* tier);
  cxlpool_kv_seq_info_t info(Sequence* s);
  cxlpool_kv_handle_t export_sequence(Sequence* s, uint64_t tokens);
  cxlpool_kv_stats_t stats();
  bool owns(const Sequence* s);
  // Pool `p` of the arena was closed (its memory and its blocks went with it): its blocks are
  // forgotten, never touched again; sequences holding them fail on them (INVALID_ARGUMENT).
  void pool_gone(const shared::SharedPool* p) noexcept;

 private:
  struct Block {
    void* data = nullptr;  // nullptr: its pool was closed (pool_gone)
    int tier = 0;
    uint32_t refs = 0;
    bool cached = false;  // in prefix_
    Hash128 hash;
    uint32_t parent = 0;          // when cached: the block before it (0: first of its prompt)
    std::vector<int32_t> tokens;  // when cached: exact hit check
    std::list<uint32_t>::iterator idle;
    bool is_idle = false;  // cached and held by no sequence: in idle_[tier]
    uint64_t used = 0;     // the arena's clock at its last hold or drop (LRU order)
  };

  void* try_alloc(int tier);                 // nullptr when full (or at its block limit)
  void* alloc_in(int tier, bool may_evict);  // may demote/evict idle blocks of that tier
  uint32_t new_block();                      // nearest tier with room; CAPACITY otherwise
  bool demote_oldest(int tier);              // one idle block of tier: farther, or out
  void move_block(uint32_t id, int to, void* dst);
  void free_block(uint32_t id) noexcept;
  void hold(uint32_t id);
  void drop(uint32_t id) noexcept;
  void withdraw_exports(Sequence* s) noexcept;
  size_t held_blocks() const noexcept;
  void promote_if_room(uint32_t id);

  std::mutex mu_;
  Geometry g_;
  std::vector<shared::SharedPool*> tiers_;  // nullptr once pool_gone()
  ArenaParams params_;
  std::unordered_map<uint32_t, Block> blocks_;
  uint32_t next_id_ = 1;
  uint64_t clock_ = 0;
  std::unordered_map<Hash128, uint32_t, Hash128Hasher> prefix_;
  std::list<uint32_t> idle_[kMaxTiers];  // least recently used first
  uint64_t count_[kMaxTiers] = {};
  std::unordered_set<Sequence*> seqs_;
  cxlpool_kv_stats_t stats_{};
};

}  // namespace cxlpool::detail::kv

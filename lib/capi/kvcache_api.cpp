// SPDX-License-Identifier: MIT
// C ABI for the KV cache (include/cxlpool/kvcache.h): geometry, arenas, sequences, export and
// import. Handles carry a magic word so a foreign or destroyed one is refused, not followed.
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/shared_handle.hpp"
#include "cxlpool/kvcache.h"
#include "kvcache/arena.hpp"
#include "kvcache/handoff.hpp"

using namespace cxlpool::detail;

// Every handle is a small shell with a magic word. Destroyed shells are kept, marked dead, in
// a bounded quarantine instead of being freed: a second destroy, or a call on a destroyed
// handle, is refused with a status instead of reaching freed memory or, its address reused,
// another object (as shared pool handles are).
using PoolPair = std::pair<cxlpool_shared_pool_t*, shared::SharedPool*>;  // shell, and the pool it had

struct cxlpool_kv_params {
  static constexpr uint64_t kLive = 0x534d524150564b31ull;
  uint64_t magic = kLive;
  kv::ArenaParams p;
};

struct cxlpool_kv_arena {
  static constexpr uint64_t kLive = 0x414e455241564b31ull;  // "1KVARENA"
  uint64_t magic = kLive;
  std::unique_ptr<kv::Arena> arena;
  std::vector<PoolPair> pools;
};

struct cxlpool_kv_seq {
  static constexpr uint64_t kLive = 0x514553564b4c5831ull;
  uint64_t magic = kLive;
  cxlpool_kv_arena_t* arena = nullptr;
  kv::Sequence* seq = nullptr;
};

struct cxlpool_kv_view {
  static constexpr uint64_t kLive = 0x5745495656584b31ull;
  uint64_t magic = kLive;
  std::unique_ptr<kv::View> view;
  std::vector<PoolPair> pools;
};

namespace {

constexpr size_t kQuarantine = 1024;
std::mutex g_quarantine_mu;

template <class Shell>
std::deque<Shell*>* quarantine() noexcept {
  static std::deque<Shell*>* retired = new (std::nothrow) std::deque<Shell*>;  // never destroyed
  return retired;
}

template <class Shell>
void retire(Shell* shell) noexcept {
  shell->magic = 0;
  std::lock_guard<std::mutex> lock(g_quarantine_mu);
  std::deque<Shell*>* retired = quarantine<Shell>();
  if (!retired) return;  // no room to remember it: leaked rather than freed under a stale pointer
  try {
    retired->push_back(shell);
  } catch (...) {
    return;
  }
  if (retired->size() > kQuarantine) {
    delete retired->front();
    retired->pop_front();
  }
}

// Pools closed since the last call: the arena (or view) forgets their blocks (their memory
// went with the close) before anything else touches them.
template <class Owner>
void forget_closed_pools(std::vector<PoolPair>& pools, Owner& owner) noexcept {
  for (PoolPair& pp : pools)
    if (pp.second && shared_pool_if_open(pp.first) != pp.second) {
      owner.pool_gone(pp.second);
      pp.second = nullptr;
    }
}

kv::Arena& arena_of(cxlpool_kv_arena_t* a, const char* who) {
  require(a != nullptr && a->magic == cxlpool_kv_arena::kLive && a->arena, who, "not a live KV arena");
  forget_closed_pools(a->pools, *a->arena);
  return *a->arena;
}
kv::Sequence* seq_of(cxlpool_kv_seq_t* s, const char* who) {
  require(s != nullptr && s->magic == cxlpool_kv_seq::kLive && s->seq, who, "not a live KV sequence");
  arena_of(s->arena, who);
  return s->seq;
}
kv::View& view_of(cxlpool_kv_view_t* v, const char* who) {
  require(v != nullptr && v->magic == cxlpool_kv_view::kLive && v->view, who, "not a live KV view");
  forget_closed_pools(v->pools, *v->view);
  return *v->view;
}
cxlpool_kv_params* params_of(cxlpool_kv_params_t* p, const char* who) {
  require(p != nullptr && p->magic == cxlpool_kv_params::kLive, who, "not live KV parameters");
  return p;
}
std::vector<PoolPair> pairs_of(cxlpool_shared_pool_t* const* pools, const std::vector<shared::SharedPool*>& list) {
  std::vector<PoolPair> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back({pools[i], list[i]});
  return out;
}
std::vector<shared::SharedPool*> pools_of(cxlpool_shared_pool_t* const* pools, size_t n, const char* who) {
  require(pools != nullptr && n > 0, who, "no pools");
  require(n <= size_t(kv::kMaxTiers), who, "at most 4 pools");
  std::vector<shared::SharedPool*> out;
  for (size_t i = 0; i < n; ++i) {
    shared::SharedPool* p = shared_pool_of(pools[i], who);
    for (shared::SharedPool* q : out) require(q != p, who, "a pool is given twice");
    out.push_back(p);
  }
  return out;
}

}  // namespace

extern "C" {

cxlpool_status_t cxlpool_kv_geometry_preset(const char* model, uint32_t tokens_per_block, cxlpool_kv_geometry_t* out) {
  return guarded([&] {
    require(model != nullptr, "cxlpool_kv_geometry_preset", "model is NULL");
    require(out != nullptr, "cxlpool_kv_geometry_preset", "out is NULL");
    cxlpool_kv_geometry_t g = kv::preset(model, tokens_per_block);
    kv::make_geometry(g, "cxlpool_kv_geometry_preset");
    *out = g;
  });
}

cxlpool_status_t cxlpool_kv_geometry_sizes(const cxlpool_kv_geometry_t* geometry, uint64_t* bytes_per_token,
                                           uint64_t* bytes_per_block) {
  return guarded([&] {
    require(geometry != nullptr, "cxlpool_kv_geometry_sizes", "geometry is NULL");
    const kv::Geometry g = kv::make_geometry(*geometry, "cxlpool_kv_geometry_sizes");
    if (bytes_per_token) *bytes_per_token = g.bytes_per_token;
    if (bytes_per_block) *bytes_per_block = g.block_bytes;
  });
}

cxlpool_status_t cxlpool_kv_block_offset(const cxlpool_kv_geometry_t* geometry, uint32_t layer, uint32_t kv,
                                         uint32_t token, uint64_t* offset) {
  return guarded([&] {
    constexpr const char* kWho = "cxlpool_kv_block_offset";
    require(geometry != nullptr && offset != nullptr, kWho, "geometry or offset is NULL");
    const kv::Geometry g = kv::make_geometry(*geometry, kWho);
    require(layer < g.c.layers, kWho, "layer " + std::to_string(layer) + " of " + std::to_string(g.c.layers));
    require(kv <= 1, kWho, "kv is 0 (keys) or 1 (values)");
    require(token < g.c.tokens_per_block, kWho,
            "token " + std::to_string(token) + " of a block of " + std::to_string(g.c.tokens_per_block));
    *offset = ((uint64_t(layer) * 2 + kv) * g.c.tokens_per_block + token) * g.row_bytes;
  });
}

cxlpool_status_t cxlpool_kv_params_create(cxlpool_kv_params_t** out) {
  return guarded([&] {
    require(out != nullptr, "cxlpool_kv_params_create", "out is NULL");
    *out = new cxlpool_kv_params{};
  });
}

void cxlpool_kv_params_destroy(cxlpool_kv_params_t* params) {
  if (params && params->magic == cxlpool_kv_params::kLive) retire(params);
}

cxlpool_status_t cxlpool_kv_params_set_max_blocks(cxlpool_kv_params_t* params, uint32_t tier, uint64_t blocks) {
  return guarded([&] {
    cxlpool_kv_params* p = params_of(params, "cxlpool_kv_params_set_max_blocks");
    require(tier < uint32_t(kv::kMaxTiers), "cxlpool_kv_params_set_max_blocks", "tier is 0..3");
    p->p.max_blocks[tier] = blocks;
  });
}

cxlpool_status_t cxlpool_kv_params_set_prefix_caching(cxlpool_kv_params_t* params, int enabled) {
  return guarded([&] { params_of(params, "cxlpool_kv_params_set_prefix_caching")->p.prefix_caching = enabled != 0; });
}

cxlpool_status_t cxlpool_kv_arena_create(const cxlpool_kv_geometry_t* geometry, cxlpool_shared_pool_t* const* pools,
                                         size_t npools, const cxlpool_kv_params_t* params, cxlpool_kv_arena_t** out) {
  return guarded([&] {
    constexpr const char* kWho = "cxlpool_kv_arena_create";
    require(geometry != nullptr && out != nullptr, kWho, "geometry or out is NULL");
    const kv::Geometry g = kv::make_geometry(*geometry, kWho);
    std::vector<shared::SharedPool*> tiers = pools_of(pools, npools, kWho);
    const kv::ArenaParams ap =
        params ? params_of(const_cast<cxlpool_kv_params_t*>(params), kWho)->p : kv::ArenaParams{};
    auto a = std::make_unique<cxlpool_kv_arena>();
    a->pools = pairs_of(pools, tiers);
    a->arena = std::make_unique<kv::Arena>(g, std::move(tiers), ap);
    *out = a.release();
  });
}

cxlpool_status_t cxlpool_kv_arena_destroy(cxlpool_kv_arena_t* arena) {
  return guarded([&] {
    kv::Arena& a = arena_of(arena, "cxlpool_kv_arena_destroy");
    if (size_t n = a.sequences())
      fail(CXLPOOL_E_BUSY, "cxlpool_kv_arena_destroy: " + std::to_string(n) + " sequences of the arena are alive");
    arena->arena.reset();
    retire(arena);
  });
}

cxlpool_status_t cxlpool_kv_arena_stats(cxlpool_kv_arena_t* arena, cxlpool_kv_stats_t* out) {
  return guarded([&] {
    kv::Arena& a = arena_of(arena, "cxlpool_kv_arena_stats");
    require(out != nullptr, "cxlpool_kv_arena_stats", "out is NULL");
    *out = a.stats();
  });
}

cxlpool_status_t cxlpool_kv_seq_create(cxlpool_kv_arena_t* arena, cxlpool_kv_seq_t** out) {
  return guarded([&] {
    kv::Arena& a = arena_of(arena, "cxlpool_kv_seq_create");
    require(out != nullptr, "cxlpool_kv_seq_create", "out is NULL");
    auto s = std::make_unique<cxlpool_kv_seq>();
    s->arena = arena;
    s->seq = a.create_sequence();
    *out = s.release();
  });
}

cxlpool_status_t cxlpool_kv_seq_destroy(cxlpool_kv_seq_t* seq) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_destroy");
    s->arena->destroy_sequence(s);
    seq->seq = nullptr;
    retire(seq);
  });
}

cxlpool_status_t cxlpool_kv_seq_append(cxlpool_kv_seq_t* seq, const int32_t* tokens, size_t n, size_t* reused) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_append");
    require(tokens != nullptr || n == 0, "cxlpool_kv_seq_append", "tokens is NULL");
    const size_t r = n ? s->arena->append(s, tokens, n) : 0;
    if (reused) *reused = r;
  });
}

cxlpool_status_t cxlpool_kv_seq_seal(cxlpool_kv_seq_t* seq, uint64_t tokens) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_seal");
    s->arena->seal(s, tokens);
  });
}

cxlpool_status_t cxlpool_kv_seq_info(cxlpool_kv_seq_t* seq, cxlpool_kv_seq_info_t* out) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_info");
    require(out != nullptr, "cxlpool_kv_seq_info", "out is NULL");
    *out = s->arena->info(s);
  });
}

cxlpool_status_t cxlpool_kv_seq_block(cxlpool_kv_seq_t* seq, uint64_t index, void** data, uint32_t* tier) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_block");
    require(data != nullptr, "cxlpool_kv_seq_block", "data is NULL");
    uint32_t t = 0;
    void* p = s->arena->block(s, index, &t);
    *data = p;
    if (tier) *tier = t;
  });
}

cxlpool_status_t cxlpool_kv_seq_export(cxlpool_kv_seq_t* seq, uint64_t tokens, cxlpool_kv_handle_t* out) {
  return guarded([&] {
    kv::Sequence* s = seq_of(seq, "cxlpool_kv_seq_export");
    require(out != nullptr, "cxlpool_kv_seq_export", "out is NULL");
    *out = s->arena->export_sequence(s, tokens);
  });
}

cxlpool_status_t cxlpool_kv_import(cxlpool_shared_pool_t* const* pools, size_t npools,
                                   const cxlpool_kv_geometry_t* expected, const cxlpool_kv_handle_t* handle,
                                   cxlpool_kv_view_t** out) {
  return guarded([&] {
    constexpr const char* kWho = "cxlpool_kv_import";
    require(handle != nullptr && out != nullptr, kWho, "handle or out is NULL");
    std::vector<shared::SharedPool*> list = pools_of(pools, npools, kWho);
    auto v = std::make_unique<cxlpool_kv_view>();
    v->pools = pairs_of(pools, list);
    v->view = std::make_unique<kv::View>(list, expected, *handle);
    *out = v.release();
  });
}

cxlpool_status_t cxlpool_kv_view_info(const cxlpool_kv_view_t* view, cxlpool_kv_view_info_t* out) {
  return guarded([&] {
    const kv::View& v = view_of(const_cast<cxlpool_kv_view_t*>(view), "cxlpool_kv_view_info");
    require(out != nullptr, "cxlpool_kv_view_info", "out is NULL");
    cxlpool_kv_view_info_t i{};
    i.geometry = v.geometry().c;
    i.tokens = v.tokens();
    i.blocks = v.blocks();
    i.bytes_per_block = v.geometry().block_bytes;
    *out = i;
  });
}

cxlpool_status_t cxlpool_kv_view_block(const cxlpool_kv_view_t* view, uint64_t index, const void** data) {
  return guarded([&] {
    const kv::View& v = view_of(const_cast<cxlpool_kv_view_t*>(view), "cxlpool_kv_view_block");
    require(data != nullptr, "cxlpool_kv_view_block", "data is NULL");
    require(index < v.blocks(), "cxlpool_kv_view_block",
            "index " + std::to_string(index) + " of " + std::to_string(v.blocks()) + " blocks");
    *data = v.block(size_t(index));
  });
}

cxlpool_status_t cxlpool_kv_view_create(cxlpool_shared_pool_t* const* pools, size_t npools,
                                        const cxlpool_kv_geometry_t* geometry, uint64_t tokens,
                                        cxlpool_kv_view_t** out) {
  return guarded([&] {
    constexpr const char* kWho = "cxlpool_kv_view_create";
    require(geometry != nullptr && out != nullptr, kWho, "geometry or out is NULL");
    std::vector<shared::SharedPool*> list = pools_of(pools, npools, kWho);
    auto v = std::make_unique<cxlpool_kv_view>();
    v->pools = pairs_of(pools, list);
    v->view = std::make_unique<kv::View>(list, *geometry, tokens);
    *out = v.release();
  });
}

cxlpool_status_t cxlpool_kv_view_block_writable(cxlpool_kv_view_t* view, uint64_t index, void** data) {
  return guarded([&] {
    const kv::View& v = view_of(view, "cxlpool_kv_view_block_writable");
    require(data != nullptr, "cxlpool_kv_view_block_writable", "data is NULL");
    require(index < v.blocks(), "cxlpool_kv_view_block_writable",
            "index " + std::to_string(index) + " of " + std::to_string(v.blocks()) + " blocks");
    *data = v.block_writable(size_t(index));
  });
}

cxlpool_status_t cxlpool_kv_view_release(cxlpool_kv_view_t* view) {
  return guarded([&] {
    view_of(view, "cxlpool_kv_view_release");
    view->view.reset();
    retire(view);
  });
}

}  // extern "C"

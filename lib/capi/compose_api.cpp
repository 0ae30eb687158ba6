// SPDX-License-Identifier: MIT
// C ABI for composition (include/cxlpool/compose.h): grants of a shared pool's quotas.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "capi/capi_guard.hpp"
#include "capi/shared_handle.hpp"
#include "common/error.hpp"
#include "cxlpool/compose.h"

using namespace cxlpool::detail;

cxlpool_status_t cxlpool_compose_get_state(cxlpool_shared_pool_t* pool, uint32_t wait_ms,
                                           cxlpool_compose_state_t* out) {
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_get_state");
    require(out != nullptr, "cxlpool_compose_get_state", "out is NULL");
    const shared::SharedPool::ComposeState st = p->compose_state(wait_ms);
    cxlpool_compose_state_t r{};
    r.extents_total = st.extents;
    r.extent_size = st.extent_size;
    r.extents_unassigned = st.unassigned;
    r.extents_over_grant = st.over_grant;
    r.overcommitted = st.overcommitted;
    r.quota_count = static_cast<uint32_t>(std::min<size_t>(st.quotas.size(), 16));
    for (uint32_t q = 0; q < r.quota_count; ++q) {
      const auto& s = st.quotas[q];
      auto& d = r.quotas[q];
      std::memcpy(d.name, s.name.data(), std::min(s.name.size(), sizeof d.name - 1));
      d.reserved_extents = s.reserved;
      d.granted_extents = s.granted;
      d.used_extents = s.used;
      d.grant_set = s.grant_set;
      d.grant_damaged = s.grant_damaged;
      d.demand_extents = s.demand;
      d.min_extents = s.policy.min_extents;
      d.max_extents = s.policy.max_extents;
      d.priority = s.policy.priority;
      d.policy_damaged = s.policy_damaged;
      d.locked = s.locked;
      d.key_damaged = s.key_damaged;
    }
    *out = r;
  });
}

cxlpool_status_t cxlpool_compose_grant(cxlpool_shared_pool_t* pool, const char* quota, uint64_t extents,
                                       uint32_t wait_ms) {
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_grant");
    require(quota != nullptr, "cxlpool_compose_grant", "quota is NULL");
    p->compose_grant(quota, extents, wait_ms);
  });
}

cxlpool_status_t cxlpool_compose_lock_quota(cxlpool_shared_pool_t* pool, const char* quota, uint32_t wait_ms,
                                            char key[CXLPOOL_QUOTA_KEY_SIZE]) {
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_lock_quota");
    require(quota != nullptr, "cxlpool_compose_lock_quota", "quota is NULL");
    require(key != nullptr, "cxlpool_compose_lock_quota", "key is NULL");
    const std::string text = p->compose_lock(quota, wait_ms);
    std::memcpy(key, text.c_str(), text.size() + 1);
  });
}

cxlpool_status_t cxlpool_compose_unlock_quota(cxlpool_shared_pool_t* pool, const char* quota, uint32_t wait_ms) {
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_unlock_quota");
    require(quota != nullptr, "cxlpool_compose_unlock_quota", "quota is NULL");
    p->compose_unlock(quota, wait_ms);
  });
}

cxlpool_status_t cxlpool_compose_reset_keys(const char* device, uint32_t* unlocked) {
  if (unlocked) *unlocked = 0;
  return guarded([&] {
    require(device != nullptr, "cxlpool_compose_reset_keys", "device is NULL");
    const uint32_t n = shared::reset_quota_keys(device);
    if (unlocked) *unlocked = n;
  });
}

cxlpool_status_t cxlpool_compose_reclaim(cxlpool_shared_pool_t* pool, const char* quota, uint64_t extents,
                                         uint32_t deadline_ms, uint32_t wait_ms, uint64_t* reclaimed) {
  if (reclaimed) *reclaimed = 0;
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_reclaim");
    require(quota != nullptr, "cxlpool_compose_reclaim", "quota is NULL");
    const shared::SharedPool::ReclaimResult r = p->compose_reclaim(quota, extents, deadline_ms, wait_ms);
    if (reclaimed) *reclaimed = r.reclaimed;
    const std::string held = std::string("cxlpool_compose_reclaim: quota \"") + quota + "\" still held " +
                             std::to_string(r.still_held) + " of the " + std::to_string(extents) +
                             " extents at the deadline (" + std::to_string(deadline_ms) + " ms)";
    if (r.still_held && r.lowered)
      fail(CXLPOOL_E_BUSY, held + ", and the compose claim stayed held, so its grant stays lowered by all " +
                               std::to_string(extents) + ": they come back as the quota frees them; " +
                               std::to_string(r.reclaimed) + " reclaimed now");
    if (r.still_held)
      fail(CXLPOOL_E_BUSY,
           held + ": its grant keeps them until they are freed; " + std::to_string(r.reclaimed) + " reclaimed");
  });
}

cxlpool_status_t cxlpool_compose_set_policy(cxlpool_shared_pool_t* pool, const char* quota,
                                            const cxlpool_compose_policy_t* policy, uint32_t fields, uint32_t wait_ms) {
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_set_policy");
    require(quota != nullptr, "cxlpool_compose_set_policy", "quota is NULL");
    require(policy != nullptr, "cxlpool_compose_set_policy", "policy is NULL");
    require(policy->reserved == 0, "cxlpool_compose_set_policy", "reserved is not 0");
    require((fields & ~7u) == 0, "cxlpool_compose_set_policy", "unknown fields");
    p->compose_set_policy(quota, {policy->min_extents, policy->max_extents, policy->priority}, fields, wait_ms);
  });
}

// A composer: the pool handle it steps on and its memory. Closing the pool first is the
// caller's bug, seen as a closed handle (shared_pool_of refuses it).
struct cxlpool_composer {
  static constexpr uint64_t kMagic = 0x636f6d706f736572ull;
  uint64_t magic = kMagic;
  cxlpool_shared_pool_t* pool = nullptr;
  uint64_t hold_ns = 0;
  shared::SharedPool::ComposerMemory memory;
};

cxlpool_status_t cxlpool_composer_create(cxlpool_shared_pool_t* pool, uint32_t hold_ms, cxlpool_composer_t** out) {
  return guarded([&] {
    require(out != nullptr, "cxlpool_composer_create", "out is NULL");
    *out = nullptr;
    shared_pool_of(pool, "cxlpool_composer_create");
    auto c = std::make_unique<cxlpool_composer>();
    c->pool = pool;
    c->hold_ns = uint64_t{hold_ms} * 1000000u;
    *out = c.release();
  });
}

cxlpool_status_t cxlpool_composer_step(cxlpool_composer_t* composer, uint32_t wait_ms, cxlpool_compose_move_t* moves,
                                       size_t capacity, size_t* count) {
  return guarded([&] {
    require(composer != nullptr && composer->magic == cxlpool_composer::kMagic, "cxlpool_composer_step",
            "composer is NULL or not a composer");
    require(count != nullptr, "cxlpool_composer_step", "count is NULL");
    require(moves != nullptr || capacity == 0, "cxlpool_composer_step", "moves is NULL with a non-zero capacity");
    *count = 0;
    shared::SharedPool* p = shared_pool_of(composer->pool, "cxlpool_composer_step");
    const auto applied = p->compose_step(&composer->memory, composer->hold_ns, wait_ms);
    const auto names = p->compose_quota_names();
    for (size_t i = 0; i < applied.size() && i < capacity; ++i) {
      cxlpool_compose_move_t m{};
      const std::string& n = names.at(applied[i].quota);
      std::memcpy(m.quota, n.data(), std::min(n.size(), sizeof m.quota - 1));
      m.delta_extents = applied[i].delta;
      std::strncpy(m.why, applied[i].why, sizeof m.why - 1);
      moves[i] = m;
    }
    *count = applied.size();
  });
}

void cxlpool_composer_destroy(cxlpool_composer_t* composer) {
  if (composer == nullptr || composer->magic != cxlpool_composer::kMagic) return;
  composer->magic = 0;
  delete composer;
}

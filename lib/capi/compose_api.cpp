// SPDX-License-Identifier: MIT
// C ABI for composition (include/cxlpool/compose.h): grants of a shared pool's quotas.
#include <algorithm>
#include <cstring>

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

cxlpool_status_t cxlpool_compose_reclaim(cxlpool_shared_pool_t* pool, const char* quota, uint64_t extents,
                                         uint32_t deadline_ms, uint32_t wait_ms, uint64_t* reclaimed) {
  if (reclaimed) *reclaimed = 0;
  return guarded([&] {
    shared::SharedPool* p = shared_pool_of(pool, "cxlpool_compose_reclaim");
    require(quota != nullptr, "cxlpool_compose_reclaim", "quota is NULL");
    const shared::SharedPool::ReclaimResult r = p->compose_reclaim(quota, extents, deadline_ms, wait_ms);
    if (reclaimed) *reclaimed = r.reclaimed;
    if (r.still_held)
      fail(CXLPOOL_E_BUSY,
           std::string("cxlpool_compose_reclaim: quota \"") + quota + "\" still held " + std::to_string(r.still_held) +
               " of the " + std::to_string(extents) + " extents at the deadline (" + std::to_string(deadline_ms) +
               " ms): its grant keeps them until they are freed; " + std::to_string(r.reclaimed) + " reclaimed");
  });
}

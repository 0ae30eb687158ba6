// SPDX-License-Identifier: MIT
// The composer's planner (compose_plan.hpp): a pure function of the quotas' state and time.
#include "shared/compose_plan.hpp"

#include <algorithm>
#include <numeric>

namespace cxlpool::detail::shared {

std::vector<PlanMove> plan_grants(const std::vector<PlanQuota>& quotas, uint64_t extents, uint64_t now_ns,
                                  uint64_t hold_ns, PlanMemory* memory) {
  const size_t nq = quotas.size();
  memory->spare_since_ns.resize(nq, 0);
  memory->streak.resize(nq, 0);
  for (size_t q = 0; q < nq; ++q) memory->streak[q] = quotas[q].demand ? memory->streak[q] + 1 : 0;
  std::vector<uint64_t> granted(nq);
  std::vector<int64_t> delta(nq, 0);
  uint64_t counted = 0;
  for (size_t q = 0; q < nq; ++q) {
    granted[q] = quotas[q].granted;
    counted += std::max(quotas[q].granted, quotas[q].used);
  }
  if (counted > extents) return {};  // damage: nothing is composed until a check repairs it
  uint64_t free = extents - counted;
  std::vector<const char*> why(nq, "");
  std::vector<bool> below(nq, false);
  auto move = [&](size_t q, int64_t d, const char* reason, bool below_used = false) {
    granted[q] = uint64_t(int64_t(granted[q]) + d);
    delta[q] += d;
    why[q] = reason;
    if (below_used) below[q] = true;
  };
  auto spare = [&](size_t q) {
    const uint64_t keep = std::max(quotas[q].used, quotas[q].min);
    return granted[q] > keep ? granted[q] - keep : 0;
  };
  auto cap = [&](size_t q) { return quotas[q].max ? std::min(quotas[q].max, extents) : extents; };

  // 1. Minimums.
  for (size_t q = 0; q < nq; ++q) {
    if (granted[q] >= quotas[q].min || free == 0) continue;
    const uint64_t take = std::min(quotas[q].min - granted[q], free);
    free -= take;
    move(q, int64_t(take), "minimum");
  }
  // 2. What went unused for a whole hold time, back.
  memory->peak_used.resize(nq, 0);
  for (size_t q = 0; q < nq; ++q) {
    uint64_t& since = memory->spare_since_ns[q];
    uint64_t& peak = memory->peak_used[q];
    if (quotas[q].demand != 0) {
      since = 0;
      continue;
    }
    if (since == 0) {  // a new window
      since = now_ns ? now_ns : 1;
      peak = quotas[q].used;
      continue;
    }
    peak = std::max(peak, quotas[q].used);
    if (now_ns - since < hold_ns) continue;
    const uint64_t keep = std::max(peak, quotas[q].min);
    const uint64_t s = granted[q] > keep ? granted[q] - keep : 0;
    since = now_ns ? now_ns : 1;  // the next window starts here
    peak = quotas[q].used;
    if (s == 0) continue;
    free += s;
    move(q, -int64_t(s), "idle");
  }
  // 3. Demand by priority.
  std::vector<size_t> order(nq);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return quotas[a].priority > quotas[b].priority; });
  for (size_t q : order) {
    const uint64_t room = cap(q) > granted[q] ? cap(q) - granted[q] : 0;
    const uint32_t k = std::min<uint32_t>(memory->streak[q], 7);
    const uint64_t growing = k ? uint64_t{1} << (k - 1) : 0;
    uint64_t want = std::min(std::max(quotas[q].demand, growing), room);
    if (want == 0) continue;
    const uint64_t from_free = std::min(want, free);
    if (from_free) {
      free -= from_free;
      want -= from_free;
      move(q, int64_t(from_free), "demand");
    }
    // Donors: lower priority, lowest first.
    for (auto it = order.rbegin(); it != order.rend() && want > 0; ++it) {
      const size_t d = *it;
      if (quotas[d].priority >= quotas[q].priority) break;
      const uint64_t take = std::min(want, spare(d));
      if (take == 0) continue;
      move(d, -int64_t(take), "to a higher priority");
      move(q, int64_t(take), "demand");
      want -= take;
    }
    for (auto it = order.rbegin(); it != order.rend() && want > 0; ++it) {
      const size_t d = *it;
      if (quotas[d].priority >= quotas[q].priority) break;
      const uint64_t floor = quotas[d].min;
      const uint64_t can = granted[d] > floor ? granted[d] - floor : 0;
      const uint64_t take = std::min(want, can);
      if (take == 0) continue;
      move(d, -int64_t(take), "to a higher priority", true);  // over grant until it frees them
      want -= take;
    }
  }
  std::vector<PlanMove> out;
  for (size_t q = 0; q < nq; ++q)
    if (delta[q] < 0) out.push_back({uint32_t(q), delta[q], why[q], below[q]});
  for (size_t q = 0; q < nq; ++q)
    if (delta[q] > 0) out.push_back({uint32_t(q), delta[q], why[q], false});
  return out;
}

}  // namespace cxlpool::detail::shared

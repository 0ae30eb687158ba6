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

  // Takes up to want extents for quota q from quotas of priority below `priority`, lowest
  // first: their spare at once (granted to q now), then their grants down to their minimums
  // (extents they hold come back as they free them: never granted here). Returns what was
  // granted to q.
  std::vector<size_t> order(nq);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return quotas[a].priority > quotas[b].priority; });
  // `need` is what q is really short of (want may be more: a growing step); grants are only
  // lowered below what a quota holds for need, less what lower quotas already hold over their
  // grants (promised back already).
  auto from_lower = [&](size_t q, uint64_t want, uint64_t need, uint32_t priority, const char* reason) {
    uint64_t got = 0;
    for (auto it = order.rbegin(); it != order.rend() && want > 0; ++it) {
      const size_t d = *it;
      if (d == q || quotas[d].priority >= priority) continue;
      const uint64_t take = std::min(want, spare(d));
      if (take == 0) continue;
      move(d, -int64_t(take), "to a higher priority");
      move(q, int64_t(take), reason);
      want -= take;
      got += take;
    }
    uint64_t pending = 0;
    for (size_t d = 0; d < nq; ++d)
      if (d != q && quotas[d].priority < priority && quotas[d].used > granted[d])
        pending += quotas[d].used - granted[d];
    want = std::min(want, need > got + pending ? need - got - pending : 0);
    for (auto it = order.rbegin(); it != order.rend() && want > 0; ++it) {
      const size_t d = *it;
      if (d == q || quotas[d].priority >= priority) continue;
      const uint64_t can = granted[d] > quotas[d].min ? granted[d] - quotas[d].min : 0;
      const uint64_t take = std::min(want, can);
      if (take == 0) continue;
      move(d, -int64_t(take), "to a higher priority", true);  // over grant until it frees them
      want -= take;
    }
    return got;
  };

  // 1. Minimums: from the unassigned extents, then from every quota above its own minimum
  // (a minimum outranks any priority).
  for (size_t q = 0; q < nq; ++q) {
    if (granted[q] >= quotas[q].min) continue;
    uint64_t want = quotas[q].min - granted[q];
    const uint64_t take = std::min(want, free);
    if (take) {
      free -= take;
      want -= take;
      move(q, int64_t(take), "minimum");
    }
    if (want) from_lower(q, want, want, 256, "minimum");
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
  // 3. Demand by priority: only what the quota is short of (demand its spare does not cover:
  // a refusal already served, by this composer or another, asks for nothing more).
  for (size_t q : order) {
    const uint64_t has = granted[q] > quotas[q].used ? granted[q] - quotas[q].used : 0;
    const uint64_t short_of = quotas[q].demand > has ? quotas[q].demand - has : 0;
    uint32_t& streak = memory->streak[q];
    streak = short_of ? streak + 1 : 0;
    const uint64_t room = cap(q) > granted[q] ? cap(q) - granted[q] : 0;
    const uint32_t k = std::min<uint32_t>(streak, 7);
    const uint64_t growing = k ? uint64_t{1} << (k - 1) : 0;
    uint64_t want = short_of ? std::min(std::max(short_of, growing), room) : 0;
    if (want == 0) continue;
    const uint64_t from_free = std::min(want, free);
    if (from_free) {
      free -= from_free;
      want -= from_free;
      move(q, int64_t(from_free), "demand");
    }
    if (want) from_lower(q, want, short_of > from_free ? short_of - from_free : 0, quotas[q].priority, "demand");
  }
  std::vector<PlanMove> out;
  for (size_t q = 0; q < nq; ++q)
    if (delta[q] < 0) out.push_back({uint32_t(q), delta[q], why[q], below[q]});
  for (size_t q = 0; q < nq; ++q)
    if (delta[q] > 0) out.push_back({uint32_t(q), delta[q], why[q], false});
  return out;
}

}  // namespace cxlpool::detail::shared

// SPDX-License-Identifier: MIT
// The composer's policy as a pure function: each quota's grant, holdings, recent demand and
// policy in, grant changes out. No pool and no clock of its own, so it is tested with made-up
// states and times (docs/compose.md, "Policy").
#pragma once

#include <cstdint>
#include <vector>

namespace cxlpool::detail::shared {

struct PlanQuota {
  uint64_t granted = 0, used = 0;
  uint64_t demand = 0;  // extents its participants asked for recently beyond the grant
  uint64_t min = 0;     // guaranteed: granted first, never reclaimed below
  uint64_t max = 0;     // 0: the pool
  uint32_t priority = 0;
};

struct PlanMove {
  uint32_t quota = 0;
  int64_t delta = 0;  // > 0: a grant from the unassigned; < 0: a reclaim
  const char* why = "";
  bool below_used = false;  // a reclaim that may leave the quota over grant (for a higher priority)
};

// What the planner remembers between steps.
struct PlanMemory {
  std::vector<uint64_t> spare_since_ns;  // per quota: since when it has had spare and no demand (0: not)
  std::vector<uint32_t> streak;          // per quota: steps in a row with demand
  std::vector<uint64_t> peak_used;       // per quota: the most it used since spare_since_ns
};

// The moves for this step, reclaims first. Rules, in order:
//   1. a quota below its minimum is served first: from the unassigned extents, then from any
//      quota above its own minimum (a minimum outranks every priority);
//   2. a quota with no demand for hold_ns gives back what it did not use at any step of that
//      time (granted beyond max(its peak use, min)): a load that rises and falls slower than
//      the steps and faster than hold_ns keeps its peak (hysteresis);
//   3. demand is served by priority (higher first, then quota order), up to the quota's
//      maximum, for what the quota is short of (its demand beyond its unused grant: a demand
//      already served asks for nothing more, whichever composer served it); a shortfall that
//      lasts is served in growing steps (2^(k-1) extents at its k-th step in a row, up to 64):
//      from the unassigned extents, then the spare of lower priorities, then by lowering
//      lower-priority grants to their minimums (their extents come back as they free them:
//      never taken from under a block).
// Equal priorities never take from each other but through rule 2.
std::vector<PlanMove> plan_grants(const std::vector<PlanQuota>& quotas, uint64_t extents, uint64_t now_ns,
                                  uint64_t hold_ns, PlanMemory* memory);

}  // namespace cxlpool::detail::shared

// SPDX-License-Identifier: MIT
// Placement: the policy compiled into per-class routes at pool creation (route.hpp), and the
// rule chain walked for what the routes leave open (hints, forced devices, huge blocks,
// classes split twice, per-page decisions when a page fills up).
#include "alloc/internal.hpp"

namespace cxlpool::detail::alloc {

namespace {

int next_interleave(Pool* pool) noexcept {
  uint64_t n = pool->interleave_counter.fetch_add(1, std::memory_order_relaxed);
  return pool->interleave_sequence[n % pool->interleave_sequence.size()];
}

int next_ratio(Pool* pool, const Rule& r) noexcept {
  int best = r.devices[0];
  double best_share = -1;
  for (size_t i = 0; i < r.devices.size(); ++i) {
    double share = double(pool->dev[r.devices[i]].active.load(std::memory_order_relaxed)) / r.weights[i];
    if (best_share < 0 || share < best_share) {
      best_share = share;
      best = r.devices[i];
    }
  }
  return best;
}

bool spilling(Pool* pool, const Rule& r) noexcept {
  const PoolDevice& near = pool->dev[r.devices[0]];
  return spill_full(near.device->committed(), near.device->capacity(), r.watermark_pct);
}

}  // namespace

void compile_routes(Pool* pool) {
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const uint64_t lo = c == 0 ? 0 : class_to_size(c - 1) + 1, hi = class_to_size(c);
    ClassRoute route;  // kEvaluate unless a single outcome (with at most one split) is found
    bool split = false;
    int above = 0;
    for (const Rule& r : pool->policy.rules) {
      if (r.kind == RuleKind::kHint) continue;  // plain allocations carry no hint
      if (r.kind == RuleKind::kThreshold) {
        if (r.min_size > hi) continue;  // no size of the class reaches it
        if (r.min_size > lo) {          // splits the class: the rest of the chain decides below
          if (split) break;             // a second split: evaluate per call
          split = true;
          route.split = uint32_t(r.min_size);
          above = r.devices[0];
          continue;
        }
      }
      if (r.kind == RuleKind::kBind || r.kind == RuleKind::kPreferred || r.kind == RuleKind::kThreshold) {
        route.kind = RouteKind::kFixed;
        route.below = uint8_t(r.devices[0]);
        route.above = uint8_t(split ? above : r.devices[0]);
      } else if (!split && r.kind == RuleKind::kSpill) {
        route.kind = RouteKind::kSpill;
        route.below = uint8_t(r.devices[0]);
        route.above = uint8_t(r.devices[1]);
        const PoolDevice& near = pool->dev[r.devices[0]];
        route.pct = uint8_t(r.watermark_pct);
        route.watched = &near.device->ledger().committed;
        route.capacity = &near.device->ledger().capacity;
      } else if (!split && (r.kind == RuleKind::kRatio || r.kind == RuleKind::kInterleave)) {
        route.kind = RouteKind::kPerPage;
      }
      break;
    }
    pool->routes[c] = route;
  }
}

int choose(Pool* pool, Heap* h, size_t size, uint32_t hint, unsigned cls, bool huge, const Rule** rule) noexcept {
  for (const Rule& r : pool->policy.rules) {
    *rule = &r;
    switch (r.kind) {
      case RuleKind::kBind:
      case RuleKind::kPreferred:
        return r.devices[0];
      case RuleKind::kSpill:
        return r.devices[spilling(pool, r) ? 1 : 0];
      case RuleKind::kThreshold:
        if (size >= r.min_size) return r.devices[0];
        break;
      case RuleKind::kHint:
        for (int b = 0; b < 4; ++b)
          if ((hint >> b & 1) && r.hint_device[b] >= 0) return r.hint_device[b];
        break;
      case RuleKind::kRatio:
      case RuleKind::kInterleave: {
        auto next = [&] { return r.kind == RuleKind::kRatio ? next_ratio(pool, r) : next_interleave(pool); };
        if (huge || !h) return next();
        if (h->page_device[cls] < 0) h->page_device[cls] = int16_t(next());
        return h->page_device[cls];
      }
    }
  }
  *rule = nullptr;
  return 0;
}

}  // namespace cxlpool::detail::alloc

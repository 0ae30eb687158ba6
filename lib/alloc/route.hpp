// SPDX-License-Identifier: MIT
// A policy compiled for malloc's fast path: one route per size class, decided once at pool
// creation for plain (hint-less) allocations. Only decisions that depend on state are left
// for the allocation itself, and those cost one load:
//   kFixed    device = size >= split ? above : below   (bind, preferred, threshold; split 0: always above)
//   kSpill    device = spill_full(*watched, *capacity, pct) ? above : below (the near device's
//             ledger: its committed bytes against its capacity now, which may change)
//   kPerPage  device = the thread's current page device for the class (ratio, interleave)
//   kEvaluate walk the rule chain (more than one threshold splits the class)
// Calls with hints, forced devices and blocks above 1 MiB always walk the chain.
#pragma once

#include <atomic>
#include <cstdint>

namespace cxlpool::detail::alloc {

enum class RouteKind : uint8_t { kFixed, kSpill, kPerPage, kEvaluate };

struct ClassRoute {
  RouteKind kind = RouteKind::kEvaluate;
  uint8_t below = 0, above = 0;  // pool device indices
  uint8_t pct = 0;               // kSpill: the watermark, in percent of the capacity
  uint32_t split = 0;
  const std::atomic<uint64_t>* watched = nullptr;   // kSpill: the near device's committed bytes
  const std::atomic<uint64_t>* capacity = nullptr;  // and its capacity
};

// Whether a device with `committed` of `capacity` bytes is at or past a spill watermark of pct
// percent: the one test of spill, in routes and in the rule chain.
inline bool spill_full(uint64_t committed, uint64_t capacity, unsigned pct) noexcept {
  return committed * 100 >= capacity * pct;
}

}  // namespace cxlpool::detail::alloc

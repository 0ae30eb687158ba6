// SPDX-License-Identifier: MIT
// A set of disjoint half-open [start, end) ranges that reports how many units an insert
// added and an erase removed. Backings use it to count committed bytes exactly once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace cxlpool::detail {

class IntervalSet {
 public:
  // Adds [start, end); returns the number of units not already present.
  uint64_t insert(uint64_t start, uint64_t end);
  // Removes [start, end); returns the number of units that were present.
  uint64_t erase(uint64_t start, uint64_t end);
  // Units present inside [start, end).
  uint64_t covered(uint64_t start, uint64_t end) const;
  // Positions strictly inside (start, end) where presence changes (range starts and ends).
  uint64_t boundaries_inside(uint64_t start, uint64_t end) const;
  uint64_t total() const { return total_; }
  bool empty() const { return ranges_.empty(); }
  size_t ranges() const { return ranges_.size(); }
  template <class F>
  void for_each(F&& f) const {
    for (auto& [lo, hi] : ranges_) f(lo, hi);
  }
  // Calls f(lo, hi) for each part of [start, end) that is not present, in order; allocates
  // nothing.
  template <class F>
  void for_each_gap(uint64_t start, uint64_t end, F&& f) const {
    uint64_t at = start;
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin() && std::prev(it)->second > at) at = std::prev(it)->second;
    while (at < end) {
      const uint64_t gap_end = it == ranges_.end() ? end : std::min(end, it->first);
      if (gap_end > at) f(at, gap_end);
      if (it == ranges_.end()) return;
      at = std::max(at, it->second);
      ++it;
    }
  }
  // Calls f(lo, hi) for each present part of [start, end), in order; allocates nothing.
  template <class F>
  void for_each_in(uint64_t start, uint64_t end, F&& f) const {
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < end; ++it) {
      const uint64_t lo = std::max(start, it->first), hi = std::min(end, it->second);
      if (lo < hi) f(lo, hi);
    }
  }
  // The first range, in order, for which f(lo, hi) returns true; false when none does.
  template <class F>
  bool find_if(F&& f) const {
    for (auto& [lo, hi] : ranges_)
      if (f(lo, hi)) return true;
    return false;
  }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // start -> end
  uint64_t total_ = 0;
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// A set of disjoint half-open [start, end) ranges that reports how many units an insert
// added and an erase removed (merge on insert, split on erase, over a map keyed by range
// start). Backings use it to count committed bytes exactly once. The allocator of its nodes is
// a parameter: the device layer's sets use the internal heap (backing/storage.hpp), never the
// program's malloc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

namespace cxlpool::detail {

template <class Alloc = std::allocator<std::pair<const uint64_t, uint64_t>>>
class BasicIntervalSet {
 public:
  // Adds [start, end); returns the number of units not already present.
  uint64_t insert(uint64_t start, uint64_t end) {
    if (start >= end) return 0;
    const uint64_t added = (end - start) - covered(start, end);
    // Absorb every range that overlaps or touches [start, end).
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) {
      auto prev = std::prev(it);
      if (prev->second >= start) it = prev;
    }
    while (it != ranges_.end() && it->first <= end) {
      start = std::min(start, it->first);
      end = std::max(end, it->second);
      it = ranges_.erase(it);
    }
    ranges_.emplace(start, end);
    total_ += added;
    return added;
  }
  // Removes [start, end); returns the number of units that were present.
  uint64_t erase(uint64_t start, uint64_t end) {
    if (start >= end) return 0;
    const uint64_t removed = covered(start, end);
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < end) {
      const uint64_t lo = it->first, hi = it->second;
      if (hi <= start) {
        ++it;
        continue;
      }
      it = ranges_.erase(it);
      if (lo < start) ranges_.emplace(lo, start);
      if (hi > end) {
        ranges_.emplace(end, hi);
        break;
      }
    }
    total_ -= removed;
    return removed;
  }
  // Units present inside [start, end).
  uint64_t covered(uint64_t start, uint64_t end) const {
    uint64_t n = 0;
    for_each_in(start, end, [&](uint64_t lo, uint64_t hi) { n += hi - lo; });
    return n;
  }
  // Positions strictly inside (start, end) where presence changes (range starts and ends).
  uint64_t boundaries_inside(uint64_t start, uint64_t end) const {
    uint64_t n = 0;
    auto it = ranges_.upper_bound(start);
    if (it != ranges_.begin()) --it;
    for (; it != ranges_.end() && it->first < end; ++it) {
      n += it->first > start && it->first < end;
      n += it->second > start && it->second < end;
    }
    return n;
  }
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
  std::map<uint64_t, uint64_t, std::less<uint64_t>, Alloc> ranges_;  // start -> end
  uint64_t total_ = 0;
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// IntervalSet: merge-on-insert, split-on-erase over a std::map keyed by range start.
#include "common/interval_set.hpp"

#include <algorithm>

namespace cxlpool::detail {

uint64_t IntervalSet::covered(uint64_t start, uint64_t end) const {
  uint64_t n = 0;
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->first < end; ++it) {
    uint64_t lo = std::max(start, it->first), hi = std::min(end, it->second);
    if (lo < hi) n += hi - lo;
  }
  return n;
}

uint64_t IntervalSet::boundaries_inside(uint64_t start, uint64_t end) const {
  uint64_t n = 0;
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->first < end; ++it) {
    n += it->first > start && it->first < end;
    n += it->second > start && it->second < end;
  }
  return n;
}

uint64_t IntervalSet::insert(uint64_t start, uint64_t end) {
  if (start >= end) return 0;
  uint64_t added = (end - start) - covered(start, end);
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

uint64_t IntervalSet::erase(uint64_t start, uint64_t end) {
  if (start >= end) return 0;
  uint64_t removed = covered(start, end);
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin()) --it;
  while (it != ranges_.end() && it->first < end) {
    uint64_t lo = it->first, hi = it->second;
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

}  // namespace cxlpool::detail

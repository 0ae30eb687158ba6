// SPDX-License-Identifier: MIT
// Pool statistics: per-thread, per-class counters summed on read (exact byte figures), the
// pool's own commit figures, and its device's ledger; rendered as JSON for the C ABI.
#include "alloc/fast.hpp"
#include "common/json.hpp"

namespace cxlpool::detail::alloc {

DeviceStats pool_device_stats(const Pool* pool, int di) noexcept {
  DeviceStats s;
  const PoolDevice& d = pool->dev[di];
  uint64_t alloc_bytes = 0, free_bytes = 0;
  auto count = [&](const Counter* allocs, const Counter* frees) {
    for (unsigned c = 0; c < kNumClasses; ++c) {
      uint64_t a = allocs ? allocs[c].get() : 0, f = frees[c].get();
      s.allocations += a;
      s.frees += f;
      alloc_bytes += a * kClassSizes[c];
      free_bytes += f * kClassSizes[c];
    }
  };
  {
    std::lock_guard<std::mutex> lock(const_cast<Pool*>(pool)->heaps_mu);
    for (Heap* h = pool->heaps; h; h = h->next_in_pool) {
      const HeapCounters& c = h->counters[di];
      count(c.allocs, c.frees);
      s.allocations += c.huge_allocs.get();
      s.frees += c.huge_frees.get();
      s.fallbacks += c.fallbacks.get();
      s.failures += c.failures.get();
      s.double_frees += c.double_frees.get();
      s.invalid_frees += c.invalid_frees.get();
    }
  }
  for (unsigned c = 0; c < kNumClasses; ++c) {
    uint64_t f = d.orphan_frees[c].load(std::memory_order_relaxed);
    uint64_t late = d.late_double_frees[c].load(std::memory_order_relaxed);
    s.frees += f - late;  // remote frees that turned out to be second frees
    free_bytes += (f - late) * kClassSizes[c];
    s.double_frees += late;
  }
  s.frees += d.orphan_huge_frees.load(std::memory_order_relaxed);
  s.double_frees += d.orphan_double_frees.load(std::memory_order_relaxed);
  s.invalid_frees += d.orphan_invalid_frees.load(std::memory_order_relaxed);
  s.allocated_bytes =
      (alloc_bytes > free_bytes ? alloc_bytes - free_bytes : 0) + d.huge_live_bytes.load(std::memory_order_relaxed);
  s.active_bytes = d.active.load(std::memory_order_relaxed);
  s.resident_bytes = d.resident.load(std::memory_order_relaxed);
  s.peak_resident_bytes = d.peak_resident.load(std::memory_order_relaxed);
  s.capacity_bytes = d.capacity;
  s.device_committed_bytes = d.device->committed();
  return s;
}

std::string pool_stats_json(const Pool* pool) {
  JsonWriter j;
  j.begin_object().key("pool").value(pool->name).key("policy").value(pool->policy.text);
  j.key("sharing").value(pool->sharing == Sharing::kShared ? "shared" : "private");
  j.key("devices").begin_array();
  DeviceStats total;
  for (int di = 0; di < pool->ndev; ++di) {
    DeviceStats s = pool_device_stats(pool, di);
    j.begin_object().key("device").value(pool->dev[di].name).key("tier").value(pool->dev[di].tier);
    j.key("allocated_bytes").value(s.allocated_bytes).key("active_bytes").value(s.active_bytes);
    j.key("resident_bytes").value(s.resident_bytes).key("peak_resident_bytes").value(s.peak_resident_bytes);
    j.key("capacity_bytes").value(s.capacity_bytes).key("device_committed_bytes").value(s.device_committed_bytes);
    j.key("allocations").value(s.allocations).key("frees").value(s.frees);
    j.key("fallbacks").value(s.fallbacks).key("failures").value(s.failures);
    j.key("double_frees").value(s.double_frees).key("invalid_frees").value(s.invalid_frees);
    j.end_object();
    total.allocated_bytes += s.allocated_bytes;
    total.resident_bytes += s.resident_bytes;
    total.allocations += s.allocations;
    total.frees += s.frees;
  }
  j.end_array().key("totals").begin_object();
  j.key("allocated_bytes").value(total.allocated_bytes).key("resident_bytes").value(total.resident_bytes);
  j.key("allocations").value(total.allocations).key("frees").value(total.frees).end_object();
  j.end_object();
  return j.str() + "\n";
}

}  // namespace cxlpool::detail::alloc

// SPDX-License-Identifier: MIT
// Pool statistics: per-thread, per-class counters summed on read (exact byte figures), the
// pool's own commit figures, and its device's ledger; rendered as JSON for the C ABI.
#include <algorithm>
#include <cstring>

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
      const HeapCounters& c = h->row[di].counters;
      count(c.allocs, c.frees);
      s.allocations += c.huge_allocs.get();
      s.frees += c.huge_frees.get();
      s.fallbacks += c.fallbacks.get();
      s.failures += c.failures.get();
      s.double_frees += c.double_frees.get();
      s.invalid_frees += c.invalid_frees.get();
    }
  }
  // Frees a fold found to be second frees were counted as frees by whoever made them (a
  // thread's heap or the orphan counters): taken off the sum, never below zero.
  uint64_t late_frees = 0, late_bytes = 0;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    uint64_t f = d.orphan_frees[c].load(std::memory_order_relaxed);
    uint64_t late = d.late_double_frees[c].load(std::memory_order_relaxed);
    s.frees += f;
    free_bytes += f * kClassSizes[c];
    late_frees += late;
    late_bytes += late * kClassSizes[c];
    s.double_frees += late;
  }
  s.frees -= std::min(s.frees, late_frees);
  free_bytes -= std::min(free_bytes, late_bytes);
  s.frees += d.orphan_huge_frees.load(std::memory_order_relaxed);
  s.double_frees += d.orphan_double_frees.load(std::memory_order_relaxed);
  s.invalid_frees += d.orphan_invalid_frees.load(std::memory_order_relaxed);
  s.allocated_bytes =
      (alloc_bytes > free_bytes ? alloc_bytes - free_bytes : 0) + d.huge_live_bytes.load(std::memory_order_relaxed);
  s.active_bytes = d.active.load(std::memory_order_relaxed);
  s.resident_bytes = d.resident.load(std::memory_order_relaxed);
  s.peak_resident_bytes = d.peak_resident.load(std::memory_order_relaxed);
  s.capacity_bytes = d.device->capacity();
  s.device_committed_bytes = d.device->committed();
  const ElasticCounters& e = d.device->ledger().elastic;
  s.capacity_changes = e.grows.load(std::memory_order_relaxed) + e.shrinks.load(std::memory_order_relaxed);
  s.capacity_refusals = e.refusals.load(std::memory_order_relaxed);
  s.evacuated_bytes = e.evacuated_bytes.load(std::memory_order_relaxed);
  s.lost_bytes = e.lost_bytes.load(std::memory_order_relaxed);
  s.borrow_refusals = e.borrow_refusals.load(std::memory_order_relaxed);
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
    for (const DeviceStatField& f : kDeviceStatFields) j.key(f.desc.name).value(s.*f.member);
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

size_t collect_device_totals(DeviceTotals* out, size_t max) noexcept {
  size_t n = 0;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (const RegistryEntry& e : g_registry) {
    const Pool* pool = e.pool;
    if (!pool) continue;
    for (int di = 0; di < pool->ndev; ++di) {
      const PoolDevice& d = pool->dev[di];
      size_t k = 0;
      while (k < n && out[k].identity != d.device.get()) ++k;
      if (k == n) {
        if (n == max) continue;
        DeviceTotals& t = out[n++];
        t = DeviceTotals{};
        t.identity = d.device.get();
        size_t len = std::min(d.name.size(), sizeof t.name - 1);
        std::memcpy(t.name, d.name.data(), len);
        t.kind = int(d.device->spec().kind);
        t.tier = d.tier;
        t.numa_node = d.device->spec().numa_node;
      }
      DeviceTotals& t = out[k];
      ++t.pools;
      const DeviceStats s = pool_device_stats(pool, di);
      for (const DeviceStatField& f : kDeviceStatFields)
        t.stats.*f.member = f.per_device ? s.*f.member : t.stats.*f.member + s.*f.member;
    }
  }
  return n;
}

}  // namespace cxlpool::detail::alloc

// SPDX-License-Identifier: MIT
// Pool lifecycle: creation over topology targets (devices borrowed from the registry, the
// policy parsed and compiled), the registry of pools (index + generation, so a stale thread
// heap or segment is recognised), destruction, trimming, and the accessors of pool.hpp.
#include <algorithm>
#include <memory>
#include <shared_mutex>

#include "alloc/fast.hpp"
#include "common/error.hpp"
#include "common/intrusive_list.hpp"
#include "common/parse.hpp"
#include "config/options.hpp"
#include "device/registry.hpp"

namespace cxlpool::detail::alloc {

std::mutex g_registry_mu;
RegistryEntry g_registry[kMaxPools];

namespace {
uint32_t g_generation = 0;

// Smooth weighted round robin over one period (the sum of the weights).
std::vector<uint8_t> interleave_sequence(const Rule& r) {
  std::vector<uint8_t> seq;
  uint32_t total = 0;
  for (uint32_t w : r.weights) total += w;
  std::vector<int64_t> current(r.devices.size(), 0);
  for (uint32_t step = 0; step < total; ++step) {
    size_t best = 0;
    for (size_t i = 0; i < r.devices.size(); ++i) {
      current[i] += r.weights[i];
      if (current[i] > current[best]) best = i;
    }
    current[best] -= total;
    seq.push_back(uint8_t(r.devices[best]));
  }
  return seq;
}
}  // namespace

Pool* pool_create(const Topology& topo, const PoolOptions& options) {
  std::vector<size_t> targets = options.targets;
  if (targets.empty()) {
    for (size_t i = 0; i < topo.targets.size(); ++i) targets.push_back(i);
    std::stable_sort(targets.begin(), targets.end(),
                     [&](size_t a, size_t b) { return topo.targets[a].tier.value < topo.targets[b].tier.value; });
  }
  if (targets.size() > size_t(kMaxDevices)) {
    // Every target of a large machine: keep the fastest kMaxDevices.
    if (!options.targets.empty())
      fail(CXLPOOL_E_INVALID_ARGUMENT, "pool: " + std::to_string(targets.size()) + " devices given; at most " +
                                           std::to_string(kMaxDevices) + " per pool");
    targets.resize(kMaxDevices);
  }
  auto pool = std::make_unique<Pool>();
  pool->name = options.name.empty() ? "pool" : options.name;
  pool->sharing = options.sharing;
  PolicyDevices pd;
  for (size_t t : targets) {
    if (t >= topo.targets.size())
      fail(CXLPOOL_E_NOT_FOUND, "pool: target index " + std::to_string(t) + " out of range");
    for (int j = 0; j < pool->ndev; ++j)
      if (pool->dev[j].target == t)
        fail(CXLPOOL_E_INVALID_ARGUMENT, "pool: device '" + topo.targets[t].name + "' listed twice");
    const Target& tg = topo.targets[t];
    PoolDevice& d = pool->dev[pool->ndev++];
    d.name = tg.name;
    d.target = t;
    d.tier = tg.tier.value;
    d.read_bandwidth = tg.read_bandwidth_mbps.known() ? tg.read_bandwidth_mbps.value : 0;
    pd.names.push_back(tg.name);
    pd.tiers.push_back(d.tier);
    pd.read_bandwidth_mbps.push_back(d.read_bandwidth);
  }
  pool->policy = parse_policy(options.policy, pd, "policy");
  for (int i = 0; i < pool->ndev; ++i) {
    PoolDevice& d = pool->dev[i];
    d.device = registry::acquire(topo.targets[d.target].backing);
    node_watch_add(d.device, topo.sysfs_root, topo.targets[d.target].kind == CXLPOOL_TARGET_NUMA_NODE);
    d.page_size = d.device->caps().page_size;
    d.coarse = d.page_size > kSliceSize;
    if (d.page_size > kSegmentSize || (d.page_size & (d.page_size - 1)))
      fail(CXLPOOL_E_NOT_SUPPORTED, "pool: device '" + d.name + "' has " + std::to_string(d.page_size) +
                                        "-byte pages; the allocator needs a power of two of at most 4 MiB");
  }
  for (const Rule& r : pool->policy.rules)
    if (r.kind == RuleKind::kInterleave) pool->interleave_sequence = interleave_sequence(r);
  compile_routes(pool.get());

  std::lock_guard<std::mutex> lock(g_registry_mu);
  int slot = -1;
  for (int i = 0; i < kMaxPools; ++i)
    if (!g_registry[i].pool) {
      slot = i;
      break;
    }
  if (slot < 0) fail(CXLPOOL_E_NO_MEMORY, "pool: " + std::to_string(kMaxPools) + " pools exist already");
  pool->index = uint32_t(slot);
  pool->generation = ++g_generation;
  g_registry[slot] = {pool.get(), pool->generation};
  return pool.release();
}

namespace {
std::shared_mutex g_pools_alive_mu;  // exclusive: a pool being destroyed; shared: PoolsAlive
}  // namespace

PoolsAlive::PoolsAlive() noexcept { g_pools_alive_mu.lock_shared(); }
PoolsAlive::~PoolsAlive() { g_pools_alive_mu.unlock_shared(); }
void reset_pools_alive_in_child() noexcept { new (&g_pools_alive_mu) std::shared_mutex(); }

void pool_destroy(Pool* pool) noexcept {
  if (!pool) return;
  std::unique_lock<std::shared_mutex> alive(g_pools_alive_mu);
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_registry[pool->index] = {};
  }
  for (int di = 0; di < pool->ndev; ++di) {
    PoolDevice& d = pool->dev[di];
    std::lock_guard<std::mutex> lock(d.mu);
    for (HugeSpan** list : {&d.huge_live, &d.huge_cache})
      while (HugeSpan* span = *list) {
        list_remove(*list, span);
        huge_release_span(pool, d, span);
      }
    release_regions(pool, d);
  }
  Heap* h = pool->heaps;
  while (h) {
    Heap* next = h->next_in_pool;
    meta_delete(h);
    h = next;
  }
  forget_thread_heap(pool);
  delete pool;  // releases the devices (the last user closes each)
}

Pool* pool_create_from_environment(const Topology& topo, const std::string& name) {
  PoolOptions o;
  o.name = name;
  if (const char* policy = option_value(Option::kPolicy)) o.policy = policy;
  try {
    return pool_create(topo, o);
  } catch (const Failure& f) {
    // Policy errors carry the parser's "policy:" origin; say which variable held the text.
    if (f.status() == CXLPOOL_E_CONFIG && std::string(f.what()).rfind("policy:", 0) == 0)
      fail(CXLPOOL_E_CONFIG, std::string("CXLPOOL_POLICY: ") + f.what());
    throw;
  }
}

void configure_from_environment() {
  // Each option on its own: a bad one is reported and left at its default, never keeping a
  // good one from taking effect.
  std::string bad;
  if (const char* v = option_value(Option::kPurgeDelayMs)) {
    auto ms = parse_u64(trim(v));
    if (!ms || *ms > 60000)
      bad += std::string("CXLPOOL_PURGE_DELAY_MS: bad value '") + v +
             "' (expected milliseconds 0..60000; 0 returns free memory at once)";
    else
      set_purge_delay_ms(*ms);
  }
  if (const char* v = option_value(Option::kNodeWatchMs)) {
    auto ms = parse_u64(trim(v));
    if (!ms || *ms > 600000)
      bad += std::string(bad.empty() ? "" : "; ") + "CXLPOOL_NODE_WATCH_MS: bad value '" + v +
             "' (expected milliseconds 0..600000; 0 watches only when the program asks)";
    else
      set_node_watch_ms(*ms);
  }
  if (!bad.empty()) fail(CXLPOOL_E_CONFIG, bad);
}

uint64_t pool_trim(Pool* pool) noexcept {
  uint64_t released = 0;
  central_trim(pool);
  // The calling thread's own empty pages first (its current pages are never retired on free).
  if (Heap* me = current_heap_of(pool))
    for (int di = 0; di < pool->ndev; ++di) retire_empty_pages(me, di);
  for (int di = 0; di < pool->ndev; ++di) {
    PoolDevice& d = pool->dev[di];
    // Abandoned pages that remote frees emptied go back to their segments.
    for (;;) {
      Page* empty = nullptr;
      {
        std::lock_guard<std::mutex> lock(d.mu);
        for (unsigned c = 0; c < kNumClasses && !empty; ++c)
          for (Page* pg = d.abandoned[c]; pg; pg = pg->next) {
            fold_frees(d, pg);
            if (pg->used == 0) {
              list_remove(d.abandoned[c], pg);
              empty = pg;
              break;
            }
          }
      }
      if (!empty) break;
      release_page(pool, empty);
    }
    std::lock_guard<std::mutex> lock(d.mu);
    for (HugeSpan* span = d.huge_cache; span;) {
      HugeSpan* next = span->next;
      if (!span->moving) {  // one that moves now stays for a purge pass after the move
        list_remove(d.huge_cache, span);
        --d.huge_cache_count;
        d.huge_cache_bytes -= span->committed;
        released += span->committed;
        huge_release_span(pool, d, span);
      }
      span = next;
    }
    uint64_t kept = 0;  // free committed slices of segments that move now
    for (Segment* s = d.partial; s;) {
      Segment* next = s->next_partial;
      if (segment_moving(d, s)) {
        kept += uint64_t(__builtin_popcountll(s->free_slices & s->committed_slices)) << kSliceShift;
        s = next;
        continue;
      }
      uint64_t idle = s->free_slices & s->committed_slices;
      released += uint64_t(__builtin_popcountll(idle)) << kSliceShift;
      decommit_slices(pool, d, s, idle);
      if (s->free_slices == ~uint64_t(0)) free_segment(pool, d, s);  // back to its region
      s = next;
    }
    d.free_committed = kept;
  }
  return released;
}

int pool_device_count(const Pool* pool) noexcept { return pool->ndev; }
const std::string& pool_device_name(const Pool* pool, int device) noexcept { return pool->dev[device].name; }
size_t pool_device_target(const Pool* pool, int device) noexcept { return pool->dev[device].target; }
int pool_device_tier(const Pool* pool, int device) noexcept { return pool->dev[device].tier; }
int pool_find_device(const Pool* pool, const std::string& name) noexcept {
  for (int i = 0; i < pool->ndev; ++i)
    if (pool->dev[i].name == name) return i;
  return -1;
}
const std::string& pool_policy_text(const Pool* pool) noexcept { return pool->policy.text; }
const std::string& pool_name(const Pool* pool) noexcept { return pool->name; }
Sharing pool_sharing(const Pool* pool) noexcept { return pool->sharing; }

}  // namespace cxlpool::detail::alloc

// SPDX-License-Identifier: MIT
// Tier ranking. Each target gets an abstract distance (1000 = local DRAM) from the best facts
// available, in this order, then targets are grouped into tiers (0 = fastest):
//
//   basis            used when                               abstract distance
//   perf             latency and/or bandwidth known          1000 * lat/lat_ref * bw_ref/bw
//                    (hmat, hwloc, config or default)        (as mm/memory-tiers.c; read+write
//                                                            sums when both sides know both)
//   slit             no perf, node with SLIT distances       1000 * d(nearest CPU node)/10
//   cpu-locality     nothing else                            1000 with CPUs, 2000 CPU-less
//
// The reference (lat_ref, bw_ref) is the CPU node with the lowest known read latency; if no
// CPU node has a latency, lat_ref is kDefaultDramLatencyNs (source "default").
// Worked example (QEMU guest, HMAT): node0 100 ns / 20 GB/s -> 1000; node1 300 ns / 5 GB/s
// -> 1000 * 3 * 4 = 12000 -> tier 1. Two sockets, no HMAT, SLIT 10/21: both nodes have CPUs,
// each is local to itself -> 1000, 1000 -> both tier 0.
// Grouping: sort by distance; a target opens a new tier when its distance exceeds the first
// distance of the current tier by more than kTierSpread (25%). An explicit tier= from
// configuration pins that target and does not shift the others.
#include <algorithm>
#include <cmath>

#include "topology/model.hpp"

namespace cxlpool::detail {
namespace {

// Sum of read (+ write when both sides know it) values.
bool ratio(const Attr<uint64_t>& r, const Attr<uint64_t>& w, const Attr<uint64_t>& r_ref, const Attr<uint64_t>& w_ref,
           double& out) {
  if (!r.known() || !r_ref.known() || r.value == 0 || r_ref.value == 0) return false;
  double num = double(r.value), den = double(r_ref.value);
  if (w.known() && w_ref.known() && w.value && w_ref.value) {
    num += double(w.value);
    den += double(w_ref.value);
  }
  out = num / den;
  return true;
}

bool has_cpus(const Target& t) { return t.kind == CXLPOOL_TARGET_NUMA_NODE && t.cpuless.known() && !t.cpuless.value; }

}  // namespace

void rank_targets(Topology& topo) {
  // Reference: CPU node with the lowest known read latency, else the first CPU node.
  const Target* ref = nullptr;
  for (auto& t : topo.targets)
    if (has_cpus(t) && t.read_latency_ns.known() && (!ref || t.read_latency_ns.value < ref->read_latency_ns.value))
      ref = &t;
  if (!ref)
    for (auto& t : topo.targets)
      if (has_cpus(t)) {
        ref = &t;
        break;
      }
  Attr<uint64_t> ref_rl, ref_wl, ref_rb, ref_wb;
  if (ref) {
    ref_rl = ref->read_latency_ns;
    ref_wl = ref->write_latency_ns;
    ref_rb = ref->read_bandwidth_mbps;
    ref_wb = ref->write_bandwidth_mbps;
  }
  if (!ref_rl.known()) {
    ref_rl.set(kDefaultDramLatencyNs, CXLPOOL_SOURCE_DEFAULT);
    ref_wl = {};
  }
  std::vector<int> cpu_nodes;
  for (auto& t : topo.targets)
    if (has_cpus(t)) cpu_nodes.push_back(t.numa_node);

  for (auto& t : topo.targets) {
    double lat = 0, bw = 0;
    bool have_lat = ratio(t.read_latency_ns, t.write_latency_ns, ref_rl, ref_wl, lat);
    bool have_bw = ratio(ref_rb, ref_wb, t.read_bandwidth_mbps, t.write_bandwidth_mbps, bw);
    if (have_lat || have_bw) {
      double d = kLocalDramDistance * (have_lat ? lat : 1.0) * (have_bw ? bw : 1.0);
      t.abstract_distance.set(d, CXLPOOL_SOURCE_COMPUTED);
      t.distance_basis = have_lat && have_bw ? "latency+bandwidth" : have_lat ? "latency" : "bandwidth";
      continue;
    }
    if (!t.distances.empty() && !cpu_nodes.empty()) {
      int best = 0;
      for (int c : cpu_nodes) {
        auto it = t.distances.find(c);
        if (it != t.distances.end() && (best == 0 || it->second < best)) best = it->second;
      }
      auto self = t.distances.find(t.numa_node);
      int local = self != t.distances.end() && self->second > 0 ? self->second : 10;
      if (best > 0) {
        t.abstract_distance.set(kLocalDramDistance * double(best) / double(local), CXLPOOL_SOURCE_COMPUTED);
        t.distance_basis = "slit";
        continue;
      }
    }
    bool cpuless = !t.cpuless.known() || t.cpuless.value;
    t.abstract_distance.set(cpuless ? 2 * kLocalDramDistance : kLocalDramDistance, CXLPOOL_SOURCE_COMPUTED);
    t.distance_basis = "cpu-locality";
  }

  std::vector<Target*> order;
  for (auto& t : topo.targets)
    if (!t.tier.known()) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const Target* a, const Target* b) {
    return a->abstract_distance.value < b->abstract_distance.value;
  });
  int tier = -1;
  double tier_start = 0;
  for (Target* t : order) {
    if (tier < 0 || t->abstract_distance.value > tier_start * kTierSpread) {
      ++tier;
      tier_start = t->abstract_distance.value;
    }
    t->tier.set(tier, CXLPOOL_SOURCE_COMPUTED);
  }
  topo.tier_count = 0;
  for (auto& t : topo.targets) topo.tier_count = std::max(topo.tier_count, t.tier.value + 1);
}

}  // namespace cxlpool::detail

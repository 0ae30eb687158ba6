// SPDX-License-Identifier: MIT
// The immutable topology model: memory targets with every attribute tagged by its source,
// CXL/DAX inventory, and the kernel's own tiering state. Built by discover().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backing/backing_spec.hpp"
#include "config/device_spec.hpp"
#include "cxlpool/topology.h"

namespace cxlpool::detail {

template <class T>
struct Attr {
  T value{};
  cxlpool_source_t source = CXLPOOL_SOURCE_UNKNOWN;
  bool known() const { return source != CXLPOOL_SOURCE_UNKNOWN; }
  void set(T v, cxlpool_source_t s) {
    value = v;
    source = s;
  }
  void set_if_unknown(T v, cxlpool_source_t s) {
    if (!known()) set(v, s);
  }
};

struct Target {
  std::string name;
  cxlpool_target_kind_t kind = CXLPOOL_TARGET_NUMA_NODE;
  int numa_node = -1;
  std::string cpulist;
  Attr<int64_t> cpu_count;
  Attr<bool> cpuless;
  Attr<uint64_t> capacity, free;
  Attr<uint64_t> read_latency_ns, write_latency_ns, read_bandwidth_mbps, write_bandwidth_mbps;
  Attr<int> kernel_tier;
  Attr<int> tier;
  Attr<double> abstract_distance;
  std::string distance_basis;  // which facts produced abstract_distance
  Attr<bool> cxl_backed;
  std::string cxl_region;  // region providing the memory, when cxl_backed
  Attr<int> interleave_weight;
  std::string hwloc_subtype;
  std::map<int, int> distances;  // SLIT: node id -> distance
  cxlpool_source_t distance_source = CXLPOOL_SOURCE_UNKNOWN;
  BackingSpec backing;
  cxlpool_backing_caps_t caps{};
  std::string origin;  // config origin of an emulated device
};

struct CxlMemdev {
  std::string name;
  std::optional<uint64_t> ram_bytes, pmem_bytes;
  std::string serial;
  int numa_node = -1;
};

struct CxlRegion {
  std::string name, mode;
  std::optional<uint64_t> size;
  std::optional<uint64_t> interleave_ways;
  std::vector<std::string> targets;  // endpoint decoders
  std::string dax_device;            // "dax0.0" when a DAX device sits on the region
  std::optional<uint64_t> resource;  // host physical start
};

struct DaxDevice {
  std::string name;  // "dax0.0"
  std::optional<uint64_t> size;
  std::optional<uint64_t> align;
  int target_node = -1;
  std::string driver;                // "device_dax" (devdax mode) or "kmem" (system RAM)
  std::optional<uint64_t> resource;  // host physical start (the kernel shows it to root only)
  bool under_cxl_root = false;       // its sysfs device sits below a CXL root port (cxl_acpi)
};

struct KernelState {
  Attr<int> numa_balancing;
  Attr<bool> demotion_enabled;
  Attr<bool> weighted_interleave;
  std::map<int, std::vector<int>> memory_tiers;  // memory_tierN -> nodes
  cxlpool_source_t memory_tiers_source = CXLPOOL_SOURCE_UNKNOWN;
};

struct Topology {
  std::vector<Target> targets;
  std::vector<CxlMemdev> memdevs;
  std::vector<CxlRegion> regions;
  std::vector<DaxDevice> dax_devices;
  KernelState kernel;
  std::vector<std::string> warnings;
  // The warnings (also in warnings) about declared sizes larger than the room there is now:
  // what cxlpool-run prints before it starts the program.
  std::vector<std::string> room_warnings;
  std::string sysfs_root, procfs_root;
  bool hwloc_used = false;
  std::string hwloc_note;  // version, or why hwloc was not used
  int tier_count = 0;
  bool default_device = false;

  const Target* find(const std::string& name) const;
};

struct DiscoverOptions {
  std::string sysfs_root = "/sys";
  std::string procfs_root;                 // empty: "/proc", or <sysfs_root>/../proc for a custom sysfs root
  std::optional<std::string> devices;      // overrides CXLPOOL_DEVICES
  std::optional<std::string> config_file;  // overrides CXLPOOL_CONFIG
  bool ignore_env = false;
  bool no_default_device = false;
  bool no_hwloc = false;
};

Topology discover(const DiscoverOptions& options);

// Node `node`'s memory now (MemTotal of its sysfs meminfo under sysfs_root), as discovery reads
// it: 0 when the node's directory is gone; nullopt when its meminfo is absent, refused or
// implausible (unknown: nothing to act on).
std::optional<uint64_t> node_memory_now(const std::string& sysfs_root, int node);

// Ranking (rank.cpp): fills abstract_distance, distance_basis and tier of every target.
void rank_targets(Topology& topo);

const char* backing_kind_str(cxlpool_backing_kind_t kind);
const char* target_kind_str(cxlpool_target_kind_t kind);

// JSON document of the whole topology (json.cpp); schema in docs/topology.md.
std::string topology_to_json(const Topology& topo);

// Published figures used as labelled defaults (source "default"); see docs/topology.md.
inline constexpr uint64_t kDefaultCxlLatencyNs = 250;        // Melody (ASPLOS'25): 140-410 ns
inline constexpr uint64_t kDefaultCxlBandwidthMbps = 30000;  // x8 CXL expanders: 18-36 GB/s
inline constexpr uint64_t kDefaultDramLatencyNs = 100;       // local DDR idle load-to-use
inline constexpr double kLocalDramDistance = 1000.0;         // abstract distance of local DRAM
inline constexpr double kTierSpread = 1.25;                  // new tier beyond +25% of a tier's first

}  // namespace cxlpool::detail

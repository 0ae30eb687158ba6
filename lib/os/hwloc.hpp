// SPDX-License-Identifier: MIT
// hwloc behind the OS seam: memory attributes (latency, bandwidth, capacity) and subtype of
// every NUMA node, as plain values, so topology code never includes hwloc.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cxlpool::os {

struct HwlocNodeFacts {
  int os_index = -1;
  std::optional<uint64_t> capacity_bytes;
  std::optional<uint64_t> read_latency_ns, write_latency_ns, latency_ns;
  std::optional<uint64_t> read_bandwidth_mbps, write_bandwidth_mbps, bandwidth_mbps;
  std::string subtype;  // e.g. "DRAM", "HBM", "NVM", "CXL-DRAM" when hwloc knows it
};

struct HwlocReport {
  bool available = false;  // false: built without hwloc or hwloc failed (see error)
  std::string error;
  std::string version;
  std::vector<HwlocNodeFacts> nodes;
};

// Loads the live machine topology with hwloc; values are those hwloc reports for the best
// (local) initiator of each node.
HwlocReport hwloc_memory_facts();

}  // namespace cxlpool::os

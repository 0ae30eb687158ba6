// SPDX-License-Identifier: MIT
// hwloc memattr queries (hwloc >= 2.3). Compiled to a "not available" report when the build
// has no hwloc (CXLPOOL_WITH_HWLOC=OFF).
#include "os/hwloc.hpp"

#ifdef CXLPOOL_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace cxlpool::os {

#ifdef CXLPOOL_HAVE_HWLOC
namespace {
std::optional<uint64_t> best_value(hwloc_topology_t topo, hwloc_memattr_id_t attr, hwloc_obj_t node) {
  hwloc_uint64_t value = 0;
  // Values depend on the initiator; report those of the node's best initiator (access0).
  struct hwloc_location best {};
  if (hwloc_memattr_get_best_initiator(topo, attr, node, 0, &best, &value) == 0) return uint64_t(value);
  // Attributes without initiators (capacity, locality).
  if (hwloc_memattr_get_value(topo, attr, node, nullptr, 0, &value) == 0) return uint64_t(value);
  return std::nullopt;
}
}  // namespace

HwlocReport hwloc_memory_facts() {
  HwlocReport r;
  unsigned v = hwloc_get_api_version();
  r.version = "API " + std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff);
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) {
    r.error = "hwloc_topology_init failed";
    return r;
  }
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    r.error = "hwloc_topology_load failed";
    return r;
  }
  r.available = true;
  int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, unsigned(i));
    HwlocNodeFacts f;
    f.os_index = int(node->os_index);
    if (node->subtype) f.subtype = node->subtype;
    f.capacity_bytes = best_value(topo, HWLOC_MEMATTR_ID_CAPACITY, node);
    f.read_latency_ns = best_value(topo, HWLOC_MEMATTR_ID_READ_LATENCY, node);
    f.write_latency_ns = best_value(topo, HWLOC_MEMATTR_ID_WRITE_LATENCY, node);
    f.latency_ns = best_value(topo, HWLOC_MEMATTR_ID_LATENCY, node);
    f.read_bandwidth_mbps = best_value(topo, HWLOC_MEMATTR_ID_READ_BANDWIDTH, node);
    f.write_bandwidth_mbps = best_value(topo, HWLOC_MEMATTR_ID_WRITE_BANDWIDTH, node);
    f.bandwidth_mbps = best_value(topo, HWLOC_MEMATTR_ID_BANDWIDTH, node);
    r.nodes.push_back(std::move(f));
  }
  hwloc_topology_destroy(topo);
  return r;
}
#else
HwlocReport hwloc_memory_facts() {
  HwlocReport r;
  r.error = "built without hwloc (CXLPOOL_WITH_HWLOC=OFF)";
  return r;
}
#endif

}  // namespace cxlpool::os

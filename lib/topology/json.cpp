// SPDX-License-Identifier: MIT
// JSON rendering of a Topology (schema documented in docs/topology.md). Every attribute is
// an object {"value": ..., "source": "..."} with value null when unknown.
#include "common/json.hpp"

#include "backing/provider.hpp"
#include "common/names.hpp"
#include "topology/model.hpp"

namespace cxlpool::detail {
namespace {

template <class T>
void attr(JsonWriter& j, const char* name, const Attr<T>& a) {
  j.key(name).begin_object().key("value");
  if (a.known())
    j.value(a.value);
  else
    j.null();
  j.key("source").value(source_name(a.source)).end_object();
}

template <class T>
void opt(JsonWriter& j, const char* name, const std::optional<T>& v) {
  j.key(name);
  if (v)
    j.value(*v);
  else
    j.null();
}

}  // namespace

const char* target_kind_str(cxlpool_target_kind_t k) {
  switch (k) {
    case CXLPOOL_TARGET_NUMA_NODE:
      return "numa";
    case CXLPOOL_TARGET_EMULATED:
      return "emulated";
    case CXLPOOL_TARGET_DAX:
      return "dax";
    default:
      break;
  }
  return "unknown";
}

const char* backing_kind_str(cxlpool_backing_kind_t k) {
  const Provider* p = provider_for(k);
  return p ? p->word : "unknown";
}

std::string topology_to_json(const Topology& topo) {
  JsonWriter j;
  j.begin_object();
  j.key("cxlpool_version").value(version_string());
  j.key("sysfs_root").value(topo.sysfs_root);
  j.key("procfs_root");
  if (topo.procfs_root.empty())
    j.null();
  else
    j.value(topo.procfs_root);
  j.key("hwloc").begin_object().key("used").value(topo.hwloc_used).key("note").value(topo.hwloc_note).end_object();
  j.key("tier_count").value(topo.tier_count);

  j.key("targets").begin_array();
  for (auto& t : topo.targets) {
    j.begin_object();
    j.key("name").value(t.name);
    j.key("kind").value(target_kind_str(t.kind));
    j.key("numa_node");
    if (t.numa_node >= 0)
      j.value(t.numa_node);
    else
      j.null();
    if (!t.origin.empty()) j.key("declared_at").value(t.origin);
    j.key("cpus").begin_object().key("list").value(t.cpulist).key("count");
    if (t.cpu_count.known())
      j.value(t.cpu_count.value);
    else
      j.null();
    j.key("source").value(source_name(t.cpu_count.source)).end_object();
    attr(j, "cpuless", t.cpuless);
    attr(j, "capacity_bytes", t.capacity);
    attr(j, "free_bytes", t.free);
    attr(j, "read_latency_ns", t.read_latency_ns);
    attr(j, "write_latency_ns", t.write_latency_ns);
    attr(j, "read_bandwidth_mbps", t.read_bandwidth_mbps);
    attr(j, "write_bandwidth_mbps", t.write_bandwidth_mbps);
    attr(j, "kernel_tier", t.kernel_tier);
    attr(j, "tier", t.tier);
    j.key("abstract_distance").begin_object().key("value").value(t.abstract_distance.value);
    j.key("basis").value(t.distance_basis).key("source").value(source_name(t.abstract_distance.source)).end_object();
    attr(j, "cxl_backed", t.cxl_backed);
    if (!t.cxl_region.empty()) j.key("cxl_region").value(t.cxl_region);
    attr(j, "interleave_weight", t.interleave_weight);
    if (!t.hwloc_subtype.empty()) j.key("hwloc_subtype").value(t.hwloc_subtype);
    j.key("distances").begin_object().key("value");
    if (t.distances.empty())
      j.null();
    else {
      j.begin_object();
      for (auto& [node, d] : t.distances) j.key("node" + std::to_string(node)).value(d);
      j.end_object();
    }
    j.key("source").value(source_name(t.distance_source)).end_object();
    j.key("backing").begin_object();
    j.key("kind").value(backing_kind_str(t.backing.kind));
    j.key("path");
    if (t.backing.path.empty())
      j.null();
    else
      j.value(t.backing.path);
    j.key("shareable").value(bool(t.caps.shareable));
    j.key("kernel_migratable").value(bool(t.caps.kernel_migratable));
    j.key("decommit_frees_memory").value(bool(t.caps.decommit_frees_memory));
    j.key("page_size").value(uint64_t(t.caps.page_size));
    j.end_object();
    j.end_object();
  }
  j.end_array();

  j.key("tiers").begin_array();
  for (int tier = 0; tier < topo.tier_count; ++tier) {
    j.begin_object().key("tier").value(tier).key("targets").begin_array();
    for (auto& t : topo.targets)
      if (t.tier.value == tier) j.value(t.name);
    j.end_array().end_object();
  }
  j.end_array();

  j.key("cxl").begin_object().key("memdevs").begin_array();
  for (auto& m : topo.memdevs) {
    j.begin_object().key("name").value(m.name);
    opt(j, "ram_bytes", m.ram_bytes);
    opt(j, "pmem_bytes", m.pmem_bytes);
    j.key("serial").value(m.serial).key("numa_node").value(m.numa_node).key("source").value("sysfs").end_object();
  }
  j.end_array().key("regions").begin_array();
  for (auto& r : topo.regions) {
    j.begin_object().key("name").value(r.name).key("mode").value(r.mode);
    opt(j, "size_bytes", r.size);
    opt(j, "interleave_ways", r.interleave_ways);
    j.key("targets").begin_array();
    for (auto& t : r.targets) j.value(t);
    j.end_array();
    j.key("dax_device");
    if (r.dax_device.empty())
      j.null();
    else
      j.value(r.dax_device);
    j.key("source").value("sysfs").end_object();
  }
  j.end_array().end_object();

  j.key("dax_devices").begin_array();
  for (auto& d : topo.dax_devices) {
    j.begin_object().key("name").value(d.name);
    opt(j, "size_bytes", d.size);
    opt(j, "align", d.align);
    j.key("target_node").value(d.target_node).key("driver").value(d.driver);
    const char* mode = d.driver == "kmem" ? "system-ram" : d.driver == "device_dax" ? "devdax" : "unbound";
    j.key("mode").value(mode).key("source").value("sysfs").end_object();
  }
  j.end_array();

  const KernelState& k = topo.kernel;
  j.key("kernel").begin_object();
  attr(j, "numa_balancing", k.numa_balancing);
  attr(j, "demotion_enabled", k.demotion_enabled);
  attr(j, "weighted_interleave", k.weighted_interleave);
  j.key("memory_tiers").begin_object().key("value").begin_array();
  for (auto& [id, nodes] : k.memory_tiers) {
    j.begin_object().key("id").value(id).key("nodes").begin_array();
    for (int n : nodes) j.value(n);
    j.end_array().end_object();
  }
  j.end_array().key("source").value(source_name(k.memory_tiers_source)).end_object();
  j.end_object();

  j.key("warnings").begin_array();
  for (auto& w : topo.warnings) j.value(w);
  j.end_array();
  j.end_object();
  return j.str() + "\n";
}

}  // namespace cxlpool::detail

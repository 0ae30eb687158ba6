// SPDX-License-Identifier: MIT
// C ABI for discovery configuration and the topology snapshot.
#include <cstdlib>
#include <cstring>

#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "common/parse.hpp"
#include "cxlpool/topology.h"

using namespace cxlpool::detail;

namespace {
const Target& target_at(const cxlpool_topology_t* topo, size_t index, const char* fn) {
  if (index >= topo->model.targets.size())
    fail(CXLPOOL_E_NOT_FOUND, std::string(fn) + ": target index " + std::to_string(index) + " out of range (" +
                                  std::to_string(topo->model.targets.size()) + " targets)");
  return topo->model.targets[index];
}

void build_components(cxlpool_topology& t) {
  using C = cxlpool_topology::Component;
  for (auto& m : t.model.memdevs) {
    std::string detail = "ram " + (m.ram_bytes ? format_bytes(*m.ram_bytes) : std::string("?")) + ", pmem " +
                         (m.pmem_bytes ? format_bytes(*m.pmem_bytes) : std::string("?")) + ", serial " + m.serial;
    t.components.push_back(C{CXLPOOL_COMPONENT_CXL_MEMDEV, m.name, "", detail,
                             m.ram_bytes.value_or(0) + m.pmem_bytes.value_or(0), m.numa_node});
  }
  for (auto& r : t.model.regions) {
    std::string detail = std::to_string(r.interleave_ways.value_or(0)) + "-way interleave";
    for (auto& target : r.targets) detail += " " + target;
    if (!r.dax_device.empty()) detail += ", dax " + r.dax_device;
    t.components.push_back(C{CXLPOOL_COMPONENT_CXL_REGION, r.name, r.mode, detail, r.size.value_or(0), -1});
  }
  for (auto& d : t.model.dax_devices) {
    std::string detail = "driver " + (d.driver.empty() ? std::string("none") : d.driver) + ", align " +
                         (d.align ? std::to_string(*d.align) : std::string("?"));
    const char* mode = d.driver == "kmem" ? "system-ram" : d.driver == "device_dax" ? "devdax" : "unbound";
    t.components.push_back(C{CXLPOOL_COMPONENT_DAX, d.name, mode, detail, d.size.value_or(0), d.target_node});
  }
}

template <class T>
cxlpool_attr_value_t to_c(const Attr<T>& a) {
  cxlpool_attr_value_t v{};
  v.known = a.known();
  v.source = a.source;
  v.value = a.known() ? int64_t(a.value) : 0;
  return v;
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_config_create(cxlpool_config_t** out) {
  return guarded([&] {
    require(out, "cxlpool_config_create", "out is NULL");
    *out = new cxlpool_config();
  });
}

void cxlpool_config_destroy(cxlpool_config_t* config) { delete config; }

cxlpool_status_t cxlpool_config_set_sysfs_root(cxlpool_config_t* config, const char* dir) {
  return guarded([&] {
    require(config, "cxlpool_config_set_sysfs_root", "config is NULL");
    require(dir && *dir, "cxlpool_config_set_sysfs_root", "dir is NULL or empty");
    config->options.sysfs_root = dir;
  });
}

cxlpool_status_t cxlpool_config_set_procfs_root(cxlpool_config_t* config, const char* dir) {
  return guarded([&] {
    require(config, "cxlpool_config_set_procfs_root", "config is NULL");
    require(dir && *dir, "cxlpool_config_set_procfs_root", "dir is NULL or empty");
    config->options.procfs_root = dir;
  });
}

cxlpool_status_t cxlpool_config_set_devices(cxlpool_config_t* config, const char* spec) {
  return guarded([&] {
    require(config, "cxlpool_config_set_devices", "config is NULL");
    require(spec, "cxlpool_config_set_devices", "spec is NULL");
    config->options.devices = spec;
  });
}

cxlpool_status_t cxlpool_config_set_config_file(cxlpool_config_t* config, const char* path) {
  return guarded([&] {
    require(config, "cxlpool_config_set_config_file", "config is NULL");
    require(path && *path, "cxlpool_config_set_config_file", "path is NULL or empty");
    config->options.config_file = path;
  });
}

cxlpool_status_t cxlpool_config_set_flags(cxlpool_config_t* config, uint32_t flags) {
  return guarded([&] {
    require(config, "cxlpool_config_set_flags", "config is NULL");
    const uint32_t known = CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE | CXLPOOL_CONFIG_NO_HWLOC;
    if (flags & ~known)
      fail(
          CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_config_set_flags: unknown flag bits 0x" + [&] {
            char b[16];
            snprintf(b, sizeof b, "%x", flags & ~known);
            return std::string(b);
          }());
    auto& o = config->options;
    o.ignore_env |= (flags & CXLPOOL_CONFIG_IGNORE_ENV) != 0;
    o.no_default_device |= (flags & CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) != 0;
    o.no_hwloc |= (flags & CXLPOOL_CONFIG_NO_HWLOC) != 0;
  });
}

cxlpool_status_t cxlpool_topology_discover(const cxlpool_config_t* config, cxlpool_topology_t** out) {
  return guarded([&] {
    require(out, "cxlpool_topology_discover", "out is NULL");
    DiscoverOptions defaults;
    auto topo = std::make_unique<cxlpool_topology>();
    topo->model = discover(config ? config->options : defaults);
    build_components(*topo);
    *out = topo.release();
  });
}

void cxlpool_topology_destroy(cxlpool_topology_t* topology) { delete topology; }

const char* cxlpool_target_kind_str(cxlpool_target_kind_t kind) { return target_kind_str(kind); }
const char* cxlpool_backing_kind_str(cxlpool_backing_kind_t kind) { return backing_kind_str(kind); }

cxlpool_status_t cxlpool_topology_target_count(const cxlpool_topology_t* topology, size_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_target_count", "topology or out is NULL");
    *out = topology->model.targets.size();
  });
}

cxlpool_status_t cxlpool_topology_get_target(const cxlpool_topology_t* topology, size_t index,
                                             cxlpool_target_info_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_get_target", "topology or out is NULL");
    const Target& t = target_at(topology, index, "cxlpool_topology_get_target");
    cxlpool_target_info_t info{};
    info.name = t.name.c_str();
    info.kind = t.kind;
    info.numa_node = t.numa_node;
    info.tier = t.tier.value;
    info.cpuless = t.cpuless.known() ? int(t.cpuless.value) : 1;
    info.cpulist = t.cpulist.c_str();
    info.backing = t.backing.kind;
    info.backing_path = t.backing.path.c_str();
    info.capacity_bytes = t.capacity.known() ? t.capacity.value : 0;
    *out = info;
  });
}

cxlpool_status_t cxlpool_topology_find_target(const cxlpool_topology_t* topology, const char* name, size_t* out) {
  return guarded([&] {
    require(topology && name && out, "cxlpool_topology_find_target", "topology, name or out is NULL");
    auto& ts = topology->model.targets;
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i].name == name) {
        *out = i;
        return;
      }
    fail(CXLPOOL_E_NOT_FOUND, std::string("cxlpool_topology_find_target: no target named '") + name + "'");
  });
}

cxlpool_status_t cxlpool_target_get_attr(const cxlpool_topology_t* topology, size_t index, cxlpool_attr_t attr,
                                         cxlpool_attr_value_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_target_get_attr", "topology or out is NULL");
    const Target& t = target_at(topology, index, "cxlpool_target_get_attr");
    cxlpool_attr_value_t v{};
    switch (attr) {
      case CXLPOOL_ATTR_CAPACITY_BYTES:
        v = to_c(t.capacity);
        break;
      case CXLPOOL_ATTR_FREE_BYTES:
        v = to_c(t.free);
        break;
      case CXLPOOL_ATTR_READ_LATENCY_NS:
        v = to_c(t.read_latency_ns);
        break;
      case CXLPOOL_ATTR_WRITE_LATENCY_NS:
        v = to_c(t.write_latency_ns);
        break;
      case CXLPOOL_ATTR_READ_BANDWIDTH_MBPS:
        v = to_c(t.read_bandwidth_mbps);
        break;
      case CXLPOOL_ATTR_WRITE_BANDWIDTH_MBPS:
        v = to_c(t.write_bandwidth_mbps);
        break;
      case CXLPOOL_ATTR_KERNEL_TIER:
        v = to_c(t.kernel_tier);
        break;
      case CXLPOOL_ATTR_TIER:
        v = to_c(t.tier);
        break;
      case CXLPOOL_ATTR_CPU_COUNT:
        v = to_c(t.cpu_count);
        break;
      case CXLPOOL_ATTR_CPULESS:
        v = to_c(t.cpuless);
        break;
      case CXLPOOL_ATTR_CXL_BACKED:
        v = to_c(t.cxl_backed);
        break;
      case CXLPOOL_ATTR_PAGE_SIZE:
        v = {int64_t(t.caps.page_size), t.kind == CXLPOOL_TARGET_DAX ? CXLPOOL_SOURCE_SYSFS : CXLPOOL_SOURCE_COMPUTED,
             1};
        break;
      case CXLPOOL_ATTR_ABSTRACT_DISTANCE:
        v = to_c(t.abstract_distance);
        break;
      case CXLPOOL_ATTR_INTERLEAVE_WEIGHT:
        v = to_c(t.interleave_weight);
        break;
      default:
        fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_target_get_attr: unknown attribute " + std::to_string(int(attr)));
    }
    *out = v;
  });
}

cxlpool_status_t cxlpool_target_get_distance(const cxlpool_topology_t* topology, size_t from, size_t to,
                                             cxlpool_attr_value_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_target_get_distance", "topology or out is NULL");
    const Target& a = target_at(topology, from, "cxlpool_target_get_distance");
    const Target& b = target_at(topology, to, "cxlpool_target_get_distance");
    cxlpool_attr_value_t v{};
    auto it = a.distances.find(b.numa_node);
    if (b.numa_node >= 0 && it != a.distances.end()) v = {it->second, a.distance_source, 1};
    *out = v;
  });
}

cxlpool_status_t cxlpool_topology_tier_count(const cxlpool_topology_t* topology, int* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_tier_count", "topology or out is NULL");
    *out = topology->model.tier_count;
  });
}

cxlpool_status_t cxlpool_topology_get_kernel_state(const cxlpool_topology_t* topology, cxlpool_kernel_state_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_get_kernel_state", "topology or out is NULL");
    const KernelState& k = topology->model.kernel;
    cxlpool_kernel_state_t s{};
    s.numa_balancing = to_c(k.numa_balancing);
    s.demotion_enabled = to_c(k.demotion_enabled);
    s.weighted_interleave = to_c(k.weighted_interleave);
    s.memory_tier_count = {int64_t(k.memory_tiers.size()), k.memory_tiers_source,
                           k.memory_tiers_source != CXLPOOL_SOURCE_UNKNOWN};
    *out = s;
  });
}

cxlpool_status_t cxlpool_topology_component_count(const cxlpool_topology_t* topology, size_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_component_count", "topology or out is NULL");
    *out = topology->components.size();
  });
}

cxlpool_status_t cxlpool_topology_get_component(const cxlpool_topology_t* topology, size_t index,
                                                cxlpool_component_info_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_get_component", "topology or out is NULL");
    if (index >= topology->components.size())
      fail(CXLPOOL_E_NOT_FOUND, "cxlpool_topology_get_component: index " + std::to_string(index) + " out of range");
    auto& c = topology->components[index];
    cxlpool_component_info_t info{};
    info.kind = c.kind;
    info.name = c.name.c_str();
    info.size_bytes = c.size;
    info.numa_node = c.numa_node;
    info.mode = c.mode.c_str();
    info.detail = c.detail.c_str();
    *out = info;
  });
}

cxlpool_status_t cxlpool_topology_warning_count(const cxlpool_topology_t* topology, size_t* out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_warning_count", "topology or out is NULL");
    *out = topology->model.warnings.size();
  });
}

cxlpool_status_t cxlpool_topology_get_warning(const cxlpool_topology_t* topology, size_t index, const char** out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_get_warning", "topology or out is NULL");
    auto& w = topology->model.warnings;
    if (index >= w.size())
      fail(CXLPOOL_E_NOT_FOUND, "cxlpool_topology_get_warning: index " + std::to_string(index) + " out of range");
    *out = w[index].c_str();
  });
}

cxlpool_status_t cxlpool_topology_to_json(const cxlpool_topology_t* topology, char** out) {
  return guarded([&] {
    require(topology && out, "cxlpool_topology_to_json", "topology or out is NULL");
    std::string json = topology_to_json(topology->model);
    char* s = static_cast<char*>(std::malloc(json.size() + 1));
    if (!s) throw std::bad_alloc();
    std::memcpy(s, json.c_str(), json.size() + 1);
    *out = s;
  });
}

void cxlpool_string_free(char* s) { std::free(s); }

}  // extern "C"

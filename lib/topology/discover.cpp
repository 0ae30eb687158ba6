// SPDX-License-Identifier: MIT
// Topology discovery: NUMA nodes, HMAT, memory tiers and weighted-interleave state from sysfs;
// CXL memdevs/regions and DAX devices; hwloc memattrs to fill gaps; declared and default
// emulated devices; then ranking and warnings. Every attribute records its source.
#include <algorithm>
#include <cerrno>

#include "common/error.hpp"
#include "common/parse.hpp"
#include "config/options.hpp"
#include "os/fs_root.hpp"
#include "os/hwloc.hpp"
#include "os/os.hpp"
#include "topology/model.hpp"

namespace cxlpool::detail {

const Target* Topology::find(const std::string& name) const {
  for (auto& t : targets)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

constexpr const char* kNodeDir = "devices/system/node";

// sysfs numbers: decimal, or hex with 0x (CXL sizes and serials).
std::optional<uint64_t> sysfs_u64(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  std::string_view v = trim(*s);
  if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
    uint64_t out = 0;
    for (char c : v.substr(2)) {
      int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
              : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
              : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                          : -1;
      if (d < 0 || out >> 60) return std::nullopt;
      out = out * 16 + uint64_t(d);
    }
    return out;
  }
  return parse_u64(v);
}

std::optional<int64_t> sysfs_i64(const std::optional<std::string>& s) {
  if (!s) return std::nullopt;
  std::string_view v = trim(*s);
  bool neg = !v.empty() && v[0] == '-';
  auto u = parse_u64(neg ? v.substr(1) : v);
  if (!u || *u > uint64_t(INT64_MAX)) return std::nullopt;
  return neg ? -int64_t(*u) : int64_t(*u);
}

// "Node 0 MemTotal:       24576000 kB" -> bytes of the named field.
std::optional<uint64_t> meminfo_field(const std::string& text, const std::string& field) {
  for (std::string_view line : split(text, '\n')) {
    auto pos = line.find(field + ":");
    if (pos == std::string_view::npos) continue;
    std::string_view rest = trim(line.substr(pos + field.size() + 1));
    auto sp = rest.find(' ');
    auto kb = parse_u64(rest.substr(0, sp));
    if (!kb) return std::nullopt;
    return *kb * 1024;
  }
  return std::nullopt;
}

std::vector<int> node_ids(const os::FsRoot& sys) {
  std::vector<int> ids;
  if (auto online = sys.read(std::string(kNodeDir) + "/online"))
    if (auto parsed = parse_id_list(*online)) return *parsed;
  for (auto& e : sys.list(kNodeDir))
    if (e.size() > 4 && e.compare(0, 4, "node") == 0)
      if (auto id = parse_u64(std::string_view(e).substr(4))) ids.push_back(int(*id));
  std::sort(ids.begin(), ids.end());
  return ids;
}

void read_hmat(const os::FsRoot& sys, const std::string& node_dir, Target& t) {
  const std::string base = node_dir + "/access0/initiators/";
  auto get = [&](const char* file, Attr<uint64_t>& attr) {
    auto v = sysfs_u64(sys.read(base + file));
    if (v && *v > 0) attr.set(*v, CXLPOOL_SOURCE_HMAT);
  };
  get("read_latency", t.read_latency_ns);
  get("write_latency", t.write_latency_ns);
  get("read_bandwidth", t.read_bandwidth_mbps);
  get("write_bandwidth", t.write_bandwidth_mbps);
}

void discover_nodes(const os::FsRoot& sys, Topology& topo) {
  std::vector<int> ids = node_ids(sys);
  std::optional<std::vector<int>> has_memory;
  if (auto hm = sys.read(std::string(kNodeDir) + "/has_memory")) has_memory = parse_id_list(*hm);
  for (int id : ids) {
    const std::string dir = std::string(kNodeDir) + "/node" + std::to_string(id);
    if (!sys.exists(dir)) continue;
    Target t;
    t.name = "node" + std::to_string(id);
    t.kind = CXLPOOL_TARGET_NUMA_NODE;
    t.numa_node = id;
    if (auto cpus = sys.read(dir + "/cpulist")) {
      t.cpulist = std::string(trim(*cpus));
      if (auto list = parse_id_list(t.cpulist)) {
        t.cpu_count.set(int64_t(list->size()), CXLPOOL_SOURCE_SYSFS);
        t.cpuless.set(list->empty(), CXLPOOL_SOURCE_SYSFS);
      }
    }
    if (auto mi = sys.read(dir + "/meminfo")) {
      if (auto v = meminfo_field(*mi, "MemTotal")) t.capacity.set(*v, CXLPOOL_SOURCE_SYSFS);
      if (auto v = meminfo_field(*mi, "MemFree")) t.free.set(*v, CXLPOOL_SOURCE_SYSFS);
    }
    bool memory = has_memory ? std::binary_search(has_memory->begin(), has_memory->end(), id)
                             : (t.capacity.known() && t.capacity.value > 0);
    if (!memory) continue;  // a CPU-only node offers no memory target
    if (auto dist = sys.read(dir + "/distance")) {
      size_t i = 0;
      for (auto piece : split(trim(*dist), ' ')) {
        if (piece.empty()) continue;
        auto d = parse_u64(piece);
        if (d && i < ids.size()) t.distances[ids[i]] = int(*d);
        ++i;
      }
      if (!t.distances.empty()) t.distance_source = CXLPOOL_SOURCE_SLIT;
    }
    read_hmat(sys, dir, t);
    t.backing.device_name = t.name;
    t.backing.kind = CXLPOOL_BACKING_NUMA;
    t.backing.numa_node = id;
    t.backing.capacity = t.capacity.known() ? t.capacity.value : 0;
    topo.targets.push_back(std::move(t));
  }
}

void discover_kernel_state(const os::FsRoot& sys, const os::FsRoot& proc, Topology& topo) {
  KernelState& k = topo.kernel;
  if (auto v = sysfs_i64(proc.read("sys/kernel/numa_balancing"))) k.numa_balancing.set(int(*v), CXLPOOL_SOURCE_PROCFS);
  if (auto v = sys.read("kernel/mm/numa/demotion_enabled")) {
    std::string_view s = trim(*v);
    if (s == "true" || s == "1")
      k.demotion_enabled.set(true, CXLPOOL_SOURCE_SYSFS);
    else if (s == "false" || s == "0")
      k.demotion_enabled.set(false, CXLPOOL_SOURCE_SYSFS);
  }
  const std::string wi = "kernel/mm/mempolicy/weighted_interleave";
  k.weighted_interleave.set(sys.exists(wi), CXLPOOL_SOURCE_SYSFS);
  for (auto& t : topo.targets) {
    if (t.kind != CXLPOOL_TARGET_NUMA_NODE) continue;
    if (auto w = sysfs_u64(sys.read(wi + "/node" + std::to_string(t.numa_node))))
      t.interleave_weight.set(int(*w), CXLPOOL_SOURCE_SYSFS);
  }
  const std::string mt = "devices/virtual/memory_tiering";
  if (sys.exists(mt)) k.memory_tiers_source = CXLPOOL_SOURCE_SYSFS;
  for (auto& e : sys.list(mt)) {
    if (e.compare(0, 11, "memory_tier") != 0) continue;
    auto id = parse_u64(std::string_view(e).substr(11));
    if (!id) continue;
    auto nodes_text = sys.read(mt + "/" + e + "/nodelist");
    if (!nodes_text) nodes_text = sys.read(mt + "/" + e + "/nodes");
    auto nodes = nodes_text ? parse_id_list(*nodes_text) : std::nullopt;
    if (!nodes) continue;
    k.memory_tiers[int(*id)] = *nodes;
    for (int n : *nodes)
      for (auto& t : topo.targets)
        if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.numa_node == n) t.kernel_tier.set(int(*id), CXLPOOL_SOURCE_SYSFS);
  }
}

void discover_cxl_and_dax(const os::FsRoot& sys, Topology& topo) {
  const std::string dax_dir = "bus/dax/devices";
  for (auto& e : sys.list(dax_dir)) {
    const std::string d = dax_dir + "/" + e;
    DaxDevice dev;
    dev.name = e;
    dev.size = sysfs_u64(sys.read(d + "/size"));
    dev.align = sysfs_u64(sys.read(d + "/align"));
    if (auto tn = sysfs_i64(sys.read(d + "/target_node"))) dev.target_node = int(*tn);
    if (auto drv = sys.link_basename(d + "/driver")) dev.driver = *drv;
    topo.dax_devices.push_back(dev);
  }
  const std::string cxl_dir = "bus/cxl/devices";
  for (auto& e : sys.list(cxl_dir)) {
    const std::string d = cxl_dir + "/" + e;
    if (e.compare(0, 3, "mem") == 0 && sysfs_u64(std::string(e.substr(3)))) {
      CxlMemdev m;
      m.name = e;
      m.ram_bytes = sysfs_u64(sys.read(d + "/ram/size"));
      m.pmem_bytes = sysfs_u64(sys.read(d + "/pmem/size"));
      if (auto s = sys.read(d + "/serial")) m.serial = std::string(trim(*s));
      if (auto n = sysfs_i64(sys.read(d + "/numa_node"))) m.numa_node = int(*n);
      topo.memdevs.push_back(m);
    } else if (e.compare(0, 6, "region") == 0 && sysfs_u64(std::string(e.substr(6)))) {
      CxlRegion r;
      r.name = e;
      if (auto m = sys.read(d + "/mode")) r.mode = std::string(trim(*m));
      r.size = sysfs_u64(sys.read(d + "/size"));
      r.interleave_ways = sysfs_u64(sys.read(d + "/interleave_ways"));
      for (uint64_t i = 0; r.interleave_ways && i < *r.interleave_ways && i < 64; ++i)
        if (auto t = sys.read(d + "/target" + std::to_string(i))) r.targets.push_back(std::string(trim(*t)));
      for (auto& sub : sys.list(d)) {
        if (sub.compare(0, 10, "dax_region") != 0) continue;
        for (auto& dx : sys.list(d + "/" + sub))
          if (dx.compare(0, 3, "dax") == 0 && dx.find('.') != std::string::npos) r.dax_device = dx;
      }
      topo.regions.push_back(r);
    }
  }
  // A CXL region whose DAX device was onlined as system RAM (kmem) provides a node's memory.
  for (auto& r : topo.regions) {
    for (auto& dax : topo.dax_devices) {
      if (dax.name != r.dax_device || dax.driver != "kmem" || dax.target_node < 0) continue;
      for (auto& t : topo.targets)
        if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.numa_node == dax.target_node) {
          t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
          t.cxl_region = r.name;
        }
    }
  }
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE && !t.cxl_backed.known() && sys.exists("bus/cxl"))
      t.cxl_backed.set(false, CXLPOOL_SOURCE_SYSFS);
  // DAX devices bound to device_dax are mappable targets of their own; kmem ones are system
  // RAM (a node); unbound ones cannot be opened (ENXIO) and are only listed.
  for (auto& dax : topo.dax_devices) {
    if (dax.driver != "device_dax") {
      if (dax.driver != "kmem")
        topo.warnings.push_back("DAX device " + dax.name +
                                " has no driver: bind it to device_dax (devdax mode) "
                                "or kmem (system RAM) to use it");
      continue;
    }
    Target t;
    t.name = dax.name;
    t.kind = CXLPOOL_TARGET_DAX;
    t.numa_node = dax.target_node;
    t.cpuless.set(true, CXLPOOL_SOURCE_SYSFS);
    if (dax.size) t.capacity.set(*dax.size, CXLPOOL_SOURCE_SYSFS);
    for (auto& r : topo.regions)
      if (r.dax_device == dax.name) {
        t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
        t.cxl_region = r.name;
      }
    t.backing.device_name = t.name;
    t.backing.kind = CXLPOOL_BACKING_DEVDAX;
    t.backing.path = "/dev/" + dax.name;
    t.backing.capacity = dax.size.value_or(0);
    t.backing.page_size = size_t(dax.align.value_or(0));
    topo.targets.push_back(std::move(t));
  }
}

void apply_hwloc(Topology& topo) {
  os::HwlocReport r = os::hwloc_memory_facts();
  if (!r.available) {
    topo.hwloc_note = r.error;
    return;
  }
  topo.hwloc_used = true;
  topo.hwloc_note = "hwloc " + r.version;
  for (auto& f : r.nodes) {
    for (auto& t : topo.targets) {
      if (t.kind != CXLPOOL_TARGET_NUMA_NODE || t.numa_node != f.os_index) continue;
      auto fill = [](Attr<uint64_t>& a, const std::optional<uint64_t>& v) {
        if (v && *v > 0) a.set_if_unknown(*v, CXLPOOL_SOURCE_HWLOC);
      };
      fill(t.read_latency_ns, f.read_latency_ns ? f.read_latency_ns : f.latency_ns);
      fill(t.write_latency_ns, f.write_latency_ns);
      fill(t.read_bandwidth_mbps, f.read_bandwidth_mbps ? f.read_bandwidth_mbps : f.bandwidth_mbps);
      fill(t.write_bandwidth_mbps, f.write_bandwidth_mbps);
      fill(t.capacity, f.capacity_bytes);
      t.hwloc_subtype = f.subtype;
    }
  }
}

std::vector<DeviceSpec> read_device_config(const DiscoverOptions& o) {
  std::vector<DeviceSpec> specs;
  std::optional<std::string> file = o.config_file;
  std::optional<std::string> list = o.devices;
  if (!o.ignore_env) {
    if (!file)
      if (const char* v = option_value(Option::kConfigFile)) file = std::string(v);
    if (!list)
      if (const char* v = option_value(Option::kDevices)) list = std::string(v);
  }
  if (file) {
    if (file->empty()) fail(CXLPOOL_E_CONFIG, "CXLPOOL_CONFIG is set but empty (expected a file path)");
    specs = parse_device_file(*file);
  }
  if (list) {
    auto more = parse_device_list(*list, o.devices ? "devices" : "CXLPOOL_DEVICES");
    for (auto& m : more)
      for (auto& s : specs)
        if (s.name == m.name)
          fail(CXLPOOL_E_CONFIG, m.origin + ": device '" + m.name + "' is declared twice (first at " + s.origin + ")");
    specs.insert(specs.end(), more.begin(), more.end());
  }
  return specs;
}

// Size of the default emulated device: a quarter of RAM, at most 16 GiB, at most half of
// what /dev/shm can still hold (memfd pages live in shmem), rounded down to 2 MiB.
uint64_t default_device_size(const Topology& topo) {
  uint64_t ram = 0;
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.capacity.known()) ram += t.capacity.value;
  if (ram == 0) ram = os::total_ram_bytes();
  uint64_t size = std::min<uint64_t>(ram / 4, uint64_t(16) << 30);
  if (uint64_t shm_free = os::fs_free_bytes("/dev/shm")) size = std::min(size, shm_free / 2);
  size &= ~((uint64_t(2) << 20) - 1);
  return std::max<uint64_t>(size, uint64_t(64) << 20);
}

void set_emulated_performance(Target& t, const DeviceSpec* s) {
  cxlpool_source_t src = s ? CXLPOOL_SOURCE_CONFIG : CXLPOOL_SOURCE_DEFAULT;
  if (s && s->read_latency_ns) t.read_latency_ns.set(*s->read_latency_ns, src);
  if (s && s->write_latency_ns) t.write_latency_ns.set(*s->write_latency_ns, src);
  if (s && s->read_bandwidth_mbps) t.read_bandwidth_mbps.set(*s->read_bandwidth_mbps, src);
  if (s && s->write_bandwidth_mbps) t.write_bandwidth_mbps.set(*s->write_bandwidth_mbps, src);
}

// Checks that need the machine and do not depend on discovered targets: a device must hold
// one segment, named devices need a size, a private file device never uses an existing file
// and needs a directory on a filesystem that can hold memory, devdax must be device-DAX.
void validate_emulated(const DeviceSpec& s, const std::string& dev) {
  if (s.size && *s.size < kMinDeviceBytes)
    fail(CXLPOOL_E_CONFIG, dev + ": key 'size': " + format_bytes(*s.size) + " cannot hold one " +
                               format_bytes(kMinDeviceBytes) + " allocator segment (the smallest device)");
  if ((s.backing == CXLPOOL_BACKING_SHM || s.backing == CXLPOOL_BACKING_FILE) && !s.size)
    fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': '" + format_backing(s) +
                               "' needs size= (cxlpool creates the device's memory itself and never sizes it "
                               "from an existing object)");
  if (s.backing == CXLPOOL_BACKING_FILE || s.backing == CXLPOOL_BACKING_SHM) {
    std::string named = s.backing == CXLPOOL_BACKING_FILE ? s.path : "/dev/shm/" + s.path;
    std::string dir = os::parent_dir(named);
    if (!os::is_directory(dir))
      fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': directory of '" + format_backing(s) + "' does not exist");
    std::string pseudo = os::pseudo_filesystem(dir);
    if (!pseudo.empty())
      fail(CXLPOOL_E_CONFIG,
           dev + ": key 'backing': " + dir + " is on a " + pseudo + " pseudo filesystem, which cannot hold memory");
    std::string kind = os::path_kind(named);
    if (!kind.empty())
      fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': " + named + " exists (" + kind +
                                 ") and was not created by cxlpool; cxlpool never uses or changes existing "
                                 "files: remove it or choose another " +
                                 (s.backing == CXLPOOL_BACKING_SHM ? "name" : "path"));
  }
  if (s.backing == CXLPOOL_BACKING_DEVDAX) {
    std::string kind = os::path_kind(s.path);
    if (kind != "character device" && kind != "symbolic link")
      fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': '" + format_backing(s) + "' is " +
                                 (kind.empty() ? std::string("missing") : "a " + kind) +
                                 ", not a device-DAX character device");
    std::string subsystem = os::char_device_subsystem(s.path);
    if (subsystem != "dax")
      fail(CXLPOOL_E_CONFIG,
           dev + ": key 'backing': '" + format_backing(s) + "' is a " +
               (subsystem.empty() ? std::string("character device of unknown kind") : "'" + subsystem + "' device") +
               ", not device-DAX memory (/sys/dev/char/*/subsystem must be dax)");
  }
}

Target make_emulated(const DeviceSpec& s, const Topology& topo, const os::FsRoot& sys) {
  const std::string dev = s.origin + ": device '" + s.name + "'";
  Target t;
  t.name = s.name;
  t.kind = CXLPOOL_TARGET_EMULATED;
  t.origin = s.origin;
  t.backing.device_name = s.name;
  t.backing.kind = s.backing;
  t.backing.path = s.path;
  if (s.fork_copy) t.backing.fork_mode = *s.fork_copy ? ForkMode::kCopy : ForkMode::kCopyOnWrite;
  validate_emulated(s, dev);
  set_emulated_performance(t, &s);
  if (s.tier) t.tier.set(*s.tier, CXLPOOL_SOURCE_CONFIG);

  if (s.backing == CXLPOOL_BACKING_NUMA) {
    const Target* node = nullptr;
    std::string with_memory;
    for (auto& n : topo.targets)
      if (n.kind == CXLPOOL_TARGET_NUMA_NODE) {
        if (n.numa_node == s.numa_node) node = &n;
        append_item(with_memory, std::to_string(n.numa_node));
      }
    if (!node)
      fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': NUMA node in 'numa:" + std::to_string(s.numa_node) +
                                 "' does not exist or has no memory (nodes with memory: " +
                                 (with_memory.empty() ? "none" : with_memory) + ")");
    t.numa_node = s.numa_node;
    t.backing.numa_node = s.numa_node;
    t.cpulist = node->cpulist;
    t.cpu_count = node->cpu_count;
    t.cpuless = node->cpuless;
    t.kernel_tier = node->kernel_tier;
    t.cxl_backed = node->cxl_backed;
    t.distances = node->distances;
    t.distance_source = node->distance_source;
    // Undeclared performance is the node's own, with the node's sources.
    if (!t.read_latency_ns.known()) t.read_latency_ns = node->read_latency_ns;
    if (!t.write_latency_ns.known()) t.write_latency_ns = node->write_latency_ns;
    if (!t.read_bandwidth_mbps.known()) t.read_bandwidth_mbps = node->read_bandwidth_mbps;
    if (!t.write_bandwidth_mbps.known()) t.write_bandwidth_mbps = node->write_bandwidth_mbps;
    if (s.size) {
      if (node->capacity.known() && *s.size > node->capacity.value)
        fail(CXLPOOL_E_CONFIG, dev + ": key 'size': " + format_bytes(*s.size) + " exceeds the capacity of node " +
                                   std::to_string(s.numa_node) + " (" + format_bytes(node->capacity.value) + ")");
      t.capacity.set(*s.size, CXLPOOL_SOURCE_CONFIG);
    } else {
      t.capacity = node->capacity;
    }
    t.free = node->free;
  } else {
    t.cpuless.set(true, CXLPOOL_SOURCE_CONFIG);
    t.cpu_count.set(0, CXLPOOL_SOURCE_CONFIG);
    if (s.size) t.capacity.set(*s.size, CXLPOOL_SOURCE_CONFIG);
    switch (s.backing) {
      case CXLPOOL_BACKING_MEMFD:
        if (!s.size) t.capacity.set(default_device_size(topo), CXLPOOL_SOURCE_DEFAULT);
        break;
      case CXLPOOL_BACKING_DEVDAX: {
        // /dev/daxX.Y: size and alignment from sysfs when the kernel lists the device.
        std::string base = s.path.substr(s.path.find_last_of('/') + 1);
        for (auto& dax : topo.dax_devices)
          if (dax.name == base) {
            if (!s.size && dax.size) t.capacity.set(*dax.size, CXLPOOL_SOURCE_SYSFS);
            if (dax.align) t.backing.page_size = size_t(*dax.align);
            t.numa_node = dax.target_node;
          }
        if (!t.capacity.known())
          fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': size of 'devdax:" + s.path + "' is not listed under " +
                                     sys.path("bus/dax/devices") + "; give size=");
        break;
      }
      default:
        break;
    }
    // Emulated far memory without declared figures gets the published CXL defaults.
    t.read_latency_ns.set_if_unknown(kDefaultCxlLatencyNs, CXLPOOL_SOURCE_DEFAULT);
    t.read_bandwidth_mbps.set_if_unknown(kDefaultCxlBandwidthMbps, CXLPOOL_SOURCE_DEFAULT);
  }
  t.backing.capacity = t.capacity.known() ? t.capacity.value : 0;
  return t;
}

bool has_cxl_hardware(const Topology& topo) {
  for (auto& t : topo.targets) {
    if (t.kind == CXLPOOL_TARGET_DAX) return true;
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.cpuless.known() && t.cpuless.value) return true;
  }
  return !topo.regions.empty();
}

void add_warnings(Topology& topo, bool multi_node_without_hmat) {
  auto& w = topo.warnings;
  std::string cpuless_nodes;
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.cpuless.known() && t.cpuless.value)
      append_item(cpuless_nodes, std::to_string(t.numa_node));
  auto& k = topo.kernel;
  if (!cpuless_nodes.empty() && k.numa_balancing.known() && k.numa_balancing.value == 1)
    w.push_back(
        "kernel.numa_balancing=1 moves pages toward the CPUs that touch them and will pull pages placed on "
        "CPU-less node(s) " +
        cpuless_nodes +
        " back to CPU nodes; use 0 for static placement or 2 for "
        "kernel memory tiering (sysctl kernel.numa_balancing=2)");
  if (k.memory_tiers.size() > 1 && k.demotion_enabled.known() && !k.demotion_enabled.value)
    w.push_back("the kernel has " + std::to_string(k.memory_tiers.size()) +
                " memory tiers but demotion is disabled "
                "(/sys/kernel/mm/numa/demotion_enabled=false): reclaim will not demote to slower memory");
  if (multi_node_without_hmat)
    w.push_back("no HMAT latency/bandwidth in sysfs for a multi-node machine: tiers are ranked by SLIT distance");
  if (topo.default_device) {
    const Target& d = topo.targets.back();
    w.push_back("no CXL memory found and no devices configured: using the default emulated device '" + d.name +
                "' (memfd, " + format_bytes(d.capacity.value) +
                "); its latency/bandwidth are cxlpool defaults, not measurements. Declare devices with "
                "CXLPOOL_DEVICES (docs/config.md)");
  }
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_EMULATED && t.backing.kind == CXLPOOL_BACKING_NUMA && t.cpuless.known() &&
        !t.cpuless.value && !t.read_latency_ns.known())
      w.push_back("device '" + t.name + "' maps onto node " + std::to_string(t.numa_node) +
                  ", which has CPUs and no declared latency: it ranks with local DRAM unless you declare latency=");
}

}  // namespace

Topology discover(const DiscoverOptions& o) {
  // Configuration first: a bad declaration fails before anything else is looked at.
  std::vector<DeviceSpec> specs = read_device_config(o);

  Topology topo;
  topo.sysfs_root = o.sysfs_root;
  bool custom_root = o.sysfs_root != "/sys";
  if (!o.procfs_root.empty())
    topo.procfs_root = o.procfs_root;
  else if (!custom_root)
    topo.procfs_root = "/proc";
  else if (os::is_directory(o.sysfs_root + "/../proc"))
    topo.procfs_root = o.sysfs_root + "/../proc";
  os::FsRoot sys(o.sysfs_root), proc(topo.procfs_root);
  if (!os::is_directory(o.sysfs_root))
    fail(CXLPOOL_E_NOT_FOUND, "sysfs root '" + o.sysfs_root + "' is not a directory");

  discover_nodes(sys, topo);
  if (topo.targets.empty()) {
    // Kernels without CONFIG_NUMA expose no node directory: the machine is one node.
    Target t;
    t.name = "node0";
    t.numa_node = 0;
    if (!custom_root) {
      t.capacity.set(os::total_ram_bytes(), CXLPOOL_SOURCE_SYSFS);
      t.cpuless.set(false, CXLPOOL_SOURCE_SYSFS);
    }
    t.backing = {t.name, CXLPOOL_BACKING_NUMA, 0, "", t.capacity.value, 0};
    topo.targets.push_back(t);
    topo.warnings.push_back("no NUMA nodes under " + sys.path(kNodeDir) + ": assuming one node");
  }
  discover_kernel_state(sys, proc, topo);
  discover_cxl_and_dax(sys, topo);
  if (o.no_hwloc)
    topo.hwloc_note = "disabled by configuration";
  else if (custom_root)
    topo.hwloc_note = "not used with a custom sysfs root";
  else
    apply_hwloc(topo);

  size_t nodes = 0;
  bool any_hmat = false;
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE) {
      ++nodes;
      any_hmat |=
          t.read_latency_ns.source == CXLPOOL_SOURCE_HMAT || t.read_bandwidth_mbps.source == CXLPOOL_SOURCE_HMAT;
    }

  for (auto& s : specs) topo.targets.push_back(make_emulated(s, topo, sys));
  if (specs.empty() && !o.no_default_device && !has_cxl_hardware(topo)) {
    DeviceSpec def;
    def.name = "cxl0";
    def.origin = "default";
    Target t = make_emulated(def, topo, sys);
    t.origin = "default";
    t.cpuless.set(true, CXLPOOL_SOURCE_DEFAULT);
    t.cpu_count.set(0, CXLPOOL_SOURCE_DEFAULT);
    topo.targets.push_back(std::move(t));
    topo.default_device = true;
  }
  for (auto& t : topo.targets) t.caps = describe_backing(t.backing);

  rank_targets(topo);
  add_warnings(topo, nodes > 1 && !any_hmat);
  return topo;
}

}  // namespace cxlpool::detail

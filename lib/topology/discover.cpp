// SPDX-License-Identifier: MIT
// Topology discovery: NUMA nodes, HMAT, memory tiers and weighted-interleave state from sysfs;
// CXL memdevs/regions and DAX devices; hwloc memattrs to fill gaps; declared and default
// emulated devices; then ranking and warnings. Every attribute records its source.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <iterator>

#include "backing/provider.hpp"
#include "common/error.hpp"
#include "common/parse.hpp"
#include "config/options.hpp"
#include "os/fs_root.hpp"
#include "os/hwloc.hpp"
#include "os/os.hpp"
#include "os/room.hpp"
#include "topology/model.hpp"

namespace cxlpool::detail {

const Target* Topology::find(const std::string& name) const {
  for (auto& t : targets)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

constexpr const char* kNodeDir = "devices/system/node";

// Plausibility limits for what sysfs/procfs say (docs/topology.md, "Plausibility checks"). A
// value outside them comes from broken firmware tables or a hostile tree; it is reported as a
// warning naming the file and the raw text, and left unknown so it is never shown, ranked or
// sized on as a fact.
// 2^52 bytes (4 PiB) is the architectural physical-address limit of x86-64 and arm64: no node,
// DAX device or CXL region can be larger. It also keeps sums over nodes far from overflow.
constexpr uint64_t kMaxPhysicalBytes = uint64_t(1) << 52;
constexpr uint64_t kMaxLatencyNs = 10'000'000'000;  // 10 s: far beyond any memory, even over a fabric
constexpr uint64_t kMaxBandwidthMbps = 10'000'000;  // 10 TB/s: above any memory interface built
constexpr int kMaxCpuId = 65535;                    // NR_CPUS is at most 8192 today; room to grow
constexpr int kMaxNodeId = 1023;                    // MAX_NUMNODES: NODES_SHIFT is at most 10
constexpr uint64_t kLocalDistance = 10;             // SLIT: a node's distance to itself
constexpr uint64_t kMaxDistance = 254;              // SLIT: 255 means unreachable
constexpr uint64_t kUnreachable = 255;
constexpr uint64_t kMaxInterleaveWeight = 255;  // u8; writing 0 restores the default, so 0 is never read
constexpr uint64_t kMinDaxAlign = 4096;         // device-DAX aligns to at least a page
constexpr size_t kMaxRawShown = 40;             // raw text quoted in a warning

// Text quoted in a warning: bytes outside printable ASCII (and the backslash and quote) become
// \xNN, and at most max bytes of the input are shown, so a warning is one short readable line
// whatever a file holds.
std::string printable(std::string_view raw, size_t max) {
  std::string out;
  size_t shown = 0;
  for (unsigned char c : raw) {
    if (shown++ == max) {
      out += "...(" + std::to_string(raw.size()) + " bytes)";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// sysfs numbers: decimal, or hex with 0x (CXL sizes and serials).
std::optional<uint64_t> sysfs_u64(std::string_view v) {
  v = trim(v);
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

std::optional<int64_t> sysfs_i64(std::string_view v) {
  v = trim(v);
  bool neg = !v.empty() && v[0] == '-';
  auto u = parse_u64(neg ? v.substr(1) : v);
  if (!u || *u > uint64_t(INT64_MAX)) return std::nullopt;
  return neg ? -int64_t(*u) : int64_t(*u);
}

// A kernel id list ("0-3,8,10-11") whose ids are all at most max_id, sorted and unique; nullopt
// on any deviation. Ranges are merged before they are expanded, so hostile text (a megabyte of
// "0-65535,") costs one pass and the result holds at most max_id + 1 ids.
std::optional<std::vector<int>> bounded_id_list(std::string_view s, int max_id) {
  std::vector<int> out;
  s = trim(s);
  if (s.empty()) return out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto piece : split(s, ',')) {
    auto dash = piece.find('-');
    auto lo = parse_u64(piece.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parse_u64(piece.substr(dash + 1));
    if (!lo || !hi || *lo > *hi || *hi > uint64_t(max_id)) return std::nullopt;
    ranges.emplace_back(*lo, *hi);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;  // lowest id not yet in out
  for (auto [lo, hi] : ranges) {
    for (uint64_t v = std::max(lo, next); v <= hi; ++v) out.push_back(int(v));
    next = std::max(next, hi + 1);
  }
  return out;
}

// Sorted unique ids back to the kernel's list format ("0-3,8").
std::string format_id_list(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    append_item(out, j == i ? std::to_string(ids[i]) : std::to_string(ids[i]) + "-" + std::to_string(ids[j]));
    i = j + 1;
  }
  return out;
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// A short identifier as sysfs prints them (driver names, region modes, decoder names).
bool is_identifier(std::string_view s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// Reads files of one tree (sysfs or procfs) for discovery. Absent files are simply unknown;
// files that exist but are refused or hold implausible values become warnings.
class TreeReader {
 public:
  TreeReader(const os::FsRoot& fs, std::vector<std::string>& warnings) : fs_(fs), warnings_(warnings) {}
  const os::FsRoot& fs() const { return fs_; }

  std::optional<std::string> text(const std::string& rel) {
    std::string refused;
    auto v = fs_.read(rel, &refused);
    if (!v && !refused.empty()) warnings_.push_back(where(rel) + " " + refused + "; treated as unknown");
    return v;
  }

  // "<path>: implausible <what> '<raw>' (<why>); treated as unknown"
  void implausible(const std::string& rel, std::string_view raw, const std::string& why,
                   std::string_view what = "value") {
    warnings_.push_back(where(rel) + ": implausible " + std::string(what) + " '" + printable(raw, kMaxRawShown) +
                        "' (" + why + "); treated as unknown");
  }

  // An unsigned number (decimal, or hex with 0x) in [lo, hi]; range says what is accepted.
  std::optional<uint64_t> number(const std::string& rel, uint64_t lo, uint64_t hi, const std::string& range) {
    auto raw = text(rel);
    if (!raw) return std::nullopt;
    auto v = sysfs_u64(*raw);
    if (!v) {
      implausible(rel, *raw, "not a non-negative integer; expected " + range);
    } else if (*v < lo || *v > hi) {
      implausible(rel, *raw, "expected " + range);
      v.reset();
    }
    return v;
  }

  // A number the kernel prints in hex without "0x" (memory block size and index).
  std::optional<uint64_t> bare_hex(const std::string& rel, uint64_t lo, uint64_t hi, const std::string& range) {
    auto raw = text(rel);
    if (!raw) return std::nullopt;
    auto v = sysfs_u64("0x" + std::string(trim(*raw)));
    if (!v || *v < lo || *v > hi) {
      implausible(rel, *raw, "expected hex digits, " + range);
      return std::nullopt;
    }
    return v;
  }

  std::optional<int64_t> signed_number(const std::string& rel, int64_t lo, int64_t hi, const std::string& range) {
    auto raw = text(rel);
    if (!raw) return std::nullopt;
    auto v = sysfs_i64(*raw);
    if (!v || *v < lo || *v > hi) {
      implausible(rel, *raw, "expected " + range);
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::vector<int>> id_list(const std::string& rel, int max_id, const char* what) {
    auto raw = text(rel);
    if (!raw) return std::nullopt;
    auto ids = bounded_id_list(*raw, max_id);
    if (!ids) implausible(rel, *raw, std::string("not a list of ") + what + " ids 0.." + std::to_string(max_id));
    return ids;
  }

 private:
  std::string where(const std::string& rel) const { return printable(fs_.path(rel), PATH_MAX); }

  const os::FsRoot& fs_;
  std::vector<std::string>& warnings_;
};

// "Node 0 MemTotal:       24576000 kB" -> bytes of the named field of node `node`, at most
// kMaxPhysicalBytes; raw receives the field's text for messages. Only a line that is the
// node's own and names the field whole counts (not "Node 1 ...", not "NotMemTotal"); a missing
// field is unknown without a warning.
std::optional<uint64_t> meminfo_field(TreeReader& r, const std::string& rel, const std::string& text, int node,
                                      const std::string& field, std::string& raw) {
  const std::string key = "Node " + std::to_string(node) + " " + field + ":";
  for (std::string_view line : split(text, '\n')) {
    line = trim(line);
    if (line.substr(0, key.size()) != key) continue;
    std::string_view rest = trim(line.substr(key.size()));
    raw = std::string(rest);
    const size_t space = rest.find(' ');
    auto kb = parse_u64(rest.substr(0, space));
    if (!kb || space == std::string_view::npos || trim(rest.substr(space)) != "kB") {
      r.implausible(rel, rest, "not a non-negative number of kB", field);
      return std::nullopt;
    }
    // Compared in kB so that a value whose byte count overflows 64 bits is caught too.
    if (*kb > kMaxPhysicalBytes / 1024) {
      r.implausible(rel, rest, "above 4 PiB, the physical address limit", field);
      return std::nullopt;
    }
    return *kb * 1024;
  }
  return std::nullopt;
}

std::vector<int> node_ids(TreeReader& r) {
  if (auto ids = r.id_list(std::string(kNodeDir) + "/online", kMaxNodeId, "node")) return *ids;
  std::vector<int> ids;
  for (auto& e : r.fs().list(kNodeDir)) {
    if (e.size() <= 4 || e.compare(0, 4, "node") != 0) continue;
    auto id = parse_u64(std::string_view(e).substr(4));
    if (!id) continue;
    if (*id > uint64_t(kMaxNodeId))
      r.implausible(std::string(kNodeDir) + "/" + e, e, "node id above " + std::to_string(kMaxNodeId), "node");
    else
      ids.push_back(int(*id));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void read_hmat(TreeReader& r, const std::string& node_dir, Target& t) {
  const std::string base = node_dir + "/access0/initiators/";
  auto get = [&](const char* file, Attr<uint64_t>& attr, uint64_t max, const char* range) {
    if (auto v = r.number(base + file, 1, max, range)) attr.set(*v, CXLPOOL_SOURCE_HMAT);
  };
  get("read_latency", t.read_latency_ns, kMaxLatencyNs, "latency 1 ns .. 10 s");
  get("write_latency", t.write_latency_ns, kMaxLatencyNs, "latency 1 ns .. 10 s");
  get("read_bandwidth", t.read_bandwidth_mbps, kMaxBandwidthMbps, "bandwidth 1 MB/s .. 10 TB/s");
  get("write_bandwidth", t.write_bandwidth_mbps, kMaxBandwidthMbps, "bandwidth 1 MB/s .. 10 TB/s");
}

// One SLIT row ("10 21 ...", one entry per online node). Entries must be 10..254 and the
// node's own 10; a row breaking that, or with a non-number or the wrong entry count, is
// unknown as a whole (its scale or its columns cannot be trusted). 255 (unreachable) leaves
// only that entry unknown.
void read_distances(TreeReader& r, const std::string& rel, int id, const std::vector<int>& ids, Target& t) {
  auto raw = r.text(rel);
  if (!raw) return;
  std::map<int, int> row;
  size_t i = 0;
  std::string bad, unreachable;
  for (auto piece : split(trim(*raw), ' ')) {
    if (piece.empty()) continue;
    if (i >= ids.size()) {
      bad = "more entries than the " + std::to_string(ids.size()) + " online nodes";
      break;
    }
    int node = ids[i++];
    auto d = parse_u64(piece);
    if (!d) {
      bad = "entry for node" + std::to_string(node) + " is not a number";
    } else if (node == id && *d != kLocalDistance) {
      bad = "distance to itself must be 10";
    } else if (*d == kUnreachable) {
      append_item(unreachable, "node" + std::to_string(node));
      continue;
    } else if (*d < kLocalDistance || *d > kMaxDistance) {
      bad = "entry for node" + std::to_string(node) + " outside 10..254";
    }
    if (!bad.empty()) break;
    row[node] = int(*d);
  }
  if (bad.empty() && i != ids.size())
    bad = std::to_string(i) + " entries for " + std::to_string(ids.size()) + " online nodes";
  if (!bad.empty()) {
    r.implausible(rel, *raw, bad, "SLIT row");
    return;
  }
  if (!unreachable.empty()) r.implausible(rel, *raw, "255 = unreachable: " + unreachable, "SLIT entries");
  t.distances = std::move(row);
  if (!t.distances.empty()) t.distance_source = CXLPOOL_SOURCE_SLIT;
}

void discover_nodes(TreeReader& r, Topology& topo) {
  const os::FsRoot& sys = r.fs();
  std::vector<int> ids = node_ids(r);
  std::optional<std::vector<int>> has_memory = r.id_list(std::string(kNodeDir) + "/has_memory", kMaxNodeId, "node");
  for (int id : ids) {
    const std::string dir = std::string(kNodeDir) + "/node" + std::to_string(id);
    if (!sys.exists(dir)) continue;
    Target t;
    t.name = "node" + std::to_string(id);
    t.kind = CXLPOOL_TARGET_NUMA_NODE;
    t.numa_node = id;
    if (auto list = r.id_list(dir + "/cpulist", kMaxCpuId, "CPU")) {
      t.cpulist = format_id_list(*list);
      t.cpu_count.set(int64_t(list->size()), CXLPOOL_SOURCE_SYSFS);
      t.cpuless.set(list->empty(), CXLPOOL_SOURCE_SYSFS);
    }
    const std::string meminfo = dir + "/meminfo";
    if (auto mi = r.text(meminfo)) {
      std::string total_raw, free_raw;
      auto total = meminfo_field(r, meminfo, *mi, id, "MemTotal", total_raw);
      auto free = meminfo_field(r, meminfo, *mi, id, "MemFree", free_raw);
      if (total && free && *free > *total) {
        // One of the two is wrong and nothing says which.
        r.implausible(meminfo, free_raw,
                      "exceeds MemTotal '" + printable(total_raw, kMaxRawShown) + "', so neither is trusted",
                      "MemFree");
        total.reset();
        free.reset();
      }
      if (total) t.capacity.set(*total, CXLPOOL_SOURCE_SYSFS);
      if (free) t.free.set(*free, CXLPOOL_SOURCE_SYSFS);
    }
    bool memory = has_memory ? std::binary_search(has_memory->begin(), has_memory->end(), id)
                             : (t.capacity.known() && t.capacity.value > 0);
    if (!memory) continue;  // a CPU-only node offers no memory target
    read_distances(r, dir + "/distance", id, ids, t);
    read_hmat(r, dir, t);
    t.backing.device_name = t.name;
    t.backing.kind = CXLPOOL_BACKING_NUMA;
    t.backing.numa_node = id;
    t.backing.capacity = t.capacity.known() ? t.capacity.value : 0;
    topo.targets.push_back(std::move(t));
  }
}

}  // namespace

std::optional<uint64_t> node_memory_now(const std::string& sysfs_root, int node) {
  const os::FsRoot sys(sysfs_root);
  std::vector<std::string> warnings;
  TreeReader r(sys, warnings);
  const std::string dir = std::string(kNodeDir) + "/node" + std::to_string(node);
  if (!sys.exists(dir)) {
    // Gone (a node whose memory and CPUs all went offline) only when the kernel's list of
    // online nodes says so; a root that is missing or unreadable knows nothing.
    auto online = r.id_list(std::string(kNodeDir) + "/online", kMaxNodeId, "node");
    if (online && std::find(online->begin(), online->end(), node) == online->end()) return uint64_t(0);
    return std::nullopt;
  }
  const std::string meminfo = dir + "/meminfo";
  auto text = r.text(meminfo);
  if (!text) return std::nullopt;
  std::string raw;
  return meminfo_field(r, meminfo, *text, node, "MemTotal", raw);
}

namespace {

void discover_kernel_state(TreeReader& r, TreeReader& proc, Topology& topo) {
  const os::FsRoot& sys = r.fs();
  KernelState& k = topo.kernel;
  if (auto v = proc.number("sys/kernel/numa_balancing", 0, 3, "0..3"))
    k.numa_balancing.set(int(*v), CXLPOOL_SOURCE_PROCFS);
  const std::string demotion = "kernel/mm/numa/demotion_enabled";
  if (auto v = r.text(demotion)) {
    std::string_view s = trim(*v);
    if (s == "true" || s == "1")
      k.demotion_enabled.set(true, CXLPOOL_SOURCE_SYSFS);
    else if (s == "false" || s == "0")
      k.demotion_enabled.set(false, CXLPOOL_SOURCE_SYSFS);
    else
      r.implausible(demotion, *v, "expected true or false");
  }
  const std::string wi = "kernel/mm/mempolicy/weighted_interleave";
  k.weighted_interleave.set(sys.exists(wi), CXLPOOL_SOURCE_SYSFS);
  for (auto& t : topo.targets) {
    if (t.kind != CXLPOOL_TARGET_NUMA_NODE) continue;
    if (auto w = r.number(wi + "/node" + std::to_string(t.numa_node), 1, kMaxInterleaveWeight, "weight 1..255"))
      t.interleave_weight.set(int(*w), CXLPOOL_SOURCE_SYSFS);
  }
  const std::string mt = "devices/virtual/memory_tiering";
  if (sys.exists(mt)) k.memory_tiers_source = CXLPOOL_SOURCE_SYSFS;
  for (auto& e : sys.list(mt)) {
    if (e.compare(0, 11, "memory_tier") != 0) continue;
    auto id = parse_u64(std::string_view(e).substr(11));
    if (!id || *id > uint64_t(INT_MAX)) {
      r.implausible(mt + "/" + e, e, "tier id is not a number 0.." + std::to_string(INT_MAX), "memory tier");
      continue;
    }
    auto nodes = r.id_list(mt + "/" + e + "/nodelist", kMaxNodeId, "node");
    if (!nodes && !sys.exists(mt + "/" + e + "/nodelist"))
      nodes = r.id_list(mt + "/" + e + "/nodes", kMaxNodeId, "node");
    if (!nodes) continue;
    k.memory_tiers[int(*id)] = *nodes;
    for (int n : *nodes)
      for (auto& t : topo.targets)
        if (t.kind == CXLPOOL_TARGET_NUMA_NODE && t.numa_node == n) t.kernel_tier.set(int(*id), CXLPOOL_SOURCE_SYSFS);
  }
}

// "dax3.1": the only names device-DAX gives its devices; the name becomes the path /dev/<name>.
bool is_dax_name(std::string_view s) {
  auto dot = s.find('.');
  return s.size() > 3 && s.compare(0, 3, "dax") == 0 && dot != std::string_view::npos &&
         parse_u64(s.substr(3, dot - 3)) && parse_u64(s.substr(dot + 1));
}

constexpr const char* kSizeRange = "0 .. 4 PiB, the physical address limit";
// The interleave ways CXL decoders support (CXL 3.0: 1, 2, 4, 8, 16 and 3, 6, 12).
constexpr uint64_t kInterleaveWays[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr const char* kWaysRange = "1, 2, 3, 4, 6, 8, 12 or 16";

void discover_cxl_and_dax(TreeReader& r, Topology& topo) {
  const os::FsRoot& sys = r.fs();
  const std::string node_range = "-1.." + std::to_string(kMaxNodeId);
  const std::string dax_dir = "bus/dax/devices";
  for (auto& e : sys.list(dax_dir)) {
    const std::string d = dax_dir + "/" + e;
    if (!is_dax_name(e)) {
      r.implausible(d, e, "not a daxX.Y name", "DAX device name");
      continue;
    }
    DaxDevice dev;
    dev.name = e;
    dev.size = r.number(d + "/size", 0, kMaxPhysicalBytes, kSizeRange);
    dev.align = r.number(d + "/align", kMinDaxAlign, kMaxPhysicalBytes, "a power of two, 4 KiB .. 4 PiB");
    if (dev.align && !is_power_of_two(*dev.align)) {
      r.implausible(d + "/align", std::to_string(*dev.align), "not a power of two");
      dev.align.reset();
    }
    if (auto tn = r.signed_number(d + "/target_node", -1, kMaxNodeId, node_range)) dev.target_node = int(*tn);
    dev.resource = r.number(d + "/resource", 0, kMaxPhysicalBytes, kSizeRange);  // unreadable unless root
    if (auto drv = sys.link_basename(d + "/driver")) {
      if (is_identifier(*drv, 64))
        dev.driver = *drv;
      else
        r.implausible(d + "/driver", *drv, "not a driver name", "driver link");
    }
    topo.dax_devices.push_back(dev);
  }
  const std::string cxl_dir = "bus/cxl/devices";
  std::vector<std::string> cxl_roots;  // "devices/platform/ACPI0017:00/root0/"
  for (auto& e : sys.list(cxl_dir)) {
    const std::string d = cxl_dir + "/" + e;
    if (e.compare(0, 4, "root") == 0 && parse_u64(std::string_view(e).substr(4))) {
      // The root port device itself (".../ACPI0017:00/root0"), never a directory above it.
      auto p = sys.link_path(d);
      if (p && p->size() > e.size() + 1 && p->compare(p->size() - e.size() - 1, e.size() + 1, "/" + e) == 0)
        cxl_roots.push_back(*p + "/");
    } else if (e.compare(0, 3, "mem") == 0 && parse_u64(std::string_view(e).substr(3))) {
      CxlMemdev m;
      m.name = e;
      m.ram_bytes = r.number(d + "/ram/size", 0, kMaxPhysicalBytes, kSizeRange);
      m.pmem_bytes = r.number(d + "/pmem/size", 0, kMaxPhysicalBytes, kSizeRange);
      if (auto s = r.text(d + "/serial")) {
        if (sysfs_u64(*s))
          m.serial = std::string(trim(*s));
        else
          r.implausible(d + "/serial", *s, "not a number", "serial");
      }
      if (auto n = r.signed_number(d + "/numa_node", -1, kMaxNodeId, node_range)) m.numa_node = int(*n);
      topo.memdevs.push_back(m);
    } else if (e.compare(0, 6, "region") == 0 && parse_u64(std::string_view(e).substr(6))) {
      CxlRegion reg;
      reg.name = e;
      if (auto m = r.text(d + "/mode")) {
        if (is_identifier(trim(*m), 16))
          reg.mode = std::string(trim(*m));
        else
          r.implausible(d + "/mode", *m, "not a region mode", "mode");
      }
      reg.size = r.number(d + "/size", 0, kMaxPhysicalBytes, kSizeRange);
      reg.resource = r.number(d + "/resource", 0, kMaxPhysicalBytes, kSizeRange);
      const std::string ways = d + "/interleave_ways";
      reg.interleave_ways = r.number(ways, 1, 16, kWaysRange);
      if (reg.interleave_ways && std::find(std::begin(kInterleaveWays), std::end(kInterleaveWays),
                                           *reg.interleave_ways) == std::end(kInterleaveWays)) {
        r.implausible(ways, std::to_string(*reg.interleave_ways), std::string("expected ") + kWaysRange);
        reg.interleave_ways.reset();
      }
      for (uint64_t i = 0; reg.interleave_ways && i < *reg.interleave_ways; ++i) {
        const std::string target = d + "/target" + std::to_string(i);
        auto t = r.text(target);
        if (!t || trim(*t).empty()) continue;  // a position not yet assigned
        if (is_identifier(trim(*t), 32))
          reg.targets.push_back(std::string(trim(*t)));
        else
          r.implausible(target, *t, "not a decoder name", "target");
      }
      for (auto& sub : sys.list(d)) {
        if (sub.compare(0, 10, "dax_region") != 0) continue;
        for (auto& dx : sys.list(d + "/" + sub))
          if (is_dax_name(dx)) reg.dax_device = dx;
      }
      topo.regions.push_back(reg);
    }
  }
  // A RAM region names its DAX device (regionN/dax_regionN/daxN.M). A persistent-memory region's
  // DAX device sits under the NVDIMM bus instead (root0/nvdimm-bridge0/ndbus0/region0/dax0.0):
  // it is known to be CXL memory by that path, and matched to its region by physical address,
  // which the kernel shows to root only.
  auto within = [](const CxlRegion& reg, uint64_t addr) {
    return reg.resource && reg.size && addr >= *reg.resource && addr - *reg.resource < *reg.size;
  };
  for (auto& dax : topo.dax_devices) {
    if (auto p = sys.link_path(dax_dir + "/" + dax.name))
      for (auto& root : cxl_roots) dax.under_cxl_root |= p->compare(0, root.size(), root) == 0;
    for (auto& reg : topo.regions)
      if (reg.dax_device.empty() && dax.resource && within(reg, *dax.resource)) reg.dax_device = dax.name;
  }
  // A node onlined from a CXL region (kmem) is CXL memory: its memory blocks lie in the region's
  // range (memoryN/phys_index x block_size_bytes, readable by anyone), whether or not the DAX
  // device it came from could be matched.
  std::optional<uint64_t> block =
      r.bare_hex("devices/system/memory/block_size_bytes", 4096, kMaxPhysicalBytes, "a block size up to 4 PiB");
  bool ranges_known = block.has_value();
  for (auto& reg : topo.regions) ranges_known &= reg.resource && reg.size;
  for (auto& t : topo.targets) {
    if (t.kind != CXLPOOL_TARGET_NUMA_NODE) continue;
    for (auto& dax : topo.dax_devices) {
      if (dax.driver != "kmem" || dax.target_node != t.numa_node) continue;
      for (auto& reg : topo.regions)
        if (dax.name == reg.dax_device) {
          t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
          t.cxl_region = reg.name;
        }
      if (dax.under_cxl_root) t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);  // which region: by its blocks
    }
    if (!t.cxl_region.empty() || topo.regions.empty() || !block) continue;
    const std::string node_dir = "devices/system/node/node" + std::to_string(t.numa_node);
    size_t blocks = 0, read = 0;
    for (auto& e : sys.list(node_dir)) {
      if (e.compare(0, 6, "memory") != 0 || !parse_u64(std::string_view(e).substr(6))) continue;
      ++blocks;
      auto index = r.bare_hex(node_dir + "/" + e + "/phys_index", 0, kMaxPhysicalBytes / *block, "a block number");
      read += index.has_value();
      for (auto& reg : topo.regions)
        if (index && within(reg, *index * *block) && t.cxl_region.empty()) {
          t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
          t.cxl_region = reg.name;
        }
    }
    // Not CXL memory: only said when every region's range and every block of the node were read.
    if (!t.cxl_backed.known() && ranges_known && blocks > 0 && read == blocks)
      t.cxl_backed.set(false, CXLPOOL_SOURCE_SYSFS);
  }
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_NUMA_NODE && !t.cxl_backed.known() && sys.exists("bus/cxl") && topo.regions.empty())
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
    for (auto& reg : topo.regions)
      if (reg.dax_device == dax.name) {
        t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
        t.cxl_region = reg.name;
      }
    if (dax.under_cxl_root) t.cxl_backed.set(true, CXLPOOL_SOURCE_SYSFS);
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
      // hwloc reads the same firmware tables, so its figures get the same limits; 0 means
      // hwloc has no figure.
      auto fill = [&](Attr<uint64_t>& a, const std::optional<uint64_t>& v, uint64_t max, const char* what) {
        if (!v || *v == 0 || a.known()) return;
        if (*v > max)
          topo.warnings.push_back("hwloc: implausible " + std::string(what) + " '" + std::to_string(*v) + "' for " +
                                  t.name + "; treated as unknown");
        else
          a.set(*v, CXLPOOL_SOURCE_HWLOC);
      };
      fill(t.read_latency_ns, f.read_latency_ns ? f.read_latency_ns : f.latency_ns, kMaxLatencyNs, "read latency");
      fill(t.write_latency_ns, f.write_latency_ns, kMaxLatencyNs, "write latency");
      fill(t.read_bandwidth_mbps, f.read_bandwidth_mbps ? f.read_bandwidth_mbps : f.bandwidth_mbps, kMaxBandwidthMbps,
           "read bandwidth");
      fill(t.write_bandwidth_mbps, f.write_bandwidth_mbps, kMaxBandwidthMbps, "write bandwidth");
      fill(t.capacity, f.capacity_bytes, kMaxPhysicalBytes, "capacity");
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
// one segment, and its kind's own checks (its provider's check_declared: for the file kinds a
// size, a directory that can hold memory and no existing object; devdax a device-DAX node).
void validate_emulated(const DeviceSpec& s, const std::string& dev) {
  if (s.size && *s.size < kMinDeviceBytes)
    fail(CXLPOOL_E_CONFIG, dev + ": key 'size': " + format_bytes(*s.size) + " cannot hold one " +
                               format_bytes(kMinDeviceBytes) + " allocator segment (the smallest device)");
  BackingSpec loc;
  loc.kind = s.backing;
  loc.numa_node = s.numa_node;
  loc.path = s.path;
  loc.device_name = s.name;
  const Provider* provider = provider_for(s.backing);
  if (provider && provider->check_declared)
    if (std::string why = provider->check_declared(loc, s.size.has_value()); !why.empty())
      fail(CXLPOOL_E_CONFIG, dev + ": key 'backing': " + why);
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
  if (s.max_size) t.backing.max_space = *s.max_size;
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
      case CXLPOOL_BACKING_POOL:  // what it borrows at open; it grows as it fills (docs/compose.md)
        if (!s.size) t.capacity.set(kMinDeviceBytes, CXLPOOL_SOURCE_DEFAULT);
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
  // A memdev or region with no DAX device or node gives nothing to allocate from (a warning
  // says what to do), so the emulated default still stands in.
  return false;
}

// What the kernel's CXL stack has that cxlpool cannot use yet, and the step that makes it usable.
void add_cxl_warnings(Topology& topo) {
  auto& w = topo.warnings;
  if (!topo.memdevs.empty() && topo.regions.empty()) {
    std::string devs;
    for (auto& m : topo.memdevs) {
      std::string what;
      if (m.ram_bytes && *m.ram_bytes) what += format_bytes(*m.ram_bytes) + " volatile";
      if (m.pmem_bytes && *m.pmem_bytes)
        what += (what.empty() ? "" : ", ") + format_bytes(*m.pmem_bytes) + " persistent";
      append_item(devs, m.name + (what.empty() ? "" : " (" + what + ")"));
    }
    w.push_back("CXL memory device(s) " + devs +
                " have no region, so none of their memory can be used yet: create one with "
                "'cxl create-region' (docs/devices.md)");
  }
  bool unmatched_cxl_dax = false;
  for (auto& dax : topo.dax_devices) {
    bool matched = false;
    for (auto& reg : topo.regions) matched |= reg.dax_device == dax.name;
    unmatched_cxl_dax |= dax.under_cxl_root && !matched;
  }
  for (auto& reg : topo.regions) {
    bool used = !reg.dax_device.empty();
    for (auto& t : topo.targets) used |= t.cxl_region == reg.name;
    if (used || unmatched_cxl_dax) continue;
    w.push_back("CXL region " + reg.name + " (" + (reg.mode.empty() ? std::string("mode unknown") : reg.mode) +
                (reg.size ? ", " + format_bytes(*reg.size) : std::string()) +
                ") has no DAX device or NUMA node: make one with 'ndctl create-namespace -m devdax' (a "
                "persistent-memory region) and, for system RAM, 'daxctl reconfigure-device --mode=system-ram'");
  }
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
  add_cxl_warnings(topo);
  if (topo.default_device) {
    const Target& d = topo.targets.back();
    w.push_back(std::string(topo.memdevs.empty() ? "no CXL memory found" : "no usable CXL memory found") +
                " and no devices configured: using the default emulated device '" + d.name + "' (memfd, " +
                format_bytes(d.capacity.value) +
                "); its latency/bandwidth are cxlpool defaults, not measurements. Declare devices with "
                "CXLPOOL_DEVICES (docs/config.md)");
  }
  for (auto& t : topo.targets)
    if (t.kind == CXLPOOL_TARGET_EMULATED && t.backing.kind == CXLPOOL_BACKING_NUMA && t.cpuless.known() &&
        !t.cpuless.value && !t.read_latency_ns.known())
      w.push_back("device '" + t.name + "' maps onto node " + std::to_string(t.numa_node) +
                  ", which has CPUs and no declared latency: it ranks with local DRAM unless you declare latency=");
}

// Declared sizes against the room there is now: a warning, never a refusal (room may be freed
// later, and what runs out is refused then, not a signal: docs/backing.md). Bytes kept in a
// device's file (shared ranges; private ones with fork=copy) need its filesystem's room (on
// hugetlbfs: free huge pages); private memory of memfd, shm and file devices is RAM charged
// to the process's memory cgroup, whose limit no call can reserve against.
void add_room_warnings(Topology& topo) {
  os::CgroupRoom cg;
  const bool cg_limited = os::memory_cgroup_room(&cg);
  for (auto& t : topo.targets) {
    // Devices in files (anonymous memory and device nodes are neither a filesystem's nor the
    // cgroup's page cache).
    const Provider* provider = provider_for(t.backing.kind);
    if (t.kind != CXLPOOL_TARGET_EMULATED || t.capacity.source != CXLPOOL_SOURCE_CONFIG || !provider ||
        provider->anonymous || provider->device_node)
      continue;
    const uint64_t size = t.capacity.value;
    std::string parts;
    os::FsRoom fs;
    if (const std::string named = provider->named_path(t.backing); !named.empty()) {
      const std::string dir = os::parent_dir(named);
      if (os::filesystem_room(dir, &fs) && fs.bytes < size)
        parts += fs.huge_page ? dir + " (hugetlbfs) has " + std::to_string(fs.bytes / fs.huge_page) + " free " +
                                    format_bytes(fs.huge_page) + " huge pages (" + format_bytes(fs.bytes) +
                                    "): commits past that are refused (CXLPOOL_E_CAPACITY)"
                              : "its filesystem (" + dir + ") has " + format_bytes(fs.bytes) +
                                    " free: memory kept in the file (shared ranges; private ones with fork=copy) "
                                    "is refused past that (CXLPOOL_E_CAPACITY: malloc returns NULL or the policy "
                                    "spills), never a SIGBUS";
    }
    const uint64_t cg_room = cg.usage >= cg.limit ? 0 : cg.limit - cg.usage;
    if (cg_limited && !fs.huge_page && cg_room < size)
      parts += (parts.empty() ? "" : "; ") + std::string("its memory is RAM charged to the memory cgroup (") + cg.path +
               "), which has " + format_bytes(cg_room) + " left of its " + format_bytes(cg.limit) +
               " limit: past that the kernel's OOM killer ends a process (a cgroup limit cannot be reserved "
               "against)";
    if (parts.empty()) continue;
    std::string w = "device '" + t.name + "' (size=" + format_bytes(size) + ") cannot all be had now: " + parts;
    topo.room_warnings.push_back(w);
    topo.warnings.push_back(std::move(w));
  }
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

  TreeReader sys_reader(sys, topo.warnings), proc_reader(proc, topo.warnings);
  discover_nodes(sys_reader, topo);
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
  discover_kernel_state(sys_reader, proc_reader, topo);
  discover_cxl_and_dax(sys_reader, topo);
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
  add_room_warnings(topo);
  return topo;
}

}  // namespace cxlpool::detail

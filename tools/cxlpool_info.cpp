// SPDX-License-Identifier: MIT
// cxlpool-info: the machine's memory targets and tiers as cxlpool sees them (like numactl -H
// plus cxl list), every attribute with its source, the kernel's tiering state and warnings,
// and the shared pools found in /dev/shm or named with --pool (participants, quotas, leases,
// health), looked at from outside without joining them. Uses only the public API (and the
// header-only UTF-8 check of lib/common). --json
// prints the same as one JSON document.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/utf8.hpp"  // header-only; the rest is the public API
#include "cxlpool/cxlpool.hpp"

namespace {

const char* kUsage =
    "usage: cxlpool-info [--json] [--sysfs-root DIR] [--procfs-root DIR] [--devices SPEC]\n"
    "                    [--config FILE] [--no-default-device] [--no-hwloc] [--pool DEVICE]...\n"
    "                    [--no-pool-scan] [--help] [--version]\n"
    "\n"
    "Shows the memory targets cxlpool discovers (NUMA nodes, DAX devices, emulated CXL devices),\n"
    "their tiers (0 = fastest) and where each attribute came from, then the shared pools: those\n"
    "in /dev/shm and those named with --pool, with their participants, quotas, leases and health.\n"
    "  --json               one JSON document instead of tables (schema: docs/topology.md)\n"
    "  --sysfs-root DIR     read a (fake) sysfs tree instead of /sys\n"
    "  --procfs-root DIR    read kernel settings from DIR instead of /proc\n"
    "  --devices SPEC       device declarations, overriding CXLPOOL_DEVICES\n"
    "  --config FILE        device file, overriding CXLPOOL_CONFIG\n"
    "  --no-default-device  do not add the default emulated device\n"
    "  --no-hwloc           do not consult hwloc\n"
    "  --pool DEVICE        also show this shared pool (shm:NAME, file:/PATH, devdax:/dev/daxX.Y)\n"
    "  --no-pool-scan       do not look for shared pools in /dev/shm\n"
    "Environment: CXLPOOL_DEVICES, CXLPOOL_CONFIG (docs/config.md).\n";

std::string bytes(uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

// "value [source]" or "-" when unknown.
std::string cell(const cxlpool::Value& v, const std::string& text) {
  if (!v.known) return "-";
  return text + " [" + v.source_name() + "]";
}
std::string bytes_cell(const cxlpool::Value& v) { return cell(v, bytes(uint64_t(v.value))); }
std::string ns_cell(const cxlpool::Value& v) { return cell(v, std::to_string(v.value) + " ns"); }
std::string bw_cell(const cxlpool::Value& v) {
  char buf[32];
  if (v.value >= 1000)
    std::snprintf(buf, sizeof buf, "%.1f GB/s", double(v.value) / 1000.0);
  else
    std::snprintf(buf, sizeof buf, "%lld MB/s", static_cast<long long>(v.value));
  return cell(v, buf);
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

void print_text(const cxlpool::Topology& topo) {
  using cxlpool::Value;
  std::cout << "cxlpool " << cxlpool_version_string()
            << ": memory targets, tier 0 = fastest; [source] of each value\n\n";
  std::vector<std::vector<std::string>> rows = {{"TIER", "TARGET", "KIND", "NODE", "CPUS", "CAPACITY", "FREE",
                                                 "READ LAT", "WRITE LAT", "READ BW", "WRITE BW", "KTIER", "BACKING"}};
  auto targets = topo.targets();
  for (int tier = 0; tier < topo.tier_count(); ++tier)
    for (auto& t : targets) {
      if (t.tier() != tier) continue;
      std::string backing = cxlpool_backing_kind_str(t.backing());
      if (!t.backing_path().empty()) {
        backing += ':';
        backing += t.backing_path();
      }
      Value tier_v = t.attr(CXLPOOL_ATTR_TIER);
      rows.push_back(
          {std::to_string(tier) + (tier_v.source == CXLPOOL_SOURCE_CONFIG ? " [config]" : ""), std::string(t.name()),
           cxlpool_target_kind_str(t.kind()), t.numa_node() >= 0 ? std::to_string(t.numa_node()) : "-",
           t.cpulist().empty() ? (t.cpuless() ? "none" : "-") : std::string(t.cpulist()),
           bytes_cell(t.attr(CXLPOOL_ATTR_CAPACITY_BYTES)), bytes_cell(t.attr(CXLPOOL_ATTR_FREE_BYTES)),
           ns_cell(t.attr(CXLPOOL_ATTR_READ_LATENCY_NS)), ns_cell(t.attr(CXLPOOL_ATTR_WRITE_LATENCY_NS)),
           bw_cell(t.attr(CXLPOOL_ATTR_READ_BANDWIDTH_MBPS)), bw_cell(t.attr(CXLPOOL_ATTR_WRITE_BANDWIDTH_MBPS)),
           cell(t.attr(CXLPOOL_ATTR_KERNEL_TIER), std::to_string(t.attr(CXLPOOL_ATTR_KERNEL_TIER).value)), backing});
    }
  print_table(rows);

  std::cout << "\nranking (abstract distance, 1000 = local DRAM; rule in docs/topology.md):\n";
  for (auto& t : targets) {
    Value d = t.attr(CXLPOOL_ATTR_ABSTRACT_DISTANCE);
    std::cout << "  " << t.name() << ": tier " << t.tier() << ", distance " << d.value
              << (t.attr(CXLPOOL_ATTR_CXL_BACKED).value ? ", CXL-backed" : "") << "\n";
  }

  // SLIT matrix of the NUMA node targets.
  std::vector<cxlpool::Target> nodes;
  for (auto& t : targets)
    if (t.kind() == CXLPOOL_TARGET_NUMA_NODE) nodes.push_back(t);
  if (nodes.size() > 1) {
    std::cout << "\nnode distances [slit]:\n";
    std::vector<std::vector<std::string>> d = {{"node"}};
    for (auto& n : nodes) d[0].push_back(std::to_string(n.numa_node()));
    for (auto& a : nodes) {
      std::vector<std::string> row = {"  " + std::to_string(a.numa_node())};
      for (auto& b : nodes) {
        Value v = a.distance_to(b);
        row.push_back(v.known ? std::to_string(v.value) : "-");
      }
      d.push_back(row);
    }
    print_table(d);
  }

  auto comps = topo.components();
  if (!comps.empty()) {
    std::cout << "\nCXL and DAX devices [sysfs]:\n";
    std::vector<std::vector<std::string>> c = {{"  DEVICE", "TYPE", "SIZE", "NODE", "MODE", "DETAIL"}};
    for (auto& x : comps) {
      const char* type = x.kind == CXLPOOL_COMPONENT_CXL_MEMDEV   ? "cxl memdev"
                         : x.kind == CXLPOOL_COMPONENT_CXL_REGION ? "cxl region"
                                                                  : "dax";
      c.push_back({"  " + std::string(x.name), type, x.size_bytes ? bytes(x.size_bytes) : "-",
                   x.numa_node >= 0 ? std::to_string(x.numa_node) : "-", *x.mode ? x.mode : "-", x.detail});
    }
    print_table(c);
  }

  cxlpool_kernel_state_t k = topo.kernel_state();
  auto kv = [](const cxlpool_attr_value_t& v, const std::string& text) { return cell(Value::from(v), text); };
  static const char* nb_modes[] = {"off", "normal", "memory tiering", "normal + memory tiering"};
  std::string nb = k.numa_balancing.known && k.numa_balancing.value >= 0 && k.numa_balancing.value <= 3
                       ? std::to_string(k.numa_balancing.value) + " (" + nb_modes[k.numa_balancing.value] + ")"
                       : std::to_string(k.numa_balancing.value);
  std::cout << "\nkernel tiering state:\n"
            << "  numa_balancing       " << kv(k.numa_balancing, nb) << "\n"
            << "  demotion_enabled     " << kv(k.demotion_enabled, k.demotion_enabled.value ? "true" : "false") << "\n"
            << "  weighted interleave  "
            << kv(k.weighted_interleave, k.weighted_interleave.value ? "present" : "absent");
  if (k.weighted_interleave.value) {
    std::string weights;
    for (auto& t : nodes) {
      Value w = t.attr(CXLPOOL_ATTR_INTERLEAVE_WEIGHT);
      if (w.known) weights += " node" + std::to_string(t.numa_node()) + "=" + std::to_string(w.value);
    }
    if (!weights.empty()) std::cout << ", weights" << weights;
  }
  std::cout << "\n  memory tiers         " << kv(k.memory_tier_count, std::to_string(k.memory_tier_count.value))
            << "\n";

  auto warnings = topo.warnings();
  if (!warnings.empty()) {
    std::cout << "\nwarnings:\n";
    for (auto& w : warnings) std::cout << "  ! " << w << "\n";
  }
}

// ---- Shared pools ----------------------------------------------------------------------

struct PoolReport {
  std::string device;
  bool ok = false;
  cxlpool_status_t status = CXLPOOL_OK;
  std::string error;  // when !ok
  cxlpool_shared_survey_t survey{};
  std::vector<cxlpool_shared_participant_t> participants;
  bool consistent = false;
  std::string problems;  // what is wrong, when not consistent
};

PoolReport report_pool(const std::string& device) {
  PoolReport r;
  r.device = device;
  r.participants.resize(64);
  cxlpool_status_t st;
  while ((st = cxlpool_shared_pool_survey(device.c_str(), &r.survey, r.participants.data(), r.participants.size())) ==
             CXLPOOL_OK &&
         r.survey.participant_count > r.participants.size())
    r.participants.resize(r.survey.participant_count);
  if (st != CXLPOOL_OK) {
    r.status = st;
    r.error = cxlpool_last_error_message();
    return r;
  }
  r.participants.resize(r.survey.participant_count);
  r.ok = true;
  // Health as far as the metadata tells, from the same read-only look (cxlpool-pool check
  // walks every block too, and maps the pool: for an operator who means to).
  const auto& s = r.survey;
  r.consistent = s.dead_not_recovered == 0 && s.orphan_extents == 0 && s.corrupt_words == 0;
  if (!r.consistent)
    r.problems = std::to_string(s.dead_not_recovered) + " dead participants not recovered, " +
                 std::to_string(s.orphan_extents) + " extents of dead owners, " + std::to_string(s.corrupt_words) +
                 " corrupt words (cxlpool-pool check " + device + " --repair recovers the dead)";
  return r;
}

// Pools in /dev/shm (files carrying a cxlpool header; others are not opened further), then
// the named ones. A damaged pool in /dev/shm is listed with its error.
// Surveys of many pools at once: a survey may sample silent participants for up to 2 s, so
// they run side by side (up to 64 at a time) and a scan of /dev/shm takes about as long as the
// slowest pool, not the sum (the last error message is per thread).
std::vector<PoolReport> report_all(const std::vector<std::string>& devices, bool scanned) {
  std::vector<PoolReport> reports(devices.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < devices.size();) {
      reports[i] = report_pool(devices[i]);
      if (scanned && reports[i].status == CXLPOOL_E_CONFIG)  // a name shm: refuses
        reports[i] = report_pool("file:/dev/shm/" + devices[i].substr(4));
    }
  };
  std::vector<std::thread> workers;
  const size_t n = std::min<size_t>(64, devices.size());
  for (size_t k = 1; k < n; ++k) {
    try {
      workers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones there share the work
    }
  }
  work();
  for (auto& w : workers) w.join();
  return reports;
}

// Pools in /dev/shm (files carrying a cxlpool header; others are not opened further), then
// the named ones. A damaged pool in /dev/shm is listed with its error.
std::vector<PoolReport> find_pools(bool scan, const std::vector<std::string>& named) {
  std::vector<PoolReport> out;
  if (scan) {
    std::vector<std::string> devices;
    if (DIR* d = opendir("/dev/shm")) {
      while (dirent* e = readdir(d))
        if (e->d_type == DT_REG) devices.push_back(std::string("shm:") + e->d_name);
      closedir(d);
    }
    std::sort(devices.begin(), devices.end());
    for (auto& r : report_all(devices, true))
      // Not a pool, gone meanwhile, or not ours to read: not listed. Damaged pools are.
      if (r.ok || r.status == CXLPOOL_E_CORRUPT) out.push_back(std::move(r));
  }
  std::vector<std::string> more;
  for (const auto& d : named)
    if (std::none_of(out.begin(), out.end(), [&](const PoolReport& r) { return r.device == d; }) &&
        std::find(more.begin(), more.end(), d) == more.end())
      more.push_back(d);
  for (auto& r : report_all(more, false)) out.push_back(std::move(r));
  return out;
}

using cxlpool::detail::printable;  // names and strings from pools: anyone may write them

const char* coherence_str(uint32_t c) {
  return c == CXLPOOL_COHERENCE_HOST ? "host" : c == CXLPOOL_COHERENCE_FABRIC ? "fabric" : "none";
}
const char* slot_state_str(cxlpool_shared_slot_state_t s) {
  return s == CXLPOOL_SHARED_SLOT_ACTIVE ? "active" : s == CXLPOOL_SHARED_SLOT_LEFT ? "left" : "evicted";
}

void print_pools(const std::vector<PoolReport>& pools, bool scanned) {
  std::cout << "\nshared pools (" << (scanned ? "/dev/shm and --pool" : "--pool") << ", seen from outside):\n";
  if (pools.empty()) {
    std::cout << "  none\n";
    return;
  }
  for (const auto& p : pools) {
    if (!p.ok) {
      std::cout << "  " << printable(p.device) << ": " << printable(p.error) << "\n";
      continue;
    }
    const auto& s = p.survey;
    uint64_t leases = 0;
    for (const auto& x : p.participants) leases += x.leases;
    std::cout << "  " << printable(p.device) << ": " << bytes(s.size) << ", " << s.extents_free << " of "
              << s.extents_total << " extents of " << bytes(s.extent_size) << " free, coherence "
              << coherence_str(s.coherence) << ", failure domain \"" << printable(s.failure_domain) << "\", "
              << s.participants_alive << " of " << s.participant_count << " participants alive, " << leases
              << " leases; health: " << (p.consistent ? "consistent" : printable(p.problems)) << "\n";
    for (uint32_t q = 0; q < s.quota_count; ++q)
      std::cout << "    quota " << printable(s.quotas[q].name) << ": " << s.quotas[q].used_extents << " of "
                << s.quotas[q].max_extents << " extents\n";
    std::vector<std::vector<std::string>> rows = {
        {"    SLOT", "HOST", "PID", "STATE", "ALIVE", "EXTENTS", "IN USE", "LEASES"}};
    for (const auto& x : p.participants)
      rows.push_back({"    " + std::to_string(x.slot), std::to_string(x.host_index), std::to_string(x.pid),
                      slot_state_str(x.state),
                      x.alive == 1   ? "yes"
                      : x.alive == 2 ? "undecided"
                                     : "no",
                      std::to_string(x.extents_owned), bytes(x.bytes_in_use), std::to_string(x.leases)});
    if (rows.size() > 1) print_table(rows);
  }
}

// A JSON string, valid UTF-8 whatever the input holds (common/utf8.hpp, json_escaped).
std::string json_str(const std::string& in) { return "\"" + cxlpool::detail::json_escaped(in) + "\""; }

std::string pools_json(const std::vector<PoolReport>& pools) {
  std::string j = "[";
  for (size_t i = 0; i < pools.size(); ++i) {
    const auto& p = pools[i];
    j += i ? ",\n    {" : "\n    {";
    j += "\"device\": " + json_str(p.device);
    if (!p.ok) {
      j += ", \"error\": " + json_str(p.error) + "}";
      continue;
    }
    const auto& s = p.survey;
    char id[40];
    std::snprintf(id, sizeof id, "%016llx%016llx", static_cast<unsigned long long>(s.pool_id[0]),
                  static_cast<unsigned long long>(s.pool_id[1]));
    j += std::string(", \"pool_id\": \"") + id + "\", \"size\": " + std::to_string(s.size) +
         ", \"extent_size\": " + std::to_string(s.extent_size) +
         ", \"extents_total\": " + std::to_string(s.extents_total) +
         ", \"extents_free\": " + std::to_string(s.extents_free) + ", \"coherence\": \"" + coherence_str(s.coherence) +
         "\", \"failure_domain\": " + json_str(s.failure_domain) + ", \"hosts\": " + std::to_string(s.hosts) +
         ", \"slots_per_host\": " + std::to_string(s.slots_per_host) +
         ", \"heartbeat_ms\": " + std::to_string(s.heartbeat_ms) +
         ", \"lease_timeout_ms\": " + std::to_string(s.lease_timeout_ms) + ", \"stopped_timeout_ms\": " +
         (s.stopped_timeout_ms == CXLPOOL_SHARED_STOPPED_NEVER ? std::string("null")
                                                               : std::to_string(s.stopped_timeout_ms)) +
         ", \"health\": {\"consistent\": " + (p.consistent ? "true" : "false") +
         ", \"problems\": " + json_str(p.problems) + "}, \"quotas\": [";
    for (uint32_t q = 0; q < s.quota_count; ++q)
      j += std::string(q ? ", " : "") + "{\"name\": " + json_str(s.quotas[q].name) +
           ", \"max_extents\": " + std::to_string(s.quotas[q].max_extents) +
           ", \"used_extents\": " + std::to_string(s.quotas[q].used_extents) + "}";
    j += "], \"participants\": [";
    for (size_t k = 0; k < p.participants.size(); ++k) {
      const auto& x = p.participants[k];
      j += std::string(k ? ", " : "") + "{\"slot\": " + std::to_string(x.slot) +
           ", \"host_index\": " + std::to_string(x.host_index) + ", \"incarnation\": " + std::to_string(x.incarnation) +
           ", \"state\": \"" + slot_state_str(x.state) + "\", \"pid\": " + std::to_string(x.pid) + ", \"alive\": " +
           (x.alive == 1   ? "true"
            : x.alive == 2 ? "null"
                           : "false") +
           ", \"extents_owned\": " + std::to_string(x.extents_owned) +
           ", \"bytes_in_use\": " + std::to_string(x.bytes_in_use) + ", \"leases\": " + std::to_string(x.leases) + "}";
    }
    j += "]}";
  }
  return j + (pools.empty() ? "]" : "\n  ]");
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  try {
    cxlpool::Config config;
    uint32_t flags = 0;
    std::vector<std::string> pools;
    bool scan = true;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto need = [&](const char* opt) -> std::string {
        if (i + 1 >= argc) {
          std::cerr << "cxlpool-info: " << opt << " needs an argument\n" << kUsage;
          std::exit(2);
        }
        return argv[++i];
      };
      if (a == "--json")
        json = true;
      else if (a == "--sysfs-root")
        config.sysfs_root(need("--sysfs-root"));
      else if (a == "--procfs-root")
        config.procfs_root(need("--procfs-root"));
      else if (a == "--devices")
        config.devices(need("--devices"));
      else if (a == "--config")
        config.config_file(need("--config"));
      else if (a == "--no-default-device")
        flags |= CXLPOOL_CONFIG_NO_DEFAULT_DEVICE;
      else if (a == "--no-hwloc")
        flags |= CXLPOOL_CONFIG_NO_HWLOC;
      else if (a == "--pool")
        pools.push_back(need("--pool"));
      else if (a == "--no-pool-scan")
        scan = false;
      else if (a == "--help" || a == "-h") {
        std::cout << kUsage;
        return 0;
      } else if (a == "--version") {
        std::cout << "cxlpool-info " << cxlpool_version_string() << "\n";
        return 0;
      } else {
        std::cerr << "cxlpool-info: unknown argument '" << a << "'\n" << kUsage;
        return 2;
      }
    }
    if (flags) config.flags(flags);
    cxlpool::Topology topo = cxlpool::Topology::discover(&config);
    const std::vector<PoolReport> found = find_pools(scan, pools);
    if (json) {
      // The topology document with one more member, "shared_pools" (docs/topology.md).
      std::string doc = topo.to_json();
      const size_t end = doc.find_last_of('}');
      if (end == std::string::npos) throw cxlpool::Error(CXLPOOL_E_INTERNAL, 0, "topology JSON is not an object");
      doc.insert(end, ",\n  \"shared_pools\": " + pools_json(found) + "\n");
      std::cout << doc;
    } else {
      print_text(topo);
      print_pools(found, scan);
    }
    for (const auto& p : found)  // a pool named on the command line that cannot be shown: an error
      if (!p.ok && std::find(pools.begin(), pools.end(), p.device) != pools.end()) return 1;
    return 0;
  } catch (const cxlpool::Error& e) {
    std::cerr << "cxlpool-info: " << e.what() << "\n";
    return 1;
  }
}

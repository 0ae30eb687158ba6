// SPDX-License-Identifier: MIT
// cxlpool-stat: reads a running process's stats page (lib/stats/layout.hpp) without attaching
// to it, through /proc/PID/fd (or /proc/PID/map_files), and shows it as a live table like
// top, as JSON, or in the Prometheus text format (node_exporter's textfile collector).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.hpp"
#include "common/parse.hpp"
#include "stats/layout.hpp"
#include "stats/schema.hpp"

namespace {

namespace S = cxlpool::detail::stats;
using cxlpool::detail::JsonWriter;

// Exit statuses (docs/stats.md).
enum Exit : int {
  kOk = 0,
  kUsage = 1,
  kNoProcess = 2,
  kNoPage = 3,
  kDenied = 4,
  kBadPage = 5,
  kStale = 6,
};

const char* kUsageText =
    "usage: cxlpool-stat [--json | --prometheus | --once] [--interval SECONDS] [--count N] PID\n"
    "       cxlpool-stat --list\n"
    "       cxlpool-stat --schema [--json]\n"
    "\n"
    "Reads the stats page of a running cxlpool process (made when its first pool is, unless\n"
    "CXLPOOL_STAT_PAGE=0) without attaching to it. Without an output option: a table refreshed\n"
    "every --interval seconds (default 1) with per-second rates, --count times (default: until\n"
    "interrupted).\n"
    "  --json        one snapshot as JSON          --prometheus  one snapshot, text format 0.0.4\n"
    "  --once        one table                      --list        processes that have a stats page\n"
    "  --schema      the metrics the page carries\n"
    "Exit status: 0 ok; 1 usage; 2 no such process; 3 the process has no stats page; 4 permission\n"
    "denied; 5 the page is unreadable (foreign layout, or never consistent); 6 stale (the process\n"
    "stopped updating it; the numbers are still printed).\n";

[[noreturn]] void die(int code, const std::string& msg) {
  fprintf(stderr, "cxlpool-stat: %s\n", msg.c_str());
  exit(code);
}

// ---- Finding and mapping the page ----

bool is_stats_link(const std::string& target) {
  const std::string want = std::string("/memfd:") + S::kMemfdName;
  return target.compare(0, want.size(), want) == 0 &&
         (target.size() == want.size() || target.compare(want.size(), std::string::npos, " (deleted)") == 0);
}

std::string read_link(const std::string& path) {
  char buf[4096];
  ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) return "";
  return std::string(buf, size_t(n));
}

struct Mapped {
  const uint8_t* base = nullptr;
  size_t bytes = 0;
};

// Validates what fd holds as a stats page of pid and maps it read-only. Returns kOk or why not.
int map_page(int fd, int pid, Mapped* out, std::string* why) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) < S::kHeaderBytes) {
    *why = "the page is smaller than its header";
    return kBadPage;
  }
  void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = std::string("mmap: ") + strerror(errno);
    return kBadPage;
  }
  const auto* h = static_cast<const S::Header*>(p);
  const char* problem = nullptr;
  if (std::memcmp(h->magic, S::kMagic, sizeof S::kMagic) != 0)
    problem = "not a cxlpool stats page (magic)";
  else if (h->version != S::kLayoutVersion)
    problem = "a stats page of another layout version";
  else if (h->pid != pid)
    problem = "the page belongs to another process";
  else if (h->total_bytes != uint64_t(st.st_size) || h->header_bytes != S::kHeaderBytes)
    problem = "the page's size does not match its header";
  else if (h->max_devices > 4096 || h->n_tiers > 64 || h->n_metrics > 4096 ||
           h->n_metrics != h->n_process_metrics + h->n_device_metrics + h->n_tier_metrics ||
           uint64_t(h->metrics_offset) + uint64_t(h->n_metrics) * sizeof(S::MetricSlot) > h->total_bytes ||
           uint64_t(h->devices_offset) + uint64_t(h->max_devices) * sizeof(S::DeviceSlot) > h->total_bytes ||
           uint64_t(h->values_offset) +
                   (uint64_t(h->n_process_metrics) + uint64_t(h->max_devices) * h->n_device_metrics +
                    uint64_t(h->n_tiers) * h->n_tier_metrics) *
                       8 >
               h->total_bytes)
    problem = "the page's offsets are out of bounds";
  if (problem) {
    munmap(p, size_t(st.st_size));
    *why = problem;
    return kBadPage;
  }
  out->base = static_cast<const uint8_t*>(p);
  out->bytes = size_t(st.st_size);
  return kOk;
}

int open_page(int pid, Mapped* out, std::string* why) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (stat(proc.c_str(), &st) != 0) {
    *why = "no process " + std::to_string(pid);
    return kNoProcess;
  }
  int status = kNoPage;
  *why =
      "process " + std::to_string(pid) + " has no cxlpool stats page (not a cxlpool program, or CXLPOOL_STAT_PAGE=0)";
  // Its descriptors first (allowed to whoever may read the process: its owner, root).
  if (DIR* d = opendir((proc + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string link = proc + "/fd/" + e->d_name;
      if (!is_stats_link(read_link(link))) continue;
      int fd = open(link.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (errno == EACCES || errno == EPERM) status = kDenied, *why = "permission denied opening " + link;
        continue;
      }
      std::string w;
      int r = map_page(fd, pid, out, &w);
      close(fd);
      if (r == kOk) {
        closedir(d);
        return kOk;
      }
      status = r;
      *why = link + ": " + w;
    }
    closedir(d);
  } else if (errno == EACCES || errno == EPERM) {
    status = kDenied;
    *why = "permission denied reading " + proc + "/fd (run as the process's owner or root)";
  } else if (errno == ENOENT) {
    *why = "no process " + std::to_string(pid);
    return kNoProcess;
  }
  if (status != kNoPage) return status;
  // A program that closed the descriptor still has the mapping: /proc/PID/map_files.
  FILE* maps = fopen((proc + "/maps").c_str(), "re");
  if (!maps) return status;
  char line[4096];
  while (fgets(line, sizeof line, maps)) {
    std::string l(line);
    if (l.find(std::string("/memfd:") + S::kMemfdName) == std::string::npos) continue;
    const std::string range = l.substr(0, l.find(' '));
    const std::string path = proc + "/map_files/" + range;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == EACCES || errno == EPERM) status = kDenied, *why = "permission denied opening " + path;
      continue;
    }
    std::string w;
    int r = map_page(fd, pid, out, &w);
    close(fd);
    if (r == kOk) {
      fclose(maps);
      return kOk;
    }
    status = r;
    *why = path + ": " + w;
  }
  fclose(maps);
  return status;
}

// ---- A consistent copy ----

struct Metric {
  S::Scope scope;
  uint8_t kind;
  std::string name, unit, help;
};
struct Device {
  std::string name, kind;
  int tier = 0, numa_node = -1, pools = 0;
  std::vector<uint64_t> values;
};
struct Snapshot {
  int pid = 0;
  std::string program;
  uint32_t interval_ms = 0;
  uint64_t start_realtime_ns = 0, updated_realtime_ns = 0, updated_monotonic_ns = 0, publishes = 0;
  std::vector<Metric> metrics;                                        // page order
  std::vector<Metric> process_metrics, device_metrics, tier_metrics;  // copies, by scope
  std::vector<uint64_t> process;
  std::vector<Device> devices;
  std::vector<std::vector<uint64_t>> tiers;
  uint64_t taken_monotonic_ns = 0;
};

uint64_t now_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

std::string fixed_text(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

const char* kind_name(int kind) {
  switch (kind) {
    case 1:
      return "numa";
    case 2:
      return "memfd";
    case 3:
      return "shm";
    case 4:
      return "file";
    case 5:
      return "devdax";
  }
  return "?";
}

// Copies the page under its seqlock; false when no consistent copy came in 1,000 tries.
bool take(const Mapped& m, Snapshot* out) {
  std::vector<uint8_t> copy(m.bytes);
  const auto* live = reinterpret_cast<const S::Header*>(m.base);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t s1 = __atomic_load_n(&live->seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) {
      usleep(100);
      continue;
    }
    for (size_t i = 0; i < m.bytes; ++i) copy[i] = __atomic_load_n(m.base + i, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&live->seq, __ATOMIC_RELAXED) != s1) continue;
    const auto* h = reinterpret_cast<const S::Header*>(copy.data());
    Snapshot s;
    s.pid = h->pid;
    s.program = fixed_text(h->program, sizeof h->program);
    s.interval_ms = h->interval_ms;
    s.start_realtime_ns = h->start_realtime_ns;
    s.updated_realtime_ns = h->updated_realtime_ns;
    s.updated_monotonic_ns = h->updated_monotonic_ns;
    s.publishes = h->publishes;
    const auto* slots = reinterpret_cast<const S::MetricSlot*>(copy.data() + h->metrics_offset);
    s.metrics.reserve(h->n_metrics);
    for (uint32_t i = 0; i < h->n_metrics; ++i)
      s.metrics.push_back({S::Scope(slots[i].scope), slots[i].kind, fixed_text(slots[i].name, sizeof slots[i].name),
                           fixed_text(slots[i].unit, sizeof slots[i].unit),
                           fixed_text(slots[i].help, sizeof slots[i].help)});
    for (const Metric& x : s.metrics)
      (x.scope == S::Scope::kProcess  ? s.process_metrics
       : x.scope == S::Scope::kDevice ? s.device_metrics
                                      : s.tier_metrics)
          .push_back(x);
    if (s.process_metrics.size() != h->n_process_metrics || s.device_metrics.size() != h->n_device_metrics ||
        s.tier_metrics.size() != h->n_tier_metrics)
      return false;
    const auto* v = reinterpret_cast<const uint64_t*>(copy.data() + h->values_offset);
    s.process.assign(v, v + h->n_process_metrics);
    v += h->n_process_metrics;
    const auto* devs = reinterpret_cast<const S::DeviceSlot*>(copy.data() + h->devices_offset);
    for (uint32_t d = 0; d < h->max_devices; ++d, v += h->n_device_metrics) {
      if (d >= h->n_devices) continue;
      Device dev;
      dev.name = fixed_text(devs[d].name, sizeof devs[d].name);
      dev.kind = kind_name(devs[d].kind);
      dev.tier = devs[d].tier;
      dev.numa_node = devs[d].numa_node;
      dev.pools = devs[d].pools;
      dev.values.assign(v, v + h->n_device_metrics);
      s.devices.push_back(std::move(dev));
    }
    for (uint32_t t = 0; t < h->n_tiers; ++t, v += h->n_tier_metrics) s.tiers.emplace_back(v, v + h->n_tier_metrics);
    s.taken_monotonic_ns = now_ns(CLOCK_MONOTONIC);
    *out = std::move(s);
    return true;
  }
  return false;
}

double age_s(const Snapshot& s) {
  return s.taken_monotonic_ns > s.updated_monotonic_ns ? double(s.taken_monotonic_ns - s.updated_monotonic_ns) / 1e9
                                                       : 0.0;
}
// Stale: no update for three intervals (at least 3 s), or never written.
bool stale(const Snapshot& s) {
  const double limit = std::max(3.0, 3.0 * double(s.interval_ms) / 1000.0);
  return s.publishes == 0 || age_s(s) > limit;
}

uint64_t value_of(const Snapshot& s, const char* name) {
  for (size_t i = 0; i < s.process_metrics.size(); ++i)
    if (s.process_metrics[i].name == name) return s.process[i];
  return 0;
}

// ---- Renderings ----

const char* kind_text(uint8_t k) { return k == 1 ? "counter" : "gauge"; }

std::string render_json(const Snapshot& s) {
  JsonWriter j;
  j.begin_object();
  j.key("pid").value(int64_t(s.pid)).key("program").value(s.program);
  j.key("layout_version").value(uint64_t(S::kLayoutVersion)).key("interval_ms").value(uint64_t(s.interval_ms));
  j.key("start_realtime_ns").value(s.start_realtime_ns).key("updated_realtime_ns").value(s.updated_realtime_ns);
  j.key("age_seconds").value(age_s(s)).key("stale").value(stale(s)).key("publishes").value(s.publishes);
  j.key("process").begin_object();
  for (size_t i = 0; i < s.process_metrics.size(); ++i) j.key(s.process_metrics[i].name).value(s.process[i]);
  j.end_object();
  j.key("devices").begin_array();
  for (const Device& d : s.devices) {
    j.begin_object().key("device").value(d.name).key("kind").value(d.kind).key("tier").value(int64_t(d.tier));
    j.key("numa_node").value(int64_t(d.numa_node)).key("pools").value(int64_t(d.pools));
    for (size_t i = 0; i < s.device_metrics.size(); ++i) j.key(s.device_metrics[i].name).value(d.values[i]);
    j.end_object();
  }
  j.end_array().key("tiers").begin_array();
  for (size_t t = 0; t < s.tiers.size(); ++t) {
    bool any = false;
    for (uint64_t v : s.tiers[t]) any |= v != 0;
    if (!any) continue;
    j.begin_object().key("tier").value(uint64_t(t));
    for (size_t i = 0; i < s.tier_metrics.size(); ++i) j.key(s.tier_metrics[i].name).value(s.tiers[t][i]);
    j.end_object();
  }
  j.end_array().key("schema").begin_array();
  for (const Metric& m : s.metrics)
    j.begin_object()
        .key("name")
        .value(m.name)
        .key("scope")
        .value(S::scope_name(m.scope))
        .key("kind")
        .value(kind_text(m.kind))
        .key("unit")
        .value(m.unit)
        .key("help")
        .value(m.help)
        .end_object();
  j.end_array().end_object();
  return j.str() + "\n";
}

// A label value in the text format: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"')
      out += '\\', out += c;
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string render_prometheus(const Snapshot& s) {
  std::string out;
  char num[32];
  const std::string base = "pid=\"" + std::to_string(s.pid) + "\",program=\"" + label(s.program) + "\"";
  auto head = [&](const Metric& m) {
    out += "# HELP cxlpool_" + m.name + " " + m.help + " (" + m.unit + ")\n";
    out += "# TYPE cxlpool_" + m.name + " " + kind_text(m.kind) + "\n";
  };
  auto sample = [&](const Metric& m, const std::string& labels, uint64_t v) {
    snprintf(num, sizeof num, "%" PRIu64, v);
    out += "cxlpool_" + m.name + "{" + labels + "} " + num + "\n";
  };
  for (size_t i = 0; i < s.process_metrics.size(); ++i) {
    head(s.process_metrics[i]);
    sample(s.process_metrics[i], base, s.process[i]);
  }
  for (size_t i = 0; i < s.device_metrics.size(); ++i) {
    head(s.device_metrics[i]);
    for (const Device& d : s.devices)
      sample(s.device_metrics[i],
             base + ",device=\"" + label(d.name) + "\",kind=\"" + d.kind + "\",tier=\"" + std::to_string(d.tier) + "\"",
             d.values[i]);
  }
  for (size_t i = 0; i < s.tier_metrics.size(); ++i) {
    head(s.tier_metrics[i]);
    for (size_t t = 0; t < s.tiers.size(); ++t)
      sample(s.tier_metrics[i], base + ",tier=\"" + std::to_string(t) + "\"", s.tiers[t][i]);
  }
  // Freshness, so a scraper can tell a stopped process from a quiet one.
  out += "# HELP cxlpool_stats_age_seconds seconds since the process last refreshed its stats page\n";
  out += "# TYPE cxlpool_stats_age_seconds gauge\n";
  snprintf(num, sizeof num, "%.3f", age_s(s));
  out += "cxlpool_stats_age_seconds{" + base + "} " + num + "\n";
  return out;
}

std::string human(const Metric& m, uint64_t v) {
  if (m.unit == "bytes") return cxlpool::detail::format_bytes(v);
  char b[32];
  if (m.unit == "nanoseconds") {
    snprintf(b, sizeof b, "%.3f s", double(v) / 1e9);
    return b;
  }
  snprintf(b, sizeof b, "%" PRIu64, v);
  return b;
}

std::string render_table(const Snapshot& s, const Snapshot* prev) {
  std::string out;
  char line[512];
  const double up =
      s.updated_realtime_ns > s.start_realtime_ns ? double(s.updated_realtime_ns - s.start_realtime_ns) / 1e9 : 0.0;
  snprintf(line, sizeof line, "cxlpool-stat: pid %d (%s), up %.1f s, updated %.1f s ago (every %u ms)%s\n", s.pid,
           s.program.c_str(), up, age_s(s), s.interval_ms, stale(s) ? "  STALE" : "");
  out += line;
  const bool tiering = value_of(s, "tiering_running") != 0;
  if (tiering)
    snprintf(line, sizeof line, "tiering: running, kernel=%s (numa_balancing=%" PRIu64 ")\n\n",
             value_of(s, "kernel_mode_own") ? "own" : "respect", value_of(s, "numa_balancing"));
  else
    snprintf(line, sizeof line, "tiering: off\n\n");
  out += line;
  const double dt = prev && s.updated_monotonic_ns > prev->updated_monotonic_ns
                        ? double(s.updated_monotonic_ns - prev->updated_monotonic_ns) / 1e9
                        : 0.0;
  snprintf(line, sizeof line, "%-28s %16s %14s\n", "process", "value", dt > 0 ? "per second" : "");
  out += line;
  for (size_t i = 0; i < s.process_metrics.size(); ++i) {
    const Metric& m = s.process_metrics[i];
    std::string rate;
    if (dt > 0 && m.kind == 1 && prev->process.size() == s.process.size()) {
      char b[32];
      snprintf(b, sizeof b, "%.1f", double(s.process[i] - prev->process[i]) / dt);
      rate = b;
    }
    snprintf(line, sizeof line, "%-28s %16s %14s\n", m.name.c_str(), human(m, s.process[i]).c_str(), rate.c_str());
    out += line;
  }
  out += "\n";
  snprintf(line, sizeof line, "%-24s %-7s %4s %4s %5s", "device", "kind", "tier", "node", "pools");
  out += line;
  for (const Metric& m : s.device_metrics) {
    snprintf(line, sizeof line, " %*s", int(std::max<size_t>(12, m.name.size())), m.name.c_str());
    out += line;
  }
  out += "\n";
  for (const Device& d : s.devices) {
    snprintf(line, sizeof line, "%-24s %-7s %4d %4d %5d", d.name.c_str(), d.kind.c_str(), d.tier, d.numa_node, d.pools);
    out += line;
    for (size_t i = 0; i < s.device_metrics.size(); ++i) {
      snprintf(line, sizeof line, " %*s", int(std::max<size_t>(12, s.device_metrics[i].name.size())),
               human(s.device_metrics[i], d.values[i]).c_str());
      out += line;
    }
    out += "\n";
  }
  if (s.devices.empty()) out += "(no pools yet)\n";
  bool header = false;
  for (size_t t = 0; t < s.tiers.size(); ++t) {
    bool any = false;
    for (uint64_t v : s.tiers[t]) any |= v != 0;
    if (!any) continue;
    if (!header) {
      out += "\ntier";
      for (const Metric& m : s.tier_metrics) out += "  " + m.name;
      out += "\n";
      header = true;
    }
    snprintf(line, sizeof line, "%4zu", t);
    out += line;
    for (size_t i = 0; i < s.tier_metrics.size(); ++i) {
      snprintf(line, sizeof line, "  %*s", int(s.tier_metrics[i].name.size()),
               human(s.tier_metrics[i], s.tiers[t][i]).c_str());
      out += line;
    }
    out += "\n";
  }
  return out;
}

int print_schema(bool json) {
  if (json) {
    JsonWriter j;
    j.begin_array();
    for (size_t i = 0; i < S::schema_size(); ++i) {
      const S::SchemaEntry& e = S::schema_entry(i);
      j.begin_object().key("name").value(e.desc.name).key("scope").value(S::scope_name(e.scope));
      j.key("kind").value(kind_text(uint8_t(e.desc.kind))).key("unit").value(e.desc.unit);
      j.key("help").value(e.desc.help).end_object();
    }
    j.end_array();
    printf("%s\n", j.str().c_str());
    return kOk;
  }
  for (size_t i = 0; i < S::schema_size(); ++i) {
    const S::SchemaEntry& e = S::schema_entry(i);
    printf("%-28s %-8s %-8s %-12s %s\n", e.desc.name, S::scope_name(e.scope), kind_text(uint8_t(e.desc.kind)),
           e.desc.unit, e.desc.help);
  }
  return kOk;
}

int list_processes() {
  DIR* d = opendir("/proc");
  if (!d) die(kDenied, std::string("cannot read /proc: ") + strerror(errno));
  int found = 0;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    Mapped m;
    std::string why;
    if (open_page(int(pid), &m, &why) != kOk) continue;
    Snapshot s;
    if (take(m, &s)) {
      printf("%7ld  %-16s %s\n", pid, s.program.c_str(), stale(s) ? "stale" : "live");
      ++found;
    }
    munmap(const_cast<uint8_t*>(m.base), m.bytes);
  }
  closedir(d);
  if (!found) fprintf(stderr, "cxlpool-stat: no process with a stats page is visible to this user\n");
  return kOk;
}

uint64_t parse_count(const char* flag, const char* text) {
  auto v = cxlpool::detail::parse_u64(text);
  if (!v || *v == 0) die(kUsage, std::string(flag) + ": '" + text + "' is not a positive whole number");
  return *v;
}

}  // namespace

int main(int argc, char** argv) {
  enum { kTable, kOnce, kJson, kPrometheus } mode = kTable;
  bool schema = false, list = false;
  double interval = 1.0;
  uint64_t count = 0;
  int pid = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die(kUsage, a + " needs a value\n\n" + kUsageText);
      return argv[++i];
    };
    if (a == "--json")
      mode = mode == kTable ? kJson : (die(kUsage, "--json, --prometheus and --once exclude each other"), mode);
    else if (a == "--prometheus")
      mode = mode == kTable ? kPrometheus : (die(kUsage, "--json, --prometheus and --once exclude each other"), mode);
    else if (a == "--once")
      mode = mode == kTable ? kOnce : (die(kUsage, "--json, --prometheus and --once exclude each other"), mode);
    else if (a == "--schema")
      schema = true;
    else if (a == "--list")
      list = true;
    else if (a == "--count")
      count = parse_count("--count", next());
    else if (a == "--interval") {
      const char* t = next();
      char* end = nullptr;
      errno = 0;
      interval = strtod(t, &end);
      if (errno || end == t || *end || !(interval >= 0.05 && interval <= 3600))
        die(kUsage, std::string("--interval: '") + t + "' is not a number of seconds in 0.05..3600");
    } else if (a == "-h" || a == "--help") {
      fputs(kUsageText, stdout);
      return kOk;
    } else if (!a.empty() && a[0] != '-' && pid < 0) {
      auto v = cxlpool::detail::parse_u64(a);
      if (!v || *v == 0 || *v > 0x7fffffff) die(kUsage, "'" + a + "' is not a process id");
      pid = int(*v);
    } else
      die(kUsage, "unexpected argument '" + a + "'\n\n" + kUsageText);
  }
  if (schema) return print_schema(mode == kJson);
  if (list) return list_processes();
  if (pid < 0) die(kUsage, std::string("which process? give a PID\n\n") + kUsageText);

  Mapped m;
  std::string why;
  if (int r = open_page(pid, &m, &why); r != kOk) die(r, why);
  Snapshot s, prev;
  bool have_prev = false;
  for (uint64_t round = 0;; ++round) {
    if (!take(m, &s)) die(kBadPage, "the stats page of process " + std::to_string(pid) + " never read consistently");
    if (mode == kJson || mode == kPrometheus || mode == kOnce) {
      std::string text = mode == kJson         ? render_json(s)
                         : mode == kPrometheus ? render_prometheus(s)
                                               : render_table(s, nullptr);
      fputs(text.c_str(), stdout);
      return stale(s) ? kStale : kOk;
    }
    std::string text = render_table(s, have_prev ? &prev : nullptr);
    if (isatty(1))
      fputs("\033[H\033[2J", stdout);
    else if (round)
      fputs("\n", stdout);
    fputs(text.c_str(), stdout);
    fflush(stdout);
    if (count && round + 1 >= count) return stale(s) ? kStale : kOk;
    prev = s;
    have_prev = true;
    timespec ts{time_t(interval), long((interval - double(time_t(interval))) * 1e9)};
    nanosleep(&ts, nullptr);
    if (kill(pid, 0) != 0 && errno == ESRCH) die(kNoProcess, "process " + std::to_string(pid) + " exited");
  }
}

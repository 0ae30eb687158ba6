// SPDX-License-Identifier: MIT
// cxlpool-stat: reads a running process's stats page (lib/stats/layout.hpp) without attaching
// to it, through /proc/PID/fd (or /proc/PID/map_files), and shows it as a live table like
// top, as JSON, or in the Prometheus text format (node_exporter's textfile collector). Any
// process can name a memfd "cxlpool-stats": the page is checked before it is mapped (sealed,
// bounded, its header exactly version 1's) and every copy again before it is used.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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
#include "common/utf8.hpp"  // header-only: printable()
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
    "Exit status: 0 ok; 1 usage; 2 no such process (or it exited: a zombie); 3 the process has no\n"
    "stats page; 4 permission denied; 5 the page is unreadable (not a cxlpool page: unsealed, too\n"
    "large, malformed or changing; another layout version; or never consistent); 6 stale (the\n"
    "process stopped updating it; the numbers are still printed).\n";

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

// A page of layout version 1 is about 12 KiB; these bounds are far above any real page's and
// keep a forged one from making the reader map, allocate or copy much (docs/stats.md).
constexpr uint32_t kMaxMetrics = 1024;
constexpr uint32_t kMaxDeviceSlots = 256;
constexpr uint32_t kMaxTiers = 64;
constexpr uint64_t kMaxPageBytes = 1 << 20;
// What the publisher seals (os::create_sealed_page): with the size fixed, the mapping can never
// lose its pages under the reader (no SIGBUS), and no one else can map the page writable.
constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
constexpr decltype(statfs::f_type) kTmpfsMagic = 0x01021994;  // memfds live on the kernel's tmpfs

struct Mapped {
  const uint8_t* base = nullptr;
  size_t bytes = 0;
  int pid = 0;        // the process, as this reader sees it
  S::Header shape{};  // the header as map_page validated it: its fixed fields never change
};

// What /proc/PID/status says of a process: whether it is a zombie (exited, not yet reaped), and
// its pid in each pid namespace it is in, this reader's first (NSpid; one entry when the
// process is in this reader's namespace).
struct ProcInfo {
  int pid = 0;
  bool zombie = false;
  bool leader_exited = false;  // Z or X, other threads or not
  std::vector<int> nspids;
};

ProcInfo read_proc(int pid) {
  ProcInfo p;
  p.pid = pid;
  p.nspids = {pid};
  FILE* f = fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "re");
  if (!f) return p;
  char line[512];
  char state = 0;
  long threads = 0;
  while (fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "State:", 6) == 0) {
      if (sscanf(line + 6, " %c", &state) != 1) state = 0;
    } else if (std::strncmp(line, "Threads:", 8) == 0) {
      threads = strtol(line + 8, nullptr, 10);
    } else if (std::strncmp(line, "NSpid:", 6) == 0) {
      std::vector<int> ids;
      char* at = line + 6;
      for (;;) {
        char* end = nullptr;
        const long v = strtol(at, &end, 10);
        if (end == at || v <= 0 || v > 0x7fffffff) break;
        ids.push_back(int(v));
        at = end;
      }
      if (!ids.empty() && ids[0] == pid) p.nspids = ids;
    }
  }
  fclose(f);
  // A thread group whose leader exited while other threads run shows the leader as Z too.
  p.leader_exited = state == 'Z' || state == 'X';
  p.zombie = p.leader_exited && threads <= 1;
  return p;
}

// A process whose leader has exited and whose descriptors listed no page: either its main
// thread left through pthread_exit while others run on, or the whole process is exiting and
// its last threads, their descriptors already closed, are still being torn down. The latter
// ends within moments; wait for it (at most 2 s, polling) rather than call the process one
// without a page.
bool exiting(int pid) {
  for (int i = 0; i < 200; ++i) {
    const ProcInfo p = read_proc(pid);
    if (p.zombie || (kill(pid, 0) != 0 && errno == ESRCH)) return true;
    if (!p.leader_exited) return false;
    usleep(10000);
  }
  return false;
}

// Why h (with file_bytes bytes behind it) is not a stats page of this layout, or nullptr. Every
// field the reader later trusts is checked: the counts against the bounds above, the three
// regions exactly where the layout puts them, and the size exactly what the counts make
// (rounded up to pages, as the publisher does).
const char* shape_problem(const S::Header& h, uint64_t file_bytes) {
  if (std::memcmp(h.magic, S::kMagic, sizeof S::kMagic) != 0) return "not a cxlpool stats page (magic)";
  if (h.version != S::kLayoutVersion) return "a stats page of another layout version";
  if (h.header_bytes != S::kHeaderBytes) return "not a cxlpool stats page (header size)";
  if (h.n_metrics > kMaxMetrics || h.max_devices > kMaxDeviceSlots || h.n_tiers > kMaxTiers ||
      h.n_devices > h.max_devices ||
      uint64_t(h.n_process_metrics) + h.n_device_metrics + h.n_tier_metrics != h.n_metrics)
    return "not a cxlpool stats page (counts out of bounds)";
  const uint64_t devices = uint64_t(S::kHeaderBytes) + uint64_t(h.n_metrics) * sizeof(S::MetricSlot);
  const uint64_t values = devices + uint64_t(h.max_devices) * sizeof(S::DeviceSlot);
  const uint64_t end = values + (uint64_t(h.n_process_metrics) + uint64_t(h.max_devices) * h.n_device_metrics +
                                 uint64_t(h.n_tiers) * h.n_tier_metrics) *
                                    sizeof(uint64_t);
  if (h.metrics_offset != S::kHeaderBytes || h.devices_offset != devices || h.values_offset != values)
    return "not a cxlpool stats page (offsets out of place)";
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  if (h.total_bytes != (end + page - 1) / page * page || h.total_bytes != file_bytes)
    return "not a cxlpool stats page (its size is not what its counts make)";
  return nullptr;
}

// The fixed fields of two headers (everything but the seqlock, the times and n_devices) agree.
bool same_shape(const S::Header& a, const S::Header& b) {
  return std::memcmp(a.magic, b.magic, sizeof a.magic) == 0 && a.version == b.version &&
         a.header_bytes == b.header_bytes && a.total_bytes == b.total_bytes && a.pid == b.pid &&
         a.n_metrics == b.n_metrics && a.max_devices == b.max_devices && a.n_tiers == b.n_tiers &&
         a.metrics_offset == b.metrics_offset && a.devices_offset == b.devices_offset &&
         a.values_offset == b.values_offset && a.n_process_metrics == b.n_process_metrics &&
         a.n_device_metrics == b.n_device_metrics && a.n_tier_metrics == b.n_tier_metrics;
}

std::string pid_list(const std::vector<int>& pids) {
  std::string s;
  for (int p : pids) s += (s.empty() ? "" : ", ") + std::to_string(p);
  return s;
}

// Validates what fd holds as a stats page of the process and maps it read-only. Returns kOk or
// why not. Before anything is mapped: the file is a memfd sealed as the publisher seals it (so
// its size is fixed from here on) and no larger than kMaxPageBytes, and its header (read with
// pread, which cannot fault) describes exactly that size and belongs to the process (its pid
// is the process's pid in one of its pid namespaces).
int map_page(int fd, const ProcInfo& proc, Mapped* out, std::string* why) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0 || fs.f_type != kTmpfsMagic) {
    *why = "not a cxlpool stats page (not a memfd)";
    return kBadPage;
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    char b[160];
    snprintf(b, sizeof b,
             "not a cxlpool stats page (the memfd's seals are 0x%x; a cxlpool page has at least 0x%x: shrink, "
             "grow, future write, seal)",
             seals < 0 ? 0 : unsigned(seals), unsigned(kRequiredSeals));
    *why = b;
    return kBadPage;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size_t(st.st_size) < S::kHeaderBytes) {
    *why = "the page is smaller than its header";
    return kBadPage;
  }
  if (uint64_t(st.st_size) > kMaxPageBytes) {
    *why = "not a cxlpool stats page (" + std::to_string(st.st_size) + " bytes; a cxlpool page is at most " +
           std::to_string(kMaxPageBytes) + ")";
    return kBadPage;
  }
  S::Header h{};
  if (pread(fd, &h, sizeof h, 0) != ssize_t(sizeof h)) {
    *why = std::string("cannot read the page's header: ") + strerror(errno);
    return kBadPage;
  }
  // Magic and version first (a page of another layout says so), then whose page it is, then its
  // shape.
  const bool cxlpool = std::memcmp(h.magic, S::kMagic, sizeof S::kMagic) == 0 && h.version == S::kLayoutVersion;
  if (cxlpool && std::find(proc.nspids.begin(), proc.nspids.end(), h.pid) == proc.nspids.end()) {
    *why = "the page belongs to another process (its pid is " + std::to_string(h.pid) + "; process " +
           std::to_string(proc.pid) + " is " + pid_list(proc.nspids) + ")";
    return kBadPage;
  }
  if (const char* problem = shape_problem(h, uint64_t(st.st_size))) {
    *why = problem;
    return kBadPage;
  }
  void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = std::string("mmap: ") + strerror(errno);
    return kBadPage;
  }
  out->base = static_cast<const uint8_t*>(p);
  out->bytes = size_t(st.st_size);
  out->pid = proc.pid;
  out->shape = h;
  return kOk;
}

int open_page(int pid, Mapped* out, std::string* why) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (stat(proc.c_str(), &st) != 0) {
    *why = "no process " + std::to_string(pid);
    return kNoProcess;
  }
  ProcInfo info = read_proc(pid);
  const bool leader_exited = info.leader_exited;
  std::string fds = proc;  // where its descriptors are listed
  if (leader_exited && !info.zombie) {
    // A main thread that exited (pthread_exit from main) is a zombie while the other threads
    // run, and /proc/PID/fd lists nothing then (or is refused to its owner): a live thread's
    // own directory does.
    if (DIR* d = opendir((proc + "/task").c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.' && std::string(e->d_name) != std::to_string(pid)) {
          fds = proc + "/task/" + e->d_name;
          break;
        }
      closedir(d);
    }
  }
  if (info.zombie) {
    *why = "process " + std::to_string(pid) + " has exited (a zombie its parent has not reaped yet)";
    return kNoProcess;
  }
  int status = kNoPage;
  *why =
      "process " + std::to_string(pid) + " has no cxlpool stats page (not a cxlpool program, or CXLPOOL_STAT_PAGE=0)";
  // Its descriptors first (allowed to whoever may read the process: its owner, root).
  if (DIR* d = opendir((fds + "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string link = fds + "/fd/" + e->d_name;
      if (!is_stats_link(read_link(link))) continue;
      int fd = open(link.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (errno == EACCES || errno == EPERM) status = kDenied, *why = "permission denied opening " + link;
        continue;
      }
      std::string w;
      int r = map_page(fd, info, out, &w);
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
  if (leader_exited && exiting(pid)) {
    *why = "process " + std::to_string(pid) + " has exited (a zombie its parent has not reaped yet)";
    return kNoProcess;
  }
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
    int r = map_page(fd, info, out, &w);
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
    case 6:
      return "pool";
  }
  return "?";
}

// A metric name as Prometheus and JSON keys take it; unit and help: printable ASCII (they go
// into "# HELP" lines, where a newline would forge samples).
bool good_name(const std::string& s) {
  if (s.empty() || s[0] < 'a' || s[0] > 'z') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}
bool good_text(const std::string& s) {
  for (char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

// Copies the page under its seqlock, then checks the copy again before reading anything
// through it: map_page validated the live header, and whoever writes the page may have changed
// it since. A consistent copy whose fixed header fields differ from the validated ones, or
// whose descriptors are not a cxlpool page's, is refused at once (a publisher never changes
// them). false, with *why, when the copy is refused or no consistent copy came in 1,000 tries.
bool take(const Mapped& m, Snapshot* out, std::string* why) {
  std::vector<uint8_t> copy(m.bytes);  // at most kMaxPageBytes (map_page)
  const auto* live = reinterpret_cast<const S::Header*>(m.base);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t s1 = __atomic_load_n(&live->seq, __ATOMIC_ACQUIRE);
    if (s1 & 1) {
      usleep(100);
      continue;
    }
    // A word at a time (the page is page aligned, a whole number of pages).
    for (size_t i = 0; i + 8 <= m.bytes; i += 8) {
      const uint64_t w = __atomic_load_n(reinterpret_cast<const uint64_t*>(m.base + i), __ATOMIC_ACQUIRE);
      std::memcpy(copy.data() + i, &w, 8);
    }
    if (__atomic_load_n(&live->seq, __ATOMIC_RELAXED) != s1) continue;
    const auto* h = reinterpret_cast<const S::Header*>(copy.data());
    if (const char* problem = shape_problem(*h, m.bytes)) {
      *why = std::string("the page changed after it was mapped: ") + problem;
      return false;
    }
    if (!same_shape(*h, m.shape)) {
      *why = "not a cxlpool stats page (its header changed while it was read)";
      return false;
    }
    // From here every offset and count is the copy's own, checked against the copy's size.
    Snapshot s;
    s.pid = m.pid;
    s.program = fixed_text(h->program, sizeof h->program);
    s.interval_ms = h->interval_ms;
    s.start_realtime_ns = h->start_realtime_ns;
    s.updated_realtime_ns = h->updated_realtime_ns;
    s.updated_monotonic_ns = h->updated_monotonic_ns;
    s.publishes = h->publishes;
    const auto* slots = reinterpret_cast<const S::MetricSlot*>(copy.data() + h->metrics_offset);
    s.metrics.reserve(h->n_metrics);
    for (uint32_t i = 0; i < h->n_metrics; ++i) {
      Metric x{S::Scope(slots[i].scope), slots[i].kind, fixed_text(slots[i].name, sizeof slots[i].name),
               fixed_text(slots[i].unit, sizeof slots[i].unit), fixed_text(slots[i].help, sizeof slots[i].help)};
      if (slots[i].scope < uint8_t(S::Scope::kProcess) || slots[i].scope > uint8_t(S::Scope::kTier) ||
          (x.kind != 1 && x.kind != 2) || !good_name(x.name) || !good_text(x.unit) || !good_text(x.help)) {
        *why = "not a cxlpool stats page (metric descriptor " + std::to_string(i) + " is malformed)";
        return false;
      }
      s.metrics.push_back(std::move(x));
    }
    for (const Metric& x : s.metrics)
      (x.scope == S::Scope::kProcess  ? s.process_metrics
       : x.scope == S::Scope::kDevice ? s.device_metrics
                                      : s.tier_metrics)
          .push_back(x);
    if (s.process_metrics.size() != h->n_process_metrics || s.device_metrics.size() != h->n_device_metrics ||
        s.tier_metrics.size() != h->n_tier_metrics) {
      *why = "not a cxlpool stats page (its descriptors do not match its counts)";
      return false;
    }
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
  *why = "the stats page never read consistently";
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
// A Prometheus label value: the text made printable (valid UTF-8, no control bytes), then
// escaped as the text format asks.
std::string label(const std::string& raw) {
  const std::string v = cxlpool::detail::printable(raw);
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
           cxlpool::detail::printable(s.program).c_str(), up, age_s(s), s.interval_ms, stale(s) ? "  STALE" : "");
  out += line;
  const bool tiering = value_of(s, "tiering_running") != 0;
  static const char* const kFenceModes[] = {"unknown", "kernel-mode", "user-mode only (moves that copy are off)",
                                            "none (moves that copy are off)"};
  const uint64_t fence = value_of(s, "write_fence_mode");
  if (tiering)
    snprintf(line, sizeof line, "tiering: running, kernel=%s (numa_balancing=%" PRIu64 "), write fences: %s\n\n",
             value_of(s, "kernel_mode_own") ? "own" : "respect", value_of(s, "numa_balancing"),
             kFenceModes[fence < 4 ? fence : 0]);
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
    if (take(m, &s, &why)) {
      printf("%7ld  %-16s %s\n", pid, cxlpool::detail::printable(s.program).c_str(), stale(s) ? "stale" : "live");
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
    if (!take(m, &s, &why)) die(kBadPage, "process " + std::to_string(pid) + ": " + why);
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
    if ((kill(pid, 0) != 0 && errno == ESRCH) || read_proc(pid).zombie)
      die(kNoProcess, "process " + std::to_string(pid) + " exited");
  }
}

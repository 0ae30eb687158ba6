// SPDX-License-Identifier: MIT
// Hostile sysfs/procfs content: fixture trees with random files replaced by garbage, huge or
// negative numbers, FIFOs, directories, symlink loops; discover() must return promptly, never
// crash, and never present an implausible value as a fact. Plus one case per plausibility rule.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/error.hpp"
#include "os/fs_root.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

using namespace cxlpool::detail;
using cxlpool_test::ScratchDir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Deadlines here only catch a hang (a blocking open, a list expanded one entry at a time):
// generous, so that a slow or loaded machine, or a sanitizer build, never fails them.
constexpr int kHangGuardMs = 30000;

// The limits of docs/topology.md, "Plausibility checks", restated independently of the code.
constexpr uint64_t kMaxBytes = uint64_t(1) << 52;
constexpr uint64_t kMaxLatencyNs = 10'000'000'000;
constexpr uint64_t kMaxBandwidthMbps = 10'000'000;
constexpr int kMaxNodeId = 1023;
constexpr int kMaxCpuId = 65535;

const std::vector<std::string> kTrees = {"cpuless-hmat", "cpuless-nohmat", "cxl-dax",
                                         "one-node",     "three-tier",     "two-socket"};

// A fixture's sys/ and proc/ copied into a scratch directory, to be damaged at will.
class TreeCopy {
 public:
  TreeCopy(const std::string& tree, const std::string& into) : root_(into) {
    fs::create_directories(root_);
    // copy_symlinks keeps the (dangling) DAX driver links as links.
    fs::copy(std::string(CXLPOOL_FIXTURE_DIR) + "/" + tree, root_,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
  std::string sys() const { return root_ + "/sys"; }
  std::string path(const std::string& rel) const { return root_ + "/" + rel; }
  void write(const std::string& rel, const std::string& content) const {
    fs::remove_all(path(rel));
    std::ofstream(path(rel), std::ios::binary) << content;
  }
  DiscoverOptions options(bool default_device = false) const {
    return DiscoverOptions{.sysfs_root = sys(), .ignore_env = true, .no_default_device = !default_device};
  }

 private:
  std::string root_;
};

// A scratch directory on tmpfs when there is one: the fuzz test creates and deletes some 40000
// files, which costs several times longer on a disk filesystem of a busy VM.
class ShmScratch {
 public:
  ShmScratch() {
    char shm[] = "/dev/shm/cxlpool-fuzz-XXXXXX";
    char tmp[] = "/tmp/cxlpool-fuzz-XXXXXX";
    const char* p = mkdtemp(shm);
    if (!p) p = mkdtemp(tmp);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~ShmScratch() { fs::remove_all(path_); }
  ShmScratch(const ShmScratch&) = delete;
  ShmScratch& operator=(const ShmScratch&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool printable_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// Every fact in the model is within the plausibility limits; returns one line per violation.
std::string violations(const Topology& topo) {
  std::string out;
  auto bad = [&](const std::string& what) { out += "VIOLATION: " + what + "\n"; };
  auto range = [&](const std::string& what, const Attr<uint64_t>& a, uint64_t lo, uint64_t hi) {
    if (a.known() && (a.value < lo || a.value > hi)) bad(what + " = " + std::to_string(a.value));
  };
  for (auto& t : topo.targets) {
    range(t.name + ".capacity", t.capacity, 0, kMaxBytes);
    range(t.name + ".free", t.free, 0, kMaxBytes);
    if (t.capacity.known() && t.free.known() && t.free.source == CXLPOOL_SOURCE_SYSFS &&
        t.free.value > t.capacity.value)
      bad(t.name + ": free > capacity");
    range(t.name + ".read_latency", t.read_latency_ns, 1, kMaxLatencyNs);
    range(t.name + ".write_latency", t.write_latency_ns, 1, kMaxLatencyNs);
    range(t.name + ".read_bandwidth", t.read_bandwidth_mbps, 1, kMaxBandwidthMbps);
    range(t.name + ".write_bandwidth", t.write_bandwidth_mbps, 1, kMaxBandwidthMbps);
    for (auto [node, d] : t.distances) {
      if (node < 0 || node > kMaxNodeId || d < 10 || d > 254) bad(t.name + ".distance[" + std::to_string(node) + "]");
      if (node == t.numa_node && d != 10) bad(t.name + ": distance to itself " + std::to_string(d));
    }
    if (t.cpu_count.known() && (t.cpu_count.value < 0 || t.cpu_count.value > kMaxCpuId + 1)) bad(t.name + ".cpu_count");
    if (!printable_ascii(t.cpulist) || t.cpulist.find_first_not_of("0123456789,-") != std::string::npos)
      bad(t.name + ".cpulist not a list");
    if (t.interleave_weight.known() && (t.interleave_weight.value < 1 || t.interleave_weight.value > 255))
      bad(t.name + ".interleave_weight = " + std::to_string(t.interleave_weight.value));
    if (t.kernel_tier.known() && t.kernel_tier.value < 0) bad(t.name + ".kernel_tier");
    if (t.numa_node < -1 || t.numa_node > kMaxNodeId) bad(t.name + ".numa_node = " + std::to_string(t.numa_node));
    if (t.backing.capacity > kMaxBytes) bad(t.name + ".backing.capacity");
    size_t ps = t.backing.page_size;
    if (ps != 0 && (ps < 4096 || ps > kMaxBytes || (ps & (ps - 1)) != 0)) bad(t.name + ".page_size");
    if (!printable_ascii(t.name)) bad("target name not printable");
  }
  for (auto& d : topo.dax_devices) {
    if (d.size && *d.size > kMaxBytes) bad(d.name + ".size");
    if (d.align && (*d.align < 4096 || *d.align > kMaxBytes || (*d.align & (*d.align - 1)) != 0))
      bad(d.name + ".align");
    if (d.target_node < -1 || d.target_node > kMaxNodeId) bad(d.name + ".target_node");
    if (!printable_ascii(d.name) || !printable_ascii(d.driver)) bad("dax strings not printable");
  }
  for (auto& m : topo.memdevs) {
    if ((m.ram_bytes && *m.ram_bytes > kMaxBytes) || (m.pmem_bytes && *m.pmem_bytes > kMaxBytes)) bad(m.name + ".size");
    if (m.numa_node < -1 || m.numa_node > kMaxNodeId) bad(m.name + ".numa_node");
    if (!printable_ascii(m.serial)) bad(m.name + ".serial not printable");
  }
  static const std::vector<uint64_t> ways = {1, 2, 3, 4, 6, 8, 12, 16};
  for (auto& r : topo.regions) {
    if (r.size && *r.size > kMaxBytes) bad(r.name + ".size");
    if (r.interleave_ways && std::find(ways.begin(), ways.end(), *r.interleave_ways) == ways.end())
      bad(r.name + ".interleave_ways");
    if (!printable_ascii(r.mode) || !printable_ascii(r.dax_device)) bad(r.name + " strings not printable");
    for (auto& x : r.targets)
      if (!printable_ascii(x)) bad(r.name + ".targets not printable");
  }
  auto& k = topo.kernel;
  if (k.numa_balancing.known() && (k.numa_balancing.value < 0 || k.numa_balancing.value > 3))
    bad("numa_balancing = " + std::to_string(k.numa_balancing.value));
  for (auto& [id, nodes] : k.memory_tiers) {
    if (id < 0) bad("memory tier id");
    for (int n : nodes)
      if (n < 0 || n > kMaxNodeId) bad("memory tier node id");
  }
  for (auto& w : topo.warnings)
    if (!printable_ascii(w) || w.size() > 512) bad("warning not one short printable line: " + w.substr(0, 80));
  // The JSON document (cxlpool-info --json) is plain ASCII whatever the tree held.
  std::string json = topology_to_json(topo);
  if (!std::all_of(json.begin(), json.end(), [](char c) { return (c >= 0x20 && c < 0x7f) || c == '\n'; }))
    bad("JSON has non-ASCII bytes");
  return out;
}

struct ChildResult {
  bool timed_out = false;
  int signal = 0;      // the child died of this signal (a crash)
  int exit_code = -1;  // otherwise its exit code
  std::string report;  // what the child wrote
  double seconds = 0;
};

// Runs fn in a forked child so a crash or a hang cannot take the test runner with it: the
// child is killed after timeout (and alarm() is its backstop). fn's result comes back
// through a pipe.
ChildResult run_in_child(const std::function<std::string()>& fn, std::chrono::milliseconds timeout) {
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  auto start = Clock::now();
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    alarm(unsigned(timeout.count() / 1000 + 2));
    std::string out;
    try {
      out = fn();
    } catch (const Failure& f) {
      out = "FAILURE: " + std::to_string(f.status()) + " " + f.what();
    } catch (const std::exception& e) {
      out = std::string("EXCEPTION: ") + e.what();
    } catch (...) {
      out = "EXCEPTION: unknown type";
    }
    for (size_t off = 0; off < out.size();) {
      ssize_t n = write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += size_t(n);
    }
    _exit(0);  // no atexit handlers: the scratch directories belong to the parent
  }
  close(fds[1]);
  ChildResult r;
  auto deadline = start + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, int(left));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) continue;  // the deadline check above ends the loop
    ssize_t got = read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the child finished or died
    r.report.append(buf, size_t(got));
  }
  close(fds[0]);
  if (r.timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFSIGNALED(status) && !r.timed_out) r.signal = WTERMSIG(status);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

// Entries (files, links, directories) of a copied tree, relative to its root, sorted so the
// same seed picks the same entries everywhere.
std::vector<std::string> entries(const std::string& root) {
  std::vector<std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it)
    out.push_back(it->path().string().substr(root.size() + 1));
  std::sort(out.begin(), out.end());
  return out;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  uint64_t below(uint64_t n) { return rng_() % n; }

  // Damages root/rel in one of the ways hostile or broken sysfs can look; returns what it did.
  std::string mutate(const std::string& root, const std::string& rel) {
    const std::string p = root + "/" + rel;
    auto replace = [&](const std::string& content) {
      fs::remove_all(p);
      std::ofstream(p, std::ios::binary) << content;
    };
    static const char* numbers[] = {"99999999999999999999",
                                    "18446744073709551615",
                                    "18446744073709551616",
                                    "0xffffffffffffffff",
                                    "0x10000000000000000",
                                    "-1",
                                    "-4096",
                                    "-9223372036854775808",
                                    "0",
                                    "255",
                                    "256",
                                    "10000000001",
                                    "9007199254740992",
                                    "3",
                                    "1e9",
                                    "+5",
                                    " 12 ",
                                    "4294967296"};
    switch (below(14)) {
      case 0: {
        std::string junk(1 + below(64), '\0');
        for (auto& c : junk) c = char(below(256));
        junk[below(junk.size())] = '\0';
        junk[below(junk.size())] = char(0xff);
        replace(junk);
        return "garbage bytes";
      }
      case 1: {
        const char* n = numbers[below(std::size(numbers))];
        replace(n);
        return std::string("number '") + n + "'";
      }
      case 2: {
        const char* n = numbers[below(std::size(numbers))];
        replace(std::string("Node 0 MemTotal: ") + n + " kB\nNode 0 MemFree: " + numbers[below(std::size(numbers))] +
                " kB\n");
        return std::string("meminfo with '") + n + "'";
      }
      case 3:
        replace("");
        return "empty";
      case 4:
        replace(std::string(2u << 20, char('0' + below(10))));
        return "2 MiB file";
      case 5:
        fs::remove_all(p);
        if (mkfifo(p.c_str(), 0600) != 0) return "mkfifo failed";
        return "FIFO";
      case 6:
        fs::remove_all(p);
        fs::create_directory(p);
        return "directory";
      case 7:
        fs::remove_all(p);
        fs::create_symlink(fs::path(p).filename(), p);  // points at itself
        return "symlink loop";
      case 8:
        fs::remove_all(p);
        return "removed";
      case 9:
        fs::remove_all(p);
        fs::create_symlink("/dev/zero", p);
        return "symlink to /dev/zero";
      case 10:
        replace(below(2) ? "0-1048575" : [] {
          std::string s;
          while (s.size() < (512u << 10)) s += "0-65535,";
          return s + "1";
        }());
        return "id list bomb";
      case 11: {
        std::string keep;
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) std::getline(std::ifstream(p), keep, '\0');
        replace(keep + "\xff\x01junk\n");
        return "trailing junk";
      }
      case 12:
        replace(std::to_string(below(300)));
        return "small number";
      default:
        replace("\n \t\n");
        return "whitespace";
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("fuzz: discovery of damaged sysfs trees is prompt, safe and never shows implausible facts", "[unit]") {
  constexpr uint64_t kSeed = 0x5f5f2024cafef00d;
  constexpr int kTreesPerFixture = 100;
  ShmScratch dir;
  Mutator m(kSeed);
  int trees = 0, mutations = 0, failures = 0;
  double slowest = 0;
  auto start = Clock::now();
  for (const auto& fixture : kTrees) {
    for (int i = 0; i < kTreesPerFixture; ++i) {
      const std::string root = dir.path() + "/t" + std::to_string(trees++);
      TreeCopy tree(fixture, root);
      std::vector<std::string> all = entries(root);
      std::vector<std::string> files;
      for (auto& e : all)
        if (!fs::is_directory(fs::symlink_status(root + "/" + e))) files.push_back(e);
      std::string done;
      int n = 1 + int(m.below(3));
      for (int j = 0; j < n; ++j) {
        // Mostly files; now and then a whole directory (a node, a device) is the victim.
        const auto& pool = m.below(8) == 0 ? all : files;
        const std::string rel = pool[m.below(pool.size())];
        std::error_code ec;  // inside something already replaced: ENOTDIR, ELOOP
        if (!fs::exists(fs::symlink_status(root + "/" + rel, ec)) || ec) continue;
        if (rel == "sys") continue;  // the root itself missing is a documented Failure, not a fuzz case
        done += rel + ": " + m.mutate(root, rel) + "; ";
        ++mutations;
      }
      bool default_device = m.below(2) == 0;
      DiscoverOptions o = tree.options(default_device);
      ChildResult r = run_in_child([&] { return violations(discover(o)); }, std::chrono::milliseconds(kHangGuardMs));
      INFO("seed " << kSeed << ", tree " << root << " (" << fixture << "): " << done);
      INFO("child report: " << r.report);
      CHECK_FALSE(r.timed_out);
      CHECK(r.signal == 0);
      CHECK(r.exit_code == 0);
      if (r.report.rfind("FAILURE: ", 0) == 0)
        ++failures;  // a documented error type: allowed
      else
        CHECK(r.report.empty());
      slowest = std::max(slowest, r.seconds);
      fs::remove_all(root);
    }
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "sysfs fuzz: seed %llu, %d trees, %d mutations, %d Failure results, slowest discover %.3f s, %.1f s total\n",
      static_cast<unsigned long long>(kSeed), trees, mutations, failures, slowest, seconds);
  CHECK(trees >= 300);
}

namespace {

struct Rule {
  std::string tree;
  std::string file;     // relative to the tree (sys/... or proc/...)
  std::string content;  // written into file
  std::string raw;      // what the warning must quote
  std::function<bool(const Topology&)> known;
};

const Target& target(const Topology& t, const std::string& name) {
  const Target* p = t.find(name);
  REQUIRE(p != nullptr);
  return *p;
}

// For each rule: the attribute is known on the intact fixture; with exactly one impossible
// value it is unknown, and a warning names the file and quotes the raw value.
void check_rules(const std::vector<Rule>& rules) {
  ScratchDir dir;
  int i = 0;
  for (auto& rule : rules) {
    INFO(rule.tree << ": " << rule.file << " = '" << rule.raw << "'");
    TreeCopy tree(rule.tree, dir.path() + "/r" + std::to_string(i++));
    CHECK(rule.known(discover(tree.options())));
    tree.write(rule.file, rule.content);
    Topology t = discover(tree.options());
    CHECK_FALSE(rule.known(t));
    bool named = std::any_of(t.warnings.begin(), t.warnings.end(), [&](const std::string& w) {
      return w.find(rule.file) != std::string::npos && w.find("'" + rule.raw) != std::string::npos &&
             w.find("treated as unknown") != std::string::npos;
    });
    if (!named)
      for (auto& w : t.warnings) UNSCOPED_INFO("warning: " << w);
    CHECK(named);
    CHECK(violations(t).empty());
  }
}

const char* kN0 = "sys/devices/system/node/node0/";
const char* kN1 = "sys/devices/system/node/node1/";
std::string n0(const char* f) { return kN0 + std::string(f); }
std::string n1(const char* f) { return kN1 + std::string(f); }

}  // namespace

TEST_CASE("plausibility: node meminfo sizes", "[unit]") {
  auto capacity = [](const Topology& t) { return target(t, "node0").capacity.known(); };
  auto free = [](const Topology& t) { return target(t, "node0").free.known(); };
  auto both = [](const Topology& t) { return target(t, "node0").capacity.known() || target(t, "node0").free.known(); };
  const std::string mi = n0("meminfo");
  check_rules({
      {"one-node", mi, "Node 0 MemTotal: 18446744073709551615 kB\nNode 0 MemFree: 1024 kB\n", "18446744073709551615 kB",
       capacity},  // kB * 1024 overflows
      {"one-node", mi, "Node 0 MemTotal: 18014398509481984 kB\nNode 0 MemFree: 1024 kB\n", "18014398509481984 kB",
       capacity},  // exactly 2^64 bytes
      {"one-node", mi, "Node 0 MemTotal: 8796093022208 kB\nNode 0 MemFree: 1024 kB\n", "8796093022208 kB",
       capacity},  // 8 PiB: no overflow, but beyond 4 PiB
      {"one-node", mi, "Node 0 MemTotal: -4096 kB\nNode 0 MemFree: 1024 kB\n", "-4096 kB", capacity},
      {"one-node", mi, "Node 0 MemTotal: 4096 kB\nNode 0 MemFree: 99999999999999999999 kB\n", "99999999999999999999 kB",
       free},
      {"one-node", mi, "Node 0 MemTotal: 1024 kB\nNode 0 MemFree: 2048 kB\n", "2048 kB", both},  // free > total
  });
  // 4 PiB itself is still accepted.
  ScratchDir dir;
  TreeCopy tree("one-node", dir.path() + "/t");
  tree.write(mi, "Node 0 MemTotal: 4398046511104 kB\nNode 0 MemFree: 1024 kB\n");
  CHECK(target(discover(tree.options()), "node0").capacity.value == uint64_t(1) << 52);
}

TEST_CASE("plausibility: HMAT latency and bandwidth", "[unit]") {
  const std::string rl = n1("access0/initiators/read_latency"), wl = n1("access0/initiators/write_latency"),
                    rb = n1("access0/initiators/read_bandwidth"), wb = n1("access0/initiators/write_bandwidth");
  auto lat = [](const Topology& t) { return target(t, "node1").read_latency_ns.known(); };
  auto wlat = [](const Topology& t) { return target(t, "node1").write_latency_ns.known(); };
  auto bw = [](const Topology& t) { return target(t, "node1").read_bandwidth_mbps.known(); };
  auto wbw = [](const Topology& t) { return target(t, "node1").write_bandwidth_mbps.known(); };
  check_rules({
      {"cpuless-hmat", rl, "0", "0", lat},
      {"cpuless-hmat", rl, "10000000001", "10000000001", lat},  // 10 s + 1 ns
      {"cpuless-hmat", wl, "-300", "-300", wlat},
      {"cpuless-hmat", rb, "0", "0", bw},
      {"cpuless-hmat", rb, "10000001", "10000001", bw},  // 10 TB/s + 1 MB/s
      {"cpuless-hmat", wb, "18446744073709551615", "18446744073709551615", wbw},
  });
}

TEST_CASE("plausibility: SLIT distances", "[unit]") {
  const std::string d0 = n0("distance");
  auto row = [](const Topology& t) { return !target(t, "node0").distances.empty(); };
  auto to1 = [](const Topology& t) { return target(t, "node0").distances.count(1) == 1; };
  check_rules({
      {"two-socket", d0, "10 9", "10 9", row},
      {"two-socket", d0, "10 300", "10 300", row},
      {"two-socket", d0, "21 21", "21 21", row},  // distance to itself must be 10
      {"two-socket", d0, "10 -21", "10 -21", row},
      {"two-socket", d0, "10 21 21", "10 21 21", row},  // one entry per online node
      {"two-socket", d0, "10 255", "10 255", to1},      // unreachable: that entry only
  });
  ScratchDir dir;
  TreeCopy tree("two-socket", dir.path() + "/t");
  tree.write(d0, "10 255");
  CHECK(target(discover(tree.options()), "node0").distances.at(0) == 10);
}

TEST_CASE("plausibility: cpulists and node lists", "[unit]") {
  const std::string cpus = n0("cpulist");
  auto cpu_facts = [](const Topology& t) {
    const Target& n = target(t, "node0");
    return n.cpu_count.known() || n.cpuless.known() || !n.cpulist.empty();
  };
  check_rules({
      {"one-node", cpus.c_str(), std::string("0-3\xff\x00zz", 7), "0-3\\xff\\x00zz", cpu_facts},
      {"one-node", cpus, "0-70000", "0-70000", cpu_facts},
      {"one-node", cpus, "3-1", "3-1", cpu_facts},
      {"one-node", cpus, "-1", "-1", cpu_facts},
  });
  // An online list with an impossible node id: warned, and the node directories are listed instead.
  ScratchDir dir;
  TreeCopy tree("two-socket", dir.path() + "/t");
  tree.write("sys/devices/system/node/online", "0-5000");
  Topology t = discover(tree.options());
  CHECK(t.find("node1") != nullptr);
  CHECK(std::any_of(t.warnings.begin(), t.warnings.end(), [](auto& w) {
    return w.find("node/online") != std::string::npos && w.find("'0-5000'") != std::string::npos;
  }));
  // A megabyte of ranges is refused without expanding them one by one.
  std::string bomb;
  while (bomb.size() < (1000u << 10)) bomb += "0-65535,";
  tree.write(cpus, bomb + "1");
  auto start = Clock::now();
  Topology b = discover(tree.options());
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() * 1000 < kHangGuardMs);  // one by one: hours
  CHECK(target(b, "node0").cpu_count.value == 65536);
}

TEST_CASE("plausibility: kernel tiering state", "[unit]") {
  auto tier = [](const Topology& t) { return target(t, "node0").kernel_tier.known(); };
  auto balancing = [](const Topology& t) { return t.kernel.numa_balancing.known(); };
  auto demotion = [](const Topology& t) { return t.kernel.demotion_enabled.known(); };
  auto weight = [](const Topology& t) { return target(t, "node0").interleave_weight.known(); };
  const std::string wi0 = "sys/kernel/mm/mempolicy/weighted_interleave/node0";
  check_rules({
      {"one-node", "proc/sys/kernel/numa_balancing", "7", "7", balancing},
      {"one-node", "proc/sys/kernel/numa_balancing", "-1", "-1", balancing},
      {"one-node", "sys/kernel/mm/numa/demotion_enabled", "maybe", "maybe", demotion},
      {"cpuless-hmat", wi0, "0", "0", weight},
      {"cpuless-hmat", wi0, "256", "256", weight},
      {"one-node", "sys/devices/virtual/memory_tiering/memory_tier4/nodelist", "0,zz", "0,zz", tier},
  });
  // A memory tier whose id does not parse: its nodes get no kernel tier.
  for (const char* name : {"memory_tierX", "memory_tier99999999999999999999", "memory_tier-4"}) {
    INFO(name);
    ScratchDir dir;
    TreeCopy tree("one-node", dir.path() + "/t");
    const std::string mt = tree.path("sys/devices/virtual/memory_tiering/");
    fs::rename(mt + "memory_tier4", mt + name);
    Topology t = discover(tree.options());
    CHECK_FALSE(target(t, "node0").kernel_tier.known());
    CHECK(t.kernel.memory_tiers.empty());
    CHECK(std::any_of(t.warnings.begin(), t.warnings.end(),
                      [&](auto& w) { return w.find(std::string("'") + name + "'") != std::string::npos; }));
  }
}

TEST_CASE("plausibility: DAX devices, CXL regions and memdevs", "[unit]") {
  const std::string dax = "sys/bus/dax/devices/dax1.0/";
  const std::string size = dax + "size", align = dax + "align", node = dax + "target_node";
  auto dev = [](const Topology& t) -> const DaxDevice& { return t.dax_devices.at(1); };
  auto dsize = [&](const Topology& t) { return dev(t).size.has_value() && target(t, "dax1.0").capacity.known(); };
  auto dalign = [&](const Topology& t) {
    return dev(t).align.has_value() && target(t, "dax1.0").backing.page_size != 0;
  };
  auto dnode = [&](const Topology& t) { return dev(t).target_node >= 0; };
  auto rsize = [](const Topology& t) { return t.regions.at(0).size.has_value(); };
  auto rways = [](const Topology& t) { return t.regions.at(0).interleave_ways.has_value(); };
  auto ram = [](const Topology& t) { return t.memdevs.at(0).ram_bytes.has_value(); };
  auto mnode = [](const Topology& t) { return t.memdevs.at(0).numa_node >= 0; };
  check_rules({
      {"cxl-dax", size, "9007199254740992", "9007199254740992", dsize},  // 2^53
      {"cxl-dax", size, "-2147483648", "-2147483648", dsize},
      {"cxl-dax", align, "3000000", "3000000", dalign},  // not a power of two
      {"cxl-dax", align, "0", "0", dalign},
      {"cxl-dax", align, "9007199254740992", "9007199254740992", dalign},
      {"cxl-dax", node, "5000", "5000", dnode},
      {"cxl-dax", "sys/bus/cxl/devices/region0/size", "0x20000000000000", "0x20000000000000", rsize},
      {"cxl-dax", "sys/bus/cxl/devices/region0/interleave_ways", "5", "5", rways},
      {"cxl-dax", "sys/bus/cxl/devices/mem0/ram/size", "0xffffffffffffffffff", "0xffffffffffffffffff", ram},
      {"cxl-dax", "sys/bus/cxl/devices/mem0/numa_node", "-7", "-7", mnode},
  });
}

TEST_CASE("non-regular sysfs files are refused without blocking, and named", "[unit]") {
  ScratchDir dir;
  const std::string d = dir.path();
  std::ofstream(d + "/regular") << "42\n";
  REQUIRE(mkfifo((d + "/fifo").c_str(), 0600) == 0);
  fs::create_directory(d + "/dir");
  fs::create_symlink("/dev/zero", d + "/device");
  fs::create_symlink("loop", d + "/loop");
  std::ofstream(d + "/big") << std::string(2u << 20, '7');
  int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(sock >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s/socket", d.c_str());
  REQUIRE(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);

  cxlpool::os::FsRoot root(d);
  std::string why;
  CHECK(root.read("regular", &why) == "42");
  CHECK(why.empty());
  CHECK_FALSE(root.read("absent", &why));
  CHECK(why.empty());  // absent is simply unknown
  auto start = Clock::now();
  for (auto [name, expect] : std::vector<std::pair<std::string, std::string>>{{"fifo", "is a FIFO"},
                                                                              {"dir", "is a directory"},
                                                                              {"device", "is a character device"},
                                                                              {"socket", "is a socket"},
                                                                              {"loop", "symlink loop"},
                                                                              {"big", "larger than 1 MiB"}}) {
    INFO(name);
    CHECK_FALSE(root.read(name, &why));
    CHECK(why.find(expect) != std::string::npos);
  }
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() * 1000 < kHangGuardMs);  // a blocking open: forever
  close(sock);

  // Real sysfs attributes and procfs files are regular files, so they still read.
  cxlpool::os::FsRoot sys("/sys"), proc("/proc");
  if (fs::exists("/sys/devices/system/cpu/online")) CHECK(sys.read("devices/system/cpu/online").has_value());
  CHECK(proc.read("self/status").has_value());

  // In a tree, a refused file is a warning naming it, and the attribute is unknown.
  TreeCopy tree("one-node", d + "/tree");
  fs::remove(tree.path(n0("meminfo")));
  REQUIRE(mkfifo(tree.path(n0("meminfo")).c_str(), 0600) == 0);
  Topology t = discover(tree.options());
  CHECK_FALSE(target(t, "node0").capacity.known());
  CHECK(std::any_of(t.warnings.begin(), t.warnings.end(), [&](auto& w) {
    return w.find(n0("meminfo")) != std::string::npos && w.find("is a FIFO") != std::string::npos;
  }));
}

TEST_CASE("a FIFO as CXLPOOL_CONFIG is a prompt configuration error naming the path", "[unit]") {
  ScratchDir dir;
  const std::string fifo = dir.path() + "/devices.conf";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  DiscoverOptions o{.sysfs_root = cxlpool_test::fixture("one-node"), .config_file = fifo, .ignore_env = true};
  ChildResult r = run_in_child(
      [&] {
        discover(o);
        return std::string("no error");
      },
      std::chrono::milliseconds(kHangGuardMs));
  CHECK_FALSE(r.timed_out);
  INFO(r.report);
  CHECK(r.report.rfind("FAILURE: " + std::to_string(CXLPOOL_E_CONFIG) + " ", 0) == 0);
  CHECK(r.report.find("CXLPOOL_CONFIG") != std::string::npos);
  CHECK(r.report.find("'" + fifo + "' is a FIFO, not a regular file") != std::string::npos);
}

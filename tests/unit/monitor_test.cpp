// SPDX-License-Identifier: MIT
// Hotness monitors (lib/tiering/monitor_*.cpp): every kind is detected with a reason; each
// available monitor finds a synthetic hot set in anonymous, memfd private and memfd shared
// memory (precision and recall printed); pagemap_scan lets system calls write watched pages,
// survives a mapping replaced under it and leaves unwatched memory as it was; sample never
// touches PROT_NONE or decommitted pages, passes foreign faults on, never arms read-only pages;
// a forked child is unaffected by either.
#include "tiering/monitor.hpp"

#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "os/sample_trap.hpp"
#include "os/uffd.hpp"
#include "os/vm_query.hpp"
#include "program_segv_handler.hpp"
#include "test_support.hpp"
#include "tiering/monitor_pagemap_scan.hpp"
#include "tiering/monitor_sample.hpp"

using namespace cxlpool::detail::tiering;
namespace vmq = cxlpool::os::vm_query;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
const size_t kPage = size_t(sysconf(_SC_PAGESIZE));

// Records touched pages relative to a base.
struct PageSink final : HeatSink {
  uintptr_t base = 0;
  size_t len = 0;
  std::set<size_t> pages;  // page indexes inside [base, base+len)
  size_t outside = 0, calls = 0;
  AccessKind last_kind = AccessKind::kAny;
  void touched(uintptr_t addr, size_t n, AccessKind kind, uint32_t) noexcept override {
    ++calls;
    last_kind = kind;
    for (uintptr_t p = addr; p < addr + n; p += kPage) {
      if (p >= base && p < base + len)
        pages.insert((p - base) / kPage);
      else
        ++outside;
    }
  }
  std::set<size_t> seen;  // observed page indexes
  void observed(uintptr_t addr, size_t n) noexcept override {
    for (uintptr_t p = addr; p < addr + n; p += kPage)
      if (p >= base && p < base + len) seen.insert((p - base) / kPage);
  }
  void reset() {
    pages.clear();
    seen.clear();
    outside = calls = 0;
  }
};

struct Mapping {
  std::string kind;
  char* p = nullptr;
  size_t len = 0;
  int fd = -1;
  Mapping(std::string k, size_t n) : kind(std::move(k)), len(n) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    if (kind != "anonymous") {
      fd = memfd_create(("monitor-test-" + kind).c_str(), MFD_CLOEXEC);
      REQUIRE(fd >= 0);
      REQUIRE(ftruncate(fd, off_t(n)) == 0);
      flags = kind == "memfd shared" ? MAP_SHARED : MAP_PRIVATE;
    }
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, fd, 0);
    REQUIRE(m != MAP_FAILED);
    p = static_cast<char*>(m);
  }
  ~Mapping() {
    munmap(p, len);
    if (fd >= 0) close(fd);
  }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(p); }
};

std::vector<size_t> hot_set(size_t pages, double fraction, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> all(pages);
  for (size_t i = 0; i < pages; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(double(pages) * fraction));
  std::sort(all.begin(), all.end());
  return all;
}

struct Score {
  double precision = 0, recall = 0;
};
Score score(const std::set<size_t>& reported, const std::vector<size_t>& hot) {
  size_t hits = 0;
  for (size_t h : hot) hits += reported.count(h);
  Score s;
  s.precision = reported.empty() ? 1.0 : double(hits) / double(reported.size());
  s.recall = hot.empty() ? 1.0 : double(hits) / double(hot.size());
  return s;
}

// Protections of [p, p+len) page by page: 'w' read-write, '-' anything else.
std::string protections(const void* p, size_t len) {
  std::string out(len / kPage, '-');
  std::vector<vmq::Run> runs(4096);
  size_t n = 0;
  auto a = reinterpret_cast<uintptr_t>(p);
  REQUIRE(vmq::read_write_runs(a, a + len, runs.data(), runs.size(), &n) == 0);
  for (size_t i = 0; i < n; ++i)
    for (uintptr_t q = runs[i].begin; q < runs[i].end; q += kPage) out[(q - a) / kPage] = 'w';
  return out;
}

const char* const kKinds[] = {"anonymous", "memfd private", "memfd shared"};

// Budget enough for any monitor to arm everything it may (pagemap_scan: exact).
constexpr uint64_t kAmple = uint64_t(1) << 60;

// Ends the monitor's period (reporting to sink) and starts the next one with an ample budget.
void next_period(Monitor& m, HeatSink& sink) {
  m.collect(sink);
  m.arm(kAmple);
}

}  // namespace

TEST_CASE("detection: every kind appears, in order, with a non-empty reason", "[unit][monitor]") {
  auto all = detect_monitors();
  const char* names[] = {"hint", "pagemap_scan", "sample", "damon", "perf", "numa_balancing"};
  REQUIRE(all.size() == 6);
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].name == names[i]);
    CHECK(!all[i].availability.reason.empty());
    WARN(all[i].name << ": " << (all[i].availability.available ? "available" : "unavailable") << ": "
                     << all[i].availability.reason);
  }
  CHECK(all[0].availability.available);
  CHECK(all[0].availability.reason == "explicit cxlpool_hint_access/cxlpool_pin calls");
  std::string why;
  CHECK(make_monitor("hint", &why) == nullptr);
  CHECK(why.find("engine owns hints") != std::string::npos);
  for (const char* k : {"damon", "perf", "numa_balancing", "nonsense"}) {
    why.clear();
    CHECK(make_monitor(k, &why) == nullptr);
    CHECK(!why.empty());
  }
  // Whatever is available can be made, and what cannot be made says why.
  for (const auto& m : all) {
    if (m.name == "hint" || m.name == "damon" || m.name == "perf" || m.name == "numa_balancing") continue;
    why.clear();
    auto mon = make_monitor(m.name, &why);
    CHECK((mon != nullptr) == m.availability.available);
    if (!mon) CHECK(!why.empty());
  }
}

TEST_CASE("pagemap_scan: exact written pages of a synthetic hot set", "[unit][monitor]") {
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  CHECK(std::string(mon->name()) == "pagemap_scan");
  CHECK(mon->sees() == AccessKind::kWrite);
  for (const char* kind : kKinds) {
    Mapping m(kind, 64 * kMiB);
    const size_t pages = m.len / kPage;
    memset(m.p, 1, m.len / 2);  // half present before watching, half not yet
    REQUIRE(mon->watch(m.addr(), m.len) == 0);
    mon->arm(kAmple);
    PageSink sink;
    sink.base = m.addr();
    sink.len = m.len;
    next_period(*mon, sink);
    CHECK(sink.pages.empty());  // nothing written since watch()
    double worst_p = 1, worst_r = 1;
    for (unsigned interval = 0; interval < 5; ++interval) {
      auto hot = hot_set(pages, 0.10, interval);
      for (size_t h : hot) m.p[h * kPage + (interval * 64) % kPage] = char(interval);
      sink.reset();
      next_period(*mon, sink);
      Score s = score(sink.pages, hot);
      worst_p = std::min(worst_p, s.precision);
      worst_r = std::min(worst_r, s.recall);
      CHECK(sink.outside == 0);
      CHECK(sink.last_kind == AccessKind::kWrite);
    }
    WARN("pagemap_scan, " << kind << ", 64 MiB, hot set 10% rewritten in 5 intervals: precision " << worst_p
                          << ", recall " << worst_r << " (worst interval)");
    CHECK(worst_p == 1.0);
    CHECK(worst_r == 1.0);
    // Reads are not writes.
    volatile char sum = 0;
    for (size_t i = 0; i < m.len; i += kPage) sum = char(sum + m.p[i]);
    sink.reset();
    next_period(*mon, sink);
    CHECK(sink.pages.empty());
    mon->unwatch(m.addr(), m.len);
  }
  CHECK(mon->faults() > 0);
  CHECK(mon->scan_ns() > 0);
}

TEST_CASE("pagemap_scan: the plan is exact when it is cheap and a bounded sample when it is not", "[unit][monitor]") {
  PagemapScanOptions o;
  o.protect_cost_ns = 5000;
  o.fault_cost_ns = 1000;
  o.chunk_pages = 8;
  PagemapScanPlan p = pagemap_scan_plan(o, 4, 1000, 5'000'000);
  CHECK(p.exact);  // 4 calls + 1,000 faults = 1.02 ms
  p = pagemap_scan_plan(o, 256, 262144, 5'000'000);
  CHECK_FALSE(p.exact);
  CHECK(p.chunk_pages == 8);
  CHECK(p.chunks == 5'000'000 / 13'000);  // each chunk: a call and 8 faults
  CHECK(p.chunks * (5000 + 8 * 1000) <= 5'000'000);
  p = pagemap_scan_plan(o, 2000, 4000, 5'000'000);  // many small ranges: never more pages than there are
  CHECK_FALSE(p.exact);
  CHECK(p.chunks * p.chunk_pages <= 4000);
  CHECK_FALSE(pagemap_scan_plan(o, 0, 0, 5'000'000).exact);
  CHECK(pagemap_scan_plan(o, 1, 1 << 20, 1000).chunks == 0);  // less than one chunk's worth: nothing armed
  o.max_chunks = 10;
  CHECK(pagemap_scan_plan(o, 1, 1 << 20, 1'000'000'000).chunks == 10);
}

TEST_CASE("pagemap_scan: a sampled period stays within its budget and estimates each range's written share",
          "[unit][monitor]") {
  PagemapScanOptions o;
  std::string why;
  auto mon = make_pagemap_scan_monitor(o, &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  // 64 ranges of 4 MiB (65,536 pages): 8 hot ranges written all over each period, the others
  // with 2 % of their pages written.
  constexpr size_t kRanges = 64, kRange = 4 * kMiB;
  Mapping m("anonymous", kRanges * kRange);
  memset(m.p, 1, m.len);
  const size_t per = kRange / kPage;
  for (size_t r = 0; r < kRanges; ++r) REQUIRE(mon->watch(m.addr() + r * kRange, kRange) == 0);
  const uint64_t budget = 2'000'000;  // 2 ms: ~40 chunks of 16 pages
  const PagemapScanPlan plan = pagemap_scan_plan(o, kRanges, m.len / kPage, budget);
  REQUIRE_FALSE(plan.exact);
  auto hot = [](size_t r) { return r % 8 == 3; };
  std::vector<double> touched(kRanges), observed(kRanges);
  std::mt19937 rng(7);
  size_t faults_before = mon->faults();
  size_t worst_seen = SIZE_MAX, most_seen = 0, false_reports = 0;
  PageSink sink;
  sink.base = m.addr();
  sink.len = m.len;
  const int kPeriods = 20;
  for (int period = 0; period < kPeriods; ++period) {
    mon->arm(budget);
    std::set<size_t> written;
    for (size_t r = 0; r < kRanges; ++r)
      for (size_t i = 0; i < per; ++i)
        if (hot(r) || rng() % 50 == 0) {
          m.p[(r * per + i) * kPage + 16] = char(period);
          written.insert(r * per + i);
        }
    sink.reset();
    mon->collect(sink);
    worst_seen = std::min(worst_seen, sink.seen.size());
    most_seen = std::max(most_seen, sink.seen.size());
    for (size_t pg : sink.pages) {
      false_reports += !written.count(pg) || !sink.seen.count(pg);
      touched[pg / per] += 1;
    }
    for (size_t pg : sink.seen) observed[pg / per] += 1;
    // Observed and not reported means not written.
    for (size_t pg : sink.seen)
      if (!sink.pages.count(pg) && written.count(pg)) ++false_reports;
  }
  const uint64_t faults = mon->faults() - faults_before;
  double hot_min = 1, cold_max = 0;
  size_t unobserved = 0;
  for (size_t r = 0; r < kRanges; ++r) {
    if (observed[r] == 0) {
      ++unobserved;
      continue;
    }
    const double share = touched[r] / observed[r];
    if (hot(r))
      hot_min = std::min(hot_min, share);
    else
      cold_max = std::max(cold_max, share);
  }
  WARN("pagemap_scan sampled: 64 x 4 MiB, budget 2 ms per period: "
       << plan.chunks << " chunks of " << plan.chunk_pages << " pages; observed " << worst_seen << ".." << most_seen
       << " pages per period; " << faults << " faults in " << kPeriods
       << " periods; written share estimated: hot ranges >= " << hot_min << ", cold ranges <= " << cold_max
       << " (true 1.0 and 0.02); ranges never observed: " << unobserved);
  CHECK(false_reports == 0);                                // what it reports is exact, for the pages it looked at
  CHECK(most_seen <= plan.chunks * plan.chunk_pages);       // never more pages than the budget buys
  CHECK(worst_seen >= plan.chunks * plan.chunk_pages / 2);  // and not far fewer
  CHECK(faults <= uint64_t(kPeriods) * plan.chunks * plan.chunk_pages);
  CHECK(unobserved == 0);
  CHECK(hot_min >= 0.99);
  CHECK(cold_max <= 0.15);
  for (size_t r = 0; r < kRanges; ++r) mon->unwatch(m.addr() + r * kRange, kRange);
}

TEST_CASE("pagemap_scan: pages armed in an earlier period are never reported in a later one", "[unit][monitor]") {
  PagemapScanOptions o;
  o.chunk_pages = 1;
  std::string why;
  auto mon = make_pagemap_scan_monitor(o, &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  Mapping m("anonymous", 64 * kMiB);
  memset(m.p, 1, m.len);
  REQUIRE(mon->watch(m.addr(), m.len) == 0);
  PageSink sink;
  sink.base = m.addr();
  sink.len = m.len;
  mon->arm(100 * (o.protect_cost_ns + o.fault_cost_ns));  // 100 single pages
  next_period(*mon, sink);                                // nothing written: the first sample stays protected
  REQUIRE(sink.seen.size() == 100);
  const std::set<size_t> first = sink.seen;
  sink.reset();
  // The second period's sample is elsewhere (a random offset): write the first sample's pages.
  for (size_t pg : first) m.p[pg * kPage] = 2;
  mon->collect(sink);
  for (size_t pg : sink.pages) CHECK(sink.seen.count(pg) == 1);
  size_t reported_from_first = 0;
  for (size_t pg : sink.pages) reported_from_first += first.count(pg) && !sink.seen.count(pg);
  CHECK(reported_from_first == 0);
  mon->unwatch(m.addr(), m.len);
  for (size_t pg : first) CHECK(m.p[pg * kPage] == 2);
}

TEST_CASE("pagemap_scan: system calls write watched pages (read(2) from a pipe)", "[unit][monitor]") {
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  for (const char* kind : kKinds) {
    Mapping m(kind, 4 * kMiB);
    memset(m.p, 0, kPage);  // one page present, the target page not yet (both cases)
    REQUIRE(mon->watch(m.addr(), m.len) == 0);
    mon->arm(kAmple);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const char msg[] = "written by the kernel";
    for (size_t page : {size_t(0), size_t(7)}) {
      REQUIRE(write(fds[1], msg, sizeof msg) == ssize_t(sizeof msg));
      ssize_t r = read(fds[0], m.p + page * kPage + 100, sizeof msg);
      INFO(kind << " page " << page << ": read = " << r << " errno " << errno);
      CHECK(r == ssize_t(sizeof msg));
      CHECK(memcmp(m.p + page * kPage + 100, msg, sizeof msg) == 0);
    }
    close(fds[0]);
    close(fds[1]);
    PageSink sink;
    sink.base = m.addr();
    sink.len = m.len;
    next_period(*mon, sink);
    CHECK(sink.pages == std::set<size_t>{0, 7});
    mon->unwatch(m.addr(), m.len);
  }
}

namespace {

// The four ways a system call writes a program's buffer, each into dst (a page): read(2) from
// a pipe, pread(2) from the page cache, recv(2) from a socket, pread(2) with O_DIRECT (the
// kernel pins the page for the device). 0 when all four wrote their bytes; else 1 + the
// first that failed, times 10 when it failed with EFAULT.
int kernel_writes(char* dst, int file, int direct, const char* expect) {
  const size_t page = kPage;
  int fds[2], sv[2];
  if (pipe(fds) != 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 99;
  int result = 0;
  for (int kind = 0; kind < 4 && !result; ++kind) {
    ssize_t r = -1;
    size_t n = 6;
    if (kind == 0) {
      if (write(fds[1], "kernel", 6) == 6) r = read(fds[0], dst, 6);
    } else if (kind == 1) {
      r = pread(file, dst, 6, 0);
    } else if (kind == 2) {
      if (send(sv[0], "kernel", 6, 0) == 6) r = recv(sv[1], dst, 6, 0);
    } else {
      n = page;
      r = pread(direct, dst, page, 0);
    }
    if (r < 0 && errno == EFAULT)
      result = 10 * (kind + 1);
    else if (r != ssize_t(n) || std::memcmp(dst, expect, 6) != 0)
      result = kind + 1;
  }
  close(fds[0]);
  close(fds[1]);
  close(sv[0]);
  close(sv[1]);
  return result;
}

}  // namespace

TEST_CASE("pagemap_scan without privilege (UFFD_USER_MODE_ONLY): system calls still write watched pages",
          "[unit][monitor]") {
  if (geteuid() != 0) {
    WARN("running unprivileged already: the read(2) case above ran with whatever userfaultfd mode applies");
    return;
  }
  int sysctl = -1;
  std::ifstream("/proc/sys/vm/unprivileged_userfaultfd") >> sysctl;
  // A file for pread: page cache and O_DIRECT, on a disk filesystem (tmpfs has no DMA).
  const std::string path = "/tmp/cxlpool-monitor-test-" + std::to_string(getpid());
  {
    std::vector<char> page(kPage, 'x');
    std::memcpy(page.data(), "kernel", 6);
    const int w = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    REQUIRE(w >= 0);
    REQUIRE(write(w, page.data(), kPage) == ssize_t(kPage));
    REQUIRE(fsync(w) == 0);
    close(w);
  }
  pid_t child = fork();
  if (child == 0) {
    alarm(60);
    const int file = open(path.c_str(), O_RDONLY | O_CLOEXEC), direct = open(path.c_str(), O_RDONLY | O_DIRECT);
    if (file < 0 || direct < 0) _exit(9);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
      _exit(10);
    // setuid made the process non-dumpable: its /proc/self would stay root's.
    if (prctl(PR_SET_DUMPABLE, 1) != 0) _exit(10);
    std::string why;
    auto mon = make_monitor("pagemap_scan", &why);
    if (!mon) _exit(11);
    const std::string reason = detect_monitors()[1].availability.reason;
    if (sysctl == 0 && reason.find("UFFD_USER_MODE_ONLY") == std::string::npos) _exit(12);
    for (const char* kind : {"anonymous", "memfd private", "memfd shared"}) {
      const size_t len = 1 * kMiB;
      Mapping m(kind, len);
      memset(m.p, 0, len / 2);
      if (mon->watch(m.addr(), len) != 0) _exit(14);
      mon->arm(kAmple);
      // Async write-protection: the kernel resolves the fault itself, also for its own writes.
      for (size_t page : {size_t(3), size_t(200)})  // present, and not yet present
        if (int r = kernel_writes(m.p + page * kPage, file, direct, "kernel")) _exit(20 + r);
      PageSink sink;
      sink.base = m.addr();
      sink.len = len;
      next_period(*mon, sink);
      if (sink.pages != std::set<size_t>{3, 200}) _exit(19);
      mon->unwatch(m.addr(), len);
      // The control: a synchronous user-mode-only write-protection (what a write fence would
      // be here) turns the same calls into EFAULT.
      if (sysctl == 0) {
        cxlpool::os::uffd::WpAsync u;
        if (cxlpool::os::uffd::open_wp_sync(&u) || !u.user_mode_only) _exit(15);
        if (cxlpool::os::uffd::register_wp(u.fd, m.addr(), len) ||
            cxlpool::os::uffd::write_protect(u.fd, m.addr(), len, true))
          _exit(16);
        for (size_t page : {size_t(4), size_t(201)})
          if (kernel_writes(m.p + page * kPage, file, direct, "kernel") != 10) _exit(17);  // read(2): EFAULT
        close(u.fd);
      }
    }
    _exit(0);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  unlink(path.c_str());
  INFO("child (uid 65534, vm.unprivileged_userfaultfd=" << sysctl << ") exit status " << status
                                                        << " (10 setuid, 11 no monitor, 12 mode not reported, "
                                                           "21-24 read/pread/recv/O_DIRECT lost bytes, 30-60 one "
                                                           "failed with EFAULT, 19 wrong pages, 17 the sync "
                                                           "control did not fail)");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("pagemap_scan: reservations with PROT_NONE parts, and THP", "[unit][monitor]") {
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  // A reservation: PROT_NONE, its first half committed (read-write), its last quarter
  // committed then decommitted as the device layer does (DONTNEED, then PROT_NONE).
  const size_t len = 16 * kMiB;
  char* p = static_cast<char*>(mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  REQUIRE(p != MAP_FAILED);
  REQUIRE(mprotect(p, len / 2, PROT_READ | PROT_WRITE) == 0);
  REQUIRE(mprotect(p + 3 * len / 4, len / 4, PROT_READ | PROT_WRITE) == 0);
  memset(p + 3 * len / 4, 5, len / 4);
  REQUIRE(madvise(p + 3 * len / 4, len / 4, MADV_DONTNEED) == 0);
  REQUIRE(mprotect(p + 3 * len / 4, len / 4, PROT_NONE) == 0);
  const std::string before = protections(p, len);
  REQUIRE(mon->watch(reinterpret_cast<uintptr_t>(p), len) == 0);
  mon->arm(kAmple);
  CHECK(protections(p, len) == before);
  p[0] = 1;
  p[len / 2 - 1] = 1;
  // Commit a page of the PROT_NONE part while watched and write it.
  REQUIRE(mprotect(p + len / 2, kPage, PROT_READ | PROT_WRITE) == 0);
  p[len / 2] = 1;
  PageSink sink;
  sink.base = reinterpret_cast<uintptr_t>(p);
  sink.len = len;
  next_period(*mon, sink);
  CHECK(sink.pages == std::set<size_t>{0, len / 2 / kPage - 1, len / 2 / kPage});
  mon->unwatch(reinterpret_cast<uintptr_t>(p), len);
  munmap(p, len);

  // THP: a 2 MiB-aligned huge page is split at the first write after a protection.
  const size_t tlen = 8 * kMiB;
  char* raw =
      static_cast<char*>(mmap(nullptr, tlen + 2 * kMiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(raw != MAP_FAILED);
  char* t = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 2 * kMiB - 1) & ~(2 * kMiB - 1));
  madvise(t, tlen, MADV_HUGEPAGE);
  memset(t, 1, tlen);
  REQUIRE(mon->watch(reinterpret_cast<uintptr_t>(t), tlen) == 0);
  mon->arm(kAmple);
  for (size_t i = 0; i < tlen; i += 2 * kMiB) t[i + 3 * kPage] = 2;  // one 4 KiB page per 2 MiB
  sink.reset();
  sink.base = reinterpret_cast<uintptr_t>(t);
  sink.len = tlen;
  next_period(*mon, sink);
  std::set<size_t> want;
  for (size_t i = 0; i < tlen; i += 2 * kMiB) want.insert(i / kPage + 3);
  CHECK(sink.pages == want);  // 4 KiB resolution, whatever THP did
  mon->unwatch(reinterpret_cast<uintptr_t>(t), tlen);
  munmap(raw, tlen + 2 * kMiB);
}

TEST_CASE("pagemap_scan: a mapping replaced by mremap is re-armed, unwatched memory is left as it was",
          "[unit][monitor]") {
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  Mapping a("anonymous", 8 * kMiB), b("memfd private", 8 * kMiB);
  memset(a.p, 1, a.len);
  memset(b.p, 2, b.len);
  REQUIRE(mon->watch(a.addr(), a.len) == 0);
  mon->arm(kAmple);
  REQUIRE(mon->watch(b.addr(), b.len) == 0);
  mon->arm(kAmple);
  // Replace a's mapping as rebind does: a staged copy mremap'd over it.
  auto replace = [&] {
    void* staged = mmap(nullptr, a.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(staged != MAP_FAILED);
    memcpy(staged, a.p, a.len);
    REQUIRE(mremap(staged, a.len, a.len, MREMAP_MAYMOVE | MREMAP_FIXED, a.p) == a.p);
  };
  replace();
  PageSink sa, sb;
  sa.base = a.addr();
  sa.len = a.len;
  sb.base = b.addr();
  sb.len = b.len;
  struct Both final : HeatSink {
    PageSink *x, *y;
    void touched(uintptr_t ad, size_t n, AccessKind k, uint32_t w) noexcept override {
      (ad >= x->base && ad < x->base + x->len ? x : y)->touched(ad, n, k, w);
    }
  } both;
  both.x = &sa;
  both.y = &sb;
  // Not watched again: the other range still reports exactly; the replaced one is never
  // registered again by the monitor itself (the memory there may not be ours any more): it
  // reports nothing until its owner calls watch() again, and stays writable.
  b.p[5 * kPage] = 9;
  a.p[3 * kPage] = 9;
  next_period(*mon, both);
  CHECK(sb.pages == std::set<size_t>{5});
  CHECK(sa.pages.empty());
  sa.reset();
  sb.reset();
  a.p[4 * kPage] = 9;
  next_period(*mon, both);
  CHECK(sa.pages.empty());
  CHECK(sb.pages.empty());
  CHECK(a.p[4 * kPage] == 9);
  // Replaced again and watched again (what the engine does after a move): exact at once.
  replace();
  REQUIRE(mon->watch(a.addr(), a.len) == 0);
  mon->arm(kAmple);
  a.p[6 * kPage] = 9;
  sa.reset();
  next_period(*mon, both);
  CHECK(sa.pages == std::set<size_t>{6});
  // An unmapped range does not make collect fail for the others.
  Mapping c("anonymous", 4 * kMiB);
  REQUIRE(mon->watch(c.addr(), c.len) == 0);
  mon->arm(kAmple);
  REQUIRE(munmap(c.p, c.len) == 0);
  REQUIRE(mmap(c.p, c.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == c.p);
  munmap(c.p, c.len);  // a hole now
  b.p[7 * kPage] = 9;
  sb.reset();
  next_period(*mon, both);
  CHECK(sb.pages == std::set<size_t>{7});
  mon->unwatch(c.addr(), c.len);
  c.p = static_cast<char*>(mmap(c.p, c.len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));  // for ~Mapping
  // Unwatched: contents and protections exactly as they were, writes are plain writes.
  const std::string prot_a = protections(a.p, a.len);
  mon->unwatch(a.addr(), a.len);
  mon->unwatch(b.addr(), b.len);
  CHECK(protections(a.p, a.len) == prot_a);
  for (size_t i = 0; i < a.len; ++i) {
    const char want = (i == 3 * kPage || i == 4 * kPage || i == 6 * kPage) ? 9 : 1;
    if (a.p[i] != want) FAIL("a[" << i << "] = " << int(a.p[i]));
  }
  for (size_t i = 0; i < b.len; ++i) {
    const char want = (i == 5 * kPage || i == 7 * kPage) ? 9 : 2;
    if (b.p[i] != want) FAIL("b[" << i << "] = " << int(b.p[i]));
  }
  memset(a.p, 3, a.len);
  memset(b.p, 3, b.len);
}

TEST_CASE("sample: finds a synthetic hot set (reads and writes)", "[unit][monitor]") {
  SampleOptions o;
  o.fault_cost_ns = 1;  // no time cap here: max_pages armed per collect
  o.max_pages = 2048;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  CHECK(mon->sees() == AccessKind::kAny);
  for (const char* kind : kKinds) {
    Mapping m(kind, 64 * kMiB);
    const size_t pages = m.len / kPage;
    memset(m.p, 1, m.len);
    REQUIRE(mon->watch(m.addr(), m.len) == 0);
    PageSink sink;
    sink.base = m.addr();
    sink.len = m.len;
    auto hot = hot_set(pages, 0.10, 42);
    next_period(*mon, sink);  // arms the first sample
    std::set<size_t> seen;
    double worst_p = 1;
    const unsigned kIntervals = 10;
    volatile char sum = 0;
    for (unsigned interval = 0; interval < kIntervals; ++interval) {
      for (size_t i = 0; i < hot.size(); ++i) {
        char* q = m.p + hot[i] * kPage + 8;
        if (i & 1)
          *q = char(interval);  // writes
        else
          sum = char(sum + *q);  // reads
      }
      sink.reset();
      next_period(*mon, sink);
      worst_p = std::min(worst_p, score(sink.pages, hot).precision);
      CHECK(sink.outside == 0);
      seen.insert(sink.pages.begin(), sink.pages.end());
    }
    const double f = double(o.max_pages) / double(pages);
    const double expected = 1.0 - std::pow(1.0 - f, kIntervals);
    const Score s = score(seen, hot);
    WARN("sample, " << kind << ", 64 MiB, hot set 10%, " << o.max_pages << " pages armed per interval, " << kIntervals
                    << " intervals: precision " << worst_p << " (worst interval), recall " << s.recall
                    << " (union; expected " << expected << " from the sample size)");
    CHECK(worst_p == 1.0);
    CHECK(s.recall >= 0.8 * expected);
    mon->unwatch(m.addr(), m.len);
    CHECK(protections(m.p, m.len) == std::string(pages, 'w'));
  }
  CHECK(mon->faults() > 0);
}

TEST_CASE("sample: threads touching armed pages while collect ends and starts periods", "[unit][monitor]") {
  SampleOptions o;
  o.fault_cost_ns = 1;
  o.max_pages = 1024;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  Mapping m("anonymous", 16 * kMiB);
  memset(m.p, 1, m.len);
  const size_t pages = m.len / kPage;
  auto hot = hot_set(pages, 0.25, 3);
  REQUIRE(mon->watch(m.addr(), m.len) == 0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> touches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (size_t i = size_t(t); i < hot.size(); i += 2) {
          *reinterpret_cast<volatile char*>(m.p + hot[i] * kPage + 64 * t) = char(n);
          ++n;
        }
      }
      touches.fetch_add(n);
    });
  PageSink sink;
  sink.base = m.addr();
  sink.len = m.len;
  std::set<size_t> seen;
  double worst_p = 1;
  for (int interval = 0; interval < 50; ++interval) {
    sink.reset();
    next_period(*mon, sink);
    worst_p = std::min(worst_p, score(sink.pages, hot).precision);
    seen.insert(sink.pages.begin(), sink.pages.end());
    usleep(2000);
  }
  stop = true;
  for (auto& t : threads) t.join();
  mon->unwatch(m.addr(), m.len);
  const Score s = score(seen, hot);
  WARN("sample under 2 writer threads, 16 MiB, hot set 25%, 50 collects 2 ms apart: precision "
       << worst_p << ", recall " << s.recall << ", faults " << mon->faults());
  CHECK(worst_p == 1.0);
  CHECK(s.recall > 0.5);
  CHECK(protections(m.p, m.len) == std::string(pages, 'w'));
}

TEST_CASE("sample: never changes a PROT_NONE or decommitted page, and takes the owner's lock", "[unit][monitor]") {
  SampleOptions o;
  o.fault_cost_ns = 1;
  o.max_pages = 4096;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  struct Owner {
    std::mutex mu;
    int locks = 0, unlocks = 0;
    bool held = false;
  } owner;
  RangeLock rl;
  rl.ctx = &owner;
  rl.run_locked = [](void* c, uintptr_t, size_t, void (*fn)(void*) noexcept, void* arg) noexcept {
    auto* o2 = static_cast<Owner*>(c);
    std::lock_guard<std::mutex> g(o2->mu);
    o2->held = true;
    ++o2->locks;
    fn(arg);
    o2->held = false;
    ++o2->unlocks;
    return true;
  };
  mon->set_range_lock(rl);
  // A reservation of 1,024 pages: the first half committed and touched, the second PROT_NONE.
  const size_t len = 4 * kMiB, pages = len / kPage;
  char* p = static_cast<char*>(mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  REQUIRE(p != MAP_FAILED);
  REQUIRE(mprotect(p, len / 2, PROT_READ | PROT_WRITE) == 0);
  memset(p, 1, len / 2);
  REQUIRE(mon->watch(reinterpret_cast<uintptr_t>(p), len) == 0);
  PageSink sink;
  next_period(*mon, sink);  // arms up to every present read-write page: the first half
  CHECK(owner.locks > 0);
  CHECK(owner.locks == owner.unlocks);
  const std::string armed = protections(p, len);
  CHECK(armed.substr(pages / 2) == std::string(pages / 2, '-'));
  const size_t n_armed = size_t(std::count(armed.begin(), armed.end(), '-')) - pages / 2;
  CHECK(n_armed == pages / 2);  // max_pages >= the present pages: all of them
  // The owner decommits the second quarter under its lock, as the device layer does (and
  // tells the trap table it took those pages back).
  {
    std::lock_guard<std::mutex> g(owner.mu);
    REQUIRE(madvise(p + len / 4, len / 4, MADV_DONTNEED) == 0);
    REQUIRE(mprotect(p + len / 4, len / 4, PROT_NONE) == 0);
    cxlpool::os::sample_trap::forget(reinterpret_cast<uintptr_t>(p + len / 4),
                                     reinterpret_cast<uintptr_t>(p + len / 2));
  }
  p[0] = 7;  // a first touch
  sink.reset();
  sink.base = reinterpret_cast<uintptr_t>(p);
  sink.len = len;
  mon->unwatch(reinterpret_cast<uintptr_t>(p), len);
  const std::string after = protections(p, len);
  CHECK(after.substr(0, pages / 4) == std::string(pages / 4, 'w'));       // restored
  CHECK(after.substr(pages / 4) == std::string(pages - pages / 4, '-'));  // decommitted and reserved: untouched
  CHECK(p[0] == 7);
  CHECK(p[kPage] == 1);
  munmap(p, len);
}

TEST_CASE("sample: foreign faults reach the program's handler, read-only pages are never armed", "[unit][monitor]") {
  struct sigaction ours {
  }, saved{};
  ours.sa_handler = program_handler;
  sigemptyset(&ours.sa_mask);
  REQUIRE(sigaction(SIGSEGV, &ours, &saved) == 0);
  SampleOptions o;
  o.fault_cost_ns = 1;
  o.max_pages = 4096;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  Mapping m("anonymous", 4 * kMiB);
  memset(m.p, 1, m.len);
  // The first half read-only (the program's snapshot, say).
  REQUIRE(mprotect(m.p, m.len / 2, PROT_READ) == 0);
  REQUIRE(mon->watch(m.addr(), m.len) == 0);
  PageSink sink;
  next_period(*mon, sink);  // arms: the handler is ours now, in front of the program's
  // Read-only pages are not read-write: never candidates, never armed.
  const size_t pages = m.len / kPage;
  std::string prot = protections(m.p, m.len);
  CHECK(prot.substr(pages / 2) == std::string(pages / 2, '-'));  // every writable page armed
  volatile char sum = 0;
  for (size_t i = 0; i < m.len / 2; i += kPage) sum = char(sum + m.p[i]);  // they stay readable
  // A foreign fault goes to the program's handler.
  void* guard = mmap(nullptr, kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(guard != MAP_FAILED);
  g_program_handler_ran = 0;
  if (sigsetjmp(g_jump, 1) == 0) *static_cast<volatile char*>(guard) = 1;
  CHECK(g_program_handler_ran == 1);
  // Sampled pages still work with the program's handler behind ours.
  m.p[m.len / 2 + 5 * kPage] = 3;
  CHECK(g_program_handler_ran == 1);
  sink.reset();
  sink.base = m.addr();
  sink.len = m.len;
  next_period(*mon, sink);
  CHECK(sink.pages.count(pages / 2 + 5) == 1);
  REQUIRE(mprotect(m.p, m.len / 2, PROT_READ | PROT_WRITE) == 0);
  mon->unwatch(m.addr(), m.len);
  CHECK(protections(m.p, m.len) == std::string(pages, 'w'));
  munmap(guard, kPage);
  REQUIRE(sigaction(SIGSEGV, &saved, nullptr) == 0);
}

TEST_CASE("fork without exec while monitors are active: the child writes everything", "[unit][monitor]") {
  std::string why;
  auto scan = make_monitor("pagemap_scan", &why);
  SampleOptions o;
  o.fault_cost_ns = 1;
  std::unique_ptr<Monitor> sample = make_sample_monitor(o, &why);
  REQUIRE(sample != nullptr);
  if (!scan && !sample) CXLPOOL_SKIP("no monitor to fork under: " + why);
  std::vector<std::unique_ptr<Mapping>> maps;
  for (const char* kind : kKinds) {
    maps.push_back(std::make_unique<Mapping>(kind, 8 * kMiB));
    memset(maps.back()->p, 1, maps.back()->len);
    if (scan) REQUIRE(scan->watch(maps.back()->addr(), maps.back()->len) == 0);
    if (sample) REQUIRE(sample->watch(maps.back()->addr(), maps.back()->len) == 0);
  }
  PageSink sink;
  if (scan) next_period(*scan, sink);
  if (sample) next_period(*sample, sink);  // pages armed at fork time
  pid_t child = fork();
  if (child == 0) {
    alarm(30);
    for (auto& m : maps) {
      for (size_t i = 0; i < m->len; i += 512) m->p[i] = char(m->p[i] + 1);
      int fds[2];
      if (pipe(fds) != 0) _exit(3);
      if (write(fds[1], "x", 1) != 1 || read(fds[0], m->p + 3 * kPage, 1) != 1) _exit(4);
    }
    for (auto& m : maps)
      for (size_t i = 0; i < m->len; i += 512)
        if (i != 3 * kPage && m->p[i] != 2) _exit(5);
    _exit(0);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child status " << status);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent's monitors go on: shared memory shows the child's writes, private does not.
  if (scan) {
    sink.reset();
    sink.base = maps[0]->addr();
    sink.len = maps[0]->len;
    maps[0]->p[kPage] = 5;
    next_period(*scan, sink);
    CHECK(sink.pages.count(1) == 1);
  }
  for (auto& m : maps) {
    if (scan) scan->unwatch(m->addr(), m->len);
    if (sample) sample->unwatch(m->addr(), m->len);
  }
  CHECK(maps[2]->p[0] == 2);  // memfd shared: the child's write
  CHECK(maps[1]->p[512] == 1);
}

TEST_CASE("pagemap_scan: descriptors the program closes and reuses are never used again", "[unit][monitor]") {
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) CXLPOOL_SKIP("pagemap_scan unavailable: " + why);
  Mapping a("anonymous", 4 * kMiB);
  memset(a.p, 1, a.len);
  REQUIRE(mon->watch(a.addr(), a.len) == 0);
  mon->arm(kAmple);
  // Close every descriptor that is the monitor's (what a daemon's closefrom() does), then
  // take the numbers back for files of the program's own.
  std::vector<int> reused;
  for (int fd = 3; fd < 65536; ++fd) {
    char link[64], target[256] = {};
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) continue;
    if (std::strstr(target, "userfaultfd") || std::strstr(target, "pagemap")) {
      close(fd);
      int mine = open("/dev/null", O_RDWR);
      if (mine >= 0 && mine != fd) {
        REQUIRE(dup2(mine, fd) == fd);
        close(mine);
      }
      reused.push_back(fd);
    }
  }
  REQUIRE(reused.size() == 2);
  a.p[7 * kPage] = 3;
  PageSink sink;
  sink.base = a.addr();
  sink.len = a.len;
  next_period(*mon, sink);  // no ioctl on /dev/null: nothing reported, nothing fails
  CHECK(sink.pages.empty());
  CHECK(mon->watch(a.addr(), a.len) == EBADF);
  mon.reset();  // and the program's descriptors are not closed by us
  for (int fd : reused) CHECK(fcntl(fd, F_GETFD) >= 0);
  for (int fd : reused) close(fd);
  CHECK(a.p[7 * kPage] == 3);
}

TEST_CASE("sample: a range its owner says is gone is forgotten, its memory untouched", "[unit][monitor]") {
  SampleOptions o;
  o.max_pages = 4096;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  struct Owner {
    bool gone = false;
    int calls = 0;
  } owner;
  RangeLock rl;
  rl.ctx = &owner;
  rl.run_locked = [](void* c, uintptr_t, size_t, void (*fn)(void*) noexcept, void* arg) noexcept {
    auto* o2 = static_cast<Owner*>(c);
    ++o2->calls;
    if (o2->gone) return false;
    fn(arg);
    return true;
  };
  mon->set_range_lock(rl);
  Mapping m("anonymous", 4 * kMiB);
  memset(m.p, 1, m.len);
  REQUIRE(mon->watch(m.addr(), m.len) == 0);
  mon->arm(kAmple);
  const std::string armed = protections(m.p, m.len);
  const size_t n_armed = size_t(std::count(armed.begin(), armed.end(), '-'));
  REQUIRE(n_armed > 0);
  // The owner released the range (and the address may be someone else's now): the period
  // ends without a single protection change, and the range is not armed again.
  owner.gone = true;
  PageSink sink;
  sink.base = m.addr();
  sink.len = m.len;
  mon->collect(sink);
  CHECK(sink.seen.empty());
  CHECK(protections(m.p, m.len) == armed);
  owner.gone = false;
  const int calls = owner.calls;
  mon->arm(kAmple);
  CHECK(owner.calls == calls);  // forgotten: never asked for again
  CHECK(protections(m.p, m.len) == armed);
  REQUIRE(mprotect(m.p, m.len, PROT_READ | PROT_WRITE) == 0);  // the test's own clean-up
}

TEST_CASE(
    "sample: what the program does to armed pages itself is kept (mprotect, DONTNEED), and fork children "
    "start clean",
    "[unit][monitor]") {
  SampleOptions o;
  o.max_pages = 4096;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  REQUIRE(mon != nullptr);
  Mapping m("anonymous", 8 * kMiB);
  memset(m.p, 1, m.len);
  const size_t pages = m.len / kPage;
  REQUIRE(mon->watch(m.addr(), m.len) == 0);
  mon->arm(kAmple);
  const std::string armed = protections(m.p, m.len);
  REQUIRE(std::count(armed.begin(), armed.end(), '-') > 1000);
  // The program makes the first quarter read-only and drops the second quarter's pages.
  REQUIRE(mprotect(m.p, m.len / 4, PROT_READ) == 0);
  REQUIRE(madvise(m.p + m.len / 4, m.len / 4, MADV_DONTNEED) == 0);
  // A fork child: the pages the parent armed are accessible in it at once, and it may make a
  // monitor of its own.
  pid_t child = fork();
  if (child == 0) {
    alarm(20);
    sample_after_fork_child();  // what lib/lifecycle's fork child handler calls (through tiering)
    if (protections(m.p + m.len / 2, m.len / 2) != std::string(pages / 2, 'w')) _exit(4);
    for (size_t i = m.len / 2; i < m.len; i += kPage) m.p[i] = 2;
    std::string w;
    auto own = make_sample_monitor(o, &w);
    _exit(own ? 0 : 3);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  PageSink sink;
  mon->collect(sink);
  const std::string after = protections(m.p, m.len);
  // Read-only stays read-only ('-' here: not read-write); the dropped and the untouched rest
  // are read-write again.
  size_t writable_in_first = 0;
  for (size_t i = 0; i < pages / 4; ++i) writable_in_first += after[i] == 'w';
  CHECK(writable_in_first == 0);
  CHECK(after.substr(pages / 4) == std::string(pages - pages / 4, 'w'));
  for (size_t i = m.len / 4; i < m.len / 2; i += kPage) CHECK(m.p[i] == 0);  // dropped: zero pages, readable
  mon->unwatch(m.addr(), m.len);
  REQUIRE(mprotect(m.p, m.len / 4, PROT_READ | PROT_WRITE) == 0);
}

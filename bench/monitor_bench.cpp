// SPDX-License-Identifier: MIT
// Hotness monitors' costs, each with its peer in the same run: pagemap_scan's collect over
// 1 GiB watched with few and with all pages written; the program's first write per page per
// interval to watched memory against the same writes to unwatched memory; sample's first
// touch of an armed page against touching an unarmed one; and what watching does to THPs
// (AnonHugePages before and after one interval, random reads before and after); and what
// arming costs a program running beside it (pagemap_scan's cost model). Refuses a non-Release
// build.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "os/uffd.hpp"
#include "tiering/monitor.hpp"
#include "tiering/monitor_sample.hpp"

namespace {

using namespace cxlpool::detail::tiering;
constexpr size_t kMiB = size_t(1) << 20, kGiB = size_t(1) << 30;
const size_t kPage = size_t(sysconf(_SC_PAGESIZE));
constexpr uint64_t kAmple = uint64_t(1) << 60;  // a budget that arms everything (exact)

struct CountSink final : HeatSink {
  size_t pages = 0;
  void touched(uintptr_t, size_t len, AccessKind, uint32_t) noexcept override { pages += len / kPage; }
};

char* map_anon(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return static_cast<char*>(p);
}

// One exact period of pagemap_scan over 1 GiB watched and fully populated (arm: every page
// write-protected; collect: the written ones found), range(0) random pages written between.
void BM_PagemapScanCollect1GiB(benchmark::State& state) {
  const size_t writes = size_t(state.range(0));
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) return state.SkipWithError(why.c_str());
  char* p = map_anon(kGiB);
  memset(p, 1, kGiB);
  mon->watch(reinterpret_cast<uintptr_t>(p), kGiB);
  mon->arm(kAmple);
  std::mt19937_64 rng(1);
  CountSink sink;
  for (auto _ : state) {
    state.PauseTiming();
    if (writes >= kGiB / kPage)
      for (size_t i = 0; i < kGiB; i += kPage) p[i] = 2;
    else
      for (size_t i = 0; i < writes; ++i) p[(rng() % (kGiB / kPage)) * kPage] = 2;
    state.ResumeTiming();
    mon->collect(sink);
    mon->arm(kAmple);
  }
  state.counters["pages_reported_per_collect"] = double(sink.pages) / double(state.iterations());
  mon->unwatch(reinterpret_cast<uintptr_t>(p), kGiB);
  munmap(p, kGiB);
}
BENCHMARK(BM_PagemapScanCollect1GiB)->Arg(0)->Arg(256)->Arg(int64_t(kGiB / 4096))->Unit(benchmark::kMillisecond);

// The program's first write to each page of 64 MiB in an interval: watched (each write takes
// the async write-protect fault) and, the peer, unwatched. Per-page time in s_per_page.
void BM_FirstWritePerPage(benchmark::State& state) {
  const bool watched = state.range(0) != 0;
  const size_t len = 64 * kMiB;
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) return state.SkipWithError(why.c_str());
  char* p = map_anon(len);
  memset(p, 1, len);
  if (watched) mon->watch(reinterpret_cast<uintptr_t>(p), len);
  CountSink sink;
  for (auto _ : state) {
    state.PauseTiming();
    if (watched) {  // protect again: the next writes are first writes
      mon->collect(sink);
      mon->arm(kAmple);
    }
    state.ResumeTiming();
    for (size_t i = 0; i < len; i += kPage) p[i] = char(p[i] + 1);
    benchmark::ClobberMemory();
  }
  state.counters["s_per_page"] = benchmark::Counter(double(state.iterations() * (len / kPage)),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (watched) mon->unwatch(reinterpret_cast<uintptr_t>(p), len);
  munmap(p, len);
}
BENCHMARK(BM_FirstWritePerPage)->Arg(0)->Arg(1)->ArgName("watched")->Unit(benchmark::kMillisecond);

// sample: every page of 16 MiB armed (4,096 pages), then each touched once (a read), against
// the same reads of unarmed pages. Per-touch time in s_per_page.
void BM_SampleFirstTouch(benchmark::State& state) {
  const bool armed = state.range(0) != 0;
  const size_t len = 16 * kMiB;
  SampleOptions o;
  o.fault_cost_ns = 1;
  o.max_pages = len / kPage;
  std::string why;
  auto mon = make_sample_monitor(o, &why);
  if (!mon) return state.SkipWithError(why.c_str());
  char* p = map_anon(len);
  memset(p, 1, len);
  if (armed) mon->watch(reinterpret_cast<uintptr_t>(p), len);
  CountSink sink;
  long sum = 0;
  for (auto _ : state) {
    state.PauseTiming();
    mon->collect(sink);  // reports the last touches
    mon->arm(kAmple);    // arms every page again
    state.ResumeTiming();
    for (size_t i = 0; i < len; i += kPage) sum += static_cast<volatile char*>(p)[i];
  }
  benchmark::DoNotOptimize(sum);
  state.counters["s_per_page"] = benchmark::Counter(double(state.iterations() * (len / kPage)),
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["faults"] = double(mon->faults());
  if (armed) mon->unwatch(reinterpret_cast<uintptr_t>(p), len);
  munmap(p, len);
}
BENCHMARK(BM_SampleFirstTouch)->Arg(0)->Arg(1)->ArgName("armed")->Unit(benchmark::kMillisecond);

size_t anon_huge_kib() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string key;
  size_t v = 0;
  while (in >> key) {
    if (key == "AnonHugePages:") {
      in >> v;
      return v;
    }
  }
  return 0;
}

// THP: 256 MiB advised MADV_HUGEPAGE, populated; watched; one byte per 2 MiB written; one
// collect. Random 8-byte reads timed before watching (huge pages) and after (split).
void BM_PagemapScanThpSplit(benchmark::State& state) {
  const size_t len = 256 * kMiB;
  std::string why;
  auto mon = make_monitor("pagemap_scan", &why);
  if (!mon) return state.SkipWithError(why.c_str());
  char* raw = map_anon(len + 2 * kMiB);
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 2 * kMiB - 1) & ~(2 * kMiB - 1));
  madvise(p, len, MADV_HUGEPAGE);
  const size_t base = anon_huge_kib();
  memset(p, 1, len);
  const size_t before = anon_huge_kib() - base;
  auto reads = [&] {
    std::mt19937_64 rng(7);
    long sum = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4000000; ++i) sum += static_cast<volatile char*>(p)[(rng() % (len / 8)) * 8];
    benchmark::DoNotOptimize(sum);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / 4e6;
  };
  const double ns_before = reads();
  mon->watch(reinterpret_cast<uintptr_t>(p), len);
  mon->arm(kAmple);
  CountSink sink;
  for (auto _ : state) {
    for (size_t i = 0; i < len; i += 2 * kMiB) p[i] = 2;
    mon->collect(sink);
    mon->arm(kAmple);
  }
  const size_t after = anon_huge_kib() - base;
  const double ns_after = reads();
  state.counters["thp_mib_before"] = double(before) / 1024;
  state.counters["thp_mib_after"] = double(after) / 1024;
  state.counters["rand_read_ns_before"] = ns_before;
  state.counters["rand_read_ns_after"] = ns_after;
  mon->unwatch(reinterpret_cast<uintptr_t>(p), len);
  munmap(raw, len + 2 * kMiB);
}
BENCHMARK(BM_PagemapScanThpSplit)->Iterations(1)->Unit(benchmark::kMillisecond);

// What arming costs a program, the figures behind pagemap_scan's cost model
// (PagemapScanOptions): a random 8-byte-update loop over 1 GiB runs on one thread for 1.5 s
// while this thread, every 10 ms, (a) does nothing (the peer), (b) write-protects 500 single
// pages of *another* 64 MiB range it has just written (each call changes a PTE: a TLB flush of
// the loop's CPU, but no fault for the loop), (c) write-protects 100 chunks of 8 pages of the
// loop's own memory (the loop then also takes the faults). Counters: the loop's time lost per
// protection call (b) and per fault (c, after taking off its calls at (b)'s cost).
void BM_ArmingCost(benchmark::State& state) {
  namespace uffd = cxlpool::os::uffd;
  uffd::WpAsync u;
  int pagemap = -1;
  if (uffd::open_wp_async(&u) || uffd::open_pagemap(&pagemap)) return state.SkipWithError("no async userfaultfd");
  char* loop_mem = map_anon(kGiB);
  char* other = map_anon(64 * kMiB);
  memset(loop_mem, 1, kGiB);
  memset(other, 1, 64 * kMiB);
  uffd::register_wp(u.fd, reinterpret_cast<uintptr_t>(loop_mem), kGiB);
  uffd::register_wp(u.fd, reinterpret_cast<uintptr_t>(other), 64 * kMiB);
  // Runs the loop for `seconds` while every 10 ms `act` runs here; the loop's updates per s.
  auto run = [&](auto&& act) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> done{0};
    std::thread loop([&] {
      uint64_t x = 88172645463325252ull, n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 4096; ++k) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          auto* q = reinterpret_cast<volatile uint64_t*>(loop_mem + (x % (kGiB / 8)) * 8);
          *q = *q + 1;
        }
        n += 4096;
      }
      done = n;
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      act();
    }
    stop = true;
    loop.join();
    return double(done.load()) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::mt19937_64 rng(3);
  uint64_t calls_b = 0, calls_c = 0, faults_c = 0;
  double idle = 0, ipi = 0, own = 0;
  std::vector<uintptr_t> armed;
  for (auto _ : state) {
    idle = run([] {});
    ipi = run([&] {
      for (int i = 0; i < 500; ++i) {
        const size_t pg = rng() % (64 * kMiB / kPage);
        other[pg * kPage] = 2;  // writable again (our own write takes the fault)
        uffd::write_protect(u.fd, reinterpret_cast<uintptr_t>(other + pg * kPage), kPage, true);
        ++calls_b;
      }
    });
    own = run([&] {
      for (uintptr_t a : armed) {  // what the loop wrote of the last chunks: faults it took
        uffd::PageRun runs[8];
        size_t n = 0;
        uintptr_t end = 0;
        uffd::ScanRequest req;
        req.start = a;
        req.end = a + 8 * kPage;
        req.category_mask = uffd::kPageWritten;
        if (uffd::pagemap_scan(pagemap, req, runs, 8, &n, &end) == 0)
          for (size_t i = 0; i < n; ++i) faults_c += (runs[i].end - runs[i].start) / kPage;
      }
      armed.clear();
      for (int i = 0; i < 100; ++i) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(loop_mem) + (rng() % (kGiB / kPage / 8)) * 8 * kPage;
        uffd::write_protect(u.fd, a, 8 * kPage, true);
        armed.push_back(a);
        ++calls_c;
      }
    });
  }
  const double secs = 1.5 * double(state.iterations());
  const double per_call_ns = (1 - ipi / idle) * 1e9 * secs / double(calls_b);
  const double lost_c_ns = (1 - own / idle) * 1e9 * secs;
  state.counters["loop_updates_per_s"] = idle;
  state.counters["ns_lost_per_protect_call"] = per_call_ns;
  state.counters["ns_lost_per_fault"] = faults_c ? (lost_c_ns - double(calls_c) * per_call_ns) / double(faults_c) : 0.0;
  state.counters["faults"] = double(faults_c);
  uffd::unregister(u.fd, reinterpret_cast<uintptr_t>(loop_mem), kGiB);
  uffd::unregister(u.fd, reinterpret_cast<uintptr_t>(other), 64 * kMiB);
  munmap(loop_mem, kGiB);
  munmap(other, 64 * kMiB);
  close(u.fd);
  close(pagemap);
}
BENCHMARK(BM_ArmingCost)->Iterations(2)->Unit(benchmark::kSecond);

}  // namespace

int main(int argc, char** argv) {
  if (std::string(CXLPOOL_BENCH_BUILD_TYPE) != "Release") {
    std::fprintf(stderr, "monitor_bench: built as %s; benchmarks need CMAKE_BUILD_TYPE=Release\n",
                 CXLPOOL_BENCH_BUILD_TYPE);
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

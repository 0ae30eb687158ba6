// SPDX-License-Identifier: MIT
// Backing throughput: commit + touch + decommit of one chunk through cxlpool backings,
// against the same work done with plain mmap/munmap and with madvise(DONTNEED) in the same
// run, so cxlpool's bookkeeping overhead shows as a ratio to the raw system calls.
// Run: build/release/bench/backing_bench  (Release builds only)
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "cxlpool/cxlpool.hpp"

namespace {

constexpr size_t kPage = 4096;

cxlpool::Topology& topology() {
  static cxlpool::Topology topo = [] {
    cxlpool::Config c;
    c.devices("ddr:backing=numa:0;cxl:backing=shm,size=1G").flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC);
    return cxlpool::Topology::discover(&c);
  }();
  return topo;
}

void touch(void* p, size_t n) {
  for (size_t off = 0; off < n; off += kPage) static_cast<volatile char*>(p)[off] = 1;
}

void BM_cxlpool_commit_touch_decommit(benchmark::State& state, const char* device) {
  const size_t bytes = size_t(state.range(0));
  auto backing = cxlpool::Backing::open(topology(), *topology().find(device));
  auto r = backing.reserve(bytes);
  for (auto _ : state) {
    r.commit();
    touch(r.data(), bytes);
    r.decommit();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}

void BM_peer_mmap_touch_munmap(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  for (auto _ : state) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    touch(p, bytes);
    munmap(p, bytes);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}

void BM_peer_touch_madvise_dontneed(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (auto _ : state) {
    touch(p, bytes);
    madvise(p, bytes, MADV_DONTNEED);
  }
  munmap(p, bytes);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}

BENCHMARK_CAPTURE(BM_cxlpool_commit_touch_decommit, near_numa0, "ddr")->Arg(64 << 10)->Arg(2 << 20);
BENCHMARK_CAPTURE(BM_cxlpool_commit_touch_decommit, far_memfd, "cxl")->Arg(64 << 10)->Arg(2 << 20);
BENCHMARK(BM_peer_mmap_touch_munmap)->Arg(64 << 10)->Arg(2 << 20);
BENCHMARK(BM_peer_touch_madvise_dontneed)->Arg(64 << 10)->Arg(2 << 20);

// Console output plus a ratio table: each cxlpool row against each peer of the same size.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (auto& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred) times_[r.benchmark_name()] = r.GetAdjustedRealTime();
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\nratio of cxlpool time to peer time (lower is better):\n");
    for (auto& [name, t] : times_) {
      if (name.rfind("BM_cxlpool", 0) != 0) continue;
      std::string size = name.substr(name.rfind('/'));
      for (const char* peer : {"BM_peer_mmap_touch_munmap", "BM_peer_touch_madvise_dontneed"}) {
        auto it = times_.find(std::string(peer) + size);
        if (it != times_.end()) std::printf("  %-52s vs %-34s %.2fx\n", name.c_str(), peer, t / it->second);
      }
    }
  }

 private:
  std::map<std::string, double> times_;
};

}  // namespace

int main(int argc, char** argv) {
  if (std::strcmp(CXLPOOL_BENCH_BUILD_TYPE, "Release") != 0) {
    std::fprintf(stderr,
                 "backing_bench: refusing to report from a %s build; configure with -DCMAKE_BUILD_TYPE=Release\n",
                 *CXLPOOL_BENCH_BUILD_TYPE ? CXLPOOL_BENCH_BUILD_TYPE : "unspecified");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

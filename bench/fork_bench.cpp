// SPDX-License-Identifier: MIT
// The cost of fork() for a process with a far heap: fork, the child exits at once, the parent
// waits (the time a shell or a multiprocessing pool pays per child). One heap kind per
// process, selected with --heap (bench/run_fork_bench.py runs them all in one session):
//   glibc       malloc'd blocks (the reference: the kernel's copy-on-write)
//   far-cow     a private cxlpool pool on an emulated far device (memfd, fork=cow: MAP_PRIVATE)
//   far-copy    the same device with fork=copy (MAP_SHARED; the child copies what is committed)
//   file-copy   a file device in /dev/shm with fork=copy (the default on DAX filesystems and
//               hugetlbfs, where written bytes must stay in the file)
//   near        a private pool on node0 (anonymous memory, mbind)
// Heap sizes are the benchmark argument in MiB (64 and 1024), built from 256 KiB blocks that
// are all written. Refuses to run from a non-Release build.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace {

std::string g_heap = "glibc";
cxlpool_pool_t* g_pool = nullptr;
char g_dir[] = "/dev/shm/cxlpool-fork-bench-XXXXXX";

bool setup() {
  if (g_heap == "glibc") return true;
  std::string devices;
  if (g_heap == "far-cow") devices = "cxlfar:backing=shm,size=2G,fork=cow";
  if (g_heap == "far-copy") devices = "cxlfar:backing=shm,size=2G,fork=copy";
  if (g_heap == "file-copy") {
    if (!mkdtemp(g_dir)) return false;
    devices = std::string("cxlfar:backing=file:") + g_dir + "/heap,size=2G,fork=copy";
  }
  if (g_heap == "near") devices = "cxlfar:backing=numa:0,size=2G";
  if (devices.empty()) {
    std::fprintf(stderr, "fork_bench: unknown heap '%s' (glibc, far-cow, far-copy, file-copy, near)\n", g_heap.c_str());
    return false;
  }
  cxlpool_config_t* c = nullptr;
  cxlpool_topology_t* topo = nullptr;
  cxlpool_pool_params_t* p = nullptr;
  cxlpool_config_create(&c);
  cxlpool_config_set_devices(c, devices.c_str());
  cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC);
  bool ok = cxlpool_topology_discover(c, &topo) == CXLPOOL_OK;
  cxlpool_pool_params_create(&p);
  cxlpool_pool_params_set_devices(p, "cxlfar");
  ok = ok && cxlpool_pool_create(topo, p, &g_pool) == CXLPOOL_OK;
  if (!ok) std::fprintf(stderr, "fork_bench: %s\n", cxlpool_last_error_message());
  cxlpool_pool_params_destroy(p);
  cxlpool_topology_destroy(topo);
  cxlpool_config_destroy(c);
  return ok;
}

void* alloc(size_t n) { return g_pool ? cxlpool_malloc(g_pool, n) : std::malloc(n); }
void release(void* p) {
  if (g_pool)
    cxlpool_free(p);
  else
    std::free(p);
}

void BM_fork_exit(benchmark::State& state) {
  constexpr size_t kBlock = 256 << 10;
  size_t blocks = size_t(state.range(0)) * (1 << 20) / kBlock;
  std::vector<void*> heap;
  for (size_t i = 0; i < blocks; ++i) {
    void* p = alloc(kBlock);
    if (!p) {
      state.SkipWithError("heap allocation failed");
      return;
    }
    std::memset(p, int(i), kBlock);
    heap.push_back(p);
  }
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status = 0;
    waitpid(pid, &status, 0);
    auto t1 = std::chrono::steady_clock::now();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) state.SkipWithError("child failed");
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  for (void* p : heap) release(p);
  state.counters["heap_MiB"] = double(state.range(0));
}
BENCHMARK(BM_fork_exit)->Arg(64)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace

int main(int argc, char** argv) {
  if (std::strcmp(CXLPOOL_BENCH_BUILD_TYPE, "Release") != 0) {
    std::fprintf(stderr, "fork_bench: refusing to report from a %s build; configure with -DCMAKE_BUILD_TYPE=Release\n",
                 *CXLPOOL_BENCH_BUILD_TYPE ? CXLPOOL_BENCH_BUILD_TYPE : "unspecified");
    return 2;
  }
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--heap=", 7) == 0)
      g_heap = argv[i] + 7;
    else
      rest.push_back(argv[i]);
  }
  if (!setup()) return 1;
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("heap", g_heap);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_heap == "file-copy") rmdir(g_dir);
  return 0;
}

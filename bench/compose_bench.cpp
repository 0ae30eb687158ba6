// SPDX-License-Identifier: MIT
// Composition (include/cxlpool/compose.h): what a grant and a reclaim cost against the pool's
// size in extents (each holds the compose claim and counts every extent's quota once), how long
// a reclaim waits for a participant to give back what its block cache keeps, how long one takes
// that evacuates a borrowed device's live blocks, and what a running composer costs the
// participants' allocations. Refuses to run from a non-Release build.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/compose.h"
#include "cxlpool/cxlpool.h"
#include "cxlpool/device.h"

namespace {

std::string unique_name(const char* tag) {
  static int counter = 0;
  return std::string("cxlpool-bench-") + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

// A pool in /dev/shm of `extents` 1 MiB extents with quotas a and b of a quarter each, removed
// at scope exit; `pool` is a participant of quota "default".
struct Pool {
  std::string name, device;
  cxlpool_shared_pool_t* pool = nullptr;
  bool ok = false;
  Pool(const char* tag, uint64_t extents) : name(unique_name(tag)), device("shm:" + name) {
    cxlpool_shared_params_t* p = nullptr;
    if (cxlpool_shared_params_create(&p) != CXLPOOL_OK) return;
    // Metadata takes a few extents: ask for a little more than the data.
    cxlpool_shared_params_set_size(p, (extents + extents / 64 + 4) << 20);
    cxlpool_shared_params_set_extent_size(p, 1u << 20);
    cxlpool_shared_params_add_quota(p, "a", (extents / 4) << 20);
    cxlpool_shared_params_add_quota(p, "b", (extents / 4) << 20);
    ok = cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_OK;
    cxlpool_shared_params_destroy(p);
  }
  ~Pool() {
    if (pool) cxlpool_shared_pool_close(pool);
    unlink(("/dev/shm/" + name).c_str());
  }
  cxlpool_shared_pool_t* open(const char* quota) const {
    cxlpool_shared_params_t* p = nullptr;
    cxlpool_shared_params_create(&p);
    cxlpool_shared_params_set_quota(p, quota);
    cxlpool_shared_pool_t* out = nullptr;
    cxlpool_shared_pool_open(device.c_str(), p, &out);
    cxlpool_shared_params_destroy(p);
    return out;
  }
};

bool release_build(benchmark::State& state) {
  if (std::string(CXLPOOL_BENCH_BUILD_TYPE) == "Release") return true;
  state.SkipWithError("built as " CXLPOOL_BENCH_BUILD_TYPE "; benchmarks report only from a Release build");
  return false;
}

// One reclaim of an extent nobody holds and one grant of it back, per iteration.
void BM_reclaim_grant(benchmark::State& state) {
  if (!release_build(state)) return;
  Pool pool("rg", uint64_t(state.range(0)));
  if (!pool.ok) return state.SkipWithError(cxlpool_last_error_message());
  for (auto _ : state) {
    if (cxlpool_compose_reclaim(pool.pool, "a", 1, 0, 10000, nullptr) != CXLPOOL_OK ||
        cxlpool_compose_grant(pool.pool, "a", 1, 10000) != CXLPOOL_OK)
      return state.SkipWithError(cxlpool_last_error_message());
  }
  state.counters["extents"] = double(state.range(0));
  state.SetLabel("one reclaim + one grant");
}
BENCHMARK(BM_reclaim_grant)->Arg(64)->Arg(512)->Arg(2048)->Unit(benchmark::kMicrosecond);

// A reclaim of all of quota a's grant while a's participant keeps 1 MiB blocks it freed in its
// cache (its class idle or not): the wait is until its watch gives them back.
void BM_reclaim_cached(benchmark::State& state) {
  if (!release_build(state)) return;
  const uint64_t n = uint64_t(state.range(0));
  Pool pool("rc", n);
  if (!pool.ok) return state.SkipWithError(cxlpool_last_error_message());
  cxlpool_shared_pool_t* a = pool.open("a");
  if (!a) return state.SkipWithError(cxlpool_last_error_message());
  const uint64_t quarter = n / 4;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<void*> blocks;
    void* x = nullptr;
    for (uint64_t i = 0; i < quarter; ++i)  // small blocks: their extents stay with a, empty
      for (int k = 0; k < 4 && cxlpool_shared_alloc(a, 200 << 10, &x) == CXLPOOL_OK; ++k) blocks.push_back(x);
    for (void* b : blocks) cxlpool_shared_free(a, b);
    state.ResumeTiming();
    if (cxlpool_compose_reclaim(pool.pool, "a", quarter, 60000, 10000, nullptr) != CXLPOOL_OK)
      return state.SkipWithError(cxlpool_last_error_message());
    state.PauseTiming();
    cxlpool_compose_grant(pool.pool, "a", quarter, 10000);
    state.ResumeTiming();
  }
  cxlpool_shared_pool_close(a);
  state.counters["extents_reclaimed"] = double(quarter);
}
BENCHMARK(BM_reclaim_cached)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond)->Iterations(10);

// A reclaim that evacuates: a program's borrowed device (backing=pool:a@..., docs/compose.md
// "Programs follow") holds up to 64 MiB of live 1 MiB blocks; the reclaim lowers a's grant to
// what the quota holds less arg extents, and returns once the device has given back runs that
// much: their blocks moved to the program's other device under the same addresses (the bytes
// moved are counted from the device's evacuated_bytes).
void BM_reclaim_evacuate(benchmark::State& state) {
  if (!release_build(state)) return;
  const uint64_t evacuate = uint64_t(state.range(0)), live = 64;
  Pool pool("ev", 512);  // quota a: 128 extents
  if (!pool.ok) return state.SkipWithError(cxlpool_last_error_message());
  cxlpool_config_t* cfg = nullptr;
  cxlpool_config_create(&cfg);
  const std::string devices = "lent:backing=pool:a@" + pool.device + ",size=4M;spare:backing=shm,size=512M";
  cxlpool_config_set_devices(cfg, devices.c_str());
  cxlpool_config_set_flags(cfg, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_topology_t* topo = nullptr;
  const cxlpool_status_t st = cxlpool_topology_discover(cfg, &topo);
  cxlpool_config_destroy(cfg);
  if (st != CXLPOOL_OK) return state.SkipWithError(cxlpool_last_error_message());
  cxlpool_pool_params_t* pp = nullptr;
  cxlpool_pool_params_create(&pp);
  cxlpool_pool_params_set_devices(pp, "lent,spare");
  cxlpool_pool_params_set_policy(pp, "spill:near=lent,far=spare,watermark=95%");
  cxlpool_pool_t* heap = nullptr;
  const cxlpool_status_t made = cxlpool_pool_create(topo, pp, &heap);
  cxlpool_pool_params_destroy(pp);
  if (made != CXLPOOL_OK) {
    cxlpool_topology_destroy(topo);
    return state.SkipWithError(cxlpool_last_error_message());
  }
  auto used_of_a = [&] {
    cxlpool_compose_state_t s{};
    cxlpool_compose_get_state(pool.pool, 10000, &s);
    return s.quotas[1].used_extents;  // quota 1 is "a"
  };
  uint64_t moved_total = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<void*> blocks;
    for (uint64_t i = 0; i < live; ++i) {
      void* b = cxlpool_malloc(heap, 1u << 20);
      if (!b) break;
      std::memset(b, int(i), 1u << 20);
      blocks.push_back(b);
    }
    const uint64_t used = used_of_a();
    cxlpool_compose_state_t s{};
    cxlpool_compose_get_state(pool.pool, 10000, &s);
    const uint64_t granted = s.quotas[1].granted_extents;
    const uint64_t take = std::min(granted, granted - used + std::min(used, evacuate));
    cxlpool_device_capacity_t before{};
    cxlpool_device_get_capacity("lent", &before);
    state.ResumeTiming();
    if (blocks.size() != live || cxlpool_compose_reclaim(pool.pool, "a", take, 60000, 10000, nullptr) != CXLPOOL_OK) {
      state.SkipWithError(cxlpool_last_error_message());
      break;
    }
    state.PauseTiming();
    cxlpool_device_capacity_t after{};
    cxlpool_device_get_capacity("lent", &after);
    moved_total += after.evacuated_bytes - before.evacuated_bytes;
    for (void* b : blocks) cxlpool_free(b);
    cxlpool_pool_trim(heap, nullptr);
    cxlpool_compose_grant(pool.pool, "a", take, 10000);
    state.ResumeTiming();
  }
  cxlpool_pool_destroy(heap);
  cxlpool_topology_destroy(topo);
  // What the device moved, measured (its lent runs also hold free space, and some blocks may
  // have spilled to spare before the device grew).
  state.counters["evacuated_MiB_avg"] = double(moved_total) / double(state.iterations()) / double(1u << 20);
  state.SetLabel("64 MiB live in a borrowed device");
}
BENCHMARK(BM_reclaim_evacuate)->Arg(8)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond)->Iterations(5);

// 64 B alloc+free pairs and 1 MiB (one extent each) pairs of a participant of quota a, with
// no composer (arg 0) or a composer stepping every 10 ms in another thread (arg 1).
void alloc_pairs(benchmark::State& state, size_t bytes) {
  if (!release_build(state)) return;
  Pool pool(bytes > 4096 ? "al" : "as", 512);
  if (!pool.ok) return state.SkipWithError(cxlpool_last_error_message());
  cxlpool_shared_pool_t* a = pool.open("a");
  if (!a) return state.SkipWithError(cxlpool_last_error_message());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> steps{0};
  std::thread composer;
  cxlpool_composer_t* c = nullptr;
  if (state.range(0)) {
    cxlpool_compose_policy_t pol{};
    pol.min_extents = 64;  // a keeps enough: the composer's steps, not its decisions, are measured
    cxlpool_compose_set_policy(pool.pool, "a", &pol, 0, 10000);
    cxlpool_composer_create(pool.pool, 500, &c);
    composer = std::thread([&] {
      while (!stop.load()) {
        cxlpool_compose_move_t moves[16];
        size_t k = 0;
        cxlpool_composer_step(c, 10000, moves, 16, &k);
        steps.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  for (auto _ : state) {
    void* x = nullptr;
    if (cxlpool_shared_alloc(a, bytes, &x) != CXLPOOL_OK) {
      state.SkipWithError(cxlpool_last_error_message());
      break;
    }
    cxlpool_shared_free(a, x);
  }
  stop.store(true);
  if (composer.joinable()) composer.join();
  cxlpool_composer_destroy(c);
  cxlpool_shared_pool_close(a);
  state.SetLabel(state.range(0) ? "composer stepping every 10 ms" : "no composer");
  if (state.range(0)) state.counters["composer_steps"] = double(steps.load());
}
void BM_alloc_64B(benchmark::State& state) { alloc_pairs(state, 64); }
void BM_alloc_1MiB(benchmark::State& state) { alloc_pairs(state, 1u << 20); }
BENCHMARK(BM_alloc_64B)->Arg(0)->Arg(1)->Unit(benchmark::kNanosecond)->MinTime(1.0);
BENCHMARK(BM_alloc_1MiB)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();

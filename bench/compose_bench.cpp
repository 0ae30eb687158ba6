// SPDX-License-Identifier: MIT
// Composition (include/cxlpool/compose.h): what a grant and a reclaim cost against the pool's
// size in extents (each holds the compose claim and counts every extent's quota once), how long
// a reclaim waits for a participant to give back what its block cache keeps, and what a running
// composer costs the participants' allocations. Refuses to run from a non-Release build.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/compose.h"

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

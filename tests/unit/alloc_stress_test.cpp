// SPDX-License-Identifier: MIT
// Multi-threaded stress in the style of mimalloc's test-stress: 8 threads, recreated every
// round (so heaps are abandoned and adopted), a transfer array for cross-thread frees, and a
// cookie in every block checked before it is freed. >= 10 million operations (fewer under
// sanitizers, where the same code runs at a fraction of the speed).
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace {

#ifdef CXLPOOL_TEST_SANITIZED
constexpr uint64_t kTotalOps = 400'000;
#else
constexpr uint64_t kTotalOps = 10'000'000;
#endif
constexpr int kThreads = 8;
constexpr int kRounds = 5;
constexpr size_t kTransfer = 1024;

std::atomic<uint64_t> g_cookie_errors{0};
std::atomic<uint64_t> g_ops{0};

uint64_t cookie(const void* p, size_t size) { return reinterpret_cast<uintptr_t>(p) * 0x9e3779b97f4a7c15ull ^ size; }

void* make_block(cxlpool_pool_t* pool, size_t size) {
  auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, size));
  if (!p) return nullptr;
  uint64_t c = cookie(p, size);
  std::memcpy(p, &size, 8);
  std::memcpy(p + 8, &c, 8);
  p[size - 1] = static_cast<unsigned char>(c);
  return p;
}

void check_and_free(void* block) {
  auto* p = static_cast<unsigned char*>(block);
  size_t size;
  uint64_t c;
  std::memcpy(&size, p, 8);
  std::memcpy(&c, p + 8, 8);
  if (size < 16 || c != cookie(p, size) || p[size - 1] != static_cast<unsigned char>(c) ||
      cxlpool_usable_size(p) < size)
    g_cookie_errors.fetch_add(1);
  cxlpool_free(p);
}

size_t pick_size(std::mt19937_64& rng) {
  uint64_t r = rng() % 1000;
  if (r < 900) return 24 + rng() % 240;        // small (>= 24: the cookie and the last byte never overlap)
  if (r < 990) return 256 + rng() % 16000;     // medium
  if (r < 999) return 16384 + rng() % 200000;  // large classes
  return (1 + rng() % 3) << 20;                // huge
}

void worker(cxlpool_pool_t* pool, std::atomic<void*>* transfer, uint64_t ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<void*> mine;
  mine.reserve(1024);
  for (uint64_t i = 0; i < ops; ++i) {
    uint64_t r = rng() % 100;
    if (r < 45 || mine.empty()) {
      if (void* p = make_block(pool, pick_size(rng))) mine.push_back(p);
    } else if (r < 75 || mine.size() > 800) {
      size_t k = rng() % mine.size();
      check_and_free(mine[k]);
      mine[k] = mine.back();
      mine.pop_back();
    } else {
      size_t k = rng() % mine.size();
      void* got = transfer[rng() % kTransfer].exchange(mine[k]);
      if (got)
        mine[k] = got;  // freed later by this thread: a cross-thread free
      else {
        mine[k] = mine.back();
        mine.pop_back();
      }
    }
  }
  for (void* p : mine) check_and_free(p);
  g_ops.fetch_add(ops);
}

}  // namespace

TEST_CASE("8 threads, cross-thread frees, cookies in every block", "[stress]") {
  cxlpool_config_t* c = nullptr;
  cxlpool_config_create(&c);
  cxlpool_config_set_devices(c, "cxlA:backing=shm,size=2G");
  cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC);
  cxlpool_topology_t* topo = nullptr;
  REQUIRE(cxlpool_topology_discover(c, &topo) == CXLPOOL_OK);
  cxlpool_config_destroy(c);

  for (const char* policy : {"bind:near", "interleave:node0=1,cxlA=1"}) {
    INFO("policy " << policy);
    cxlpool_pool_params_t* params = nullptr;
    cxlpool_pool_params_create(&params);
    cxlpool_pool_params_set_devices(params, "node0,cxlA");
    cxlpool_pool_params_set_policy(params, policy);
    cxlpool_pool_t* pool = nullptr;
    REQUIRE(cxlpool_pool_create(topo, params, &pool) == CXLPOOL_OK);
    cxlpool_pool_params_destroy(params);

    g_cookie_errors = 0;
    g_ops = 0;
    std::vector<std::atomic<void*>> transfer(kTransfer);
    for (auto& t : transfer) t = nullptr;
    const uint64_t per_thread = kTotalOps / 2 / kRounds / kThreads;  // half the budget per policy
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(worker, pool, transfer.data(), per_thread, uint64_t(round * 100 + t + 1));
      for (auto& t : threads) t.join();
    }
    for (auto& t : transfer)
      if (void* p = t.exchange(nullptr)) check_and_free(p);
    CHECK(g_cookie_errors == 0);
    CHECK(g_ops == per_thread * kThreads * kRounds);
    cxlpool_stats_t s{};
    cxlpool_pool_get_stats(pool, -1, &s);
    CHECK(s.allocations == s.frees);
    CHECK(s.allocated_bytes == 0);
    CHECK(s.failures == 0);
    uint64_t released = 0;
    cxlpool_pool_trim(pool, &released);
    cxlpool_pool_get_stats(pool, -1, &s);
    INFO("resident after trim " << s.resident_bytes << ", released " << released);
    CHECK(s.active_bytes <= 64ull << 20);  // head pages of a few classes remain, not the peak
    cxlpool_pool_destroy(pool);
  }
  cxlpool_topology_destroy(topo);
}

// SPDX-License-Identifier: MIT
// A unit's move (alloc::move_unit) and the rest of its pool: while the bytes are copied the
// pool's lock of the unit's home device is free, so its other units allocate, free and trim;
// the moving unit itself is left alone (a second move is BUSY, a free of it is kept until the
// move ends, a page of it that grows its commit waits and then commits where the unit went).
// The device layer's move hook runs in the middle of each copy; what it starts on another
// thread must finish before the copy does (a lock held by the move would keep it waiting).
// The same holds for a pin's copy and the tiering engine's calls.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "alloc/pool.hpp"
#include "alloc/types.hpp"
#include "device/device.hpp"
#include "os/write_fence.hpp"
#include "test_support.hpp"
#include "tiering/config.hpp"
#include "tiering/engine.hpp"
#include "topology/model.hpp"

namespace {

namespace A = cxlpool::detail::alloc;
using cxlpool::detail::Device;

constexpr size_t kMiB = size_t(1) << 20;

bool copies_fenced() { return cxlpool::os::write_fence::probe().mode == cxlpool::os::write_fence::Mode::kKernel; }

void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512) p[i] = static_cast<unsigned char>(seed + i / 512);
}
bool holds(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512)
    if (p[i] != static_cast<unsigned char>(seed + i / 512)) return false;
  return true;
}

struct TwoTiers {
  cxlpool::detail::Topology topo;
  A::Pool* pool = nullptr;
  TwoTiers() {
    cxlpool::detail::DiscoverOptions o;
    o.ignore_env = true;
    o.no_hwloc = true;
    o.no_default_device = true;
    o.devices = "fast:backing=memfd,size=256M,tier=0;slow:backing=memfd,size=256M,tier=1";
    topo = cxlpool::detail::discover(o);
    A::PoolOptions po;
    po.name = "unit-move";
    po.policy = "bind:fast";
    pool = A::pool_create(topo, po);
    fast = A::pool_find_device(pool, "fast");
    slow = A::pool_find_device(pool, "slow");
  }
  ~TwoTiers() { A::pool_destroy(pool); }
  int fast = -1, slow = -1;  // the devices' indices in the pool
  uint64_t resident(int device) const { return A::pool_device_stats(pool, device).resident_bytes; }
};

A::Unit unit_of(const void* p) {
  A::Unit u;
  REQUIRE(A::unit_of(p, &u));
  return u;
}

// Runs `during` on another thread in the middle of the next copy, and waits for it there (a
// bound for any machine, not a time: a lock held by the move keeps it waiting until after).
struct DuringCopy {
  std::function<void()> during;
  std::thread thread;
  std::atomic<bool> started{false}, done{false};
  bool finished_in_copy = false;
  explicit DuringCopy(std::function<void()> f) : during(std::move(f)) {
    Device::set_move_hook(
        [](void* ctx) {
          auto* self = static_cast<DuringCopy*>(ctx);
          // The first copy only; claimed before the thread starts, as `during` may copy too
          // before this thread has stored the std::thread.
          if (self->started.exchange(true)) return;
          self->thread = std::thread([self] {
            self->during();
            self->done = true;
          });
          for (int i = 0; i < 6000 && !self->done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          self->finished_in_copy = self->done;
        },
        this);
  }
  ~DuringCopy() {
    Device::set_move_hook(nullptr, nullptr);
    if (thread.joinable()) thread.join();
  }
};

}  // namespace

TEST_CASE("while a huge block's unit moves, its pool allocates, frees and trims on the same device", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no kernel-mode userfaultfd here: moves that copy are off");
  TwoTiers t;
  auto* big = static_cast<unsigned char*>(A::pool_malloc(t.pool, 64 * kMiB));
  REQUIRE(big);
  fill(big, 64 * kMiB, 3);
  const A::Unit u = unit_of(big);
  REQUIRE(u.huge);
  REQUIRE(u.resident == t.fast);
  std::atomic<int> failed{0};
  cxlpool_status_t second = CXLPOOL_OK;
  DuringCopy copy([&] {
    // New pages and segments on the home device, and a new huge span there.
    std::vector<void*> blocks;
    for (int i = 0; i < 300; ++i) {
      void* p = A::pool_malloc(t.pool, 60000);
      if (!p) ++failed;
      if (p) std::memset(p, i, 60000);
      blocks.push_back(p);
    }
    void* other_big = A::pool_malloc(t.pool, 5 * kMiB);
    if (!other_big) ++failed;
    if (other_big) std::memset(other_big, 1, 5 * kMiB);
    for (void* p : blocks)
      if (p) A::free_any(p);
    if (other_big) A::free_any(other_big);
    A::pool_trim(t.pool);
    second = A::move_unit(u.ref, t.slow, nullptr, nullptr);  // the same unit again, mid-move
  });
  A::UnitMove moved;
  std::string why;
  cxlpool_status_t st;
  {
    A::PoolsAlive alive;
    st = A::move_unit(u.ref, t.slow, &moved, &why);
  }
  INFO(why);
  REQUIRE(st == CXLPOOL_OK);
  CHECK(copy.finished_in_copy);
  CHECK(failed == 0);
  CHECK(second == CXLPOOL_E_BUSY);
  CHECK(unit_of(big).resident == t.slow);
  CHECK(holds(big, 64 * kMiB, 3));
  CHECK(moved.bytes == 64 * kMiB);
  CHECK(t.resident(t.slow) == 64 * kMiB);
  A::free_any(big);
}

TEST_CASE("a huge block freed while its unit moves goes back once the move has ended", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no kernel-mode userfaultfd here: moves that copy are off");
  TwoTiers t;
  auto* big = static_cast<unsigned char*>(A::pool_malloc(t.pool, 32 * kMiB));
  REQUIRE(big);
  fill(big, 32 * kMiB, 4);
  const A::Unit u = unit_of(big);
  bool freed = false;
  uint64_t during_trim = 0;
  DuringCopy copy([&] {
    freed = A::free_any(big);
    during_trim = A::pool_trim(t.pool);  // the moving span is not released mid-move
  });
  cxlpool_status_t st;
  {
    A::PoolsAlive alive;
    st = A::move_unit(u.ref, t.slow, nullptr, nullptr);
  }
  REQUIRE(st == CXLPOOL_OK);
  CHECK(copy.finished_in_copy);
  CHECK(freed);
  CHECK(during_trim == 0);
  CHECK(t.resident(t.slow) == 32 * kMiB);  // moved, and kept as a freed span
  CHECK(A::pool_trim(t.pool) == 32 * kMiB);
  CHECK(t.resident(t.fast) == 0);
  CHECK(t.resident(t.slow) == 0);
  CHECK(A::pool_device_of(t.pool, t.slow).committed() == 0);
}

TEST_CASE("a page whose region moves grows its commit after the move, on the device the region went to", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no kernel-mode userfaultfd here: moves that copy are off");
  TwoTiers t;
  // A thread's own page of 60,000-byte blocks (64 KiB class: eight slices, committed a block
  // at a time), after the class's first allocations that come from a central heap: four more
  // leave it half used; the next ones, asked for during the copy, grow its commit in the
  // moving region.
  constexpr int kFirst = A::kWarmLargeAllocations + 4;
  std::vector<unsigned char*> blocks;
  std::atomic<int> phase{0};
  std::thread owner([&] {
    auto take = [&] {
      auto* p = static_cast<unsigned char*>(A::pool_malloc(t.pool, 60000));
      if (p) std::memset(p, int(blocks.size() % 251), 60000);
      blocks.push_back(p);
    };
    for (int i = 0; i < kFirst; ++i) take();
    phase = 1;
    while (phase < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < 12; ++i) take();
  });
  struct Join {
    std::thread& t;
    std::atomic<int>& phase;
    ~Join() {
      phase = 2;
      if (t.joinable()) t.join();
    }
  } join{owner, phase};
  while (phase < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const A::Unit u = unit_of(blocks.back());
  REQUIRE_FALSE(u.huge);
  REQUIRE(u.resident == t.fast);
  cxlpool_status_t st;
  {
    DuringCopy copy([&] {
      phase = 2;  // the owner allocates now, beside the copy
      A::pool_trim(t.pool);
    });
    {
      A::PoolsAlive alive;
      st = A::move_unit(u.ref, t.slow, nullptr, nullptr);
    }
    CHECK(copy.finished_in_copy);
  }
  phase = 2;
  owner.join();
  REQUIRE(st == CXLPOOL_OK);
  int missing = 0, wrong = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i]) {
      ++missing;
      continue;
    }
    const auto want = static_cast<unsigned char>(i % 251);
    wrong += blocks[i][0] != want || blocks[i][59999] != want;
  }
  CHECK(missing == 0);
  CHECK(wrong == 0);
  // The page that grew is in the region that moved, and lives where the region went.
  int grown_there = 0;
  for (size_t i = kFirst; i < blocks.size(); ++i)
    if (blocks[i] && unit_of(blocks[i]).ref.base == u.ref.base) ++grown_there;
  CHECK(grown_there > 0);
  CHECK(unit_of(blocks[kFirst - 1]).resident == t.slow);
  CHECK(unit_of(blocks[kFirst]).resident == t.slow);
  // The pool's ledger of each device and the device's own agree.
  for (int d = 0; d < 2; ++d) CHECK(t.resident(d) == A::pool_device_of(t.pool, d).committed());
  for (unsigned char* p : blocks)
    if (p) A::free_any(p);
}

TEST_CASE("while cxlpool_pin copies a unit, hints, the engine's stats and a pin of another unit go on", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no kernel-mode userfaultfd here: moves that copy are off");
  namespace T = cxlpool::detail::tiering;
  TwoTiers t;
  T::start(T::parse_config("monitors=hint,interval=5ms", "test"));
  auto* big = static_cast<unsigned char*>(A::pool_malloc(t.pool, 64 * kMiB));
  auto* other = static_cast<unsigned char*>(A::pool_malloc(t.pool, 8 * kMiB));
  REQUIRE((big && other));
  fill(big, 64 * kMiB, 5);
  fill(other, 8 * kMiB, 6);
  std::atomic<int> failed{0};
  std::string stats, why;
  DuringCopy copy([&] {
    if (T::hint_access(other, 4096, 10, &why) != CXLPOOL_OK) ++failed;
    stats = T::stats_json();
    try {
      T::pin(other, 8 * kMiB, 1);  // a move of its own, beside the one in progress
    } catch (const std::exception& e) {
      why = e.what();
      ++failed;
    }
  });
  T::pin(big, 64 * kMiB, 1);
  CHECK(copy.finished_in_copy);  // nothing of it waited for the pin's copy
  CHECK(failed.load() == 0);
  INFO(why);
  CHECK(stats.find("\"running\"") != std::string::npos);
  CHECK(unit_of(big).resident == t.slow);
  CHECK(unit_of(other).resident == t.slow);
  CHECK(holds(big, 64 * kMiB, 5));
  CHECK(holds(other, 8 * kMiB, 6));
  T::pin(big, 64 * kMiB, -1);   // unpin
  T::pin(other, 8 * kMiB, -1);  // unpin
  T::stop();
  A::free_any(big);
  A::free_any(other);
}

// SPDX-License-Identifier: MIT
// The tiering planner (lib/tiering/planner.hpp) driven with plain structs and a fake clock:
// promotion of hot units, demotion of cold residents between the watermarks, pins, the byte
// budget, full targets, displacement, the kernel's NUMA moves, residence and back-off over
// time, and the order of moves when heats tie.
#include "tiering/planner.hpp"

#include <catch2/catch.hpp>
#include <functional>
#include <utility>
#include <vector>

namespace {

using namespace cxlpool::detail::tiering;
using planner::Input;
using planner::Move;
using planner::Outcome;

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kSecond = 1'000'000'000;

// A made-up machine: devices with capacity and committed bytes, pools over them, units.
struct World {
  Input in;
  World() {
    in.policy.hot = 0.05;
    in.policy.cold = 0.01;
    in.policy.hysteresis = 1.5;
    in.policy.min_residence_ns = 2 * kSecond;
    in.tokens = uint64_t(1) << 40;
    in.now = 100 * kSecond;
  }
  // Watermarks at 95 % and 85 %, the engine's defaults.
  int device(uint64_t capacity, uint64_t committed = 0, bool numa = false) {
    in.devices.push_back({make_room(capacity, committed, 95, 85), numa});
    return int(in.devices.size()) - 1;
  }
  // devices: (device, tier) in the pool's order.
  int pool(std::vector<std::pair<int, int>> devices) {
    planner::Pool p;
    for (auto [d, t] : devices) p.devices.push_back({d, t});
    in.pools.push_back(p);
    return int(in.pools.size()) - 1;
  }
  // A unit of `committed` bytes on device `resident` of the pool (its home unless given); its
  // bytes are counted on that device.
  size_t unit(int pool, int resident, uint64_t committed, double heat, int home = -1) {
    planner::Unit u;
    u.pool = pool;
    u.resident = resident;
    u.home = home < 0 ? resident : home;
    u.committed = committed;
    u.heat = heat;
    in.units.push_back(u);
    in.devices[size_t(in.pools[size_t(pool)].devices[size_t(resident)].device)].room.committed += committed;
    return in.units.size() - 1;
  }
  uint64_t committed(int device) const { return in.devices[size_t(device)].room.committed; }
};

// Records the moves; every move succeeds with the unit's committed bytes unless `decide`
// says otherwise.
struct Script final : planner::Executor {
  explicit Script(const Input& input) : in(input) {}
  Outcome execute(const Move& m) override {
    moves.push_back(m);
    if (decide) return decide(m, moves.size());
    return Outcome{CXLPOOL_OK, true, in.units[m.unit].committed};
  }
  const Input& in;
  std::vector<Move> moves;
  std::function<Outcome(const Move&, size_t nth)> decide;
};

std::vector<std::pair<size_t, int>> pairs(const std::vector<Move>& moves) {
  std::vector<std::pair<size_t, int>> out;
  for (const Move& m : moves) out.emplace_back(m.unit, m.to);
  return out;
}
using Pairs = std::vector<std::pair<size_t, int>>;

}  // namespace

TEST_CASE("a hot unit on a slow device moves to the fast device, lukewarm and empty ones stay", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  w.unit(p, 1, 4 * kMiB, 0.04);  // below hot
  const size_t hot = w.unit(p, 1, 4 * kMiB, 0.5);
  w.unit(p, 1, 0, 0.9);  // nothing committed: nothing to move
  CHECK(pairs(planner::plan(w.in)) == Pairs{{hot, 0}});

  Script s(w.in);
  const planner::Summary sum = planner::run(w.in, s);
  CHECK(sum.spent == 4 * kMiB);
  CHECK(w.in.units[hot].resident == 0);
  CHECK(w.in.units[hot].moved_at == w.in.now);
  CHECK(w.committed(fast) == 4 * kMiB);
  CHECK(w.committed(slow) == 8 * kMiB - 4 * kMiB);
}

TEST_CASE("cold residents of a fast device above its high mark go down, coldest first, until it is not above it",
          "[unit]") {
  // The loop runs while the device is above its high mark; the low mark (at or below the high
  // one) ends it no earlier. docs/tiering.md says so.
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  // 26 units of 4 MiB: 104 MiB; below 95 MiB takes three.
  std::vector<size_t> u;
  for (int i = 0; i < 26; ++i) u.push_back(w.unit(p, 0, 4 * kMiB, 0.005 - 0.0002 * i, /*home=*/1));  // all cold
  CHECK(pairs(planner::plan(w.in)) == Pairs{{u[25], 1}, {u[24], 1}, {u[23], 1}});

  SECTION("only cold ones go: with two cold residents, two") {
    for (int i = 0; i < 24; ++i) w.in.units[u[size_t(i)]].heat = 0.5;
    CHECK(pairs(planner::plan(w.in)) == Pairs{{u[25], 1}, {u[24], 1}});
  }
  SECTION("at the high mark nothing goes") {
    w.in.devices[size_t(fast)].room.committed = w.in.devices[size_t(fast)].room.high;
    CHECK(planner::plan(w.in).empty());
  }
  SECTION("demote=off keeps them") {
    w.in.policy.demote = false;
    CHECK(planner::plan(w.in).empty());
  }
}

TEST_CASE("a demoted unit goes home when that is slower, else to the fastest slower device with room", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), mid = w.device(8 * kMiB), far = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {mid, 1}, {far, 2}});
  for (int i = 0; i < 26; ++i) w.unit(p, 0, 4 * kMiB, 0.005);  // home: the fast device; three go down
  // mid has room for two units, then none.
  const std::vector<Move> moves = planner::plan(w.in);
  REQUIRE(moves.size() == 3);
  CHECK(moves[0].to == 1);
  CHECK(moves[1].to == 1);
  CHECK(moves[2].to == 2);  // mid is full

  SECTION("home on the far device: straight home") {
    for (auto& u : w.in.units) u.home = 2;
    for (const Move& m : planner::plan(w.in)) CHECK(m.to == 2);
  }
}

TEST_CASE("pinned units are never planned by heat, and one off its tier goes to its tier", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  const size_t hot_pinned_slow = w.unit(p, 1, 4 * kMiB, 0.9);
  w.in.units[hot_pinned_slow].pin = 1;
  for (int i = 0; i < 24; ++i) w.in.units[w.unit(p, 0, 4 * kMiB, 0.0, 1)].pin = 0;  // cold, above the high mark
  CHECK(planner::plan(w.in).empty());

  const size_t off_tier = w.unit(p, 1, 4 * kMiB, 0.0);
  w.in.units[off_tier].pin = 0;
  CHECK(pairs(planner::plan(w.in)) == Pairs{{off_tier, 0}});
}

TEST_CASE("the budget limits the bytes moved in a step, hottest first, and defers the rest", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  std::vector<size_t> u;
  for (int i = 0; i < 5; ++i) u.push_back(w.unit(p, 1, 4 * kMiB, 0.1 + 0.1 * i));
  w.in.tokens = 10 * kMiB;
  Script s(w.in);
  const planner::Summary sum = planner::run(w.in, s);
  CHECK(pairs(s.moves) == Pairs{{u[4], 0}, {u[3], 0}});
  CHECK(sum.spent == 8 * kMiB);
  CHECK(w.in.tokens == 2 * kMiB);
  CHECK(sum.budget_deferred == 3);  // three candidates larger than what is left

  SECTION("an empty bucket defers the first candidate and stops") {
    w.in.tokens = 0;
    Script s0(w.in);
    CHECK(planner::run(w.in, s0).budget_deferred == 1);
    CHECK(s0.moves.empty());
  }
}

TEST_CASE("a full target is skipped: no promotion past the high mark without a colder resident", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  for (int i = 0; i < 23; ++i) w.unit(p, 0, 4 * kMiB, 0.5, 1);  // 92 MiB, as hot as the candidate
  const size_t c = w.unit(p, 1, 4 * kMiB, 0.5);
  CHECK(planner::plan(w.in).empty());  // 96 MiB would be above 95

  SECTION("a much colder resident is displaced to make room") {
    const size_t cold = 0;
    w.in.units[cold].heat = 0.02;  // above `cold` (no demotion by itself), far below the candidate
    CHECK(pairs(planner::plan(w.in)) == Pairs{{cold, 1}, {c, 0}});
  }
  SECTION("a colder resident within the noise of the two heats is not") {
    w.in.units[0].heat = 0.02;
    w.in.units[0].noise = 0.2;  // 4 x 0.2 > 0.5 - 0.02
    CHECK(planner::plan(w.in).empty());
  }
}

TEST_CASE("of a pool's fast devices the one with most room is used, and one full by offsets makes room once",
          "[unit]") {
  World w;
  const int a = w.device(100 * kMiB, 50 * kMiB), b = w.device(100 * kMiB, 10 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{a, 0}, {b, 0}, {slow, 1}});
  const size_t hot = w.unit(p, 2, 4 * kMiB, 0.5);
  CHECK(pairs(planner::plan(w.in)) == Pairs{{hot, 1}});

  SECTION("CAPACITY from the mover: the coldest resident goes down and the promotion is tried again") {
    const size_t resident = w.unit(p, 1, 4 * kMiB, 0.0, 2);
    Script s(w.in);
    s.decide = [&](const Move& m, size_t nth) {
      if (nth == 1) return Outcome{CXLPOOL_E_CAPACITY, true, 0};
      return Outcome{CXLPOOL_OK, true, w.in.units[m.unit].committed};
    };
    planner::run(w.in, s);
    CHECK(pairs(s.moves) == Pairs{{hot, 1}, {resident, 2}, {hot, 1}});
    CHECK(w.in.units[hot].resident == 1);
  }
}

TEST_CASE("NUMA to NUMA is the kernel's while it tiers memory under kernel=respect", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB, 0, true), numa_slow = w.device(1024 * kMiB, 0, true);
  const int file_slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {numa_slow, 1}, {file_slow, 1}});
  const size_t on_numa = w.unit(p, 1, 4 * kMiB, 0.9);
  const size_t on_file = w.unit(p, 2, 4 * kMiB, 0.5);
  CHECK(pairs(planner::plan(w.in)) == Pairs{{on_numa, 0}, {on_file, 0}});
  w.in.policy.kernel_moves_numa = true;
  CHECK(pairs(planner::plan(w.in)) == Pairs{{on_file, 0}});
}

TEST_CASE("with a fake clock: a moved unit stays min_residence, a refused one backs off, doubling", "[unit]") {
  World w;
  const int fast = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p = w.pool({{fast, 0}, {slow, 1}});
  const size_t u = w.unit(p, 1, 4 * kMiB, 0.5);
  const uint64_t t0 = w.in.now;

  SECTION("residence") {
    w.in.units[u].moved_at = t0 - kSecond;  // moved 1 s ago, min_residence 2 s
    CHECK(planner::plan(w.in).empty());
    w.in.now = t0 + kSecond;  // 2 s since
    CHECK(pairs(planner::plan(w.in)) == Pairs{{u, 0}});
  }
  SECTION("refusals") {
    w.in.policy.min_residence_ns = 0;
    Script refuse(w.in);
    refuse.decide = [](const Move&, size_t) { return Outcome{CXLPOOL_E_NOT_SUPPORTED, true, 0}; };
    planner::run(w.in, refuse);
    CHECK(refuse.moves.size() == 1);
    CHECK(w.in.units[u].refused_until == t0 + kSecond);
    w.in.now = t0 + kSecond - 1;
    CHECK(planner::plan(w.in).empty());
    w.in.now = t0 + kSecond;
    planner::run(w.in, refuse);
    CHECK(refuse.moves.size() == 2);
    CHECK(w.in.units[u].refused_until == t0 + 3 * kSecond);  // 2 s the second time
    CHECK(w.in.units[u].refusals == 2);
    // Declined for the fence (not attempted): backs off too, without counting as a move.
    w.in.now = t0 + 3 * kSecond;
    Script decline(w.in);
    decline.decide = [](const Move&, size_t) { return Outcome{CXLPOOL_E_NOT_SUPPORTED, false, 0}; };
    planner::run(w.in, decline);
    CHECK(w.in.units[u].refused_until == t0 + 7 * kSecond);
    CHECK(w.in.units[u].moved_at == t0 + kSecond);  // the last move tried
    // A success clears the count.
    w.in.now = t0 + 7 * kSecond;
    Script ok(w.in);
    planner::run(w.in, ok);
    CHECK(w.in.units[u].refusals == 0);
    CHECK(w.in.units[u].resident == 0);
  }
}

TEST_CASE("ties keep the units' order, fast devices are visited in device order, the plan is repeatable", "[unit]") {
  World w;
  const int fast2 = w.device(100 * kMiB), fast1 = w.device(100 * kMiB), slow = w.device(1024 * kMiB);
  const int p2 = w.pool({{fast2, 0}, {slow, 1}});
  const int p1 = w.pool({{fast1, 0}, {slow, 1}});
  std::vector<size_t> u;
  for (int i = 0; i < 40; ++i) u.push_back(w.unit(i % 2 ? p1 : p2, 1, 4 * kMiB, 0.5));
  w.in.tokens = 24 * kMiB;  // six moves
  const std::vector<Move> first = planner::plan(w.in);
  // fast2 (device 0) first: units 0, 2, 4, ... in order; the budget runs out there.
  CHECK(pairs(first) == Pairs{{u[0], 0}, {u[2], 0}, {u[4], 0}, {u[6], 0}, {u[8], 0}, {u[10], 0}});
  CHECK(pairs(planner::plan(w.in)) == pairs(first));
}

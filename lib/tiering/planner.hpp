// SPDX-License-Identifier: MIT
// The tiering planner: the hot/cold policy as a pure function of plain structs (units with
// their heat, the devices' room, the byte budget, a clock value) to moves in order. No I/O,
// no threads, no allocator or device calls, so the policy is tested with made-up units and a
// fake clock; the engine gathers the inputs and the mover (mover.hpp) carries moves out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cxlpool/common.h"
#include "tiering/capacity.hpp"

namespace cxlpool::detail::tiering::planner {

struct Policy {
  double hot = 0.05, cold = 0.01;  // heat at which a unit is hot / a resident is cold
  double hysteresis = 1.5;         // how many times colder a displaced resident must be
  bool promote = true, demote = true;
  uint64_t min_residence_ns = 0;  // a unit that moved (or failed to) stays put this long
  // kernel=respect while the kernel tiers memory itself: NUMA-to-NUMA moves are the kernel's.
  bool kernel_moves_numa = false;
};

struct Device {
  Room room;          // watermarks as configured (capacity.hpp)
  bool numa = false;  // a NUMA node's memory (CXLPOOL_BACKING_NUMA)
};

// A pool's devices in the pool's order; a Unit's devices are indices into this list.
struct PoolDevice {
  int device = 0;  // index into Input::devices
  int tier = 0;    // 0 = fastest
};
struct Pool {
  std::vector<PoolDevice> devices;
};

struct Unit {
  int pool = 0;            // index into Input::pools
  int home = 0;            // the device whose lists hold it (a demoted unit goes back there)
  int resident = 0;        // the device its bytes are on
  uint64_t committed = 0;  // bytes a move copies (and the budget it takes)
  int pin = -1;            // the tier it is pinned to, or -1
  double heat = 0;         // share of its pages touched per interval, aged
  double noise = 0;        // the standard error of heat
  // Kept by the caller from step to step and updated by run(): when the unit last moved (or
  // failed to), and until when moves are not tried after refusals (doubling each time).
  uint64_t moved_at = 0, refused_until = 0;
  unsigned refusals = 0;
};

struct Input {
  Policy policy;
  // Fast devices are visited in this order (the engine lists devices by address).
  std::vector<Device> devices;
  std::vector<Pool> pools;
  std::vector<Unit> units;  // hottest-first and coldest-first ties keep this order
  uint64_t tokens = 0;      // bytes the budget allows in this step
  uint64_t now = 0;         // the clock, ns
};

struct Move {
  size_t unit = 0;  // index into Input::units
  int to = 0;       // device of the unit's pool
};

// What became of a move: a status (OK; BUSY, NOT_SUPPORTED, CAPACITY, ...), whether it was
// tried at all (a copy no write fence covers is not) and the bytes it moved.
struct Outcome {
  cxlpool_status_t status = CXLPOOL_OK;
  bool attempted = true;
  uint64_t bytes = 0;
};

// Carries out one move for run(). Later choices depend on how earlier moves went (a failed
// demotion tries the next resident; a target found full makes room once, then tries again),
// so moves are handed over one at a time, in order.
class Executor {
 public:
  virtual Outcome execute(const Move& m) = 0;

 protected:
  ~Executor() = default;
};

struct Summary {
  uint64_t spent = 0;            // bytes moved
  uint64_t budget_deferred = 0;  // moves put off because the budget was spent
};

// One step of the policy, in order:
// 1. pinned units off their tier go to the first device of it;
// 2. per fast device (a pool's lowest tier, the device with the most room), in device order:
//    above the high mark, cold residents (heat < cold) go down, coldest first, until at or
//    below the low mark; then hot units (heat >= hot) of slower devices come up, hottest
//    first, displacing residents only when these are hysteresis times colder, colder by hot,
//    and colder by 4 times the two heats' combined noise. A promotion the device refuses as
//    full (its offsets are fragmented) makes room the same way, once, and is tried again.
// A demoted unit goes to its home when that is slower, else to the fastest slower device with
// room. Units that are pinned, moved within min_residence or backing off are left alone.
// Moves go to exec one at a time; in (units, devices' committed bytes, tokens) follows each
// outcome.
Summary run(Input& in, Executor& exec);

// The moves of one step in which every move succeeds and moves the unit's committed bytes.
std::vector<Move> plan(Input in);

// The pool's first device of `tier`, or -1.
int first_of_tier(const Pool& p, int tier) noexcept;
// The pool's first device of `tier` with room for `bytes` more, or -1.
int first_of_tier_with_room(const Pool& p, const std::vector<Device>& devices, int tier, uint64_t bytes) noexcept;

}  // namespace cxlpool::detail::tiering::planner

// SPDX-License-Identifier: MIT
// The tiering mover: the one path by which lib/tiering moves a unit, for the engine's steps
// and for cxlpool_pin alike. It declines copies no write fence covers (when asked), moves the
// unit with alloc::move_unit (the monitors' disarm/re-arm hook around it) and counts the move
// in the kernel-named counters. What to move where is the planner's (planner.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "alloc/pool.hpp"
#include "cxlpool/common.h"
#include "os/write_fence.hpp"

namespace cxlpool::detail::tiering {

// Whether a copying move can be write-fenced: a kernel-mode fence, and memory it covers at
// both ends (the target's too: a unit moved where no fence covers it could never come back).
// Devices are asked once per FenceCheck (devices come and go with pools: one per step).
class FenceCheck {
 public:
  explicit FenceCheck(os::write_fence::Mode mode) : mode_(mode) {}
  bool covers(const Device& from, const Device& to);

 private:
  bool covered(const Device& d);
  os::write_fence::Mode mode_;
  std::map<const Device*, bool> fenceable_;
};

struct MoveOptions {
  // When set, a move that copies (one end is fd-backed) and that no fence covers is not tried
  // (counted in moves_skipped_fence): the engine's. Without it the device layer refuses such
  // a copy itself, with its own message: what cxlpool_pin reports.
  FenceCheck* fence = nullptr;
  bool timed = false;  // count the move's time in move_ns (the engine's moves)
  alloc::UnitHook hook = nullptr;
  void* hook_ctx = nullptr;
};

struct MoveResult {
  cxlpool_status_t status = CXLPOOL_OK;
  bool attempted = false;    // false: declined for the fence, or by the hook (a pin)
  bool unit_moving = false;  // BUSY because another move of the unit runs (it will end)
  uint64_t bytes = 0;        // moved, on success
  std::string why;           // on failure
};

// Moves u to device `to` of its pool. Statuses: OK; NOT_SUPPORTED (declined for the fence, or
// alloc::move_unit's refusals); move_unit's others (NOT_FOUND, CAPACITY, NO_MEMORY, OS).
MoveResult move_unit_to(const alloc::Unit& u, int to, const MoveOptions& o);

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// A device's room as the tiering policy judges it: capacity, committed bytes and the
// watermarks, with the one test of "room for N more bytes" and "above the high mark" that the
// planner, the engine and cxlpool_pin share. capacity_of() is the only place lib/tiering reads
// a device's capacity, so that capacity which changes at run time is followed everywhere.
#pragma once

#include <cstdint>

namespace cxlpool::detail {
class Device;
}

namespace cxlpool::detail::tiering {

struct Room {
  uint64_t capacity = 0, committed = 0;
  uint64_t high = 0, low = 0;  // watermarks, bytes (the fast device's: see Config::high_percent)

  bool fits(uint64_t bytes) const noexcept { return committed + bytes <= capacity; }
  bool fits_below_high(uint64_t bytes) const noexcept { return committed + bytes <= high; }
  bool above_high() const noexcept { return committed > high; }
  bool at_or_below_low() const noexcept { return committed <= low; }
  uint64_t free() const noexcept { return capacity > committed ? capacity - committed : 0; }
};

// The watermarks are whole percents of the capacity (rounded down per percent, as configured).
inline Room make_room(uint64_t capacity, uint64_t committed, unsigned high_percent, unsigned low_percent) noexcept {
  return Room{capacity, committed, capacity / 100 * high_percent, capacity / 100 * low_percent};
}

// The device's capacity in bytes.
uint64_t capacity_of(const Device& d) noexcept;
// The device's room now (its ledger's committed bytes), with watermarks at those percents
// (the defaults suit callers that judge only the capacity: fits(), free()).
Room room_of(const Device& d, unsigned high_percent = 100, unsigned low_percent = 100) noexcept;

}  // namespace cxlpool::detail::tiering

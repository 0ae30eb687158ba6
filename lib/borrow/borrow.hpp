// SPDX-License-Identifier: MIT
// Borrowed capacity: a private device (backing=pool:[QUOTA@]LOCATION) whose memory is
// extents of a shared pool, taken on one quota's account. The device grows by borrowing runs
// of extents when it has no room for a reservation, and gives them back when they stay empty
// or when the quota's grant is lowered by a composer (evacuating what they hold first), so a
// program under cxlpool-run or linking the library follows the capacity composed to it
// (docs/compose.md, "Programs follow").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cxlpool::detail::borrow {

// Adds the "pool" provider to the device grammar (lifecycle init; allocates nothing).
void register_provider() noexcept;

// What one device borrowed (tests and messages).
struct Standing {
  std::string device;
  uint64_t runs = 0, bytes = 0;            // borrowed now
  uint64_t borrowed = 0, returned = 0;     // runs, since the device opened
  uint64_t reclaimed = 0;                  // of those returned: for a lowered grant
  uint64_t busy = 0;                       // returns for a lowered grant that could not move everything yet
  uint64_t lost_runs = 0, lost_bytes = 0;  // runs taken away because the pool failed (committed bytes lost)
  std::string failure;                     // why ("" while the pool is fine)
};
std::vector<Standing> standings();

// The follower's period and how long a borrowed run stays empty before it goes back.
inline constexpr uint32_t kFollowPeriodMs = 20;
inline constexpr uint32_t kIdleReturnMs = 1000;

}  // namespace cxlpool::detail::borrow

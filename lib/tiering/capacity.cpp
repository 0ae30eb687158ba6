// SPDX-License-Identifier: MIT
// A device's room (capacity.hpp): the one read of a device's capacity in lib/tiering.
#include "tiering/capacity.hpp"

#include "device/device.hpp"

namespace cxlpool::detail::tiering {

uint64_t capacity_of(const Device& d) noexcept { return d.capacity(); }

Room room_of(const Device& d, unsigned high_percent, unsigned low_percent) noexcept {
  return make_room(capacity_of(d), d.committed(), high_percent, low_percent);
}

}  // namespace cxlpool::detail::tiering

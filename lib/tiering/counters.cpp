// SPDX-License-Identifier: MIT
// The process's tiering counters (counters.hpp).
#include "tiering/counters.hpp"

namespace cxlpool::detail::tiering {

Counters& counters() noexcept {
  static Counters c;
  return c;
}

}  // namespace cxlpool::detail::tiering

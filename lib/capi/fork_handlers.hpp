// SPDX-License-Identifier: MIT
// The C ABI installs the allocator's fork() handlers once, when the first pool or backing is
// made (the interposer installs its own, around its own locks).
#pragma once

#include <pthread.h>

#include <mutex>

#include "alloc/pool.hpp"

namespace cxlpool::detail {

inline void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(alloc::fork_prepare, alloc::fork_parent, alloc::fork_child); });
}

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The C ABI installs the allocator's fork() handlers once, when the first pool or backing is
// made (the interposer installs its own, around its own locks).
#pragma once

#include <pthread.h>

#include <mutex>

#include "alloc/pool.hpp"
#include "stats/publisher.hpp"
#include "tiering/engine.hpp"

namespace cxlpool::detail {

// The tiering engine's locks, then the stats publisher's, come before the allocator's (neither
// takes one of its own while holding an allocator lock).
inline void prepare_fork() noexcept {
  tiering::fork_prepare();
  stats::fork_prepare();
  alloc::fork_prepare();
}
inline void parent_after_fork() noexcept {
  alloc::fork_parent();
  stats::fork_parent();
  tiering::fork_parent();
}
inline void child_after_fork() noexcept {
  alloc::fork_child();
  stats::after_fork_child();
  tiering::after_fork_child();
}

inline void install_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(prepare_fork, parent_after_fork, child_after_fork); });
}

}  // namespace cxlpool::detail

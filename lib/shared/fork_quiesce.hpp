// SPDX-License-Identifier: MIT
// fork() never happens in the middle of a watch pass: a pass may allocate (recovery) and take
// pool locks, and a child must not inherit a lock held by a thread it does not have. The fork
// side is two hooks that lib/lifecycle calls first and last; the pass side is a scope.
#pragma once

namespace cxlpool::detail::shared {

// The fork's prepare handler, before any lock is taken: no pass starts from now on, and the
// passes in flight have ended when it returns (they may need locks prepare takes later, so
// they are waited for before, never while, those are held).
void fork_quiesce() noexcept;
// The fork's parent handler, last: passes may run again once no other thread forks.
void fork_resume() noexcept;
// The child's, last: no pass and no fork of the parent's other threads is in the child, so it
// starts with none (also after a fork whose prepare took nothing).
void fork_resume_in_child() noexcept;

// Held by the watch thread around each pass: waits while a fork is being prepared, then keeps
// fork() out until the pass ends.
class NoForkDuringPass {
 public:
  NoForkDuringPass() noexcept;
  ~NoForkDuringPass();
  NoForkDuringPass(const NoForkDuringPass&) = delete;
  NoForkDuringPass& operator=(const NoForkDuringPass&) = delete;
};

}  // namespace cxlpool::detail::shared

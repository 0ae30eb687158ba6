// SPDX-License-Identifier: MIT
// Moves in flight and fork(). A move holds the gate open for its whole length (rebind.cpp, and
// around it the allocator's bookkeeping in alloc/residency.cpp); fork() closes it before it
// takes any allocator or device lock, waiting for the moves in flight, and a move
// that starts meanwhile waits for the fork to end. So a fork never sees a move half done and
// never waits for one while it holds a lock the move's last step needs.
//
// A mutex, a condition and a count rather than a reader-writer lock: glibc keys a rwlock's
// writer by thread id, which fork() changes, so a child could not release one normally; it
// would have to remake it behind the back of the sanitizers, which then see it held for ever.
// The gate's mutex is held across fork() and released by the child like any mutex.
#pragma once

namespace cxlpool::detail::move_gate {

// Around one move. Nested entries on one thread (a move started from inside another's hook)
// count once and never wait.
void enter() noexcept;
void leave() noexcept;

struct Scope {
  Scope() noexcept { enter(); }
  ~Scope() { leave(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

// fork() handlers (alloc/fork.cpp, first and last): close waits for the moves in flight (other
// than the forking thread's own) and keeps the gate's mutex; parent and child reopen it.
void close_for_fork() noexcept;
void open_in_parent() noexcept;
void open_in_child() noexcept;
// A child whose fork's prepare took nothing (a fork from a signal handler inside cxlpool).
void reset_in_child() noexcept;

}  // namespace cxlpool::detail::move_gate

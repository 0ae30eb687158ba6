// SPDX-License-Identifier: MIT
// The library's life in a process, in one place: what runs when a copy of it is loaded, and
// what runs around fork() (one pthread_atfork registration; the order is the table at the top
// of lifecycle.cpp). The two libraries that carry the components call init(): libcxlpool.so
// (capi) and the interposer (preload). Nothing else registers fork handlers or load-time
// constructors (tests/tools/lifecycle_test.py checks both).
#pragma once

namespace cxlpool::detail::lifecycle {

// What the interposer adds to the fork handlers. Its copy of the allocator is the process's
// malloc: every handler runs inside its internal scope (what a handler allocates comes from its
// internal heap, never from a pool whose locks are held), and its init lock is outermost. All
// members are set; each is noexcept, allocates nothing and does not fail.
struct InterposerHooks {
  struct Lock {
    void (*take)() noexcept;
    void (*release)() noexcept;
    // In the child of a fork made from a signal handler that interrupted cxlpool (nothing was
    // taken; the interrupted code may hold the lock): a fresh, unlocked lock.
    void (*reset)() noexcept;
  };
  // True while the calling thread is inside cxlpool: a fork() then comes from a signal handler
  // that interrupted it, and must not wait for locks the interrupted code holds.
  bool (*inside)() noexcept;
  // From enter to leave, the calling thread's allocations go to the internal heap.
  void (*enter)() noexcept;
  void (*leave)() noexcept;
  Lock init;  // outermost: held while the interposer makes its pool, which takes every other lock
};

// Makes this copy of the library ready: the main thread's leaving is watched
// (os::watch_main_thread) and the fork handlers are registered, once; later calls do nothing.
// Called at load, before any pool exists, by libcxlpool.so's one constructor, and by the
// interposer (with its hooks) from its constructor or its first malloc-family call, whichever
// comes first. Registration time is the order of handlers across libraries: the earlier a copy
// registers, the later its prepare runs and the earlier its parent and child handlers run.
// Takes no lock and allocates nothing of cxlpool's (the interposer calls it inside malloc).
void init(const InterposerHooks* interposer = nullptr) noexcept;

}  // namespace cxlpool::detail::lifecycle

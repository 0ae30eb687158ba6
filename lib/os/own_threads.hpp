// SPDX-License-Identifier: MIT
// cxlpool's own threads (the stats publisher, the tiering engine, the purger, the node watcher, a shared pool's
// heartbeat and watch) are not the program's. glibc ends a process with exit(0) when its last
// thread ends, counting ours: a program whose main thread called pthread_exit would otherwise
// never end while one of ours waits. Here, when the main thread has left that way, a small
// watcher ends the process with exit(0) as soon as only cxlpool's threads remain.
#pragma once

namespace cxlpool::os {

// Every thread of cxlpool's is named "cxlpool/..." (its comm, what top -H and /proc show):
// the watcher tells ours from the program's by that name, so that a second copy of the library
// in the process (the interposer next to a linked libcxlpool.so) counts as ours too. A thread's
// name is its program file's name unless it sets one, and no file name holds a '/': a program
// called cxlpool-anything is not taken for cxlpool's.
inline constexpr char kOwnThreadPrefix[] = "cxlpool/";

// Marks the calling thread as cxlpool's for the object's lifetime: names it (name must start
// with kOwnThreadPrefix; at most 15 characters) and, when the program's main thread has already
// left through pthread_exit, makes sure the watcher runs.
class OwnThread {
 public:
  explicit OwnThread(const char* name) noexcept;
  ~OwnThread();
  OwnThread(const OwnThread&) = delete;
  OwnThread& operator=(const OwnThread&) = delete;
};

// True when the process's main thread has ended and every other thread is cxlpool's (the
// watcher's test; for tests). False whenever /proc cannot tell.
bool only_own_threads_remain() noexcept;

// At library load (lib/lifecycle's init), on the main thread: from now on its leaving through
// pthread_exit is seen (a thread-specific key whose destructor only the main thread has a value
// for). On another thread (a dlopen there), and on later calls, nothing.
void watch_main_thread() noexcept;
// The interposer's internal scope (lib/preload sets the hooks at load): while a thread is in
// it, what it allocates comes from the interposer's own heap, never from the program's pools.
// cxlpool's threads enter it at their start: a block from the program's pools could need a
// borrowed device to grow, which takes the lock of the shared pool whose thread is asking.
// Without hooks (the library linked, no interposer) nothing happens.
void set_internal_scope_hooks(void (*enter)() noexcept, void (*leave)() noexcept) noexcept;
void enter_internal_scope() noexcept;
void leave_internal_scope() noexcept;

// In a fork child (lib/lifecycle's child handler, before anything can start a thread there):
// none of cxlpool's threads came along, and the forking thread is the child's main thread.
void own_threads_after_fork_child() noexcept;

}  // namespace cxlpool::os

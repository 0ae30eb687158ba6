// SPDX-License-Identifier: MIT
// The library's life in a process (lifecycle.hpp): load, thread exit, fork. This is the only
// pthread_atfork call under lib/; every component's fork hooks are called from here, directly,
// in the order of the table below. Direct calls, not hooks that components register: the order
// is the contract (which lock is outermost, who must be waited for before any lock is taken),
// and a list filled by registration would again be ordered by whoever registers first, that is
// by constructor order. Here the order is the text of prepare(), parent() and child().
//
// fork(). prepare runs rows 1 to 6; parent runs 6 to 1; the child runs row 0, then 6 to 1.
// Around them, prepare first blocks the forking thread's asynchronous signals and the parent
// and child unblock them last, outside the internal scope (t_fork_mask).
//
//  row  component             prepare                   parent        child
//   0   os                    -                         -             fork_generation() + 1; no own threads
//   1   shared (watch passes) stop passes, wait for     resume        none in flight;
//                             those in flight                         resume
//   2   interposer init lock  take                      release       release (reset*)
//   3   tiering               engine, pins, hints       release       fresh locks, no engine; sample traps
//                                                                     lifted
//   4   stats                 state, page               release       fresh locks, no page, no publisher
//   5   alloc (and device)    registry, pools, devices, release;      copies of private copy-mode memory,
//                             descriptor arena (lock    waits for     then release; other threads' heaps
//                             order: alloc/fork.cpp)    the child's   abandoned; pools of fork-shared
//                                                       copy          memory detached
//   6   os internal heap      take                      release       release (reset*)
//
// Why this order:
//  0  first in the child: whatever runs after it sees the child as a child (a shared pool
//     asked whether it is a fork child), and a thread of ours that a later row may start (the
//     purger, when the pages row 5 gives back ask for a purge) is counted after the count of
//     our threads is reset, not wiped by it.
//  1  before any lock: a watch pass allocates and takes pool locks, so it must be waited for
//     while no lock is held (waiting with row 5's locks held would wait for ever).
//  2  the interposer's initialisation holds its lock while it makes its pool, which takes every
//     lock of rows 3-6: outermost.
//  3  the engine thread holds its locks while it calls into the allocator (alloc::move_unit,
//     under a unit's home lock): before the allocator's.
//  4  the publisher holds its locks while it reads the allocator's totals under the pool
//     registry's lock: before the allocator's (and it allocates nothing there, since a
//     sanitizer's fork takes its own allocator lock before any handler runs).
//  5  the allocator's and the device layer's locks, in their own order.
//  6  every path above may allocate from the internal heap (os/internal_heap.hpp: the
//     interposer's internal scope, and the device layer's containers in either copy) while it
//     holds a lock of its own: innermost. Released first in the child, whose later rows
//     allocate there.
// (*) A fork from a signal handler that interrupted the interposer on the forking thread
// (InterposerHooks::inside; a linked libcxlpool.so's copy asks the interposer, through
// cxlpool_preload_inside) takes nothing in prepare, in either copy, as glibc takes no malloc
// lock then; the parent does nothing; the child makes every lock afresh (rows 2 and 6 reset,
// row 5 alloc::fork_child_after_reentrant_fork, rows 3 and 4 afresh; after a prepare each row
// releases what it took). Per thread: two threads may fork at once, and one fork's parent
// handler must not take the other's answer.
// Every handler of the interposer runs inside its internal scope, so what a handler allocates
// (a child opening storage for its copy) never comes from a pool whose locks are held.
//
// Across libraries: the interposer is the process's malloc, so its locks must be taken after
// every other library's prepare handler (they may call malloc) and released before any other
// library's parent or child handler. glibc runs prepare handlers last-registered first and the
// others first-registered first, so the interposer registers as early as it can: at its first
// malloc-family call or its constructor, whichever comes first (the dynamic loader and
// libstdc++'s start allocate before any other library's constructor runs, libcxlpool.so's
// included). libcxlpool.so registers from its constructor: at load, so that in a child its
// handlers run before any a program registers later (the child has its own copy of private
// memory before the program's code runs there).
//
// Load: init(), from each library's one constructor (capi/common_api.cpp, preload/preload.cpp;
// the interposer's first malloc may come earlier). Pools, topology, the tiering engine and the
// stats publisher start on first use, not at load.
//
// Thread exit: a program thread's heaps go back to their pools from a thread-specific key's
// destructor the allocator makes with its first heap (alloc/heap.cpp: abandoned pages are
// adopted by other threads); the main thread leaving through pthread_exit is seen by the key
// init() makes (os::watch_main_thread: once only cxlpool's threads remain, the process ends
// with exit(0)); cxlpool's own threads (purger, node watcher, tiering engine, stats publisher, a shared
// pool's heartbeat and watch) end when their component stops them, and never exist in a fork
// child.
#include "lifecycle/lifecycle.hpp"

#include <pthread.h>

#include <atomic>
#include <cstdlib>

#include "alloc/pool.hpp"
#include "borrow/borrow.hpp"
#include "os/claim_lock.hpp"
#include "os/internal_heap.hpp"
#include "os/os.hpp"
#include "os/own_threads.hpp"
#include "os/prim.hpp"
#include "shared/fork_quiesce.hpp"
#include "stats/publisher.hpp"
#include "tiering/engine.hpp"

// The interposer's answer to "is this thread inside it", when it is in the process
// (preload/preload.cpp): resolved at load, null without it.
extern "C" int cxlpool_preload_inside(void) noexcept __attribute__((weak));

namespace cxlpool::detail::lifecycle {
namespace {

// Set once, before the registration: the handlers never see it change.
const InterposerHooks* g_interposer = nullptr;
std::atomic<bool> g_initialised{false};
// This thread's prepare took nothing: a fork from a signal handler that interrupted cxlpool.
thread_local bool t_reentrant_fork __attribute__((tls_model("initial-exec"))) = false;
// The forking thread's signal mask before prepare blocked the asynchronous signals: from the
// first lock prepare takes to the last the parent or child releases, a handler that mallocs on
// this thread would wait for a lock the thread itself holds (glibc's fork also holds its
// malloc locks in that window). The signals wait for the fork instead, and none is lost: what
// arrives meanwhile stays pending in the parent and is delivered when they are unblocked,
// after the interposer's internal scope has ended (a handler run inside it would allocate
// from the internal heap, and one that left by siglongjmp would leave the thread "inside").
// Only what prepare blocked is unblocked: a signal the program held blocked (glibc's own two
// included) stays blocked, and so does none that another library's fork handler, run inside
// this window, blocked after the program had left it unblocked (a limit: docs/preload.md).
alignas(8) thread_local unsigned char t_fork_mask[os::prim::kSignalMaskBytes]
    __attribute__((tls_model("initial-exec")));

// The interposer's internal scope around a handler; nothing in libcxlpool.so.
struct InternalScope {
  InternalScope() noexcept {
    if (g_interposer) g_interposer->enter();
  }
  ~InternalScope() {
    if (g_interposer) g_interposer->leave();
  }
  InternalScope(const InternalScope&) = delete;
  InternalScope& operator=(const InternalScope&) = delete;
};

void take(InterposerHooks::Lock InterposerHooks::*lock) noexcept {
  if (g_interposer) (g_interposer->*lock).take();
}
void release(InterposerHooks::Lock InterposerHooks::*lock, bool reset) noexcept {
  if (g_interposer) (reset ? (g_interposer->*lock).reset : (g_interposer->*lock).release)();
}

// A fork from a signal handler that interrupted the interposer on this thread: this copy's
// prepare takes nothing, whichever copy it is. The interposer's locks are taken after every
// other copy's, so a copy that waited for its own locks here could wait for a thread that
// holds them while it waits for the interposer lock the interrupted code holds.
bool interrupted_interposer() noexcept {
  if (g_interposer) return g_interposer->inside();
  return cxlpool_preload_inside && cxlpool_preload_inside() != 0;
}

void prepare() noexcept {
  if (interrupted_interposer()) {
    t_reentrant_fork = true;
    return;
  }
  os::prim::block_async_signals(t_fork_mask);
  InternalScope scope;
  shared::fork_quiesce();        // 1
  take(&InterposerHooks::init);  // 2
  tiering::fork_prepare();       // 3
  stats::fork_prepare();         // 4
  alloc::fork_prepare();         // 5
  os::internal_lock();           // 6
}

void parent() noexcept {
  if (t_reentrant_fork) {
    t_reentrant_fork = false;
    return;
  }
  {
    InternalScope scope;
    os::internal_unlock();                   // 6
    alloc::fork_parent();                    // 5
    stats::fork_parent();                    // 4
    tiering::fork_parent();                  // 3
    release(&InterposerHooks::init, false);  // 2
    shared::fork_resume();                   // 1
  }
  os::prim::unblock_async_signals_since(t_fork_mask);
}

void child() noexcept {
  const bool reentrant = t_reentrant_fork;
  t_reentrant_fork = false;
  os::count_fork_in_child();  // 0
  os::own_threads_after_fork_child();
  {
    InternalScope scope;
    if (reentrant)  // 6
      os::internal_reset_lock();
    else
      os::internal_unlock();
    if (reentrant)  // 5
      alloc::fork_child_after_reentrant_fork();
    else
      alloc::fork_child();
    stats::after_fork_child(!reentrant);         // 4
    tiering::after_fork_child(!reentrant);       // 3
    release(&InterposerHooks::init, reentrant);  // 2
    shared::fork_resume_in_child();              // 1
  }
  if (!reentrant) os::prim::unblock_async_signals_since(t_fork_mask);
}

// At exit(): what the process leaves in filesystems goes (the lock files of its device claims;
// devices themselves are not closed: the program's memory stays usable to the end).
void at_exit() noexcept { os::remove_claim_lock_files(); }

}  // namespace

void init(const InterposerHooks* interposer) noexcept {
  if (g_initialised.exchange(true)) return;
  g_interposer = interposer;
  borrow::register_provider();  // pool:... devices, before any device is declared or opened
  os::watch_main_thread();
  if (pthread_atfork(prepare, parent, child) != 0)  // ENOMEM, the only failure
    os::prim::write_stderr(
        "cxlpool: pthread_atfork failed (no memory): a fork child of this process may inherit cxlpool's locks "
        "held and share private memory of copy devices with its parent; exec in the child, or free memory\n");
  std::atexit(at_exit);  // fails only without memory: the files then wait for the next claimant
}

}  // namespace cxlpool::detail::lifecycle

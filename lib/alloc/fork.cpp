// SPDX-License-Identifier: MIT
// fork(): every lock the allocator and the device layer take, held across fork() so the
// child never inherits a lock held by a thread that does not exist there. The lock order
// (every path that holds two of these takes them in this order):
//
//   0. the move gate (device/move_gate.hpp): the moves in flight end first, as a move's last
//      step takes its unit's PoolDevice::mu (alloc/residency.cpp) and two devices' locks
//   1. g_registry_mu (the pool registry)
//   2. per pool, in registry order: its central heaps' locks, then each PoolDevice::mu, in
//      device order
//   3. per pool: heaps_mu
//   4. the device registry's lock (device/registry.cpp), then each Device's lock
//   5. the segment descriptor arena
//   6. the node watcher's list (node_watch.cpp)
//
// (the interposer takes its init lock before 1 and its internal heap's lock after 5). In the
// child, before anything runs: private memory the kernel does not copy-on-write gets its own
// copy (device/registry.cpp), shared pools become views the child cannot allocate from, and
// the pages of threads that do not exist in the child are abandoned so it can reuse them.
#include <new>

#include "alloc/fast.hpp"
#include "device/move_gate.hpp"
#include "device/registry.hpp"

namespace cxlpool::detail::alloc {

void fork_prepare() noexcept {
  move_gate::close_for_fork();
  g_registry_mu.lock();
  for (auto& e : g_registry) {
    if (!e.pool) continue;
    for (auto& c : e.pool->central) c.mu.lock();
    for (int di = 0; di < e.pool->ndev; ++di) e.pool->dev[di].mu.lock();
    e.pool->heaps_mu.lock();
  }
  registry::fork_prepare();
  meta_lock_for_fork();
  node_watch_lock_for_fork();
}

namespace {
void unlock_pools() noexcept {
  node_watch_unlock_after_fork();
  meta_unlock_after_fork();
  for (int i = kMaxPools - 1; i >= 0; --i) {
    Pool* pool = g_registry[i].pool;
    if (!pool) continue;
    pool->heaps_mu.unlock();
    for (int di = pool->ndev - 1; di >= 0; --di) pool->dev[di].mu.unlock();
    for (int c = kCentralHeaps - 1; c >= 0; --c) pool->central[c].mu.unlock();
  }
  g_registry_mu.unlock();
}
}  // namespace

void fork_parent() noexcept {
  registry::fork_parent();
  unlock_pools();
  move_gate::open_in_parent();
}

void fork_child() noexcept {
  registry::fork_child();
  // No move was in flight (the gate), but a thread the child does not have may have been
  // waiting on a condition: remade, as the mutexes would be.
  for (auto& e : g_registry)
    if (e.pool)
      for (int di = 0; di < e.pool->ndev; ++di) new (&e.pool->dev[di].unit_moved) std::condition_variable();
  unlock_pools();
  move_gate::open_in_child();
  reset_pools_alive_in_child();
  purger_reset_after_fork();
  elastic_reset_after_fork();
  node_watch_reset_after_fork();
  // The heaps abandoned below ask for a purge, and the purger starts here: what the parent's
  // other threads had freed is this child's private copy once the parent purges its own, and a
  // child that only allocates would never ask again (segment.cpp: not under g++'s sanitizers).
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (auto& e : g_registry) {
    Pool* pool = e.pool;
    if (!pool) continue;
    if (pool->sharing == Sharing::kShared) {
      // The blocks stay shared with the parent, but the heap state is the parent's: a child
      // that allocated here would hand out blocks the parent hands out too.
      pool->detached = true;
      forget_thread_heap(pool);
      continue;
    }
    // The heaps of the parent's other threads, in batches (abandoning takes heaps_mu).
    Heap* mine = current_heap_of(pool);
    for (;;) {
      Heap* others[64];
      int n = 0;
      {
        std::lock_guard<std::mutex> hlock(pool->heaps_mu);
        for (Heap* h = pool->heaps; h && n < 64; h = h->next_in_pool)
          if (h->live && h != mine && h->central < 0) others[n++] = h;
      }
      if (!n) break;
      for (int i = 0; i < n; ++i) abandon_heap(others[i]);  // threads of the parent only
    }
  }
}

void fork_child_after_reentrant_fork() noexcept {
  new (&g_registry_mu) std::mutex();
  reset_pools_alive_in_child();
  for (auto& e : g_registry) {
    if (!e.pool) continue;
    for (auto& c : e.pool->central) new (&c.mu) std::mutex();
    for (int di = 0; di < e.pool->ndev; ++di) new (&e.pool->dev[di].mu) std::mutex();
    new (&e.pool->heaps_mu) std::mutex();
  }
  registry::reset_locks_in_child();
  meta_reset_lock_in_child();
  node_watch_reset_lock_in_child();
  fork_prepare();
  fork_child();
}

}  // namespace cxlpool::detail::alloc

// SPDX-License-Identifier: MIT
// Central heaps: a thread's first allocations of each class (types.hpp, warm_limit) come from a
// few heaps per pool that every thread shares, each under its own lock, picked by the CPU the
// calling thread runs on. A page of its own per class costs a thread a slice of the device
// (above 8 KiB, 8+ blocks) for every class it touches, which made memory grow with the number
// of threads. Here the pages of a class are shared, a block freed by one thread is reused by
// the next at once, and no thread's exit strands any. Frees of these blocks take the owning
// central heap's lock (a lock-free remote free only from a signal handler, folded in at the
// next refill).
#include <sched.h>

#include <cstring>

#include "alloc/fast.hpp"

namespace cxlpool::detail::alloc {

namespace {
// A central heap's lock is held for a malloc or a free of one block: a thread that finds it
// taken tries again for a few hundred nanoseconds before it sleeps, as the holder is likely
// running on another CPU. Under an RLIMIT_AS with 500 short-lived threads, all on the
// central heaps, `threads_short/500` took 467-565 ms instead of 572-624 (3 runs each;
// unlimited, 51-56 ms both ways).
void lock_spinning(std::mutex& mu) noexcept {
  for (int i = 0; i < 100; ++i) {
    if (mu.try_lock()) return;
    __builtin_ia32_pause();
  }
  mu.lock();
}
}  // namespace

Pool::Central& lock_central(Pool* pool, std::unique_lock<std::mutex>* held) noexcept {
  const int cpu = sched_getcpu();
  Pool::Central& mine = pool->central[unsigned(cpu < 0 ? 0 : cpu) % kCentralHeaps];
  // The CPU's heap is made only once threads contend for one already made: each central heap
  // holds a page of every class its threads touched (several MiB), so threads that never
  // overlap, landing on one CPU or another, keep to one heap instead of one per CPU.
  if (!mine.heap.load(std::memory_order_acquire))
    for (Pool::Central& c : pool->central)
      if (&c != &mine && c.heap.load(std::memory_order_acquire) && c.mu.try_lock()) {
        *held = std::unique_lock<std::mutex>(c.mu, std::adopt_lock);
        return c;
      }
  lock_spinning(mine.mu);
  *held = std::unique_lock<std::mutex>(mine.mu, std::adopt_lock);
  return mine;
}

Heap* central_heap(Pool* pool, Pool::Central& c) noexcept {
  if (Heap* made = c.heap.load(std::memory_order_relaxed)) return made;
  Heap* h = meta_new<Heap>();
  if (!h) return nullptr;
  h->pool = pool;
  h->central = int8_t(&c - pool->central);
  std::memset(h->page_device, -1, sizeof h->page_device);
  {
    std::lock_guard<std::mutex> lock(pool->heaps_mu);
    h->live = true;  // never handed to a thread
    h->next_in_pool = pool->heaps;
    pool->heaps = h;
  }
  c.heap.store(h, std::memory_order_release);
  return h;
}

void nonlocal_free(Segment* seg, void* p, Heap* me, Page* pg, uint64_t* word, uint32_t w, uint64_t bit) noexcept {
  // Heaps are freed only with their pool, so the owner read without a lock can be looked at.
  const Heap* owner = pg->owner.load(std::memory_order_acquire);
  if (owner && owner->central >= 0) {
    Pool::Central& c = seg->pool->central[owner->central];
    {
      lock_spinning(c.mu);
      std::lock_guard<std::mutex> lock(c.mu, std::adopt_lock);
      // The page cannot change hands while the lock is held, but it may have since the look
      // above (a racing second free emptied it, and it was retired and reused): look again.
      const BlockRef now = locate_block(seg, reinterpret_cast<uintptr_t>(p));
      if (!now.valid) {
        count_invalid_free(seg, c.heap.load(std::memory_order_relaxed));
        return;
      }
      Heap* const heap = c.heap.load(std::memory_order_relaxed);
      if (now.pg->owner.load(std::memory_order_relaxed) == heap) {
        local_free(seg, now, heap, seg->device);
        return;
      }
    }
    const BlockRef now = locate_block(seg, reinterpret_cast<uintptr_t>(p));
    if (!now.valid) {
      count_invalid_free(seg, me);
      return;
    }
    remote_free(seg, now.pg, me, now.word, now.w, now.bit);
    return;
  }
  remote_free(seg, pg, me, word, w, bit);
}

void central_trim(Pool* pool) noexcept {
  for (Pool::Central& c : pool->central) {
    std::lock_guard<std::mutex> lock(c.mu);
    if (Heap* h = c.heap.load(std::memory_order_relaxed))
      for (int di = 0; di < pool->ndev; ++di) retire_empty_pages(h, di);
  }
}

}  // namespace cxlpool::detail::alloc

// SPDX-License-Identifier: MIT
// Thread heaps: each thread has one heap per pool, found through one initial-exec TLS
// pointer. A heap owns pages per (device, class): a list of pages with free blocks and a
// stack of full ones. A thread that exits abandons its pages to the pool; other threads adopt
// abandoned pages with free blocks before carving new ones, and retire the empty ones.
#include <pthread.h>

#include <cstring>
#include <new>
#include <type_traits>

#include "alloc/fast.hpp"
#include "common/intrusive_list.hpp"

namespace cxlpool::detail::alloc {

constinit thread_local ThreadState* tls_state __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

pthread_key_t g_exit_key;
std::once_flag g_exit_key_once;

// Thread states of exited threads, for the next threads: a thread's start and exit would
// otherwise map and unmap one each, and every mmap/munmap takes the process's address-space
// lock for writing, stalling the page faults of all the other threads meanwhile. A slot is
// taken with one exchange, so no lock is held across fork().
constexpr int kSpareThreadStates = 128;
std::atomic<ThreadState*> g_spare_states[kSpareThreadStates];

ThreadState* new_thread_state() noexcept {
  for (auto& slot : g_spare_states)
    if (slot.load(std::memory_order_relaxed))
      if (ThreadState* ts = slot.exchange(nullptr, std::memory_order_acquire)) {
        *ts = ThreadState{};
        return ts;
      }
  return meta_new<ThreadState>();
}

void delete_thread_state(ThreadState* ts) noexcept {
  for (auto& slot : g_spare_states) {
    ThreadState* expected = nullptr;
    if (!slot.load(std::memory_order_relaxed) &&
        slot.compare_exchange_strong(expected, ts, std::memory_order_release, std::memory_order_relaxed))
      return;
  }
  meta_delete(ts);
}

void thread_exit(void*) {
  ThreadState* ts = tls_state;
  if (!ts) return;
  // glibc runs this outside any malloc call: what the device layer allocates while pages go
  // back (under a device's lock) must go to the interposer's internal heap, not to a pool.
  enter_internal_scope();
  {
    // No pool is destroyed meanwhile (its heaps with it), and the registry's lock is held only
    // to read which of the thread's heaps are still current: a storm of exiting threads
    // abandoning their heaps one at a time under that lock kept them (stacks, heaps, pages)
    // alive while the program started more.
    PoolsAlive alive;
    Heap* current[kMaxPools];
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      for (int i = 0; i < kMaxPools; ++i) {
        const TlsEntry& e = ts->heaps[i];
        if (e.heap && g_registry[i].pool && g_registry[i].generation == e.generation) current[n++] = e.heap;
      }
    }
    for (int i = 0; i < n; ++i) abandon_heap(current[i]);
  }
  tls_state = nullptr;
  delete_thread_state(ts);
  leave_internal_scope();
}

// Adopts an abandoned page of (di, cls) with free blocks; retires empty ones.
Page* adopt(Heap* h, int di, unsigned cls) noexcept {
  Pool* pool = h->pool;
  PoolDevice& d = pool->dev[di];
  Page* found = nullptr;
  Page* empty[kAdoptScan];
  int nempty = 0;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Page* pg = d.abandoned[cls];
    for (int scanned = 0; pg && scanned < kAdoptScan && !found; ++scanned) {
      Page* next = pg->next;
      fold_frees(d, pg);
      if (pg->used == 0) {
        list_remove(d.abandoned[cls], pg);
        empty[nempty++] = pg;
      } else {
        pg->cursor = 0;
        if (page_has_free(pg)) {
          list_remove(d.abandoned[cls], pg);
          found = pg;
        }
      }
      pg = next;
    }
  }
  for (int i = 0; i < nempty; ++i) release_page(pool, empty[i]);
  if (found) {
    found->owner.store(h, std::memory_order_release);
    found->state.store(kActive, std::memory_order_relaxed);
    queue_push_back(h->row[di].head[cls], h->row[di].tail[cls], found);
  }
  return found;
}

// A thread's heap in fresh zero pages, left untouched: a thread uses the rows of the devices
// and classes it allocates from (a few KiB of the ~36), and with hundreds of threads alive
// the rest, written with zeros by a constructor, was megabytes of resident memory. Only when
// a Heap's default state is all zero bytes (its central index aside), checked once.
Heap* new_thread_heap() noexcept {
  static const bool zero_default = [] {
    void* probe = os::try_map_metadata(sizeof(Heap));
    if (!probe) return false;
    Heap* t = new (probe) Heap();
    t->central = 0;
    bool zero = true;
    for (size_t i = 0; i < sizeof(Heap); ++i) zero &= static_cast<const unsigned char*>(probe)[i] == 0;
    t->~Heap();
    os::unmap(probe, sizeof(Heap));
    return zero;
  }();
  static_assert(std::is_aggregate_v<Heap>, "a Heap can begin its life in zero pages");
  if (!zero_default) return meta_new<Heap>();
  void* p = os::try_map_metadata(sizeof(Heap));
  if (!p) return nullptr;
  Heap* h = std::launder(static_cast<Heap*>(p));
  h->central = -1;
  return h;
}

}  // namespace

// A heap's empty pages on device di go back to their segments (its current pages included,
// which a free never retires); the heap's owner (or the holder of a central heap's lock) calls.
void retire_empty_pages(Heap* h, int di) noexcept {
  PoolDevice& d = h->pool->dev[di];
  for (unsigned c = 0; c < kNumClasses; ++c)
    for (Page* pg = h->row[di].head[c]; pg;) {
      Page* next = pg->next;
      fold_frees(d, pg);
      if (pg->used == 0) {
        queue_remove(h->row[di].head[c], h->row[di].tail[c], pg);
        release_page(h->pool, pg);
      }
      pg = next;
    }
}

Heap* heap_slow(Pool* pool) noexcept {
  std::call_once(g_exit_key_once, [] { pthread_key_create(&g_exit_key, thread_exit); });
  Heap* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool->heaps_mu);
    if ((h = pool->free_heaps)) {
      pool->free_heaps = h->next_free;
      h->next_free = nullptr;
    } else {
      h = new_thread_heap();
      if (!h) return nullptr;
      h->pool = pool;
      h->next_in_pool = pool->heaps;
      pool->heaps = h;
    }
    h->live = true;
    pool->thread_heaps.fetch_add(1, std::memory_order_relaxed);
    std::memset(h->page_device, -1, sizeof h->page_device);
    std::memset(h->warm, 0, sizeof h->warm);  // a new thread starts on the central heaps
  }
  if (!tls_state) {
    tls_state = new_thread_state();
    if (!tls_state) {
      std::lock_guard<std::mutex> lock(pool->heaps_mu);
      h->live = false;
      pool->thread_heaps.fetch_sub(1, std::memory_order_relaxed);
      h->next_free = pool->free_heaps;
      pool->free_heaps = h;
      return nullptr;
    }
  }
  tls_state->heaps[pool->index] = {h, pool->generation};
  pthread_setspecific(g_exit_key, reinterpret_cast<void*>(1));
  return h;
}

Heap* current_heap_of(const Pool* pool) noexcept { return tls_heap(pool); }

void forget_thread_heap(const Pool* pool) noexcept {
  if (tls_state) tls_state->heaps[pool->index] = {nullptr, 0};
}

void abandon_heap(Heap* h) noexcept {
  Pool* pool = h->pool;
  for (int di = 0; di < pool->ndev; ++di) {
    PoolDevice& d = pool->dev[di];
    std::lock_guard<std::mutex> lock(d.mu);
    for (unsigned c = 0; c < kNumClasses; ++c) {
      for (Page** list : {&h->row[di].head[c], &h->row[di].full[c]}) {
        while (Page* pg = *list) {
          *list = pg->next;
          // An empty page goes back to its segment now, for the next thread to carve.
          fold_frees(d, pg);
          if (pg->used == 0) {
            release_page_locked(pool, d, pg);
            continue;
          }
          pg->owner.store(nullptr, std::memory_order_release);
          pg->state.store(kAbandoned, std::memory_order_relaxed);
          list_push(d.abandoned[c], pg);
        }
      }
      // Written only where set: a thread touches the rows of the classes it used, and the
      // rest of its heap stays zero pages that hold no memory (new_thread_heap).
      if (h->row[di].tail[c]) h->row[di].tail[c] = nullptr;
      if (h->row[di].full_dirty[c].load(std::memory_order_relaxed))
        h->row[di].full_dirty[c].store(0, std::memory_order_relaxed);
    }
  }
  {
    std::lock_guard<std::mutex> lock(pool->heaps_mu);
    if (h->live) {  // a fork child may abandon the heap of a thread that was exiting
      h->live = false;
      pool->thread_heaps.fetch_sub(1, std::memory_order_relaxed);
      h->next_free = pool->free_heaps;
      pool->free_heaps = h;
    }
  }
  // Blocks other threads freed into these pages are folded in by a purge pass, which also
  // retires the pages that became empty.
  for (int di = 0; di < pool->ndev; ++di) purge_soon(pool, pool->dev[di]);
}

Page* refill(Heap* h, int di, unsigned cls) noexcept {
  // The heap may gain a page below (adopted or new, of another class than a page it once had
  // there): the thread's last block must not be taken for one of it (LastBlock).
  if (ThreadState* ts = tls_state) ts->last.ptr = nullptr;
  Page*& head = h->row[di].head[cls];
  Page*& tail = h->row[di].tail[cls];
  while (Page* pg = head) {
    if (page_has_free(pg)) return pg;
    queue_remove(head, tail, pg);
    pg->state.store(kFull, std::memory_order_relaxed);
    list_push(h->row[di].full[cls], pg);
  }
  if (h->row[di].full_dirty[cls].load(std::memory_order_relaxed) &&
      h->row[di].full_dirty[cls].exchange(0, std::memory_order_acquire)) {
    Page* pg = h->row[di].full[cls];
    while (pg) {
      Page* next = pg->next;
      if (pg->remote_count.load(std::memory_order_acquire) > 0) {
        fold_frees(h->pool->dev[di], pg);
        list_remove(h->row[di].full[cls], pg);
        pg->state.store(kActive, std::memory_order_relaxed);
        queue_push_back(head, tail, pg);
      }
      pg = next;
    }
    while (Page* p2 = head) {
      if (page_has_free(p2)) return p2;
      queue_remove(head, tail, p2);
      p2->state.store(kFull, std::memory_order_relaxed);
      list_push(h->row[di].full[cls], p2);
    }
  }
  if (Page* pg = adopt(h, di, cls)) return pg;
  // Under an RLIMIT_AS a new segment is 4 MiB of address space: first the thread's empty
  // pages go back, in case that makes room.
  Page* pg = new_page(h->pool, di, cls, !address_space_limited());
  if (!pg) {
    retire_empty_pages(h, di);
    pg = new_page(h->pool, di, cls);
  }
  if (!pg) return nullptr;
  pg->owner.store(h, std::memory_order_release);
  pg->state.store(kActive, std::memory_order_relaxed);
  queue_push_back(head, tail, pg);
  return pg;
}

}  // namespace cxlpool::detail::alloc

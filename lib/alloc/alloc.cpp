// SPDX-License-Identifier: MIT
// The malloc paths: the fast path (a compiled route, the thread's heap, a free block on the
// current page), the slow path (the rule chain, refill, lazy commit, fallbacks to the rule's
// other devices), aligned allocation (always a block start: a size class whose size is a
// multiple of the alignment, or a huge span), realloc and free.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "alloc/fast.hpp"
#include "common/error.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::alloc {

namespace {

// Under an RLIMIT_AS, threads take pages of their own only while at most this many threads
// have heaps in the pool (glibc's arena count on 64-bit: 8 per CPU); the others allocate from
// the central heaps. Each page a thread owns holds a slice or more of address space for every
// class it allocates often: 2,000 threads with four live blocks each filled a 586 MiB limit
// with pages, where glibc's threads share its few arenas.
unsigned limited_owner_threads() noexcept { return 8 * os::prim::online_cpus(); }

// The calling thread's heap, made at its first allocation. Under an RLIMIT_AS, none is made
// once limited_owner_threads() threads have one: a heap is a metadata mapping of ~36 KiB (70
// MiB of address space for 2,000 threads), and such a thread allocates from the central heaps.
inline Heap* heap_of(Pool* pool, bool limited) noexcept {
  if (Heap* h = tls_heap(pool)) return h;
  if (limited && pool->thread_heaps.load(std::memory_order_relaxed) >= limited_owner_threads()) return nullptr;
  return heap_slow(pool);
}

// The smallest class at least size bytes whose blocks all start aligned (pages start 64 KiB
// aligned, so a block size that is a multiple of the alignment is enough); kNumClasses when
// none (a huge span then).
unsigned aligned_class(size_t size, size_t alignment) noexcept {
  unsigned c = size_to_class(size < alignment ? alignment : size);
  while (c < kNumClasses && class_to_size(c) % alignment) ++c;
  return c;
}

// Slow path of a small allocation on device di: refill, lazy commit.
void* alloc_block_slow(Heap* h, int di, unsigned cls) noexcept {
  Page* pg = refill(h, di, cls);
  if (!pg) return nullptr;
  uint32_t c = pg->cursor;
  uint64_t w = *free_word(pg, c);
  unsigned bit = unsigned(__builtin_ctzll(w));
  uintptr_t p = pg->start + ((uintptr_t(c) << 6) + bit) * pg->block_size;
  if (p + pg->block_size > pg->commit_end && !extend_commit(h->pool, pg, p + pg->block_size)) return nullptr;
  store_bits(free_word(pg, c), w & (w - 1));
  ++pg->used;
  return reinterpret_cast<void*>(p);
}

void* alloc_on(Pool* pool, Heap* h, int di, size_t size, size_t alignment, unsigned cls, bool huge) noexcept {
  if (huge) return huge_alloc(pool, di, size, alignment);
  void* p = alloc_block(h, di, cls);
  return p ? p : alloc_block_slow(h, di, cls);
}

// Gives back what the pools hold free (pool_trim: empty pages, free slices, cached spans,
// empty segments and regions) before a failed allocation is retried: address space under an
// RLIMIT_AS, device capacity otherwise. Every pool when the registry's lock is free; else
// (another thread holds it, or this one on a thread-exit path) this pool only.
void give_back_free(Pool* pool) noexcept {
  std::unique_lock<std::mutex> lock(g_registry_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    pool_trim(pool);
    return;
  }
  for (const RegistryEntry& e : g_registry)
    if (e.pool && !e.pool->detached) pool_trim(e.pool);
}

// Why an allocation failed, as the thread's last error (cxlpool_last_error_message). Under an
// RLIMIT_AS with less address space left than the block and a segment more, that is the cause
// (the device may have room); otherwise the device the policy tried last, its committed bytes
// against its capacity and, for fd devices, its reserved offsets (a block needs free offsets in
// one run). Nothing is allocated here: the interposer's malloc fails through this too.
[[gnu::cold, gnu::noinline]] void say_no_room(const Pool* pool, int di, size_t size) noexcept {
  const Device& dev = *pool->dev[di].device;
  constexpr double kMiBf = 1024.0 * 1024.0;
  char text[800];
  const size_t headroom = os::prim::address_space_headroom();
  if (headroom != SIZE_MAX && headroom < size + 2 * kSegmentSize) {
    std::snprintf(text, sizeof text,
                  "pool '%s': no address space for %zu bytes: RLIMIT_AS is %.1f MiB and %.1f MiB of it are left "
                  "(device '%s' has %.1f of %.1f MiB committed)",
                  pool->name.c_str(), size, double(os::prim::address_space_limit()) / kMiBf, double(headroom) / kMiBf,
                  dev.name().c_str(), double(dev.committed()) / kMiBf, double(dev.capacity()) / kMiBf);
    set_last_error(CXLPOOL_E_NO_MEMORY, ENOMEM, text);
    return;
  }
  // The device had room, and the process is at vm.max_map_count: a reservation or a commit
  // that splits a mapping needs a mapping more.
  if (dev.committed() + size <= dev.capacity()) {
    const uint64_t maps = os::process_mappings(), max_maps = os::max_map_count();
    if (maps + 8 >= max_maps) {
      std::snprintf(text, sizeof text,
                    "pool '%s': no mapping left for %zu bytes: the process holds %llu mappings and "
                    "vm.max_map_count is %llu (device '%s' has %.1f of %.1f MiB committed)",
                    pool->name.c_str(), size, static_cast<unsigned long long>(maps),
                    static_cast<unsigned long long>(max_maps), dev.name().c_str(), double(dev.committed()) / kMiBf,
                    double(dev.capacity()) / kMiBf);
      set_last_error(CXLPOOL_E_NO_MEMORY, ENOMEM, text);
      return;
    }
  }
  char offsets[128] = "";
  if (dev.caps().kind != CXLPOOL_BACKING_NUMA)
    std::snprintf(offsets, sizeof offsets, "; %.1f MiB of its offsets reserved (a block needs free offsets in one run)",
                  double(dev.reserved_bytes()) / kMiBf);
  char refusal[260] = "";  // a device that borrows its capacity: why it could not borrow more
  if (dev.grows_on_request()) {
    refusal[0] = ';';
    refusal[1] = ' ';
    dev.grow_refusal(refusal + 2, sizeof refusal - 2);
    if (!refusal[2]) refusal[0] = 0;
  }
  std::snprintf(
      text, sizeof text,
      "pool '%s': no room for %zu bytes on device '%s' (the policy's last choice): %.1f of %.1f MiB committed%s%s",
      pool->name.c_str(), size, dev.name().c_str(), double(dev.committed()) / kMiBf, double(dev.capacity()) / kMiBf,
      offsets, refusal);
  set_last_error(CXLPOOL_E_CAPACITY, ENOMEM, text);
}

// No heap to allocate with: a thread's heap and a central heap are metadata mappings, and
// neither could be made.
[[gnu::cold, gnu::noinline]] void say_no_heap(const Pool* pool) noexcept {
  char text[320];
  const size_t headroom = os::prim::address_space_headroom();
  const uint64_t maps = os::process_mappings(), max_maps = os::max_map_count();
  if (headroom != SIZE_MAX && headroom < 2 * kSegmentSize)
    std::snprintf(text, sizeof text,
                  "pool '%s': no memory for a heap's metadata (%zu bytes): RLIMIT_AS is %.1f MiB and %.1f MiB of it "
                  "are left",
                  pool->name.c_str(), sizeof(Heap), double(os::prim::address_space_limit()) / (1024.0 * 1024.0),
                  double(headroom) / (1024.0 * 1024.0));
  else if (maps + 8 >= max_maps)
    std::snprintf(text, sizeof text,
                  "pool '%s': no mapping left for a heap's metadata (%zu bytes): the process holds %llu mappings and "
                  "vm.max_map_count is %llu",
                  pool->name.c_str(), sizeof(Heap), static_cast<unsigned long long>(maps),
                  static_cast<unsigned long long>(max_maps));
  else
    std::snprintf(text, sizeof text, "pool '%s': no memory for a heap's metadata (%zu bytes)", pool->name.c_str(),
                  sizeof(Heap));
  set_last_error(CXLPOOL_E_NO_MEMORY, ENOMEM, text);
}

// in_pages: no exact span under an RLIMIT_AS (one could not be had). central_only: from a
// central heap even where the thread would take a page of its own (none could be had).
void* allocate(Pool* pool, size_t size, size_t alignment, uint32_t hint, int forced, bool in_pages = false,
               bool central_only = false) noexcept {
  if (pool->detached) {  // a shared pool inherited across fork(): the parent's heap state
    errno = ENOMEM;
    return nullptr;
  }
  // Under an RLIMIT_AS blocks above 32 KiB get a reservation of exactly their size (to the
  // page), as glibc maps its large ones: a class page would hold up to a quarter more. Each is
  // a mapping of its own, so only while cxlpool's mappings are under half their budget (a
  // quarter of vm.max_map_count); where one cannot be had, a class page still can.
  const bool limited = address_space_limited();
  const bool room_span =
      !in_pages && size <= kMaxClassSize && alignment <= kSliceSize && size > kLimitedSpanMin && limited && [] {
        const VmaUse v = vma_use();
        return v.vmas < v.budget / 2;
      }();
  bool huge = size > kMaxClassSize || alignment > kSliceSize || room_span;
  unsigned cls = 0;
  if (!huge) {
    cls = alignment > 16 ? aligned_class(size, alignment) : size_to_class(size);
    huge = cls >= kNumClasses;
    if (huge) cls = 0;
  }
  // A thread's first warm_limit(cls) blocks of a class come from a central heap under its lock
  // (central.cpp): a page of its own per class would hold a slice of the device (above 8 KiB,
  // 8+ blocks) for each class each thread touches now and then. Not for the only thread under
  // an RLIMIT_AS: it would hold two pages of each class it uses, the central one and its own
  // (a segment more of address space for a single-threaded Python). A thread without a heap
  // (its metadata could not be mapped) allocates from a central heap too.
  Heap* h = heap_of(pool, limited);
  bool shared = !h || central_only;
  if (h && !shared && !huge) {
    const uint32_t threads = pool->thread_heaps.load(std::memory_order_relaxed);
    if (limited && threads > limited_owner_threads()) {
      shared = true;
    } else if (h->warm[cls] < warm_limit(cls) && !(limited && threads <= 1)) {
      ++h->warm[cls];
      shared = true;
    }
  }
  const bool own_heap = h && !shared;
  std::unique_lock<std::mutex> held;
  Pool::Central* central = shared ? &lock_central(pool, &held) : nullptr;
  if (central) h = central_heap(pool, *central);
  if (!h) {
    say_no_heap(pool);
    errno = ENOMEM;
    return nullptr;
  }
  int di = 0, used = 0;
  void* p = nullptr;
  for (int attempt = 0; attempt < 2 && !p; ++attempt) {
    if (attempt) {
      if (central) held.unlock();  // pool_trim takes central locks
      give_back_free(pool);
      if (central) held.lock();
    }
    const Rule* rule = nullptr;
    if (forced >= 0) {
      di = forced;
    } else {
      if (!huge && pool->routes[cls].kind == RouteKind::kPerPage) {
        // Per-page policies move on to the next device when the current page fills up.
        int16_t cur = h->page_device[cls];
        if (cur >= 0) {
          Page* head = h->row[cur].head[cls];
          if (!head || !page_has_free(head)) h->page_device[cls] = -1;
        }
      }
      di = choose(pool, h, size, hint, cls, huge, &rule);
    }
    p = alloc_on(pool, h, di, size, alignment, cls, huge);
    used = di;
    if (!p && rule) {
      for (int fb : rule->fallback) {
        if (fb == di) continue;
        p = alloc_on(pool, h, fb, size, alignment, cls, huge);
        if (p) {
          used = fb;
          h->row[fb].counters.fallbacks.add(1);
          if (!huge && (rule->kind == RuleKind::kRatio || rule->kind == RuleKind::kInterleave))
            h->page_device[cls] = int16_t(fb);
          break;
        }
      }
    }
  }
  if (!p && room_span) {
    if (held.owns_lock()) held.unlock();
    return allocate(pool, size, alignment, hint, forced, true, central_only);
  }
  // A thread whose own pages are full and that could get no new one (no address space for a
  // segment) may still find a free block in a central heap's pages.
  if (!p && own_heap && !huge) return allocate(pool, size, alignment, hint, forced, in_pages, true);
  if (!p) {
    h->row[di].counters.failures.add(1);
    say_no_room(pool, di, size);
    errno = ENOMEM;
    return nullptr;
  }
  HeapCounters& ctr = h->row[used].counters;
  if (huge)
    ctr.huge_allocs.add(1);
  else
    ctr.allocs[cls].add(1);
  return p;
}

// A request past what any block may be (64 TiB, or an alignment past 1 TiB): refused before
// anything is reserved, with a message of its own (the last one would be another call's).
[[gnu::cold, gnu::noinline]] void* say_too_large(const Pool* pool, size_t size, size_t alignment) noexcept {
  char text[200];  // no allocation here: the interposer's malloc fails through this too
  if (alignment)
    std::snprintf(text, sizeof text,
                  "pool '%s': %zu bytes aligned to %zu is past what one block may be "
                  "(64 TiB, aligned to at most 1 TiB)",
                  pool->name.c_str(), size, alignment);
  else
    std::snprintf(text, sizeof text, "pool '%s': %zu bytes is past what one block may be (64 TiB)", pool->name.c_str(),
                  size);
  set_last_error(CXLPOOL_E_CAPACITY, ENOMEM, text);
  errno = ENOMEM;
  return nullptr;
}

[[gnu::noinline]] void* pool_malloc_slow(Pool* pool, size_t size, uint32_t hint, int device) noexcept {
  if (size > (size_t(1) << 46)) return say_too_large(pool, size, 0);
  return allocate(pool, size, 0, hint, device);
}

}  // namespace

void* pool_malloc(Pool* pool, size_t size) noexcept {
  // Fast path: a class-size request, the thread's heap ready, the class's route decided
  // without the rule chain, a page with a free block.
  if (__builtin_expect(size <= kMaxClassSize, 1)) {
    ThreadState* ts = tls_state;
    const TlsEntry* e = ts ? &ts->heaps[pool->index] : nullptr;
    if (Heap* h = e && e->generation == pool->generation ? e->heap : nullptr) {
      const size_t cls = size_to_class(size);
      const ClassRoute& rt = pool->routes[cls];
      int di = -1;
      if (__builtin_expect(rt.kind == RouteKind::kFixed, 1))
        di = size >= rt.split ? rt.above : rt.below;
      else if (rt.kind == RouteKind::kSpill)
        di = spill_full(rt.watched->load(std::memory_order_relaxed), rt.capacity->load(std::memory_order_relaxed),
                        rt.pct)
                 ? rt.above
                 : rt.below;
      else if (rt.kind == RouteKind::kPerPage)
        di = h->page_device[cls];
      if (di >= 0)
        if (void* p = alloc_block<true>(h, di, unsigned(cls), ts, pool)) {
          h->row[di].counters.allocs[cls].add(1);
          return p;
        }
    }
  }
  return pool_malloc_slow(pool, size, 0, -1);
}

void* pool_malloc(Pool* pool, size_t size, uint32_t hint, int device) noexcept {
  if (device < 0 && hint == 0) return pool_malloc(pool, size);
  return pool_malloc_slow(pool, size, hint, device);
}

void* pool_aligned(Pool* pool, size_t alignment, size_t size, uint32_t hint, int device) noexcept {
  if (alignment == 0 || (alignment & (alignment - 1))) {
    errno = EINVAL;
    return nullptr;
  }
  if (size > (size_t(1) << 46) || alignment > (size_t(1) << 40)) return say_too_large(pool, size, alignment);
  return allocate(pool, size, alignment, hint, device);
}

namespace {

// Frees p in the arena hdr names; false for address space of a huge span that is not ours.
inline bool free_in(SegmentHeader* hdr, void* p) noexcept {
  if (__builtin_expect(hdr->kind == ArenaKind::kHeapSmall, 1)) {
    free_small(static_cast<Segment*>(hdr), p);
    return true;
  }
  if (hdr->kind == ArenaKind::kHeapHuge && !huge_reserves(static_cast<HugeSpan*>(hdr), p)) return false;
  // Address space we gave back counts as ours: a free there is a late second free, ignored.
  // (Something mapped there since, a thread stack say, must not reach glibc's free either;
  // the one loss is a block glibc itself placed there, which then leaks.)
  g_arena_ops[size_t(hdr->kind)]->free(hdr, p);
  return true;
}

}  // namespace

namespace {
// Out of line, so the registers it needs are not saved on free_last's path.
[[gnu::noinline]] bool free_looked_up(void* p) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  return hdr && free_in(hdr, p);
}
}  // namespace

bool free_any(void* p) noexcept { return free_last(p) || free_looked_up(p); }

bool free_any_reentrant(void* p) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  if (!hdr) return false;
  if (hdr->kind == ArenaKind::kHeapSmall) {
    auto* seg = static_cast<Segment*>(hdr);
    const BlockRef b = locate_block(seg, reinterpret_cast<uintptr_t>(p));
    if (!b.valid)
      count_invalid_free(seg, nullptr);
    else
      remote_free(seg, b.pg, nullptr, b.word, b.w, b.bit);  // lock-free, counted without a heap
  } else if (hdr->kind == ArenaKind::kHeapHuge && !huge_reserves(static_cast<HugeSpan*>(hdr), p)) {
    return false;
  }
  // A huge block stays allocated: freeing it takes a lock the interrupted code may hold.
  return true;
}

void* pool_realloc(Pool* pool, void* p, size_t size) noexcept {
  if (!p) return pool_malloc(pool, size);
  SegmentHeader* hdr = pagemap_lookup(p);
  const size_t usable = hdr ? g_arena_ops[size_t(hdr->kind)]->usable_size(hdr, p) : 0;
  if (usable == 0) {  // not the start of a live block of ours
    errno = EINVAL;
    return nullptr;
  }
  // Stay in place when the block fits and is not more than twice too big.
  if (size <= usable && (size >= usable / 2 || usable <= 16)) return p;
  // A small block that grows takes at least half as much again as it had: a buffer grown in
  // small steps is then copied a logarithmic number of times, not once per step (tcmalloc
  // grows by a quarter; half brings the bench's growth row level with it, and a caller that
  // grows by half or more itself, as vectors do, gets exactly what it asks). Its usable size
  // says what it got.
  void* q = nullptr;
  if (size > usable && size - usable < usable / 2 && usable <= kMaxClassSize)
    q = pool_malloc(hdr->pool, usable + usable / 2);
  if (!q) q = pool_malloc(hdr->pool, size);
  if (!q) return nullptr;
  std::memcpy(q, p, std::min(size, usable));
  free_in(hdr, p);
  return q;
}

}  // namespace cxlpool::detail::alloc

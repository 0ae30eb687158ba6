// SPDX-License-Identifier: MIT
// Huge blocks: requests above 1 MiB (or aligned beyond a slice) get a reservation of their
// own — whole segments of address space (under an RLIMIT_AS, only the block's bytes), of
// which only the bytes needed (64 KiB granules; the page under an RLIMIT_AS) are device
// memory. A few freed spans stay cached (committed) for reuse until a purge pass finds them
// idle.
#include <algorithm>

#include "alloc/fast.hpp"
#include "common/intrusive_list.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::alloc {

void huge_release_span(Pool* pool, PoolDevice&, HugeSpan* span) noexcept {
  PoolDevice& at = pool->dev[span->resident];
  unit_released(pool, span->base, span->block);
  if (span->segments > 1 && span->reserved < span->segments * kSegmentSize) {
    // The last segment is partly the program's: what maps there next is foreign to free().
    pagemap_release(span->base, span->segments - 1);
    pagemap_set(span->base + (span->segments - 1) * kSegmentSize, 1, nullptr);
  } else {
    pagemap_release(span->base, span->segments);
  }
  at.resident.fetch_sub(span->committed, std::memory_order_relaxed);
  at.device->release(reinterpret_cast<void*>(span->base), int(pool->index), nullptr);
  span_delete(span);
}

void* huge_alloc(Pool* pool, int di, size_t size, size_t alignment) noexcept {
  PoolDevice& d = pool->dev[di];
  // Large alignments come from the address space (a reservation aligned as asked), never
  // from device memory: a 64-byte block aligned to 256 MiB takes 64 KiB of the device.
  const size_t align = std::max(alignment, kSegmentSize);
  if (size > (size_t(1) << 46) || align > (size_t(1) << 40)) return nullptr;
  size_t n = (size + kSegmentSize - 1) / kSegmentSize;
  if (n == 0) n = 1;
  // Under an RLIMIT_AS the device's page: a 140,000-byte block takes 140 KiB of address space,
  // not 192.
  const size_t granule = address_space_limited() ? d.page_size : std::max(kSliceSize, d.page_size);
  size_t device_bytes = (size + granule - 1) & ~(granule - 1);
  if (device_bytes == 0) device_bytes = granule;
  std::lock_guard<std::mutex> lock(d.mu);
  HugeSpan* span = nullptr;
  // Under an RLIMIT_AS a cached span serves a block at most 1/4 smaller (its address space is
  // the block's own, and stays with the block).
  const bool limited = address_space_limited();
  for (HugeSpan* c = d.huge_cache; c; c = c->next)
    if (!c->lost && !c->moving && c->resident == di && c->segments == n && c->block >= device_bytes &&
        c->base % align == 0 && (!limited || c->block - device_bytes <= device_bytes / 4)) {
      span = c;
      list_remove(d.huge_cache, c);
      --d.huge_cache_count;
      d.huge_cache_bytes -= span->committed;
      span->serial = next_unit_serial();  // a new block: no pin or engine state of the old one
      break;
    }
  if (!span) {
    // A device without room for the block fails here, before address space is reserved for
    // it (the next device of the policy may need that address space), unless the device gets
    // capacity on request (a borrowed device: its reservation asks).
    if (d.device->committed() + device_bytes > d.device->capacity() && !d.device->grows_on_request()) return nullptr;
    // Under an RLIMIT_AS the block's bytes only, not the rest of its last segment.
    const size_t reserved = address_space_limited() ? device_bytes : n * kSegmentSize;
    void* base = nullptr;
    if (d.device->reserve(device_bytes, align, reserved, pool->sharing, int(pool->index), &base, nullptr))
      return nullptr;
    span = span_new();
    if (!span) {
      d.device->release(base, int(pool->index), nullptr);
      return nullptr;
    }
    init_header(span, pool, di, ArenaKind::kHeapHuge);
    span->base = reinterpret_cast<uintptr_t>(base);
    span->segments = n;
    span->reserved = reserved;
    span->block = device_bytes;
    span->serial = next_unit_serial();
    if (!pagemap_set(span->base, n, span)) {
      d.device->release(base, int(pool->index), nullptr);
      span_delete(span);
      return nullptr;
    }
  }
  if (span->committed < device_bytes) {
    if (!device_commit(pool, pool->dev[span->resident], span->base + span->committed,
                       size_t(device_bytes - span->committed))) {
      if (!span->committed || address_space_limited()) {  // its address space is worth more
        huge_release_span(pool, d, span);
        return nullptr;
      }
      span->cached = true;  // consistent: keep it for a later request
      span->cached_at = d.purge_passes;
      list_push(d.huge_cache, span);
      ++d.huge_cache_count;
      d.huge_cache_bytes += span->committed;
      return nullptr;
    }
    span->committed = device_bytes;
  }
  span->cached = false;
  list_push(d.huge_live, span);
  d.active.fetch_add(span->block, std::memory_order_relaxed);
  d.huge_live_bytes.fetch_add(span->block, std::memory_order_relaxed);
  span->user = span->base;
  return reinterpret_cast<void*>(span->base);
}

namespace {

// Bytes of freed spans a pool device keeps for reuse: 64 MiB; under an RLIMIT_AS 1/64 of the
// limit, as a cached span holds address space the program may need for something else (a
// failing allocation empties the cache before it retries; the purger within two delays).
uint64_t huge_cache_bound() noexcept {
  if (!address_space_limited()) return kHugeCacheBytes;
  return std::min<uint64_t>(kHugeCacheBytes, os::prim::address_space_limit() / 64);
}

void huge_free(SegmentHeader* hdr, void* p) noexcept {
  ErrnoGuard keep_errno;
  auto* span = static_cast<HugeSpan*>(hdr);
  Pool* pool = span->pool;
  PoolDevice& d = pool->dev[span->device];
  Heap* me = tls_heap(pool);
  bool cache = false;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (span->cached || reinterpret_cast<uintptr_t>(p) != span->user) {
      // Already free, or not the pointer handed out: counted and ignored.
      bool twice = span->cached && reinterpret_cast<uintptr_t>(p) == span->user;
      if (me)
        (twice ? me->row[span->device].counters.double_frees : me->row[span->device].counters.invalid_frees).add(1);
      else
        (twice ? d.orphan_double_frees : d.orphan_invalid_frees).fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (me)
      me->row[span->device].counters.huge_frees.add(1);
    else
      d.orphan_huge_frees.fetch_add(1, std::memory_order_relaxed);
    list_remove(d.huge_live, span);
    d.active.fetch_sub(span->block, std::memory_order_relaxed);
    d.huge_live_bytes.fetch_sub(span->block, std::memory_order_relaxed);
    // A span that moves now is not released mid-move: the cache keeps it, whatever its bound,
    // until a purge pass after the move. One the tiering engine moved off its home is not
    // reused (a new block goes where the pool's policy says): released.
    if (span->moving ||
        (!span->lost && span->resident == span->device && purge_delay_ms() && d.huge_cache_count < kHugeCacheEntries &&
         d.huge_cache_bytes + span->committed <= huge_cache_bound())) {
      span->cached = true;
      span->cached_at = d.purge_passes;
      list_push(d.huge_cache, span);
      ++d.huge_cache_count;
      d.huge_cache_bytes += span->committed;
      cache = true;
    } else {
      huge_release_span(pool, d, span);
    }
  }
  if (cache) purge_soon(pool, d);
}

size_t huge_usable_size(SegmentHeader* hdr, const void* p) noexcept {
  auto* span = static_cast<HugeSpan*>(hdr);
  auto a = reinterpret_cast<uintptr_t>(p);
  if (span->cached || a != span->user) return 0;
  return span->base + span->block - a;
}

bool huge_info(SegmentHeader* hdr, const void* p, PtrInfo* out) noexcept {
  auto* span = static_cast<HugeSpan*>(hdr);
  auto a = reinterpret_cast<uintptr_t>(p);
  if (span->cached || a < span->base || a >= span->base + span->block) return false;
  out->block_size = span->block - (span->user - span->base);
  out->usable = span->base + span->block - a;
  out->huge = true;
  return true;
}

}  // namespace

const ArenaOps kHugeOps = {huge_free, huge_usable_size, huge_info};

}  // namespace cxlpool::detail::alloc

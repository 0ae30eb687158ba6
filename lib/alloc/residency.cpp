// SPDX-License-Identifier: MIT
// Residency: the tiering engine's view of the allocator. Units (regions of small segments
// and huge spans, each one device reservation) are listed with their home and resident
// devices, checked still alive by serial under their home lock, and moved to another device
// of their pool with Device::move_reservation. The unit is marked moving under that lock and
// the lock is released for the copy: the pool's other units keep allocating, while nothing
// commits, decommits, releases or purges in the moving one (Region::moving).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "alloc/fast.hpp"
#include "common/intrusive_list.hpp"
#include "device/move_gate.hpp"

namespace cxlpool::detail::alloc {

namespace {

bool movable(const Pool* pool) noexcept {
  return pool && !pool->detached && pool->sharing == Sharing::kPrivate && pool->ndev >= 2;
}

std::atomic<UnitReleaseHook> g_release_hook{nullptr};

uint64_t region_committed(const Pool* pool, const PoolDevice& d, const Region& r) noexcept {
  uint64_t bytes = 0;
  for (size_t s = 0; s < r.segments; ++s) {
    if (!(r.used >> s & 1)) continue;
    SegmentHeader* hdr = pagemap_lookup(reinterpret_cast<void*>(r.base + s * kSegmentSize));
    if (!hdr || hdr->kind != ArenaKind::kHeapSmall || hdr->pool != pool) continue;
    auto* seg = static_cast<Segment*>(hdr);
    bytes += d.coarse && seg->committed_slices ? kSegmentSize
                                               : uint64_t(__builtin_popcountll(seg->committed_slices)) << kSliceShift;
  }
  return bytes;
}

// Decommits the free committed slices of a region's segments (home mutex held), as a purge
// pass would later: a move copies what is committed, and free slices hold nothing to keep.
// A coarse device decommits only whole free segments.
void drop_idle_slices(Pool* pool, PoolDevice& d, const Region& r) noexcept {
  for (size_t s = 0; s < r.segments; ++s) {
    if (!(r.used >> s & 1)) continue;
    SegmentHeader* hdr = pagemap_lookup(reinterpret_cast<void*>(r.base + s * kSegmentSize));
    if (!hdr || hdr->kind != ArenaKind::kHeapSmall || hdr->pool != pool) continue;
    auto* seg = static_cast<Segment*>(hdr);
    const uint64_t idle = seg->free_slices & seg->committed_slices;
    if (d.coarse) {
      if (seg->free_slices == ~uint64_t(0)) decommit_slices(pool, d, seg, ~uint64_t(0));
    } else if (idle) {
      decommit_slices(pool, d, seg, idle);
    }
  }
}

Unit region_unit(Pool* pool, int di, const Region& r) noexcept {
  Unit u;
  u.ref = {pool->index, pool->generation, r.base, r.serial, di};
  u.pool = pool;
  u.size = r.segments * kSegmentSize;
  u.committed = region_committed(pool, pool->dev[di], r);
  u.home = di;
  u.resident = r.resident;
  u.moving = r.moving;
  return u;
}

Unit span_unit(Pool* pool, int di, const HugeSpan& s) noexcept {
  Unit u;
  u.ref = {pool->index, pool->generation, s.base, s.serial, di};
  u.pool = pool;
  u.size = s.block;
  u.committed = s.committed;
  u.home = di;
  u.resident = s.resident;
  u.huge = true;
  u.moving = s.moving;
  return u;
}

// The live pool of ref, with g_registry_mu held by the caller.
Pool* pool_of(const UnitRef& ref) noexcept {
  if (ref.pool_index >= uint32_t(kMaxPools)) return nullptr;
  const RegistryEntry& e = g_registry[ref.pool_index];
  return e.pool && e.generation == ref.pool_generation && movable(e.pool) ? e.pool : nullptr;
}

// The home device and the region or span of ref (home mutex held); -1 when gone.
struct Found {
  Region* region = nullptr;
  HugeSpan* span = nullptr;
};
Found find_unit(Pool* pool, int di, const UnitRef& ref) noexcept {
  // From the home's own lists only, never through the page map: a descriptor there may be
  // another device's, released and reused under that device's lock meanwhile.
  PoolDevice& d = pool->dev[di];
  for (Region& r : d.regions)
    if (r.segments && r.base == ref.base) return r.serial == ref.serial ? Found{&r, nullptr} : Found{};
  for (HugeSpan* list : {d.huge_live, d.huge_cache})
    for (HugeSpan* span = list; span; span = span->next)
      if (span->base == ref.base) return span->serial == ref.serial ? Found{nullptr, span} : Found{};
  return {};
}

// Locks the home of ref and returns it (registry lock released once the home's is held: the
// pool cannot be destroyed while one of its device mutexes is held). nullptr when gone.
PoolDevice* lock_home(const UnitRef& ref, Pool** pool_out, int* home_out) noexcept {
  std::unique_lock<std::mutex> registry(g_registry_mu);
  Pool* pool = pool_of(ref);
  if (!pool || ref.home < 0 || ref.home >= pool->ndev) return nullptr;
  pool->dev[ref.home].mu.lock();
  *pool_out = pool;
  *home_out = ref.home;
  return &pool->dev[ref.home];
}

}  // namespace

void set_unit_release_hook(UnitReleaseHook hook) noexcept { g_release_hook.store(hook, std::memory_order_release); }

void unit_released(const Pool* pool, uintptr_t base, size_t size) noexcept {
  if (!movable(pool)) return;
  if (UnitReleaseHook hook = g_release_hook.load(std::memory_order_acquire)) hook(base, size);
}

size_t for_each_unit(void (*fn)(void* ctx, const Unit& unit), void* ctx) noexcept {
  size_t n = 0;
  std::lock_guard<std::mutex> registry(g_registry_mu);
  for (auto& e : g_registry) {
    if (!movable(e.pool)) continue;
    for (int di = 0; di < e.pool->ndev; ++di) {
      PoolDevice& d = e.pool->dev[di];
      std::lock_guard<std::mutex> lock(d.mu);
      for (const Region& r : d.regions)
        if (r.segments) {
          fn(ctx, region_unit(e.pool, di, r));
          ++n;
        }
      for (HugeSpan* list : {d.huge_live, d.huge_cache})
        for (HugeSpan* s = list; s; s = s->next) {
          fn(ctx, span_unit(e.pool, di, *s));
          ++n;
        }
    }
  }
  return n;
}

bool with_unit(const UnitRef& ref, void (*fn)(void* ctx, const Unit& unit), void* ctx) noexcept {
  Pool* pool = nullptr;
  int di = 0;
  PoolDevice* d = lock_home(ref, &pool, &di);
  if (!d) return false;
  std::lock_guard<std::mutex> lock(d->mu, std::adopt_lock);
  Found f = find_unit(pool, di, ref);
  if (!f.region && !f.span) return false;
  fn(ctx, f.region ? region_unit(pool, di, *f.region) : span_unit(pool, di, *f.span));
  return true;
}

const Device& pool_device_of(const Pool* pool, int device) noexcept { return *pool->dev[device].device; }
uint64_t pool_device_read_bandwidth(const Pool* pool, int device) noexcept { return pool->dev[device].read_bandwidth; }

cxlpool_status_t move_unit(const UnitRef& ref, int to, UnitMove* out, std::string* message, UnitHook hook,
                           void* hook_ctx) noexcept {
  UnitMove local;
  UnitMove& result = out ? *out : local;
  result = UnitMove{};
  auto refuse = [&](cxlpool_status_t status, const char* why) {
    if (message) {
      try {
        *message = why;
      } catch (...) {
      }
    }
    return status;
  };
  // fork() waits for the whole move, bookkeeping included, before it takes the home mutex
  // (fork.cpp): a child never sees a unit marked moving.
  move_gate::Scope gate;
  Pool* pool = nullptr;
  int di = 0;
  PoolDevice* home = lock_home(ref, &pool, &di);
  if (!home) return refuse(CXLPOOL_E_NOT_FOUND, "the unit is gone");
  std::unique_lock<std::mutex> lock(home->mu, std::adopt_lock);
  Found f = find_unit(pool, di, ref);
  if (!f.region && !f.span) return refuse(CXLPOOL_E_NOT_FOUND, "the unit is gone");
  if (to < 0 || to >= pool->ndev) return refuse(CXLPOOL_E_INVALID_ARGUMENT, "no such device in the pool");
  if (f.region ? f.region->moving : f.span->moving) {
    result.moving = true;
    return refuse(CXLPOOL_E_BUSY, "the unit is moving already");
  }
  if (f.span && f.span->cached) {
    // A freed span the cache keeps: free memory, released rather than copied anywhere.
    list_remove(home->huge_cache, f.span);
    --home->huge_cache_count;
    home->huge_cache_bytes -= f.span->committed;
    huge_release_span(pool, *home, f.span);
    result.freed = true;
    return refuse(CXLPOOL_E_NOT_FOUND, "the unit was freed: its memory is released, not moved");
  }
  if (f.region) drop_idle_slices(pool, *home, *f.region);
  const int from = f.region ? f.region->resident : f.span->resident;
  if (from == to) {
    result.already = true;
    return refuse(CXLPOOL_E_NOT_SUPPORTED, "already on that device");
  }
  PoolDevice& src = pool->dev[from];
  PoolDevice& dst = pool->dev[to];
  if (dst.page_size != home->page_size || dst.coarse != home->coarse)
    return refuse(CXLPOOL_E_NOT_SUPPORTED, "the devices have different page sizes");
  const Unit before = f.region ? region_unit(pool, di, *f.region) : span_unit(pool, di, *f.span);
  const size_t length = f.region ? f.region->segments * kSegmentSize : f.span->block;
  if (hook && !hook(hook_ctx, before, false, CXLPOOL_OK)) {
    result.declined = true;
    return refuse(CXLPOOL_E_NOT_SUPPORTED, "declined: a pin of the unit forbids the move");
  }
  // The copy runs with the home mutex released, so that the pool's other units on this device
  // allocate and free meanwhile; the mark keeps commits, decommits and releases out of this
  // one (Region::moving), and the caller's PoolsAlive keeps the pool.
  (f.region ? f.region->moving : f.span->moving) = true;
  lock.unlock();
  Device::MoveReport report;
  DeviceError err;
  cxlpool_status_t s = src.device->move_reservation(reinterpret_cast<void*>(ref.base), *dst.device, &report, &err);
  lock.lock();
  f = find_unit(pool, di, ref);  // the region list may have grown (and moved) meanwhile
  if (f.region) f.region->moving = false;
  if (f.span) f.span->moving = false;
  home->unit_moved.notify_all();
  if (s != CXLPOOL_OK) {
    if (hook) hook(hook_ctx, before, true, s);
    if (message) {
      try {
        // A refusal of the target's (no room, no offsets) is told by the target device.
        const bool target = err.call && std::strncmp(err.call, "move: target", 12) == 0;
        *message = "moving from device '" + src.name + "' to device '" + dst.name + "': " +
                   (target ? dst.device : src.device)->describe("move", reinterpret_cast<void*>(ref.base), length, err);
      } catch (...) {
      }
    }
    return s;
  }
  // Nothing releases a moving unit, so it is still there.
  if (f.region) {
    f.region->resident = to;
    for (size_t i = 0; i < f.region->segments; ++i) {
      SegmentHeader* hdr = pagemap_lookup(reinterpret_cast<void*>(f.region->base + i * kSegmentSize));
      if (hdr && hdr->kind == ArenaKind::kHeapSmall && hdr->pool == pool) set_resident(hdr, to);
    }
  } else if (f.span) {
    set_resident(f.span, to);
  }
  src.resident.fetch_sub(std::min(report.bytes, src.resident.load(std::memory_order_relaxed)),
                         std::memory_order_relaxed);
  uint64_t now = dst.resident.fetch_add(report.bytes, std::memory_order_relaxed) + report.bytes;
  uint64_t peak = dst.peak_resident.load(std::memory_order_relaxed);
  while (now > peak && !dst.peak_resident.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  if (hook && (f.region || f.span))
    hook(hook_ctx, f.region ? region_unit(pool, di, *f.region) : span_unit(pool, di, *f.span), true, CXLPOOL_OK);
  result.bytes = report.bytes;
  result.by_kernel = report.by_kernel;
  result.pages_left_behind = report.pages_left_behind;
  result.from = from;
  return CXLPOOL_OK;
}

bool unit_of(const void* p, Unit* out) noexcept {
  SegmentHeader* hdr = pagemap_lookup(p);
  if (!hdr || (hdr->kind != ArenaKind::kHeapSmall && hdr->kind != ArenaKind::kHeapHuge)) return false;
  Pool* pool = hdr->pool;
  int di = hdr->device;
  std::lock_guard<std::mutex> registry(g_registry_mu);
  if (!movable(pool) || g_registry[pool->index].pool != pool) return false;
  PoolDevice& d = pool->dev[di];
  std::lock_guard<std::mutex> lock(d.mu);
  hdr = pagemap_lookup(p);  // again, under the lock
  if (!hdr || hdr->pool != pool) return false;
  if (hdr->kind == ArenaKind::kHeapHuge) {
    if (!huge_reserves(static_cast<HugeSpan*>(hdr), p)) return false;  // the rest of its last segment
    *out = span_unit(pool, di, *static_cast<HugeSpan*>(hdr));
    return true;
  }
  if (hdr->kind != ArenaKind::kHeapSmall) return false;
  const Region& r = d.regions[static_cast<Segment*>(hdr)->region];
  *out = region_unit(pool, di, r);
  return true;
}

}  // namespace cxlpool::detail::alloc

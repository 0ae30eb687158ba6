// SPDX-License-Identifier: MIT
// The tiering mover (mover.hpp): fence check, alloc::move_unit, counters.
#include "tiering/mover.hpp"

#include "device/device.hpp"
#include "os/os.hpp"
#include "tiering/counters.hpp"

namespace cxlpool::detail::tiering {

namespace {

constexpr uint64_t kPage = 4096;

// Whether moving u to `to` copies its bytes (one end is fd-backed) and so needs a write
// fence; NUMA to NUMA the kernel migrates the pages in place.
bool copies(const alloc::Unit& u, int to) {
  return !(alloc::pool_device_of(u.pool, u.resident).caps().kernel_migratable &&
           alloc::pool_device_of(u.pool, to).caps().kernel_migratable);
}

}  // namespace

bool FenceCheck::covered(const Device& d) {
  auto it = fenceable_.find(&d);
  if (it == fenceable_.end()) {
    bool yes = false;
    try {
      yes = d.copy_fenceable();
    } catch (...) {
    }
    it = fenceable_.emplace(&d, yes).first;
  }
  return it->second;
}

bool FenceCheck::covers(const Device& from, const Device& to) {
  if (mode_ != os::write_fence::Mode::kKernel) return false;
  return covered(from) && covered(to);
}

MoveResult move_unit_to(const alloc::Unit& u, int to, const MoveOptions& o) {
  Counters& c = counters();
  MoveResult r;
  if (o.fence && copies(u, to) &&
      !o.fence->covers(alloc::pool_device_of(u.pool, u.resident), alloc::pool_device_of(u.pool, to))) {
    // Not tried: the copy would need a fence that holds the program's system calls.
    c.moves_skipped_fence.add(1);
    r.status = CXLPOOL_E_NOT_SUPPORTED;
    return r;
  }
  r.attempted = true;
  const bool promote = alloc::pool_device_tier(u.pool, to) < alloc::pool_device_tier(u.pool, u.resident);
  alloc::UnitMove moved;
  const uint64_t t0 = o.timed ? os::monotonic_ns() : 0;
  r.status = alloc::move_unit(u.ref, to, &moved, &r.why, o.hook, o.hook_ctx);
  r.unit_moving = moved.moving;
  if (moved.declined) {  // nothing was tried: not a move, not a failure
    r.attempted = false;
    return r;
  }
  if (o.timed) c.move_ns.add(os::monotonic_ns() - t0);
  c.moves.add(1);
  if (r.status != CXLPOOL_OK) {
    c.move_failures.add(1);
    // Refused before any page was copied: no migration failed.
    if (r.status != CXLPOOL_E_NOT_SUPPORTED) c.pgmigrate_fail.add(u.committed / kPage);
    return r;
  }
  r.bytes = moved.bytes;
  (promote ? c.pgpromote_success : c.pgdemote_success).add(moved.bytes / kPage);
  (promote ? c.promote_bytes : c.demote_bytes).add(moved.bytes);
  return r;
}

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// Movable residency (device.hpp, Device::move_reservation): a reservation's bytes move to
// another device under the same virtual address. NUMA to NUMA the kernel migrates the pages;
// every other pair copies into a staging mapping of the target's storage while writers are
// fenced (os/write_fence.hpp: userfaultfd, else mprotect), then swaps the mapping in with one
// mremap, the program's page protections kept. Bookkeeping (reservation, committed offsets,
// ledgers) moves with the bytes, under both devices' locks.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "device/device.hpp"
#include "os/prim.hpp"
#include "os/vm_query.hpp"
#include "os/write_fence.hpp"

namespace cxlpool::detail {
namespace {

struct Run {
  uint64_t lo, hi;  // byte offsets inside the reservation
};

}  // namespace

cxlpool_status_t Device::move_reservation(void* addr, Device& to, MoveReport* report, DeviceError* err) noexcept {
  MoveReport local;
  MoveReport& out = report ? *report : local;
  out = MoveReport{};
  if (&to == this) return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0, "move to the same device");
  std::scoped_lock lock(mu_, to.mu_);
  auto it = reservations_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == reservations_.end()) return device_failure(err, CXLPOOL_E_NOT_FOUND, 0, "move");
  Reservation r = it->second;
  if (r.sharing == Sharing::kShared || r.inherited || !r.owns_range)
    return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0, "move of shared memory");
  const size_t to_ps = to.caps_.page_size;
  if (r.size % to_ps || r.addr % to_ps) return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "move: page size");

  // What is committed, as runs of offsets inside the reservation.
  std::vector<Run> runs;
  uint64_t bytes = 0;
  try {
    committed_in(r).for_each([&](uint64_t lo, uint64_t hi) {
      runs.push_back({lo - r.offset, hi - r.offset});
      bytes += hi - lo;
    });
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "move: committed ranges");
  }
  if (to.committed() + bytes > to.ledger_.capacity)
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "move: target capacity");
  std::shared_ptr<Storage> dst;
  if (cxlpool_status_t s = to.storage_for(Sharing::kPrivate, dst, err)) return s;
  Storage& src = *r.storage;

  const bool by_kernel = src.anonymous() && dst->anonymous() && dst->numa_node() >= 0;
  // A copy holds a staging mapping as split as the reservation until the swap.
  if (!by_kernel && !vma_room_for(r.vmas))
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "VMA budget", vma_use().budget);
  uint64_t new_offset = r.addr;  // anonymous storage counts addresses
  if (!dst->anonymous()) {
    uint64_t largest = 0;
    int e = dst->take_range(r.size, std::min<size_t>(r.size, size_t(2) << 20), &new_offset, &largest);
    if (e == ENOSPC) return device_failure(err, CXLPOOL_E_CAPACITY, 0, "move: target offsets");
    if (e) return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "move: target offsets");
  }
  auto give_back = [&] {
    if (!dst->anonymous()) dst->give_back_range(new_offset, r.size);
  };
  Reservation moved = r;
  moved.storage = dst;
  moved.offset = new_offset;
  // The target's table gets its entry first (the one step that allocates), so that nothing
  // after the bytes moved can fail; failures before that point take it out again.
  try {
    to.reservations_.emplace(moved.addr, moved);
  } catch (...) {
    give_back();
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "move: reservation table");
  }
  auto undo_entry = [&] { to.reservations_.erase(moved.addr); };
  if (by_kernel) {
    // NUMA to NUMA: the kernel moves the pages in place and the policy follows.
    size_t left = 0;
    int e = os::prim::move_to_node(addr, r.size, dst->numa_node(), &left);
    if (e) {
      // A full target (ENOMEM) is found after the kernel moved what fitted and bound the range
      // there: the pages and the source's policy go back, so that nothing is counted on the
      // wrong device and later faults do not land on (or OOM-kill for) the full node.
      size_t back = 0;
      if (src.numa_node() >= 0)
        os::prim::move_to_node(addr, r.size, src.numa_node(), &back);
      else
        os::prim::clear_policy(addr, r.size);
      undo_entry();
      return device_failure(err, e == ENOMEM ? CXLPOOL_E_CAPACITY : CXLPOOL_E_OS, e, "mbind(MPOL_MF_MOVE)");
    }
    out.by_kernel = true;
    out.pages_left_behind = left;
  } else {
    void* staging = nullptr;
    if (int e = os::prim::reserve(r.size, to_ps, &staging)) {
      undo_entry();
      give_back();
      return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "move: staging address space");
    }
    auto drop_staging = [&](cxlpool_status_t status, int e, const char* call) {
      os::prim::unmap(staging, r.size);
      undo_entry();
      give_back();
      return device_failure(err, status, e, call);
    };
    if (int e = dst->map(staging, r.size, new_offset, to.mapped_shared(moved)))
      return drop_staging(CXLPOOL_E_OS, e, "move: mapping the target");
    auto* stage = static_cast<char*>(staging);
    // Every target page is faulted in before the fence goes up, in one call per run (much
    // cheaper than a fault per page during the copy, and the fenced window only copies).
    const bool shared_target = !dst->anonymous() && to.mapped_shared(moved);
    for (const Run& run : runs) {
      if (int e = os::prim::protect(stage + run.lo, run.hi - run.lo, true))
        return drop_staging(CXLPOOL_E_OS, e, "move: mprotect(staging)");
      // Target memory on a size-limited filesystem is allocated before anything is copied,
      // so a full one is CAPACITY here rather than SIGBUS in the copy (as in commit()).
      int e = os::prim::populate_write(stage + run.lo, run.hi - run.lo);
      if (e && e != EINVAL) {  // EINVAL: a kernel before 5.14, the copy faults them in
        if (shared_target) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
        return drop_staging(e == ENOMEM || e == EFAULT ? CXLPOOL_E_CAPACITY : CXLPOOL_E_OS, e,
                            "move: madvise(POPULATE_WRITE)");
      }
    }
    // The program's protections of the range (kept on the new mapping); what it made
    // unreadable is not ours to read, so the range does not move.
    std::vector<os::vm_query::ProtRun> prots(64);
    size_t nprot = 0;
    for (int e; (e = os::vm_query::protection_runs(r.addr, r.addr + r.size, prots.data(), prots.size(), &nprot));) {
      if (e != ENOSPC || prots.size() >= 65536) {
        if (shared_target)
          for (const Run& run : runs) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
        return drop_staging(e == ENOSPC ? CXLPOOL_E_NOT_SUPPORTED : CXLPOOL_E_OS, e, "move: /proc/self/maps");
      }
      prots.resize(prots.size() * 4);
    }
    prots.resize(nprot);
    for (const Run& run : runs)
      for (const auto& p : prots)
        if (p.begin < r.addr + run.hi && r.addr + run.lo < p.end && (p.prot < 0 || !(p.prot & os::vm_query::kRead))) {
          if (shared_target)
            for (const Run& x : runs) os::prim::advise_remove(stage + x.lo, x.hi - x.lo);
          return drop_staging(CXLPOOL_E_NOT_SUPPORTED, 0,
                              "move: the program made part of the range unreadable (its protections are kept: not "
                              "moved)");
        }
    // Fence the writers: by userfaultfd where it can be had (writers and system calls wait in
    // the kernel), else read-only pages and the SIGSEGV handler.
    os::write_fence::UffdFence uf;
    int slot = -1;
    int fe = os::write_fence::raise_uffd(addr, r.size, &uf);
    if (fe == EBUSY) {
      if (shared_target)
        for (const Run& run : runs) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
      return drop_staging(CXLPOOL_E_NOT_SUPPORTED, fe,
                          "move: the range is registered with a userfaultfd of the program's (not taken over)");
    }
    const bool by_uffd = fe == 0;
    auto* from = static_cast<char*>(addr);
    if (!by_uffd) {
      if (int e = os::write_fence::raise(addr, r.size, &slot)) {
        if (shared_target)
          for (const Run& run : runs) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
        return drop_staging(e == EBUSY ? CXLPOOL_E_NOT_SUPPORTED : CXLPOOL_E_OS, e,
                            e == EBUSY ? "move: no userfaultfd here, and the program replaced cxlpool's SIGSEGV "
                                         "handler (write fences need one or the other)"
                                       : "move: write fence");
      }
      for (const auto& p : prots)
        if (p.prot & os::vm_query::kWrite)
          os::prim::protect_prot(reinterpret_cast<void*>(p.begin), p.end - p.begin, p.prot & ~os::vm_query::kWrite);
    }
    auto restore_source = [&] {
      if (by_uffd) {
        os::write_fence::lift_uffd_in_place(uf);
        return;
      }
      for (const auto& p : prots)
        if (p.prot & os::vm_query::kWrite)
          os::prim::protect_prot(reinterpret_cast<void*>(p.begin), p.end - p.begin, p.prot);
      os::write_fence::lift(slot);
    };
    for (const Run& run : runs) std::memcpy(stage + run.lo, from + run.lo, run.hi - run.lo);
    // The new mapping gets the program's protections where they differ from read-write.
    for (const auto& p : prots) {
      if (p.prot == (os::vm_query::kRead | os::vm_query::kWrite)) continue;
      const uint64_t lo = p.begin - r.addr, hi = p.end - r.addr;
      bool committed = false;
      for (const Run& run : runs) committed |= run.lo < hi && lo < run.hi;
      if (committed) os::prim::protect_prot(stage + lo, hi - lo, p.prot);
    }
    if (int e = os::prim::move_mapping(staging, r.size, addr)) {
      restore_source();
      if (shared_target)
        for (const Run& run : runs) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
      return drop_staging(CXLPOOL_E_OS, e, "move: mremap");
    }
    if (by_uffd)
      os::write_fence::lift_uffd_replaced(uf);
    else
      os::write_fence::lift(slot);
    // The source's memory: anonymous and private pages went with the old mapping; pages of a
    // shared file mapping stay in the file until punched out.
    if (!src.anonymous() && mapped_shared(r) && caps_.decommit_frees_memory && src.valid_fd() >= 0)
      for (const Run& run : runs) os::prim::punch_hole(src.fd(), r.offset + run.lo, run.hi - run.lo);
  }

  // Bookkeeping: the reservation, its committed offsets and its bytes now belong to to.
  uint64_t removed = 0;
  try {
    for (const Run& run : runs) {
      removed += src.committed.erase(r.offset + run.lo, r.offset + run.hi);
      dst->committed.insert(moved.offset + run.lo, moved.offset + run.hi);
    }
  } catch (...) {
    // Out of host memory for the interval tables: the bytes moved; a later decommit of this
    // range may under-count on the target (never counts anything twice).
  }
  account(src, 0, removed, r.client);
  to.account(*dst, bytes, 0, r.client);
  if (!src.anonymous()) src.give_back_range(r.offset, r.size);
  reserved_bytes_ -= r.size;
  to.reserved_bytes_ += r.size;
  reservations_.erase(it);
  out.bytes = bytes;
  return CXLPOOL_OK;
}

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// Movable residency (device.hpp, Device::move_reservation): a reservation's bytes move to
// another device under the same virtual address. NUMA to NUMA the kernel migrates the pages;
// every other pair copies into a staging mapping of the target's storage while writers are
// fenced (os/write_fence.hpp: a kernel-mode userfaultfd, or no copy at all), then swaps the
// mapping in with one mremap, the program's page protections kept. Bookkeeping (reservation,
// committed offsets, ledgers) moves with the bytes, under both devices' locks; the bytes
// themselves move with neither held.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "device/device.hpp"
#include "device/move_gate.hpp"
#include "os/io_pins.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/vm_query.hpp"
#include "os/write_fence.hpp"

namespace cxlpool::detail {

namespace {

namespace vmq = os::vm_query;
namespace io_pins = os::io_pins;

// The range's protections now, as runs; NOT_SUPPORTED when it has too many to follow.
int read_protections(uintptr_t b, uintptr_t e, std::vector<vmq::ProtRun>* out) noexcept {
  try {
    out->resize(64);
    size_t n = 0;
    for (int err; (err = vmq::protection_runs(b, e, out->data(), out->size(), &n));) {
      if (err != ENOSPC || out->size() >= 65536) return err;
      out->resize(out->size() * 4);
    }
    out->resize(n);
  } catch (...) {
    return ENOMEM;
  }
  return 0;
}

bool same_protections(const std::vector<vmq::ProtRun>& a, const std::vector<vmq::ProtRun>& b, int drop) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].begin != b[i].begin || a[i].end != b[i].end ||
        (a[i].prot < 0 ? a[i].prot : a[i].prot & ~drop) != b[i].prot)
      return false;
  return true;
}

// Holds every asynchronous signal away from this thread while a fence is up: a handler that
// wrote the fenced range would wait on the fence this thread holds.
struct AsyncSignalsHeld {
  alignas(16) unsigned char saved[os::prim::kSignalMaskBytes];
  AsyncSignalsHeld() noexcept { os::prim::block_async_signals(saved); }
  ~AsyncSignalsHeld() { os::prim::restore_signals(saved); }
};

constexpr uint64_t kPopulatePiece = uint64_t(16) << 20;
constexpr unsigned kBusyRetries = 7;  // 1 + 2 + ... + 64 ms of waiting at most

const char* io_pins_refusal(const io_pins::Result& r) noexcept {
  return r.verdict == io_pins::Verdict::kOverlap
             ? "move: part of the range is an io_uring registered buffer (the kernel reads and writes those pages "
               "directly): not moved"
             : "move: an io_uring ring's registered buffers could not be read (/proc/self/fdinfo: the ring was busy "
               "or /proc unreadable): not moved";
}

}  // namespace

cxlpool_status_t Device::staged_copy(const Reservation& r, const std::vector<Run>& runs, Storage& dst,
                                     uint64_t new_offset, bool shared_mapping, size_t to_ps,
                                     DeviceError* err) noexcept {
  void* const addr = reinterpret_cast<void*>(r.addr);
  // Without a fence that holds system calls (write_fence.hpp) a copy would fail the program's
  // reads into the range with EFAULT, or lose them: no copy.
  if (os::write_fence::probe().mode != os::write_fence::Mode::kKernel)
    return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, EPERM,
                          "move: no write fence that holds system calls here (userfaultfd is user-mode only or "
                          "unavailable: cxlpool_tiering_stats_json says why): not moved");
  // The range as the program has it, read before anything is mapped (a range that cannot
  // move costs two /proc reads, not a staged copy): what it made unreadable is not ours to
  // read, and attributes it set (mlock, MADV_DONTDUMP, WIPEONFORK, DONTFORK) would be lost
  // with the mapping, so such ranges do not move; THP hints are carried over.
  std::vector<vmq::ProtRun> prots, now;
  if (int e = read_protections(r.addr, r.addr + r.size, &prots))
    return device_failure(err, e == ENOSPC ? CXLPOOL_E_NOT_SUPPORTED : CXLPOOL_E_OS, e, "move: /proc/self/maps");
  for (const Run& run : runs)
    for (const auto& p : prots)
      if (p.begin < r.addr + run.hi && r.addr + run.lo < p.end && (p.prot < 0 || !(p.prot & vmq::kRead)))
        return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0,
                              "move: the program made part of the range unreadable (its protections are kept: not "
                              "moved)");
  unsigned flags = 0;
  if (int e = vmq::vma_flags(r.addr, r.addr + r.size, &flags))
    return device_failure(err, CXLPOOL_E_OS, e, "move: /proc/self/smaps");
  if (flags & (vmq::kVmLocked | vmq::kVmDontDump | vmq::kVmWipeOnFork | vmq::kVmDontCopy))
    return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0,
                          "move: the program set attributes on the range (mlock, MADV_DONTDUMP, MADV_WIPEONFORK or "
                          "MADV_DONTFORK) that a new mapping would lose: not moved");
  // Under an RLIMIT_AS the staging copy holds address space the program may need meanwhile:
  // at most half of what the limit leaves, or the unit stays where it is.
  const size_t headroom = os::prim::address_space_headroom();
  if (headroom != SIZE_MAX && r.size > headroom / 2)
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "move: staging address space (RLIMIT_AS)");
  void* staging = nullptr;
  if (int e = os::prim::reserve(r.size, to_ps, &staging))
    return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "move: staging address space");
  auto* stage = static_cast<char*>(staging);
  const bool shared_target = !dst.anonymous() && shared_mapping;
  auto drop_staging = [&](cxlpool_status_t status, int e, const char* call) {
    if (shared_target)
      for (const Run& run : runs) os::prim::advise_remove(stage + run.lo, run.hi - run.lo);
    os::prim::unmap(staging, r.size);
    return device_failure(err, status, e, call);
  };
  if (int e = dst.map(staging, r.size, new_offset, shared_mapping)) {
    os::prim::unmap(staging, r.size);
    return device_failure(err, CXLPOOL_E_OS, e, "move: mapping the target");
  }
  // Every target page is faulted in before the fence goes up, in one call per run (much
  // cheaper than a fault per page during the copy, and the fenced window only copies).
  for (const Run& run : runs) {
    if (int e = os::prim::protect(stage + run.lo, run.hi - run.lo, true))
      return drop_staging(CXLPOOL_E_OS, e, "move: mprotect(staging)");
    // The target's room is taken as commit() takes it, before anything is copied: a full
    // filesystem is CAPACITY here (the move is skipped), not SIGBUS in the copy or later.
    if (shared_target)
      if (int e = dst.reserve_room(stage + run.lo, new_offset + run.lo, run.hi - run.lo))
        return drop_staging(e == ENOSPC || e == EDQUOT || e == EFBIG || e == ENOMEM ? CXLPOOL_E_CAPACITY : CXLPOOL_E_OS,
                            e, "move: fallocate(target)");
    // In pieces: one call holds the process's mmap lock for reading throughout, and every
    // mprotect and mmap of the program (and every commit) waits behind it.
    int e = 0;
    for (uint64_t at = run.lo; at < run.hi && !e; at += kPopulatePiece)
      e = os::prim::populate_write(stage + at, std::min<uint64_t>(kPopulatePiece, run.hi - at));
    if (e && e != EINVAL)  // EINVAL: a kernel before 5.14, the copy faults them in
      return drop_staging(e == ENOMEM || e == EFAULT ? CXLPOOL_E_CAPACITY : CXLPOOL_E_OS, e,
                          "move: madvise(POPULATE_WRITE)");
  }
  if (flags & (vmq::kVmNoHugePage | vmq::kVmHugePage))
    os::prim::advise_thp(staging, r.size, (flags & vmq::kVmHugePage) != 0);
  // Fence the writers, system calls included: they wait in the kernel until the new mapping
  // is in place.
  AsyncSignalsHeld held;
  os::write_fence::UffdFence uf;
  if (const int fe = os::write_fence::raise_uffd(addr, r.size, &uf))
    return drop_staging(
        CXLPOOL_E_NOT_SUPPORTED, fe,
        fe == EBUSY    ? "move: the range is registered with a userfaultfd of the program's (not taken over)"
        : fe == EINVAL ? "move: userfaultfd cannot write-protect this memory (a file on a disk filesystem, or "
                         "device DAX), and no other fence holds system calls: not moved"
                       : "move: write fence");
  auto lift_in_place = [&] { os::write_fence::lift_uffd_in_place(uf); };
  // Under the fence nothing new can pin the range for writing (get_user_pages waits on it):
  // the buffers registered now, and the reads running now, are all there will be until the
  // swap. A read that pinned the old pages before the fence (O_DIRECT: the device writes them
  // until the call returns) would land its bytes in pages the program no longer sees.
  // A ring whose list cannot be read now (a registration or submission holds its lock) is
  // asked again a few times.
  if (const io_pins::Result pins = io_pins::registered_buffers(r.addr, r.addr + r.size, 8);
      pins.verdict != io_pins::Verdict::kClear) {
    lift_in_place();
    return drop_staging(CXLPOOL_E_NOT_SUPPORTED, pins.verdict == io_pins::Verdict::kOverlap ? EBUSY : pins.error,
                        io_pins_refusal(pins));
  }
  if (const io_pins::Result reads = io_pins::reads_in_flight(r.addr, r.addr + r.size);
      reads.verdict != io_pins::Verdict::kClear) {
    lift_in_place();
    return drop_staging(CXLPOOL_E_NOT_SUPPORTED, reads.verdict == io_pins::Verdict::kOverlap ? EBUSY : reads.error,
                        reads.verdict == io_pins::Verdict::kOverlap
                            ? "move: a thread is inside a read system call into the range (an O_DIRECT read keeps the "
                              "old pages pinned until it returns): not moved"
                        : reads.error == EAGAIN
                            ? "move: a thread stayed on a CPU while the range was fenced and may be inside a read it "
                              "began before (its pages pinned): not moved now"
                            : "move: the threads' system calls could not be read (/proc/self/task): not moved");
  }
  // The copy reads as the kernel does for another process: a page the program makes
  // unreadable meanwhile is an error here, not a fault in cxlpool's thread.
  const auto* from = static_cast<const char*>(addr);
  for (const Run& run : runs)
    if (int e = os::prim::copy_checked(stage + run.lo, from + run.lo, run.hi - run.lo)) {
      lift_in_place();
      return drop_staging(CXLPOOL_E_NOT_SUPPORTED, e,
                          "move: the program made part of the range unreadable while it moved (not moved)");
    }
  // Nothing may have changed under the fence: the program's protections (mprotect is not held
  // by it), and the fence itself (a program that closes cxlpool's userfaultfd releases it).
  const bool protections_kept = read_protections(r.addr, r.addr + r.size, &now) == 0 && same_protections(prots, now, 0);
  if (!protections_kept || !os::write_fence::uffd_fence_intact(uf)) {
    lift_in_place();
    return drop_staging(CXLPOOL_E_NOT_SUPPORTED, 0,
                        protections_kept
                            ? "move: the program closed cxlpool's userfaultfd while the range moved (not "
                              "moved; its writes went to the old pages, which stay)"
                            : "move: the program changed the range's protections while it moved (not moved)");
  }
  // The new mapping gets the program's protections where they differ from read-write.
  for (const auto& p : prots) {
    if (p.prot == (vmq::kRead | vmq::kWrite)) continue;
    const uint64_t lo = p.begin - r.addr, hi = p.end - r.addr;
    bool committed = false;
    for (const Run& run : runs) committed |= run.lo < hi && lo < run.hi;
    if (committed) os::prim::protect_prot(stage + lo, hi - lo, p.prot);
  }
  if (int e = os::prim::move_mapping(staging, r.size, addr)) {
    lift_in_place();
    return drop_staging(CXLPOOL_E_OS, e, "move: mremap");
  }
  os::write_fence::lift_uffd_replaced(uf);
  return CXLPOOL_OK;
}

bool Device::copy_fenceable() const {
  // Moves take private ranges only, and those are anonymous memory (numa), or anonymous memory
  // under the file's policy (memfd, shm, file: Storage::map) on any filesystem but hugetlbfs,
  // which the fence covers too. Device-DAX pages are the device's own.
  return !provider_->device_node;
}

namespace {
std::atomic<Device::MoveHook> g_move_hook{nullptr};
std::atomic<void*> g_move_hook_ctx{nullptr};
}  // namespace

void Device::set_move_hook(MoveHook hook, void* ctx) noexcept {
  g_move_hook_ctx.store(ctx);
  g_move_hook.store(hook);
}

// Three steps: under both devices' locks the move is checked and the target's room taken (its
// ledger, offsets and table entry); then the bytes move with no device lock held, the range
// marked as moving on both sides (its own commits, decommits and releases wait; nothing else
// does); then, under both locks again, the bookkeeping moves or the first step is undone.
cxlpool_status_t Device::move_reservation(void* addr, Device& to, MoveReport* report, DeviceError* err) noexcept {
  MoveReport local;
  MoveReport& out = report ? *report : local;
  out = MoveReport{};
  if (&to == this) return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0, "move to the same device");
  move_gate::Scope moving;  // fork() waits for this move (move_gate.hpp)
  std::unique_lock<std::mutex> lock_from(mu_, std::defer_lock), lock_to(to.mu_, std::defer_lock);
  std::lock(lock_from, lock_to);
  const uintptr_t key = reinterpret_cast<uintptr_t>(addr);
  auto it = reservations_.find(key);
  if (it == reservations_.end()) return device_failure(err, CXLPOOL_E_NOT_FOUND, 0, "move");
  // Another thread moves it now (its caller should have excluded that): not waited for here,
  // as that move ends under both locks.
  if (it->second.leaving || it->second.arriving || to.reservations_.count(key))
    return device_failure(err, CXLPOOL_E_BUSY, 0, "move: the range is moving already");
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
  if (to.committed() + bytes > to.capacity())
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "move: target capacity");
  std::shared_ptr<Storage> dst;
  if (cxlpool_status_t s = to.storage_for(Sharing::kPrivate, dst, err)) return s;
  std::shared_ptr<Storage> src_storage = r.storage;
  Storage& src = *src_storage;

  const bool by_kernel = src.anonymous() && dst->anonymous() && dst->numa_node() >= 0;
  // A copy holds a staging mapping as split as the reservation until the swap.
  if (!by_kernel && !vma_room_for(r.vmas))
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "VMA budget", vma_use().budget);
  uint64_t new_offset = r.addr;  // anonymous storage counts addresses
  if (!dst->anonymous()) {
    uint64_t largest = 0;
    int e = dst->take_mappable_range(r.size, size_t(2) << 20, &new_offset, &largest);
    if (e == ENOSPC) return device_failure(err, CXLPOOL_E_CAPACITY, 0, "move: target offsets");
    if (e) return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "move: target offsets");
  }
  Reservation moved = r;
  moved.storage = dst;
  moved.offset = new_offset;
  moved.arriving = true;
  // The target's table gets its entry first (the one step that allocates), so that nothing
  // after the bytes moved can fail.
  try {
    to.reservations_.emplace(moved.addr, moved);
  } catch (...) {
    if (!dst->anonymous()) dst->give_back_range(new_offset, r.size);
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "move: reservation table");
  }
  // The bytes count on the target from now: no commit there takes the room they need.
  to.account(*dst, bytes, 0, r.client);
  it->second.leaving = true;
  const bool target_shared_mapping = to.mapped_shared(moved);
  const bool source_shared_mapping = mapped_shared(r);
  lock_to.unlock();
  lock_from.unlock();

  // The bytes move, no device lock held.
  if (MoveHook hook = g_move_hook.load()) hook(g_move_hook_ctx.load());
  cxlpool_status_t st = CXLPOOL_OK;
  if (by_kernel) {
    // NUMA to NUMA: the kernel moves the pages in place and the policy follows.
    size_t left = 0;
    if (int e = os::prim::move_to_node(addr, r.size, dst->numa_node(), &left)) {
      // A full target (ENOMEM) is found after the kernel moved what fitted and bound the range
      // there: the pages and the source's policy go back, so that nothing is counted on the
      // wrong device and later faults do not land on (or OOM-kill for) the full node.
      size_t back = 0;
      if (src.numa_node() >= 0)
        os::prim::move_to_node(addr, r.size, src.numa_node(), &back);
      else
        os::prim::clear_policy(addr, r.size);
      st = device_failure(err, e == ENOMEM ? CXLPOOL_E_CAPACITY : CXLPOOL_E_OS, e, "mbind(MPOL_MF_MOVE)");
    } else {
      out.by_kernel = true;
      out.pages_left_behind = left;
    }
  } else {
    // A thread that stayed on a CPU through every look under the fence (a busy machine) may
    // be inside a read into the range: "not now", not "never". Asked again a few times, with
    // no lock held, before the move is given up.
    DeviceError mine;
    DeviceError* e = err ? err : &mine;
    for (unsigned attempt = 0;; ++attempt) {
      st = staged_copy(r, runs, *dst, new_offset, target_shared_mapping, to_ps, e);
      if (st != CXLPOOL_E_NOT_SUPPORTED || e->os_errno != EAGAIN || attempt == kBusyRetries) break;
      os::prim::sleep_ms(1u << attempt);
    }
    // The source's memory: anonymous and private pages went with the old mapping; pages of a
    // shared file mapping stay in the file until punched out.
    if (st == CXLPOOL_OK && !src.anonymous() && source_shared_mapping && caps_.decommit_frees_memory &&
        src.valid_fd() >= 0)
      for (const Run& run : runs) os::prim::punch_hole(src.fd(), r.offset + run.lo, run.hi - run.lo);
  }

  std::lock(lock_from, lock_to);
  auto arrived = to.reservations_.find(key);
  auto left_here = reservations_.find(key);
  if (st != CXLPOOL_OK) {
    to.reservations_.erase(arrived);
    to.account(*dst, 0, bytes, r.client);
    if (!dst->anonymous()) dst->give_back_range(new_offset, r.size);
    left_here->second.leaving = false;
  } else {
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
    if (!src.anonymous()) src.give_back_range(r.offset, r.size);
    reserved_bytes_ -= r.size;
    to.reserved_bytes_ += r.size;
    arrived->second.arriving = false;
    reservations_.erase(left_here);
    out.bytes = bytes;
  }
  lock_to.unlock();
  lock_from.unlock();
  moved_.notify_all();
  to.moved_.notify_all();
  return st;
}

}  // namespace cxlpool::detail

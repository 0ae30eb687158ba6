// SPDX-License-Identifier: MIT
// Device::move_reservation between real NUMA nodes in the guest (node0 <-> node1), its error
// matrix: pages the kernel cannot move (pinned by vmsplice), a full target node (refused as
// CAPACITY and undone), uncommitted and unmapped parts of a range, and later faults landing
// on the new node. Every page is checked with move_pages status queries; prints ok/FAIL lines.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/names.hpp"
#include "device/device.hpp"
#include "vm_numa.hpp"

using cxlpool::detail::BackingSpec;
using cxlpool::detail::Device;
using cxlpool::detail::DeviceError;
using cxlpool::detail::Sharing;
using vmtest::count_on;
using vmtest::kPage;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr int kClient = 1;
int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

std::unique_ptr<Device> numa_device(int node, uint64_t capacity) {
  static int counter = 0;
  BackingSpec spec;
  spec.device_name = "node" + std::to_string(node) + "-" + std::to_string(++counter);
  spec.kind = CXLPOOL_BACKING_NUMA;
  spec.numa_node = node;
  spec.capacity = capacity;
  return std::make_unique<Device>(spec);
}

void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512) p[i] = static_cast<unsigned char>(seed + i / 512);
}
bool holds(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512)
    if (p[i] != static_cast<unsigned char>(seed + i / 512)) return false;
  return true;
}

std::string status_name(cxlpool_status_t s) { return cxlpool::detail::status_name(s); }

bool bound_to(const void* p, int node) {
  int mode = -1;
  unsigned long mask = 0;
  return vmtest::policy_at(p, &mode, &mask) && mode == vmtest::kMpolBind && mask == (1UL << node);
}
// "bind 0x2" etc., for messages.
std::string policy_text(const void* p) {
  int mode = -1;
  unsigned long mask = 0;
  if (!vmtest::policy_at(p, &mode, &mask)) return std::string("get_mempolicy: ") + std::strerror(errno);
  char buf[64];
  std::snprintf(buf, sizeof buf, "mode %d nodes 0x%lx", mode, mask);
  return buf;
}

// What makes the kernel refuse to move a page, as seen from user space (printed, not asserted:
// the library's checks below are what must hold).
void kernel_facts_busy() {
  // Two threads migrating the same pages: a page the other one has isolated is -EBUSY.
  constexpr size_t kPages = 256;
  auto* buf =
      static_cast<char*>(mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(buf, kPages * kPage, MADV_NOHUGEPAGE);
  std::memset(buf, 1, kPages * kPage);
  std::atomic<bool> stop{false};
  std::atomic<long> ebusy{0}, calls{0};
  auto mover = [&](int first) {
    std::vector<void*> pages(kPages);
    std::vector<int> nodes(kPages), status(kPages);
    for (size_t i = 0; i < kPages; ++i) pages[i] = buf + i * kPage;
    for (int target = first; !stop.load(); target ^= 1) {
      for (auto& n : nodes) n = target;
      syscall(SYS_move_pages, 0, kPages, pages.data(), nodes.data(), status.data(), 0);
      ++calls;
      for (int s : status) ebusy += s == -EBUSY;
    }
  };
  std::thread a(mover, 0), b(mover, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  a.join();
  b.join();
  std::printf("kernel: two threads migrating the same 256 pages: %ld -EBUSY statuses in %ld move_pages calls\n",
              ebusy.load(), calls.load());
  munmap(buf, kPages * kPage);
}

// Pages pinned by vmsplice (the pipe holds references to them until read) cannot migrate:
// the move succeeds and reports them as left behind; once the pipe is read they move.
void busy_pages() {
  std::printf("--- pages the kernel cannot move (vmsplice)\n");
  kernel_facts_busy();
  auto near = numa_device(0, 256 * kMiB), far = numa_device(1, 256 * kMiB);
  constexpr size_t kSize = kMiB, kPages = kSize / kPage, kPinFirst = 100, kPinned = 8;
  void* base = nullptr;
  DeviceError err{};
  if (near->reserve(kSize, 2 * kMiB, 0, Sharing::kPrivate, kClient, &base, &err) != CXLPOOL_OK ||
      near->commit(base, kSize, true, kClient, &err) != CXLPOOL_OK) {
    check(false, "busy: reserve and commit 1 MiB on node0");
    return;
  }
  auto* p = static_cast<unsigned char*>(base);
  fill(p, kSize, 3);
  check(count_on(p, kPages, 0).on == kPages, "busy: all 256 pages on node0 before the move (control)");
  int pipefd[2];
  if (pipe(pipefd) != 0) return;
  iovec iov{p + kPinFirst * kPage, kPinned * kPage};
  ssize_t spliced = vmsplice(pipefd[1], &iov, 1, 0);
  check(spliced == ssize_t(kPinned * kPage), "busy: 8 pages spliced into a pipe (the pipe holds them)");
  // What the kernel says about them: mbind without MPOL_MF_STRICT returns 0, with it EIO;
  // move_pages returns how many pages it did not move and sets no -EBUSY status.
  {
    std::vector<void*> pages(kPinned);
    std::vector<int> nodes(kPinned, 1), status(kPinned, 99);
    for (size_t i = 0; i < kPinned; ++i) pages[i] = p + (kPinFirst + i) * kPage;
    long mp = syscall(SYS_move_pages, 0, kPinned, pages.data(), nodes.data(), status.data(), 0);
    long strict = vmtest::mbind_node(p + kPinFirst * kPage, kPinned * kPage, vmtest::kMpolBind, 1, vmtest::kMfMove | 1);
    int strict_errno = errno;
    vmtest::mbind_node(p + kPinFirst * kPage, kPinned * kPage, vmtest::kMpolBind, 0, vmtest::kMfMove);  // as before
    std::printf(
        "kernel: pinned pages: move_pages -> %ld (pages not moved), status[0] %d (99 = not written); "
        "mbind(MPOL_MF_MOVE|MPOL_MF_STRICT) -> %ld errno %d (%s)\n",
        mp, status[0], strict, strict ? strict_errno : 0, strict ? std::strerror(strict_errno) : "-");
  }
  Device::MoveReport rep;
  cxlpool_status_t st = near->move_reservation(base, *far, &rep, &err);
  check(st == CXLPOOL_OK && rep.by_kernel && rep.bytes == kSize,
        "busy: the move succeeds, by the kernel, 1 MiB committed (status " + status_name(st) + ")");
  check(rep.pages_left_behind == kPinned,
        "busy: it reports the 8 pinned pages as left behind (" + std::to_string(rep.pages_left_behind) + ")");
  std::vector<int> where = vmtest::nodes_of(p, kPages);
  size_t pinned_on0 = 0, rest_on1 = 0;
  for (size_t i = 0; i < kPages; ++i) {
    bool pinned = i >= kPinFirst && i < kPinFirst + kPinned;
    pinned_on0 += pinned && where[i] == 0;
    rest_on1 += !pinned && where[i] == 1;
  }
  check(pinned_on0 == kPinned && rest_on1 == kPages - kPinned,
        "busy: move_pages finds exactly the pinned pages on node0 (" + std::to_string(pinned_on0) + "/8), the other " +
            std::to_string(rest_on1) + "/248 on node1");
  check(far->committed() == kSize && near->committed() == 0 && far->reservation_count() == 1 &&
            near->reservation_count() == 0,
        "busy: the reservation and its 1 MiB belong to node1's device");
  check(holds(p, kSize, 3), "busy: every byte intact");
  std::vector<unsigned char> piped(kPinned * kPage);
  ssize_t got = read(pipefd[0], piped.data(), piped.size());
  check(got == ssize_t(piped.size()) && std::memcmp(piped.data(), p + kPinFirst * kPage, piped.size()) == 0,
        "busy: the pipe read back the same bytes");
  close(pipefd[0]);
  close(pipefd[1]);
  // Released: every page moves now, both ways.
  st = far->move_reservation(base, *near, &rep, &err);
  check(st == CXLPOOL_OK && rep.pages_left_behind == 0 && count_on(p, kPages, 0).on == kPages,
        "busy: once the pipe is read, a move to node0 takes all 256 pages (" +
            vmtest::describe(count_on(p, kPages, 0)) + ")");
  st = near->move_reservation(base, *far, &rep, &err);
  check(st == CXLPOOL_OK && rep.pages_left_behind == 0 && count_on(p, kPages, 1).on == kPages,
        "busy: and back to node1, all 256 pages");
  // mlock does not make pages busy: locked pages migrate.
  bool locked = mlock(p, kSize) == 0;
  st = far->move_reservation(base, *near, &rep, &err);
  check(locked && st == CXLPOOL_OK && rep.pages_left_behind == 0 && count_on(p, kPages, 0).on == kPages,
        "busy: mlock()ed pages are not busy: all 256 move to node0");
  munlock(p, kSize);
  check(holds(p, kSize, 3) && near->committed() == kSize && far->committed() == 0, "busy: bytes and ledgers after");
  near->release(base, kClient, nullptr);
}

// A target node without room: the move is refused as CAPACITY and undone (pages, policy,
// ledgers); the same move succeeds once the node has room again.
void full_node() {
  std::printf("--- target node full\n");
  auto near = numa_device(0, 512 * kMiB), far = numa_device(1, 512 * kMiB);
  // 64 MiB: well above what a node the filler left "full" may still find (MemFree misses the
  // free pages on per-CPU lists, tens of MiB here, which an allocation that must succeed there
  // drains), so that the kernel really runs out during the move.
  constexpr size_t kSize = 64 * kMiB, kPages = kSize / kPage;
  const std::string mib = std::to_string(kSize >> 20) + " MiB", pages = std::to_string(kPages) + " pages";
  void* base = nullptr;
  DeviceError err{};
  if (near->reserve(kSize, 2 * kMiB, 0, Sharing::kPrivate, kClient, &base, &err) != CXLPOOL_OK ||
      near->commit(base, kSize, true, kClient, &err) != CXLPOOL_OK) {
    check(false, "full: reserve and commit " + mib + " on node0");
    return;
  }
  auto* p = static_cast<unsigned char*>(base);
  fill(p, kSize, 5);
  auto unchanged = [&](const std::string& what) {
    check(near->committed() == kSize && far->committed() == 0 && near->ledger().by_client[kClient].load() == kSize &&
              far->ledger().by_client[kClient].load() == 0 && near->reservation_count() == 1 &&
              far->reservation_count() == 0 && near->reserved_bytes() == kSize && far->reserved_bytes() == 0,
          what + ": ledgers and reservation tables unchanged (" + mib + " on node0's device)");
    check(holds(p, kSize, 5), what + ": every byte intact and readable");
    vmtest::Count c = count_on(p, kPages, 0);
    check(c.on == kPages, what + ": all " + pages + " on node0 (" + vmtest::describe(c) + ")");
    check(bound_to(p, 0) && bound_to(p + kSize - kPage, 0),
          what + ": the range is still bound to node0 (" + policy_text(p) + ")");
  };
  {
    vmtest::NodeFiller filler(1, 1536 * kMiB);
    std::printf("node1 filled with %zu MiB of other memory; node1 MemFree %ld KiB\n", filler.on_node() >> 20,
                vmtest::node_free_kib(1));
    {
      // What the kernel says: mbind(MPOL_MF_MOVE) without MPOL_MF_STRICT does not report it.
      auto* probe =
          static_cast<char*>(mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      madvise(probe, kSize, MADV_NOHUGEPAGE);
      std::memset(probe, 1, kSize);
      long mb = vmtest::mbind_node(probe, kSize, vmtest::kMpolBind, 1, vmtest::kMfMove);
      vmtest::Count c = count_on(probe, kPages, 1);
      std::vector<void*> addrs;
      for (size_t i = 0; i < kPages; ++i)
        if (count_on(probe + i * kPage, 1, 1).on == 0) addrs.push_back(probe + i * kPage);
      std::vector<int> nodes(addrs.size(), 1), status(addrs.size(), 99);
      long mp = syscall(SYS_move_pages, 0, addrs.size(), addrs.data(), nodes.data(), status.data(), 0);
      int mp_errno = errno;
      std::printf(
          "kernel: %s of plain memory into the full node1: mbind(MPOL_MF_MOVE) -> %ld, %zu/%zu pages moved; "
          "move_pages of the rest -> %ld %s\n",
          mib.c_str(), mb, c.on, kPages, mp, mp < 0 ? std::strerror(mp_errno) : "");
      munmap(probe, kSize);
    }
    Device::MoveReport rep;
    cxlpool_status_t st = near->move_reservation(base, *far, &rep, &err);
    check(st == CXLPOOL_E_CAPACITY, "full: moving " + mib + " into the full node1 is CAPACITY (status " +
                                        status_name(st) + ", errno " + std::to_string(err.os_errno) + ")");
    std::printf("  %s\n", near->describe("move", base, kSize, err).c_str());
    unchanged("full");
    // The range is bound to node0 again, so new faults land there (bound to the full node1 they
    // would OOM-kill a process).
    near->decommit(p, kMiB, kClient, nullptr);
    st = near->commit(p, kMiB, true, kClient, &err);
    fill(p, kMiB, 5);
    check(st == CXLPOOL_OK && count_on(p, kMiB / kPage, 0).on == kMiB / kPage,
          "full: pages committed after the refusal land on node0");
    // Some room, less than the range: the kernel moves part of it before it runs out.
    filler.make_room(8 * kMiB);
    std::printf("node1 MemFree %ld KiB after freeing 8 MiB of the filler\n", vmtest::node_free_kib(1));
    st = near->move_reservation(base, *far, &rep, &err);
    long free_after = vmtest::node_free_kib(1);
    check(st == CXLPOOL_E_CAPACITY,
          "full, 8 MiB free: moving " + mib + " is CAPACITY (status " + status_name(st) + ")");
    std::printf("node1 MemFree %ld KiB after the refused move (what the kernel moved came back)\n", free_after);
    unchanged("full, 8 MiB free");
    {
      // The same conditions for plain memory: mbind moves part of it before the node runs out,
      // which is what the refused move had to undo.
      auto* probe =
          static_cast<char*>(mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      madvise(probe, kSize, MADV_NOHUGEPAGE);
      std::memset(probe, 1, kSize);
      long mb = vmtest::mbind_node(probe, kSize, vmtest::kMpolBind, 1, vmtest::kMfMove);
      std::printf("kernel: %s of plain memory into node1 with %ld KiB free: mbind -> %ld, %zu/%zu pages moved\n",
                  mib.c_str(), free_after, mb, count_on(probe, kPages, 1).on, kPages);
      munmap(probe, kSize);
    }
  }
  // Control: with node1's room back the same move succeeds (the refusals were about room).
  Device::MoveReport rep;
  cxlpool_status_t st = near->move_reservation(base, *far, &rep, &err);
  check(st == CXLPOOL_OK && rep.pages_left_behind == 0 && count_on(p, kPages, 1).on == kPages && holds(p, kSize, 5) &&
            far->committed() == kSize && near->committed() == 0 && bound_to(p, 1),
        "full, control: with the filler gone the same move succeeds: " + pages + " on node1, " + mib +
            " on its device (" + status_name(st) + ", " + policy_text(p) + ")");
  far->release(base, kClient, nullptr);
}

// Uncommitted (inaccessible), committed-but-never-touched and decommitted pages of a range are
// skipped, not errors, and their later faults land on the new node; a range with a hole
// unmapped behind the device's back is refused with nothing changed.
void holes() {
  std::printf("--- uncommitted and unmapped parts\n");
  auto near = numa_device(0, 256 * kMiB), far = numa_device(1, 256 * kMiB);
  constexpr size_t kSize = 4 * kMiB, kPages = kSize / kPage, kHalf = kMiB / 2;
  void* base = nullptr;
  DeviceError err{};
  if (near->reserve(kSize, 2 * kMiB, 0, Sharing::kPrivate, kClient, &base, &err) != CXLPOOL_OK) {
    check(false, "holes: reserve 4 MiB on node0");
    return;
  }
  auto* p = static_cast<unsigned char*>(base);
  // [0, 1M) and [3M, 4M) committed and written; [1M, 1.5M) committed, never touched;
  // [1.5M, 2M) written then decommitted; [2M, 3M) never committed (PROT_NONE).
  bool ok = near->commit(p, kMiB, true, kClient, &err) == CXLPOOL_OK &&
            near->commit(p + 3 * kMiB, kMiB, true, kClient, &err) == CXLPOOL_OK &&
            near->commit(p + kMiB, kHalf, false, kClient, &err) == CXLPOOL_OK &&
            near->commit(p + kMiB + kHalf, kHalf, true, kClient, &err) == CXLPOOL_OK;
  fill(p, kMiB, 7);
  fill(p + 3 * kMiB, kMiB, 8);
  fill(p + kMiB + kHalf, kHalf, 9);
  ok = ok && near->decommit(p + kMiB + kHalf, kHalf, kClient, &err) == CXLPOOL_OK;
  check(ok && near->committed() == 2 * kMiB + kHalf, "holes: 2.5 MiB committed, of which 2 MiB present");
  check(count_on(p, kPages, 0).on == 512, "holes: 512 pages present, on node0 (control)");
  Device::MoveReport rep;
  cxlpool_status_t st = near->move_reservation(base, *far, &rep, &err);
  check(st == CXLPOOL_OK && rep.by_kernel && rep.bytes == 2 * kMiB + kHalf && rep.pages_left_behind == 0,
        "holes: the move succeeds; 2.5 MiB committed moved, no page left behind (status " + status_name(st) + ")");
  vmtest::Count present = count_on(p, kMiB / kPage, 1), tail = count_on(p + 3 * kMiB, kMiB / kPage, 1),
                gap = count_on(p + kMiB, 2 * kMiB / kPage, 1);
  check(present.on == 256 && tail.on == 256 && gap.absent == 512,
        "holes: present pages on node1 (" + std::to_string(present.on + tail.on) +
            "/512); the 512 uncommitted or decommitted pages still absent (" + std::to_string(gap.absent) + ")");
  check(far->committed() == 2 * kMiB + kHalf && near->committed() == 0, "holes: the 2.5 MiB are node1's device's");
  check(holds(p, kMiB, 7) && holds(p + 3 * kMiB, kMiB, 8), "holes: bytes intact");
  // The policy moved with the pages: every later fault of the range lands on node1.
  std::memset(p + kMiB, 1, kHalf);  // committed before the move, first touched now
  ok = far->commit(p + kMiB + kHalf, kHalf, true, kClient, &err) == CXLPOOL_OK &&
       far->commit(p + 2 * kMiB, kMiB, true, kClient, &err) == CXLPOOL_OK;
  fill(p + 2 * kMiB, kMiB, 10);
  vmtest::Count later = count_on(p + kMiB, 2 * kMiB / kPage, 1);
  check(ok && later.on == 512,
        "holes: pages first touched or committed after the move land on node1 (" + vmtest::describe(later) + ")");
  check(far->committed() == kSize && bound_to(p, 1) && bound_to(p + 2 * kMiB, 1),
        "holes: 4 MiB committed on node1's device (" + std::to_string(far->committed() >> 10) +
            " KiB), the whole range bound to node1 (" + policy_text(p) + "; " + policy_text(p + 2 * kMiB) + ")");
  // A hole unmapped behind the device's back: mbind refuses the range with EFAULT before it
  // changes anything; the move fails and nothing moves.
  munmap(p + kHalf, 4 * kPage);
  st = far->move_reservation(base, *near, &rep, &err);
  check(st == CXLPOOL_E_OS && err.os_errno == EFAULT,
        "holes: a range with 4 pages unmapped by someone else is refused: " + status_name(st) + ", " +
            std::strerror(err.os_errno));
  vmtest::Count after = count_on(p + kMiB, 3 * kMiB / kPage, 1);
  check(after.on == 768 && far->committed() == kSize && near->committed() == 0 && far->reservation_count() == 1 &&
            bound_to(p + kMiB, 1) && holds(p + 2 * kMiB, kMiB, 10),
        "holes: after the refusal every page, the policy and the ledgers are as they were");
  far->release(base, kClient, nullptr);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  busy_pages();
  full_node();
  holes();
  std::printf("vm_rebind: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

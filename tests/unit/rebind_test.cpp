// SPDX-License-Identifier: MIT
// Movable residency (Device::move_reservation) and write fences: bytes survive a move between
// every pair of device kinds with the ledgers moved exactly; writer threads lose no write and
// see no torn record while their memory moves 1,000 times; refusals leave everything as it
// was; threads blocking SIGSEGV, system calls writing the range and the program's page
// protections survive moves; a hostile program (handlers writing the range, descriptors
// closed under the fence, mprotect racing the copy, mlock and madvise tags) loses nothing and
// gets a refusal that names why; without a kernel-mode fence nothing copies, NUMA-to-NUMA
// still moves; memory the kernel holds for I/O (io_uring registered buffers, reads in flight)
// is never moved. Also cxlpool's SIGSEGV handler (the sampling traps'): a fault outside every
// trap still reaches the program's own handler, and a handler the program installs later is
// not fought.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if defined(CXLPOOL_HAVE_LIBURING)
#include <liburing.h>
#endif

#include "device/device.hpp"
#include "os/io_pins.hpp"
#include "os/sample_trap.hpp"
#include "os/vm_query.hpp"
#include "os/write_fence.hpp"
#include "program_segv_handler.hpp"
#include "test_support.hpp"

using cxlpool::detail::BackingSpec;
using cxlpool::detail::Device;
using cxlpool::detail::Sharing;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::unique_ptr<Device> make(const std::string& kind, uint64_t capacity = 64 * kMiB) {
  static int counter = 0;
  BackingSpec spec;
  spec.device_name = kind + std::to_string(++counter);
  spec.capacity = capacity;
  if (kind == "numa") {
    spec.kind = CXLPOOL_BACKING_NUMA;
    spec.numa_node = 0;
  } else if (kind == "memfd") {
    spec.kind = CXLPOOL_BACKING_MEMFD;
  } else if (kind == "shm") {
    spec.kind = CXLPOOL_BACKING_SHM;
    spec.path = "cxlpool-rebind-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  } else {
    // "file": in /dev/shm (tmpfs: a fence covers it); "disk-file": in /tmp (a disk filesystem
    // here: no fence covers its page cache).
    spec.kind = CXLPOOL_BACKING_FILE;
    spec.path = std::string(kind == "disk-file" ? "/tmp" : "/dev/shm") + "/cxlpool-rebind-" + std::to_string(getpid()) +
                "-" + std::to_string(counter);
  }
  return std::make_unique<Device>(spec);
}

// Whether this process has a write fence that holds system calls: moves that copy need one.
bool copies_fenced() { return cxlpool::os::write_fence::probe().mode == cxlpool::os::write_fence::Mode::kKernel; }
#define REQUIRE_COPIES_FENCED()                                                           \
  do {                                                                                    \
    if (!copies_fenced())                                                                 \
      CXLPOOL_SKIP("no kernel-mode userfaultfd here (moves that copy are off): " +        \
                   cxlpool::os::write_fence::explain(cxlpool::os::write_fence::probe())); \
  } while (0)

void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512) p[i] = static_cast<unsigned char>(seed + i / 512);
}
bool holds(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 512)
    if (p[i] != static_cast<unsigned char>(seed + i / 512)) return false;
  return true;
}

}  // namespace

TEST_CASE("a reservation moves between every pair of device kinds with its bytes and its ledger", "[rebind]") {
  REQUIRE_COPIES_FENCED();
  const char* kinds[] = {"numa", "memfd", "shm", "file"};
  for (const char* a : kinds)
    for (const char* b : kinds) {
      if (std::string(a) == b) continue;
      INFO(a << " -> " << b);
      auto from = make(a), to = make(b);
      void* base = nullptr;
      REQUIRE(from->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 3, &base, nullptr) == CXLPOOL_OK);
      auto* p = static_cast<unsigned char*>(base);
      // Committed: the first MiB and the last two; the second MiB stays inaccessible.
      REQUIRE(from->commit(p, kMiB, false, 3, nullptr) == CXLPOOL_OK);
      REQUIRE(from->commit(p + 2 * kMiB, 2 * kMiB, false, 3, nullptr) == CXLPOOL_OK);
      fill(p, kMiB, 1);
      fill(p + 2 * kMiB, 2 * kMiB, 2);
      CHECK(from->committed() == 3 * kMiB);
      Device::MoveReport report;
      cxlpool::detail::DeviceError err;
      REQUIRE(from->move_reservation(base, *to, &report, &err) == CXLPOOL_OK);
      CHECK(report.bytes == 3 * kMiB);
      CHECK(holds(p, kMiB, 1));
      CHECK(holds(p + 2 * kMiB, 2 * kMiB, 2));
      CHECK(from->committed() == 0);
      CHECK(to->committed() == 3 * kMiB);
      CHECK(from->ledger().by_client[3].load() == 0);
      CHECK(to->ledger().by_client[3].load() == 3 * kMiB);
      CHECK(from->reservation_count() == 0);
      CHECK(to->reservation_count() == 1);
      CHECK(from->reserved_bytes() == 0);
      CHECK(to->reserved_bytes() == 4 * kMiB);
      // The reservation is the target's now: commit, decommit and release go there.
      CHECK(from->commit(p + kMiB, kMiB, false, 3, nullptr) == CXLPOOL_E_NOT_FOUND);
      REQUIRE(to->commit(p + kMiB, kMiB, false, 3, nullptr) == CXLPOOL_OK);
      fill(p + kMiB, kMiB, 3);
      CHECK(to->committed() == 4 * kMiB);
      REQUIRE(to->decommit(p, kMiB, 3, nullptr) == CXLPOOL_OK);
      CHECK(to->committed() == 3 * kMiB);
      CHECK(holds(p + kMiB, kMiB, 3));
      // And back: the bytes follow again.
      REQUIRE(to->move_reservation(base, *from, &report, &err) == CXLPOOL_OK);
      CHECK(report.bytes == 3 * kMiB);
      CHECK(holds(p + kMiB, kMiB, 3));
      CHECK(holds(p + 2 * kMiB, 2 * kMiB, 2));
      CHECK(to->committed() == 0);
      CHECK(from->committed() == 3 * kMiB);
      REQUIRE(from->release(base, 3, nullptr) == CXLPOOL_OK);
      CHECK(from->committed() == 0);
      CHECK(from->reserved_bytes() == 0);
    }
}

TEST_CASE("writers lose no write and see no torn record while their memory moves 1,000 times", "[rebind]") {
  REQUIRE_COPIES_FENCED();
#if defined(__SANITIZE_THREAD__)
  // The write fence orders writers and the copy with page protections and SIGSEGV, which
  // ThreadSanitizer does not model (it reports the fenced copy as a race and delivers the
  // fault to the wrong handler): this case runs in the normal and ASan/UBSan builds.
  WARN("skipped under ThreadSanitizer: write fences synchronise through page protection");
  return;
#endif
  auto near = make("numa", 64 * kMiB), far = make("memfd", 64 * kMiB);
  constexpr size_t kSize = 4 * kMiB, kThreads = 4, kSlots = kSize / kThreads / 16;
  void* base = nullptr;
  REQUIRE(near->reserve(kSize, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(near->commit(base, kSize, false, 1, nullptr) == CXLPOOL_OK);
  std::memset(base, 0, kSize);
  struct Record {
    uint64_t seq, check;
  };
  auto* records = static_cast<Record*>(base);
  auto check_of = [](uint64_t seq, size_t t) { return (seq * 0x9e3779b97f4a7c15ull) ^ (t + 1); };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lost{0}, torn{0}, written{0};
  const uint64_t uffd_before = cxlpool::os::write_fence::uffd_fences();
  std::vector<std::thread> writers;
  for (size_t t = 0; t < kThreads; ++t)
    writers.emplace_back([&, t] {
      Record* mine = records + t * kSlots;
      std::vector<uint64_t> last(kSlots, 0);
      uint64_t seq = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        ++seq;
        const size_t slot = (seq * 7919) % kSlots;
        volatile Record* r = &mine[slot];
        r->seq = seq;  // two separate stores: a move between them would tear the record
        r->check = check_of(seq, t);
        last[slot] = seq;
      }
      for (size_t s = 0; s < kSlots; ++s) {
        if (mine[s].seq != last[s]) ++lost;
        if (last[s] != 0 && mine[s].check != check_of(last[s], t)) ++torn;
      }
      written += seq;
    });
  Device* owner = near.get();
  Device* other = far.get();
  int moves = 0;
  for (; moves < 1000; ++moves) {
    cxlpool::detail::DeviceError err{};
    if (owner->move_reservation(base, *other, nullptr, &err) != CXLPOOL_OK) break;
    std::swap(owner, other);
    if (owner->committed() != kSize || other->committed() != 0) break;  // ledgers exact after every move
  }
  stop = true;
  for (auto& w : writers) w.join();
  CHECK(moves == 1000);
  CHECK(lost.load() == 0);
  CHECK(torn.load() == 0);
  CHECK(written.load() > 1000);
  CHECK(cxlpool::os::write_fence::uffd_fences() >= uffd_before + 1000);  // every move was fenced
  CHECK(owner->committed() == kSize);
  CHECK(other->committed() == 0);
  REQUIRE(owner->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("refused moves leave memory, ledgers and tables as they were", "[rebind]") {
  auto a = make("memfd", 64 * kMiB), small = make("shm", 2 * kMiB);
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 2, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 4 * kMiB, false, 2, nullptr) == CXLPOOL_OK);
  fill(static_cast<unsigned char*>(base), 4 * kMiB, 9);
  cxlpool::detail::DeviceError err{};
  CHECK(a->move_reservation(base, *small, nullptr, &err) == CXLPOOL_E_CAPACITY);  // 4 MiB into 2
  CHECK(a->move_reservation(static_cast<char*>(base) + kMiB, *small, nullptr, &err) == CXLPOOL_E_NOT_FOUND);
  CHECK(a->move_reservation(base, *a, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);
  void* shared = nullptr;
  REQUIRE(a->reserve(2 * kMiB, 2 * kMiB, 0, Sharing::kShared, 2, &shared, nullptr) == CXLPOOL_OK);
  auto b = make("memfd", 64 * kMiB);
  CHECK(a->move_reservation(shared, *b, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);  // other processes map it
  CHECK(holds(static_cast<unsigned char*>(base), 4 * kMiB, 9));
  static_cast<unsigned char*>(base)[0] = 1;  // still writable
  CHECK(a->committed() == 4 * kMiB);
  CHECK(small->committed() == 0);
  CHECK(small->reservation_count() == 0);
  CHECK(a->reservation_count() == 2);
  REQUIRE(a->release(base, 2, nullptr) == CXLPOOL_OK);
  REQUIRE(a->release(shared, 2, nullptr) == CXLPOOL_OK);
}

// While the bytes of a move are copied, neither device is locked: other reservations of both
// commit and decommit, and the moving range's own operations wait for the move and then find
// it where it ended. The hook runs in the middle of each move; what it starts on another thread
// must finish before the move does (a lock held would keep it waiting until after).
TEST_CASE("while a move copies, both devices serve other reservations, the range's own calls wait", "[rebind]") {
  REQUIRE_COPIES_FENCED();
  auto a = make("shm", 64 * kMiB), b = make("memfd", 64 * kMiB);
  void *base = nullptr, *side_a = nullptr, *side_b = nullptr;
  REQUIRE(a->reserve(8 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 2, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 8 * kMiB, false, 2, nullptr) == CXLPOOL_OK);
  fill(static_cast<unsigned char*>(base), 8 * kMiB, 5);
  REQUIRE(a->reserve(2 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 3, &side_a, nullptr) == CXLPOOL_OK);
  REQUIRE(b->reserve(2 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 3, &side_b, nullptr) == CXLPOOL_OK);
  struct Probe {
    Device *a, *b;
    void *side_a, *side_b, *base;
    std::atomic<bool> ok{false}, done{false};
    bool served_during_move = false;
    std::atomic<cxlpool_status_t> own{CXLPOOL_OK};
    std::thread other, own_call;
  } probe{a.get(), b.get(), side_a, side_b, base};
  Device::set_move_hook(
      [](void* ctx) {
        auto* pr = static_cast<Probe*>(ctx);
        pr->other = std::thread([pr] {
          bool ok = true;
          for (auto [d, at] : {std::pair{pr->a, pr->side_a}, {pr->b, pr->side_b}}) {
            ok &= d->commit(at, 64 << 10, true, 3, nullptr) == CXLPOOL_OK;
            static_cast<char*>(at)[0] = 1;
            ok &= d->decommit(at, 64 << 10, 3, nullptr) == CXLPOOL_OK;
          }
          // The moving range is still a's until the move ends.
          ok &= pr->a->reservation_count() == 2 && pr->b->reservation_count() == 1;
          pr->ok = ok;
          pr->done = true;
        });
        // Long enough for any machine; a lock held by the move would keep it waiting until
        // the move ends, which is after this returns.
        for (int i = 0; i < 6000 && !pr->done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        pr->served_during_move = pr->done;
        // A decommit of the moving range itself, on the device it is leaving: it waits for the
        // move, and then the range is b's.
        pr->own_call = std::thread([pr] { pr->own = pr->a->decommit(pr->base, 2 * kMiB, 2, nullptr); });
      },
      &probe);
  cxlpool::detail::DeviceError err{};
  const cxlpool_status_t moved = a->move_reservation(base, *b, nullptr, &err);
  Device::set_move_hook(nullptr, nullptr);
  probe.other.join();
  probe.own_call.join();
  REQUIRE(moved == CXLPOOL_OK);
  CHECK(probe.served_during_move);
  CHECK(probe.ok);
  CHECK(probe.own == CXLPOOL_E_NOT_FOUND);
  CHECK(holds(static_cast<unsigned char*>(base), 8 * kMiB, 5));
  CHECK(a->committed() == 0);
  CHECK(b->committed() == 8 * kMiB);
  CHECK(a->reservation_count() == 1);
  CHECK(b->reservation_count() == 2);
  REQUIRE(b->release(base, 2, nullptr) == CXLPOOL_OK);
  REQUIRE(a->release(side_a, 3, nullptr) == CXLPOOL_OK);
  REQUIRE(b->release(side_b, 3, nullptr) == CXLPOOL_OK);
}

TEST_CASE("a fault outside every trap reaches the program's handler, or kills as it would have", "[rebind]") {
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(guard != MAP_FAILED);
  // Default action: a child that puts our handler in front of SIG_DFL and faults outside every
  // trap dies of SIGSEGV; it does not hang.
  pid_t child = fork();
  if (child == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    if (cxlpool::os::sample_trap::install_handler() != 0) _exit(3);
    alarm(20);
    *static_cast<volatile char*>(guard) = 1;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  // The program's handler, installed before ours, in a process where ours was never
  // installed (this one has had ours in front of Catch2's handler).
  CHECK(run_fresh("fresh process: faults outside every trap reach the program's handler installed before ours"));
  munmap(guard, 4096);
}

TEST_CASE("fresh process: faults outside every trap reach the program's handler installed before ours", "[.][fresh]") {
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(guard != MAP_FAILED);
  struct sigaction prog {
  }, saved{};
  prog.sa_handler = program_handler;
  sigemptyset(&prog.sa_mask);
  REQUIRE(sigaction(SIGSEGV, &prog, &saved) == 0);
  REQUIRE(cxlpool::os::sample_trap::install_handler() == 0);  // ours in front
  g_program_handler_ran = 0;
  if (sigsetjmp(g_jump, 1) == 0) *static_cast<volatile char*>(guard) = 1;
  CHECK(g_program_handler_ran == 1);
  // A framework saves the disposition (ours), runs with its own, and restores it: while its
  // own is in place ours is not put back (traps refuse); restored, it is ours again.
  struct sigaction other {
  }, ours{};
  other.sa_handler = [](int) {};
  sigemptyset(&other.sa_mask);
  REQUIRE(sigaction(SIGSEGV, &other, &ours) == 0);
  CHECK(cxlpool::os::sample_trap::install_handler() == EBUSY);
  REQUIRE(sigaction(SIGSEGV, &ours, nullptr) == 0);
  REQUIRE(cxlpool::os::sample_trap::install_handler() == 0);
  // The program puts back the handler it had before ours: ours goes in front of it again, and
  // faults outside fences still reach it.
  REQUIRE(sigaction(SIGSEGV, &prog, nullptr) == 0);
  REQUIRE(cxlpool::os::sample_trap::install_handler() == 0);
  struct sigaction now {};
  REQUIRE(sigaction(SIGSEGV, nullptr, &now) == 0);
  CHECK(now.sa_handler != program_handler);
  g_program_handler_ran = 0;
  if (sigsetjmp(g_jump, 1) == 0) *static_cast<volatile char*>(guard) = 1;
  CHECK(g_program_handler_ran == 1);
  // The same fault again, from the same place after the longjmp: still the program's.
  g_program_handler_ran = 0;
  if (sigsetjmp(g_jump, 1) == 0) *static_cast<volatile char*>(guard) = 1;
  CHECK(g_program_handler_ran == 1);
  REQUIRE(sigaction(SIGSEGV, &saved, nullptr) == 0);
  munmap(guard, 4096);
}

namespace {
// A crash reporter that registers again later, saving ours as the handler it chains to.
struct sigaction g_reporter_previous {};
volatile int* g_reporter_calls = nullptr;
void re_registering_reporter(int sig, siginfo_t* info, void* ctx) {
  *g_reporter_calls = *g_reporter_calls + 1;
  if (*g_reporter_calls > 5) _exit(42);  // the two handlers loop
  if (g_reporter_previous.sa_flags & SA_SIGINFO)
    g_reporter_previous.sa_sigaction(sig, info, ctx);
  else if (g_reporter_previous.sa_handler == SIG_DFL)
    signal(sig, SIG_DFL);
}
}  // namespace

TEST_CASE("fresh process: a handler ours is in front of again that gives the signal back ends in the default action",
          "[.][fresh]") {
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  auto* calls =
      static_cast<volatile int*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(guard != MAP_FAILED);
  REQUIRE(calls != MAP_FAILED);
  pid_t child = fork();
  if (child == 0) {
    alarm(20);
    g_reporter_calls = calls;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);  // Catch2's handler out of the way
    struct sigaction reporter {};
    reporter.sa_sigaction = re_registering_reporter;
    reporter.sa_flags = SA_SIGINFO;
    sigemptyset(&reporter.sa_mask);
    sigaction(SIGSEGV, &reporter, &g_reporter_previous);             // first: chains to SIG_DFL
    if (cxlpool::os::sample_trap::install_handler() != 0) _exit(3);  // ours in front of it
    sigaction(SIGSEGV, &reporter, &g_reporter_previous);             // registers again: now chains to ours
    if (cxlpool::os::sample_trap::install_handler() != 0) _exit(4);  // the same handler: ours in front
    *static_cast<volatile char*>(guard) = 1;                         // ours -> reporter -> ours: the default action
    _exit(5);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("status " << status << ", reporter called " << *calls << " times (exit 42: a loop)");
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(*calls == 1);
  munmap(const_cast<int*>(calls), 4096);
  munmap(guard, 4096);
}

TEST_CASE("ours goes back in front only of the handler it was in front of, or of no handler", "[rebind]") {
  CHECK(
      run_fresh("fresh process: a handler ours is in front of again that gives the signal back ends in the default "
                "action"));
}

namespace {
struct sigaction g_replaced {};
volatile sig_atomic_t g_chained = 0;
// A crash reporter's handler: report, then call the handler it replaced (ours).
void chaining_handler(int sig, siginfo_t* info, void* ctx) {
  g_chained = g_chained + 1;
  if (g_chained > 5) _exit(42);  // called again and again: the two handlers loop
  if (g_replaced.sa_flags & SA_SIGINFO) g_replaced.sa_sigaction(sig, info, ctx);
}
}  // namespace

TEST_CASE("a program handler installed after ours is not fought: no loop, traps refuse instead", "[rebind]") {
  void* fenced = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(fenced != MAP_FAILED);
  REQUIRE(guard != MAP_FAILED);
  pid_t child = fork();
  if (child == 0) {
    alarm(20);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    if (cxlpool::os::sample_trap::install_handler() != 0) _exit(3);  // ours, in front of SIG_DFL
    struct sigaction mine {};
    mine.sa_sigaction = chaining_handler;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGSEGV, &mine, &g_replaced);  // replaces ours, chains to it
    // Ours is not put back in front: sampling traps refuse.
    if (cxlpool::os::sample_trap::install_handler() != EBUSY) _exit(4);
    if (cxlpool::os::sample_trap::arm(reinterpret_cast<uintptr_t>(fenced)) != EBUSY) _exit(5);
    // The program's own fault: its handler once, ours after it, then the default action.
    *static_cast<volatile char*>(guard) = 1;
    _exit(6);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("status " << status << " (exit 42: the handlers called each other; 3-5: a refusal failed)");
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  munmap(fenced, 4096);
  munmap(guard, 4096);
}

TEST_CASE("moves keep what the program did to its memory", "[rebind]") {
  REQUIRE_COPIES_FENCED();
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  SECTION("a writer thread that blocks SIGSEGV keeps writing through 200 moves") {
#if defined(__SANITIZE_THREAD__)
    WARN("skipped under ThreadSanitizer: writers are held by the kernel while memory moves");
    return;
#endif
    auto a = make("numa"), b = make("memfd");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* words = static_cast<volatile uint64_t*>(base);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> last{0};
    std::thread writer([&] {
      sigset_t all;
      sigfillset(&all);
      pthread_sigmask(SIG_BLOCK, &all, nullptr);  // "only main handles signals"
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        ++n;
        for (size_t i = 0; i < 4 * kMiB / 8; i += 512) words[i] = n;
        last = n;
      }
    });
    Device* from = a.get();
    Device* to = b.get();
    int moves = 0;
    for (; moves < 200; ++moves) {
      if (from->move_reservation(base, *to, nullptr, nullptr) != CXLPOOL_OK) break;
      std::swap(from, to);
    }
    stop = true;
    writer.join();
    CHECK(moves == 200);
    size_t wrong = 0;
    for (size_t i = 0; i < 4 * kMiB / 8; i += 512) wrong += words[i] != last.load();
    CHECK(wrong == 0);
    REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
  }
  SECTION("read(2) into memory while it moves: no EFAULT") {
#if defined(__SANITIZE_THREAD__)
    WARN("skipped under ThreadSanitizer: the kernel holds the reader while memory moves");
    return;
#endif
    auto a = make("numa"), b = make("shm");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* bytes = static_cast<char*>(base);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> ok{0}, efault{0}, other{0};
    std::thread reader([&] {
      char msg[64];
      std::memset(msg, 'k', sizeof msg);
      uint64_t i = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (write(fds[1], msg, sizeof msg) != ssize_t(sizeof msg)) break;
        char* at = bytes + (i++ * 4096 + 100) % (4 * kMiB - 64);
        ssize_t r = read(fds[0], at, sizeof msg);
        if (r == ssize_t(sizeof msg))
          ++ok;
        else if (r < 0 && errno == EFAULT) {
          ++efault;
          char sink[64];
          if (read(fds[0], sink, sizeof sink) != ssize_t(sizeof sink)) break;  // keep the pipe empty
        } else {
          ++other;
        }
      }
    });
    Device* from = a.get();
    Device* to = b.get();
    for (int m = 0; m < 200; ++m) {
      REQUIRE(from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK);
      std::swap(from, to);
    }
    stop = true;
    reader.join();
    close(fds[0]);
    close(fds[1]);
    WARN("read(2) into a range moved 200 times: " << ok.load() << " complete, " << efault.load() << " EFAULT");
    CHECK(ok.load() > 0);
    CHECK(other.load() == 0);
    CHECK(efault.load() == 0);
    REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
  }
  SECTION("read-only pages stay read-only; unreadable ones are refused, nothing changed") {
    auto a = make("memfd"), b = make("numa");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* p = static_cast<unsigned char*>(base);
    fill(p, 4 * kMiB, 6);
    REQUIRE(mprotect(p + 8 * page, 2 * page, PROT_READ) == 0);  // the program's snapshot pages
    REQUIRE(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);
    CHECK(holds(p, 4 * kMiB, 6));
    std::vector<cxlpool::os::vm_query::ProtRun> runs(64);
    size_t n = 0;
    const auto at = reinterpret_cast<uintptr_t>(p);
    REQUIRE(cxlpool::os::vm_query::protection_runs(at, at + 4 * kMiB, runs.data(), runs.size(), &n) == 0);
    size_t read_only = 0;
    for (size_t i = 0; i < n; ++i)
      if (runs[i].prot == cxlpool::os::vm_query::kRead) read_only += (runs[i].end - runs[i].begin) / page;
    CHECK(read_only == 2);
    REQUIRE(mprotect(p + 8 * page, 2 * page, PROT_READ | PROT_WRITE) == 0);
    REQUIRE(mprotect(p + 20 * page, page, PROT_NONE) == 0);  // a guard page
    cxlpool::detail::DeviceError err{};
    CHECK(b->move_reservation(base, *a, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);
    CHECK(b->committed() == 4 * kMiB);
    CHECK(a->committed() == 0);
    REQUIRE(mprotect(p + 20 * page, page, PROT_READ | PROT_WRITE) == 0);
    CHECK(holds(p, 4 * kMiB, 6));
    REQUIRE(b->release(base, 1, nullptr) == CXLPOOL_OK);
  }
}

namespace {
// For the signal-handler case: where the handler writes, and how often it ran.
volatile uint64_t* g_handler_word = nullptr;
volatile sig_atomic_t g_handler_runs = 0;
void write_in_handler(int) {
  if (g_handler_word) *g_handler_word = *g_handler_word + 1;
  g_handler_runs = g_handler_runs + 1;
}

// The descriptors of this process that are userfaultfds (what a hostile program closes).
std::vector<int> userfaultfds() {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    char target[128] = {};
    if (readlink(e.path().c_str(), target, sizeof target - 1) > 0 && std::strstr(target, "userfaultfd"))
      out.push_back(std::stoi(e.path().filename().string()));
  }
  return out;
}
}  // namespace

TEST_CASE("moves under a hostile program: signal handlers, closed descriptors, mprotect races, attributes",
          "[rebind]") {
  REQUIRE_COPIES_FENCED();
#if defined(__SANITIZE_THREAD__)
  WARN("skipped under ThreadSanitizer: writers are held by the kernel while memory moves");
  return;
#endif
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  SECTION("a signal handler that writes the moving memory: no deadlock, every write kept") {
    pid_t child = fork();
    if (child == 0) {
      alarm(60);  // a deadlock ends as SIGALRM's default action, never as a hang
      auto a = make("numa"), b = make("memfd");
      void* base = nullptr;
      if (a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) ||
          a->commit(base, 4 * kMiB, false, 1, nullptr))
        _exit(3);
      g_handler_word = static_cast<volatile uint64_t*>(base) + 1000;
      struct sigaction sa {};
      sa.sa_handler = write_in_handler;
      sigemptyset(&sa.sa_mask);
      sigaction(SIGUSR1, &sa, nullptr);
      std::atomic<bool> stop{false};
      std::thread pinger([&] {
        // Only the moving thread takes the signal: two threads running the handler at once
        // would race on its (non-atomic) increment and look like a lost write.
        sigset_t usr1;
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
        while (!stop) {
          kill(getpid(), SIGUSR1);  // the process: delivered to the moving thread
          usleep(50);
        }
      });
      Device* from = a.get();
      Device* to = b.get();
      for (int m = 0; m < 300; ++m) {
        if (from->move_reservation(base, *to, nullptr, nullptr) != CXLPOOL_OK) _exit(4);
        std::swap(from, to);
      }
      stop = true;
      pinger.join();
      usleep(10000);
      _exit(*g_handler_word == uint64_t(g_handler_runs) ? 0 : 5);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    INFO("status " << status << " (signal 14: deadlocked; exit 5: a handler write was lost)");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  SECTION("the program closes cxlpool's userfaultfd again and again: no write lost") {
    auto a = make("numa"), b = make("shm");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* words = static_cast<volatile uint64_t*>(base);
    const size_t n = 4 * kMiB / 8;
    std::atomic<bool> stop{false};
    std::atomic<size_t> written{0};
    std::thread writer([&] {  // each slot written once, in order: a lost write shows as a 0
      for (size_t i = 0; i < n && !stop; ++i) {
        words[i] = i + 1;
        written = i + 1;
      }
    });
    std::thread closer([&] {
      while (!stop)
        for (int fd : userfaultfds()) close(fd);
    });
    Device* from = a.get();
    Device* to = b.get();
    int moved = 0, refused = 0;
    for (int m = 0; m < 400 && written < n; ++m) {
      cxlpool::detail::DeviceError err{};
      if (from->move_reservation(base, *to, nullptr, &err) == CXLPOOL_OK) {
        ++moved;
        std::swap(from, to);
      } else {
        ++refused;
      }
    }
    writer.join();
    stop = true;
    closer.join();
    size_t lost = 0;
    for (size_t i = 0; i < written; ++i) lost += words[i] != i + 1;
    WARN("moves while descriptors are closed: " << moved << " done, " << refused << " refused; " << lost << " of "
                                                << written.load() << " writes lost");
    CHECK(lost == 0);
    REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
  }
  SECTION("the program changes protections while its memory moves: no crash, its protections hold") {
    auto a = make("memfd"), b = make("numa");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* p = static_cast<unsigned char*>(base);
    fill(p, 4 * kMiB, 3);
    std::atomic<bool> stop{false};
    std::thread toggler([&] {
      while (!stop) {
        mprotect(p + 10 * page, page, PROT_NONE);
        mprotect(p + 10 * page, page, PROT_READ | PROT_WRITE);
      }
    });
    Device* from = a.get();
    Device* to = b.get();
    int moved = 0;
    for (int m = 0; m < 300; ++m)
      if (from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK) {
        ++moved;
        std::swap(from, to);
      }
    stop = true;
    toggler.join();
    WARN(moved << " of 300 moves went through while the program toggled a page's protection");
    CHECK(holds(p, 4 * kMiB, 3));
    std::vector<cxlpool::os::vm_query::ProtRun> runs(64);
    size_t nr = 0;
    const auto at = reinterpret_cast<uintptr_t>(p);
    REQUIRE(cxlpool::os::vm_query::protection_runs(at, at + 4 * kMiB, runs.data(), runs.size(), &nr) == 0);
    CHECK(nr == 1);  // all read-write, as the program left it
    REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
  }
  SECTION("attributes a new mapping would lose are refused; THP hints carried over") {
    auto a = make("numa"), b = make("memfd");
    void* base = nullptr;
    REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
    REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
    auto* p = static_cast<unsigned char*>(base);
    fill(p, 4 * kMiB, 8);
    struct Attr {
      const char* what;
      std::function<int()> set, clear;
    };
    const std::vector<Attr> attrs = {
        // mlock by the system call itself: ASan's interceptor does nothing and returns 0.
        {"mlock", [&] { return int(syscall(SYS_mlock, p, page)); }, [&] { return int(syscall(SYS_munlock, p, page)); }},
        {"MADV_DONTDUMP", [&] { return madvise(p, page, MADV_DONTDUMP); },
         [&] { return madvise(p, page, MADV_DODUMP); }},
        {"MADV_WIPEONFORK", [&] { return madvise(p, page, MADV_WIPEONFORK); },
         [&] { return madvise(p, page, MADV_KEEPONFORK); }},
        {"MADV_DONTFORK", [&] { return madvise(p, page, MADV_DONTFORK); },
         [&] { return madvise(p, page, MADV_DOFORK); }},
    };
    for (const Attr& attr : attrs) {
      INFO(attr.what);
      REQUIRE(attr.set() == 0);
      cxlpool::detail::DeviceError err{};
      CHECK(a->move_reservation(base, *b, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);
      CHECK(a->committed() == 4 * kMiB);
      REQUIRE(attr.clear() == 0);
    }
    CHECK(holds(p, 4 * kMiB, 8));
    REQUIRE(madvise(p, 4 * kMiB, MADV_NOHUGEPAGE) == 0);
    REQUIRE(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);
    unsigned flags = 0;
    const auto at = reinterpret_cast<uintptr_t>(p);
    REQUIRE(cxlpool::os::vm_query::vma_flags(at, at + 4 * kMiB, &flags) == 0);
    CHECK((flags & cxlpool::os::vm_query::kVmNoHugePage) != 0);
    CHECK(holds(p, 4 * kMiB, 8));
    REQUIRE(b->release(base, 1, nullptr) == CXLPOOL_OK);
  }
}

TEST_CASE("no descriptor for a moment does not give up userfaultfd fences for good", "[rebind]") {
  REQUIRE_COPIES_FENCED();
  auto a = make("numa"), b = make("memfd");
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  for (int fd : userfaultfds()) close(fd);  // a fresh start: the next fence opens a descriptor
  rlimit saved{};
  getrlimit(RLIMIT_NOFILE, &saved);
  int probe = open("/dev/null", O_RDONLY);
  REQUIRE(probe >= 0);
  close(probe);
  rlimit low = saved;
  low.rlim_cur = rlim_t(probe);  // no descriptor left
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  const uint64_t before = cxlpool::os::write_fence::uffd_fences();
  cxlpool::detail::DeviceError err{};
  const cxlpool_status_t st = a->move_reservation(base, *b, nullptr, &err);  // no fence: refused
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  INFO(a->describe("move", base, 4 * kMiB, err));
  CHECK(st == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(a->committed() == 4 * kMiB);
  REQUIRE(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);
  CHECK(cxlpool::os::write_fence::uffd_fences() > before);  // descriptors are back: userfaultfd again
  REQUIRE(b->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("a SIGSEGV sent by raise() or kill() is not taken for a fault", "[rebind]") {
  pid_t child = fork();
  if (child == 0) {
    alarm(20);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    if (cxlpool::os::sample_trap::install_handler() != 0) _exit(3);  // ours in front of SIG_DFL
    raise(SIGSEGV);                                                  // the default action: death
    _exit(4);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
}

TEST_CASE("a file on a disk filesystem: its private ranges are anonymous memory and move both ways, fenced",
          "[rebind]") {
  auto numa = make("numa"), memfd = make("memfd"), shm = make("shm"), tmpfs_file = make("file"),
       disk_file = make("disk-file");
  for (auto* d : {numa.get(), memfd.get(), shm.get(), tmpfs_file.get(), disk_file.get()}) CHECK(d->copy_fenceable());
  REQUIRE_COPIES_FENCED();
  void* base = nullptr;
  REQUIRE(numa->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(numa->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  auto* p = static_cast<unsigned char*>(base);
  fill(p, 4 * kMiB, 4);
  REQUIRE(numa->move_reservation(base, *disk_file, nullptr, nullptr) == CXLPOOL_OK);
  CHECK(disk_file->committed() == 4 * kMiB);
  CHECK(holds(p, 4 * kMiB, 4));
  fill(p, 4 * kMiB, 5);
  cxlpool::detail::DeviceError err{};
  INFO(disk_file->describe("move", base, 4 * kMiB, err));
  REQUIRE(disk_file->move_reservation(base, *numa, nullptr, &err) == CXLPOOL_OK);
  CHECK(disk_file->committed() == 0);
  CHECK(numa->committed() == 4 * kMiB);
  CHECK(holds(p, 4 * kMiB, 5));
  p[0] = 1;  // still writable
  REQUIRE(numa->release(base, 1, nullptr) == CXLPOOL_OK);
}

namespace {

// Runs body in a child that has only a user-mode userfaultfd: as uid 65534 when this process
// is root (vm.unprivileged_userfaultfd must be 0), or this process's own mode when it already
// lacks a kernel-mode one. The body returns 0 for success or a code naming what failed.
// Returns the child's status, or -1 (with *why) when no such child can be had.
int in_degraded_child(const std::function<int()>& body, std::string* why) {
  if (geteuid() != 0) {
    if (copies_fenced()) {
      *why =
          "this unprivileged process has a kernel-mode userfaultfd (vm.unprivileged_userfaultfd=1 or "
          "/dev/userfaultfd access)";
      return -1;
    }
  } else {
    std::ifstream sysctl("/proc/sys/vm/unprivileged_userfaultfd");
    int v = -1;
    sysctl >> v;
    if (v != 0) {
      *why = "vm.unprivileged_userfaultfd=" + std::to_string(v) + ": an unprivileged user has kernel-mode fences here";
      return -1;
    }
  }
  pid_t child = fork();
  if (child == 0) {
    alarm(120);
    if (geteuid() == 0) {
      if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
        _exit(90);
      if (prctl(PR_SET_DUMPABLE, 1) != 0) _exit(91);  // its /proc/self stays readable to it
    }
    _exit(body());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1;
  return status;
}

}  // namespace

TEST_CASE("without a kernel-mode fence nothing copies, and NUMA to NUMA still moves", "[rebind]") {
  std::string why;
  const int status = in_degraded_child(
      [] {
        // Fences the parent raised before the fork count in this copy of the counter too.
        const auto fences_before = cxlpool::os::write_fence::uffd_fences();
        const cxlpool::os::write_fence::Probe p = cxlpool::os::write_fence::probe();
        if (p.mode != cxlpool::os::write_fence::Mode::kUserModeOnly) return 10;
        const std::string explained = cxlpool::os::write_fence::explain(p);
        if (explained.find("user-mode-only") == std::string::npos ||
            explained.find("vm.unprivileged_userfaultfd=1") == std::string::npos)
          return 11;
        auto near = make("numa"), far = make("numa"), memfd = make("memfd");
        void* base = nullptr;
        if (near->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) ||
            near->commit(base, 4 * kMiB, false, 1, nullptr))
          return 12;
        auto* bytes = static_cast<unsigned char*>(base);
        fill(bytes, 4 * kMiB, 5);
        // Copies are refused, naming why, with nothing changed.
        cxlpool::detail::DeviceError err{};
        if (near->move_reservation(base, *memfd, nullptr, &err) != CXLPOOL_E_NOT_SUPPORTED) return 13;
        if (near->describe("move", base, 4 * kMiB, err).find("no write fence") == std::string::npos) return 14;
        if (near->committed() != 4 * kMiB || memfd->committed() != 0 || !holds(bytes, 4 * kMiB, 5)) return 15;
        // The kernel's migration needs no fence: NUMA to NUMA moves, there and back.
        Device::MoveReport report;
        if (near->move_reservation(base, *far, &report, nullptr) != CXLPOOL_OK || !report.by_kernel) return 16;
        if (far->committed() != 4 * kMiB || near->committed() != 0 || !holds(bytes, 4 * kMiB, 5)) return 17;
        if (far->move_reservation(base, *near, &report, nullptr) != CXLPOOL_OK) return 18;
        // Not one fence was raised.
        if (cxlpool::os::write_fence::uffd_fences() != fences_before) return 19;
        if (near->release(base, 1, nullptr)) return 20;
        return 0;
      },
      &why);
  if (status < 0) CXLPOOL_SKIP("no process with user-mode-only userfaultfd here: " + why);
  INFO("child status " << status
                       << " (10 mode not user-mode-only, 11 reason, 13-15 a copy was not refused or changed "
                          "something, 16-18 NUMA to NUMA failed, 19 a fence was raised, 90 setuid)");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("/dev/userfaultfd gives an unprivileged process kernel-mode fences", "[rebind]") {
  struct stat dev {};
  if (geteuid() != 0) CXLPOOL_SKIP("not root: needs a private mount namespace and a device node of its own");
  if (stat("/dev/userfaultfd", &dev) != 0 || !S_ISCHR(dev.st_mode))
    CXLPOOL_SKIP("no /dev/userfaultfd (a kernel before 6.1)");
  cxlpool_test::ScratchDir scratch;
  pid_t child = fork();
  if (child == 0) {
    alarm(120);
    // A private mount namespace in which /dev/userfaultfd is a node of our own, mode 0666
    // (the machine's node is left as it is).
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(10);
    if (mount("tmpfs", scratch.path().c_str(), "tmpfs", 0, "size=64k,mode=0755") != 0) _exit(11);
    const std::string node = scratch.path() + "/userfaultfd";
    if (mknod(node.c_str(), S_IFCHR | 0666, dev.st_rdev) != 0 || chmod(node.c_str(), 0666) != 0) _exit(12);
    if (mount(node.c_str(), "/dev/userfaultfd", nullptr, MS_BIND, nullptr) != 0) _exit(13);
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
      _exit(14);
    if (prctl(PR_SET_DUMPABLE, 1) != 0) _exit(15);
    const cxlpool::os::write_fence::Probe p = cxlpool::os::write_fence::probe();
    if (p.mode != cxlpool::os::write_fence::Mode::kKernel || !p.via_device || p.syscall_errno != EPERM) _exit(16);
    // A system call writing the range while it moves waits for the fence, as root's would.
    auto a = make("numa"), b = make("memfd");
    void* base = nullptr;
    if (a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) ||
        a->commit(base, 4 * kMiB, false, 1, nullptr))
      _exit(17);
    auto* bytes = static_cast<char*>(base);
    int fds[2];
    if (pipe(fds) != 0) _exit(18);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> ok{0}, failed{0};
    std::thread reader([&] {
      char msg[64];
      std::memset(msg, 'k', sizeof msg);
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        if (write(fds[1], msg, sizeof msg) != ssize_t(sizeof msg)) break;
        char* at = bytes + (i * 4096 + 100) % (4 * kMiB - 64);
        if (read(fds[0], at, sizeof msg) == ssize_t(sizeof msg) && std::memcmp(at, msg, sizeof msg) == 0) {
          ++ok;
        } else {
          ++failed;
          char sink[64];
          if (read(fds[0], sink, sizeof sink) != ssize_t(sizeof sink)) break;
        }
      }
    });
    Device* from = a.get();
    Device* to = b.get();
    int moved = 0;
    for (int m = 0; m < 100; ++m)
      if (from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK) {
        ++moved;
        std::swap(from, to);
      }
    stop = true;
    reader.join();
    if (moved != 100) _exit(19);
    if (failed.load() != 0 || ok.load() == 0) _exit(20);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child status " << status
                       << " (10-13 namespace or node, 14-15 setuid, 16 not kernel mode through the device, 19 a "
                          "move failed, 20 a read(2) failed or lost its bytes)");
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a thread inside a read from a device into the range: not moved until it returns", "[rebind]") {
  REQUIRE_COPIES_FENCED();
  auto a = make("numa"), b = make("memfd");
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  auto* bytes = static_cast<char*>(base);
  // A pseudo-terminal stands for a device whose read blocks (as an O_DIRECT read waits for the
  // disk): the reader sits inside read(2) with its destination in the range.
  const int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(grantpt(master) == 0);
  REQUIRE(unlockpt(master) == 0);
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(slave >= 0);
  termios raw{};
  REQUIRE(tcgetattr(slave, &raw) == 0);
  cfmakeraw(&raw);
  REQUIRE(tcsetattr(slave, TCSANOW, &raw) == 0);
  std::atomic<ssize_t> got{-2};
  std::atomic<pid_t> tid{0};
  std::thread reader([&] {
    tid = pid_t(syscall(SYS_gettid));
    got = read(slave, bytes + 3 * kMiB + 10, 5);
  });
  // Until the reader is inside read(2) (its /proc/.../syscall says so).
  std::string state;
  for (int i = 0; i < 20000; ++i) {
    if (tid.load()) {
      std::ifstream f("/proc/self/task/" + std::to_string(tid.load()) + "/syscall");
      std::getline(f, state);
      if (state.rfind(std::to_string(SYS_read) + " ", 0) == 0) break;
    }
    usleep(1000);
  }
  REQUIRE(state.rfind(std::to_string(SYS_read) + " ", 0) == 0);
  const auto at = reinterpret_cast<uintptr_t>(base);
  const cxlpool::os::io_pins::Result seen = cxlpool::os::io_pins::reads_in_flight(at, at + 4 * kMiB);
  CHECK(seen.verdict == cxlpool::os::io_pins::Verdict::kOverlap);
  CHECK(seen.tid == tid.load());
  CHECK(cxlpool::os::io_pins::reads_in_flight(at + 4 * kMiB, at + 8 * kMiB).verdict ==
        cxlpool::os::io_pins::Verdict::kClear);
  cxlpool::detail::DeviceError err{};
  CHECK(a->move_reservation(base, *b, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(a->describe("move", base, 4 * kMiB, err).find("inside a read system call") != std::string::npos);
  CHECK(a->committed() == 4 * kMiB);
  REQUIRE(write(master, "hello", 5) == 5);
  reader.join();
  CHECK(got.load() == 5);
  CHECK(std::memcmp(bytes + 3 * kMiB + 10, "hello", 5) == 0);
  CHECK(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);  // it returned: the range moves
  CHECK(std::memcmp(bytes + 3 * kMiB + 10, "hello", 5) == 0);
  close(slave);
  close(master);
  REQUIRE(b->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("O_DIRECT reads into memory that moves: every byte lands where the program reads it", "[rebind]") {
#if defined(__SANITIZE_THREAD__)
  WARN("skipped under ThreadSanitizer: the kernel holds the readers while memory moves");
  return;
#endif
  REQUIRE_COPIES_FENCED();
  // A file on a disk filesystem (tmpfs has no DMA: its O_DIRECT reads copy).
  const std::string path = "/tmp/cxlpool-rebind-direct-" + std::to_string(getpid());
  constexpr size_t kFile = 16 * kMiB;
  std::vector<unsigned char> image(kFile);
  for (size_t i = 0; i < kFile; ++i) image[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  {
    const int w = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(w >= 0);
    REQUIRE(pwrite(w, image.data(), kFile, 0) == ssize_t(kFile));
    REQUIRE(fsync(w) == 0);
    close(w);
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  unlink(path.c_str());
  if (fd < 0) CXLPOOL_SKIP(std::string("no O_DIRECT on /tmp here: ") + strerror(errno));
  auto a = make("numa"), b = make("memfd");
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  auto* bytes = static_cast<unsigned char*>(base);
  constexpr int kReaders = 3;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, wrong{0}, failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < kReaders; ++t)
    readers.emplace_back([&, t] {
      unsigned char* mine = bytes + size_t(t) * kMiB;
      unsigned seed = 1234u + unsigned(t);
      while (!stop.load(std::memory_order_relaxed)) {
        const size_t n = 4096 * (1 + rand_r(&seed) % 64);
        const size_t off = 4096 * (rand_r(&seed) % ((kFile - n) / 4096));
        std::memset(mine, 0xEE, n);
        const ssize_t r = pread(fd, mine, n, off_t(off));
        if (r != ssize_t(n)) {
          ++failed;
          continue;
        }
        ++reads;
        if (std::memcmp(mine, image.data() + off, n) != 0) ++wrong;
      }
    });
  Device* from = a.get();
  Device* to = b.get();
  int moved = 0, refused = 0;
  for (int m = 0; m < 600; ++m) {
    if (from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK) {
      ++moved;
      std::swap(from, to);
    } else {
      ++refused;
    }
  }
  stop = true;
  for (auto& r : readers) r.join();
  close(fd);
  WARN("O_DIRECT reads while the range moved: " << reads.load() << " reads, " << wrong.load() << " wrong, "
                                                << failed.load() << " failed; " << moved << " moves, " << refused
                                                << " refused (a read was in flight)");
  CHECK(wrong.load() == 0);
  CHECK(failed.load() == 0);
  CHECK(moved > 0);
  REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("parsing what /proc says of registered buffers and of threads inside system calls", "[rebind]") {
  using cxlpool::os::io_pins::parse_fdinfo;
  using cxlpool::os::io_pins::Verdict;
  uintptr_t hb = 0, he = 0;
  // Linux 6.18, the lock taken: the ring's buffers are listed.
  const std::string listed =
      "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t2011\nSqMask:\t0x7\nUserFiles:\t1\n    0: log\n"
      "UserBufs:\t3\n    0: 0x7fea30b21000/16384\n    1: <none>\n    2: 0x7fea40000000/1048576\nPollList:\n"
      "CqOverflowList:\nNAPI:\tdisabled\n";
  CHECK(parse_fdinfo(listed.data(), listed.size(), 0x7fea30b20000, 0x7fea30b21000, &hb, &he) == Verdict::kClear);
  CHECK(parse_fdinfo(listed.data(), listed.size(), 0x7fea30b24fff, 0x7fea30b26000, &hb, &he) == Verdict::kOverlap);
  CHECK(hb == 0x7fea30b21000);
  CHECK(he == 0x7fea30b25000);
  CHECK(parse_fdinfo(listed.data(), listed.size(), 0x7fea400ff000, 0x7fea40100000, &hb, &he) == Verdict::kOverlap);
  CHECK(parse_fdinfo(listed.data(), listed.size(), 0x7fea40100000, 0x7fea40200000, &hb, &he) == Verdict::kClear);
  // The lock busy (a registration or submission): 6.16+ print nothing of the ring; earlier
  // kernels print the count without the list.
  const std::string busy = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t2011\n";
  CHECK(parse_fdinfo(busy.data(), busy.size(), 0, ~uintptr_t(0), &hb, &he) == Verdict::kUnknown);
  const std::string counted = "UserFiles:\t0\nUserBufs:\t2\nPollList:\n";
  CHECK(parse_fdinfo(counted.data(), counted.size(), 0, ~uintptr_t(0), &hb, &he) == Verdict::kUnknown);
  const std::string none = "UserFiles:\t0\nUserBufs:\t0\nPollList:\n";
  CHECK(parse_fdinfo(none.data(), none.size(), 0, ~uintptr_t(0), &hb, &he) == Verdict::kClear);

  using cxlpool::os::io_pins::parse_syscall_line;
  long nr = 0;
  uint64_t args[6] = {};
  const std::string in_read = "17 0x5 0x7f2d5cbe5000 0x20000 0x1000 0xffffffff 0x0 0x7fff906a80c8 0x7f2d5cd5e2ad\n";
  REQUIRE(parse_syscall_line(in_read.data(), in_read.size(), &nr, args));
  CHECK(nr == 17);
  CHECK(args[0] == 5);
  CHECK(args[1] == 0x7f2d5cbe5000);
  CHECK(args[2] == 0x20000);
  CHECK_FALSE(parse_syscall_line("running\n", 8, &nr, args));
  CHECK_FALSE(parse_syscall_line("-1 0x7fff906a80c8 0x7f2d5cd5e2ad\n", 33, &nr, args));
}

TEST_CASE("io_uring registered buffers are never moved, also while registrations race the moves", "[rebind]") {
#if !defined(CXLPOOL_HAVE_LIBURING)
  CXLPOOL_SKIP("built without liburing (liburing-dev): io_uring cases not compiled");
#else
#if defined(__SANITIZE_THREAD__)
  WARN("skipped under ThreadSanitizer: the kernel holds the registering thread while memory moves");
  return;
#endif
  REQUIRE_COPIES_FENCED();
  io_uring ring{};
  const int e = io_uring_queue_init(8, &ring, 0);
  if (e < 0) CXLPOOL_SKIP(std::string("io_uring_queue_init: ") + strerror(-e));
  auto a = make("numa"), b = make("memfd");
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(base, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  auto* bytes = static_cast<unsigned char*>(base);
  fill(bytes, 4 * kMiB, 7);
  // A file to read from with READ_FIXED.
  const int fd = memfd_create("rebind-uring", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  std::vector<unsigned char> image(kMiB);
  for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<unsigned char>(i * 13 + 5);
  REQUIRE(pwrite(fd, image.data(), image.size(), 0) == ssize_t(image.size()));
  // (No Catch2 assertion inside: the racing thread below calls it too.)
  auto read_fixed = [&](unsigned char* dst, unsigned n, int index) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read_fixed(sqe, fd, dst, n, 0, index);
    io_uring_cqe* cqe = nullptr;
    if (io_uring_submit(&ring) != 1 || io_uring_wait_cqe(&ring, &cqe) != 0) return -1;
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    return res;
  };
  // Registered in the range: refused, naming why; nothing changed; the kernel's writes still
  // land where the program reads.
  iovec inside{bytes + kMiB, 64 * 1024};
  REQUIRE(io_uring_register_buffers(&ring, &inside, 1) == 0);
  cxlpool::detail::DeviceError err{};
  CHECK(a->move_reservation(base, *b, nullptr, &err) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(a->describe("move", base, 4 * kMiB, err).find("io_uring registered buffer") != std::string::npos);
  CHECK(a->committed() == 4 * kMiB);
  CHECK(read_fixed(bytes + kMiB, 64 * 1024, 0) == 64 * 1024);
  CHECK(std::memcmp(bytes + kMiB, image.data(), 64 * 1024) == 0);
  // Unregistered: it moves.
  REQUIRE(io_uring_unregister_buffers(&ring) == 0);
  REQUIRE(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);
  // A buffer registered elsewhere does not hold this range.
  std::vector<unsigned char> elsewhere(64 * 1024);
  iovec outside{elsewhere.data(), elsewhere.size()};
  REQUIRE(io_uring_register_buffers(&ring, &outside, 1) == 0);
  REQUIRE(b->move_reservation(base, *a, nullptr, nullptr) == CXLPOOL_OK);
  REQUIRE(io_uring_unregister_buffers(&ring) == 0);
  // Registrations racing the moves: every read lands where the program reads it.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, wrong{0}, failed{0};
  std::thread registrar([&] {
    unsigned seed = 99;
    while (!stop.load(std::memory_order_relaxed)) {
      unsigned char* dst = bytes + 4096 * (rand_r(&seed) % 960);
      iovec v{dst, 64 * 1024};
      if (io_uring_register_buffers(&ring, &v, 1) != 0) {
        ++failed;
        continue;
      }
      for (int k = 0; k < 4; ++k) {
        std::memset(dst, 0xEE, 64 * 1024);
        if (read_fixed(dst, 64 * 1024, 0) != 64 * 1024) {
          ++failed;
          continue;
        }
        ++reads;
        if (std::memcmp(dst, image.data(), 64 * 1024) != 0) ++wrong;
      }
      io_uring_unregister_buffers(&ring);
      usleep(200);  // unregistered for a moment (asleep, not running): moves get through
    }
  });
  Device* from = a.get();
  Device* to = b.get();
  int moved = 0, refused = 0;
  for (int m = 0; m < 3000 && moved < 100; ++m) {
    if (from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK) {
      ++moved;
      std::swap(from, to);
    } else {
      ++refused;
    }
  }
  stop = true;
  registrar.join();
  WARN("registered-buffer reads while the range moved: " << reads.load() << " reads, " << wrong.load() << " wrong, "
                                                         << failed.load() << " failed; " << moved << " moves, "
                                                         << refused << " refused");
  CHECK(wrong.load() == 0);
  CHECK(failed.load() == 0);
  CHECK(reads.load() > 0);
  CHECK(moved > 0);
  io_uring_queue_exit(&ring);
  close(fd);
  REQUIRE(from->release(base, 1, nullptr) == CXLPOOL_OK);
#endif
}

TEST_CASE("the fence probe's sentence names the mode, what is off, why and the knob, for every mode", "[rebind]") {
  using cxlpool::os::write_fence::explain;
  using cxlpool::os::write_fence::Mode;
  using cxlpool::os::write_fence::Probe;
  Probe p;
  p.mode = Mode::kKernel;
  CHECK(explain(p, 0, "6.18.0").empty());  // nothing to say
  p.mode = Mode::kUserModeOnly;
  p.syscall_errno = EPERM;
  p.device_errno = EACCES;
  std::string s = explain(p, 0, "6.18.0");
  INFO(s);
  CHECK(s.find("user-mode-only") != std::string::npos);
  CHECK(s.find("moves that copy") != std::string::npos);
  CHECK(s.find("NUMA-to-NUMA") != std::string::npos);
  CHECK(s.find("vm.unprivileged_userfaultfd=0") != std::string::npos);
  CHECK(s.find("EACCES") != std::string::npos);
  CHECK(s.find("sysctl vm.unprivileged_userfaultfd=1") != std::string::npos);
  CHECK(s.find("/dev/userfaultfd") != std::string::npos);
  CHECK(s.find('\n') == std::string::npos);  // one line
  p.device_errno = ENOENT;
  CHECK(explain(p, -1, "").find("absent (kernel before 6.1") != std::string::npos);
  p = Probe{};
  p.mode = Mode::kNone;
  p.error = EINVAL;
  s = explain(p, 0, "6.1.0");
  CHECK(s.find("write fences: none") != std::string::npos);
  CHECK(s.find("kernel 6.1.0") != std::string::npos);
  CHECK(s.find("WP_UNPOPULATED") != std::string::npos);
  p.error = ENOSYS;
  CHECK(explain(p, 0, "").find("no userfaultfd") != std::string::npos);
  p.error = EPERM;
  CHECK(explain(p, 0, "").find("seccomp") != std::string::npos);
  p = Probe{};
  p.error = EMFILE;
  CHECK(explain(p, 0, "").find("tried again") != std::string::npos);
  // This process: root here has kernel-mode fences, by the system call.
  if (geteuid() == 0) {
    const Probe here = cxlpool::os::write_fence::probe();
    CHECK(here.mode == Mode::kKernel);
    CHECK_FALSE(here.via_device);
  }
}

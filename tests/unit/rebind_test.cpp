// SPDX-License-Identifier: MIT
// Movable residency (Device::move_reservation) and write fences: bytes survive a move between
// every pair of device kinds with the ledgers moved exactly; writer threads lose no write and
// see no torn record while their memory moves 1,000 times; refusals leave everything as it
// was; a fault outside every fence still reaches the program's own SIGSEGV handler, and a
// handler the program installs later is not fought; threads blocking SIGSEGV, system calls
// writing the range and the program's page protections survive moves; a hostile program
// (handlers writing the range, descriptors closed under the fence, mprotect racing the copy,
// mlock and madvise tags) loses nothing and gets a refusal that names why.
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
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
    spec.kind = CXLPOOL_BACKING_FILE;
    spec.path = "/tmp/cxlpool-rebind-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  }
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

}  // namespace

TEST_CASE("a reservation moves between every pair of device kinds with its bytes and its ledger", "[rebind]") {
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
  const uint64_t waited_before = cxlpool::os::write_fence::writes_waited();
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
  // The fence was exercised: userfaultfd fences where they can be had, else mprotect ones that
  // held writers.
  CHECK((cxlpool::os::write_fence::uffd_fences() >= uffd_before + 1000 ||
         cxlpool::os::write_fence::writes_waited() > waited_before));
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

TEST_CASE("a fault outside every fence reaches the program's handler, or kills as it would have", "[rebind]") {
  void* fenced = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(fenced != MAP_FAILED);
  REQUIRE(guard != MAP_FAILED);
  // Default action: a child whose first fence puts our handler in front of SIG_DFL, and that
  // faults outside the fence, dies of SIGSEGV; it does not hang.
  pid_t child = fork();
  if (child == 0) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    int s = -1;
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != 0) _exit(3);
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
  CHECK(run_fresh("fresh process: faults outside the fence reach the program's handler installed before ours"));
  munmap(fenced, 4096);
  munmap(guard, 4096);
}

TEST_CASE("fresh process: faults outside the fence reach the program's handler installed before ours", "[.][fresh]") {
  void* fenced = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(fenced != MAP_FAILED);
  REQUIRE(guard != MAP_FAILED);
  struct sigaction prog {
  }, saved{};
  prog.sa_handler = program_handler;
  sigemptyset(&prog.sa_mask);
  REQUIRE(sigaction(SIGSEGV, &prog, &saved) == 0);
  int slot = -1;
  REQUIRE(cxlpool::os::write_fence::raise(fenced, 4096, &slot) == 0);  // installs ours in front
  g_program_handler_ran = 0;
  if (sigsetjmp(g_jump, 1) == 0) *static_cast<volatile char*>(guard) = 1;
  CHECK(g_program_handler_ran == 1);
  cxlpool::os::write_fence::lift(slot);
  // A framework saves the disposition (ours), runs with its own, and restores it: while its
  // own is in place fences refuse; restored, they work again.
  struct sigaction other {
  }, ours{};
  other.sa_handler = [](int) {};
  sigemptyset(&other.sa_mask);
  REQUIRE(sigaction(SIGSEGV, &other, &ours) == 0);
  CHECK(cxlpool::os::write_fence::raise(fenced, 4096, &slot) == EBUSY);
  REQUIRE(sigaction(SIGSEGV, &ours, nullptr) == 0);
  REQUIRE(cxlpool::os::write_fence::raise(fenced, 4096, &slot) == 0);
  cxlpool::os::write_fence::lift(slot);
  // The program puts back the handler it had before ours: ours goes in front of it again, and
  // faults outside fences still reach it.
  REQUIRE(sigaction(SIGSEGV, &prog, nullptr) == 0);
  REQUIRE(cxlpool::os::write_fence::raise(fenced, 4096, &slot) == 0);
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
  cxlpool::os::write_fence::lift(slot);
  REQUIRE(sigaction(SIGSEGV, &saved, nullptr) == 0);
  munmap(fenced, 4096);
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
  void* fenced = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  auto* calls =
      static_cast<volatile int*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(fenced != MAP_FAILED);
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
    sigaction(SIGSEGV, &reporter, &g_reporter_previous);  // first: chains to SIG_DFL
    int s = -1;
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != 0) _exit(3);  // ours in front of it
    cxlpool::os::write_fence::lift(s);
    sigaction(SIGSEGV, &reporter, &g_reporter_previous);                   // registers again: now chains to ours
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != 0) _exit(4);  // the same handler: ours in front
    cxlpool::os::write_fence::lift(s);
    *static_cast<volatile char*>(guard) = 1;  // ours -> reporter -> ours: the default action
    _exit(5);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("status " << status << ", reporter called " << *calls << " times (exit 42: a loop)");
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(*calls == 1);
  munmap(const_cast<int*>(calls), 4096);
  munmap(fenced, 4096);
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

TEST_CASE("a program handler installed after ours is not fought: no loop, fences refuse instead", "[rebind]") {
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
    int s = -1;
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != 0) _exit(3);  // ours, in front of SIG_DFL
    cxlpool::os::write_fence::lift(s);
    struct sigaction mine {};
    mine.sa_sigaction = chaining_handler;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    sigaction(SIGSEGV, &mine, &g_replaced);  // replaces ours, chains to it
    // Ours is not put back in front: fences and sampling traps refuse.
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != EBUSY) _exit(4);
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
  SECTION("read(2) into memory while it moves: no EFAULT (when the fence's userfaultfd may hold system calls)") {
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
    const bool user_only = cxlpool::os::write_fence::uffd_user_mode_only();
    WARN("read(2) into a range moved 200 times: " << ok.load() << " complete, " << efault.load() << " EFAULT"
                                                  << (user_only ? " (userfaultfd is user-mode-only here)" : ""));
    CHECK(ok.load() > 0);
    CHECK(other.load() == 0);
    if (cxlpool::os::write_fence::uffd_fences() > 0 && !user_only) CHECK(efault.load() == 0);
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
  for (int fd = 3; fd < 4096; ++fd) {
    char link[64], target[128] = {};
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    if (readlink(link, target, sizeof target - 1) > 0 && std::strstr(target, "userfaultfd")) out.push_back(fd);
  }
  return out;
}
}  // namespace

TEST_CASE("moves under a hostile program: signal handlers, closed descriptors, mprotect races, attributes",
          "[rebind]") {
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
  const cxlpool_status_t st = a->move_reservation(base, *b, nullptr, nullptr);  // mprotect fence, or refused
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  Device* from = st == CXLPOOL_OK ? b.get() : a.get();
  Device* to = st == CXLPOOL_OK ? a.get() : b.get();
  REQUIRE(from->move_reservation(base, *to, nullptr, nullptr) == CXLPOOL_OK);
  CHECK(cxlpool::os::write_fence::uffd_fences() > before);  // descriptors are back: userfaultfd again
  REQUIRE(to->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("a SIGSEGV sent by raise() or kill() is not taken for a fault", "[rebind]") {
  void* fenced = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(fenced != MAP_FAILED);
  pid_t child = fork();
  if (child == 0) {
    alarm(20);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    int s = -1;
    if (cxlpool::os::write_fence::raise(fenced, 4096, &s) != 0) _exit(3);  // ours in front of SIG_DFL
    cxlpool::os::write_fence::lift(s);
    raise(SIGSEGV);  // the default action: death
    _exit(4);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  munmap(fenced, 4096);
}

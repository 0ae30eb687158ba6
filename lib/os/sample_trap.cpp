// SPDX-License-Identifier: MIT
// Sampling traps (sample_trap.hpp): a table of sampled pages and the one SIGSEGV handler that
// counts and undoes their first touches and passes every other fault on. The handler only
// reads and swaps atomics, waits on futexes, calls mprotect and the program's previous
// handler: async-signal-safe, no allocation, no lock.
#include "os/sample_trap.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <new>

#include "os/prim.hpp"

namespace cxlpool::os::sample_trap {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");

std::atomic<uint32_t> g_lifts{0};  // bumped whenever pages of the table are settled
std::atomic<uint64_t> g_passed_on{0};
std::mutex g_install_mu;  // ensure_installed() only, never the handler
struct sigaction g_previous {};

// The last fault this thread let retry outside the table's armed pages, and the settle count
// then: a fault on a page whose protection was being settled is retried once; a second fault
// at the same address with nothing settled in between is the program's.
__attribute__((tls_model("initial-exec"))) thread_local uintptr_t tl_retried_addr = 0;
__attribute__((tls_model("initial-exec"))) thread_local uint32_t tl_retried_lifts = 0;

// The signal this thread is handing to the program's handler, and this handler's frame then:
// when that handler chains back to ours (it saved ours as the one it replaced), the same
// siginfo arrives deeper on the same stack. A handler that leaves by siglongjmp leaves these
// set; a later fault has its own siginfo, or one at the same place with ours above it again.
__attribute__((tls_model("initial-exec"))) thread_local const siginfo_t* tl_chained_info = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local uintptr_t tl_chained_frame = 0;

uintptr_t frame_here() noexcept { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

bool called_back(const siginfo_t* info) noexcept { return info == tl_chained_info && frame_here() < tl_chained_frame; }

// Calls the program's handler, marking the signal as handed on while it runs.
template <typename Call>
void chain(const siginfo_t* info, Call&& call) {
  const siginfo_t* const outer_info = tl_chained_info;
  const uintptr_t outer_frame = tl_chained_frame;
  tl_chained_info = info;
  tl_chained_frame = frame_here();
  call();
  tl_chained_info = outer_info;
  tl_chained_frame = outer_frame;
}

void default_action(int sig, bool sent) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (sent) ::raise(sig);  // pending while this handler runs; terminates when it returns
}

void pass_on(int sig, siginfo_t* info, void* context) {
  g_passed_on.fetch_add(1, std::memory_order_relaxed);
  const struct sigaction prev = g_previous;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    chain(info, [&] { prev.sa_sigaction(sig, info, context); });
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler) {
    chain(info, [&] { prev.sa_handler(sig); });
  } else {
    // Default action: restore it and return; the instruction faults again and the program
    // terminates (with a core) exactly as it would have without us.
    default_action(sig, false);
  }
}

// ---- Sampling traps ----
// Entry states. armed -> restoring -> touched (the handler), armed -> disarming -> released or
// dead (the arming thread: restored, or left to its owner).
enum TrapState : uint32_t { kArmed = 1, kRestoring, kTouched, kDisarming, kReleased, kDead };
struct Trap {
  std::atomic<uintptr_t> page{0};
  std::atomic<uint32_t> state{0};
};
Trap g_traps[sample_trap::kMaxPages];
std::atomic<size_t> g_trap_count{0};
std::atomic<uint32_t> g_trap_clearing{0};  // odd while clear() empties the table
std::atomic<uint32_t> g_trap_busy{0};      // handlers reading the table
std::atomic<uint32_t> g_trap_released{0};  // bumped by released(): disarming pages decided
std::atomic<uint64_t> g_trap_touches{0}, g_trap_ns{0};
std::atomic<size_t> g_page_size{0};

uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

Trap* find_trap(uintptr_t page) noexcept {
  size_t lo = 0, hi = g_trap_count.load(std::memory_order_acquire);
  const size_t n = hi;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_traps[mid].page.load(std::memory_order_relaxed) < page)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == n || g_traps[lo].page.load(std::memory_order_relaxed) != page) return nullptr;
  return &g_traps[lo];
}

enum class TrapVerdict { kNotOurs, kHandled, kRetryOnce };

// A fault at addr against the sampling table. kHandled: a first touch, undone; kRetryOnce: a
// page of the table whose protection someone else is settling (another thread's first touch,
// or the arming thread's disarm): the access is retried once, like a fault just after a lift.
TrapVerdict on_trap_fault(uintptr_t addr) noexcept {
  const size_t ps = g_page_size.load(std::memory_order_relaxed);
  if (ps == 0) return TrapVerdict::kNotOurs;
  const uintptr_t page = addr & ~(uintptr_t(ps) - 1);
  for (;;) {
    g_trap_busy.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t c = g_trap_clearing.load(std::memory_order_seq_cst);
    if (c & 1) {
      g_trap_busy.fetch_sub(1, std::memory_order_seq_cst);
      prim::futex_wait(reinterpret_cast<const uint32_t*>(&g_trap_clearing), c, 10);
      continue;
    }
    const uint32_t released = g_trap_released.load(std::memory_order_acquire);
    Trap* t = find_trap(page);
    if (!t) {
      g_trap_busy.fetch_sub(1, std::memory_order_seq_cst);
      return TrapVerdict::kNotOurs;
    }
    uint32_t s = t->state.load(std::memory_order_acquire);
    if (s == kArmed && t->state.compare_exchange_strong(s, kRestoring, std::memory_order_acq_rel)) {
      const uint64_t t0 = now_ns();
      mprotect(reinterpret_cast<void*>(page), ps, PROT_READ | PROT_WRITE);
      t->state.store(kTouched, std::memory_order_release);
      g_trap_touches.fetch_add(1, std::memory_order_relaxed);
      g_trap_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
      g_trap_busy.fetch_sub(1, std::memory_order_seq_cst);
      return TrapVerdict::kHandled;
    }
    g_trap_busy.fetch_sub(1, std::memory_order_seq_cst);
    if (s == kRestoring) {
      while (t->state.load(std::memory_order_acquire) == kRestoring) sched_yield();
      return TrapVerdict::kRetryOnce;
    }
    if (s == kDisarming) {
      while (g_trap_released.load(std::memory_order_acquire) == released)
        prim::futex_wait(reinterpret_cast<const uint32_t*>(&g_trap_released), released, 100);
      return TrapVerdict::kRetryOnce;
    }
    return s == kTouched || s == kReleased ? TrapVerdict::kRetryOnce : TrapVerdict::kNotOurs;
  }
}

// A SIGSEGV another process or the program itself sent (kill, raise, sigqueue: si_code <= 0)
// is no fault of ours: the program's handler gets it, or its disposition applies.
void pass_on_sent(int sig, siginfo_t* info, void* context) {
  g_passed_on.fetch_add(1, std::memory_order_relaxed);
  const struct sigaction prev = g_previous;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    chain(info, [&] { prev.sa_sigaction(sig, info, context); });
  } else if (prev.sa_handler == SIG_IGN) {
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler) {
    chain(info, [&] { prev.sa_handler(sig); });
  } else {
    default_action(sig, true);  // the signal again, with the default disposition
  }
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  if (called_back(info)) {
    // The program's handler, given this signal by us, gave it back (its "previous" is ours):
    // the disposition before both of us is not known, so the default one applies.
    default_action(sig, info->si_code <= 0);
    errno = saved_errno;
    return;
  }
  if (info->si_code <= 0) {
    pass_on_sent(sig, info, context);
    errno = saved_errno;
    return;
  }
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const TrapVerdict trap = on_trap_fault(addr);
  if (trap == TrapVerdict::kHandled) {
    tl_retried_addr = 0;
    errno = saved_errno;
    return;  // the access runs again, on the page made accessible again
  }
  const uint32_t lifts = g_lifts.load(std::memory_order_acquire);
  if (tl_retried_addr != addr || tl_retried_lifts != lifts) {
    tl_retried_addr = addr;
    tl_retried_lifts = lifts;
    errno = saved_errno;
    return;
  }
  tl_retried_addr = 0;
  pass_on(sig, info, context);
  errno = saved_errno;
}

bool g_installed_once = false;  // g_install_mu

bool same_disposition(const struct sigaction& a, const struct sigaction& b) noexcept {
  if ((a.sa_flags & SA_SIGINFO) != (b.sa_flags & SA_SIGINFO)) return false;
  return (a.sa_flags & SA_SIGINFO) ? a.sa_sigaction == b.sa_sigaction : a.sa_handler == b.sa_handler;
}

// Installs on_segv in front of whatever handles SIGSEGV now. EBUSY when the program has
// replaced ours since with a handler of its own: ours is not put back in front (a handler that
// chains to the one it replaced would then call ours, and ours it). Put back in front are only
// dispositions nothing can chain from (SIG_DFL, SIG_IGN) and the very handler ours was in
// front of before (a program that saved its disposition and restored it, as test frameworks
// do); if that one chains to ours meanwhile, called_back() ends the loop.
int ensure_installed() noexcept {
  std::lock_guard<std::mutex> lock(g_install_mu);
  struct sigaction current {};
  if (sigaction(SIGSEGV, nullptr, &current) != 0) return errno;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return 0;
  const bool no_handler =
      !(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN);
  if (g_installed_once && !no_handler && !same_disposition(current, g_previous)) return EBUSY;
  g_installed_once = true;
  struct sigaction ours {};
  ours.sa_sigaction = on_segv;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  g_previous = current;
  if (sigaction(SIGSEGV, &ours, nullptr) != 0) return errno;
  return 0;
}

}  // namespace

int install_handler() noexcept { return ensure_installed(); }

uint64_t faults_passed_on() noexcept { return g_passed_on.load(std::memory_order_relaxed); }

int arm(uintptr_t page) noexcept {
  if (g_page_size.load(std::memory_order_relaxed) == 0) {
    if (int e = ensure_installed()) return e;
    g_page_size.store(size_t(sysconf(_SC_PAGESIZE)), std::memory_order_relaxed);
  } else if (int e = ensure_installed()) {
    return e;
  }
  const size_t ps = g_page_size.load(std::memory_order_relaxed);
  if (page & (ps - 1)) return EINVAL;
  const size_t n = g_trap_count.load(std::memory_order_relaxed);
  if (n == kMaxPages) return EBUSY;
  if (n && g_traps[n - 1].page.load(std::memory_order_relaxed) >= page) return ERANGE;
  Trap& t = g_traps[n];
  t.page.store(page, std::memory_order_relaxed);
  t.state.store(kArmed, std::memory_order_relaxed);
  g_trap_count.store(n + 1, std::memory_order_release);  // findable before it faults
  if (mprotect(reinterpret_cast<void*>(page), ps, PROT_NONE) != 0) {
    int e = errno;
    t.state.store(kDead, std::memory_order_release);
    return e;
  }
  return 0;
}

void stop(uintptr_t begin, uintptr_t end, uintptr_t* touched, size_t cap_t, size_t* n_touched, uintptr_t* untouched,
          size_t cap_u, size_t* n_untouched) noexcept {
  *n_touched = *n_untouched = 0;
  const size_t n = g_trap_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    Trap& t = g_traps[i];
    const uintptr_t p = t.page.load(std::memory_order_relaxed);
    if (p < begin || p >= end) continue;
    uint32_t s = t.state.load(std::memory_order_acquire);
    if (s == kArmed && t.state.compare_exchange_strong(s, kDisarming, std::memory_order_acq_rel)) {
      if (*n_untouched < cap_u) untouched[(*n_untouched)++] = p;
      continue;
    }
    if ((s == kRestoring || s == kTouched) && *n_touched < cap_t) touched[(*n_touched)++] = p;
  }
}

int restore(uintptr_t page) noexcept {
  const size_t ps = g_page_size.load(std::memory_order_relaxed);
  Trap* t = find_trap(page);
  if (!t || t->state.load(std::memory_order_acquire) != kDisarming) return ENOENT;
  if (mprotect(reinterpret_cast<void*>(page), ps, PROT_READ | PROT_WRITE) != 0) return errno;
  t->state.store(kReleased, std::memory_order_release);
  return 0;
}

void forget(uintptr_t begin, uintptr_t end) noexcept {
  const size_t n = g_trap_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    Trap& t = g_traps[i];
    const uintptr_t p = t.page.load(std::memory_order_relaxed);
    if (p < begin || p >= end) continue;
    uint32_t s = kArmed;
    if (!t.state.compare_exchange_strong(s, kDead, std::memory_order_acq_rel) && s == kDisarming)
      t.state.compare_exchange_strong(s, kDead, std::memory_order_acq_rel);
  }
}

void disarm_in_fork_child() noexcept {
  const size_t ps = g_page_size.load(std::memory_order_relaxed);
  const size_t n = g_trap_count.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    Trap& t = g_traps[i];
    if (t.state.load(std::memory_order_relaxed) == kArmed)
      mprotect(reinterpret_cast<void*>(t.page.load(std::memory_order_relaxed)), ps, PROT_READ | PROT_WRITE);
    t.state.store(kDead, std::memory_order_relaxed);
  }
  g_trap_count.store(0, std::memory_order_release);
  g_trap_busy.store(0, std::memory_order_relaxed);
  if (g_trap_clearing.load(std::memory_order_relaxed) & 1) g_trap_clearing.fetch_add(1, std::memory_order_relaxed);
}

void released() noexcept {
  const size_t n = g_trap_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = kDisarming;
    g_traps[i].state.compare_exchange_strong(s, kDead, std::memory_order_acq_rel);
  }
  g_lifts.fetch_add(1, std::memory_order_release);
  g_trap_released.fetch_add(1, std::memory_order_release);
  prim::futex_wake(reinterpret_cast<uint32_t*>(&g_trap_released));
}

void clear() noexcept {
  g_trap_clearing.fetch_add(1, std::memory_order_seq_cst);  // odd: handlers wait
  while (g_trap_busy.load(std::memory_order_seq_cst) != 0) sched_yield();
  g_trap_count.store(0, std::memory_order_release);
  g_trap_clearing.fetch_add(1, std::memory_order_seq_cst);
  g_lifts.fetch_add(1, std::memory_order_release);
  prim::futex_wake(reinterpret_cast<uint32_t*>(&g_trap_clearing));
}

size_t armed() noexcept {
  size_t k = 0;
  const size_t n = g_trap_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (g_traps[i].state.load(std::memory_order_relaxed) == kArmed) ++k;
  return k;
}

uint64_t touches() noexcept { return g_trap_touches.load(std::memory_order_relaxed); }
uint64_t handler_ns() noexcept { return g_trap_ns.load(std::memory_order_relaxed); }

}  // namespace cxlpool::os::sample_trap

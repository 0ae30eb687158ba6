// SPDX-License-Identifier: MIT
// Write fences (write_fence.hpp): a table of fenced ranges and the SIGSEGV handler that parks
// writers on them. The handler only reads atomics, waits on a futex and calls the program's
// previous handler: async-signal-safe, no allocation, no lock.
#include "os/write_fence.hpp"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "os/prim.hpp"

namespace cxlpool::os::write_fence {
namespace {

struct Fence {
  std::atomic<bool> used{false};
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<uint32_t> seq{0};  // odd while the fence is up
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word");

Fence g_fences[kMaxFences];
std::atomic<uint32_t> g_lifts{0};  // bumped by every lift
std::atomic<uint64_t> g_waited{0}, g_passed_on{0};
std::mutex g_install_mu;  // raise() only, never the handler
struct sigaction g_previous {};

// The last fault this thread let retry outside any fence, and the lift count then: a fault
// taken while a fence was up and handled after it was lifted is retried once; a second fault
// at the same address with no lift in between is the program's.
__attribute__((tls_model("initial-exec"))) thread_local uintptr_t tl_retried_addr = 0;
__attribute__((tls_model("initial-exec"))) thread_local uint32_t tl_retried_lifts = 0;

void pass_on(int sig, siginfo_t* info, void* context) {
  g_passed_on.fetch_add(1, std::memory_order_relaxed);
  const struct sigaction prev = g_previous;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler) {
    prev.sa_handler(sig);
  } else {
    // Default action: restore it and return; the instruction faults again and the program
    // terminates (with a core) exactly as it would have without us.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
  }
}

void on_segv(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Fence& f : g_fences) {
    const uint32_t s = f.seq.load(std::memory_order_acquire);
    if (!(s & 1)) continue;
    const uintptr_t b = f.begin.load(std::memory_order_relaxed), e = f.end.load(std::memory_order_relaxed);
    if (addr < b || addr >= e || f.seq.load(std::memory_order_acquire) != s) continue;
    g_waited.fetch_add(1, std::memory_order_relaxed);
    while (f.seq.load(std::memory_order_acquire) == s)
      prim::futex_wait(reinterpret_cast<const uint32_t*>(&f.seq), s, 100);
    tl_retried_addr = 0;
    errno = saved_errno;
    return;  // the write runs again, on what is mapped there now
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

// Installs on_segv in front of whatever handles SIGSEGV now (again, if the program replaced it).
int ensure_installed() noexcept {
  std::lock_guard<std::mutex> lock(g_install_mu);
  struct sigaction current {};
  if (sigaction(SIGSEGV, nullptr, &current) != 0) return errno;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return 0;
  struct sigaction ours {};
  ours.sa_sigaction = on_segv;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  g_previous = current;
  if (sigaction(SIGSEGV, &ours, nullptr) != 0) return errno;
  return 0;
}

}  // namespace

int raise(const void* addr, size_t len, int* slot) noexcept {
  if (int e = ensure_installed()) return e;
  for (int i = 0; i < kMaxFences; ++i) {
    Fence& f = g_fences[i];
    bool expected = false;
    if (!f.used.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) continue;
    f.begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_relaxed);
    f.end.store(reinterpret_cast<uintptr_t>(addr) + len, std::memory_order_relaxed);
    f.seq.fetch_add(1, std::memory_order_release);  // odd: up
    *slot = i;
    return 0;
  }
  return EBUSY;
}

void lift(int slot) noexcept {
  if (slot < 0 || slot >= kMaxFences) return;
  Fence& f = g_fences[slot];
  f.seq.fetch_add(1, std::memory_order_release);  // even: down
  g_lifts.fetch_add(1, std::memory_order_release);
  prim::futex_wake(reinterpret_cast<uint32_t*>(&f.seq));
  f.used.store(false, std::memory_order_release);
}

uint64_t writes_waited() noexcept { return g_waited.load(std::memory_order_relaxed); }
uint64_t faults_passed_on() noexcept { return g_passed_on.load(std::memory_order_relaxed); }

}  // namespace cxlpool::os::write_fence

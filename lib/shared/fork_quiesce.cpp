// SPDX-License-Identifier: MIT
// The watch passes against fork() (fork_quiesce.hpp): two counters rather than a lock held
// across fork(). The handshake is Dekker's: the forker counts itself in, then waits for the
// count of passes to drain; a pass counts itself in, then looks at the forkers, and backs out
// while there are any. Sequentially consistent on both sides: either the forker sees the pass
// counted, or the pass sees the forker.
//
// The child starts both counts at zero: a pass that counted itself in and was about to back
// out when the parent's memory was copied lives on in the child only as that count (its thread
// is not there), and a forker other than the child's own parent thread is not there either.
#include "shared/fork_quiesce.hpp"

#include <atomic>
#include <thread>

namespace cxlpool::detail::shared {
namespace {
std::atomic<int> g_forking{0};  // forks being prepared (two threads may fork at once)
std::atomic<int> g_passes{0};
}  // namespace

void fork_quiesce() noexcept {
  g_forking.fetch_add(1);
  while (g_passes.load() != 0) std::this_thread::yield();
}

void fork_resume() noexcept { g_forking.fetch_sub(1); }

void fork_resume_in_child() noexcept {
  g_passes.store(0);
  g_forking.store(0);
}

NoForkDuringPass::NoForkDuringPass() noexcept {
  for (;;) {
    while (g_forking.load() != 0) std::this_thread::yield();
    g_passes.fetch_add(1);
    if (g_forking.load() == 0) return;
    g_passes.fetch_sub(1);
  }
}

NoForkDuringPass::~NoForkDuringPass() { g_passes.fetch_sub(1); }

}  // namespace cxlpool::detail::shared

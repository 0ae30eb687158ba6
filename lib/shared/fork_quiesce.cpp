// SPDX-License-Identifier: MIT
// The watch passes against fork() (fork_quiesce.hpp): two atomics rather than a lock held
// across fork(), so nothing needs re-initialising in the child. The handshake is Dekker's: the
// forker raises the flag, then waits for the count of passes to drain; a pass counts itself
// in, then looks at the flag, and backs out while it is up. Sequentially consistent on both
// sides: either the forker sees the pass counted, or the pass sees the flag.
#include "shared/fork_quiesce.hpp"

#include <atomic>
#include <thread>

namespace cxlpool::detail::shared {
namespace {
std::atomic<bool> g_forking{false};
std::atomic<int> g_passes{0};
}  // namespace

void fork_quiesce() noexcept {
  g_forking.store(true);
  while (g_passes.load() != 0) std::this_thread::yield();
}

void fork_resume() noexcept { g_forking.store(false); }

NoForkDuringPass::NoForkDuringPass() noexcept {
  for (;;) {
    while (g_forking.load()) std::this_thread::yield();
    g_passes.fetch_add(1);
    if (!g_forking.load()) return;
    g_passes.fetch_sub(1);
  }
}

NoForkDuringPass::~NoForkDuringPass() { g_passes.fetch_sub(1); }

}  // namespace cxlpool::detail::shared

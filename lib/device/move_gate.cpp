// SPDX-License-Identifier: MIT
// The gate between moves and fork() (move_gate.hpp).
#include "device/move_gate.hpp"

#include <condition_variable>
#include <mutex>
#include <new>

namespace cxlpool::detail::move_gate {
namespace {
std::mutex g_mu;
std::condition_variable g_changed;
int g_active = 0;        // threads inside the gate
bool g_closing = false;  // a fork waits: new moves wait for it
thread_local int t_depth __attribute__((tls_model("initial-exec"))) = 0;

// Moves the forking thread itself has in flight (it forked from a move's hook).
int own() noexcept { return t_depth > 0 ? 1 : 0; }
}  // namespace

void enter() noexcept {
  if (t_depth++ > 0) return;
  std::unique_lock<std::mutex> lock(g_mu);
  g_changed.wait(lock, [] { return !g_closing; });
  ++g_active;
}

void leave() noexcept {
  if (--t_depth > 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_active == 0 && g_closing) g_changed.notify_all();
}

void close_for_fork() noexcept {
  std::unique_lock<std::mutex> lock(g_mu);
  g_closing = true;
  g_changed.wait(lock, [] { return g_active == own(); });
  g_closing = true;  // another thread's fork may have reopened it while this one waited
  lock.release();    // held until the parent or the child reopens the gate
}

void open_in_parent() noexcept {
  g_closing = false;
  g_changed.notify_all();
  g_mu.unlock();
}

void open_in_child() noexcept {
  // The parent's other threads, their moves and their waits are not in the child.
  g_active = own();
  g_closing = false;
  new (&g_changed) std::condition_variable();
  g_mu.unlock();
}

void reset_in_child() noexcept {
  new (&g_mu) std::mutex();
  new (&g_changed) std::condition_variable();
  g_active = own();
  g_closing = false;
}

}  // namespace cxlpool::detail::move_gate

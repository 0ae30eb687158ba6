// SPDX-License-Identifier: MIT
// Memory hot-remove and hot-add under numa devices. The kernel takes a node's memory away
// (memory blocks offlined: daxctl offline-memory, /sys/devices/system/memory/memoryN/state)
// by migrating its pages elsewhere itself; what it cannot do is stop a pool that still counts
// the node's old size from binding new pages there, which would fault on memory the node no
// longer has. So every numa device a pool opens is watched: a pass reads the node's MemTotal
// and, once it differs from what it was when the device was first watched, keeps the device's
// capacity at the smaller of it and the capacity the device would have otherwise. A shrink is
// a forced release from the top (what can move goes to the pools' other devices first; on a
// numa device nothing is lost, the budget only falls); a growth brings evacuated units home.
// Passes run on a thread of their own every CXLPOOL_NODE_WATCH_MS, or when the program asks.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "alloc/internal.hpp"
#include "common/parse.hpp"
#include "os/own_threads.hpp"
#include "os/prim.hpp"
#include "topology/model.hpp"

namespace cxlpool::detail::alloc {

namespace {

struct Watched {
  const Device* key = nullptr;  // identity (the weak pointer cannot be compared once expired)
  std::weak_ptr<Device> dev;
  std::string root;  // the sysfs root of the topology the device came from
  int node = -1;
  uint64_t baseline = 0;            // the node's MemTotal when first watched
  bool baseline_known = false;      // false: unreadable then (its first reading is a change)
  bool moved = false;               // the node's memory has changed since
  bool whole_node = false;          // a discovered node target: its capacity is the node's memory
  bool resized = false;             // someone else changed the capacity: it is the device's own now
  uint64_t wanted = 0;              // the capacity the device would have without the node's change
  uint64_t last_set = 0;            // the capacity the last pass left (another value: someone resized)
  uint64_t failed_at = UINT64_MAX;  // the target of the last change that failed (said once)
};

std::mutex g_watch_mu;                      // g_watched
std::vector<Watched>* g_watched = nullptr;  // never freed: the thread may outlive static destructors
std::mutex g_pass_mu;                       // one pass at a time
std::atomic<uint64_t> g_watch_ms{1000};
std::atomic<bool> g_thread_running{false};

// The same entry: one device object (its address may be reused once it is gone).
bool same(const Watched& a, const Watched& b) {
  return a.key == b.key && !a.dev.owner_before(b.dev) && !b.dev.owner_before(a.dev);
}

// Drops the entries of devices that closed (g_watch_mu held); nothing is allocated.
void prune_locked() {
  if (!g_watched) return;
  g_watched->erase(
      std::remove_if(g_watched->begin(), g_watched->end(), [](const Watched& w) { return w.dev.expired(); }),
      g_watched->end());
}

bool anything_watched() {
  std::lock_guard<std::mutex> lock(g_watch_mu);
  prune_locked();
  return g_watched && !g_watched->empty();
}

void* watcher_main(void*) {
  os::OwnThread mark("cxlpool/nodes");
  os::prim::block_async_signals(nullptr);
  enter_internal_scope();
  for (;;) {
    const uint64_t ms = g_watch_ms.load(std::memory_order_relaxed);
    if (ms == 0) break;
    os::prim::sleep_ms(unsigned(std::min<uint64_t>(ms, 600'000)));
    node_watch_pass();
    if (anything_watched()) continue;
    g_thread_running.store(false, std::memory_order_release);
    // A device watched after the check above found the thread still running.
    if (anything_watched() && !g_thread_running.exchange(true)) continue;
    break;
  }
  leave_internal_scope();
  return nullptr;
}

// Without the thread (none may start here: segment.cpp), passes run when the program asks
// (cxlpool_device_watch_nodes).
void start_watcher() noexcept {
  if (g_watch_ms.load(std::memory_order_relaxed) != 0) start_background_thread(g_thread_running, watcher_main);
}

// One device: its node's memory now, and the capacity change that follows. True if changed.
bool follow(Watched& w, Device& dev) {
  const std::optional<uint64_t> total = node_memory_now(w.root, w.node);
  if (!total) return false;  // unknown: nothing to act on
  const uint64_t cap = dev.capacity();
  if (cap != w.last_set) {  // resized by someone else since the last pass
    w.wanted = cap;
    w.resized = true;
  }
  if (*total != w.baseline || !w.baseline_known) w.moved = true;
  w.last_set = cap;
  if (!w.moved) return false;
  const uint64_t ps = dev.caps().page_size;
  uint64_t target = w.whole_node && !w.resized ? *total : std::min(w.wanted, *total);
  target -= target % ps;
  if (target == cap) return false;
  CapacityReport r;
  std::vector<LostRange> lost;
  std::string message;
  const cxlpool_status_t s = device_follow(dev, target, &r, &lost, &message);
  w.last_set = dev.capacity();
  const bool again = s != CXLPOOL_OK && w.failed_at == target;
  w.failed_at = s == CXLPOOL_OK ? UINT64_MAX : target;
  if (again) return r.capacity_after != r.capacity_before;  // said at the first failure; tried each pass
  std::string text = "cxlpool: device '" + dev.name() + "': node " + std::to_string(w.node) + " has " +
                     format_bytes(*total) + " of memory now (" +
                     (w.baseline_known ? format_bytes(w.baseline) : std::string("unknown")) +
                     " when the device opened): " + "capacity " + format_bytes(r.capacity_before) + " -> " +
                     format_bytes(r.capacity_after);
  if (r.evacuated_units)
    text += ", " + std::to_string(r.evacuated_units) + " units (" + format_bytes(r.evacuated_bytes) + ") moved off";
  if (r.returned_units)
    text += ", " + std::to_string(r.returned_units) + " units (" + format_bytes(r.returned_bytes) + ") back home";
  if (s != CXLPOOL_OK || r.lost_units) text += ": " + message;
  os::prim::write_stderr((text + "\n").c_str());
  return r.capacity_after != r.capacity_before;
}

}  // namespace

void node_watch_add(const std::shared_ptr<Device>& dev, const std::string& sysfs_root, bool whole_node) noexcept {
  if (!dev || dev->caps().kind != CXLPOOL_BACKING_NUMA || dev->spec().numa_node < 0) return;
  try {
    std::lock_guard<std::mutex> lock(g_watch_mu);
    if (!g_watched) g_watched = new std::vector<Watched>();
    prune_locked();
    for (const Watched& w : *g_watched)
      if (w.key == dev.get()) return;
    Watched w;
    w.key = dev.get();
    w.dev = dev;
    w.root = sysfs_root;
    w.node = dev->spec().numa_node;
    const std::optional<uint64_t> now = node_memory_now(sysfs_root, w.node);
    w.baseline = now.value_or(0);
    w.baseline_known = now.has_value();
    w.wanted = w.last_set = dev->capacity();
    w.whole_node = whole_node;
    g_watched->push_back(std::move(w));
  } catch (...) {
    return;  // out of host memory: the device is not watched (the pool works as before)
  }
  start_watcher();
}

size_t node_watch_pass() noexcept {
  try {
    std::lock_guard<std::mutex> pass(g_pass_mu);
    std::vector<Watched> list;
    {
      std::lock_guard<std::mutex> lock(g_watch_mu);
      if (!g_watched) return 0;
      list = *g_watched;
    }
    size_t changed = 0;
    for (Watched& w : list) {
      std::shared_ptr<Device> dev = w.dev.lock();
      if (dev && follow(w, *dev)) ++changed;
    }
    std::lock_guard<std::mutex> lock(g_watch_mu);
    // The pass's findings go back to the entries it read, which stay in order (entries are
    // appended, and removed only by prune_locked, which keeps the order).
    size_t at = 0;
    for (Watched& mine : *g_watched) {
      while (at < list.size() && !same(list[at], mine)) ++at;
      if (at == list.size()) break;
      const Watched& w = list[at++];
      mine.moved = w.moved;
      mine.wanted = w.wanted;
      mine.last_set = w.last_set;
      mine.failed_at = w.failed_at;
      mine.resized = w.resized;
    }
    prune_locked();
    return changed;
  } catch (...) {
    return 0;  // out of host memory: the next pass tries again
  }
}

std::optional<uint64_t> node_memory_of(const Device& dev) noexcept {
  std::string root;
  int node = -1;
  {
    std::lock_guard<std::mutex> lock(g_watch_mu);
    if (!g_watched) return std::nullopt;
    for (const Watched& w : *g_watched)
      if (w.key == &dev) {
        try {
          root = w.root;
        } catch (...) {
          return std::nullopt;
        }
        node = w.node;
        break;
      }
  }
  if (node < 0) return std::nullopt;
  try {
    return node_memory_now(root, node);
  } catch (...) {
    return std::nullopt;
  }
}

void set_node_watch_ms(uint64_t ms) noexcept {
  g_watch_ms.store(ms, std::memory_order_relaxed);
  if (ms && anything_watched()) start_watcher();
}

void node_watch_lock_for_fork() noexcept { g_watch_mu.lock(); }
void node_watch_unlock_after_fork() noexcept { g_watch_mu.unlock(); }
void node_watch_reset_lock_in_child() noexcept { new (&g_watch_mu) std::mutex(); }

void node_watch_reset_after_fork() noexcept {
  new (&g_pass_mu) std::mutex();
  g_thread_running.store(false, std::memory_order_relaxed);  // the thread is not in the child
  if (anything_watched()) start_watcher();                   // the child's devices are its own
}

}  // namespace cxlpool::detail::alloc

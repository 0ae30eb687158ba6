// SPDX-License-Identifier: MIT
// Device registry (see registry.hpp). Entries hold a weak reference; the shared_ptr deleter
// removes its entry and destroys the device under the registry lock, so fork() (which holds
// that lock) never sees a device half destroyed.
#include "device/registry.hpp"

#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::registry {
namespace {

struct Entry {
  Device* device;
  std::weak_ptr<Device> weak;
};

std::mutex g_mu;
std::vector<Entry>* g_devices = nullptr;  // never destroyed: devices may outlive static destructors

// fork(): the pipe on which a child reports that its copies are taken (only while some
// device has private copy-mode memory committed; -1 otherwise).
int g_fork_pipe[2] = {-1, -1};

bool same_spec(const BackingSpec& a, const BackingSpec& b) {
  return a.device_name == b.device_name && a.kind == b.kind && a.numa_node == b.numa_node && a.path == b.path &&
         a.capacity == b.capacity && a.page_size == b.page_size && a.fork_mode == b.fork_mode;
}

bool same_named_object(const BackingSpec& a, const BackingSpec& b) {
  bool named = a.kind == CXLPOOL_BACKING_SHM || a.kind == CXLPOOL_BACKING_FILE || a.kind == CXLPOOL_BACKING_DEVDAX;
  return named && a.kind == b.kind && a.path == b.path;
}

void destroy(Device* d) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_devices->begin(); it != g_devices->end(); ++it)
    if (it->device == d) {
      g_devices->erase(it);
      break;
    }
  delete d;
}

}  // namespace

std::shared_ptr<Device> acquire(const BackingSpec& spec) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_devices) g_devices = new std::vector<Entry>();
  for (Entry& e : *g_devices) {
    if (same_spec(e.device->requested_spec(), spec))
      if (auto live = e.weak.lock()) return live;
    if (same_named_object(e.device->spec(), spec))
      fail(CXLPOOL_E_BUSY, "device '" + spec.device_name + "': " + spec.path +
                               " is already open in this process as device '" + e.device->name() +
                               "' with a different configuration; a named device is opened once");
  }
  std::shared_ptr<Device> d(new Device(spec), [](Device* p) { destroy(p); });
  g_devices->push_back({d.get(), d});
  return d;
}

// Lock order: the registry lock, then each device in registry order (alloc/fork.cpp takes
// its own locks before these).
void fork_prepare() noexcept {
  g_mu.lock();
  bool copy = false;
  if (g_devices)
    for (Entry& e : *g_devices) {
      e.device->lock_for_fork();
      copy |= e.device->fork_needs_copy();
    }
  if (copy && os::prim::pipe_cloexec(g_fork_pipe) != 0) g_fork_pipe[0] = g_fork_pipe[1] = -1;
}

void fork_parent() noexcept {
  if (g_devices)
    for (auto it = g_devices->rbegin(); it != g_devices->rend(); ++it) it->device->unlock_after_fork();
  if (g_fork_pipe[0] >= 0) {
    // Wait until the child has its own copy of private copy-mode memory: until then it reads
    // the storage this process writes. If fork() failed, nobody else holds the write end and
    // the read returns at once.
    os::prim::close_fd(g_fork_pipe[1]);
    // A child that cannot finish (stopped by a debugger, say) must not hang its parent for
    // ever; after a minute the parent goes on and says so.
    if (!os::prim::read_byte(g_fork_pipe[0], 60'000))
      os::prim::write_stderr(
          "cxlpool: fork: the child has not finished copying private memory after 60 s; the parent continues "
          "(its writes may reach the child's view of that memory)\n");
    os::prim::close_fd(g_fork_pipe[0]);
    g_fork_pipe[0] = g_fork_pipe[1] = -1;
  }
  g_mu.unlock();
}

void fork_child() noexcept {
  if (g_devices)
    for (Entry& e : *g_devices) {
      char message[512];
      if (!e.device->child_after_fork(message, sizeof message)) {
        // The child would share the parent's memory: it must not run on.
        os::prim::write_stderr("cxlpool: fork: ");
        os::prim::write_stderr(message);
        os::prim::write_stderr("; the child exits (status 127) rather than share the parent's memory\n");
        os::prim::exit_now(127);
      }
    }
  if (g_fork_pipe[0] >= 0) {
    os::prim::close_fd(g_fork_pipe[0]);
    os::prim::write_byte(g_fork_pipe[1]);
    os::prim::close_fd(g_fork_pipe[1]);
    g_fork_pipe[0] = g_fork_pipe[1] = -1;
  }
  if (g_devices)
    for (auto it = g_devices->rbegin(); it != g_devices->rend(); ++it) it->device->unlock_after_fork();
  g_mu.unlock();
}

}  // namespace cxlpool::detail::registry

// SPDX-License-Identifier: MIT
// Device registry (see registry.hpp). Entries hold a weak reference; the shared_ptr deleter
// removes its entry and destroys the device under the registry lock, so fork() (which holds
// that lock) never sees a device half destroyed.
#include "device/registry.hpp"

#include <mutex>
#include <new>
#include <vector>

#include "backing/claim.hpp"
#include "backing/provider.hpp"
#include "common/error.hpp"
#include "device/move_gate.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/write_fence.hpp"

namespace cxlpool::detail::registry {
namespace {

struct Entry {
  Device* device;
  std::weak_ptr<Device> weak;
};

std::mutex g_mu;
// Set while this thread holds g_mu to open a device: a provider that opens a shared pool
// (pool:...) registers it from inside the device's construction, under the same lock. (Not a
// recursive mutex: a fork child could not release the parent thread's hold of one.)
__attribute__((tls_model("initial-exec"))) thread_local bool t_opening = false;
// g_mu, unless this thread holds it already for a device it is opening.
struct TableLock {
  std::unique_lock<std::mutex> lock{g_mu, std::defer_lock};
  TableLock() {
    if (!t_opening) lock.lock();
  }
};
std::vector<Entry>* g_devices = nullptr;  // never destroyed: devices may outlive static destructors
std::vector<std::weak_ptr<SharedDevice>>* g_shared = nullptr;  // (g_mu) likewise

// fork(): a page shared with the child, on which it reports that its copies are taken (only
// while some device has private copy-mode memory committed). No descriptor is needed, so a
// program that has used them all up still forks correctly.
struct ForkSync {
  uint32_t state;  // kCopying until the child is done
  int32_t child_pid;
};
constexpr uint32_t kCopying = 1, kDone = 2;
ForkSync* g_sync = nullptr;
bool g_wait_for_child = false;
alignas(16) unsigned char g_saved_mask[os::prim::kSignalMaskBytes];

bool same_spec(const BackingSpec& a, const BackingSpec& b) {
  return a.device_name == b.device_name && a.kind == b.kind && a.numa_node == b.numa_node && a.path == b.path &&
         a.capacity == b.capacity && a.max_space == b.max_space && a.page_size == b.page_size &&
         a.fork_mode == b.fork_mode;
}

// Two specs naming one object (however spelled: shm:q is file:/dev/shm/q).
bool same_named_object(const BackingSpec& a, const BackingSpec& b) {
  std::string ia = DeviceClaim::identity_of(a);
  return !ia.empty() && ia == DeviceClaim::identity_of(b);
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

// The live shared device of identity (g_mu held), or nullptr; drops expired records.
std::shared_ptr<SharedDevice> shared_of(const std::string& identity) {
  std::shared_ptr<SharedDevice> found;
  if (!g_shared) return found;
  for (auto it = g_shared->begin(); it != g_shared->end();) {
    std::shared_ptr<SharedDevice> live = it->lock();
    if (!live) {
      it = g_shared->erase(it);
      continue;
    }
    if (!found && live->identity == identity) found = std::move(live);
    ++it;
  }
  return found;
}

}  // namespace

std::shared_ptr<Device> acquire(const BackingSpec& spec) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_devices) g_devices = new std::vector<Entry>();
  const std::string identity = DeviceClaim::identity_of(spec);
  if (!identity.empty())
    if (std::shared_ptr<SharedDevice> s = shared_of(identity))
      fail(CXLPOOL_E_BUSY, "device '" + spec.device_name + "': " + s->path +
                               " holds a shared pool this process has open ('" + s->location +
                               "'); a private device never takes a shared pool's device");
  for (Entry& e : *g_devices) {
    if (same_spec(e.device->requested_spec(), spec))
      if (auto live = e.weak.lock()) return live;
    if (same_named_object(e.device->spec(), spec))
      fail(CXLPOOL_E_BUSY, "device '" + spec.device_name + "': " + spec.path +
                               " is already open in this process as device '" + e.device->name() +
                               "' with a different configuration; a named device is opened once");
  }
  t_opening = true;
  Device* made = nullptr;
  try {
    made = new Device(spec);
  } catch (...) {
    t_opening = false;
    throw;
  }
  t_opening = false;
  std::shared_ptr<Device> d(made, [](Device* p) { destroy(p); });
  g_devices->push_back({d.get(), d});
  return d;
}

std::shared_ptr<Device> find(const std::string& name, size_t* matches) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::shared_ptr<Device> found;
  size_t n = 0;
  if (g_devices)
    for (Entry& e : *g_devices)
      if (e.device->name() == name)
        if (auto live = e.weak.lock()) {
          ++n;
          if (!found) found = std::move(live);
        }
  if (matches) *matches = n;
  return found;
}

std::shared_ptr<SharedDevice> add_shared(const BackingSpec& spec, const std::string& path, uint64_t pool_bytes) {
  std::string identity = DeviceClaim::identity_of(spec);
  if (identity.empty()) identity = "path:" + path;  // no kind can hold a pool without one today
  const std::string real = os::real_path_or(path);
  TableLock lock;
  if (!g_shared) g_shared = new std::vector<std::weak_ptr<SharedDevice>>();
  if (std::shared_ptr<SharedDevice> s = shared_of(identity)) return s;
  if (g_devices)
    for (Entry& e : *g_devices)
      if (DeviceClaim::identity_of(e.device->spec()) == identity && !e.weak.expired())
        fail(CXLPOOL_E_BUSY, path + " is open in this process as private device '" + e.device->name() +
                                 "'; a shared pool never shares a device with a private one");
  auto s = std::make_shared<SharedDevice>();
  s->location = format_location(spec);
  s->path = path;
  s->identity = identity;
  s->real_path = real;
  s->ledger.capacity.store(pool_bytes, std::memory_order_relaxed);
  g_shared->push_back(s);
  return s;
}

std::shared_ptr<SharedDevice> find_shared(const std::string& name) {
  // However spelled: a location ("shm:q", "file:/dev/shm/./q") or a path, through symbolic
  // links (resolved here, read-only: the object is ours and open already).
  BackingSpec spec;
  std::string identity, real;
  if (parse_location(name, &spec).empty()) {
    identity = DeviceClaim::identity_of(spec);
    if (const Provider* p = provider_for(spec.kind)) real = os::real_path_or(p->named_path(spec));
  } else if (!name.empty() && name[0] == '/') {
    real = os::real_path_or(name);
  }
  TableLock lock;
  if (!g_shared) return nullptr;
  for (const std::weak_ptr<SharedDevice>& w : *g_shared)
    if (std::shared_ptr<SharedDevice> s = w.lock())
      if (s->location == name || s->path == name || (!identity.empty() && s->identity == identity) ||
          (!real.empty() && s->real_path == real))
        return s;
  return nullptr;
}

// Lock order: the registry lock, then each device in registry order (alloc/fork.cpp takes
// its own locks before these).
void fork_prepare() noexcept {
  // The move gate is closed already (alloc/fork.cpp, before any lock a move's last step takes).
  g_mu.lock();
  bool copy = false;
  if (g_devices)
    for (Entry& e : *g_devices) {
      e.device->lock_for_fork();
      copy |= e.device->fork_needs_copy();
    }
  g_wait_for_child = false;
  if (!copy) return;
  if (!g_sync) g_sync = static_cast<ForkSync*>(os::prim::map_shared_page());
  if (!g_sync) {
    os::prim::write_stderr(
        "cxlpool: fork: no memory for one page to wait for the child's copy; the child copies "
        "while this process runs on\n");
    return;
  }
  __atomic_store_n(&g_sync->state, kCopying, __ATOMIC_SEQ_CST);
  __atomic_store_n(&g_sync->child_pid, 0, __ATOMIC_SEQ_CST);
  g_wait_for_child = true;
  // Until the child has its copy it maps this process's memory: no signal handler may run
  // in this thread, in either process, before the copy is taken.
  os::prim::block_signals(g_saved_mask);
}

void fork_parent() noexcept {
  if (g_devices)
    for (auto it = g_devices->rbegin(); it != g_devices->rend(); ++it) it->device->unlock_after_fork();
  if (g_wait_for_child) {
    // Wait until the child has its own copy of private copy-mode memory: until then it reads
    // the storage this process writes. A child that died (or a fork that failed) ends the
    // wait; a child that cannot finish (stopped by a debugger, say) ends it after a minute.
    for (int waited = 0; __atomic_load_n(&g_sync->state, __ATOMIC_SEQ_CST) == kCopying; waited += 50) {
      int pid = __atomic_load_n(&g_sync->child_pid, __ATOMIC_SEQ_CST);
      if ((pid > 0 && os::prim::child_gone(pid)) || (pid == 0 && waited >= 1000)) break;
      if (waited >= 60'000) {
        os::prim::write_stderr(
            "cxlpool: fork: the child has not finished copying private memory after 60 s; the parent continues "
            "(its writes may reach the child's view of that memory)\n");
        break;
      }
      os::prim::futex_wait(&g_sync->state, kCopying, 50);
    }
    os::prim::restore_signals(g_saved_mask);
    g_wait_for_child = false;
  }
  g_mu.unlock();
}

void fork_child() noexcept {
  if (g_wait_for_child) __atomic_store_n(&g_sync->child_pid, os::prim::process_id(), __ATOMIC_SEQ_CST);
  os::write_fence::forget_fences_in_fork_child();  // the child never holds the parent's fences up
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
  if (g_sync) {
    if (g_wait_for_child) {
      __atomic_store_n(&g_sync->state, kDone, __ATOMIC_SEQ_CST);
      os::prim::futex_wake(&g_sync->state);
    }
    os::prim::unmap_page(g_sync);  // the parent's; the child makes its own for its forks
    g_sync = nullptr;
  }
  if (g_wait_for_child) {
    os::prim::restore_signals(g_saved_mask);
    g_wait_for_child = false;
  }
  if (g_devices)
    for (auto it = g_devices->rbegin(); it != g_devices->rend(); ++it) it->device->unlock_after_fork();
  // A fork child is no participant of its parent's shared pools (it opens them itself): it has
  // none of their devices open. The records stay alive with the pool objects the child
  // inherited, unlisted. (Only weak references are dropped: nothing is freed here.)
  if (g_shared) g_shared->clear();
  g_mu.unlock();
}

void reset_locks_in_child() noexcept {
  move_gate::reset_in_child();
  new (&g_mu) std::mutex();
  g_sync = nullptr;  // the parent's page: this child waits on nothing there
  g_wait_for_child = false;
  if (g_devices)
    for (Entry& e : *g_devices) e.device->reset_lock_in_child();
}

}  // namespace cxlpool::detail::registry

// SPDX-License-Identifier: MIT
// devdax:PATH — a device-DAX character device (/dev/daxX.Y: a CXL region, a pmem namespace, an
// HMAT-described range). Held under flock for as long as cxlpool uses it: LOCK_EX by the one
// process that owns it as a private device, LOCK_SH by every participant of the shared pool it
// holds. A device carrying a shared pool's superblock is a shared device: no private device
// adopts it.
#include <cerrno>
#include <cstring>

#include "backing/provider.hpp"
#include "common/error.hpp"

namespace cxlpool::detail {
namespace {

constexpr size_t kHead = size_t(2) << 20;  // device-DAX maps in units of its alignment (2 MiB)

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  return parse_absolute_path(arg, has_arg, "devdax", "devdax:/dev/dax0.0", out);
}

std::string format(const BackingSpec& s) { return "devdax:" + s.path; }
std::string named_path(const BackingSpec& s) { return s.path; }
std::string claim_identity(const BackingSpec& s) { return "devdax:" + os::real_path_or(s.path); }

void lock_or_fail(int fd, bool exclusive, const std::string& what) {
  const int err = os::try_lock(fd, exclusive);
  if (err == 0) return;
  if (err == EWOULDBLOCK)
    fail(CXLPOOL_E_BUSY, what + (exclusive ? " is in use (flock held: a shared pool on it, or another process's device)"
                                           : " is in use by a private device of a process (flock(LOCK_EX) held)"));
  fail_os(what + ": flock", err);
}

// Whether fd's first bytes are a shared pool's: read through a read-only mapping (device-DAX
// has no read()); a device that cannot be mapped says nothing (the device's own probe fails).
bool holds_shared_pool(int fd) {
  const void* head = os::try_map_readonly(fd, kHead);
  if (!head) return false;
  const bool pool = std::memcmp(head, kSharedPoolMagic, sizeof kSharedPoolMagic) == 0;
  os::unmap(const_cast<void*>(head), kHead);
  return pool;
}

void open_storage(const BackingSpec& spec, bool fork_copy, StorageOpen* out) {
  if (fork_copy) {  // device-DAX cannot be duplicated: a fork child's copy lives in a memfd
    open_fork_copy_storage(spec, out);
    return;
  }
  const std::string what = "device '" + spec.device_name + "': devdax:" + spec.path;
  SharedObject node;  // closes the descriptor unless it becomes the storage's
  node.fd = os::open_char_device(spec.path);
  lock_or_fail(node.fd, true, what);
  if (holds_shared_pool(node.fd))
    fail(CXLPOOL_E_CONFIG, what +
                               " holds a cxlpool shared pool: open it with cxlpool_shared_pool_open; a private device "
                               "never adopts it (clear its first 4 KiB to use it otherwise)");
  out->fd = node.release();
  out->description = spec.path;
}

// The device node, checked to be device-DAX, opened (writable: read-write) and not yet locked.
SharedObject open_node(const BackingSpec& spec, bool writable, const std::string& what) {
  if (!os::is_char_device(spec.path) || os::char_device_subsystem(spec.path) != "dax")
    fail(CXLPOOL_E_CONFIG, what + ": " + spec.path + " is not a device-DAX character device");
  SharedObject o;
  o.fd = writable ? os::open_existing(spec.path, true, what) : os::open_existing_readonly(spec.path, true, what);
  o.device_node = true;
  o.size = UINT64_MAX;
  o.path = spec.path;
  return o;
}

SharedObject open_shared(const BackingSpec& spec, bool writable, const std::string& what) {
  SharedObject o = open_node(spec, writable, what);
  if (writable) lock_or_fail(o.fd, false, what);
  return o;
}

// One formatter, and no participant, while formatting. A device in use by a pool says so.
SharedObject create_shared(const BackingSpec& spec, unsigned, const std::string& what, os::NewFileSite*) {
  SharedObject o = open_node(spec, true, what);
  if (os::try_lock(o.fd, true) == EWOULDBLOCK && holds_shared_pool(o.fd))
    fail(CXLPOOL_E_EXISTS, what + ": the device already holds a cxlpool shared pool, open here; open it instead");
  lock_or_fail(o.fd, true, what);
  return o;
}

void publish_shared(SharedObject* obj, os::NewFileSite*, const std::string& what) {
  if (int err = os::try_lock(obj->fd, false)) fail_os(what + ": flock(LOCK_SH)", err);
}

void remove_shared(const BackingSpec&, const os::PathIdentity&, const std::string& what) {
  fail(CXLPOOL_E_NOT_SUPPORTED, what + ": a device has no name to remove");
}

const SharedObjectOps kDevdaxObjectOps = {open_shared, create_shared, publish_shared, remove_shared};

// A declared device must be a device-DAX node (a symbolic link to one is resolved when opened).
std::string check_declared(const BackingSpec& spec, bool) {
  const std::string kind = os::path_kind(spec.path);
  if (kind != "character device" && kind != "symbolic link")
    return "'" + format(spec) + "' is " + (kind.empty() ? std::string("missing") : "a " + kind) +
           ", not a device-DAX character device";
  const std::string subsystem = os::char_device_subsystem(spec.path);
  if (subsystem != "dax")
    return "'" + format(spec) + "' is a " +
           (subsystem.empty() ? std::string("character device of unknown kind") : "'" + subsystem + "' device") +
           ", not device-DAX memory (/sys/dev/char/*/subsystem must be dax)";
  return "";
}

}  // namespace

extern const Provider kDevdaxProvider = {
    "devdax",       CXLPOOL_BACKING_DEVDAX, "devdax:PATH",     false,          true,    parse, format, named_path,
    claim_identity, open_storage,           &kDevdaxObjectOps, check_declared, nullptr,
};

}  // namespace cxlpool::detail

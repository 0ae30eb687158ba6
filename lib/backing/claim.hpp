// SPDX-License-Identifier: MIT
// The claim on a named device (shm:NAME, file:PATH, devdax:PATH): at most one process of a
// user holds a named device privately. A claim is two things the kernel releases when the
// holder dies (even by SIGKILL): a listening abstract-namespace Unix socket bound to a name
// derived from the device's identity and the user, which names the holder's pid; and, since
// abstract names exist per network namespace (a container has its own), a flock(2) on a lock
// file beside the device (`.cxlpool-claim.<name>` in its directory: os/claim_lock.hpp),
// seen by every process that can see the device. devdax devices are locked themselves. Who
// holds a name is asked of the kernel (sock_diag, then SO_PEERCRED; /proc/locks), never read
// from a name: a name bound or a file made by another user is a squatter's (or a stray
// program's), not a claim, and does not keep the device from its user.
#pragma once

#include <string>

#include "backing/backing_spec.hpp"
#include "os/claim_lock.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail {

class DeviceClaim {
 public:
  // Claims identity (e.g. "file:/dev/shm/pool0", "devdax:/dev/dax0.0") for this process: its
  // socket. Throws Failure(CXLPOOL_E_BUSY) naming device_name, what and the holder's pid when
  // another process of this user holds it. A name held by another user leaves this process
  // unclaimed, said on stderr (its memory is private either way; see docs/backing.md).
  DeviceClaim(const std::string& identity, const std::string& device_name, const std::string& what);
  // The claim's second half, once the device's storage exists (the lock file never takes the
  // room, or the last inode, the storage needs): the lock file beside the device as the user
  // named it (lock_dir, lock_base; devdax has none: the device is locked itself). Throws
  // Failure(CXLPOOL_E_BUSY) when a process of another namespace holds it (the socket claim is
  // dropped then).
  void lock_beside(const std::string& lock_dir, const std::string& lock_base);
  ~DeviceClaim();
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;

  // The identity of a named device (shm:NAME, file:PATH, devdax:PATH): the same object
  // however it is named (a shm name is its file in /dev/shm; directories by real path).
  // "" for a device no other process can name. From the device's provider.
  static std::string identity_of(const BackingSpec& spec);

 private:
  std::string device_name_, what_;
  int claim_fd_ = -1;
  os::prim::FileId claim_id_{};  // closed only while still this socket
  os::ClaimLock lock_;           // the lock file beside the device (file identities)
};

}  // namespace cxlpool::detail

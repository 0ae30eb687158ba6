// SPDX-License-Identifier: MIT
// The claim on a named device (shm:NAME, file:PATH, devdax:PATH): at most one process of a
// user holds a named device privately. A claim is a listening abstract-namespace Unix socket
// bound to a name derived from the device's identity and the user, so the kernel releases it
// when the holder dies (even by SIGKILL) and nothing is ever left in a filesystem. Who holds a
// name is asked of the kernel (sock_diag, then SO_PEERCRED), never read from a name: an
// abstract name carries no permissions, so a name bound by another user is a squatter's (or a
// stray program's), not a claim, and does not keep the device from its user.
#pragma once

#include <string>

#include "os/prim.hpp"

namespace cxlpool::detail {

class DeviceClaim {
 public:
  // Claims identity (e.g. "file:/dev/shm/pool0", "devdax:/dev/dax0.0") for this process.
  // Throws Failure(CXLPOOL_E_BUSY) naming device_name, what and the holder's pid when another
  // process of this user holds it. A name held by another user leaves this process unclaimed,
  // said on stderr (its memory is private either way; see docs/backing.md).
  DeviceClaim(const std::string& identity, const std::string& device_name, const std::string& what);
  ~DeviceClaim();
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;

  // The identity of a named device (shm:NAME, file:PATH, devdax:PATH): the same object
  // however it is named (a shm name is its file in /dev/shm; directories by real path).
  static std::string identity_of(int kind, const std::string& path);

 private:
  int claim_fd_ = -1;
  os::prim::FileId claim_id_{};  // closed only while still this socket
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The claim on a named device (shm:NAME, file:PATH, devdax:PATH): at most one process holds
// a named device privately. A claim is an abstract-namespace Unix socket bound to a name
// derived from the device's identity, so the kernel releases it when the holder dies (even by
// SIGKILL) and nothing is ever left in a filesystem; a second, info socket carries the
// holder's pid so a refused process can say who holds the device.
#pragma once

#include <string>

#include "os/prim.hpp"

namespace cxlpool::detail {

class DeviceClaim {
 public:
  // Claims identity (e.g. "shm:/pool0", "file:<dev>:<ino>/name", "devdax:<rdev>") for this
  // process. Throws Failure(CXLPOOL_E_BUSY) naming device_name, what and the holder's pid
  // when another process holds it.
  DeviceClaim(const std::string& identity, const std::string& device_name, const std::string& what);
  ~DeviceClaim();
  DeviceClaim(const DeviceClaim&) = delete;
  DeviceClaim& operator=(const DeviceClaim&) = delete;

  // Pid holding identity, or 0 when nobody (or only an unknown process) holds it.
  static int holder(const std::string& identity);
  // The identity of a named device (shm:NAME, file:PATH, devdax:PATH): the same object
  // however it is named (a shm name is its file in /dev/shm; directories by real path).
  static std::string identity_of(int kind, const std::string& path);

 private:
  int claim_fd_ = -1;
  int info_fd_ = -1;
  os::prim::FileId claim_id_{}, info_id_{};  // closed only while still these sockets
};

}  // namespace cxlpool::detail

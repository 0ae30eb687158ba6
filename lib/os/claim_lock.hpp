// SPDX-License-Identifier: MIT
// A claim that every process which can see a named device's directory sees, whatever its
// network or user namespace: flock(2) on a lock file beside the device (abstract socket
// names, the other half of a claim, exist per network namespace). The file belongs to the
// user who made it, whatever that user is called inside a namespace, and holds its holder's
// pid, start time, pid namespace and boot. The kernel drops the lock when its holder dies,
// even by SIGKILL; the file such a holder leaves is removed by a later claimant of the user in
// that directory once the holder is known to be dead, and every holder removes its own when
// done. Only a regular file of this user with one name is ever opened, and only after it was
// looked at through an O_PATH descriptor: another user's file, a link, a FIFO or anything else
// there is never opened, followed or changed (os/safe_path.hpp for the directory's walk).
#pragma once

#include <cstdint>
#include <string>

namespace cxlpool::os {

struct ClaimLock {
  int fd = -1;   // the locked file (close-on-exec, high)
  int dir = -1;  // O_PATH descriptor of its directory
  // Their identities: a program that closed a number and reused it keeps what it put there.
  uint64_t fd_dev = 0, fd_ino = 0, dir_dev = 0, dir_ino = 0;
  std::string name;
  long owner_pid = 0;  // the process that took it: only it removes the file
  ClaimLock() = default;
  ClaimLock(const ClaimLock&) = delete;
  ClaimLock& operator=(const ClaimLock&) = delete;
  ~ClaimLock();  // releases (see release_claim_lock)
};

// Who holds a claim lock, as far as this process can tell; or that the directory itself could
// not be used (the device's own storage will say why: its caller says nothing more).
struct ClaimHolder {
  long pid = -1;              // -1: unknown
  bool other_pidns = false;   // its pid is its own pid namespace's (a container's)
  bool dir_unusable = false;  // the directory's walk failed (missing, another user's link)
};

// The name of the lock file of a device named base in its directory: ".cxlpool-claim.BASE",
// or ".cxlpool-claim-h.<hash>" for a base too long to carry a prefix.
std::string claim_lock_name(const std::string& base);

// Takes the lock on dir/name (created 0600 if absent), first removing lock files there whose
// holders are known to be dead. Returns 0 when held; EWOULDBLOCK when a live process holds it
// (*holder says which); EPERM when what is there is not this user's regular file with one
// name (*why says what it is); another errno (the directory cannot be walked or written, no
// inode left) with *why.
int take_claim_lock(const std::string& dir, const std::string& name, ClaimLock* out, ClaimHolder* holder,
                    std::string* why) noexcept;

// Removes the file (by its taker, while still locked, and only if the name still is that
// file), then closes: a waiting taker finds the name gone and makes a fresh file. In a fork
// child (not the taker) only the descriptors close: the lock is the parent's.
void release_claim_lock(ClaimLock* lock) noexcept;

// At exit(): removes the lock files of the claims this process took and still holds (as
// release_claim_lock, without closing anything: the devices stay in use to the end). A fork
// child removes none: they are its parent's.
void remove_claim_lock_files() noexcept;

}  // namespace cxlpool::os

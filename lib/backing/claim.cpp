// SPDX-License-Identifier: MIT
// Device claims through listening abstract Unix sockets (see claim.hpp). The name is a hash of
// the device identity under the user's uid. A refused process asks the kernel whose socket
// holds the name (os/unix_names): this user's is a claim, another user's is not.
#include "backing/claim.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "backing/provider.hpp"
#include "common/error.hpp"
#include "cxlpool/backing.h"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/unix_names.hpp"

namespace cxlpool::detail {
namespace {

std::string claim_name(const std::string& identity) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : identity) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[80];
  std::snprintf(buf, sizeof buf, "cxlpool/claim/u%u/%016llx", static_cast<unsigned>(geteuid()),
                static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

DeviceClaim::DeviceClaim(const std::string& identity, const std::string& device_name, const std::string& what)
    : device_name_(device_name), what_(what) {
  const std::string name = claim_name(identity);
  os::AbstractNameOwner owner;
  // A holder that exits between our bind and our question frees the name: bind again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    claim_fd_ = os::listen_abstract_name(name);
    if (claim_fd_ >= 0) {
      os::prim::file_id(claim_fd_, &claim_id_);
      return;
    }
    const int err = errno;
    if (err != EADDRINUSE)
      fail_os("device '" + device_name + "': claiming " + what + " (abstract socket " + name + ")", err);
    owner = os::abstract_name_owner(name);
    if (owner.bound) break;
  }
  if (!owner.bound) owner.source = "it was bound and freed again each time it was asked";
  if (owner.uid_known && owner.uid == geteuid()) {
    std::string holder = owner.pid > 0    ? "pid " + std::to_string(owner.pid)
                         : owner.pid == 0 ? "a process of this user in another pid namespace"
                                          : "a process of this user (pid unknown: it does not answer yet)";
    if (owner.pid == os::prim::process_id())
      holder += " (this process: cxlpool is loaded twice, e.g. as the interposer and as libcxlpool.so)";
    fail(CXLPOOL_E_BUSY, "device '" + device_name + "': " + what + " is in use by " + holder +
                             "; a named device belongs to one process (choose another name, or share "
                             "memory through a shared pool)");
  }
  // Bound by another user: nothing of it can be this device's memory (ours is private), and
  // refusing would let anyone deny any device. Where the kernel cannot say whose it is, the
  // same holds: a refusal there would be a denial anyone could cause.
  std::string by;
  if (owner.uid_known)
    by = "uid " + std::to_string(owner.uid) + (owner.pid > 0 ? " (pid " + std::to_string(owner.pid) + ")" : "") +
         ", not by this user";
  else
    by = "a socket whose owner the kernel does not say (" + owner.source + ")";
  const std::string text = "cxlpool: device '" + device_name + "': the claim name of " + what + " (@" + name +
                           ") is bound by " + by +
                           "; the device is opened unclaimed (its memory is this process's own either way, but "
                           "another process of this user naming it is not refused)\n";
  os::prim::write_stderr(text.c_str());
}

void DeviceClaim::lock_beside(const std::string& dir, const std::string& base) {
  const std::string& device_name = device_name_;
  const std::string& what = what_;
  if (dir.empty() || base.empty()) return;
  const std::string file = os::claim_lock_name(base);
  os::ClaimHolder holder;
  std::string why;
  const int e = os::take_claim_lock(dir, file, &lock_, &holder, &why);
  if (e == 0) return;
  if (e == EWOULDBLOCK) {
    if (claim_fd_ >= 0) os::prim::close_fd(claim_fd_);  // refused: the socket claim goes too
    claim_fd_ = -1;
    const std::string who = holder.other_pidns ? "pid " + std::to_string(holder.pid) + " of another pid namespace"
                            : holder.pid > 0   ? "pid " + std::to_string(holder.pid)
                            : holder.pid == 0  ? "a process of this user in another pid namespace"
                                               : "a process of this user (pid unknown)";
    fail(CXLPOOL_E_BUSY, "device '" + device_name + "': " + what + " is in use by " + who +
                             ", which holds its claim lock " + dir + "/" + file +
                             " (seen from every network namespace); a named device belongs to one "
                             "process (choose another name, or share memory through a shared pool)");
  }
  if (holder.dir_unusable) return;  // the device's storage cannot be made there either: it says why
  // Another user's file there, or a directory that takes no lock: the socket claim stands alone.
  const std::string text = "cxlpool: device '" + device_name + "': no claim lock beside " + what + " (" + why +
                           "); processes of this user in other network namespaces are not refused\n";
  os::prim::write_stderr(text.c_str());
}

DeviceClaim::~DeviceClaim() {
  // Only our socket: the program may have closed it and reused the number.
  os::prim::FileId now;
  if (claim_fd_ >= 0 && os::prim::file_id(claim_fd_, &now) == 0 && now == claim_id_) os::prim::close_fd(claim_fd_);
}

std::string DeviceClaim::identity_of(const BackingSpec& spec) {
  const Provider* p = provider_for(spec.kind);
  return p ? p->claim_identity(spec) : "";
}

}  // namespace cxlpool::detail

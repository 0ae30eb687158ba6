// SPDX-License-Identifier: MIT
// Names in the abstract Unix socket namespace as process-lifetime markers: a listening stream
// socket bound to a name holds it until its process dies (even by SIGKILL), and nothing is
// left in a filesystem. An abstract name carries no permissions, so whoever bound it is asked
// of the kernel, never inferred from the name.
#pragma once

#include <sys/types.h>

#include <string>

namespace cxlpool::os {

// Binds a stream socket to the abstract name (without the leading NUL) and listens; returns
// the descriptor (close-on-exec, moved above the low numbers programs use) or -1 with errno
// (EADDRINUSE: the name is bound).
int listen_abstract_name(const std::string& name);

// Accepts one connection on a listening socket (close-on-exec, moved high); *uid and *pid are
// the peer's as the kernel recorded them at connect (SO_PEERCRED). -1 with errno.
int accept_peer(int listen_fd, uid_t* uid, pid_t* pid);
// Reads one line (up to a newline, EOF or cap bytes) into *out, waiting at most timeout_ms in
// all. false with errno (ETIMEDOUT: no whole line in time; EMSGSIZE: longer than cap).
bool read_line(int fd, std::string* out, size_t cap, int timeout_ms);
// Writes all of text to a socket; a peer that left is EPIPE, never SIGPIPE. 0 or an errno.
int send_all(int fd, const std::string& text);

// Who has a stream socket bound to an abstract name, as far as the kernel tells this process.
struct AbstractNameOwner {
  bool bound = false;      // a stream socket is bound to the name
  bool uid_known = false;  // uid below is the kernel's word
  uid_t uid = 0;
  // The holder's pid: > 0 in this pid namespace; 0 the holder is in a pid namespace this one
  // does not see; -1 unknown (it does not accept connections, being bound but not listening or
  // with its queue full, and no process this one may inspect in /proc holds it).
  pid_t pid = -1;
  // Where uid came from: "sock_diag", "SO_PEERCRED", "/proc/<pid>/fd", or, when uid_known is
  // false, why the kernel could not say (e.g. "no sock_diag for Unix sockets (module
  // unix_diag) and no readable process holds it").
  std::string source;
};

// Asks, in order: sock_diag (the bound socket's uid, listening or not, whatever is queued on
// it), a connection (SO_PEERCRED: pid and uid), and, when neither named a pid (or sock_diag is
// missing: a kernel without unix_diag), /proc/net/unix for the socket's inode and the
// /proc/<pid>/fd entries this process may read (all for root, its own user's otherwise; only
// where /proc shows this process's pid namespace).
AbstractNameOwner abstract_name_owner(const std::string& name);

}  // namespace cxlpool::os

// SPDX-License-Identifier: MIT
// Abstract Unix socket names (see unix_names.hpp): binding one, and asking the kernel whose it
// is: sock_diag first (no connection, so nothing queued on the holder hides it), then
// SO_PEERCRED, then, on kernels without unix_diag, /proc/net/unix and /proc/<pid>/fd.
#include "os/unix_names.hpp"

#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "os/prim.hpp"

namespace cxlpool::os {
namespace {

socklen_t abstract_address(const std::string& name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  const size_t len = std::min(name.size(), sizeof addr->sun_path - 1);
  std::memcpy(addr->sun_path + 1, name.data(), len);  // sun_path[0] = 0: abstract namespace
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + len);
}

// The listener's credentials through a nonblocking connection (pid 0: a process in a pid
// namespace this one does not see); false when nobody accepts (not listening, queue full).
bool peer_of(const std::string& name, ucred* who) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  sockaddr_un addr;
  const socklen_t alen = abstract_address(name, &addr);
  socklen_t len = sizeof *who;
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), alen) == 0 &&
                  getsockopt(fd, SOL_SOCKET, SO_PEERCRED, who, &len) == 0 && len == sizeof *who;
  close(fd);
  return ok;
}

// sock_diag (Linux 5.3+ for UNIX_DIAG_UID): 1 found (*uid set), 0 none bound, -1 the kernel
// cannot say (no unix_diag: ENOENT; or no UNIX_DIAG_UID).
int diag_owner(const std::string& name, uid_t* uid) {
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return -1;
  struct {
    nlmsghdr nh;
    unix_diag_req req;
  } ask{};
  ask.nh.nlmsg_len = sizeof ask;
  ask.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  ask.req.sdiag_family = AF_UNIX;
  ask.req.udiag_states = ~0u;
  ask.req.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) != sizeof ask) {
    close(fd);
    return -1;
  }
  const std::string want = std::string(1, '\0') + name;
  int result = -1;
  std::vector<char> buf(32768);  // malloc's alignment suffices for nlmsghdr
  for (bool done = false; !done;) {
    const ssize_t got = recv(fd, buf.data(), buf.size(), 0);
    if (got <= 0) break;
    // NLMSG_OK/NLMSG_NEXT, without their mix of signed and unsigned lengths.
    const auto fits = [](const nlmsghdr* h, size_t left) {
      return left >= sizeof(nlmsghdr) && h->nlmsg_len >= sizeof(nlmsghdr) && h->nlmsg_len <= left;
    };
    size_t left = static_cast<size_t>(got);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); fits(h, left);
         left -= std::min<size_t>(left, NLMSG_ALIGN(h->nlmsg_len)),
               h = reinterpret_cast<nlmsghdr*>(reinterpret_cast<char*>(h) + NLMSG_ALIGN(h->nlmsg_len))) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
        if (result < 0) result = 0;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        done = true;
        break;
      }
      const auto* m = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      if (m->udiag_type != SOCK_STREAM || result == 1) continue;
      int attrs = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
      bool named = false, has_uid = false;
      uid_t owner = 0;
      for (auto* a = reinterpret_cast<const rtattr*>(m + 1); RTA_OK(a, attrs); a = RTA_NEXT(a, attrs)) {
        if (a->rta_type == UNIX_DIAG_NAME)
          named = RTA_PAYLOAD(a) == want.size() && std::memcmp(RTA_DATA(a), want.data(), want.size()) == 0;
        if (a->rta_type == UNIX_DIAG_UID && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
          uint32_t u = 0;
          std::memcpy(&u, RTA_DATA(a), sizeof u);
          owner = u;
          has_uid = true;
        }
      }
      if (named && has_uid) {
        *uid = owner;
        result = 1;
      } else if (named) {
        done = true;  // a kernel without UNIX_DIAG_UID: it cannot say whose
        result = -1;
        break;
      }
    }
  }
  close(fd);
  return result;
}

// Calls fn(name) for each entry of the directory at dirfd/path (getdents64: no allocation, so
// usable while the interposer's allocator starts); false when it cannot be opened.
template <typename Fn>
bool each_entry(int dirfd, const char* path, Fn&& fn) {
  const int dir = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(8) char buf[4096];
  bool stop = false;
  while (!stop) {
    const long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long at = 0; at < n && !stop;) {
      unsigned short reclen = 0;  // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      const char* entry = buf + at + 19;
      at += reclen;
      if (entry[0] != '.') stop = fn(dir, entry);
    }
  }
  close(dir);
  return true;
}

// The inode of the stream socket bound to the abstract name, from /proc/net/unix (this network
// namespace's sockets, which is the namespace abstract names live in); 0 when none is listed.
unsigned long listed_inode(const std::string& name) {
  const int fd = open("/proc/net/unix", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string text;
  char chunk[8192];
  for (ssize_t n; (n = read(fd, chunk, sizeof chunk)) > 0;) text.append(chunk, size_t(n));
  close(fd);
  // "Num: RefCount Protocol Flags Type St Inode Path", the abstract name shown as "@name".
  const std::string want = "@" + name;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    unsigned type = 0, state = 0;
    unsigned long inode = 0;
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%*s %*x %*x %*x %x %x %lu %n", &type, &state, &inode, &path_at) < 3 || path_at <= 0)
      continue;
    // Connections queued or accepted on the name are listed under it too: only the socket
    // bound to it is unconnected (SS_UNCONNECTED, 1), and it has an inode.
    if (type == SOCK_STREAM && state == 1 && inode != 0 && line.compare(size_t(path_at), std::string::npos, want) == 0)
      return inode;
  }
  return 0;
}

// The filesystem uid of /proc/<entry> (a socket's owner is its creator's fsuid), from its
// status file: the directory's owner is root for a process that made itself non-dumpable.
bool owner_of(int proc, const char* entry, uid_t* uid) {
  char path[64];
  std::snprintf(path, sizeof path, "%s/status", entry);
  const int fd = openat(proc, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[4096];
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return false;
  text[n] = 0;
  const char* line = std::strstr(text, "\nUid:");
  unsigned real = 0, effective = 0, saved = 0, fs = 0;
  if (!line || std::sscanf(line + 5, "%u %u %u %u", &real, &effective, &saved, &fs) != 4) return false;
  *uid = uid_t(fs);
  return true;
}

// True when /proc shows this process's pid namespace (a process that entered a new one keeps
// its parent's /proc mount, whose pids would name other processes here).
bool proc_is_ours() {
  char link[32];
  const ssize_t n = readlink("/proc/self", link, sizeof link - 1);
  if (n <= 0) return false;
  link[n] = 0;
  return std::atoi(link) == prim::process_id();
}

// A process holding socket:[inode] among the /proc/<pid>/fd this process may read; *pid and
// *uid (the process's owner) set when found.
bool holder_of_inode(unsigned long inode, pid_t* pid, uid_t* uid) {
  char want[64];
  std::snprintf(want, sizeof want, "socket:[%lu]", inode);
  const int proc = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return false;
  bool found = false;
  each_entry(proc, ".", [&](int, const char* entry) {
    if (*entry < '1' || *entry > '9') return false;
    char fd_dir[64];
    std::snprintf(fd_dir, sizeof fd_dir, "%s/fd", entry);
    each_entry(proc, fd_dir, [&](int dir, const char* fd_name) {
      char link[64];
      const ssize_t k = readlinkat(dir, fd_name, link, sizeof link - 1);
      if (k <= 0) return false;
      link[k] = 0;
      found = std::strcmp(link, want) == 0;
      return found;
    });
    if (found && !owner_of(proc, entry, uid)) found = false;
    if (found) *pid = pid_t(std::atoi(entry));
    return found;
  });
  close(proc);
  return found;
}

}  // namespace

int listen_abstract_name(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  const socklen_t alen = abstract_address(name, &addr);
  // Those who are refused leave their connections queued (nobody accepts): the backlog bounds them.
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0 || listen(fd, SOMAXCONN) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return prim::move_fd_high(fd);
}

int accept_peer(int listen_fd, uid_t* uid, pid_t* pid) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return -1;
  ucred who{};
  socklen_t len = sizeof who;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &who, &len) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  *uid = who.uid;
  *pid = who.pid;
  return prim::move_fd_high(fd);
}

bool read_line(int fd, std::string* out, size_t cap, int timeout_ms) {
  out->clear();
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long spent = long(now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (spent >= timeout_ms) {
      errno = ETIMEDOUT;
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, int(timeout_ms - spent));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) continue;  // the deadline is checked above
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return !out->empty();  // EOF ends the line
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == '\n') return true;
      if (out->size() + 1 >= cap) {
        errno = EMSGSIZE;
        return false;
      }
      out->push_back(buf[i]);
    }
  }
}

int send_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    done += size_t(n);
  }
  return 0;
}

AbstractNameOwner abstract_name_owner(const std::string& name) {
  AbstractNameOwner out;
  uid_t uid = 0;
  const int diag = diag_owner(name, &uid);
  if (diag == 1) {
    out.bound = out.uid_known = true;
    out.uid = uid;
    out.source = "sock_diag";
  }
  ucred who{};
  if (diag != 0 && peer_of(name, &who)) {
    out.bound = true;
    out.pid = who.pid;
    if (!out.uid_known) {
      out.uid_known = true;
      out.uid = who.uid;
      out.source = "SO_PEERCRED";
    }
  }
  // No pid from a connection (bound but not listening, or its queue full), or no uid from
  // sock_diag: the socket's inode in /proc/net/unix, and the process holding it.
  if (diag != 0 && out.pid < 0 && proc_is_ours()) {
    if (const unsigned long inode = listed_inode(name)) {
      out.bound = true;
      pid_t pid = -1;
      uid_t owner = 0;
      if (holder_of_inode(inode, &pid, &owner)) {
        out.pid = pid;
        if (!out.uid_known) {
          out.uid_known = true;
          out.uid = owner;
          out.source = "/proc/" + std::to_string(pid) + "/fd";
        }
      }
    }
  }
  if (!out.uid_known && diag < 0)
    out.source = "no sock_diag for Unix sockets (module unix_diag) and no process this one may inspect holds it";
  return out;
}

}  // namespace cxlpool::os

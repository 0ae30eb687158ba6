// SPDX-License-Identifier: MIT
// Device claims through abstract Unix sockets (see claim.hpp). The claim socket's name is a
// hash of the device identity; the info socket's name adds the holder's pid, which a refused
// process finds in /proc/net/unix.
#include "backing/claim.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/error.hpp"
#include "cxlpool/backing.h"
#include "os/os.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail {
namespace {

std::string claim_name(const std::string& identity) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : identity) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "cxlpool/claim/%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Binds a datagram socket to the abstract name; returns the fd, -1 with errno on failure.
int bind_abstract(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  size_t len = std::min(name.size(), sizeof addr.sun_path - 1);
  std::memcpy(addr.sun_path + 1, name.data(), len);  // sun_path[0] = 0: abstract namespace
  socklen_t alen = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), alen) != 0) {
    int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return os::prim::move_fd_high(fd);
}

}  // namespace

int DeviceClaim::holder(const std::string& identity) {
  const std::string prefix = "@" + claim_name(identity) + "/pid/";
  for (int attempt = 0; attempt < 20; ++attempt) {  // the holder binds its info socket just after the claim
    std::string table;
    try {
      table = os::read_text_file("/proc/net/unix");
    } catch (const Failure&) {
      return 0;
    }
    size_t at = table.find(prefix);
    if (at != std::string::npos) {
      int pid = 0;
      for (size_t i = at + prefix.size(); i < table.size() && table[i] >= '0' && table[i] <= '9'; ++i)
        pid = pid * 10 + (table[i] - '0');
      return pid;
    }
    struct timespec ts {
      0, 1000000
    };
    nanosleep(&ts, nullptr);
  }
  return 0;
}

DeviceClaim::DeviceClaim(const std::string& identity, const std::string& device_name, const std::string& what) {
  const std::string name = claim_name(identity);
  claim_fd_ = bind_abstract(name);
  if (claim_fd_ < 0) {
    int err = errno;
    if (err != EADDRINUSE)
      fail_os("device '" + device_name + "': claiming " + what + " (abstract socket " + name + ")", err);
    int pid = holder(identity);
    std::string who = pid > 0 ? "pid " + std::to_string(pid) : "another process (pid unknown)";
    if (pid == os::prim::process_id())
      who += " (this process: cxlpool is loaded twice, e.g. as the interposer and as libcxlpool.so)";
    fail(CXLPOOL_E_BUSY, "device '" + device_name + "': " + what + " is in use by " + who +
                             "; a named device belongs to one process (choose another name, or share "
                             "memory through a shared pool)");
  }
  info_fd_ = bind_abstract(name + "/pid/" + std::to_string(os::prim::process_id()));
  // Without the info socket the claim still holds; only the pid in a refusal is unknown.
  os::prim::file_id(claim_fd_, &claim_id_);
  if (info_fd_ >= 0) os::prim::file_id(info_fd_, &info_id_);
}

DeviceClaim::~DeviceClaim() {
  // Only our sockets: the program may have closed them and reused the numbers.
  os::prim::FileId now;
  if (info_fd_ >= 0 && os::prim::file_id(info_fd_, &now) == 0 && now == info_id_) os::prim::close_fd(info_fd_);
  if (claim_fd_ >= 0 && os::prim::file_id(claim_fd_, &now) == 0 && now == claim_id_) os::prim::close_fd(claim_fd_);
}

std::string DeviceClaim::identity_of(int kind, const std::string& path) {
  auto real_dir = [](const std::string& p) {
    std::string dir = os::parent_dir(p), base = p.substr(p.find_last_of('/') + 1);
    if (char* real = realpath(dir.c_str(), nullptr)) {
      dir = real;
      free(real);
    }
    return dir + "/" + base;
  };
  switch (kind) {
    case CXLPOOL_BACKING_SHM:
      return "file:" + real_dir("/dev/shm/" + path);
    case CXLPOOL_BACKING_FILE:
      return "file:" + real_dir(path);
    case CXLPOOL_BACKING_DEVDAX: {
      std::string canon = path;
      if (char* real = realpath(path.c_str(), nullptr)) {
        canon = real;
        free(real);
      }
      return "devdax:" + canon;
    }
    default:
      return "";
  }
}

}  // namespace cxlpool::detail

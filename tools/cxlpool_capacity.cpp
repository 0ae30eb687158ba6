// SPDX-License-Identifier: MIT
// cxlpool-capacity: changes the capacity of a device in a running cxlpool program from
// outside, through the program's control socket (CXLPOOL_CONTROL=1; lib/stats/control.hpp):
// one request, one reply. The socket is found through the program's own descriptors
// (/proc/PID/fd, then its name in /proc/net/unix), never by a name someone could bind first,
// and after connecting the kernel (SO_PEERCRED) must say that its listener is that process's
// pid and user.
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

const char kUsage[] =
    "Usage: cxlpool-capacity PID show DEVICE\n"
    "       cxlpool-capacity PID resize DEVICE SIZE\n"
    "       cxlpool-capacity PID add DEVICE OFFSET LENGTH\n"
    "       cxlpool-capacity PID withdraw DEVICE OFFSET LENGTH\n"
    "       cxlpool-capacity PID offer DEVICE OFFSET LENGTH [OFFSET LENGTH ...]\n"
    "       cxlpool-capacity PID release DEVICE OFFSET LENGTH [--deadline SECONDS] [--force]\n"
    "Changes the capacity of DEVICE (a target name, e.g. cxl0) in the running cxlpool program PID,\n"
    "which must have been started with CXLPOOL_CONTROL=1 and belong to your user (or you are\n"
    "root). A withdrawal first gives back the program's free memory on the device, then moves\n"
    "its live blocks out of the range under the same addresses; what cannot move makes it\n"
    "refuse (exit 2), naming it, with nothing lost (docs/devices.md).\n"
    "offer and release are a Dynamic Capacity Device's events: the program accepts or rejects\n"
    "each offered extent (a verdict line each); a release is a withdrawal tried again until\n"
    "--deadline (default 0: once); with --force the extent then goes whatever holds it, and\n"
    "what could not move loses its memory there (lost= lines; exit 4).\n"
    "SIZE, OFFSET, LENGTH: bytes with an optional K, M, G or T suffix.\n"
    "Prints the program's reply as key=value lines.\n"
    "Exit: 0 done; 1 bad arguments or the program refused the request; 2 busy (something in\n"
    "the range could not move); 3 no control socket for PID, it is not PID's, or no reply in time\n"
    "(a request sent may still be applied);\n"
    "4 a forced release took memory the program held (lost= lines say where).\n"
    "  --timeout SECONDS  how long to wait for the reply (default 300: a withdrawal moves memory);\n"
    "                     anywhere on the line\n"
    "  --help             this text\n"
    "  --version          the version\n";

[[noreturn]] void usage_error(const char* why) {
  std::fprintf(stderr, "cxlpool-capacity: %s\n%s", why, kUsage);
  std::exit(1);
}

[[noreturn]] void no_socket(long pid, const std::string& why) {
  std::fprintf(stderr, "cxlpool-capacity: process %ld: %s\n", pid, why.c_str());
  std::exit(3);
}

// The abstract name (without the leading NUL) of the listening control socket among pid's
// descriptors; exits 3 when there is none.
std::string find_socket(long pid) {
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(fds.c_str());
  if (!d)
    no_socket(pid, errno == ENOENT ? std::string("no such process")
                                   : "cannot read " + fds + " (" + std::strerror(errno) +
                                         "): only its user and root may change its capacity");
  std::set<unsigned long> inodes;
  while (dirent* e = readdir(d)) {
    char link[64];
    const ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = 0;
    unsigned long ino = 0;
    if (std::sscanf(link, "socket:[%lu]", &ino) == 1) inodes.insert(ino);
  }
  closedir(d);
  // /proc/net/unix: Num RefCount Protocol Flags Type St Inode Path; listening: Flags 00010000.
  std::ifstream table("/proc/net/unix");
  const std::string prefix = "@cxlpool-control." + std::to_string(pid) + ".";
  std::string line;
  std::getline(table, line);
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, path;
    unsigned long ino = 0;
    if (!(in >> num >> refs >> proto >> flags >> type >> st >> ino >> path)) continue;
    if (path.compare(0, prefix.size(), prefix) != 0 || !inodes.count(ino)) continue;
    if ((std::strtoul(flags.c_str(), nullptr, 16) & 0x10000) == 0) continue;  // not the listener
    return path.substr(1);
  }
  no_socket(pid,
            "no control socket among its descriptors: is it a cxlpool program started with "
            "CXLPOOL_CONTROL=1, in this network namespace?");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc >= 2 && !std::strcmp(argv[1], "--version")) {
    std::printf("cxlpool-capacity %s\n", CXLPOOL_VERSION);
    return 0;
  }
  // --timeout goes anywhere on the line (taken out before the rest is read).
  long timeout_s = 300;
  bool timeout_given = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--timeout") != 0) continue;
    if (timeout_given) usage_error("--timeout given twice");
    char* end = nullptr;
    timeout_s = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (!end || *end || timeout_s <= 0 || timeout_s > 86400) usage_error("--timeout takes 1..86400 seconds");
    timeout_given = true;
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    --i;
  }
  if (argc < 4) usage_error("a PID, a command and a DEVICE are needed");
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(argv[1], &end, 10);
  if (errno || !end || *end || pid <= 0) usage_error("PID must be a process id");
  const std::string cmd = argv[2];
  std::vector<std::string> args;  // after the command
  std::string options;
  bool force = false;
  long deadline_ms = -1;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (cmd == "release" && (a == "--force" || a == "--deadline") && (a == "--force" ? force : deadline_ms >= 0)) {
      usage_error((a + " given twice").c_str());
    } else if (cmd == "release" && a == "--force") {
      force = true;
    } else if (cmd == "release" && a == "--deadline") {
      // Seconds as decimal digits with an optional fraction: "30", "0.5".
      const std::string v = i + 1 < argc ? argv[++i] : "";
      const size_t dot = v.find('.');
      const std::string whole = v.substr(0, dot), frac = dot == std::string::npos ? "" : v.substr(dot + 1);
      const bool digits =
          !whole.empty() && whole.size() <= 5 && whole.find_first_not_of("0123456789") == std::string::npos &&
          frac.find_first_not_of("0123456789") == std::string::npos && (dot == std::string::npos || !frac.empty());
      const double seconds = digits ? std::strtod(v.c_str(), nullptr) : -1;
      if (!digits || seconds > 86400) usage_error("--deadline takes 0..86400 seconds (e.g. 30 or 0.5)");
      deadline_ms = long(seconds * 1000);
    } else {
      if (a.empty() || a.find_first_of(" \t\r\n") != std::string::npos)
        usage_error("arguments may not be empty or hold white space");
      args.push_back(a);
    }
  }
  if (deadline_ms > 0) {
    options += " deadline_ms=" + std::to_string(deadline_ms);
    timeout_s = std::max(timeout_s, deadline_ms / 1000 + 300);  // the reply comes after the deadline
  }
  if (force) options += " force";
  const size_t nargs = args.size();
  const bool fits = cmd == "show"                                             ? nargs == 1
                    : cmd == "resize"                                         ? nargs == 2
                    : (cmd == "add" || cmd == "withdraw" || cmd == "release") ? nargs == 3
                    : cmd == "offer"                                          ? nargs >= 3 && nargs % 2 == 1
                                                                              : false;
  if (cmd != "show" && cmd != "resize" && cmd != "add" && cmd != "withdraw" && cmd != "release" && cmd != "offer")
    usage_error(("unknown command '" + cmd + "'").c_str());
  if (!fits) usage_error(("wrong number of arguments for " + cmd).c_str());
  std::string request = cmd;
  for (const std::string& a : args) request += " " + a;
  request += options + "\n";
  if (request.size() > 1024) usage_error("the request is longer than 1024 bytes (offer fewer extents at once)");

  const std::string name = find_socket(pid);
  struct stat owner {};
  if (stat(("/proc/" + std::to_string(pid)).c_str(), &owner) != 0)
    no_socket(pid, std::string("it has exited (") + std::strerror(errno) + ")");
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) no_socket(pid, std::string("socket: ") + std::strerror(errno));
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: a leading NUL
  const socklen_t len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0)
    no_socket(pid, "no control socket (" + std::string(std::strerror(errno)) +
                       "): is it a cxlpool program started with CXLPOOL_CONTROL=1, in this network namespace?");
  ucred who{};
  socklen_t wlen = sizeof who;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &who, &wlen) != 0)
    no_socket(pid, std::string("SO_PEERCRED: ") + std::strerror(errno));
  if (long(who.pid) != pid || who.uid != owner.st_uid)
    no_socket(pid, "the socket is held by process " + std::to_string(who.pid) + " of uid " + std::to_string(who.uid) +
                       ", not by it (uid " + std::to_string(owner.st_uid) + "): nothing sent");
  if (who.uid != geteuid() && geteuid() != 0)
    no_socket(pid, "it belongs to uid " + std::to_string(who.uid) + "; only its user and root may change it");
  for (size_t done = 0; done < request.size();) {
    const ssize_t n = send(fd, request.data() + done, request.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      no_socket(pid, "it did not take the request within " + std::to_string(timeout_s) + " s (is it stopped?)");
    if (n < 0) no_socket(pid, std::string("send: ") + std::strerror(errno));
    done += size_t(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      no_socket(
          pid,
          "no reply within " + std::to_string(timeout_s) +
              " s (is it stopped, or busy with other connections? the request was sent and may still be applied there; "
              "--timeout waits longer)");
    if (n <= 0) break;
    reply.append(buf, size_t(n));
  }
  close(fd);
  if (reply.empty()) no_socket(pid, "the program closed the connection without a reply");
  const size_t nl = reply.find('\n');
  const std::string status = reply.substr(0, nl);
  const std::string body = nl == std::string::npos ? "" : reply.substr(nl + 1);
  if (status == "OK") {
    std::fputs(body.c_str(), stdout);
    return body.find("\nlost=") != std::string::npos || body.rfind("lost=", 0) == 0 ? 4 : 0;
  }
  std::fprintf(stderr, "cxlpool-capacity: process %ld: %s\n", pid, status.c_str());
  std::fputs(body.c_str(), stdout);
  return status == "ERR CXLPOOL_E_BUSY" ? 2 : 1;
}

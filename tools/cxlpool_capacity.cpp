// SPDX-License-Identifier: MIT
// cxlpool-capacity: changes the capacity of a device in a running cxlpool program from
// outside, through the program's control socket (CXLPOOL_CONTROL=1; lib/stats/control.hpp):
// one request, one reply. The socket's name is only a name: the tool checks with the kernel
// (SO_PEERCRED) that the process listening on it is the one asked for.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

const char kUsage[] =
    "Usage: cxlpool-capacity PID show DEVICE\n"
    "       cxlpool-capacity PID resize DEVICE SIZE\n"
    "       cxlpool-capacity PID add DEVICE OFFSET LENGTH\n"
    "       cxlpool-capacity PID withdraw DEVICE OFFSET LENGTH\n"
    "Changes the capacity of DEVICE (a target name, e.g. cxl0) in the running cxlpool program PID,\n"
    "which must have been started with CXLPOOL_CONTROL=1 and belong to your user (or you are\n"
    "root). A withdrawal first gives back the program's free memory on the device, then moves\n"
    "its live blocks out of the range under the same addresses; what cannot move makes it\n"
    "refuse (exit 2), naming it, with nothing lost (docs/devices.md).\n"
    "SIZE, OFFSET, LENGTH: bytes with an optional K, M, G or T suffix.\n"
    "Prints the program's reply as key=value lines.\n"
    "Exit: 0 done; 1 bad arguments or the program refused the request; 2 busy (something in\n"
    "the range could not move); 3 no control socket for PID, or it is not PID's.\n"
    "  --help     this text\n"
    "  --version  the version\n";

[[noreturn]] void usage_error(const char* why) {
  std::fprintf(stderr, "cxlpool-capacity: %s\n%s", why, kUsage);
  std::exit(1);
}

[[noreturn]] void no_socket(long pid, const std::string& why) {
  std::fprintf(stderr, "cxlpool-capacity: process %ld: %s\n", pid, why.c_str());
  std::exit(3);
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
  if (argc < 4) usage_error("a PID, a command and a DEVICE are needed");
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(argv[1], &end, 10);
  if (errno || !end || *end || pid <= 0) usage_error("PID must be a process id");
  const std::string cmd = argv[2];
  const int want = cmd == "show" ? 4 : cmd == "resize" ? 5 : (cmd == "add" || cmd == "withdraw") ? 6 : -1;
  if (want < 0) usage_error(("unknown command '" + cmd + "'").c_str());
  if (argc != want) usage_error(("wrong number of arguments for " + cmd).c_str());
  std::string request = cmd;
  for (int i = 3; i < argc; ++i) {
    if (std::strpbrk(argv[i], " \t\r\n") || !*argv[i]) usage_error("arguments may not be empty or hold white space");
    request += std::string(" ") + argv[i];
  }
  request += "\n";

  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) no_socket(pid, std::string("socket: ") + std::strerror(errno));
  const std::string name = "cxlpool-control." + std::to_string(pid);
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
  if (long(who.pid) != pid)
    no_socket(pid, "the socket named for it is held by process " + std::to_string(who.pid) + " (uid " +
                       std::to_string(who.uid) + "), not by it: nothing sent");
  if (who.uid != geteuid() && geteuid() != 0)
    no_socket(pid, "it belongs to uid " + std::to_string(who.uid) + "; only its user and root may change it");
  for (size_t done = 0; done < request.size();) {
    const ssize_t n = send(fd, request.data() + done, request.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) no_socket(pid, std::string("send: ") + std::strerror(errno));
    done += size_t(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
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
    return 0;
  }
  std::fprintf(stderr, "cxlpool-capacity: process %ld: %s\n", pid, status.c_str());
  std::fputs(body.c_str(), stdout);
  return status == "ERR CXLPOOL_E_BUSY" ? 2 : 1;
}

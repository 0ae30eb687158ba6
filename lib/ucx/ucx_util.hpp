// SPDX-License-Identifier: MIT
// What the KV server and client share (libcxlpool_ucx): errors recorded through the C ABI's
// last error, "HOST:PORT" parsing with messages that name the bad part, a UCP context and
// worker pair that cleans up after itself, and waiting for a UCX request with a deadline.
#pragma once

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "cxlpool/common.h"
#include "ucx/wire.hpp"

namespace cxlpool::ucx {

// A failure on its way to the caller: status and message (recorded by record()).
struct Error {
  cxlpool_status_t status;
  std::string message;
};

inline cxlpool_status_t record(const Error& e) { return cxlpool_set_last_error(e.status, 0, e.message.c_str()); }

inline Error ucx_error(const std::string& what, ucs_status_t s) {
  return {CXLPOOL_E_OS, what + ": " + ucs_status_string(s)};
}

// "IPV4:PORT", "[IPV6]:PORT" or "NAME:PORT" into *out. listening: port 0 allowed.
inline bool parse_address(const char* fn, const char* text, bool listening, sockaddr_storage* out, socklen_t* len,
                          Error* err) {
  auto bad = [&](const std::string& why) {
    *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": address \"" + text + "\": " + why};
    return false;
  };
  if (!text) return *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": address is NULL"}, false;
  std::string s(text), host, port;
  if (s.empty()) return bad("empty (expected HOST:PORT)");
  if (s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') return bad("expected [IPV6]:PORT");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) return bad("no port (expected HOST:PORT)");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("an IPv6 address needs brackets: [ADDR]:PORT");
  }
  if (host.empty()) return bad("no host before the port");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad("port \"" + port + "\" is not a number 0..65535");
  unsigned long p = std::stoul(port);
  if (p > 65535 || (p == 0 && !listening)) return bad("port " + port + (p ? " is above 65535" : " (0 only to listen)"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // a name with an IPv4 address is used as such
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (listening ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  if (int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); e != 0 || !res)
    return bad("host \"" + host + "\": " + gai_strerror(e));
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  const bool v6 = pick->ai_family != AF_INET;
  std::memcpy(out, pick->ai_addr, pick->ai_addrlen);
  *len = pick->ai_addrlen;
  freeaddrinfo(res);
  if (v6) {  // uct_tcp_ep_set_dest_addr writes past its buffer for an IPv6 peer (hostile review)
    *err = {CXLPOOL_E_NOT_SUPPORTED, std::string(fn) + ": address \"" + text +
                                         "\": IPv6 is not supported (UCX 1.13's tcp connection manager corrupts "
                                         "its heap on IPv6 peers); use an IPv4 address"};
    return false;
  }
  return true;
}

inline std::string format_address(const sockaddr_storage& sa) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&sa), sizeof sa, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return sa.ss_family == AF_INET6 ? "[" + std::string(host) + "]:" + serv : std::string(host) + ":" + serv;
}

// A UCP context and one worker.
class Ucp {
 public:
  Ucp() = default;
  Ucp(const Ucp&) = delete;
  Ucp& operator=(const Ucp&) = delete;
  ~Ucp() { destroy(); }
  void destroy() {
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }
  bool init(const char* name, uint64_t features, ucs_thread_mode_t mode, Error* err) {
    ucp_config_t* config = nullptr;
    if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK)
      return *err = ucx_error("ucp_config_read (UCX_* environment)", s), false;
    // UCX's memory hooks (libucm patches mmap, munmap, mremap, madvise and brk for its
    // registration and memory-type caches) would sit under cxlpool's own allocator and tiering
    // moves. Both caches are off unless the environment asks for them: cxlpool registers its
    // pools once and needs neither. (libucm may still hook at load time: UCX_MEM_EVENTS=no in
    // the environment keeps it out entirely; under ThreadSanitizer its hooks crash new threads.)
    for (const char* option : {"RCACHE_ENABLE", "MEMTYPE_CACHE"})
      if (!std::getenv((std::string("UCX_") + option).c_str())) ucp_config_modify(config, option, "n");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = features;
    params.name = name;
    params.mt_workers_shared = 0;
    ucs_status_t s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return *err = ucx_error("ucp_init", s), false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = mode;
    if ((s = ucp_worker_create(context_, &wp, &worker_)) != UCS_OK)
      return *err = ucx_error("ucp_worker_create", s), false;
    return true;
  }
  // One active-message handler per (id, callback), all with `arg`.
  bool set_handlers(std::initializer_list<std::pair<unsigned, ucp_am_recv_callback_t>> handlers, void* arg,
                    const char* who, Error* err) {
    for (const auto& [id, cb] : handlers) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = cb;
      hp.arg = arg;
      if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &hp); s != UCS_OK)
        return *err = ucx_error(std::string(who) + ": ucp_worker_set_am_recv_handler", s), false;
    }
    return true;
  }
  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
};

using Clock = std::chrono::steady_clock;

// The other side's words with their control characters blanked: they may reach a log.
inline std::string printable(std::string text) {
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return text;
}

// This process's HostIdentity (wire.hpp); false when /proc does not tell.
inline bool host_identity(HostIdentity* out) {
  std::memset(out, 0, sizeof *out);
  FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re");
  if (!f) return false;
  const bool read = std::fgets(out->boot_id, sizeof out->boot_id, f) != nullptr;
  std::fclose(f);
  if (!read) return false;
  out->boot_id[std::strcspn(out->boot_id, "\n")] = 0;
  uint64_t* ns[] = {&out->net_ns, &out->ipc_ns, &out->pid_ns};
  const char* names[] = {"/proc/thread-self/ns/net", "/proc/thread-self/ns/ipc", "/proc/thread-self/ns/pid"};
  for (int i = 0; i < 3; ++i) {
    struct stat st {};
    if (stat(names[i], &st) != 0) return false;
    *ns[i] = st.st_ino;
  }
  return true;
}

// The inode of the TCP socket of this network namespace whose local address is `local` and
// whose remote address is `remote` (/proc/net/tcp; IPv4, ESTABLISHED). False when none is here.
inline bool tcp_socket_inode(const sockaddr_storage& local, const sockaddr_storage& remote, unsigned long* inode) {
  if (local.ss_family != AF_INET || remote.ss_family != AF_INET) return false;
  auto hex = [](const sockaddr_storage& a) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    char b[32];
    std::snprintf(b, sizeof b, "%08X:%04X", in.sin_addr.s_addr, unsigned(ntohs(in.sin_port)));
    return std::string(b);
  };
  const std::string want_local = hex(local), want_remote = hex(remote);
  FILE* f = std::fopen("/proc/net/tcp", "re");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) {
    char l[64], r[64];
    unsigned state = 0;
    unsigned long ino = 0;
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
    if (std::sscanf(line, " %*u: %63s %63s %x %*s %*s %*s %*u %*u %lu", l, r, &state, &ino) != 4) continue;
    if (want_local == l && want_remote == r && state == 1 /* ESTABLISHED */) {
      *inode = ino;
      found = true;
    }
  }
  std::fclose(f);
  return found;
}

// Whether process `pid` holds the socket `inode` among its descriptors: 1 yes, 0 no, -errno
// when its descriptors cannot be read (EACCES: that needs the permission to read its memory).
inline int process_holds_socket(pid_t pid, unsigned long inode) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return -errno;
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  bool found = false;
  while (dirent* e = readdir(d)) {
    char target[64];
    const ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (want == target) {
      found = true;
      break;
    }
  }
  closedir(d);
  return found ? 1 : 0;
}

// Why a and b are not one host and namespace set for shared memory; empty when they are.
inline std::string identity_mismatch(const HostIdentity& a, const HostIdentity& b) {
  if (std::memcmp(a.boot_id, b.boot_id, sizeof a.boot_id) != 0) return "it runs on another host (boot id)";
  if (a.net_ns != b.net_ns) return "it runs in another network namespace";
  if (a.ipc_ns != b.ipc_ns) return "it runs in another IPC namespace";
  if (a.pid_ns != b.pid_ns) return "it runs in another PID namespace";
  return {};
}

// What an endpoint's lanes carry, from UCX's own description of it (ucp_ep_print_info; UCX
// 1.13 has no query for it): "am sysv/memory, rma_bw cma/memory". *same_host: its active
// messages go through shared memory (sysv, posix, xpmem or self), not a network. Empty when
// UCX described no lane.
inline std::string describe_lanes(ucp_ep_h ep, bool* same_host) {
  *same_host = false;
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return {};
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::istringstream in(text ? std::string(text, size) : std::string());
  std::free(text);
  std::string line, out, am;
  while (std::getline(in, line)) {
    const size_t at = line.find("lane[");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at));
    std::string lane, transport, word;
    words >> lane >> transport;  // "lane[0]:" "2:sysv/memory.0"
    if (size_t colon = transport.find(':'); colon != std::string::npos) transport.erase(0, colon + 1);
    if (size_t dot = transport.rfind('.'); dot != std::string::npos && transport.find('/') < dot) transport.erase(dot);
    bool after_arrow = false;
    while (words >> word) {
      if (word == "->") after_arrow = true;
      if (!after_arrow) continue;
      std::string use;
      if (word == "am") use = "am";
      if (word.rfind("rma_bw", 0) == 0) use = "rma_bw";
      if (use.empty()) continue;
      if (use == "am" && am.empty()) am = transport;
      out += (out.empty() ? "" : ", ") + use + " " + transport;
    }
  }
  const std::string kind = am.substr(0, am.find('/'));
  *same_host = kind == "sysv" || kind == "posix" || kind == "xpmem" || kind == "self";
  return out;
}

// Nonzero (recorded) when the calling process is not the one that made the handle (a fork
// child): what names the handle in the message ("the server", "the connection").
inline cxlpool_status_t foreign(pid_t owner, const char* fn, const char* what) {
  if (owner == getpid()) return CXLPOOL_OK;
  return record({CXLPOOL_E_NOT_SUPPORTED, std::string(fn) + ": " + what + " belongs to process " +
                                              std::to_string(owner) +
                                              " (a fork child cannot use it; nothing of it is touched here)"});
}

// A stopped server's or closed connection's shell (its magic word cleared) is kept in a
// bounded quarantine instead of freed: a second stop or close is refused with a status
// instead of reaching freed memory (as every other cxlpool handle).
template <class Shell>
void retire(Shell* shell) noexcept {
  static std::mutex mu;
  static std::deque<Shell*>* retired = new (std::nothrow) std::deque<Shell*>;  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  if (!retired) return;
  try {
    retired->push_back(shell);
  } catch (...) {
    return;
  }
  if (retired->size() > 1024) {
    delete retired->front();
    retired->pop_front();
  }
}

// Progresses the worker until the request completes. When the deadline passes first,
// on_timeout() runs once (it force-closes the endpoint, which fails the request) and the wait
// goes on until the request is done; the result is then UCS_ERR_TIMED_OUT.
// progress() progresses the caller's workers and returns how much happened.
template <class Progress, class OnTimeout>
ucs_status_t wait_request(Progress&& progress, ucs_status_ptr_t req, Clock::time_point deadline,
                          OnTimeout&& on_timeout) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  ucs_status_t s;
  unsigned spins = 0;
  bool timed_out = false;
  while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
    if (!progress() && !timed_out && (++spins & 255) == 0 && Clock::now() > deadline) {
      timed_out = true;
      on_timeout();
    }
  }
  ucp_request_free(req);
  return timed_out ? UCS_ERR_TIMED_OUT : s;
}

}  // namespace cxlpool::ucx

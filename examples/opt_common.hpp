// SPDX-License-Identifier: MIT
// What the OPT example programs share (opt_prefill_server, opt_decode_server, opt_generate):
// option parsing, the control connection (a UNIX socket path, or tcp:HOST:PORT between hosts)
// carrying one text line per message, token id lists, shared pools, KV arenas.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.h"
#include "engine/error.hpp"
#include "engine/kv_store.hpp"

namespace opt_example {

using cxlpool::engine::check_cxlpool;
using cxlpool::engine::fail;

// --key value options; every key must be in `known` (a usage error otherwise).
inline std::map<std::string, std::string> parse_options(int argc, char** argv, const std::vector<std::string>& known,
                                                        const char* usage) {
  std::map<std::string, std::string> o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = false;
    for (const auto& k : known) ok = ok || a == "--" + k;
    if (!ok || i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s %s\nusage: %s\n", argv[0], ok ? "missing a value after" : "unknown option",
                   a.c_str(), usage);
      std::exit(2);
    }
    o[a.substr(2)] = argv[++i];
  }
  return o;
}

// The value of --key as a number in 0..max (dflt when absent); anything else fails.
inline uint64_t number(const std::map<std::string, std::string>& o, const std::string& key, uint64_t dflt,
                       uint64_t max = UINT32_MAX) {
  auto it = o.find(key);
  if (it == o.end()) return dflt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end || errno || it->second[0] < '0' || it->second[0] > '9')
    fail("--" + key + " " + it->second + ": not a number");
  if (v > max) fail("--" + key + " " + it->second + ": at most " + std::to_string(max));
  return v;
}
// --pool-mib: up to 16 TiB.
constexpr uint64_t kMaxPoolMib = uint64_t(1) << 24;

inline cxlpool_kv_dtype_t kv_dtype(const std::map<std::string, std::string>& o) {
  auto it = o.find("kv-dtype");
  const std::string s = it == o.end() ? "fp16" : it->second;
  if (s == "fp16") return CXLPOOL_KV_FP16;
  if (s == "bf16") return CXLPOOL_KV_BF16;
  if (s == "fp32") return CXLPOOL_KV_FP32;
  fail("--kv-dtype " + s + ": fp16, bf16 or fp32");
}

// An exception as a message: running out of memory says so (the weights are held as fp32,
// 4 bytes per parameter: opt-6.7b needs about 27 GB).
inline std::string describe(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return std::string("out of memory (") + e.what() + "): the weights are held as fp32, 4 bytes per parameter";
  return e.what();
}

// Text for a message: bytes that are not printable ASCII as \xNN, at most 64 of them.
inline std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

// "1 2 3" or "1,2,3" -> ids.
inline std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string t = text;
  for (char& c : t)
    if (c == ',') c = ' ';
  std::istringstream in(t);
  std::string w;
  while (in >> w) {
    // Digits only (a NUL or a sign inside a word is not an id), at most 10 of them.
    const bool digits = !w.empty() && w.size() <= 10 && w.find_first_not_of("0123456789") == std::string::npos;
    const long long v = digits ? std::stoll(w) : -1;
    if (v < 0 || v > INT32_MAX) fail("token id \"" + printable(w) + "\": not a non-negative 32-bit integer");
    ids.push_back(int32_t(v));
  }
  return ids;
}
inline std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

// ---- the control connection: one text line per message --------------------------------
class Line {
 public:
  explicit Line(int fd) : fd_(fd) {}
  ~Line() {
    if (fd_ >= 0) close(fd_);
  }
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  // A peer gone away is false, not SIGPIPE (MSG_NOSIGNAL).
  bool send(const std::string& s) {
    const std::string l = s + "\n";
    size_t done = 0;
    while (done < l.size()) {
      const ssize_t k = ::send(fd_, l.data() + done, l.size() - done, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      done += size_t(k);
    }
    return true;
  }
  // Reads and writes that wait longer than this fail (the connection is then dropped).
  void set_timeout(int seconds) {
    const timeval tv{seconds, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  // One line (without its newline); false at the end or past 16 MiB.
  bool receive(std::string* out) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *out = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      if (buf_.size() > (16u << 20)) return false;
      char tmp[65536];
      const ssize_t k = read(fd_, tmp, sizeof tmp);
      if (k <= 0) return false;
      buf_.append(tmp, size_t(k));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

inline bool is_tcp(const std::string& where) { return where.rfind("tcp:", 0) == 0; }

inline sockaddr_in tcp_address(const std::string& where) {
  const std::string hp = where.substr(4);
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos) fail(where + ": expected tcp:HOST:PORT");
  const std::string port = hp.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535)
    fail(where + ": the port must be a number 0..65535");
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(hp.substr(0, colon).c_str(), hp.substr(colon + 1).c_str(), &hints, &res) != 0 || !res)
    fail(where + ": cannot resolve");
  sockaddr_in a{};
  std::memcpy(&a, res->ai_addr, sizeof a);
  freeaddrinfo(res);
  return a;
}

inline sockaddr_un unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path)
    fail(path + ": socket path longer than " + std::to_string(sizeof a.sun_path - 1));
  std::memcpy(a.sun_path, path.c_str(), path.size());
  return a;
}

// A listening socket: a UNIX path (an existing name is never replaced) or tcp:HOST:PORT.
inline int listen_control(const std::string& where) {
  int s = -1;
  if (is_tcp(where)) {
    const sockaddr_in a = tcp_address(where);
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
      fail(where + ": " + std::strerror(errno));
  } else {
    const sockaddr_un a = unix_address(where);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
      fail(where + ": " + std::strerror(errno));
  }
  if (listen(s, 16) != 0) fail(where + ": " + std::strerror(errno));
  return s;
}

// A prefill server that is still loading its model has not bound its socket yet: ENOENT and
// ECONNREFUSED are retried every 100 ms for up to 60 s (said once on stderr), anything else fails.
inline int connect_control(const std::string& where) {
  for (int attempt = 0;; ++attempt) {
    int s = -1, err = 0;
    if (is_tcp(where)) {
      const sockaddr_in a = tcp_address(where);
      s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int one = 1;
      if (s >= 0) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (s < 0 || connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) err = errno;
    } else {
      const sockaddr_un a = unix_address(where);
      s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s < 0 || connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) err = errno;
    }
    if (!err) return s;
    if (s >= 0) close(s);
    if ((err != ENOENT && err != ECONNREFUSED) || attempt == 600) fail(where + ": " + std::strerror(err));
    if (attempt == 0)
      std::fprintf(stderr, "waiting for the prefill server at %s (%s)\n", where.c_str(), std::strerror(err));
    usleep(100000);
  }
}

// ---- handles as text ----------------------------------------------------------------
inline std::string handle_hex(const cxlpool_kv_handle_t& h) {
  std::string s;
  const auto* p = reinterpret_cast<const unsigned char*>(&h);
  char b[3];
  for (size_t i = 0; i < sizeof h; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}
inline cxlpool_kv_handle_t handle_from_hex(const std::string& s) {
  cxlpool_kv_handle_t h{};
  if (s.size() != 2 * sizeof h) fail("handle: " + std::to_string(s.size()) + " hex digits");
  auto* p = reinterpret_cast<unsigned char*>(&h);
  for (size_t i = 0; i < sizeof h; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) fail("handle: not hex");
    p[i] = static_cast<unsigned char>(v);
  }
  return h;
}

// ---- pools and arenas ---------------------------------------------------------------
inline cxlpool_shared_pool_t* create_pool(const std::string& device, uint64_t bytes) {
  cxlpool_shared_params_t* p = nullptr;
  check_cxlpool(cxlpool_shared_params_create(&p), "pool params");
  check_cxlpool(cxlpool_shared_params_set_size(p, bytes), "pool size");
  cxlpool_shared_pool_t* pool = nullptr;
  const cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), p, 0, &pool);
  cxlpool_shared_params_destroy(p);
  check_cxlpool(st, device.c_str());  // an existing pool of that name is refused, never taken over
  return pool;
}

inline cxlpool_kv_arena_t* create_arena(const cxlpool_kv_geometry_t& g, cxlpool_shared_pool_t* pool,
                                        bool prefix_cache) {
  cxlpool_kv_params_t* p = nullptr;
  check_cxlpool(cxlpool_kv_params_create(&p), "kv params");
  check_cxlpool(cxlpool_kv_params_set_prefix_caching(p, prefix_cache ? 1 : 0), "kv params");
  cxlpool_kv_arena_t* arena = nullptr;
  const cxlpool_status_t st = cxlpool_kv_arena_create(&g, &pool, 1, p, &arena);
  cxlpool_kv_params_destroy(p);
  check_cxlpool(st, "kv arena");
  return arena;
}

}  // namespace opt_example

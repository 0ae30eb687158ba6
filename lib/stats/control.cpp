// SPDX-License-Identifier: MIT
// The control socket (control.hpp): its thread, the peer check, and the request grammar over
// the allocator's elastic capacity (alloc/elastic.cpp).
#include "stats/control.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "alloc/pool.hpp"
#include "common/env_once.hpp"
#include "common/error.hpp"
#include "common/names.hpp"
#include "common/parse.hpp"
#include "common/utf8.hpp"
#include "config/options.hpp"
#include "device/registry.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/thread.hpp"
#include "os/unix_names.hpp"

namespace cxlpool::detail::control {

namespace {

constexpr size_t kControlStack = size_t(256) << 10;  // a withdrawal's moves run here
constexpr size_t kMaxRequest = 1024;
constexpr int kRequestTimeoutMs = 5000;

int g_listen = -1;
os::prim::FileId g_listen_id{};  // the socket's identity: a program may close the number and reuse it
EnvOnce g_env;
os::Thread* g_thread = nullptr;  // never joined: it serves for the life of the process

std::string status_word(cxlpool_status_t s) {
  const std::string name = status_name(s);  // "CXLPOOL_E_BUSY: ..."
  return name.substr(0, name.find(':'));
}

// Every value in a reply goes through printable(): names (a shm pool's may hold any byte but
// '/') and messages could otherwise forge "key=value" lines of their own, or steer a terminal.
std::string failure(cxlpool_status_t s, const std::string& message) {
  return "ERR " + status_word(s) + "\nmessage=" + printable(message) + "\n";
}

std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string report_text(const alloc::CapacityReport& r) {
  return "capacity_before=" + std::to_string(r.capacity_before) +
         "\ncapacity_after=" + std::to_string(r.capacity_after) + "\ntrimmed_bytes=" + std::to_string(r.trimmed_bytes) +
         "\nrelocated=" + std::to_string(r.relocated) + "\nevacuated_units=" + std::to_string(r.evacuated_units) +
         "\nevacuated_bytes=" + std::to_string(r.evacuated_bytes) +
         "\nreturned_units=" + std::to_string(r.returned_units) +
         "\nreturned_bytes=" + std::to_string(r.returned_bytes) + "\nlost_units=" + std::to_string(r.lost_units) +
         "\nlost_bytes=" + std::to_string(r.lost_bytes) + "\n";
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// The elastic counters, the same keys for every device.
std::string counters_text(const ElasticCounters& e) {
  return "grows=" + std::to_string(e.grows.load()) + "\nshrinks=" + std::to_string(e.shrinks.load()) +
         "\nrefusals=" + std::to_string(e.refusals.load()) + "\nrelocated=" + std::to_string(e.relocated.load()) +
         "\nevacuated_units=" + std::to_string(e.evacuated_units.load()) +
         "\nevacuated_bytes=" + std::to_string(e.evacuated_bytes.load()) +
         "\nforced=" + std::to_string(e.forced.load()) + "\nlost_units=" + std::to_string(e.lost_units.load()) +
         "\nlost_bytes=" + std::to_string(e.lost_bytes.load()) + "\n";
}

std::string show(const std::string& name) {
  if (!registry::find(name))
    if (std::shared_ptr<registry::SharedDevice> s = registry::find_shared(name)) {
      // A shared pool's device: its size, all of it online, what this process holds in it, and
      // counters that stay 0 (its capacity never changes: every change is BUSY).
      const std::string size = std::to_string(s->ledger.capacity.load());
      return "OK\ndevice=" + printable(name) + "\nshared_pool=" + printable(s->location) + "\ncapacity=" + size +
             "\ncommitted=" + std::to_string(s->ledger.committed.load()) + "\nspace=" + size + "\nextents=0-" + size +
             "\n" + counters_text(s->ledger.elastic) + "max_space=" + size + "\n";
    }
  cxlpool_status_t status = CXLPOOL_OK;
  std::string message;
  std::shared_ptr<Device> d = alloc::find_device(name, &status, &message);
  if (!d) return failure(status, message);
  const ElasticCounters& e = d->ledger().elastic;
  uint64_t max_space = d->max_space();
  if (const std::optional<uint64_t> node = alloc::node_memory_of(*d))  // a numa device: its node's memory
    max_space = std::min(max_space, std::max(*node, d->capacity()));
  std::string text = "OK\ndevice=" + printable(name) + "\ncapacity=" + std::to_string(d->capacity()) +
                     "\ncommitted=" + std::to_string(d->committed()) + "\nspace=" + std::to_string(d->space()) +
                     "\nextents=";
  bool first = true;
  for (const Device::Extent& x : d->online_extents()) {
    text += (first ? "" : ",") + std::to_string(x.lo) + "-" + std::to_string(x.hi);
    first = false;
  }
  text += "\n" + counters_text(e) + "max_space=" + std::to_string(max_space) + "\n";
  return text;
}

void serve() {
  os::prim::block_async_signals(nullptr);  // the program's handlers run on its own threads
  alloc::enter_internal_scope();           // under the interposer: our allocations are its own
  const uid_t me = geteuid();
  for (;;) {
    // The number must still be our socket: a program that closed it may have reused it.
    os::prim::FileId now{};
    if (os::prim::file_id(g_listen, &now) != 0 || !(now == g_listen_id)) {
      os::prim::write_stderr(
          "cxlpool: the program closed the control socket's descriptor; cxlpool-capacity can no longer reach this "
          "process\n");
      return;
    }
    uid_t uid = 0;
    pid_t pid = 0;
    const int fd = os::accept_peer(g_listen, &uid, &pid);
    if (fd < 0) {
      os::prim::sleep_ms(errno == EINTR || errno == ECONNABORTED ? 0 : 100);  // EMFILE and such: later
      continue;
    }
    std::string reply;
    if (uid != me && uid != 0) {
      // Answered at once: a connection that sends nothing must not hold the one thread that
      // serves the program's own user (a request it did send is dropped unread; the reply is
      // still read before the reset).
      reply = failure(CXLPOOL_E_PERMISSION, "uid " + std::to_string(uid) + " may not control a process of uid " +
                                                std::to_string(me) + " (only its own user and root)");
    } else {
      std::string line;
      if (os::read_line(fd, &line, kMaxRequest, kRequestTimeoutMs))
        reply = handle(line);
      else
        reply = failure(CXLPOOL_E_INVALID_ARGUMENT,
                        errno == EMSGSIZE ? "request longer than 1024 bytes" : "no request line within 5 s");
    }
    os::send_all(fd, reply);
    os::prim::close_fd(fd);
  }
}

}  // namespace

std::string socket_name(long pid) {
  // A part nobody can guess: a name known in advance could be bound first by another user (the
  // program would go without a socket), or stay bound by a process of another user after the
  // pid passed to this program. The tool finds the name through the program's own descriptors.
  uint64_t nonce = 0;
  os::random_bytes(&nonce, sizeof nonce);
  char tail[24];
  std::snprintf(tail, sizeof tail, ".%016llx", static_cast<unsigned long long>(nonce));
  return "cxlpool-control." + std::to_string(pid) + tail;
}

std::string handle(const std::string& request) {
  try {
    const std::vector<std::string> w = words(request);
    if (w.empty())
      return failure(CXLPOOL_E_INVALID_ARGUMENT, "empty request (show, resize, add, withdraw, offer, release)");
    auto size_at = [&](size_t i, uint64_t* out) {
      auto v = parse_size(w[i]);
      if (!v) return false;
      *out = *v;
      return true;
    };
    alloc::CapacityReport r;
    std::string message, extra;
    cxlpool_status_t s = CXLPOOL_OK;
    if (w[0] == "show" && w.size() == 2) return show(w[1]);
    if (w[0] == "resize" && w.size() == 3) {
      uint64_t bytes = 0;
      if (!size_at(2, &bytes)) return failure(CXLPOOL_E_INVALID_ARGUMENT, "resize: bad size '" + w[2] + "'");
      s = alloc::device_resize(w[1], bytes, &r, &message);
    } else if ((w[0] == "add" || w[0] == "withdraw") && w.size() == 4) {
      uint64_t offset = 0, length = 0;
      if (!size_at(2, &offset) || !size_at(3, &length))
        return failure(CXLPOOL_E_INVALID_ARGUMENT, w[0] + ": bad offset or length '" + w[2] + " " + w[3] + "'");
      s = w[0] == "add" ? alloc::device_add_extent(w[1], offset, length, &r, &message)
                        : alloc::device_withdraw_extent(w[1], offset, length, &r, &message);
    } else if (w[0] == "offer" && w.size() >= 4 && w.size() % 2 == 0) {
      std::vector<Device::Extent> extents;
      for (size_t i = 2; i + 1 < w.size(); i += 2) {
        uint64_t offset = 0, length = 0;
        if (!size_at(i, &offset) || !size_at(i + 1, &length))
          return failure(CXLPOOL_E_INVALID_ARGUMENT, "offer: bad offset or length '" + w[i] + " " + w[i + 1] + "'");
        extents.push_back({offset, offset + length < offset ? 0 : offset + length});
      }
      std::vector<cxlpool_status_t> verdicts;
      s = alloc::device_offer_extents(w[1], extents, &verdicts, &r, &message);
      for (size_t i = 0; i < verdicts.size(); ++i)
        extra += "verdict=" + hex(extents[i].lo) + "+" + hex(extents[i].hi - std::min(extents[i].hi, extents[i].lo)) +
                 " " + (verdicts[i] == CXLPOOL_OK ? std::string("accepted") : "rejected " + status_word(verdicts[i])) +
                 "\n";
    } else if (w[0] == "release" && w.size() >= 4 && w.size() <= 6) {
      uint64_t offset = 0, length = 0, deadline_ms = 0;
      bool force = false;
      if (!size_at(2, &offset) || !size_at(3, &length))
        return failure(CXLPOOL_E_INVALID_ARGUMENT, "release: bad offset or length '" + w[2] + " " + w[3] + "'");
      for (size_t i = 4; i < w.size(); ++i) {
        if (w[i] == "force" && !force) {
          force = true;
        } else if (w[i].rfind("deadline_ms=", 0) == 0) {
          auto v = parse_u64(std::string_view(w[i]).substr(12));
          if (!v || *v > 86400000)
            return failure(CXLPOOL_E_INVALID_ARGUMENT, "release: bad " + w[i] + " (0..86400000)");
          deadline_ms = *v;
        } else {
          return failure(CXLPOOL_E_INVALID_ARGUMENT, "release: unknown option '" + w[i] + "' (deadline_ms=N, force)");
        }
      }
      std::vector<alloc::LostRange> lost;
      s = alloc::device_release_extent(w[1], offset, length, deadline_ms, force, &r, &lost, &message);
      extra = "attempts=" + std::to_string(r.attempts) + "\n";
      for (const alloc::LostRange& l : lost)
        extra += "lost=" + hex(l.addr) + "+" + hex(l.len) + " committed=" + std::to_string(l.committed) +
                 (l.contents_kept ? " contents=undefined" : " contents=zeros") + " holder=" + printable(l.holder) +
                 "\n";
      if (s == CXLPOOL_OK && !message.empty()) extra += "message=" + printable(message) + "\n";
    } else {
      return failure(CXLPOOL_E_INVALID_ARGUMENT,
                     "unknown request '" + request.substr(0, 80) +
                         "' (show DEVICE | resize DEVICE SIZE | add DEVICE OFFSET LENGTH | withdraw DEVICE OFFSET "
                         "LENGTH | offer DEVICE OFFSET LENGTH [OFFSET LENGTH ...] | release DEVICE OFFSET LENGTH "
                         "[deadline_ms=N] [force])");
    }
    if (s != CXLPOOL_OK) return failure(s, message) + report_text(r) + extra;
    return "OK\n" + report_text(r) + extra;
  } catch (const std::exception& e) {
    return failure(CXLPOOL_E_NO_MEMORY, e.what());
  }
}

namespace {

void start_now() {
  const char* v = option_value(Option::kControl);
  if (!v) return;
  const std::string_view t = trim(v);
  if (t == "0") return;
  if (t != "1") fail(CXLPOOL_E_CONFIG, std::string("CXLPOOL_CONTROL: bad value '") + v + "' (expected 1 or 0)");
  const std::string name = socket_name(long(getpid()));
  g_listen = os::listen_abstract_name(name);
  if (g_listen >= 0 && os::prim::file_id(g_listen, &g_listen_id) != 0) {
    os::prim::close_fd(g_listen);
    g_listen = -1;
  }
  if (g_listen < 0) {
    const std::string line = "cxlpool: no control socket for this process (CXLPOOL_CONTROL=1): binding @" + name +
                             ": " + std::strerror(errno) + "\n";
    os::prim::write_stderr(line.c_str());
    return;
  }
  try {
    auto thread = std::make_unique<os::Thread>();
    thread->start(serve, kControlStack, "control: the control socket's thread", "cxlpool/control");
    g_thread = thread.release();
  } catch (const std::exception& e) {
    os::prim::close_fd(g_listen);
    g_listen = -1;
    const std::string line = std::string("cxlpool: no control socket for this process: ") + e.what() + "\n";
    os::prim::write_stderr(line.c_str());
  }
}

}  // namespace

void start_from_environment() { g_env.run(start_now); }

void after_fork_child() noexcept {
  if (g_listen >= 0) os::prim::close_fd(g_listen);
  g_listen = -1;
  g_thread = nullptr;  // not in the child
}

}  // namespace cxlpool::detail::control

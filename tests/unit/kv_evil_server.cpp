// SPDX-License-Identifier: MIT
// A hostile KV server against libcxlpool_ucx's consumer (cxlpool_kv_remote_import): a raw UCX
// listener that speaks the wire format of lib/ucx/wire.hpp and breaks it one way per case
// (META that lies about sizes and counts, refusals with foreign statuses and terminal escapes,
// blocks repeated, missing, short, long, beyond the sequence, of another request, sent by
// rendezvous where eager is expected and back). For each case the consumer must come back with
// the status the case expects (never OK for a broken one, never a crash), and the landing blocks
// it allocated must be freed (its pool's bytes in use back where they were). Two honest cases
// (eager and rendezvous blocks) show the server speaks the protocol. Two processes: the server
// in a child (its worker on a thread, each case's mode sent over a pipe), the consumer in the
// parent.
//   kv_evil_server            every case; prints one line per case and a summary
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.h"
#include "cxlpool/kvcache_remote.h"
#include "ucx/wire.hpp"

namespace {

using namespace cxlpool::ucx;

cxlpool_kv_geometry_t test_geometry() {
  cxlpool_kv_geometry_t g{};
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.dtype = CXLPOOL_KV_FP16;
  g.tokens_per_block = 16;  // 16 KiB blocks
  return g;
}
constexpr uint64_t kBlock = 16384;

struct Case {
  const char* name;
  int expect;  // the status the import must return
};

// The raw server: one mode at a time, a progress thread, sends whose buffers live until done.
class EvilServer {
 public:
  bool start() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
    ucs_status_t s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return false;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context_, &wp, &worker_) != UCS_OK) return false;
    for (unsigned id : {kAmFetch, kAmPull, kAmDone}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = id == kAmFetch ? on_fetch : id == kAmPull ? on_pull : on_ignore;
      hp.arg = this;
      if (ucp_worker_set_am_recv_handler(worker_, &hp) != UCS_OK) return false;
    }
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = sizeof sa;
    lp.conn_handler.cb = on_connection;
    lp.conn_handler.arg = this;
    if (ucp_listener_create(worker_, &lp, &listener_) != UCS_OK) return false;
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    ucp_listener_query(listener_, &la);
    port_ = ntohs(reinterpret_cast<const sockaddr_in&>(la.sockaddr).sin_port);
    for (size_t i = 0; i < sizeof block_; ++i) block_[i] = static_cast<unsigned char>(i * 131 + 7);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        ucp_worker_progress(worker_);
        std::deque<std::pair<int, std::vector<unsigned char>>> batch;
        {
          std::lock_guard<std::mutex> lock(mu_);
          batch.swap(work_);
        }
        for (auto& [kind, payload] : batch) act(kind, payload);
      }
      for (ucp_ep_h ep : eps_) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
        if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
      }
      for (int i = 0; i < 1000; ++i) ucp_worker_progress(worker_);
    });
    return true;
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (listener_) ucp_listener_destroy(listener_);
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
  }
  void set_mode(const std::string& mode) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
  }
  int port() const { return port_; }
  uint64_t sends_failed_early() const { return bad_sends_.load(); }

 private:
  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<EvilServer*>(arg);
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(self->worker_, &ep, &h) == UCS_OK) self->eps_.push_back(h);
  }
  static ucs_status_t queue(void* arg, int kind, void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<EvilServer*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    self->reply_ep_ = param->reply_ep;
    std::lock_guard<std::mutex> lock(self->mu_);
    const auto* b = static_cast<const unsigned char*>(data);
    self->work_.emplace_back(kind, std::vector<unsigned char>(b, b + length));
    return UCS_OK;
  }
  static ucs_status_t on_fetch(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    return queue(arg, 0, data, length, param);
  }
  static ucs_status_t on_pull(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return queue(arg, 1, data, length, param);
  }
  static ucs_status_t on_ignore(void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
    return UCS_OK;
  }

  // A send whose header and payload live until UCX is done with them.
  struct Send {
    BlockHeader header{};
    std::vector<unsigned char> bytes;
    EvilServer* server = nullptr;
  };
  void send(unsigned id, const void* header, size_t header_length, std::vector<unsigned char> bytes, uint32_t flags) {
    auto* s = new Send;
    if (header_length) std::memcpy(&s->header, header, sizeof s->header);
    s->bytes = std::move(bytes);
    s->server = this;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = flags;
    p.cb.send = [](void* request, ucs_status_t, void* user) {
      delete static_cast<Send*>(user);
      ucp_request_free(request);
    };
    p.user_data = s;
    ucs_status_ptr_t r = ucp_am_send_nbx(reply_ep_, id, header_length ? &s->header : nullptr, header_length,
                                         s->bytes.data(), s->bytes.size(), &p);
    if (UCS_PTR_IS_ERR(r)) bad_sends_.fetch_add(1);
    if (!UCS_PTR_IS_PTR(r)) delete s;
  }
  void meta(uint64_t id, int32_t status, uint64_t tokens, uint64_t blocks, uint64_t block_bytes,
            const std::string& message = "", uint32_t flags = UCP_AM_SEND_FLAG_EAGER, int64_t message_bytes = -1) {
    MetaReply h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = status;
    h.request_id = id;
    h.geometry = test_geometry();
    h.tokens = tokens;
    h.blocks = blocks;
    h.block_bytes = block_bytes;
    h.message_bytes = uint32_t(message_bytes >= 0 ? uint64_t(message_bytes) : message.size());
    std::vector<unsigned char> b(sizeof h + message.size());
    std::memcpy(b.data(), &h, sizeof h);
    std::memcpy(b.data() + sizeof h, message.data(), message.size());
    send(kAmMeta, nullptr, 0, std::move(b), flags);
  }
  void block(uint64_t id, uint64_t index, uint64_t bytes = kBlock, uint32_t flags = 0) {
    BlockHeader h{kWireMagic, id, index};
    send(kAmBlock, &h, sizeof h, std::vector<unsigned char>(block_, block_ + bytes), flags);
  }

  void act(int kind, const std::vector<unsigned char>& payload) {
    std::string m;
    {
      std::lock_guard<std::mutex> lock(mu_);
      m = mode_;
    }
    if (kind == 0) {
      FetchRequest req{};
      if (payload.size() != sizeof req) return;
      std::memcpy(&req, payload.data(), sizeof req);
      const uint64_t id = req.request_id;
      id_ = id;
      if (m == "tokens_mismatch")
        meta(id, 0, 100, 3, kBlock);
      else if (m == "tokens_zero")
        meta(id, 0, 0, 0, kBlock);
      else if (m == "blocks_beyond_limit")
        meta(id, 0, (kMaxBlocks + 1) * 16, kMaxBlocks + 1, kBlock);
      else if (m == "block_bytes_lie")
        meta(id, 0, 40, 3, kBlock * 2);
      else if (m == "foreign_status")
        meta(id, 5, 0, 0, 0, "evil\nline two\x1b[31mred");
      else if (m == "message_size_lie")
        meta(id, -4, 0, 0, 0, "abc", UCP_AM_SEND_FLAG_EAGER, 2000);
      else if (m == "message_huge")
        meta(id, -4, 0, 0, 0, std::string(100000, 'A'));
      else if (m == "meta_by_rendezvous")
        meta(id, 0, 40, 3, kBlock, std::string(200000, 'x'), UCP_AM_SEND_FLAG_RNDV, 0);
      else if (m == "meta_of_another_request")
        meta(id + 1, 0, 40, 3, kBlock);
      else
        meta(id, 0, 40, 3, kBlock);
      return;
    }
    const uint64_t id = id_;
    if (m == "index_beyond") {
      block(id, 0), block(id, 1), block(id, 3);
    } else if (m == "block_twice") {
      block(id, 0), block(id, 0), block(id, 1);
    } else if (m == "block_short") {
      block(id, 0), block(id, 1), block(id, 2, kBlock - 1);
    } else if (m == "block_long") {
      block(id, 0), block(id, 1), block(id, 2, kBlock + 1);
    } else if (m == "blocks_of_another_request") {
      for (uint64_t i = 0; i < 3; ++i) block(id + 1, i);
    } else if (m == "rendezvous_then_eager_twice") {
      block(id, 0, kBlock, UCP_AM_SEND_FLAG_RNDV), block(id, 0, kBlock, UCP_AM_SEND_FLAG_EAGER), block(id, 1);
      block(id, 2);
    } else if (m == "last_block_never") {
      block(id, 0), block(id, 1);
    } else if (m == "ok_rendezvous") {
      for (uint64_t i = 0; i < 3; ++i) block(id, i, kBlock, UCP_AM_SEND_FLAG_RNDV);
    } else {  // ok_eager
      for (uint64_t i = 0; i < 3; ++i) block(id, i, kBlock, UCP_AM_SEND_FLAG_EAGER);
    }
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  ucp_ep_h reply_ep_ = nullptr;
  uint64_t id_ = 0;
  int port_ = 0;
  unsigned char block_[kBlock + 1];
  std::mutex mu_;
  std::string mode_;
  std::deque<std::pair<int, std::vector<unsigned char>>> work_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bad_sends_{0};
};

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Case cases[] = {
      {"ok_eager", CXLPOOL_OK},
      {"ok_rendezvous", CXLPOOL_OK},
      {"tokens_mismatch", CXLPOOL_E_CORRUPT},
      {"tokens_zero", CXLPOOL_E_CORRUPT},
      {"blocks_beyond_limit", CXLPOOL_E_CORRUPT},
      {"block_bytes_lie", CXLPOOL_E_CORRUPT},
      {"foreign_status", CXLPOOL_E_CORRUPT},
      {"message_size_lie", CXLPOOL_E_CORRUPT},
      {"message_huge", CXLPOOL_E_CORRUPT},
      {"meta_by_rendezvous", CXLPOOL_E_DEVICE_FAILED},
      {"meta_of_another_request", CXLPOOL_E_DEVICE_FAILED},
      {"index_beyond", CXLPOOL_E_CORRUPT},
      {"block_twice", CXLPOOL_E_CORRUPT},
      {"block_short", CXLPOOL_E_CORRUPT},
      {"block_long", CXLPOOL_E_CORRUPT},
      {"blocks_of_another_request", CXLPOOL_E_DEVICE_FAILED},
      {"rendezvous_then_eager_twice", CXLPOOL_E_CORRUPT},
      {"last_block_never", CXLPOOL_E_DEVICE_FAILED},
  };
  // The server runs in a child process of its own, as a hostile server would: two UCX
  // contexts in one process share UCX's table of async event handlers, keyed by descriptor
  // number, and a descriptor the client closed and the server reused could then reach the
  // other context's queue of missed events (a UCX assertion, not a fault of either side).
  int modes[2], replies[2];
  if (pipe(modes) != 0 || pipe(replies) != 0) {
    std::printf("kv_evil_server: pipe: %s\n", std::strerror(errno));
    return 2;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::printf("kv_evil_server: fork: %s\n", std::strerror(errno));
    return 2;
  }
  if (child == 0) {
    close(modes[1]);
    close(replies[0]);
    EvilServer server;
    const int port = server.start() ? server.port() : 0;
    dprintf(replies[1], "%d\n", port);
    if (!port) _exit(2);
    FILE* in = fdopen(modes[0], "r");
    char mode[128];
    while (in && std::fgets(mode, sizeof mode, in)) {  // one mode per line, acknowledged
      mode[std::strcspn(mode, "\n")] = 0;
      server.set_mode(mode);
      dprintf(replies[1], "ok\n");
    }
    server.stop();
    _exit(0);
  }
  close(modes[0]);
  close(replies[1]);
  std::signal(SIGPIPE, SIG_IGN);  // a server process that died is reported, not our death
  FILE* from_server = fdopen(replies[0], "r");
  char line[64] = "";
  const int port = from_server && std::fgets(line, sizeof line, from_server) ? std::atoi(line) : 0;
  if (!port) {
    std::printf("kv_evil_server: no UCX listener: %s\n", "ucp_init/worker/listener failed");
    return 2;
  }
  const std::string device = "shm:cxlpool-kv-evil-" + std::to_string(getpid());
  cxlpool_shared_pool_unlink(device.c_str());
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_shared_params_create(&params);
  cxlpool_shared_params_set_size(params, 64ull << 20);
  if (cxlpool_shared_pool_create(device.c_str(), params, 0, &pool) != CXLPOOL_OK) {
    std::printf("kv_evil_server: %s\n", cxlpool_last_error_message());
    return 2;
  }
  cxlpool_shared_params_destroy(params);
  const cxlpool_kv_geometry_t g = test_geometry();
  cxlpool_shared_info_t before{};
  cxlpool_shared_pool_info(pool, &before);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  int failures = 0;
  for (const Case& c : cases) {
    dprintf(modes[1], "%s\n", c.name);
    if (!std::fgets(line, sizeof line, from_server)) {
      std::printf("FAILED %s: the server process is gone\n", c.name);
      ++failures;
      break;
    }
    cxlpool_kv_remote_t* remote = nullptr;
    // The cases the client can only end by its timeout get a short one; the others a hang guard,
    // so a starved UCX progress thread on a busy machine is not taken for a broken server.
    const uint32_t timeout_ms = c.expect == CXLPOOL_E_DEVICE_FAILED ? 5000 : 30000;
    if (cxlpool_kv_remote_connect(address.c_str(), timeout_ms, 0, &remote) != CXLPOOL_OK) {
      std::printf("FAILED %s: connect: %s\n", c.name, cxlpool_last_error_message());
      ++failures;
      continue;
    }
    cxlpool_kv_handle_t handle{};
    cxlpool_kv_view_t* view = nullptr;
    const cxlpool_status_t st = cxlpool_kv_remote_import(remote, &pool, 1, &g, &handle, &view);
    const std::string message = st ? cxlpool_last_error_message() : "";
    bool ok = st == c.expect && (st == CXLPOOL_OK) == (view != nullptr);
    if (view) {  // an honest case: the bytes the server sent
      for (uint64_t b = 0; b < 3 && ok; ++b) {
        const void* data = nullptr;
        ok = cxlpool_kv_view_block(view, b, &data) == CXLPOOL_OK;
        for (uint64_t i = 0; ok && i < kBlock; ++i)
          ok = static_cast<const unsigned char*>(data)[i] == static_cast<unsigned char>(i * 131 + 7);
      }
      cxlpool_kv_view_release(view);
    }
    for (char ch : message)  // the server's words reach this log without its control characters
      if (static_cast<unsigned char>(ch) < 0x20) ok = false;
    cxlpool_kv_remote_close(remote);
    cxlpool_shared_info_t after{};
    cxlpool_shared_pool_info(pool, &after);
    const bool freed = after.bytes_in_use == before.bytes_in_use;
    std::printf("%s %s: status %d (expected %d)%s %s\n", ok && freed ? "ok    " : "FAILED", c.name, int(st), c.expect,
                freed ? "" : " [landing blocks not freed]", message.c_str());
    failures += !(ok && freed);
  }
  close(modes[1]);  // the server stops at the end of its input
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    std::printf("FAILED the server process ended with status %d\n", wstatus);
    ++failures;
  }
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device.c_str());
  std::printf("kv_evil_server: %zu cases, %d failed\n", sizeof cases / sizeof *cases, failures);
  return failures ? 1 : 0;
}

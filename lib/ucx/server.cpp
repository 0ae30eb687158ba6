// SPDX-License-Identifier: MIT
// The producer's KV server (include/cxlpool/kvcache_remote.h): a UCX listener and one worker
// driven by its own thread. A FETCH is imported from the server's pools exactly as a local
// consumer would (cxlpool_kv_import: every check, a lease on every block), answered with the
// blocks' addresses in the regions registered at start, and held until the consumer's DONE, its
// disconnect or its failure. UCX calls its callbacks inside ucp_worker_progress on this thread
// only; they queue work that the loop does after progress returns.
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/kvcache_remote.h"
#include "ucx/ucx_util.hpp"
#include "ucx/wire.hpp"

namespace cxlpool::ucx {
namespace {

constexpr size_t kMaxViewsPerPeer = 256;

class Server {
 public:
  ~Server() { stop(); }

  bool start(cxlpool_shared_pool_t* const* pools, size_t npools, const char* address, Error* err) {
    constexpr const char* kWho = "cxlpool_kv_server_start";
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (!parse_address(kWho, address, true, &sa, &len, err)) return false;
    if (!pools || npools == 0 || npools > kMaxRegions)
      return *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": 1 to 16 pools"}, false;
    if (!ucp_.init("cxlpool-kv-server", UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                   UCS_THREAD_MODE_SERIALIZED, err))
      return false;
    for (size_t i = 0; i < npools; ++i) {
      void* base = nullptr;
      uint64_t size = 0;
      if (cxlpool_status_t s = cxlpool_shared_pool_data_range(pools[i], &base, &size); s != CXLPOOL_OK)
        return *err = {s, std::string(kWho) + ": pool " + std::to_string(i) + ": " + cxlpool_last_error_message()},
               false;
      pools_.push_back(pools[i]);
      Region r{reinterpret_cast<uintptr_t>(base), size, nullptr, {}};
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      mp.address = base;
      mp.length = size;
      if (ucs_status_t s = ucp_mem_map(ucp_.context(), &mp, &r.memh); s != UCS_OK)
        return *err = ucx_error(std::string(kWho) + ": ucp_mem_map(pool " + std::to_string(i) + ")", s), false;
      void* packed = nullptr;
      size_t packed_size = 0;
      ucs_status_t s = ucp_rkey_pack(ucp_.context(), r.memh, &packed, &packed_size);
      if (s == UCS_OK && (packed_size == 0 || packed_size > kMaxRkeyBytes)) s = UCS_ERR_EXCEEDS_LIMIT;
      if (s == UCS_OK)
        r.rkey.assign(static_cast<unsigned char*>(packed), static_cast<unsigned char*>(packed) + packed_size);
      if (packed) ucp_rkey_buffer_release(packed);
      regions_.push_back(std::move(r));
      if (s != UCS_OK) return *err = ucx_error(std::string(kWho) + ": ucp_rkey_pack", s), false;
    }
    for (unsigned id : {kAmFetch, kAmDone}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = id == kAmFetch ? on_fetch : on_done;
      hp.arg = this;
      if (ucs_status_t s = ucp_worker_set_am_recv_handler(ucp_.worker(), &hp); s != UCS_OK)
        return *err = ucx_error(std::string(kWho) + ": ucp_worker_set_am_recv_handler", s), false;
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = on_connection;
    lp.conn_handler.arg = this;
    if (ucs_status_t s = ucp_listener_create(ucp_.worker(), &lp, &listener_); s != UCS_OK)
      return *err = ucx_error(std::string(kWho) + ": listening on " + address, s), false;
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener_, &la) == UCS_OK) address_ = format_address(la.sockaddr);
    if (ucs_status_t s = ucp_worker_get_efd(ucp_.worker(), &efd_); s != UCS_OK)
      return *err = ucx_error(std::string(kWho) + ": ucp_worker_get_efd", s), false;
    // The loop thread takes no asynchronous signal: they are the program's.
    sigset_t all, old;
    sigfillset(&all);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    try {
      thread_ = std::thread([this] { loop(); });
    } catch (...) {
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      return *err = {CXLPOOL_E_NO_MEMORY, std::string(kWho) + ": no thread"}, false;
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return true;
  }

  void stop() {
    if (thread_.joinable()) {
      stop_.store(true);
      ucp_worker_signal(ucp_.worker());
      thread_.join();
    }
    if (listener_) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    for (Region& r : regions_)
      if (r.memh) ucp_mem_unmap(ucp_.context(), r.memh);
    regions_.clear();
  }

  const std::string& address() const { return address_; }

  cxlpool_kv_server_stats_t stats() const {
    cxlpool_kv_server_stats_t s{};
    s.connections = connections_.load();
    s.disconnects = disconnects_.load();
    s.fetches = fetches_.load();
    s.refused = refused_.load();
    s.bytes_offered = bytes_offered_.load();
    s.views_held = views_held_.load();
    return s;
  }

 private:
  struct Region {
    uintptr_t base;
    uint64_t size;
    ucp_mem_h memh;
    std::vector<unsigned char> rkey;
  };
  struct Peer {
    std::map<uint64_t, cxlpool_kv_view_t*> views;  // request id -> the leases it holds
  };
  enum class Kind { kFetch, kDone, kFailed };
  struct Work {
    Kind kind;
    ucp_ep_h ep;
    std::vector<unsigned char> payload;
  };

  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<Server*>(arg);
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_endpoint_error;
    ep.err_handler.arg = self;
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(self->ucp_.worker(), &ep, &h) != UCS_OK) return;  // UCX rejects the request
    self->peers_[h];
    self->connections_.fetch_add(1);
  }

  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<Server*>(arg)->queue(Kind::kFailed, ep, nullptr, 0);
  }

  static ucs_status_t on_message(Kind kind, void* arg, void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Server*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // never sent so: requests are small and eager
      ucp_am_data_release(self->ucp_.worker(), data);
      return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
      self->queue(kind, param->reply_ep, static_cast<const unsigned char*>(data), length);
    return UCS_OK;
  }
  static ucs_status_t on_fetch(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    return on_message(Kind::kFetch, arg, data, length, param);
  }
  static ucs_status_t on_done(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return on_message(Kind::kDone, arg, data, length, param);
  }

  void queue(Kind kind, ucp_ep_h ep, const unsigned char* data, size_t length) noexcept {
    try {
      work_.push_back({kind, ep, std::vector<unsigned char>(data, data + length)});
    } catch (...) {
      // No memory for the request: the consumer times out and its connection is closed.
    }
  }

  void loop() {
    while (!stop_.load()) {
      while (ucp_worker_progress(ucp_.worker()) != 0) {
      }
      if (!work_.empty()) {
        std::deque<Work> batch;
        batch.swap(work_);
        for (Work& w : batch) handle(w);
        continue;
      }
      ucs_status_t s = ucp_worker_arm(ucp_.worker());
      if (s == UCS_ERR_BUSY) continue;
      pollfd pfd{efd_, POLLIN, 0};
      poll(&pfd, 1, 100);
    }
    // Every consumer goes: leases dropped, endpoints closed.
    for (auto& [ep, peer] : peers_) {
      drop_views(peer);
      close_endpoint(ep);
    }
    peers_.clear();
    for (int i = 0; i < 100 && ucp_worker_progress(ucp_.worker()) != 0; ++i) {
    }
  }

  void drop_views(Peer& peer) {
    for (auto& [id, view] : peer.views) {
      cxlpool_kv_view_release(view);
      views_held_.fetch_sub(1);
    }
    peer.views.clear();
  }

  void close_endpoint(ucp_ep_h ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // released when the close completes
  }

  void handle(Work& w) {
    if (w.kind == Kind::kFailed) {
      auto it = peers_.find(w.ep);
      if (it == peers_.end()) return;
      drop_views(it->second);
      peers_.erase(it);
      close_endpoint(w.ep);
      disconnects_.fetch_add(1);
      return;
    }
    Peer& peer = peers_[w.ep];
    if (w.kind == Kind::kDone) {
      DoneMessage d{};
      if (w.payload.size() != sizeof d) return;
      std::memcpy(&d, w.payload.data(), sizeof d);
      auto it = peer.views.find(d.request_id);
      if (d.magic != kWireMagic || it == peer.views.end()) return;
      cxlpool_kv_view_release(it->second);
      peer.views.erase(it);
      views_held_.fetch_sub(1);
      return;
    }
    FetchRequest req{};
    if (w.payload.size() != sizeof req) return;  // not ours: no request id to answer
    std::memcpy(&req, w.payload.data(), sizeof req);
    if (req.magic != kWireMagic) return;
    if (req.version != kWireVersion) {
      refuse(w.ep, req.request_id, CXLPOOL_E_NOT_SUPPORTED,
             "protocol version " + std::to_string(req.version) + " (this server speaks 1)");
      return;
    }
    if (peer.views.size() >= kMaxViewsPerPeer || peer.views.count(req.request_id)) {
      refuse(w.ep, req.request_id, CXLPOOL_E_CAPACITY,
             "this consumer already reads " + std::to_string(peer.views.size()) + " sequences (at most " +
                 std::to_string(kMaxViewsPerPeer) + ")");
      return;
    }
    cxlpool_kv_view_t* view = nullptr;
    cxlpool_status_t s =
        cxlpool_kv_import(pools_.data(), pools_.size(), req.has_expected ? &req.expected : nullptr, &req.handle, &view);
    if (s != CXLPOOL_OK) {
      refuse(w.ep, req.request_id, s, cxlpool_last_error_message());
      return;
    }
    std::vector<unsigned char> reply;
    if (!describe(view, req.request_id, &reply)) {
      cxlpool_kv_view_release(view);
      refuse(w.ep, req.request_id, CXLPOOL_E_INTERNAL, "a block outside every registered region");
      return;
    }
    peer.views[req.request_id] = view;
    views_held_.fetch_add(1);
    fetches_.fetch_add(1);
    cxlpool_kv_view_info_t info{};
    cxlpool_kv_view_info(view, &info);
    bytes_offered_.fetch_add(info.blocks * info.bytes_per_block);
    send(w.ep, std::move(reply));
  }

  bool describe(cxlpool_kv_view_t* view, uint64_t request_id, std::vector<unsigned char>* out) {
    cxlpool_kv_view_info_t info{};
    if (cxlpool_kv_view_info(view, &info) != CXLPOOL_OK) return false;
    ReplyHeader h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = CXLPOOL_OK;
    h.request_id = request_id;
    h.geometry = info.geometry;
    h.tokens = info.tokens;
    h.blocks = info.blocks;
    h.block_bytes = info.bytes_per_block;
    h.regions = uint32_t(regions_.size());
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      out->insert(out->end(), b, b + n);
    };
    put(&h, sizeof h);
    for (const Region& r : regions_) {
      RegionEntry e{r.base, r.size, uint32_t(r.rkey.size()), 0};
      put(&e, sizeof e);
      put(r.rkey.data(), r.rkey.size());
      out->resize(out->size() + pad8(r.rkey.size()) - r.rkey.size(), 0);
    }
    for (uint64_t i = 0; i < info.blocks; ++i) {
      const void* data = nullptr;
      if (cxlpool_kv_view_block(view, i, &data) != CXLPOOL_OK) return false;
      const auto a = reinterpret_cast<uintptr_t>(data);
      uint32_t region = 0;
      while (region < regions_.size() &&
             !(a >= regions_[region].base && a - regions_[region].base + info.bytes_per_block <= regions_[region].size))
        ++region;
      if (region == regions_.size()) return false;
      BlockEntry b{a, region, 0};
      put(&b, sizeof b);
    }
    return true;
  }

  void refuse(ucp_ep_h ep, uint64_t request_id, cxlpool_status_t status, const std::string& message) {
    refused_.fetch_add(1);
    ReplyHeader h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = status;
    h.request_id = request_id;
    const std::string m = message.substr(0, kMaxMessage);
    h.message_bytes = uint32_t(m.size());
    std::vector<unsigned char> reply(sizeof h + m.size());
    std::memcpy(reply.data(), &h, sizeof h);
    std::memcpy(reply.data() + sizeof h, m.data(), m.size());
    send(ep, std::move(reply));
  }

  // Sends a REPLY; the buffer lives until UCX is done with it.
  void send(ucp_ep_h ep, std::vector<unsigned char> bytes) {
    auto* buffer = new (std::nothrow) std::vector<unsigned char>(std::move(bytes));
    if (!buffer) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    p.cb.send = [](void* request, ucs_status_t, void* user) {
      delete static_cast<std::vector<unsigned char>*>(user);
      ucp_request_free(request);
    };
    p.user_data = buffer;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, kAmReply, nullptr, 0, buffer->data(), buffer->size(), &p);
    if (!UCS_PTR_IS_PTR(r)) delete buffer;  // done at once, or failed (the endpoint's error comes)
  }

  Ucp ucp_;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  std::string address_;
  std::vector<cxlpool_shared_pool_t*> pools_;
  std::vector<Region> regions_;
  std::map<ucp_ep_h, Peer> peers_;  // loop thread only
  std::deque<Work> work_;           // loop thread only (callbacks run inside its progress)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> connections_{0}, disconnects_{0}, fetches_{0}, refused_{0}, bytes_offered_{0}, views_held_{0};
};

}  // namespace
}  // namespace cxlpool::ucx

struct cxlpool_kv_server {
  static constexpr uint64_t kLive = 0x5652455356564b31ull;
  uint64_t magic = kLive;
  std::unique_ptr<cxlpool::ucx::Server> server;
};

using cxlpool::ucx::Error;
using cxlpool::ucx::record;

namespace {
bool live(const cxlpool_kv_server_t* s) { return s && s->magic == cxlpool_kv_server::kLive && s->server; }
cxlpool_status_t not_live(const char* fn) {
  return record({CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": not a live KV server"});
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_kv_server_start(cxlpool_shared_pool_t* const* pools, size_t npools, const char* address,
                                         cxlpool_kv_server_t** out) {
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_start: out is NULL"});
  *out = nullptr;
  auto s = std::unique_ptr<cxlpool_kv_server>(new (std::nothrow) cxlpool_kv_server);
  if (!s) return record({CXLPOOL_E_NO_MEMORY, "cxlpool_kv_server_start: no memory"});
  Error err{CXLPOOL_OK, ""};
  try {
    s->server = std::make_unique<cxlpool::ucx::Server>();
    if (!s->server->start(pools, npools, address, &err)) return record(err);
  } catch (const std::exception& e) {
    return record({CXLPOOL_E_NO_MEMORY, std::string("cxlpool_kv_server_start: ") + e.what()});
  }
  *out = s.release();
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_address(const cxlpool_kv_server_t* server, char* buf, size_t len) {
  if (!live(server)) return not_live("cxlpool_kv_server_address");
  const std::string& a = server->server->address();
  if (!buf || len <= a.size())
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_address: buffer NULL or shorter than " +
                                                   std::to_string(a.size() + 1) + " bytes"});
  std::memcpy(buf, a.c_str(), a.size() + 1);
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_stats(const cxlpool_kv_server_t* server, cxlpool_kv_server_stats_t* out) {
  if (!live(server)) return not_live("cxlpool_kv_server_stats");
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_stats: out is NULL"});
  *out = server->server->stats();
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_stop(cxlpool_kv_server_t* server) {
  if (!live(server)) return not_live("cxlpool_kv_server_stop");
  server->magic = 0;
  server->server.reset();  // stops it
  cxlpool::ucx::retire(server);
  return CXLPOOL_OK;
}

}  // extern "C"

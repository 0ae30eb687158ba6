// SPDX-License-Identifier: MIT
// The consumer's side of the KV remote protocol (include/cxlpool/kvcache_remote.h): one UCX
// endpoint to a server, driven by the calling thread (one call at a time: the worker is
// serialized by a mutex). An import sends FETCH, validates the REPLY, allocates a landing
// view in the consumer's pools (cxlpool_kv_view_create), reads every block one-sided
// (ucp_get_nbx) into it and sends DONE so that the server drops its leases.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cxlpool/kvcache_remote.h"
#include "ucx/ucx_util.hpp"
#include "ucx/wire.hpp"

namespace cxlpool::ucx {
namespace {

constexpr size_t kGetsInFlight = 32;

class Client {
 public:
  ~Client() { close(); }

  bool connect(const char* address, uint32_t timeout_ms, Error* err) {
    constexpr const char* kWho = "cxlpool_kv_remote_connect";
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (!parse_address(kWho, address, false, &sa, &len, err)) return false;
    address_ = address;
    timeout_ = std::chrono::milliseconds(timeout_ms ? timeout_ms : 10000);
    if (!ucp_.init("cxlpool-kv-client", UCP_FEATURE_RMA | UCP_FEATURE_AM, UCS_THREAD_MODE_SERIALIZED, err))
      return false;
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = kAmReply;
    hp.cb = on_reply;
    hp.arg = this;
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(ucp_.worker(), &hp); s != UCS_OK)
      return *err = ucx_error(std::string(kWho) + ": ucp_worker_set_am_recv_handler", s), false;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
    ep.sockaddr.addrlen = len;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_endpoint_error;
    ep.err_handler.arg = this;
    if (ucs_status_t s = ucp_ep_create(ucp_.worker(), &ep, &ep_); s != UCS_OK)
      return *err = ucx_error(std::string(kWho) + ": " + address, s), false;
    // The connection is made in the background: a flush completes once it is up.
    ucp_request_param_t p{};
    ucs_status_t s = wait(ucp_ep_flush_nbx(ep_, &p));
    if (s == UCS_OK && failed_) s = failure_;
    if (s != UCS_OK) {
      *err = {CXLPOOL_E_OS, std::string(kWho) + ": no connection to " + address + ": " +
                                (s == UCS_ERR_TIMED_OUT ? "timed out after " + std::to_string(timeout_.count()) + " ms"
                                                        : ucs_status_string(s))};
      return false;
    }
    return true;
  }

  cxlpool_status_t import(cxlpool_shared_pool_t* const* pools, size_t npools, const cxlpool_kv_geometry_t* expected,
                          const cxlpool_kv_handle_t* handle, cxlpool_kv_view_t** out) {
    constexpr const char* kWho = "cxlpool_kv_remote_import";
    if (!handle || !out) return record({CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": handle or out is NULL"});
    *out = nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return broken(kWho);
    FetchRequest req{};
    req.magic = kWireMagic;
    req.version = kWireVersion;
    req.request_id = ++next_id_;
    req.handle = *handle;
    if (expected) {
      req.has_expected = 1;
      req.expected = *expected;
    }
    replies_.erase(req.request_id);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    if (wait(ucp_am_send_nbx(ep_, kAmFetch, nullptr, 0, &req, sizeof req, &p)) != UCS_OK || failed_)
      return broken(kWho);
    const Clock::time_point deadline = Clock::now() + timeout_;
    unsigned spins = 0;
    while (!failed_ && !replies_.count(req.request_id)) {
      if (!ucp_worker_progress(ucp_.worker()) && (++spins & 255) == 0 && Clock::now() > deadline) {
        fail_connection(UCS_ERR_TIMED_OUT);
        break;
      }
    }
    if (failed_) return broken(kWho);
    std::vector<unsigned char> bytes = std::move(replies_[req.request_id]);
    replies_.erase(req.request_id);
    Reply reply;
    std::string why;
    if (!parse_reply(bytes.data(), bytes.size(), &reply, &why)) {
      done(req.request_id);
      return record({CXLPOOL_E_CORRUPT, std::string(kWho) + ": the server's reply " + why});
    }
    if (reply.header.status != CXLPOOL_OK)
      return record({cxlpool_status_t(reply.header.status),
                     std::string(kWho) + ": refused by " + address_ + ": " + reply.message});
    cxlpool_status_t s = fetch(reply, pools, npools, expected, out);
    done(req.request_id);
    if (s == CXLPOOL_OK && failed_) {
      cxlpool_kv_view_release(*out);
      *out = nullptr;
      return broken(kWho);
    }
    return s;
  }

  void close() {
    if (!ep_) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = failed_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
    ep_ = nullptr;
    if (UCS_PTR_IS_PTR(r)) {
      const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(1000);
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(ucp_.worker());
      ucp_request_free(r);
    }
  }

 private:
  cxlpool_status_t fetch(const Reply& reply, cxlpool_shared_pool_t* const* pools, size_t npools,
                         const cxlpool_kv_geometry_t* expected, cxlpool_kv_view_t** out) {
    constexpr const char* kWho = "cxlpool_kv_remote_import";
    const ReplyHeader& h = reply.header;
    uint64_t per_token = 0, per_block = 0;
    if (cxlpool_kv_geometry_sizes(&h.geometry, &per_token, &per_block) != CXLPOOL_OK || per_block != h.block_bytes)
      return record({CXLPOOL_E_CORRUPT, std::string(kWho) + ": the server's reply has sizes that do not agree with "
                                                            "its geometry"});
    if (expected && std::memcmp(expected, &h.geometry, sizeof h.geometry) != 0)
      return record(
          {CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": the exporter's geometry is not the expected one"});
    cxlpool_kv_view_t* view = nullptr;
    if (cxlpool_status_t s = cxlpool_kv_view_create(pools, npools, &h.geometry, h.tokens, &view); s != CXLPOOL_OK)
      return s;  // its message stands
    cxlpool_kv_view_info_t info{};
    cxlpool_kv_view_info(view, &info);
    if (info.blocks != h.blocks) {
      cxlpool_kv_view_release(view);
      return record({CXLPOOL_E_CORRUPT, std::string(kWho) + ": the server says " + std::to_string(h.blocks) +
                                            " blocks for " + std::to_string(h.tokens) + " tokens"});
    }
    std::vector<ucp_rkey_h> rkeys;
    ucs_status_t st = UCS_OK;
    for (const Reply::Region& r : reply.regions) {
      ucp_rkey_h k = nullptr;
      if ((st = ucp_ep_rkey_unpack(ep_, r.rkey.data(), &k)) != UCS_OK) break;
      rkeys.push_back(k);
    }
    std::vector<ucs_status_ptr_t> in_flight;
    auto drain = [&](size_t keep) {
      while (in_flight.size() > keep) {
        ucs_status_t s = wait(in_flight.front());
        in_flight.erase(in_flight.begin());
        if (s != UCS_OK && st == UCS_OK) st = s;
      }
    };
    for (uint64_t i = 0; st == UCS_OK && i < h.blocks && !failed_; ++i) {
      void* dst = nullptr;
      cxlpool_kv_view_block_writable(view, i, &dst);
      const BlockEntry& b = reply.blocks[size_t(i)];
      ucp_request_param_t p{};
      ucs_status_ptr_t r = ucp_get_nbx(ep_, dst, size_t(h.block_bytes), b.address, rkeys[b.region], &p);
      if (UCS_PTR_IS_ERR(r)) {
        st = UCS_PTR_STATUS(r);
      } else if (r) {
        in_flight.push_back(r);
        drain(kGetsInFlight - 1);
      }
    }
    drain(0);
    if (st == UCS_OK && !failed_) {  // every get has landed once the endpoint is flushed
      ucp_request_param_t p{};
      st = wait(ucp_ep_flush_nbx(ep_, &p));
    }
    for (ucp_rkey_h k : rkeys) ucp_rkey_destroy(k);
    if (st != UCS_OK || failed_) {
      cxlpool_kv_view_release(view);
      if (failed_) return broken(kWho);
      return record(ucx_error(std::string(kWho) + ": reading the blocks from " + address_, st));
    }
    *out = view;
    return CXLPOOL_OK;
  }

  // Tells the server the sequence is read (its leases go); a failure shows at the next call.
  void done(uint64_t request_id) {
    if (failed_) return;
    DoneMessage d{kWireMagic, request_id};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    wait(ucp_am_send_nbx(ep_, kAmDone, nullptr, 0, &d, sizeof d, &p));
  }

  ucs_status_t wait(ucs_status_ptr_t req) {
    return wait_request(ucp_.worker(), req, Clock::now() + timeout_, [&] { fail_connection(UCS_ERR_TIMED_OUT); });
  }

  void fail_connection(ucs_status_t why) {
    if (!failed_) {
      failed_ = true;
      failure_ = why;
    }
    if (ep_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &p);
      ep_ = nullptr;
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
  }

  cxlpool_status_t broken(const char* who) {
    return record({CXLPOOL_E_DEVICE_FAILED,
                   std::string(who) + ": the connection to " + address_ + " failed (" +
                       (failure_ == UCS_ERR_TIMED_OUT ? "no answer within " + std::to_string(timeout_.count()) + " ms"
                                                      : std::string(ucs_status_string(failure_))) +
                       "); connect again"});
  }

  static void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* self = static_cast<Client*>(arg);
    if (!self->failed_) {
      self->failed_ = true;
      self->failure_ = status;
    }
  }

  static ucs_status_t on_reply(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Client*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // the server sends eagerly only
      ucp_am_data_release(self->ucp_.worker(), data);
      return UCS_OK;
    }
    ReplyHeader h{};
    if (length < sizeof h) return UCS_OK;
    std::memcpy(&h, data, sizeof h);
    if (h.magic != kWireMagic || h.request_id != self->next_id_) return UCS_OK;  // late answer to a past request
    try {
      const auto* b = static_cast<const unsigned char*>(data);
      self->replies_[h.request_id].assign(b, b + length);
    } catch (...) {
      self->fail_connection(UCS_ERR_NO_MEMORY);
    }
    return UCS_OK;
  }

  Ucp ucp_;
  ucp_ep_h ep_ = nullptr;
  std::string address_;
  std::chrono::milliseconds timeout_{10000};
  std::mutex mu_;
  bool failed_ = false;
  ucs_status_t failure_ = UCS_OK;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::vector<unsigned char>> replies_;
};

}  // namespace
}  // namespace cxlpool::ucx

struct cxlpool_kv_remote {
  static constexpr uint64_t kLive = 0x45544f4d45564b31ull;
  uint64_t magic = kLive;
  std::unique_ptr<cxlpool::ucx::Client> client;
};

using cxlpool::ucx::Error;
using cxlpool::ucx::record;

namespace {
bool live(const cxlpool_kv_remote_t* r) { return r && r->magic == cxlpool_kv_remote::kLive && r->client; }
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_kv_remote_connect(const char* address, uint32_t timeout_ms, cxlpool_kv_remote_t** out) {
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_connect: out is NULL"});
  *out = nullptr;
  auto r = std::unique_ptr<cxlpool_kv_remote>(new (std::nothrow) cxlpool_kv_remote);
  if (!r) return record({CXLPOOL_E_NO_MEMORY, "cxlpool_kv_remote_connect: no memory"});
  Error err{CXLPOOL_OK, ""};
  try {
    r->client = std::make_unique<cxlpool::ucx::Client>();
    if (!r->client->connect(address, timeout_ms, &err)) return record(err);
  } catch (const std::exception& e) {
    return record({CXLPOOL_E_NO_MEMORY, std::string("cxlpool_kv_remote_connect: ") + e.what()});
  }
  *out = r.release();
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_remote_import(cxlpool_kv_remote_t* remote, cxlpool_shared_pool_t* const* pools,
                                          size_t npools, const cxlpool_kv_geometry_t* expected,
                                          const cxlpool_kv_handle_t* handle, cxlpool_kv_view_t** out) {
  if (!live(remote))
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_import: not a live KV remote connection"});
  try {
    return remote->client->import(pools, npools, expected, handle, out);
  } catch (const std::exception& e) {
    return record({CXLPOOL_E_NO_MEMORY, std::string("cxlpool_kv_remote_import: ") + e.what()});
  }
}

cxlpool_status_t cxlpool_kv_remote_close(cxlpool_kv_remote_t* remote) {
  if (!live(remote))
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_close: not a live KV remote connection"});
  remote->magic = 0;
  remote->client.reset();
  cxlpool::ucx::retire(remote);
  return CXLPOOL_OK;
}

}  // extern "C"

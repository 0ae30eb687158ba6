// SPDX-License-Identifier: MIT
// The consumer's side of the KV remote protocol (include/cxlpool/kvcache_remote.h): one UCX
// endpoint to a server, driven by the calling thread (one call at a time: the worker is
// serialized by a mutex). An import sends FETCH, validates the META answer, allocates a landing
// view in the consumer's pools (cxlpool_kv_view_create), sends PULL and receives every BLOCK
// straight into its landing block (ucp_am_recv_data_nbx for rendezvous), then sends DONE.
// With CXLPOOL_KV_REMOTE_SAME_HOST, connecting also sends HELLO (this worker's address) and
// waits for the server's answer: META and BLOCK then come through shared memory, over the
// endpoint the server made to this worker's address (the handlers take them from any endpoint).
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
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

class Client {
 public:
  ~Client() { close(); }

  bool connect(const char* address, uint32_t timeout_ms, uint32_t flags, Error* err) {
    constexpr const char* kWho = "cxlpool_kv_remote_connect";
    if (flags & ~CXLPOOL_KV_REMOTE_SAME_HOST)
      return *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": unknown flags " + std::to_string(flags)}, false;
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (!parse_address(kWho, address, false, &sa, &len, err)) return false;
    address_ = address;
    timeout_ = std::chrono::milliseconds(timeout_ms ? timeout_ms : 10000);
    if (!ucp_.init("cxlpool-kv-client", UCP_FEATURE_AM, UCS_THREAD_MODE_SERIALIZED, err)) return false;
    if (!ucp_.set_handlers({{kAmMeta, on_meta},
                            {kAmBlock, on_block},
                            {kAmHelloReply, on_hello_reply},
                            {kAmHelloChallenge, on_hello_challenge}},
                           this, kWho, err))
      return false;
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
    deadline_ = Clock::now() + timeout_;
    ucp_request_param_t p{};
    ucs_status_t s = wait(ucp_ep_flush_nbx(ep_, &p));
    if (s == UCS_OK && failed_) s = failure_;
    if (s != UCS_OK) {
      *err = {CXLPOOL_E_OS, std::string(kWho) + ": no connection to " + address + ": " +
                                (s == UCS_ERR_TIMED_OUT ? "timed out after " + std::to_string(timeout_.count()) + " ms"
                                                        : ucs_status_string(s))};
      return false;
    }
    bool same_host = false;
    const std::string lanes = describe_lanes(ep_, &same_host);
    path_ = "network: " + lanes;
    if (flags & CXLPOOL_KV_REMOTE_SAME_HOST) return hello(err);
    return true;
  }

  // The same-host path: HELLO with this worker's address, then the server's answer.
  bool hello(Error* err) {
    constexpr const char* kWho = "cxlpool_kv_remote_connect";
    ucp_address_t* mine = nullptr;
    size_t length = 0;
    if (ucs_status_t s = ucp_worker_get_address(ucp_.worker(), &mine, &length); s != UCS_OK)
      return *err = ucx_error(std::string(kWho) + ": ucp_worker_get_address", s), false;
    if (length > kMaxWorkerAddress) {
      ucp_worker_release_address(ucp_.worker(), mine);
      return *err = {CXLPOOL_E_NOT_SUPPORTED, std::string(kWho) + ": this worker's address has " +
                                                  std::to_string(length) + " bytes (at most " +
                                                  std::to_string(kMaxWorkerAddress) + ")"},
             false;
    }
    HelloRequest h{kWireMagic, kWireVersion, uint32_t(length), {}};
    if (!host_identity(&h.where)) {
      ucp_worker_release_address(ucp_.worker(), mine);
      return *err = {CXLPOOL_E_OS, std::string(kWho) + ": /proc does not tell this process's boot id and namespaces"},
             false;
    }
    std::vector<unsigned char> bytes(sizeof h + length);
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, mine, length);
    ucp_worker_release_address(ucp_.worker(), mine);
    hello_.reset();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    want_hello_ = true;
    challenge_.reset();
    bool answered = wait(ucp_am_send_nbx(ep_, kAmHello, nullptr, 0, bytes.data(), bytes.size(), &p)) == UCS_OK &&
                    !failed_ && progress_until([&] { return hello_ != nullptr || challenge_ != nullptr; });
    if (answered && !hello_) {  // HELLO_CHALLENGE: prove this process may read the server's memory
      HelloProof proof = answer(*challenge_);
      challenge_.reset();
      answered = wait(ucp_am_send_nbx(ep_, kAmHelloProof, nullptr, 0, &proof, sizeof proof, &p)) == UCS_OK &&
                 !failed_ && progress_until([&] { return hello_ != nullptr; });
    }
    want_hello_ = false;
    if (!answered) {
      *err = {CXLPOOL_E_OS, std::string(kWho) + ": " + address_ +
                                ": no answer to the same-host request (HELLO) within " +
                                std::to_string(timeout_.count()) + " ms (" +
                                (failure_ == UCS_ERR_TIMED_OUT ? "timed out" : ucs_status_string(failure_)) + ")"};
      return false;
    }
    HelloReply r{};
    std::memcpy(&r, hello_->data(), sizeof r);
    std::string m = printable(std::string(reinterpret_cast<const char*>(hello_->data() + sizeof r), r.message_bytes));
    hello_.reset();
    if (r.status == CXLPOOL_OK) {
      path_ = "same host: " + m;
    } else {
      path_ += " (the same-host path was refused: " + m + ")";
    }
    return true;
  }

  // The answer to a HELLO_CHALLENGE: the nonce read in the server's memory, only if the process
  // it names holds the server's end of this connection (a server naming another process gets
  // nothing read there), or why not.
  HelloProof answer(const std::vector<unsigned char>& bytes) {
    HelloProof proof{};
    proof.magic = kWireMagic;
    proof.version = kWireVersion;
    HelloChallenge c{};
    std::memcpy(&c, bytes.data(), sizeof c);
    ucp_ep_attr_t attr{};
    attr.field_mask = UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR | UCP_EP_ATTR_FIELD_REMOTE_SOCKADDR;
    unsigned long inode = 0;
    if (c.magic != kWireMagic || c.pid <= 0 || ucp_ep_query(ep_, &attr) != UCS_OK ||
        !tcp_socket_inode(attr.remote_sockaddr, attr.local_sockaddr, &inode)) {
      proof.read_errno = ESRCH;
      return proof;
    }
    if (const int held = process_holds_socket(pid_t(c.pid), inode); held <= 0) {
      proof.read_errno = held < 0 ? -held : ESRCH;  // EACCES: not ours to look at
      return proof;
    }
    iovec local{proof.nonce, kNonceBytes};
    iovec remote{reinterpret_cast<void*>(uintptr_t(c.address)), kNonceBytes};
    errno = 0;
    if (process_vm_readv(pid_t(c.pid), &local, 1, &remote, 1, 0) != ssize_t(kNonceBytes)) {
      proof.read_errno = errno ? errno : EIO;
      std::memset(proof.nonce, 0, sizeof proof.nonce);
    }
    return proof;
  }

  const std::string& path() const { return path_; }

  cxlpool_status_t import(cxlpool_shared_pool_t* const* pools, size_t npools, const cxlpool_kv_geometry_t* expected,
                          const cxlpool_kv_handle_t* handle, cxlpool_kv_view_t** out) {
    constexpr const char* kWho = "cxlpool_kv_remote_import";
    if (!handle || !out) return record({CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": handle or out is NULL"});
    *out = nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return broken(kWho);
    deadline_ = Clock::now() + timeout_;  // the whole import, however the server paces it
    FetchRequest req{};
    req.magic = kWireMagic;
    req.version = kWireVersion;
    req.request_id = ++next_id_;
    req.handle = *handle;
    if (expected) {
      req.has_expected = 1;
      req.expected = *expected;
    }
    meta_.reset();
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    if (wait(ucp_am_send_nbx(ep_, kAmFetch, nullptr, 0, &req, sizeof req, &p)) != UCS_OK || failed_)
      return broken(kWho);
    if (!progress_until([&] { return meta_ != nullptr; })) return broken(kWho);
    std::vector<unsigned char> bytes = std::move(*meta_);
    meta_.reset();
    MetaReply h{};
    if (bytes.size() < sizeof h) return protocol_error(kWho, "a META answer shorter than its header");
    std::memcpy(&h, bytes.data(), sizeof h);
    if (h.version != kWireVersion) return protocol_error(kWho, "protocol version " + std::to_string(h.version));
    if (h.status != CXLPOOL_OK) {
      if (h.message_bytes > kMaxMessage || bytes.size() - sizeof h != h.message_bytes)
        return protocol_error(kWho, "a refusal whose message does not fit it");
      // The server's words, not its control characters, reach the caller's logs.
      const std::string m =
          printable(std::string(reinterpret_cast<const char*>(bytes.data() + sizeof h), h.message_bytes));
      return record({known_error(h.status), std::string(kWho) + ": refused by " + address_ + ": " + m});
    }
    if (bytes.size() != sizeof h) return protocol_error(kWho, "a META answer of the wrong size");
    // The shape, checked before anything is allocated for it.
    uint64_t per_token = 0, per_block = 0;
    if (cxlpool_kv_geometry_sizes(&h.geometry, &per_token, &per_block) != CXLPOOL_OK || per_block != h.block_bytes)
      return abandon(req.request_id, protocol_error(kWho, "sizes that do not agree with its geometry"));
    const uint64_t T = h.geometry.tokens_per_block;
    if (h.tokens == 0 || h.blocks == 0 || h.blocks > kMaxBlocks || (h.tokens + T - 1) / T != h.blocks ||
        h.tokens > h.blocks * T)
      return abandon(req.request_id, protocol_error(kWho, std::to_string(h.blocks) + " blocks for " +
                                                              std::to_string(h.tokens) + " tokens"));
    if (expected && std::memcmp(expected, &h.geometry, sizeof h.geometry) != 0)
      return abandon(req.request_id, record({CXLPOOL_E_INVALID_ARGUMENT,
                                             std::string(kWho) + ": the exporter's geometry is not the expected one"}));
    cxlpool_kv_view_t* view = nullptr;
    if (cxlpool_status_t s = cxlpool_kv_view_create(pools, npools, &h.geometry, h.tokens, &view); s != CXLPOOL_OK) {
      std::string m = cxlpool_last_error_message();
      return abandon(req.request_id, record({s, std::string(kWho) + ": " + m}));
    }
    // Receive every block into its landing block.
    rx_ = Receive{};
    rx_.request_id = req.request_id;
    rx_.block_bytes = h.block_bytes;
    rx_.view = view;
    rx_.have.assign(size_t(h.blocks), 0);
    RequestMessage pull{kWireMagic, req.request_id};
    bool ok = wait(ucp_am_send_nbx(ep_, kAmPull, nullptr, 0, &pull, sizeof pull, &p)) == UCS_OK && !failed_ &&
              progress_until([&] { return rx_.error || (rx_.received == h.blocks && rx_.pending == 0); });
    if (!ok || rx_.error) {
      if (!failed_) fail_connection(UCS_ERR_IO_ERROR);
      // No receive may still be writing the landing blocks when they are freed.
      const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
      while (rx_.pending && Clock::now() < until) progress();
      if (rx_.pending == 0) cxlpool_kv_view_release(view);  // else: leaked, never freed under a receive
      const std::string why = rx_.why;
      rx_ = Receive{};
      if (!why.empty()) return protocol_error(kWho, why);
      return broken(kWho);
    }
    rx_ = Receive{};
    RequestMessage done{kWireMagic, req.request_id};
    wait(ucp_am_send_nbx(ep_, kAmDone, nullptr, 0, &done, sizeof done, &p));  // a failure shows next time
    *out = view;
    return CXLPOOL_OK;
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
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) progress();
      ucp_request_free(r);
    }
  }

 private:
  // A sequence being received: which blocks have landed, receives still in flight.
  struct Receive {
    uint64_t request_id = 0;
    uint64_t block_bytes = 0;
    cxlpool_kv_view_t* view = nullptr;
    std::vector<char> have;
    uint64_t received = 0, pending = 0;
    bool error = false;
    std::string why;
  };

  // Progresses until done() or the deadline (the connection then fails) or a failure.
  template <class Done>
  bool progress_until(Done&& done) {
    const Clock::time_point deadline = deadline_;
    unsigned spins = 0;
    while (!failed_ && !done()) {
      if (!progress() && (++spins & 255) == 0 && Clock::now() > deadline) {
        fail_connection(UCS_ERR_TIMED_OUT);
        return false;
      }
    }
    return !failed_;
  }

  // The server broke the protocol: the connection is not used again.
  cxlpool_status_t protocol_error(const char* who, const std::string& what) {
    fail_connection(UCS_ERR_IO_ERROR);
    return record({CXLPOOL_E_CORRUPT,
                   std::string(who) + ": the server at " + address_ + " sent " + what + "; the connection is closed"});
  }

  // Tells the server the request is given up (its leases go at once); returns status.
  cxlpool_status_t abandon(uint64_t request_id, cxlpool_status_t status) {
    if (!failed_ && ep_) {
      RequestMessage d{kWireMagic, request_id};
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
      cxlpool_error_info_t e{};
      cxlpool_last_error(&e);
      const std::string keep = e.message;
      wait(ucp_am_send_nbx(ep_, kAmDone, nullptr, 0, &d, sizeof d, &p));
      cxlpool_set_last_error(status, e.os_errno, keep.c_str());
    }
    return status;
  }

  ucs_status_t wait(ucs_status_ptr_t req) {
    return wait_request([&] { return progress(); }, req, deadline_, [&] { fail_connection(UCS_ERR_TIMED_OUT); });
  }

  unsigned progress() { return ucp_worker_progress(ucp_.worker()); }

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

  static ucs_status_t on_meta(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Client*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // the server sends META eagerly
      self->fail_connection(UCS_ERR_IO_ERROR);
      return UCS_OK;  // (a rendezvous descriptor not received is dropped by UCX when this returns)
    }
    MetaReply h{};
    if (length < sizeof h) return UCS_OK;
    std::memcpy(&h, data, sizeof h);
    if (h.magic != kWireMagic || h.request_id != self->next_id_ || self->meta_) return UCS_OK;  // stale or repeated
    return self->keep(data, length, self->meta_);
  }

  // A message the calling thread reads after progress: copied into `slot`.
  ucs_status_t keep(const void* data, size_t length, std::unique_ptr<std::vector<unsigned char>>& slot) {
    try {
      const auto* b = static_cast<const unsigned char*>(data);
      slot = std::make_unique<std::vector<unsigned char>>(b, b + length);
    } catch (...) {
      fail_connection(UCS_ERR_NO_MEMORY);
    }
    return UCS_OK;
  }

  static ucs_status_t on_hello_reply(void* arg, const void*, size_t, void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Client*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // the server sends it eagerly
      self->fail_connection(UCS_ERR_IO_ERROR);
      return UCS_OK;
    }
    HelloReply h{};
    if (!self->want_hello_ || self->hello_ || length < sizeof h) return UCS_OK;  // not asked for, or repeated
    std::memcpy(&h, data, sizeof h);
    if (h.magic != kWireMagic || h.version != kWireVersion || h.message_bytes > kMaxMessage ||
        length - sizeof h != h.message_bytes) {
      self->fail_connection(UCS_ERR_IO_ERROR);
      return UCS_OK;
    }
    return self->keep(data, length, self->hello_);
  }

  static ucs_status_t on_hello_challenge(void* arg, const void*, size_t, void* data, size_t length,
                                         const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Client*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      self->fail_connection(UCS_ERR_IO_ERROR);
      return UCS_OK;
    }
    if (!self->want_hello_ || self->challenge_ || self->hello_) return UCS_OK;  // not asked for, or repeated
    if (length != sizeof(HelloChallenge)) {
      self->fail_connection(UCS_ERR_IO_ERROR);
      return UCS_OK;
    }
    return self->keep(data, length, self->challenge_);
  }

  static ucs_status_t on_block(void* arg, const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Client*>(arg);
    Receive& rx = self->rx_;
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    // A rendezvous block not received is dropped by UCX when the handler returns UCS_OK (its
    // sender's request completes); ucp_am_data_release is only for descriptors kept (UCS_INPROGRESS).
    auto reject = [&](const std::string& why) {
      if (rx.view && !rx.error) {
        rx.error = true;
        rx.why = why;
      }
      return UCS_OK;
    };
    BlockHeader bh{};
    if (header_length != sizeof bh)
      return reject("a block with a header of " + std::to_string(header_length) + " bytes");
    std::memcpy(&bh, header, sizeof bh);
    if (!rx.view || bh.magic != kWireMagic || bh.request_id != rx.request_id)
      return UCS_OK;  // a block of a request given up: dropped
    if (bh.index >= rx.have.size() || rx.have[size_t(bh.index)])
      return reject("block " + std::to_string(bh.index) + " twice or beyond the sequence");
    if (length != rx.block_bytes)
      return reject("block " + std::to_string(bh.index) + " of " + std::to_string(length) + " bytes");
    void* dst = nullptr;
    if (cxlpool_kv_view_block_writable(rx.view, bh.index, &dst) != CXLPOOL_OK) return reject("a block it cannot place");
    rx.have[size_t(bh.index)] = 1;
    if (!rndv) {
      std::memcpy(dst, data, length);
      ++rx.received;
      return UCS_OK;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user) {
      auto* c = static_cast<Client*>(user);
      --c->rx_.pending;
      if (status == UCS_OK) {
        ++c->rx_.received;
      } else if (!c->rx_.error) {
        c->rx_.error = true;
      }
      ucp_request_free(request);
    };
    p.user_data = self;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(self->ucp_.worker(), data, dst, length, &p);
    if (UCS_PTR_IS_ERR(r)) {
      rx.error = true;
    } else {
      ++rx.pending;
    }
    return UCS_OK;
  }

  Ucp ucp_;
  ucp_ep_h ep_ = nullptr;
  std::string address_;
  std::chrono::milliseconds timeout_{10000};
  Clock::time_point deadline_{};  // of the call in progress: connect, or one whole import
  std::mutex mu_;
  bool failed_ = false;
  ucs_status_t failure_ = UCS_OK;
  uint64_t next_id_ = 0;
  std::unique_ptr<std::vector<unsigned char>> meta_;       // the current request's META
  std::unique_ptr<std::vector<unsigned char>> hello_;      // the server's HELLO_REPLY
  std::unique_ptr<std::vector<unsigned char>> challenge_;  // its HELLO_CHALLENGE
  bool want_hello_ = false;
  std::string path_;  // cxlpool_kv_remote_path
  Receive rx_;
};

}  // namespace
}  // namespace cxlpool::ucx

struct cxlpool_kv_remote {
  static constexpr uint64_t kLive = 0x45544f4d45564b31ull;
  uint64_t magic = kLive;
  pid_t owner = getpid();  // a fork child has the handle but must not speak on the parent's connection
  std::unique_ptr<cxlpool::ucx::Client> client;
};

using cxlpool::ucx::Error;
using cxlpool::ucx::record;

namespace {
bool live(const cxlpool_kv_remote_t* r) { return r && r->magic == cxlpool_kv_remote::kLive && r->client; }
cxlpool_status_t foreign(const cxlpool_kv_remote_t* r, const char* fn) {
  return cxlpool::ucx::foreign(r->owner, fn, "the connection");
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_kv_remote_connect(const char* address, uint32_t timeout_ms, uint32_t flags,
                                           cxlpool_kv_remote_t** out) {
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_connect: out is NULL"});
  *out = nullptr;
  auto r = std::unique_ptr<cxlpool_kv_remote>(new (std::nothrow) cxlpool_kv_remote);
  if (!r) return record({CXLPOOL_E_NO_MEMORY, "cxlpool_kv_remote_connect: no memory"});
  Error err{CXLPOOL_OK, ""};
  try {
    r->client = std::make_unique<cxlpool::ucx::Client>();
    if (!r->client->connect(address, timeout_ms, flags, &err)) return record(err);
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
  if (cxlpool_status_t f = foreign(remote, "cxlpool_kv_remote_import")) return f;
  try {
    return remote->client->import(pools, npools, expected, handle, out);
  } catch (const std::exception& e) {
    return record({CXLPOOL_E_NO_MEMORY, std::string("cxlpool_kv_remote_import: ") + e.what()});
  }
}

cxlpool_status_t cxlpool_kv_remote_path(const cxlpool_kv_remote_t* remote, char* buf, size_t len) {
  if (!live(remote))
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_path: not a live KV remote connection"});
  if (cxlpool_status_t f = foreign(remote, "cxlpool_kv_remote_path")) return f;
  const std::string& p = remote->client->path();
  if (!buf || len <= p.size())
    return record({CXLPOOL_E_INVALID_ARGUMENT,
                   "cxlpool_kv_remote_path: buffer NULL or shorter than " + std::to_string(p.size() + 1) + " bytes"});
  std::memcpy(buf, p.c_str(), p.size() + 1);
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_remote_close(cxlpool_kv_remote_t* remote) {
  if (!live(remote))
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_remote_close: not a live KV remote connection"});
  if (cxlpool_status_t f = foreign(remote, "cxlpool_kv_remote_close")) return f;
  remote->magic = 0;
  remote->client.reset();
  cxlpool::ucx::retire(remote);
  return CXLPOOL_OK;
}

}  // extern "C"

// SPDX-License-Identifier: MIT
// The producer's KV server (include/cxlpool/kvcache_remote.h): a UCX listener and one worker
// driven by its own thread. A FETCH is imported from the server's pools exactly as a local
// consumer would (cxlpool_kv_import: every check, a lease on every block) and answered with the
// sequence's shape (META); on the consumer's PULL every block goes to it as an active message
// (UCX rendezvous: zero-copy where the transport can). The leases are held from the FETCH until
// the last block is sent, the consumer gives up, fails, or misses a deadline. A consumer on this
// host that says HELLO (CXLPOOL_KV_REMOTE_SAME_HOST, both ends) gets a second endpoint, made to
// its worker address, when UCX reaches it through shared memory: META and BLOCK go there. That
// endpoint has no peer error handling (UCX 1.13's shared-memory transports have none: with it
// UCX picks tcp); the first connection watches the consumer for both. The worker has no
// RMA feature: a consumer cannot read anything of this process that was not sent to it (UCX's
// software RMA over tcp checks no key or address). UCX calls its callbacks inside
// ucp_worker_progress on this thread only; they queue work that the loop does after progress.
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/kvcache_remote.h"
#include "ucx/ucx_util.hpp"
#include "ucx/wire.hpp"

namespace cxlpool::ucx {
namespace {

// Sequences handed out at once, in all and to one consumer: each holds a lease on every block
// (the producer's own participant's lease table, 4,096 by default, is shared with its local
// imports) until its last block is sent.
constexpr uint64_t kMaxRequests = 64, kMaxRequestsPerPeer = 16;
// A sequence whose blocks stop reaching the consumer for this long (a consumer stopped or
// stuck) loses it: its connection is closed and the leases go.
constexpr auto kSendStall = std::chrono::seconds(10);

class Server {
 public:
  ~Server() { stop(); }

  bool start(cxlpool_shared_pool_t* const* pools, size_t npools, const char* address, uint32_t flags, Error* err) {
    constexpr const char* kWho = "cxlpool_kv_server_start";
    if (flags & ~CXLPOOL_KV_REMOTE_SAME_HOST)
      return *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": unknown flags 0x" + hex(flags)}, false;
    same_host_ = flags & CXLPOOL_KV_REMOTE_SAME_HOST;
    if (same_host_ && !host_identity(&where_))
      return *err = {CXLPOOL_E_OS, std::string(kWho) + ": /proc does not tell this process's boot id and namespaces"},
             false;
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (!parse_address(kWho, address, true, &sa, &len, err)) return false;
    if (!pools || npools == 0 || npools > 16)
      return *err = {CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": 1 to 16 pools"}, false;
    if (!ucp_.init("cxlpool-kv-server", UCP_FEATURE_AM | UCP_FEATURE_WAKEUP, UCS_THREAD_MODE_SERIALIZED, err))
      return false;
    pools_.assign(pools, pools + npools);
    for (size_t i = 0; i < npools; ++i) {
      cxlpool_shared_info_t info{};
      if (cxlpool_status_t st = cxlpool_shared_pool_info(pools[i], &info); st != CXLPOOL_OK)
        return *err = {st, std::string(kWho) + ": pool " + std::to_string(i) + ": " + cxlpool_last_error_message()},
               false;
    }
    if (!ucp_.set_handlers({{kAmFetch, on_fetch},
                            {kAmPull, on_pull},
                            {kAmDone, on_done},
                            {kAmHello, on_hello},
                            {kAmHelloProof, on_proof}},
                           this, kWho, err))
      return false;
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
    ucp_.destroy();  // now, while the records a late send completion may look at still exist
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
    s.expired = expired_.load();
    s.same_host = same_host_paths_.load();
    return s;
  }

 private:
  // One sequence being handed to a consumer: its leases (the view) and its sends in flight.
  struct Request {
    cxlpool_kv_view_t* view = nullptr;
    bool pulled = false;
    uint64_t sends = 0;  // in flight
    Clock::time_point deadline;
  };
  struct Peer {
    uint64_t serial = 0;                        // unique per connection (a closed endpoint's handle is reused)
    std::map<uint64_t, Request> requests;       // by request id
    bool hello = false;                         // said HELLO (once only)
    bool challenged = false;                    // HELLO_CHALLENGE sent, HELLO_PROOF awaited
    std::unique_ptr<unsigned char[]> nonce;     // what the consumer must read in this process
    std::vector<unsigned char> worker_address;  // HELLO's, used only after the proof
    ucp_ep_h data_ep = nullptr;                 // the same-host endpoint: META and BLOCK go there when set
  };
  enum class Kind { kFetch, kPull, kDone, kHello, kProof, kFailed, kHostile };
  struct Work {
    Kind kind;
    ucp_ep_h ep;
    std::vector<unsigned char> payload;
  };
  // What a BLOCK send's completion needs to find its request, and the send's active-message
  // header (UCX 1.13 reads it until the send completes: a pending send on shared memory read a
  // stack copy long gone, and the consumer dropped the blocks).
  struct SendContext {
    Server* server;
    ucp_ep_h ep;
    uint64_t serial;  // the peer's: a completion for a peer record since dropped changes nothing
    uint64_t request_id;
    BlockHeader header;
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
    // A record left under this handle by a closed endpoint (UCX reused its memory) is not this
    // consumer's: what it held goes now.
    if (auto old = self->peers_.find(h); old != self->peers_.end()) {
      for (auto& [id, r] : old->second.requests) self->release(r);
      self->peers_.erase(old);
      self->failed_.erase(h);
    }
    self->peers_[h].serial = ++self->serial_;
    self->connections_.fetch_add(1);
  }

  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<Server*>(arg)->queue(Kind::kFailed, ep, nullptr, 0);
  }

  static ucs_status_t on_message(Kind kind, void* arg, void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Server*>(arg);
    // (A rendezvous descriptor not received is dropped by UCX when the handler returns UCS_OK.)
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;  // no one to answer
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // requests are small and sent eagerly: not a consumer of ours
      self->queue(Kind::kHostile, param->reply_ep, nullptr, 0);
      return UCS_OK;
    }
    self->queue(kind, param->reply_ep, static_cast<const unsigned char*>(data), length);
    return UCS_OK;
  }
  static ucs_status_t on_fetch(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    return on_message(Kind::kFetch, arg, data, length, param);
  }
  static ucs_status_t on_pull(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return on_message(Kind::kPull, arg, data, length, param);
  }
  static ucs_status_t on_done(void* arg, const void*, size_t, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return on_message(Kind::kDone, arg, data, length, param);
  }
  static ucs_status_t on_hello(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    return on_message(Kind::kHello, arg, data, length, param);
  }
  static ucs_status_t on_proof(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    return on_message(Kind::kProof, arg, data, length, param);
  }

  static std::string hex(uint32_t v) {
    char b[16];
    std::snprintf(b, sizeof b, "%x", v);
    return b;
  }

  void queue(Kind kind, ucp_ep_h ep, const unsigned char* data, size_t length) noexcept {
    try {
      work_.push_back({kind, ep, std::vector<unsigned char>(data, data + length)});
    } catch (...) {
      // No memory for the request: the consumer times out and its connection is closed.
    }
  }

  // A pass of the loop with nothing to do: yield; nap 200 us once nothing has moved for 2 ms,
  // 2 ms once nothing has for 100 ms (a consumer stopped mid-transfer; UCX reporting work for
  // ever after a same-host consumer died: hostile review, 3,200 wake-ups a second before).
  void idle() {
    const auto quiet = Clock::now() - last_activity_;
    if (quiet < std::chrono::milliseconds(2)) {
      sched_yield();
      return;
    }
    timespec nap{0, quiet < std::chrono::milliseconds(100) ? 200 * 1000 : 2000 * 1000};
    nanosleep(&nap, nullptr);
  }

  void loop() {
    // Named as libcxlpool names its threads: its watcher then counts this one as cxlpool's, not
    // the program's, and ends a program whose own threads have all ended (os/own_threads.hpp).
    pthread_setname_np(pthread_self(), "cxlpool/ucx");
    while (!stop_.load()) {
      while (ucp_worker_progress(ucp_.worker()) != 0) last_activity_ = Clock::now();
      if (!work_.empty()) {
        last_activity_ = Clock::now();
        std::deque<Work> batch;
        batch.swap(work_);
        for (Work& w : batch) handle(w);
        continue;
      }
      sweep();
      // While blocks are on their way, keep progressing: a rendezvous completes only when this
      // side answers (not every transport wakes the worker's descriptor for it). When nothing
      // has moved for 2 ms (a consumer stopped; UCX busy with a closed endpoint's leftovers,
      // its arm saying BUSY for ever: hostile review), it naps instead of spinning.
      if (sending_ > 0) {
        idle();
        continue;
      }
      ucs_status_t s = ucp_worker_arm(ucp_.worker());
      if (s == UCS_ERR_BUSY) {
        idle();
        continue;
      }
      pollfd pfd{efd_, POLLIN, 0};
      poll(&pfd, 1, 100);
    }
    // Every consumer goes: endpoints closed (their sends complete with an error), then the
    // leases dropped once no send can still read a block.
    for (auto& [ep, peer] : peers_) {
      close_endpoint(ep);
      if (peer.data_ep) close_endpoint(peer.data_ep);  // (kept as the mark of a same-host peer)
    }
    const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
    while (sends_in_flight() && Clock::now() < until) ucp_worker_progress(ucp_.worker());
    for (auto& [ep, peer] : peers_)
      for (auto& [id, r] : peer.requests)
        // A send that never completed keeps its leases (never freed under it), except on the
        // same-host path, where no late send writes the pool (fail_peer).
        if (r.sends == 0 || peer.data_ep) release(r);
    peers_.clear();
  }

  uint64_t sends_in_flight() const {
    uint64_t n = 0;
    for (const auto& [ep, peer] : peers_)
      for (const auto& [id, r] : peer.requests) n += r.sends;
    return n;
  }

  void release(Request& r) {
    if (!r.view) return;
    cxlpool_kv_view_release(r.view);
    r.view = nullptr;
    views_held_.fetch_sub(1);
  }

  // Requests that missed their deadline: not pulled in time (leases dropped), or sends stuck
  // (the consumer's endpoint is closed: the sends complete with an error, then the leases go).
  void sweep() {
    const Clock::time_point now = Clock::now();
    if (now < next_sweep_) return;
    next_sweep_ = now + std::chrono::milliseconds(100);
    std::vector<ucp_ep_h> stuck;
    for (auto& [ep, peer] : peers_)
      for (auto it = peer.requests.begin(); it != peer.requests.end();) {
        Request& r = it->second;
        if (now > r.deadline && r.sends == 0) {
          release(r);
          it = peer.requests.erase(it);
          expired_.fetch_add(1);
          continue;
        }
        if (now > r.deadline && r.sends) stuck.push_back(ep);
        ++it;
      }
    for (ucp_ep_h ep : stuck) fail_peer(ep);
  }

  void close_endpoint(ucp_ep_h ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);  // released when the close completes
  }

  // The consumer failed, misbehaved or is stuck: its endpoint goes; each request's leases go as
  // soon as none of its sends can still read a block.
  void fail_peer(ucp_ep_h ep) {
    auto it = peers_.find(ep);
    if (it == peers_.end() || failed_.count(ep)) return;
    failed_.insert(ep);
    close_endpoint(ep);
    disconnects_.fetch_add(1);
    if (it->second.data_ep) {
      // The same-host endpoint has no peer error handling: UCX completes none of its sends that
      // wait for a dead consumer (a rendezvous waits for the consumer's acknowledgement). They
      // are forgotten now and the leases go: on shared memory a late send only reads the pool
      // (CMA: the consumer reads this process; a lone copy goes to a closed endpoint), never
      // writes it. A completion that comes later finds no record of its serial and does nothing.
      close_endpoint(it->second.data_ep);
      for (auto& [id, r] : it->second.requests) {
        sending_ -= r.sends;
        r.sends = 0;
        release(r);
      }
      peers_.erase(it);
      failed_.erase(ep);
      return;
    }
    reap(ep);
  }

  // Drops a failed peer's finished requests, and the peer once it has none.
  void reap(ucp_ep_h ep) {
    auto it = peers_.find(ep);
    if (it == peers_.end() || !failed_.count(ep)) return;
    for (auto r = it->second.requests.begin(); r != it->second.requests.end();) {
      if (r->second.sends == 0) {
        release(r->second);
        r = it->second.requests.erase(r);
      } else {
        ++r;
      }
    }
    if (it->second.requests.empty()) {
      peers_.erase(it);
      failed_.erase(ep);
    }
  }

  // False when the send's peer record is gone (it was forgotten with its sends).
  bool sent(ucp_ep_h ep, uint64_t serial, uint64_t request_id, ucs_status_t status) {
    auto it = peers_.find(ep);
    if (it == peers_.end() || it->second.serial != serial) return false;
    --sending_;
    auto r = it->second.requests.find(request_id);
    if (r == it->second.requests.end() || r->second.sends == 0) return true;
    --r->second.sends;
    if (status == UCS_OK) r->second.deadline = Clock::now() + kSendStall;
    if (status != UCS_OK && !failed_.count(ep)) {
      fail_peer(ep);
      return true;
    }
    if (r->second.sends == 0 && r->second.pulled) {  // every block is with the consumer
      release(r->second);
      it->second.requests.erase(r);
    }
    reap(ep);
    return true;
  }

  void handle(Work& w) {
    if (w.kind == Kind::kFailed || w.kind == Kind::kHostile) {
      fail_peer(w.ep);
      return;
    }
    if (failed_.count(w.ep)) return;
    auto found = peers_.find(w.ep);
    if (found == peers_.end()) return;  // an endpoint already let go: never a new record for it
    Peer& peer = found->second;
    if (w.kind == Kind::kHello) return hello(w.ep, peer, w.payload);
    if (w.kind == Kind::kProof) return proof(w.ep, peer, w.payload);
    const ucp_ep_h out = peer.data_ep ? peer.data_ep : w.ep;  // where META and BLOCK go
    if (w.kind == Kind::kPull || w.kind == Kind::kDone) {
      RequestMessage m{};
      if (w.payload.size() != sizeof m) return fail_peer(w.ep);
      std::memcpy(&m, w.payload.data(), sizeof m);
      auto it = peer.requests.find(m.request_id);
      if (m.magic != kWireMagic || it == peer.requests.end()) return;  // late, or not ours: nothing to do
      Request& r = it->second;
      if (w.kind == Kind::kDone) {  // the consumer has what it needs, or gives up
        if (r.sends == 0) {
          release(r);
          peer.requests.erase(it);
        }
        return;
      }
      if (r.pulled) return;
      r.pulled = true;
      r.deadline = Clock::now() + kSendStall;                // renewed by every block sent
      if (!push_blocks(w.ep, out, m.request_id, r)) return;  // the peer was failed: its records may be gone
      if (r.sends == 0) {
        release(r);
        peer.requests.erase(it);
      }
      return;
    }
    FetchRequest req{};
    if (w.payload.size() != sizeof req) return fail_peer(w.ep);  // no request id to answer
    std::memcpy(&req, w.payload.data(), sizeof req);
    if (req.magic != kWireMagic) return fail_peer(w.ep);
    if (req.version != kWireVersion) {
      refuse(out, req.request_id, CXLPOOL_E_NOT_SUPPORTED,
             "protocol version " + std::to_string(req.version) + " (this server speaks " +
                 std::to_string(kWireVersion) + ")");
      return;
    }
    if (peer.requests.count(req.request_id)) {
      refuse(out, req.request_id, CXLPOOL_E_INVALID_ARGUMENT,
             "request id " + std::to_string(req.request_id) + " is already in use on this connection");
      return;
    }
    if (peer.requests.size() >= kMaxRequestsPerPeer || views_held_.load() >= kMaxRequests) {
      refuse(out, req.request_id, CXLPOOL_E_BUSY,
             "the server is handing out " + std::to_string(views_held_.load()) + " sequences (at most " +
                 std::to_string(kMaxRequests) + ", " + std::to_string(kMaxRequestsPerPeer) +
                 " per consumer); try again");
      return;
    }
    cxlpool_kv_view_t* view = nullptr;
    cxlpool_status_t s =
        cxlpool_kv_import(pools_.data(), pools_.size(), req.has_expected ? &req.expected : nullptr, &req.handle, &view);
    if (s != CXLPOOL_OK) {
      refuse(out, req.request_id, s, cxlpool_last_error_message());
      return;
    }
    cxlpool_kv_view_info_t info{};
    cxlpool_kv_view_info(view, &info);
    Request& r = peer.requests[req.request_id];
    r.view = view;
    r.deadline = Clock::now() + std::chrono::seconds(10);  // for the consumer's PULL
    views_held_.fetch_add(1);
    fetches_.fetch_add(1);
    bytes_offered_.fetch_add(info.blocks * info.bytes_per_block);
    MetaReply h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = CXLPOOL_OK;
    h.request_id = req.request_id;
    h.geometry = info.geometry;
    h.tokens = info.tokens;
    h.blocks = info.blocks;
    h.block_bytes = info.bytes_per_block;
    std::vector<unsigned char> reply(sizeof h);
    std::memcpy(reply.data(), &h, sizeof h);
    send(out, kAmMeta, std::move(reply));
  }

  // HELLO from a consumer that wants the same-host path: a second endpoint to its worker
  // address if this server offers it and UCX reaches the consumer through shared memory; the
  // answer says which (over the new endpoint when it is taken: it proves the way works).
  void hello(ucp_ep_h ep, Peer& peer, const std::vector<unsigned char>& payload) {
    HelloRequest h{};
    if (peer.hello || payload.size() < sizeof h) return fail_peer(ep);
    std::memcpy(&h, payload.data(), sizeof h);
    if (h.magic != kWireMagic || h.version != kWireVersion || h.address_bytes == 0 ||
        h.address_bytes > kMaxWorkerAddress || payload.size() - sizeof h != h.address_bytes)
      return fail_peer(ep);
    peer.hello = true;
    if (!same_host_)
      return hello_reply(ep, CXLPOOL_E_NOT_SUPPORTED,
                         "the server does not offer a same-host path (started without CXLPOOL_KV_REMOTE_SAME_HOST)");
    h.where.boot_id[sizeof h.where.boot_id - 1] = 0;
    if (const std::string why = identity_mismatch(where_, h.where); !why.empty())
      return hello_reply(ep, CXLPOOL_E_NOT_SUPPORTED, "no shared memory reaches the consumer: " + why);
    // UCX's shared-memory transports trust the peer completely: this process would map and
    // write what the consumer's worker address names, with this process's rights (a segment, a
    // file), and a malformed address aborts UCX (hostile reviews: a uid taken from the socket
    // table was fooled by a root-run port forwarder and by user namespaces). So the consumer
    // first proves it may read this process's memory, the ptrace permission the kernel checks
    // (in its own user namespace terms): a process that could already do all of that to us.
    auto nonce = std::make_unique<unsigned char[]>(kNonceBytes);
    if (getrandom(nonce.get(), kNonceBytes, 0) != ssize_t(kNonceBytes))
      return hello_reply(ep, CXLPOOL_E_OS, "no random bytes for the same-host challenge (getrandom)");
    HelloChallenge c{kWireMagic, kWireVersion, int32_t(getpid()), uint64_t(reinterpret_cast<uintptr_t>(nonce.get()))};
    peer.nonce = std::move(nonce);
    peer.worker_address.assign(payload.begin() + sizeof h, payload.end());
    peer.challenged = true;
    std::vector<unsigned char> bytes(sizeof c);
    std::memcpy(bytes.data(), &c, sizeof c);
    send(ep, kAmHelloChallenge, std::move(bytes));
  }

  // HELLO_PROOF: the nonce read in this process's memory. Then, and only then, the second
  // endpoint to the consumer's worker address.
  void proof(ucp_ep_h ep, Peer& peer, const std::vector<unsigned char>& payload) {
    HelloProof pr{};
    if (!peer.challenged || payload.size() != sizeof pr) return fail_peer(ep);
    std::memcpy(&pr, payload.data(), sizeof pr);
    peer.challenged = false;
    const bool proven =
        pr.magic == kWireMagic && pr.read_errno == 0 && std::memcmp(pr.nonce, peer.nonce.get(), kNonceBytes) == 0;
    peer.nonce.reset();
    std::vector<unsigned char> address = std::move(peer.worker_address);
    peer.worker_address.clear();
    if (!proven)
      return hello_reply(
          ep, CXLPOOL_E_PERMISSION,
          pr.read_errno == ESRCH
              ? std::string("the consumer's connection does not end in this process (a forwarder between them?): the "
                            "same-host path is only for direct connections")
              : "the consumer could not read this process's memory (" +
                    (pr.read_errno ? std::string(std::strerror(pr.read_errno)) : std::string("it sent other bytes")) +
                    "): the same-host path is only for processes that may ptrace the server (its user or root, as "
                    "yama's ptrace_scope allows)");
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // the first connection watches the consumer
    ucp_ep_h data = nullptr;
    if (ucs_status_t s = ucp_ep_create(ucp_.worker(), &p, &data); s != UCS_OK)
      return hello_reply(ep, CXLPOOL_E_NOT_SUPPORTED,
                         std::string("UCX cannot reach the consumer's worker: ") + ucs_status_string(s));
    bool same_host = false;
    const std::string lanes = describe_lanes(data, &same_host);
    if (!same_host) {
      close_endpoint(data);
      return hello_reply(ep, CXLPOOL_E_NOT_SUPPORTED,
                         "UCX has no shared-memory way to the consumer (it would use " +
                             (lanes.empty() ? std::string("no lane it describes") : lanes) + ")");
    }
    peer.data_ep = data;
    same_host_paths_.fetch_add(1);
    hello_reply(data, CXLPOOL_OK, lanes);
  }

  void hello_reply(ucp_ep_h ep, cxlpool_status_t status, const std::string& message) {
    HelloReply h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = status;
    send(ep, kAmHelloReply, with_message(h, message));
  }

  // A reply header and its message (at most kMaxMessage bytes), as one buffer.
  template <class Header>
  static std::vector<unsigned char> with_message(Header h, const std::string& message) {
    const std::string m = message.substr(0, kMaxMessage);
    h.message_bytes = uint32_t(m.size());
    std::vector<unsigned char> bytes(sizeof h + m.size());
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, m.data(), m.size());
    return bytes;
  }

  // Every block of the request to the consumer, each its own active message (the view's leases
  // keep the bytes in place until the last send completes).
  // ep: the consumer's connection (its record's key); out: where the blocks go. False when the
  // consumer was failed on the way (r and its peer may be gone then).
  bool push_blocks(ucp_ep_h ep, ucp_ep_h out, uint64_t request_id, Request& r) {
    cxlpool_kv_view_info_t info{};
    cxlpool_kv_view_info(r.view, &info);
    for (uint64_t i = 0; i < info.blocks; ++i) {
      const void* data = nullptr;
      if (cxlpool_kv_view_block(r.view, i, &data) != CXLPOOL_OK) return fail_peer(ep), false;  // the pool failed
      auto* ctx = new (std::nothrow) SendContext{this, ep, peers_[ep].serial, request_id, {kWireMagic, request_id, i}};
      if (!ctx) return fail_peer(ep), false;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      p.cb.send = [](void* request, ucs_status_t status, void* user) {
        auto* c = static_cast<SendContext*>(user);
        c->server->sent(c->ep, c->serial, c->request_id, status);
        delete c;
        ucp_request_free(request);
      };
      p.user_data = ctx;
      ucs_status_ptr_t q =
          ucp_am_send_nbx(out, kAmBlock, &ctx->header, sizeof ctx->header, data, size_t(info.bytes_per_block), &p);
      if (UCS_PTR_IS_PTR(q)) {
        ++r.sends;
        ++sending_;
        continue;
      }
      delete ctx;
      if (UCS_PTR_IS_ERR(q)) return fail_peer(ep), false;
    }
    return true;
  }

  void refuse(ucp_ep_h ep, uint64_t request_id, cxlpool_status_t status, const std::string& message) {
    refused_.fetch_add(1);
    MetaReply h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.status = status;
    h.request_id = request_id;
    send(ep, kAmMeta, with_message(h, message));
  }

  // Sends a small message; the buffer lives until UCX is done with it.
  void send(ucp_ep_h ep, unsigned id, std::vector<unsigned char> bytes) {
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
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, nullptr, 0, buffer->data(), buffer->size(), &p);
    if (!UCS_PTR_IS_PTR(r)) delete buffer;  // done at once, or failed (the endpoint's error comes)
  }

  Ucp ucp_;
  ucp_listener_h listener_ = nullptr;
  int efd_ = -1;
  std::string address_;
  std::vector<cxlpool_shared_pool_t*> pools_;
  std::map<ucp_ep_h, Peer> peers_;  // loop thread only
  std::set<ucp_ep_h> failed_;       // closed, waiting for their sends to complete
  Clock::time_point next_sweep_{};
  uint64_t sending_ = 0;               // BLOCK sends in flight, all consumers
  uint64_t serial_ = 0;                // of the last connection
  Clock::time_point last_activity_{};  // the loop's last progress or work
  std::deque<Work> work_;              // loop thread only (callbacks run inside its progress)
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool same_host_ = false;  // CXLPOOL_KV_REMOTE_SAME_HOST
  HostIdentity where_{};    // this process's, for the consumers that say HELLO
  std::atomic<uint64_t> connections_{0}, disconnects_{0}, fetches_{0}, refused_{0}, bytes_offered_{0}, views_held_{0},
      expired_{0}, same_host_paths_{0};
};

}  // namespace
}  // namespace cxlpool::ucx

struct cxlpool_kv_server {
  static constexpr uint64_t kLive = 0x5652455356564b31ull;
  uint64_t magic = kLive;
  pid_t owner = getpid();  // a fork child has the handle but not the thread or the connections
  std::unique_ptr<cxlpool::ucx::Server> server;
};

using cxlpool::ucx::Error;
using cxlpool::ucx::record;

namespace {
bool live(const cxlpool_kv_server_t* s) { return s && s->magic == cxlpool_kv_server::kLive && s->server; }
cxlpool_status_t not_live(const char* fn) {
  return record({CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": not a live KV server"});
}
cxlpool_status_t foreign(const cxlpool_kv_server_t* s, const char* fn) {
  return cxlpool::ucx::foreign(s->owner, fn, "the server");
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_kv_server_start(cxlpool_shared_pool_t* const* pools, size_t npools, const char* address,
                                         uint32_t flags, cxlpool_kv_server_t** out) {
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_start: out is NULL"});
  *out = nullptr;
  auto s = std::unique_ptr<cxlpool_kv_server>(new (std::nothrow) cxlpool_kv_server);
  if (!s) return record({CXLPOOL_E_NO_MEMORY, "cxlpool_kv_server_start: no memory"});
  Error err{CXLPOOL_OK, ""};
  try {
    s->server = std::make_unique<cxlpool::ucx::Server>();
    if (!s->server->start(pools, npools, address, flags, &err)) return record(err);
  } catch (const std::exception& e) {
    return record({CXLPOOL_E_NO_MEMORY, std::string("cxlpool_kv_server_start: ") + e.what()});
  }
  *out = s.release();
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_address(const cxlpool_kv_server_t* server, char* buf, size_t len) {
  if (!live(server)) return not_live("cxlpool_kv_server_address");
  if (cxlpool_status_t f = foreign(server, "cxlpool_kv_server_address")) return f;
  const std::string& a = server->server->address();
  if (!buf || len <= a.size())
    return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_address: buffer NULL or shorter than " +
                                                   std::to_string(a.size() + 1) + " bytes"});
  std::memcpy(buf, a.c_str(), a.size() + 1);
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_stats(const cxlpool_kv_server_t* server, cxlpool_kv_server_stats_t* out) {
  if (!live(server)) return not_live("cxlpool_kv_server_stats");
  if (cxlpool_status_t f = foreign(server, "cxlpool_kv_server_stats")) return f;
  if (!out) return record({CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_server_stats: out is NULL"});
  *out = server->server->stats();
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_kv_server_stop(cxlpool_kv_server_t* server) {
  if (!live(server)) return not_live("cxlpool_kv_server_stop");
  if (cxlpool_status_t f = foreign(server, "cxlpool_kv_server_stop")) return f;
  server->magic = 0;
  server->server.reset();  // stops it
  cxlpool::ucx::retire(server);
  return CXLPOOL_OK;
}

}  // extern "C"

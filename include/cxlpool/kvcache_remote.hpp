// SPDX-License-Identifier: MIT
// cxlpool C++ layer for libcxlpool_ucx (cxlpool/kvcache_remote.h): RAII over the KV server and
// a consumer's connection, on the C ABI; errors throw cxlpool::Error like cxlpool.hpp. Link
// with cxlpool::cxlpool_ucx.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cxlpool/cxlpool.hpp"
#include "cxlpool/kvcache_remote.h"

namespace cxlpool {

// A producer's KV server (stopped with the object). The pools must outlive it.
class KvServer {
 public:
  KvServer(const std::vector<cxlpool_shared_pool_t*>& pools, const std::string& address, uint32_t flags = 0) {
    detail::check(cxlpool_kv_server_start(pools.data(), pools.size(), address.c_str(), flags, &s_));
  }
  KvServer(KvServer&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  KvServer(const KvServer&) = delete;
  KvServer& operator=(const KvServer&) = delete;
  ~KvServer() {
    if (s_) cxlpool_kv_server_stop(s_);
  }
  void stop() {
    if (s_) detail::check(cxlpool_kv_server_stop(std::exchange(s_, nullptr)));
  }
  std::string address() const {
    char buf[128];
    detail::check(cxlpool_kv_server_address(s_, buf, sizeof buf));
    return buf;
  }
  cxlpool_kv_server_stats_t stats() const {
    cxlpool_kv_server_stats_t st{};
    detail::check(cxlpool_kv_server_stats(s_, &st));
    return st;
  }
  cxlpool_kv_server_t* get() const noexcept { return s_; }

 private:
  cxlpool_kv_server_t* s_ = nullptr;
};

// A consumer's connection to one server (closed with the object).
class KvRemote {
 public:
  explicit KvRemote(const std::string& address, uint32_t timeout_ms = 0, uint32_t flags = 0) {
    detail::check(cxlpool_kv_remote_connect(address.c_str(), timeout_ms, flags, &r_));
  }
  KvRemote(KvRemote&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  KvRemote(const KvRemote&) = delete;
  KvRemote& operator=(const KvRemote&) = delete;
  ~KvRemote() {
    if (r_) cxlpool_kv_remote_close(r_);
  }
  // The sequence `handle` names, in blocks of this process's pools.
  KvView import(const std::vector<cxlpool_shared_pool_t*>& pools, const cxlpool_kv_handle_t& handle,
                const KvGeometry* expected = nullptr) {
    cxlpool_kv_view_t* v = nullptr;
    detail::check(
        cxlpool_kv_remote_import(r_, pools.data(), pools.size(), expected ? &expected->c : nullptr, &handle, &v));
    return KvView(v);
  }
  // "same host: ..." or "network: ...": which way the blocks go, and why.
  std::string path() const {
    char buf[1024];
    detail::check(cxlpool_kv_remote_path(r_, buf, sizeof buf));
    return buf;
  }
  cxlpool_kv_remote_t* get() const noexcept { return r_; }

 private:
  cxlpool_kv_remote_t* r_ = nullptr;
};

}  // namespace cxlpool

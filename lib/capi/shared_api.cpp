// SPDX-License-Identifier: MIT
// C ABI for shared pools (include/cxlpool/shared.h): parameter objects, create/open/close,
// blocks, handles and leases, publish/acquire.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/shared_handle.hpp"
#include "cxlpool/shared.h"
#include "shared/shared_pool.hpp"
#include "stats/control.hpp"

using namespace cxlpool::detail;
namespace S = cxlpool::detail::shared;

struct cxlpool_shared_params {
  S::SharedParams p;
};

// A pool handle is a small shell around the pool. Closing destroys the pool but keeps the
// shell, marked closed, in a quarantine of the last kQuarantine closed shells: a second close
// or a call on a closed handle is refused with a status instead of reaching freed memory or
// (the address being reused) another pool.
struct cxlpool_shared_pool {
  static constexpr uint64_t kOpen = 0x43584c504f4f4c31ull, kClosed = 0x636c6f7365643030ull;
  uint64_t magic = kOpen;
  S::SharedPool* pool = nullptr;
};

struct cxlpool_shared_set {
  std::vector<cxlpool_shared_pool_t*> pools;
};

namespace {
constexpr size_t kQuarantine = 1024;
std::mutex g_shell_mu;
// Never destroyed: shells stay reachable (and refusable) until the process ends.
std::deque<cxlpool_shared_pool_t*>& g_closed_shells = *new std::deque<cxlpool_shared_pool_t*>;

// A call racing cxlpool_shared_pool_close on the same handle is the caller's bug (as a call
// racing free); the pointer is read once, so a call that starts after the close fails cleanly.
inline S::SharedPool* impl(cxlpool_shared_pool_t* p) {
  S::SharedPool* pool = p->pool;
  if (p->magic != cxlpool_shared_pool::kOpen || pool == nullptr)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         p->magic == cxlpool_shared_pool::kClosed ? "the pool handle was closed" : "not a shared pool handle");
  return pool;
}
inline cxlpool_shared_pool_t* handle(S::SharedPool* p) {
  std::unique_ptr<S::SharedPool> owned(p);
  auto* shell = new cxlpool_shared_pool_t{};
  shell->pool = owned.release();
  return shell;
}
void retire_shell(cxlpool_shared_pool_t* shell) {
  shell->magic = cxlpool_shared_pool::kClosed;
  shell->pool = nullptr;
  std::lock_guard<std::mutex> lock(g_shell_mu);
  g_closed_shells.push_back(shell);
  if (g_closed_shells.size() > kQuarantine) {
    delete g_closed_shells.front();
    g_closed_shells.pop_front();
  }
}
bool pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
}  // namespace

namespace cxlpool::detail {
shared::SharedPool* shared_pool_of(cxlpool_shared_pool_t* pool, const char* who) {
  require(pool != nullptr, who, "a pool is NULL");
  return impl(pool);
}
shared::SharedPool* shared_pool_if_open(cxlpool_shared_pool_t* pool) noexcept {
  return pool && pool->magic == cxlpool_shared_pool::kOpen ? pool->pool : nullptr;
}
}  // namespace cxlpool::detail

extern "C" {

cxlpool_status_t cxlpool_shared_params_create(cxlpool_shared_params_t** out) {
  return guarded([&] {
    require(out != nullptr, "cxlpool_shared_params_create", "out is NULL");
    *out = new cxlpool_shared_params{};
  });
}

void cxlpool_shared_params_destroy(cxlpool_shared_params_t* params) { delete params; }

cxlpool_status_t cxlpool_shared_params_set_size(cxlpool_shared_params_t* params, uint64_t bytes) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_size", "params is NULL");
    require(bytes >= (4u << 20), "cxlpool_shared_params_set_size",
            "size " + std::to_string(bytes) + " is below the minimum of 4 MiB");
    // A file's size is an off_t: nothing larger can hold a pool.
    require(bytes <= uint64_t(INT64_MAX), "cxlpool_shared_params_set_size",
            "size " + std::to_string(bytes) + " is larger than any file or device can be (at most 2^63 - 1 bytes)");
    params->p.size = bytes;
  });
}

cxlpool_status_t cxlpool_shared_params_set_extent_size(cxlpool_shared_params_t* params, uint64_t bytes) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_extent_size", "params is NULL");
    require(pow2(bytes) && bytes >= (256u << 10) && bytes <= (1u << 30), "cxlpool_shared_params_set_extent_size",
            "extent size " + std::to_string(bytes) + " is not a power of two from 256 KiB to 1 GiB");
    params->p.extent_size = bytes;
  });
}

cxlpool_status_t cxlpool_shared_params_set_coherence(cxlpool_shared_params_t* params, cxlpool_coherence_t coherence) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_coherence", "params is NULL");
    require(coherence == CXLPOOL_COHERENCE_HOST || coherence == CXLPOOL_COHERENCE_FABRIC ||
                coherence == CXLPOOL_COHERENCE_NONE,
            "cxlpool_shared_params_set_coherence", "unknown coherence " + std::to_string(int(coherence)));
    params->p.coherence = coherence;
    params->p.coherence_set = true;
  });
}

cxlpool_status_t cxlpool_shared_params_set_mode(cxlpool_shared_params_t* params, unsigned mode) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_mode", "params is NULL");
    require((mode & ~0777u) == 0 && (mode & 0600u) == 0600u, "cxlpool_shared_params_set_mode",
            "mode " + std::to_string(mode) + " must be permission bits (at most 0777) with owner read-write");
    params->p.mode = mode;
  });
}

cxlpool_status_t cxlpool_shared_params_set_participants(cxlpool_shared_params_t* params, uint32_t hosts,
                                                        uint32_t participants_per_host) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_participants", "params is NULL");
    require(hosts >= 1 && participants_per_host >= 1 && uint64_t{hosts} * participants_per_host <= S::kMaxSlots,
            "cxlpool_shared_params_set_participants",
            std::to_string(hosts) + " hosts x " + std::to_string(participants_per_host) +
                " participants: need at least 1 x 1 and at most 255 slots in all");
    params->p.hosts = hosts;
    params->p.per_host = participants_per_host;
  });
}

cxlpool_status_t cxlpool_shared_params_set_leases(cxlpool_shared_params_t* params, uint32_t per_participant) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_leases", "params is NULL");
    require(pow2(per_participant) && per_participant >= 8 && per_participant <= (1u << 20),
            "cxlpool_shared_params_set_leases",
            std::to_string(per_participant) + " leases: need a power of two from 8 to 1048576");
    params->p.leases = per_participant;
  });
}

cxlpool_status_t cxlpool_shared_params_set_lease_timing(cxlpool_shared_params_t* params, uint32_t heartbeat_ms,
                                                        uint32_t lease_timeout_ms) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_lease_timing", "params is NULL");
    require(heartbeat_ms >= 1 && heartbeat_ms <= 60000 && lease_timeout_ms >= 3 * heartbeat_ms &&
                lease_timeout_ms <= 3600000,
            "cxlpool_shared_params_set_lease_timing",
            "heartbeat " + std::to_string(heartbeat_ms) + " ms, timeout " + std::to_string(lease_timeout_ms) +
                " ms: need 1..60000 ms and a timeout of at least 3 heartbeats (at most an hour)");
    params->p.heartbeat_ms = heartbeat_ms;
    params->p.lease_timeout_ms = lease_timeout_ms;
  });
}

cxlpool_status_t cxlpool_shared_params_set_stopped_timeout(cxlpool_shared_params_t* params, uint32_t timeout_ms) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_stopped_timeout", "params is NULL");
    require(timeout_ms <= 86400000 || timeout_ms == CXLPOOL_SHARED_STOPPED_NEVER,
            "cxlpool_shared_params_set_stopped_timeout",
            "timeout " + std::to_string(timeout_ms) +
                " ms: at most a day (86400000), 0 for the default or CXLPOOL_SHARED_STOPPED_NEVER");
    params->p.stopped_timeout_ms = timeout_ms;
  });
}

namespace {
void require_quota_name(const char* function, const char* name) {
  require(name != nullptr, function, "name is NULL");
  const std::string n = name;
  bool ok = !n.empty() && n.size() <= 23;
  for (char c : n) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
  require(ok, function, "quota name \"" + n + "\": need 1-23 characters of [A-Za-z0-9_.-]");
}
}  // namespace

cxlpool_status_t cxlpool_shared_params_add_quota(cxlpool_shared_params_t* params, const char* name, uint64_t bytes) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_add_quota", "params is NULL");
    require_quota_name("cxlpool_shared_params_add_quota", name);
    require(std::string(name) != "default", "cxlpool_shared_params_add_quota",
            "\"default\" is the quota of what the named ones leave; choose another name");
    for (const auto& q : params->p.quotas)
      require(q.first != name, "cxlpool_shared_params_add_quota", "quota \"" + std::string(name) + "\" added twice");
    require(params->p.quotas.size() < S::kMaxQuotas - 1, "cxlpool_shared_params_add_quota",
            "more than " + std::to_string(S::kMaxQuotas - 1) + " quotas");
    require(bytes > 0, "cxlpool_shared_params_add_quota", "quota \"" + std::string(name) + "\" of 0 bytes");
    params->p.quotas.emplace_back(name, bytes);
  });
}

cxlpool_status_t cxlpool_shared_params_set_quota(cxlpool_shared_params_t* params, const char* name) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_quota", "params is NULL");
    require_quota_name("cxlpool_shared_params_set_quota", name);
    params->p.quota = name;
  });
}

cxlpool_status_t cxlpool_shared_params_set_quota_key(cxlpool_shared_params_t* params, const char* key) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_quota_key", "params is NULL");
    require(key != nullptr, "cxlpool_shared_params_set_quota_key", "key is NULL");
    unsigned char bytes[S::kKeyBytes];
    require(S::parse_quota_key(key, bytes), "cxlpool_shared_params_set_quota_key",
            "not a quota key: need 32 hexadecimal digits (what cxlpool_compose_lock_quota wrote)");
    params->p.quota_key = key;
  });
}

cxlpool_status_t cxlpool_shared_params_set_failure_domain(cxlpool_shared_params_t* params, const char* domain) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_failure_domain", "params is NULL");
    require(domain != nullptr, "cxlpool_shared_params_set_failure_domain", "domain is NULL");
    const std::string d = domain;
    bool ok = !d.empty() && d.size() <= 31;
    for (char c : d)
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' || c == '-');
    require(ok, "cxlpool_shared_params_set_failure_domain",
            "failure domain \"" + d + "\": need 1-31 characters of [A-Za-z0-9_.:-]");
    params->p.failure_domain = d;
  });
}

cxlpool_status_t cxlpool_shared_params_set_noncoherent_view(cxlpool_shared_params_t* params, uint64_t seed,
                                                            uint32_t evict_per_call) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_noncoherent_view", "params is NULL");
    require(evict_per_call <= 1u << 20, "cxlpool_shared_params_set_noncoherent_view",
            "evict_per_call " + std::to_string(evict_per_call) + " is above 1048576");
    params->p.noncoherent_view = true;
    params->p.view_seed = seed;
    params->p.view_evict_per_call = evict_per_call;
  });
}

cxlpool_status_t cxlpool_shared_params_set_host_index(cxlpool_shared_params_t* params, uint32_t index) {
  return guarded([&] {
    require(params != nullptr, "cxlpool_shared_params_set_host_index", "params is NULL");
    require(index < S::kMaxSlots, "cxlpool_shared_params_set_host_index",
            "host index " + std::to_string(index) + " out of range");
    params->p.host_index = index;
  });
}

cxlpool_status_t cxlpool_shared_pool_create(const char* device, const cxlpool_shared_params_t* params, unsigned flags,
                                            cxlpool_shared_pool_t** out) {
  return guarded([&] {
    require(device != nullptr, "cxlpool_shared_pool_create", "device is NULL");
    require(params != nullptr, "cxlpool_shared_pool_create", "params is NULL (the size must be given)");
    require(out != nullptr, "cxlpool_shared_pool_create", "out is NULL");
    // The control socket (CXLPOOL_CONTROL=1) answers for a program whose pools are all shared too.
    control::start_from_environment();
    *out = handle(S::SharedPool::create(device, params->p, flags).release());
  });
}

cxlpool_status_t cxlpool_shared_pool_open(const char* device, const cxlpool_shared_params_t* params,
                                          cxlpool_shared_pool_t** out) {
  return guarded([&] {
    require(device != nullptr, "cxlpool_shared_pool_open", "device is NULL");
    require(out != nullptr, "cxlpool_shared_pool_open", "out is NULL");
    control::start_from_environment();
    *out = handle(S::SharedPool::open(device, params ? &params->p : nullptr).release());
  });
}

cxlpool_status_t cxlpool_shared_pool_close(cxlpool_shared_pool_t* pool) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_close", "pool is NULL");
    S::SharedPool* p = impl(pool);
    if (p->in_fork_child()) {  // not a participant; the parent's copies must not be destroyed
      p->abandon_in_fork_child();
      retire_shell(pool);
      return;
    }
    std::unique_ptr<S::SharedPool> owned(p);
    retire_shell(pool);
    owned->leave();
  });
}

cxlpool_status_t cxlpool_shared_pool_unlink(const char* device) {
  return guarded([&] {
    require(device != nullptr, "cxlpool_shared_pool_unlink", "device is NULL");
    S::SharedPool::unlink(device);
  });
}

cxlpool_status_t cxlpool_shared_alloc(cxlpool_shared_pool_t* pool, size_t size, void** out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_alloc", "pool is NULL");
    require(out != nullptr, "cxlpool_shared_alloc", "out is NULL");
    *out = impl(pool)->alloc(size);
  });
}

cxlpool_status_t cxlpool_shared_alloc_flags(cxlpool_shared_pool_t* pool, size_t size, unsigned flags, void** out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_alloc_flags", "pool is NULL");
    require(out != nullptr, "cxlpool_shared_alloc_flags", "out is NULL");
    require((flags & ~(CXLPOOL_SHARED_WRITE_SHARED | CXLPOOL_SHARED_LOCK_BEARING)) == 0, "cxlpool_shared_alloc_flags",
            "unknown flags " + std::to_string(flags));
    *out = impl(pool)->alloc(size, flags);
  });
}

cxlpool_status_t cxlpool_shared_free(cxlpool_shared_pool_t* pool, void* ptr) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_free", "pool is NULL");
    require(ptr != nullptr, "cxlpool_shared_free", "ptr is NULL");
    impl(pool)->free(ptr);
  });
}

cxlpool_status_t cxlpool_shared_export(cxlpool_shared_pool_t* pool, const void* ptr, cxlpool_shared_handle_t* out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_export", "pool is NULL");
    require(ptr != nullptr, "cxlpool_shared_export", "ptr is NULL");
    require(out != nullptr, "cxlpool_shared_export", "out is NULL");
    *out = impl(pool)->export_block(ptr);
  });
}

cxlpool_status_t cxlpool_shared_import(cxlpool_shared_pool_t* pool, const cxlpool_shared_handle_t* h, void** out,
                                       size_t* size_out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_import", "pool is NULL");
    require(h != nullptr, "cxlpool_shared_import", "handle is NULL");
    require(out != nullptr, "cxlpool_shared_import", "out is NULL");
    size_t size = 0;
    void* p = impl(pool)->import_block(*h, &size);
    *out = p;
    if (size_out) *size_out = size;
  });
}

cxlpool_status_t cxlpool_shared_release(cxlpool_shared_pool_t* pool, void* ptr) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_release", "pool is NULL");
    require(ptr != nullptr, "cxlpool_shared_release", "ptr is NULL");
    impl(pool)->release(ptr);
  });
}

cxlpool_status_t cxlpool_shared_pool_info(cxlpool_shared_pool_t* pool, cxlpool_shared_info_t* out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_info", "pool is NULL");
    require(out != nullptr, "cxlpool_shared_pool_info", "out is NULL");
    *out = impl(pool)->info();
  });
}

cxlpool_status_t cxlpool_shared_pool_data_range(cxlpool_shared_pool_t* pool, void** base, uint64_t* size) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_data_range", "pool is NULL");
    require(base != nullptr && size != nullptr, "cxlpool_shared_pool_data_range", "base or size is NULL");
    const shared::PoolView& v = impl(pool)->view();
    *base = v.base() + v.extent_offset(0);
    *size = v.extent_count() * v.extent_size();
  });
}

cxlpool_status_t cxlpool_shared_pool_quotas(cxlpool_shared_pool_t* pool, cxlpool_shared_quota_t* out, size_t capacity,
                                            size_t* count) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_quotas", "pool is NULL");
    require(count != nullptr, "cxlpool_shared_pool_quotas", "count is NULL");
    require(out != nullptr || capacity == 0, "cxlpool_shared_pool_quotas", "out is NULL with a non-zero capacity");
    const auto q = impl(pool)->quotas();
    for (size_t i = 0; i < q.size() && i < capacity; ++i) out[i] = q[i];
    *count = q.size();
  });
}

cxlpool_status_t cxlpool_shared_pool_health(cxlpool_shared_pool_t* pool, cxlpool_shared_health_t* out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_health", "pool is NULL");
    require(out != nullptr, "cxlpool_shared_pool_health", "out is NULL");
    *out = impl(pool)->health();
  });
}

cxlpool_status_t cxlpool_shared_pool_inject_failure(cxlpool_shared_pool_t* pool, const char* reason) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_inject_failure", "pool is NULL");
    impl(pool)->declare_failed(std::string("injected: ") + (reason ? reason : "fault injection"));
  });
}

cxlpool_status_t cxlpool_shared_set_create(cxlpool_shared_pool_t* const* pools, size_t count,
                                           cxlpool_shared_set_t** out) {
  return guarded([&] {
    require(pools != nullptr, "cxlpool_shared_set_create", "pools is NULL");
    require(count >= 1 && count <= 64, "cxlpool_shared_set_create",
            "count " + std::to_string(count) + ": need 1 to 64 pools");
    require(out != nullptr, "cxlpool_shared_set_create", "out is NULL");
    auto set = std::make_unique<cxlpool_shared_set>();
    for (size_t i = 0; i < count; ++i) {
      require(pools[i] != nullptr, "cxlpool_shared_set_create", "pools[" + std::to_string(i) + "] is NULL");
      impl(pools[i]);  // open?
      for (auto* p : set->pools)
        require(p != pools[i], "cxlpool_shared_set_create", "pools[" + std::to_string(i) + "] given twice");
      set->pools.push_back(pools[i]);
    }
    *out = set.release();
  });
}

void cxlpool_shared_set_destroy(cxlpool_shared_set_t* set) { delete set; }

cxlpool_status_t cxlpool_shared_set_alloc(cxlpool_shared_set_t* set, size_t size, void** out,
                                          cxlpool_shared_pool_t** from) {
  return guarded([&] {
    require(set != nullptr, "cxlpool_shared_set_alloc", "set is NULL");
    require(out != nullptr, "cxlpool_shared_set_alloc", "out is NULL");
    std::vector<std::string> failed_domains;
    for (cxlpool_shared_pool_t* h : set->pools)  // a pool closed while in the set is refused here
      if (impl(h)->failed()) failed_domains.push_back(impl(h)->view().sb().failure_domain);
    auto in_failed_domain = [&](S::SharedPool* p) {
      for (const auto& d : failed_domains)
        if (d == p->view().sb().failure_domain) return true;
      return false;
    };
    bool any_candidate = false;
    std::string full;
    for (cxlpool_shared_pool_t* h : set->pools) {
      S::SharedPool* p = impl(h);
      if (p->failed() || in_failed_domain(p)) continue;
      any_candidate = true;
      try {
        *out = p->alloc(size);
        if (from) *from = h;
        return;
      } catch (const Failure& f) {
        if (f.status() != CXLPOOL_E_CAPACITY && f.status() != CXLPOOL_E_DEVICE_FAILED) throw;
        full += std::string(full.empty() ? "" : "; ") + f.what();
      }
    }
    if (!any_candidate)
      fail(CXLPOOL_E_DEVICE_FAILED, "cxlpool_shared_set_alloc: every pool of the set is failed or in a failed domain");
    fail(CXLPOOL_E_CAPACITY, "cxlpool_shared_set_alloc: no healthy pool has room: " + full);
  });
}

cxlpool_status_t cxlpool_shared_pool_check(const char* device, const cxlpool_shared_params_t* params, int repair,
                                           cxlpool_shared_check_report_t* out) {
  return guarded([&] {
    require(device != nullptr, "cxlpool_shared_pool_check", "device is NULL");
    require(out != nullptr, "cxlpool_shared_pool_check", "out is NULL");
    *out = cxlpool_shared_check_report_t{};  // extents_total stays 0 when the check cannot run
    *out = S::check_pool(device, params ? &params->p : nullptr, repair != 0);
    const auto& r = *out;
    const uint64_t problems =
        r.leaked_blocks + r.dangling_leases + r.corrupt_words + r.orphan_extents + r.dead_participants;
    if (problems != 0)
      fail(CXLPOOL_E_CORRUPT,
           std::string("cxlpool_shared_pool_check: ") + device + ": " + std::to_string(r.leaked_blocks) +
               " leaked blocks, " + std::to_string(r.dangling_leases) + " dangling leases, " +
               std::to_string(r.corrupt_words) + " corrupt words, " + std::to_string(r.orphan_extents) +
               " extents of dead owners, " + std::to_string(r.dead_participants) + " dead participants not recovered");
  });
}

cxlpool_status_t cxlpool_shared_pool_stats_json(cxlpool_shared_pool_t* pool, char** out) {
  return guarded([&] {
    require(pool != nullptr, "cxlpool_shared_pool_stats_json", "pool is NULL");
    require(out != nullptr, "cxlpool_shared_pool_stats_json", "out is NULL");
    const std::string json = impl(pool)->stats_json();
    char* s = static_cast<char*>(std::malloc(json.size() + 1));
    if (!s) throw std::bad_alloc();
    std::memcpy(s, json.c_str(), json.size() + 1);
    *out = s;
  });
}

cxlpool_status_t cxlpool_shared_pool_survey(const char* device, cxlpool_shared_survey_t* out,
                                            cxlpool_shared_participant_t* participants, size_t capacity) {
  return guarded([&] {
    require(device != nullptr, "cxlpool_shared_pool_survey", "device is NULL");
    require(out != nullptr, "cxlpool_shared_pool_survey", "out is NULL");
    require(participants != nullptr || capacity == 0, "cxlpool_shared_pool_survey",
            "participants is NULL with a capacity");
    std::vector<cxlpool_shared_participant_t> all;
    *out = S::survey_pool(device, &all);
    for (size_t i = 0; i < all.size() && i < capacity; ++i) participants[i] = all[i];
  });
}

cxlpool_status_t cxlpool_publish(const void* ptr, size_t len) {
  if (len == 0) return CXLPOOL_OK;
  if (ptr == nullptr) {
    set_last_error(CXLPOOL_E_INVALID_ARGUMENT, 0, "cxlpool_publish: ptr is NULL");
    return CXLPOOL_E_INVALID_ARGUMENT;
  }
  S::publish_in_open_pool(ptr, len);  // memory outside shared pools is coherent: nothing to do
  return CXLPOOL_OK;
}

cxlpool_status_t cxlpool_acquire(const void* ptr, size_t len) {
  if (len == 0) return CXLPOOL_OK;
  if (ptr == nullptr) {
    set_last_error(CXLPOOL_E_INVALID_ARGUMENT, 0, "cxlpool_acquire: ptr is NULL");
    return CXLPOOL_E_INVALID_ARGUMENT;
  }
  S::acquire_in_open_pool(ptr, len);
  return CXLPOOL_OK;
}

}  // extern "C"

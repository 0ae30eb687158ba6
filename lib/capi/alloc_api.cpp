// SPDX-License-Identifier: MIT
// C ABI for pools and the malloc family. Allocation functions keep the malloc contract
// (NULL + errno) and set no last error on the fast path; pool management returns statuses.
#include <cerrno>
#include <cstring>
#include <mutex>

#include "alloc/pool.hpp"
#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "common/parse.hpp"
#include "cxlpool/alloc.h"
#include "stats/control.hpp"
#include "stats/publisher.hpp"
#include "tiering/engine.hpp"

using namespace cxlpool::detail;
namespace A = cxlpool::detail::alloc;

struct cxlpool_pool_params {
  std::string devices, policy, name;
  bool has_devices = false;
  cxlpool_sharing_t sharing = CXLPOOL_SHARING_PRIVATE;
};

namespace {
inline A::Pool* impl(cxlpool_pool_t* p) { return reinterpret_cast<A::Pool*>(p); }
inline const A::Pool* impl(const cxlpool_pool_t* p) { return reinterpret_cast<const A::Pool*>(p); }
inline cxlpool_pool_t* handle(A::Pool* p) { return reinterpret_cast<cxlpool_pool_t*>(p); }

std::once_flag g_default_once;
A::Pool* g_default_pool = nullptr;
cxlpool_status_t g_default_status = CXLPOOL_OK;
std::string g_default_error;

void create_default_pool() {
  g_default_status = guarded([] {
    A::configure_from_environment();
    tiering::start_from_environment();  // before the pool, so that its regions are 4 MiB units
    stats::start_from_environment();
    Topology topo = discover(DiscoverOptions{});
    g_default_pool = A::pool_create_from_environment(topo, "default");
    control::start_from_environment();  // after the pool: a request finds its devices open
  });
  if (g_default_status != CXLPOOL_OK) g_default_error = last_error().message;
}

A::Pool* default_pool() noexcept {
  std::call_once(g_default_once, create_default_pool);
  return g_default_pool;
}

inline A::Pool* pool_or_default(cxlpool_pool_t* p) noexcept { return p ? impl(p) : default_pool(); }

void add(cxlpool_stats_t& t, const A::DeviceStats& s) {
  t.allocated_bytes += s.allocated_bytes;
  t.active_bytes += s.active_bytes;
  t.resident_bytes += s.resident_bytes;
  t.peak_resident_bytes += s.peak_resident_bytes;
  t.capacity_bytes += s.capacity_bytes;
  t.allocations += s.allocations;
  t.frees += s.frees;
  t.fallbacks += s.fallbacks;
  t.failures += s.failures;
  t.device_committed_bytes += s.device_committed_bytes;
  t.double_frees += s.double_frees;
  t.invalid_frees += s.invalid_frees;
}

void check_device(const cxlpool_pool_t* pool, int device, const char* fn) {
  int n = A::pool_device_count(impl(pool));
  if (device < 0 || device >= n)
    fail(CXLPOOL_E_NOT_FOUND, std::string(fn) + ": device index " + std::to_string(device) + " out of range (" +
                                  std::to_string(n) + " devices)");
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_pool_params_create(cxlpool_pool_params_t** out) {
  return guarded([&] {
    require(out, "cxlpool_pool_params_create", "out is NULL");
    *out = new cxlpool_pool_params();
  });
}

void cxlpool_pool_params_destroy(cxlpool_pool_params_t* params) { delete params; }

cxlpool_status_t cxlpool_pool_params_set_devices(cxlpool_pool_params_t* params, const char* names) {
  return guarded([&] {
    require(params && names, "cxlpool_pool_params_set_devices", "params or names is NULL");
    params->devices = names;
    params->has_devices = true;
  });
}

cxlpool_status_t cxlpool_pool_params_set_policy(cxlpool_pool_params_t* params, const char* policy) {
  return guarded([&] {
    require(params && policy, "cxlpool_pool_params_set_policy", "params or policy is NULL");
    params->policy = policy;
  });
}

cxlpool_status_t cxlpool_pool_params_set_name(cxlpool_pool_params_t* params, const char* name) {
  return guarded([&] {
    require(params && name, "cxlpool_pool_params_set_name", "params or name is NULL");
    params->name = name;
  });
}

cxlpool_status_t cxlpool_pool_params_set_sharing(cxlpool_pool_params_t* params, cxlpool_sharing_t sharing) {
  return guarded([&] {
    require(params, "cxlpool_pool_params_set_sharing", "params is NULL");
    if (sharing != CXLPOOL_SHARING_PRIVATE && sharing != CXLPOOL_SHARING_SHARED)
      fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pool_params_set_sharing: unknown sharing mode " +
                                           std::to_string(int(sharing)) +
                                           " (CXLPOOL_SHARING_PRIVATE or CXLPOOL_SHARING_SHARED)");
    params->sharing = sharing;
  });
}

cxlpool_status_t cxlpool_pool_create(const cxlpool_topology_t* topology, const cxlpool_pool_params_t* params,
                                     cxlpool_pool_t** out) {
  return guarded([&] {
    require(topology && out, "cxlpool_pool_create", "topology or out is NULL");
    tiering::start_from_environment();
    stats::start_from_environment();
    control::start_from_environment();
    A::PoolOptions o;
    if (params) {
      o.policy = params->policy;
      o.name = params->name;
      o.sharing = params->sharing == CXLPOOL_SHARING_SHARED ? Sharing::kShared : Sharing::kPrivate;
      if (params->has_devices) {
        const auto& ts = topology->model.targets;
        for (auto name : split(params->devices, ',')) {
          name = trim(name);
          size_t i = 0;
          while (i < ts.size() && ts[i].name != name) ++i;
          if (i == ts.size())
            fail(CXLPOOL_E_NOT_FOUND, "cxlpool_pool_create: no target named '" + std::string(name) + "' in devices '" +
                                          params->devices + "'");
          o.targets.push_back(i);
        }
        if (o.targets.empty()) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pool_create: empty device list");
      }
    }
    *out = handle(A::pool_create(topology->model, o));
  });
}

cxlpool_status_t cxlpool_pool_destroy(cxlpool_pool_t* pool) {
  return guarded([&] {
    if (!pool) return;
    if (impl(pool) == g_default_pool)
      fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pool_destroy: the default pool lives as long as the process");
    A::pool_destroy(impl(pool));
  });
}

cxlpool_status_t cxlpool_pool_default(cxlpool_pool_t** out) {
  return guarded([&] {
    require(out, "cxlpool_pool_default", "out is NULL");
    A::Pool* p = default_pool();
    if (!p) fail(g_default_status, g_default_error);
    *out = handle(p);
  });
}

void* cxlpool_malloc(cxlpool_pool_t* pool, size_t size) {
  A::Pool* p = pool_or_default(pool);
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  return A::pool_malloc(p, size);
}

void* cxlpool_malloc_hint(cxlpool_pool_t* pool, size_t size, const cxlpool_hint_t* hint) {
  A::Pool* p = pool_or_default(pool);
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  if (!hint) return A::pool_malloc(p, size);
  if (hint->device >= A::pool_device_count(p)) {
    errno = EINVAL;
    return nullptr;
  }
  return A::pool_malloc(p, size, hint->flags, hint->device);
}

void* cxlpool_calloc(cxlpool_pool_t* pool, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  void* q = cxlpool_malloc(pool, bytes);
  if (q) std::memset(q, 0, bytes);
  return q;
}

void* cxlpool_realloc(cxlpool_pool_t* pool, void* p, size_t size) {
  if (!p) return cxlpool_malloc(pool, size);
  if (size == 0) {
    cxlpool_free(p);
    return nullptr;
  }
  // The block stays in its own pool; EINVAL when p starts no live block of ours.
  return A::pool_realloc(nullptr, p, size);
}

void* cxlpool_aligned_alloc(cxlpool_pool_t* pool, size_t alignment, size_t size) {
  A::Pool* p = pool_or_default(pool);
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  return A::pool_aligned(p, alignment, size);
}

void* cxlpool_aligned_alloc_hint(cxlpool_pool_t* pool, size_t alignment, size_t size, const cxlpool_hint_t* hint) {
  A::Pool* p = pool_or_default(pool);
  if (!p) {
    errno = ENOMEM;
    return nullptr;
  }
  if (hint && hint->device >= A::pool_device_count(p)) {
    errno = EINVAL;
    return nullptr;
  }
  return A::pool_aligned(p, alignment, size, hint ? hint->flags : 0, hint ? hint->device : -1);
}

int cxlpool_posix_memalign(cxlpool_pool_t* pool, void** out, size_t alignment, size_t size) {
  if (!out || alignment < sizeof(void*) || (alignment & (alignment - 1))) return EINVAL;
  int saved = errno;
  void* q = cxlpool_aligned_alloc(pool, alignment, size);
  if (!q) {
    int err = errno;
    errno = saved;
    return err ? err : ENOMEM;
  }
  *out = q;
  return 0;
}

void cxlpool_free(void* p) {
  if (p) A::free_any(p);  // never changes errno (its slow paths restore it)
}

size_t cxlpool_usable_size(const void* p) { return p ? A::usable_size(p) : 0; }

cxlpool_status_t cxlpool_ptr_info(const void* p, cxlpool_ptr_info_t* out) {
  return guarded([&] {
    require(p && out, "cxlpool_ptr_info", "p or out is NULL");
    A::PtrInfo info;
    if (!A::ptr_info(p, &info)) fail(CXLPOOL_E_NOT_FOUND, "cxlpool_ptr_info: pointer was not allocated by cxlpool");
    cxlpool_ptr_info_t r{};
    r.pool = handle(info.pool);
    r.device = info.device;
    r.target_index = info.target;
    r.device_name = A::pool_device_name(info.pool, info.device).c_str();
    r.tier = info.tier;
    r.block_size = info.block_size;
    r.usable_size = info.usable;
    r.huge = info.huge;
    r.home_device = info.home_device;
    *out = r;
  });
}

cxlpool_status_t cxlpool_pool_get_stats(const cxlpool_pool_t* pool, int device, cxlpool_stats_t* out) {
  return guarded([&] {
    require(pool && out, "cxlpool_pool_get_stats", "pool or out is NULL");
    cxlpool_stats_t s{};
    if (device == -1) {
      for (int i = 0; i < A::pool_device_count(impl(pool)); ++i) add(s, A::pool_device_stats(impl(pool), i));
    } else {
      check_device(pool, device, "cxlpool_pool_get_stats");
      add(s, A::pool_device_stats(impl(pool), device));
    }
    *out = s;
  });
}

cxlpool_status_t cxlpool_pool_stats_json(const cxlpool_pool_t* pool, char** out) {
  return guarded([&] {
    require(pool && out, "cxlpool_pool_stats_json", "pool or out is NULL");
    std::string json = A::pool_stats_json(impl(pool));
    char* s = static_cast<char*>(std::malloc(json.size() + 1));
    if (!s) throw std::bad_alloc();
    std::memcpy(s, json.c_str(), json.size() + 1);
    *out = s;
  });
}

cxlpool_status_t cxlpool_pool_device_count(const cxlpool_pool_t* pool, int* out) {
  return guarded([&] {
    require(pool && out, "cxlpool_pool_device_count", "pool or out is NULL");
    *out = A::pool_device_count(impl(pool));
  });
}

cxlpool_status_t cxlpool_pool_get_device(const cxlpool_pool_t* pool, int device, const char** name, int* tier) {
  return guarded([&] {
    require(pool, "cxlpool_pool_get_device", "pool is NULL");
    check_device(pool, device, "cxlpool_pool_get_device");
    if (name) *name = A::pool_device_name(impl(pool), device).c_str();
    if (tier) *tier = A::pool_device_tier(impl(pool), device);
  });
}

cxlpool_status_t cxlpool_pool_find_device(const cxlpool_pool_t* pool, const char* name, int* out) {
  return guarded([&] {
    require(pool && name && out, "cxlpool_pool_find_device", "pool, name or out is NULL");
    int i = A::pool_find_device(impl(pool), name);
    if (i < 0) fail(CXLPOOL_E_NOT_FOUND, std::string("cxlpool_pool_find_device: no device '") + name + "' in the pool");
    *out = i;
  });
}

cxlpool_status_t cxlpool_pool_policy(const cxlpool_pool_t* pool, const char** out) {
  return guarded([&] {
    require(pool && out, "cxlpool_pool_policy", "pool or out is NULL");
    *out = A::pool_policy_text(impl(pool)).c_str();
  });
}

cxlpool_status_t cxlpool_pool_trim(cxlpool_pool_t* pool, uint64_t* released) {
  return guarded([&] {
    require(pool, "cxlpool_pool_trim", "pool is NULL");
    uint64_t r = A::pool_trim(impl(pool));
    if (released) *released = r;
  });
}

}  // extern "C"

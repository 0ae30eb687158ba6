// SPDX-License-Identifier: MIT
// cxlpool C++ layer: header-only RAII wrappers over the C ABI. Throwing calls raise
// cxlpool::Error (a std::system_error in cxlpool::category()); the std::error_code overloads
// never throw. Thread-safety is that of the wrapped C objects (see the C headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <memory_resource>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace cxlpool {

// ---- Errors -------------------------------------------------------------------------------
class ErrorCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cxlpool"; }
  std::string message(int status) const override { return cxlpool_status_str(static_cast<cxlpool_status_t>(status)); }
};
inline const std::error_category& category() noexcept {
  static const ErrorCategory instance;
  return instance;
}
inline std::error_code make_error_code(cxlpool_status_t s) noexcept { return {int(s), category()}; }

// Carries the status, the OS errno and the last-error message of the failing call.
class Error : public std::system_error {
 public:
  Error(cxlpool_status_t status, int os_errno, const std::string& message)
      : std::system_error(make_error_code(status), message), os_errno_(os_errno), message_(message) {}
  // The message of the failing call alone (system_error would append the status text).
  const char* what() const noexcept override { return message_.c_str(); }
  cxlpool_status_t status() const noexcept { return static_cast<cxlpool_status_t>(code().value()); }
  int os_errno() const noexcept { return os_errno_; }

 private:
  int os_errno_;
  std::string message_;
};

namespace detail {
inline void check(cxlpool_status_t s) {
  if (s == CXLPOOL_OK) return;
  cxlpool_error_info_t e{};
  cxlpool_last_error(&e);
  throw Error(s, e.os_errno, e.message);
}
inline bool check(cxlpool_status_t s, std::error_code& ec) noexcept {
  ec = s == CXLPOOL_OK ? std::error_code() : make_error_code(s);
  return s == CXLPOOL_OK;
}
}  // namespace detail

// An attribute value with its provenance.
struct Value {
  int64_t value = 0;
  cxlpool_source_t source = CXLPOOL_SOURCE_UNKNOWN;
  bool known = false;
  const char* source_name() const noexcept { return cxlpool_source_str(source); }
  static Value from(const cxlpool_attr_value_t& v) noexcept { return {v.value, v.source, v.known != 0}; }
};

// ---- Discovery configuration ----------------------------------------------------------------
class Config {
 public:
  Config() { detail::check(cxlpool_config_create(&cfg_)); }
  ~Config() { cxlpool_config_destroy(cfg_); }
  Config(Config&& o) noexcept : cfg_(std::exchange(o.cfg_, nullptr)) {}
  Config& operator=(Config&& o) noexcept {
    std::swap(cfg_, o.cfg_);
    return *this;
  }
  Config& sysfs_root(const std::string& dir) {
    return detail::check(cxlpool_config_set_sysfs_root(cfg_, dir.c_str())), *this;
  }
  Config& procfs_root(const std::string& dir) {
    return detail::check(cxlpool_config_set_procfs_root(cfg_, dir.c_str())), *this;
  }
  Config& devices(const std::string& spec) {
    return detail::check(cxlpool_config_set_devices(cfg_, spec.c_str())), *this;
  }
  Config& config_file(const std::string& path) {
    return detail::check(cxlpool_config_set_config_file(cfg_, path.c_str())), *this;
  }
  Config& flags(uint32_t f) { return detail::check(cxlpool_config_set_flags(cfg_, f)), *this; }
  const cxlpool_config_t* get() const noexcept { return cfg_; }

 private:
  cxlpool_config_t* cfg_ = nullptr;
};

// ---- Topology -----------------------------------------------------------------------------
class Topology;

// A view of one target; valid while its Topology lives.
class Target {
 public:
  Target(const cxlpool_topology_t* topo, size_t index) : topo_(topo), index_(index) {
    detail::check(cxlpool_topology_get_target(topo, index, &info_));
  }
  size_t index() const noexcept { return index_; }
  std::string_view name() const noexcept { return info_.name; }
  cxlpool_target_kind_t kind() const noexcept { return info_.kind; }
  int numa_node() const noexcept { return info_.numa_node; }
  int tier() const noexcept { return info_.tier; }
  bool cpuless() const noexcept { return info_.cpuless != 0; }
  std::string_view cpulist() const noexcept { return info_.cpulist; }
  cxlpool_backing_kind_t backing() const noexcept { return info_.backing; }
  std::string_view backing_path() const noexcept { return info_.backing_path; }
  uint64_t capacity() const noexcept { return info_.capacity_bytes; }
  Value attr(cxlpool_attr_t a) const {
    cxlpool_attr_value_t v{};
    detail::check(cxlpool_target_get_attr(topo_, index_, a, &v));
    return Value::from(v);
  }
  Value distance_to(const Target& other) const {
    cxlpool_attr_value_t v{};
    detail::check(cxlpool_target_get_distance(topo_, index_, other.index_, &v));
    return Value::from(v);
  }

 private:
  const cxlpool_topology_t* topo_;
  size_t index_;
  cxlpool_target_info_t info_{};
};

class Topology {
 public:
  // Throws cxlpool::Error (e.g. CXLPOOL_E_CONFIG naming the bad token).
  static Topology discover(const Config* config = nullptr) {
    cxlpool_topology_t* t = nullptr;
    detail::check(cxlpool_topology_discover(config ? config->get() : nullptr, &t));
    return Topology(t);
  }
  static std::optional<Topology> discover(std::error_code& ec, const Config* config = nullptr) noexcept {
    cxlpool_topology_t* t = nullptr;
    if (!detail::check(cxlpool_topology_discover(config ? config->get() : nullptr, &t), ec)) return std::nullopt;
    return Topology(t);
  }
  ~Topology() { cxlpool_topology_destroy(topo_); }
  Topology(Topology&& o) noexcept : topo_(std::exchange(o.topo_, nullptr)) {}
  Topology& operator=(Topology&& o) noexcept {
    std::swap(topo_, o.topo_);
    return *this;
  }

  size_t size() const {
    size_t n = 0;
    detail::check(cxlpool_topology_target_count(topo_, &n));
    return n;
  }
  Target target(size_t index) const { return Target(topo_, index); }
  std::vector<Target> targets() const {
    std::vector<Target> out;
    for (size_t i = 0, n = size(); i < n; ++i) out.emplace_back(topo_, i);
    return out;
  }
  std::optional<Target> find(const std::string& name) const {
    size_t i = 0;
    std::error_code ec;
    if (!detail::check(cxlpool_topology_find_target(topo_, name.c_str(), &i), ec)) return std::nullopt;
    return Target(topo_, i);
  }
  int tier_count() const {
    int n = 0;
    detail::check(cxlpool_topology_tier_count(topo_, &n));
    return n;
  }
  cxlpool_kernel_state_t kernel_state() const {
    cxlpool_kernel_state_t s{};
    detail::check(cxlpool_topology_get_kernel_state(topo_, &s));
    return s;
  }
  std::vector<cxlpool_component_info_t> components() const {
    size_t n = 0;
    detail::check(cxlpool_topology_component_count(topo_, &n));
    std::vector<cxlpool_component_info_t> out(n);
    for (size_t i = 0; i < n; ++i) detail::check(cxlpool_topology_get_component(topo_, i, &out[i]));
    return out;
  }
  std::vector<std::string> warnings() const {
    size_t n = 0;
    detail::check(cxlpool_topology_warning_count(topo_, &n));
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      const char* w = nullptr;
      detail::check(cxlpool_topology_get_warning(topo_, i, &w));
      out.emplace_back(w);
    }
    return out;
  }
  std::string to_json() const {
    char* s = nullptr;
    detail::check(cxlpool_topology_to_json(topo_, &s));
    std::string out(s);
    cxlpool_string_free(s);
    return out;
  }
  const cxlpool_topology_t* get() const noexcept { return topo_; }

 private:
  explicit Topology(cxlpool_topology_t* t) noexcept : topo_(t) {}
  cxlpool_topology_t* topo_ = nullptr;
};

// ---- Backings -----------------------------------------------------------------------------
class Backing;

// An RAII reservation: released (and decommitted) when destroyed.
class Reservation {
 public:
  Reservation() = default;
  Reservation(cxlpool_backing_t* b, void* addr, size_t size) noexcept : backing_(b), addr_(addr), size_(size) {}
  ~Reservation() { reset(); }
  Reservation(Reservation&& o) noexcept
      : backing_(std::exchange(o.backing_, nullptr)),
        addr_(std::exchange(o.addr_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  Reservation& operator=(Reservation&& o) noexcept {
    if (this != &o) {
      reset();
      backing_ = std::exchange(o.backing_, nullptr);
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  void* data() const noexcept { return addr_; }
  size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return addr_ != nullptr; }
  // Commits [offset, offset+len) of this reservation (whole reservation by default).
  void commit(size_t offset = 0, size_t len = SIZE_MAX, uint32_t flags = 0) {
    detail::check(cxlpool_backing_commit(backing_, at(offset), clamp(offset, len), flags));
  }
  void decommit(size_t offset = 0, size_t len = SIZE_MAX) {
    detail::check(cxlpool_backing_decommit(backing_, at(offset), clamp(offset, len)));
  }
  uint64_t device_offset() const {
    uint64_t off = 0;
    detail::check(cxlpool_backing_offset_of(backing_, addr_, &off));
    return off;
  }
  void reset() noexcept {
    if (addr_) cxlpool_backing_release(backing_, addr_);
    addr_ = nullptr;
    size_ = 0;
  }

 private:
  void* at(size_t offset) const noexcept { return static_cast<char*>(addr_) + offset; }
  size_t clamp(size_t offset, size_t len) const noexcept { return len == SIZE_MAX ? size_ - offset : len; }
  cxlpool_backing_t* backing_ = nullptr;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

class Backing {
 public:
  static Backing open(const Topology& topo, const Target& target) {
    cxlpool_backing_t* b = nullptr;
    detail::check(cxlpool_backing_open(topo.get(), target.index(), &b));
    return Backing(b);
  }
  // Reservations must be destroyed before their Backing.
  ~Backing() {
    if (b_) cxlpool_backing_close(b_);
  }
  Backing(Backing&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  Backing& operator=(Backing&& o) noexcept {
    std::swap(b_, o.b_);
    return *this;
  }
  Reservation reserve(size_t size, size_t alignment = 0) {
    void* p = nullptr;
    detail::check(cxlpool_backing_reserve(b_, size, alignment, &p));
    return Reservation(b_, p, round_to_page(size));
  }
  Reservation map(uint64_t offset, size_t size) {
    void* p = nullptr;
    detail::check(cxlpool_backing_map(b_, offset, size, &p));
    return Reservation(b_, p, round_to_page(size));
  }
  cxlpool_backing_caps_t caps() const {
    cxlpool_backing_caps_t c{};
    detail::check(cxlpool_backing_get_caps(b_, &c));
    return c;
  }
  cxlpool_backing_usage_t usage() const {
    cxlpool_backing_usage_t u{};
    detail::check(cxlpool_backing_get_usage(b_, &u));
    return u;
  }
  cxlpool_backing_t* get() const noexcept { return b_; }

 private:
  explicit Backing(cxlpool_backing_t* b) noexcept : b_(b) {}
  size_t round_to_page(size_t n) const {
    size_t ps = caps().page_size;
    return (n + ps - 1) / ps * ps;
  }
  cxlpool_backing_t* b_ = nullptr;
};

// ---- Pools and allocation ---------------------------------------------------------------------
enum class Tier { near, far };  // the pool's fastest / slowest device

// A std::pmr::memory_resource over a pool: the pool's policy, or one device of it, or a hint.
// Throws std::bad_alloc when the pool cannot allocate. Thread-safe.
class MemoryResource final : public std::pmr::memory_resource {
 public:
  MemoryResource(cxlpool_pool_t* pool, int device = -1, uint32_t hint_flags = 0) noexcept
      : pool_(pool), hint_{hint_flags, device} {}
  cxlpool_pool_t* pool() const noexcept { return pool_; }
  int device() const noexcept { return hint_.device; }

 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    void* p = alignment <= alignof(std::max_align_t) ? cxlpool_malloc_hint(pool_, bytes, &hint_)
                                                     : cxlpool_aligned_alloc_hint(pool_, alignment, bytes, &hint_);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void do_deallocate(void* p, size_t, size_t) override { cxlpool_free(p); }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    auto* o = dynamic_cast<const MemoryResource*>(&other);
    return o && o->pool_ == pool_ && o->hint_.device == hint_.device && o->hint_.flags == hint_.flags;
  }
  cxlpool_pool_t* pool_;
  cxlpool_hint_t hint_;
};

// Parameters of Pool::create (a namespace-level struct so its defaults work in default
// arguments of Pool's own members).
struct PoolParams {
  std::string devices;  // comma-separated target names; empty: every target
  std::string policy;   // docs/policy.md; empty: bind:near
  std::string name;
  cxlpool_sharing_t sharing = CXLPOOL_SHARING_PRIVATE;  // what a fork() child gets (alloc.h)
};

// A pool of tiered memory (RAII). Movable, not copyable.
class Pool {
 public:
  using Params = PoolParams;
  // Throws cxlpool::Error (CXLPOOL_E_CONFIG names a bad policy token).
  static Pool create(const Topology& topo, const Params& params = {}) {
    std::error_code ec;
    auto p = create(ec, topo, params);
    if (!p) detail::check(static_cast<cxlpool_status_t>(ec.value()));
    return std::move(*p);
  }
  static std::optional<Pool> create(std::error_code& ec, const Topology& topo, const Params& params = {}) noexcept {
    cxlpool_pool_params_t* pp = nullptr;
    if (!detail::check(cxlpool_pool_params_create(&pp), ec)) return std::nullopt;
    cxlpool_status_t st = CXLPOOL_OK;
    if (!params.devices.empty()) st = cxlpool_pool_params_set_devices(pp, params.devices.c_str());
    if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_policy(pp, params.policy.c_str());
    if (st == CXLPOOL_OK && !params.name.empty()) st = cxlpool_pool_params_set_name(pp, params.name.c_str());
    if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_sharing(pp, params.sharing);
    cxlpool_pool_t* pool = nullptr;
    if (st == CXLPOOL_OK) st = cxlpool_pool_create(topo.get(), pp, &pool);
    cxlpool_pool_params_destroy(pp);
    if (!detail::check(st, ec)) return std::nullopt;
    return Pool(pool, true);
  }
  // The process default pool (CXLPOOL_DEVICES, CXLPOOL_POLICY); never destroyed.
  static Pool default_pool() {
    cxlpool_pool_t* pool = nullptr;
    detail::check(cxlpool_pool_default(&pool));
    return Pool(pool, false);
  }
  ~Pool() {
    if (pool_ && owned_) cxlpool_pool_destroy(pool_);
  }
  Pool(Pool&& o) noexcept
      : pool_(std::exchange(o.pool_, nullptr)), owned_(o.owned_), resources_(std::move(o.resources_)) {}
  Pool& operator=(Pool&& o) noexcept {
    std::swap(pool_, o.pool_);
    std::swap(owned_, o.owned_);
    std::swap(resources_, o.resources_);
    return *this;
  }

  // Raw allocation: throws std::bad_alloc; allocate_nothrow returns nullptr with errno set.
  void* allocate(size_t n, size_t alignment = alignof(std::max_align_t)) {
    void* p = allocate_nothrow(n, alignment);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void* allocate_nothrow(size_t n, size_t alignment = alignof(std::max_align_t)) noexcept {
    return alignment <= alignof(std::max_align_t) ? cxlpool_malloc(pool_, n)
                                                  : cxlpool_aligned_alloc(pool_, alignment, n);
  }
  static void deallocate(void* p) noexcept { cxlpool_free(p); }

  int device_count() const {
    int n = 0;
    detail::check(cxlpool_pool_device_count(pool_, &n));
    return n;
  }
  std::string_view device_name(int device) const {
    const char* name = nullptr;
    detail::check(cxlpool_pool_get_device(pool_, device, &name, nullptr));
    return name;
  }
  int device_tier(int device) const {
    int tier = 0;
    detail::check(cxlpool_pool_get_device(pool_, device, nullptr, &tier));
    return tier;
  }
  int find_device(const std::string& name) const {
    int i = -1;
    detail::check(cxlpool_pool_find_device(pool_, name.c_str(), &i));
    return i;
  }
  int device(Tier t) const {
    int best = 0;
    for (int i = 1, n = device_count(); i < n; ++i)
      if (t == Tier::near ? device_tier(i) < device_tier(best) : device_tier(i) > device_tier(best)) best = i;
    return best;
  }
  std::string_view policy() const {
    const char* text = nullptr;
    detail::check(cxlpool_pool_policy(pool_, &text));
    return text;
  }
  cxlpool_stats_t stats(int device = -1) const {
    cxlpool_stats_t s{};
    detail::check(cxlpool_pool_get_stats(pool_, device, &s));
    return s;
  }
  std::string stats_json() const {
    char* s = nullptr;
    detail::check(cxlpool_pool_stats_json(pool_, &s));
    std::string out(s);
    cxlpool_string_free(s);
    return out;
  }
  uint64_t trim() {
    uint64_t released = 0;
    detail::check(cxlpool_pool_trim(pool_, &released));
    return released;
  }

  // memory_resources owned by the pool (stable addresses while the pool lives):
  // placement by policy, pinned to a device or tier, or with hint flags.
  MemoryResource& resource() { return resource_for(-1, 0); }
  MemoryResource& resource(int device) {
    if (device < 0 || device >= device_count()) detail::check(CXLPOOL_E_NOT_FOUND);
    return resource_for(device, 0);
  }
  MemoryResource& resource(Tier t) { return resource_for(device(t), 0); }
  MemoryResource& resource(const std::string& device_name) { return resource_for(find_device(device_name), 0); }
  MemoryResource& hinted(uint32_t hint_flags) { return resource_for(-1, hint_flags); }

  cxlpool_pool_t* get() const noexcept { return pool_; }

 private:
  Pool(cxlpool_pool_t* p, bool owned) noexcept : pool_(p), owned_(owned) {}
  MemoryResource& resource_for(int device, uint32_t flags) {
    MemoryResource wanted(pool_, device, flags);
    for (auto& r : resources_)
      if (r->is_equal(wanted)) return *r;
    resources_.push_back(std::make_unique<MemoryResource>(pool_, device, flags));
    return *resources_.back();
  }
  cxlpool_pool_t* pool_ = nullptr;
  bool owned_ = false;
  std::vector<std::unique_ptr<MemoryResource>> resources_;
};

// An STL allocator over a pool (optionally pinned to one device). Stateful; equal when it
// allocates from the same pool and device.
template <class T>
class Allocator {
 public:
  using value_type = T;
  explicit Allocator(cxlpool_pool_t* pool = nullptr, int device = -1) noexcept : pool_(pool), device_(device) {}
  explicit Allocator(const Pool& pool, int device = -1) noexcept : pool_(pool.get()), device_(device) {}
  template <class U>
  Allocator(const Allocator<U>& o) noexcept : pool_(o.pool()), device_(o.device()) {}
  T* allocate(size_t n) {
    if (n > std::numeric_limits<size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    cxlpool_hint_t hint{0, device_};
    void* p = alignof(T) <= alignof(std::max_align_t)
                  ? cxlpool_malloc_hint(pool_, n * sizeof(T), &hint)
                  : cxlpool_aligned_alloc_hint(pool_, alignof(T), n * sizeof(T), &hint);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { cxlpool_free(p); }
  cxlpool_pool_t* pool() const noexcept { return pool_; }
  int device() const noexcept { return device_; }
  template <class U>
  bool operator==(const Allocator<U>& o) const noexcept {
    return pool_ == o.pool() && device_ == o.device();
  }

 private:
  cxlpool_pool_t* pool_;
  int device_;
};

// Where a pointer lives, or nullopt for a pointer cxlpool did not allocate.
inline std::optional<cxlpool_ptr_info_t> ptr_info(const void* p) noexcept {
  cxlpool_ptr_info_t info{};
  if (!p || cxlpool_ptr_info(p, &info) != CXLPOOL_OK) return std::nullopt;
  return info;
}

// NUMA node of each page in [addr, addr + pages * page size) (negative errno if absent).
inline std::vector<int> query_nodes(const void* addr, size_t pages) {
  std::vector<int> out(pages, 0);
  detail::check(cxlpool_memory_query_nodes(addr, pages, out.data()));
  return out;
}

// ---- Elastic capacity (cxlpool/device.h) -------------------------------------------------

// Capacity of a device open in this process (docs/devices.md).
// Each call throws cxlpool::Error on failure (BUSY names what could not move).
namespace device {
inline cxlpool_device_capacity_t capacity(const std::string& name) {
  cxlpool_device_capacity_t c{};
  detail::check(cxlpool_device_get_capacity(name.c_str(), &c));
  return c;
}
inline std::vector<std::pair<uint64_t, uint64_t>> extents(const std::string& name) {
  size_t n = 0;
  detail::check(cxlpool_device_get_extents(name.c_str(), nullptr, 0, &n));
  std::vector<uint64_t> pairs(2 * n + 2);
  detail::check(cxlpool_device_get_extents(name.c_str(), pairs.data(), n + 1, &n));
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (size_t i = 0; i < n && 2 * i + 1 < pairs.size(); ++i) out.emplace_back(pairs[2 * i], pairs[2 * i + 1]);
  return out;
}
inline cxlpool_capacity_report_t resize(const std::string& name, uint64_t bytes) {
  cxlpool_capacity_report_t r{};
  detail::check(cxlpool_device_resize(name.c_str(), bytes, &r));
  return r;
}
inline cxlpool_capacity_report_t add_extent(const std::string& name, uint64_t offset, uint64_t length) {
  cxlpool_capacity_report_t r{};
  detail::check(cxlpool_device_add_extent(name.c_str(), offset, length, &r));
  return r;
}
inline cxlpool_capacity_report_t withdraw_extent(const std::string& name, uint64_t offset, uint64_t length) {
  cxlpool_capacity_report_t r{};
  detail::check(cxlpool_device_withdraw_extent(name.c_str(), offset, length, &r));
  return r;
}
// An offer of (offset, length) extents; throws on the first rejection (those before it and
// after it are judged on their own: capacity(name) shows what was accepted).
inline cxlpool_capacity_report_t offer_extents(const std::string& name,
                                               const std::vector<std::pair<uint64_t, uint64_t>>& extents) {
  std::vector<uint64_t> pairs;
  for (const auto& [offset, length] : extents) {
    pairs.push_back(offset);
    pairs.push_back(length);
  }
  cxlpool_capacity_report_t r{};
  detail::check(cxlpool_device_offer_extents(name.c_str(), pairs.data(), extents.size(), nullptr, &r));
  return r;
}
inline cxlpool_capacity_report_t release_extent(const std::string& name, uint64_t offset, uint64_t length,
                                                uint32_t deadline_ms = 0, bool force = false) {
  cxlpool_capacity_report_t r{};
  detail::check(
      cxlpool_device_release_extent(name.c_str(), offset, length, deadline_ms, force ? CXLPOOL_RELEASE_FORCE : 0u, &r));
  return r;
}
// Numa devices follow their node's memory now (cxlpool_device_watch_nodes); the devices changed.
inline size_t watch_nodes() {
  size_t changed = 0;
  detail::check(cxlpool_device_watch_nodes(&changed));
  return changed;
}
}  // namespace device

// ---- KV cache (cxlpool/kvcache.h) ----------------------------------------------------------

// A model's KV geometry with its sizes; kv_preset("opt-6.7b", 16) for known models.
struct KvGeometry {
  cxlpool_kv_geometry_t c{};
  uint64_t bytes_per_token() const {
    uint64_t t = 0;
    detail::check(cxlpool_kv_geometry_sizes(&c, &t, nullptr));
    return t;
  }
  uint64_t bytes_per_block() const {
    uint64_t b = 0;
    detail::check(cxlpool_kv_geometry_sizes(&c, nullptr, &b));
    return b;
  }
  // Offset inside a block of one token's keys (kv 0) or values (kv 1) of one layer.
  uint64_t offset(uint32_t layer, uint32_t kv, uint32_t token) const {
    uint64_t o = 0;
    detail::check(cxlpool_kv_block_offset(&c, layer, kv, token, &o));
    return o;
  }
};
inline KvGeometry kv_preset(const std::string& model, uint32_t tokens_per_block) {
  KvGeometry g;
  detail::check(cxlpool_kv_geometry_preset(model.c_str(), tokens_per_block, &g.c));
  return g;
}

class KvArena;

// A sequence's block table (owned: destroyed with the object).
class KvSequence {
 public:
  KvSequence() = default;
  explicit KvSequence(cxlpool_kv_seq_t* s) noexcept : s_(s) {}
  KvSequence(KvSequence&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  KvSequence& operator=(KvSequence&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~KvSequence() { reset(); }
  void reset() noexcept {
    if (s_) cxlpool_kv_seq_destroy(std::exchange(s_, nullptr));
  }
  // Returns how many leading tokens of this call were found in the prefix cache.
  size_t append(const int32_t* tokens, size_t n) {
    size_t reused = 0;
    detail::check(cxlpool_kv_seq_append(s_, tokens, n, &reused));
    return reused;
  }
  size_t append(const std::vector<int32_t>& tokens) { return append(tokens.data(), tokens.size()); }
  void seal(uint64_t tokens) { detail::check(cxlpool_kv_seq_seal(s_, tokens)); }
  cxlpool_kv_seq_info_t info() const {
    cxlpool_kv_seq_info_t i{};
    detail::check(cxlpool_kv_seq_info(s_, &i));
    return i;
  }
  void* block(uint64_t index, uint32_t* tier = nullptr) const {
    void* p = nullptr;
    detail::check(cxlpool_kv_seq_block(s_, index, &p, tier));
    return p;
  }
  cxlpool_kv_handle_t export_handle(uint64_t tokens = 0) {
    cxlpool_kv_handle_t h{};
    detail::check(cxlpool_kv_seq_export(s_, tokens, &h));
    return h;
  }
  cxlpool_kv_seq_t* get() const noexcept { return s_; }

 private:
  cxlpool_kv_seq_t* s_ = nullptr;
};

// An arena over shared pools (not owned: they must outlive it), nearest first.
class KvArena {
 public:
  KvArena(const KvGeometry& g, const std::vector<cxlpool_shared_pool_t*>& pools,
          const cxlpool_kv_params_t* params = nullptr) {
    detail::check(cxlpool_kv_arena_create(&g.c, pools.data(), pools.size(), params, &a_));
  }
  KvArena(KvArena&& o) noexcept : a_(std::exchange(o.a_, nullptr)) {}
  KvArena(const KvArena&) = delete;
  KvArena& operator=(const KvArena&) = delete;
  // Sequences must be gone first (destroying an arena with live sequences throws BUSY from
  // destroy(); the destructor then leaks the arena rather than freeing blocks in use).
  ~KvArena() {
    if (a_) cxlpool_kv_arena_destroy(a_);
  }
  void destroy() {
    if (a_) detail::check(cxlpool_kv_arena_destroy(a_));
    a_ = nullptr;
  }
  KvSequence sequence() {
    cxlpool_kv_seq_t* s = nullptr;
    detail::check(cxlpool_kv_seq_create(a_, &s));
    return KvSequence(s);
  }
  cxlpool_kv_stats_t stats() const {
    cxlpool_kv_stats_t st{};
    detail::check(cxlpool_kv_arena_stats(a_, &st));
    return st;
  }
  cxlpool_kv_arena_t* get() const noexcept { return a_; }

 private:
  cxlpool_kv_arena_t* a_ = nullptr;
};

// A consumer's leased, zero-copy view of an exported sequence (released with the object).
class KvView {
 public:
  KvView(const std::vector<cxlpool_shared_pool_t*>& pools, const cxlpool_kv_handle_t& handle,
         const KvGeometry* expected = nullptr) {
    detail::check(cxlpool_kv_import(pools.data(), pools.size(), expected ? &expected->c : nullptr, &handle, &v_));
  }
  // Takes over a view made another way (a landing view, cxlpool::KvRemote::import).
  explicit KvView(cxlpool_kv_view_t* adopt) noexcept : v_(adopt) {}
  KvView(KvView&& o) noexcept : v_(std::exchange(o.v_, nullptr)) {}
  KvView(const KvView&) = delete;
  KvView& operator=(const KvView&) = delete;
  ~KvView() {
    if (v_) cxlpool_kv_view_release(v_);
  }
  cxlpool_kv_view_info_t info() const {
    cxlpool_kv_view_info_t i{};
    detail::check(cxlpool_kv_view_info(v_, &i));
    return i;
  }
  const void* block(uint64_t index) const {
    const void* p = nullptr;
    detail::check(cxlpool_kv_view_block(v_, index, &p));
    return p;
  }
  cxlpool_kv_view_t* get() const noexcept { return v_; }

 private:
  cxlpool_kv_view_t* v_ = nullptr;
};

}  // namespace cxlpool

template <>
struct std::is_error_code_enum<cxlpool_status_t> : std::true_type {};

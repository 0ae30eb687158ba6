// SPDX-License-Identifier: MIT
// cxlpool C++ layer: header-only RAII wrappers over the C ABI. Throwing calls raise
// cxlpool::Error (a std::system_error in cxlpool::category()); the std::error_code overloads
// never throw. Thread-safety is that of the wrapped C objects (see the C headers).
#pragma once

#include <cstdint>
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
  Config& sysfs_root(const std::string& dir) { return detail::check(cxlpool_config_set_sysfs_root(cfg_, dir.c_str())), *this; }
  Config& procfs_root(const std::string& dir) { return detail::check(cxlpool_config_set_procfs_root(cfg_, dir.c_str())), *this; }
  Config& devices(const std::string& spec) { return detail::check(cxlpool_config_set_devices(cfg_, spec.c_str())), *this; }
  Config& config_file(const std::string& path) { return detail::check(cxlpool_config_set_config_file(cfg_, path.c_str())), *this; }
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
      : backing_(std::exchange(o.backing_, nullptr)), addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
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

// NUMA node of each page in [addr, addr + pages * page size) (negative errno if absent).
inline std::vector<int> query_nodes(const void* addr, size_t pages) {
  std::vector<int> out(pages, 0);
  detail::check(cxlpool_memory_query_nodes(addr, pages, out.data()));
  return out;
}

}  // namespace cxlpool

template <>
struct std::is_error_code_enum<cxlpool_status_t> : std::true_type {};

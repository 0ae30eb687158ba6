// SPDX-License-Identifier: MIT
// C ABI for the elastic capacity of open devices (cxlpool/device.h): argument checks around
// the allocator's capacity changes (alloc/elastic.cpp), which move the pools' memory out of a
// withdrawn range before the device frees it.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "alloc/pool.hpp"
#include "capi/capi_guard.hpp"
#include "cxlpool/device.h"
#include "device/registry.hpp"

using namespace cxlpool::detail;

namespace {

std::shared_ptr<Device> open_device(const char* device, const char* function) {
  require(device && *device, function, "device is NULL or empty");
  cxlpool_status_t status = CXLPOOL_OK;
  std::string message;
  std::shared_ptr<Device> d = alloc::find_device(device, &status, &message);
  if (!d) fail(status, std::string(function) + ": " + message);
  return d;
}

void to_public(const alloc::CapacityReport& r, cxlpool_capacity_report_t* out) {
  if (!out) return;
  *out = cxlpool_capacity_report_t{};
  out->capacity_before = r.capacity_before;
  out->capacity_after = r.capacity_after;
  out->trimmed_bytes = r.trimmed_bytes;
  out->relocated = r.relocated;
  out->evacuated_units = r.evacuated_units;
  out->evacuated_bytes = r.evacuated_bytes;
  out->returned_units = r.returned_units;
  out->returned_bytes = r.returned_bytes;
  out->lost_units = r.lost_units;
  out->lost_bytes = r.lost_bytes;
}

template <class F>
cxlpool_status_t change(const char* device, const char* function, cxlpool_capacity_report_t* report, F&& op) {
  return guarded([&] {
    require(device && *device, function, "device is NULL or empty");
    alloc::CapacityReport r;
    std::string message;
    cxlpool_status_t s = op(std::string(device), &r, &message);
    to_public(r, report);
    if (s != CXLPOOL_OK) fail(s, std::string(function) + ": " + message);
  });
}

}  // namespace

extern "C" {

cxlpool_status_t cxlpool_device_get_capacity(const char* device, cxlpool_device_capacity_t* out) {
  return guarded([&] {
    require(out != nullptr, "cxlpool_device_get_capacity", "out is NULL");
    require(device && *device, "cxlpool_device_get_capacity", "device is NULL or empty");
    if (!registry::find(device))
      if (std::shared_ptr<registry::SharedDevice> s = registry::find_shared(device)) {
        // A shared pool's device: its size, one extent, and what this process holds in it.
        cxlpool_device_capacity_t c{};
        c.capacity_bytes = c.space_bytes = c.max_space_bytes = s->ledger.capacity.load();
        c.committed_bytes = s->ledger.committed.load();
        c.extents = 1;
        *out = c;
        return;
      }
    std::shared_ptr<Device> d = open_device(device, "cxlpool_device_get_capacity");
    const ElasticCounters& e = d->ledger().elastic;
    cxlpool_device_capacity_t c{};
    c.capacity_bytes = d->capacity();
    c.committed_bytes = d->committed();
    c.space_bytes = d->space();
    c.extents = d->online_extents().size();
    c.grows = e.grows.load();
    c.shrinks = e.shrinks.load();
    c.refusals = e.refusals.load();
    c.relocated = e.relocated.load();
    c.evacuated_units = e.evacuated_units.load();
    c.evacuated_bytes = e.evacuated_bytes.load();
    c.forced = e.forced.load();
    c.lost_units = e.lost_units.load();
    c.lost_bytes = e.lost_bytes.load();
    c.max_space_bytes = d->max_space();
    if (const std::optional<uint64_t> node = alloc::node_memory_of(*d))  // a numa device: its node's memory
      c.max_space_bytes = std::min(c.max_space_bytes, std::max(*node, c.capacity_bytes));
    *out = c;
  });
}

cxlpool_status_t cxlpool_device_get_extents(const char* device, uint64_t* pairs, size_t max, size_t* count) {
  return guarded([&] {
    require(count != nullptr && (pairs || max == 0), "cxlpool_device_get_extents",
            "count is NULL, or pairs is NULL with max > 0");
    require(device && *device, "cxlpool_device_get_extents", "device is NULL or empty");
    std::vector<Device::Extent> online;
    if (std::shared_ptr<registry::SharedDevice> s = registry::find(device) ? nullptr : registry::find_shared(device))
      online.push_back({0, s->ledger.capacity.load()});  // a shared pool's device: all of it
    else
      online = open_device(device, "cxlpool_device_get_extents")->online_extents();
    for (size_t i = 0; i < online.size() && i < max; ++i) {
      pairs[2 * i] = online[i].lo;
      pairs[2 * i + 1] = online[i].hi;
    }
    *count = online.size();
  });
}

cxlpool_status_t cxlpool_device_resize(const char* device, uint64_t capacity, cxlpool_capacity_report_t* report) {
  return change(device, "cxlpool_device_resize", report,
                [&](const std::string& name, alloc::CapacityReport* r, std::string* m) {
                  return alloc::device_resize(name, capacity, r, m);
                });
}

cxlpool_status_t cxlpool_device_add_extent(const char* device, uint64_t offset, uint64_t length,
                                           cxlpool_capacity_report_t* report) {
  return change(device, "cxlpool_device_add_extent", report,
                [&](const std::string& name, alloc::CapacityReport* r, std::string* m) {
                  return alloc::device_add_extent(name, offset, length, r, m);
                });
}

cxlpool_status_t cxlpool_device_withdraw_extent(const char* device, uint64_t offset, uint64_t length,
                                                cxlpool_capacity_report_t* report) {
  return change(device, "cxlpool_device_withdraw_extent", report,
                [&](const std::string& name, alloc::CapacityReport* r, std::string* m) {
                  return alloc::device_withdraw_extent(name, offset, length, r, m);
                });
}

cxlpool_status_t cxlpool_device_offer_extents(const char* device, const uint64_t* pairs, size_t count,
                                              cxlpool_status_t* verdicts, cxlpool_capacity_report_t* report) {
  return change(device, "cxlpool_device_offer_extents", report,
                [&](const std::string& name, alloc::CapacityReport* r, std::string* m) {
                  require(pairs != nullptr && count > 0 && count <= 4096, "cxlpool_device_offer_extents",
                          "pairs is NULL, or count is not 1..4096");
                  std::vector<Device::Extent> extents;
                  for (size_t i = 0; i < count; ++i) {
                    const uint64_t lo = pairs[2 * i], len = pairs[2 * i + 1];
                    // A wrapping extent is rejected by its end being before its start.
                    extents.push_back({lo, lo + len < lo ? 0 : lo + len});
                  }
                  std::vector<cxlpool_status_t> v;
                  cxlpool_status_t s = alloc::device_offer_extents(name, extents, &v, r, m);
                  if (verdicts)
                    for (size_t i = 0; i < count; ++i) verdicts[i] = i < v.size() ? v[i] : s;
                  return s;
                });
}

cxlpool_status_t cxlpool_device_release_extent(const char* device, uint64_t offset, uint64_t length,
                                               uint32_t deadline_ms, unsigned flags,
                                               cxlpool_capacity_report_t* report) {
  return change(device, "cxlpool_device_release_extent", report,
                [&](const std::string& name, alloc::CapacityReport* r, std::string* m) {
                  require((flags & ~CXLPOOL_RELEASE_FORCE) == 0, "cxlpool_device_release_extent",
                          "unknown flags (only CXLPOOL_RELEASE_FORCE)");
                  require(deadline_ms <= 86400000u, "cxlpool_device_release_extent",
                          "deadline_ms above 86,400,000 (a day)");
                  return alloc::device_release_extent(name, offset, length, deadline_ms,
                                                      (flags & CXLPOOL_RELEASE_FORCE) != 0, r, nullptr, m);
                });
}

cxlpool_status_t cxlpool_device_set_lost_handler(cxlpool_lost_fn fn, void* ctx) {
  return guarded([&] { alloc::set_lost_handler(fn, ctx); });
}

cxlpool_status_t cxlpool_device_watch_nodes(size_t* changed) {
  return guarded([&] {
    const size_t n = alloc::node_watch_pass();
    if (changed) *changed = n;
  });
}

}  // extern "C"

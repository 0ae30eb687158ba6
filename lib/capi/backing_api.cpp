// SPDX-License-Identifier: MIT
// C ABI for raw backings (a handle on the process's Device for a target) and the
// page-placement query. Raw backing ranges are shared memory: visible through the device's
// descriptor and shared with forked children.
#include <mutex>

#include "alloc/pool.hpp"
#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "cxlpool/backing.h"
#include "device/registry.hpp"
#include "os/os.hpp"

using namespace cxlpool::detail;

namespace {
std::mutex g_clients_mu;
uint64_t g_clients_used = 0;  // bit i: ledger client kFirstRawClient + i is taken

int take_client() {
  std::lock_guard<std::mutex> lock(g_clients_mu);
  for (int i = 0; i < kMaxLedgerClients - kFirstRawClient; ++i)
    if (!(g_clients_used >> i & 1)) {
      g_clients_used |= uint64_t(1) << i;
      return kFirstRawClient + i;
    }
  fail(CXLPOOL_E_NO_MEMORY, "cxlpool_backing_open: " + std::to_string(kMaxLedgerClients - kFirstRawClient) +
                                " backings are open already; close some first");
}

void give_client(int client) {
  std::lock_guard<std::mutex> lock(g_clients_mu);
  g_clients_used &= ~(uint64_t(1) << (client - kFirstRawClient));
}

void check(const cxlpool_backing_t* b, cxlpool_status_t s, const char* op, const void* addr, size_t len,
           const DeviceError& err) {
  if (s != CXLPOOL_OK) fail(s, b->device->describe(op, addr, len, err));
}
}  // namespace

extern "C" {

cxlpool_status_t cxlpool_backing_open(const cxlpool_topology_t* topology, size_t index, cxlpool_backing_t** out) {
  return guarded([&] {
    require(topology && out, "cxlpool_backing_open", "topology or out is NULL");
    auto& ts = topology->model.targets;
    if (index >= ts.size())
      fail(CXLPOOL_E_NOT_FOUND, "cxlpool_backing_open: target index " + std::to_string(index) + " out of range");
    auto b = std::make_unique<cxlpool_backing>();
    b->device = registry::acquire(ts[index].backing);
    b->client = take_client();
    *out = b.release();
  });
}

cxlpool_status_t cxlpool_backing_close(cxlpool_backing_t* backing) {
  return guarded([&] {
    if (!backing) return;
    if (backing->device->reservations_of(backing->client))
      fail(CXLPOOL_E_BUSY, "cxlpool_backing_close: device '" + backing->device->name() +
                               "' still has live reservations of this backing; release them first");
    give_client(backing->client);
    delete backing;
  });
}

cxlpool_status_t cxlpool_backing_get_caps(const cxlpool_backing_t* backing, cxlpool_backing_caps_t* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_get_caps", "backing or out is NULL");
    *out = backing->device->caps();
    out->capacity_bytes = backing->device->capacity();  // now: it changes (device.h)
  });
}

cxlpool_status_t cxlpool_backing_get_usage(const cxlpool_backing_t* backing, cxlpool_backing_usage_t* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_get_usage", "backing or out is NULL");
    const Device& d = *backing->device;
    cxlpool_backing_usage_t u{};
    u.capacity_bytes = d.capacity();
    u.reserved_bytes = d.reserved_bytes();
    u.committed_bytes = d.committed();
    u.peak_committed_bytes = d.ledger().peak.load(std::memory_order_relaxed);
    u.reservations = d.reservation_count();
    *out = u;
  });
}

cxlpool_status_t cxlpool_backing_reserve(cxlpool_backing_t* backing, size_t size, size_t alignment, void** out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_reserve", "backing or out is NULL");
    DeviceError err;
    void* p = nullptr;
    check(backing, backing->device->reserve(size, alignment, 0, Sharing::kShared, backing->client, &p, &err), "reserve",
          nullptr, size, err);
    *out = p;
  });
}

cxlpool_status_t cxlpool_backing_map(cxlpool_backing_t* backing, uint64_t offset, size_t size, void** out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_map", "backing or out is NULL");
    DeviceError err;
    void* p = nullptr;
    check(backing, backing->device->map_range(offset, size, backing->client, &p, &err), "map",
          reinterpret_cast<void*>(offset), size, err);
    *out = p;
  });
}

cxlpool_status_t cxlpool_backing_commit(cxlpool_backing_t* backing, void* addr, size_t len, uint32_t flags) {
  return guarded([&] {
    require(backing, "cxlpool_backing_commit", "backing is NULL");
    if (flags & ~uint32_t(CXLPOOL_COMMIT_POPULATE))
      fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_backing_commit: unknown flags " + std::to_string(flags));
    DeviceError err;
    check(backing, backing->device->commit(addr, len, flags & CXLPOOL_COMMIT_POPULATE, backing->client, &err), "commit",
          addr, len, err);
  });
}

cxlpool_status_t cxlpool_backing_decommit(cxlpool_backing_t* backing, void* addr, size_t len) {
  return guarded([&] {
    require(backing, "cxlpool_backing_decommit", "backing is NULL");
    DeviceError err;
    check(backing, backing->device->decommit(addr, len, backing->client, &err), "decommit", addr, len, err);
  });
}

cxlpool_status_t cxlpool_backing_release(cxlpool_backing_t* backing, void* addr) {
  return guarded([&] {
    require(backing && addr, "cxlpool_backing_release", "backing or addr is NULL");
    DeviceError err;
    check(backing, backing->device->release(addr, backing->client, &err), "release", addr, 0, err);
  });
}

cxlpool_status_t cxlpool_backing_offset_of(const cxlpool_backing_t* backing, const void* addr, uint64_t* out) {
  return guarded([&] {
    require(backing && addr && out, "cxlpool_backing_offset_of", "backing, addr or out is NULL");
    uint64_t off = 0;
    if (backing->device->offset_of(addr, &off) != CXLPOOL_OK)
      fail(CXLPOOL_E_NOT_FOUND, "cxlpool_backing_offset_of: address is not inside a reservation of device '" +
                                    backing->device->name() + "'");
    *out = off;
  });
}

cxlpool_status_t cxlpool_backing_fd(const cxlpool_backing_t* backing, int* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_fd", "backing or out is NULL");
    if (backing->device->spec().kind == CXLPOOL_BACKING_NUMA)
      fail(CXLPOOL_E_NOT_SUPPORTED, "cxlpool_backing_fd: device '" + backing->device->name() + "' is not fd-backed");
    *out = backing->device->shared_fd();
  });
}

cxlpool_status_t cxlpool_memory_query_nodes(const void* addr, size_t pages, int* out) {
  return guarded([&] {
    require(addr && out && pages, "cxlpool_memory_query_nodes", "addr or out is NULL, or pages is 0");
    require(reinterpret_cast<uintptr_t>(addr) % cxlpool::os::page_size() == 0, "cxlpool_memory_query_nodes",
            "addr is not page-aligned");
    cxlpool::os::query_page_nodes(addr, pages, out);
  });
}

}  // extern "C"

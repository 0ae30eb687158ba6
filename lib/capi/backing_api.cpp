// SPDX-License-Identifier: MIT
// C ABI for backings and the page-placement query.
#include "capi/capi_guard.hpp"
#include "capi/handles.hpp"
#include "cxlpool/backing.h"
#include "os/os.hpp"

using namespace cxlpool::detail;

extern "C" {

cxlpool_status_t cxlpool_backing_open(const cxlpool_topology_t* topology, size_t index, cxlpool_backing_t** out) {
  return guarded([&] {
    require(topology && out, "cxlpool_backing_open", "topology or out is NULL");
    auto& ts = topology->model.targets;
    if (index >= ts.size())
      fail(CXLPOOL_E_NOT_FOUND, "cxlpool_backing_open: target index " + std::to_string(index) + " out of range");
    auto b = std::make_unique<cxlpool_backing>();
    b->impl = Backing::open(ts[index].backing);
    *out = b.release();
  });
}

cxlpool_status_t cxlpool_backing_close(cxlpool_backing_t* backing) {
  return guarded([&] {
    if (!backing) return;
    if (backing->impl->busy())
      fail(CXLPOOL_E_BUSY, "cxlpool_backing_close: device '" + backing->impl->name() +
                               "' still has live reservations; release them first");
    delete backing;
  });
}

cxlpool_status_t cxlpool_backing_get_caps(const cxlpool_backing_t* backing, cxlpool_backing_caps_t* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_get_caps", "backing or out is NULL");
    *out = backing->impl->caps();
  });
}

cxlpool_status_t cxlpool_backing_get_usage(const cxlpool_backing_t* backing, cxlpool_backing_usage_t* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_get_usage", "backing or out is NULL");
    *out = backing->impl->usage();
  });
}

cxlpool_status_t cxlpool_backing_reserve(cxlpool_backing_t* backing, size_t size, size_t alignment, void** out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_reserve", "backing or out is NULL");
    *out = backing->impl->reserve(size, alignment);
  });
}

cxlpool_status_t cxlpool_backing_map(cxlpool_backing_t* backing, uint64_t offset, size_t size, void** out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_map", "backing or out is NULL");
    *out = backing->impl->map(offset, size);
  });
}

cxlpool_status_t cxlpool_backing_commit(cxlpool_backing_t* backing, void* addr, size_t len, uint32_t flags) {
  return guarded([&] {
    require(backing, "cxlpool_backing_commit", "backing is NULL");
    backing->impl->commit(addr, len, flags);
  });
}

cxlpool_status_t cxlpool_backing_decommit(cxlpool_backing_t* backing, void* addr, size_t len) {
  return guarded([&] {
    require(backing, "cxlpool_backing_decommit", "backing is NULL");
    backing->impl->decommit(addr, len);
  });
}

cxlpool_status_t cxlpool_backing_release(cxlpool_backing_t* backing, void* addr) {
  return guarded([&] {
    require(backing && addr, "cxlpool_backing_release", "backing or addr is NULL");
    backing->impl->release(addr);
  });
}

cxlpool_status_t cxlpool_backing_offset_of(const cxlpool_backing_t* backing, const void* addr, uint64_t* out) {
  return guarded([&] {
    require(backing && addr && out, "cxlpool_backing_offset_of", "backing, addr or out is NULL");
    *out = backing->impl->offset_of(addr);
  });
}

cxlpool_status_t cxlpool_backing_fd(const cxlpool_backing_t* backing, int* out) {
  return guarded([&] {
    require(backing && out, "cxlpool_backing_fd", "backing or out is NULL");
    int fd = backing->impl->fd();
    if (fd < 0)
      fail(CXLPOOL_E_NOT_SUPPORTED, "cxlpool_backing_fd: device '" + backing->impl->name() + "' is not fd-backed");
    *out = fd;
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

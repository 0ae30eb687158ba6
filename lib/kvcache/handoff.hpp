// SPDX-License-Identifier: MIT
// Handoff of a sequence between processes: the block table an exporter writes into a shared
// pool (TableHeader, then one cxlpool_shared_handle_t per block), the check of the small
// cxlpool_kv_handle_t, and the importer's side: a View that validates everything it is given
// (a copy of the table, never the live one), leases every block and acquires its bytes; or a
// landing View whose blocks this process allocates in its own pools for bytes that arrive by
// another way (a transport such as libcxlpool_ucx), freed when the View goes.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cxlpool/kvcache.h"
#include "kvcache/geometry.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::kv {

inline constexpr uint64_t kTableMagic = 0x3142544b4c584301ull;  // "\x01CXLKTB1"
inline constexpr uint32_t kTableVersion = 1;

struct TableHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  cxlpool_kv_geometry_t geometry;
  uint64_t tokens;
  uint64_t blocks;
  uint64_t block_bytes;
  uint64_t check;  // check64 of the header (this field 0) and the handles that follow
};

TableHeader make_table_header(const Geometry& g, uint64_t tokens, uint64_t blocks,
                              const cxlpool_shared_handle_t* handles) noexcept;
// The header's check over itself (check field 0) and n handles.
uint64_t table_check(const TableHeader& h, const cxlpool_shared_handle_t* handles, uint64_t n) noexcept;
uint32_t handle_check(const cxlpool_kv_handle_t& h) noexcept;

class View {
 public:
  // Throws Failure (INVALID_ARGUMENT, CORRUPT, STALE, NOT_FOUND, ...) holding no lease.
  View(const std::vector<shared::SharedPool*>& pools, const cxlpool_kv_geometry_t* expected,
       const cxlpool_kv_handle_t& handle);
  // A landing view: blocks for `tokens` tokens of geometry allocated in pools (nearest first,
  // the next when one is full), owned by the view and writable through block_writable.
  // Throws Failure (INVALID_ARGUMENT, CAPACITY) holding no block.
  View(const std::vector<shared::SharedPool*>& pools, const cxlpool_kv_geometry_t& geometry, uint64_t tokens);
  ~View();  // releases every lease (frees every block of a landing view)
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  const Geometry& geometry() const { return g_; }
  uint64_t tokens() const { return tokens_; }
  size_t blocks() const { return blocks_.size(); }
  // Block i, after checking that this participant may still use its pool (EVICTED,
  // DEVICE_FAILED) and that the pool was not closed (INVALID_ARGUMENT).
  const void* block(size_t i) const;
  // Block i of a landing view, to be written (INVALID_ARGUMENT for an imported view).
  void* block_writable(size_t i) const;
  bool landing() const { return landing_; }
  // Pool p was closed (its leases went with it): its blocks are forgotten, never released.
  void pool_gone(const shared::SharedPool* p) noexcept;

 private:
  void release_all() noexcept;
  Geometry g_;
  uint64_t tokens_ = 0;
  bool landing_ = false;
  std::vector<std::pair<shared::SharedPool*, void*>> blocks_;  // leased (owned by a landing view)
};

}  // namespace cxlpool::detail::kv

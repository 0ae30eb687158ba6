// SPDX-License-Identifier: MIT
// Handoff (handoff.hpp): the block table's header and checks, and the importer's View.
#include "kvcache/handoff.hpp"

#include <cstring>

#include "common/error.hpp"

namespace cxlpool::detail::kv {
namespace {

constexpr uint64_t kTableSeed = 0x6b767461626c6531ull, kHandleSeed = 0x6b7668616e646c65ull;
constexpr size_t kHandleBytes = sizeof(cxlpool_shared_handle_t);

shared::SharedPool* pool_named(const std::vector<shared::SharedPool*>& pools, const cxlpool_shared_handle_t& h) {
  for (shared::SharedPool* p : pools) {
    const auto& id = p->view().sb().pool_id;
    if (id[0] == h.pool_id[0] && id[1] == h.pool_id[1]) return p;
  }
  return nullptr;
}

}  // namespace

uint64_t table_check(const TableHeader& h, const cxlpool_shared_handle_t* handles, uint64_t n) noexcept {
  TableHeader z = h;
  z.check = 0;
  return check64(&z, sizeof z, kTableSeed) ^ check64(handles, size_t(n) * kHandleBytes, kTableSeed + 1);
}

TableHeader make_table_header(const Geometry& g, uint64_t tokens, uint64_t blocks,
                              const cxlpool_shared_handle_t* handles) noexcept {
  TableHeader h{};
  h.magic = kTableMagic;
  h.version = kTableVersion;
  h.header_bytes = sizeof(TableHeader);
  h.geometry = g.c;
  h.tokens = tokens;
  h.blocks = blocks;
  h.block_bytes = g.block_bytes;
  h.check = table_check(h, handles, blocks);
  return h;
}

uint32_t handle_check(const cxlpool_kv_handle_t& h) noexcept {
  cxlpool_kv_handle_t z = h;
  z.check = 0;
  return uint32_t(check64(&z, sizeof z, kHandleSeed));
}

View::View(const std::vector<shared::SharedPool*>& pools, const cxlpool_kv_geometry_t* expected,
           const cxlpool_kv_handle_t& handle) {
  constexpr const char* kWho = "cxlpool_kv_import";
  if (expected) make_geometry(*expected, "cxlpool_kv_import (expected)");
  if (handle_check(handle) != handle.check)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         std::string(kWho) + ": the handle fails its check (damaged in transit, or forged)");
  if (handle.blocks == 0 || handle.tokens == 0)
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": the handle names no tokens");
  shared::SharedPool* tp = pool_named(pools, handle.descriptor);
  if (!tp) fail(CXLPOOL_E_NOT_FOUND, std::string(kWho) + ": the block table is in a pool not given to this call");
  size_t size = 0;
  void* live = tp->import_block(handle.descriptor, &size);  // validates bounds and generation
  // A private copy, read once: the exporter (or anyone with the pool mapped) cannot change
  // what is validated after it was validated.
  std::vector<unsigned char> copy;
  try {
    const uint64_t want = sizeof(TableHeader) + uint64_t(handle.blocks) * kHandleBytes;
    if (size < want)
      fail(CXLPOOL_E_CORRUPT, std::string(kWho) + ": the block table is " + std::to_string(size) +
                                  " bytes, the handle says " + std::to_string(handle.blocks) + " blocks (" +
                                  std::to_string(want) + " bytes)");
    tp->acquire(live, size_t(want));
    copy.resize(size_t(want));
    std::memcpy(copy.data(), live, copy.size());
  } catch (...) {
    tp->release(live);
    throw;
  }
  tp->release(live);
  TableHeader h;
  std::memcpy(&h, copy.data(), sizeof h);
  const auto* handles = reinterpret_cast<const cxlpool_shared_handle_t*>(copy.data() + sizeof h);
  auto corrupt = [&](const std::string& what) { fail(CXLPOOL_E_CORRUPT, std::string(kWho) + ": block table " + what); };
  if (h.magic != kTableMagic || h.header_bytes != sizeof(TableHeader)) corrupt("has no cxlpool header");
  if (h.version != kTableVersion) corrupt("version " + std::to_string(h.version) + " (this library reads 1)");
  if (h.check != table_check(h, handles, handle.blocks)) corrupt("fails its checksum");
  if (h.blocks != handle.blocks || h.tokens != handle.tokens) corrupt("does not match the handle");
  g_ = make_geometry(h.geometry, kWho);
  const uint64_t T = g_.c.tokens_per_block;
  if (h.block_bytes != g_.block_bytes || h.tokens > h.blocks * T || h.tokens <= (h.blocks - 1) * T)
    corrupt("sizes do not agree with its geometry");
  if (expected && !same_shape(*expected, h.geometry)) {
    auto shape = [](const cxlpool_kv_geometry_t& x) {
      return std::to_string(x.layers) + " layers, " + std::to_string(x.kv_heads) + " KV heads, head_dim " +
             std::to_string(x.head_dim) + ", dtype " + std::to_string(x.dtype) + ", " +
             std::to_string(x.tokens_per_block) + " tokens per block";
    };
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": the exporter's geometry (" + shape(h.geometry) +
                                         ") is not the expected one (" + shape(*expected) + ")");
  }
  tokens_ = h.tokens;
  blocks_.reserve(size_t(h.blocks));
  try {
    for (uint64_t i = 0; i < h.blocks; ++i) {
      shared::SharedPool* p = pool_named(pools, handles[i]);
      if (!p)
        fail(CXLPOOL_E_NOT_FOUND,
             std::string(kWho) + ": block " + std::to_string(i) + " is in a pool not given to this call");
      size_t bsize = 0;
      void* b = p->import_block(handles[i], &bsize);
      blocks_.push_back({p, b});
      if (bsize < g_.block_bytes)
        fail(CXLPOOL_E_CORRUPT, std::string(kWho) + ": block " + std::to_string(i) + " is " + std::to_string(bsize) +
                                    " bytes, smaller than a block (" + std::to_string(g_.block_bytes) + ")");
      p->acquire(b, size_t(g_.block_bytes));
    }
  } catch (...) {
    release_all();
    throw;
  }
}

View::View(const std::vector<shared::SharedPool*>& pools, const cxlpool_kv_geometry_t& geometry, uint64_t tokens)
    : g_(make_geometry(geometry, "cxlpool_kv_view_create")), tokens_(tokens), landing_(true) {
  constexpr const char* kWho = "cxlpool_kv_view_create";
  const uint64_t T = g_.c.tokens_per_block;
  if (tokens == 0 || tokens / T >= (uint64_t{1} << 32))
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         std::string(kWho) + ": tokens " + std::to_string(tokens) + " (1 to 2^32 blocks' worth of tokens)");
  if (g_.block_bytes > SIZE_MAX) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(kWho) + ": block too large");
  const uint64_t n = (tokens + T - 1) / T;
  try {
    blocks_.reserve(size_t(n));
    size_t from = 0;  // pools before this one were full
    for (uint64_t i = 0; i < n; ++i) {
      void* b = nullptr;
      for (; from < pools.size() && !b;) {
        try {
          b = pools[from]->alloc(size_t(g_.block_bytes));
        } catch (const Failure& f) {
          if (f.status() != CXLPOOL_E_CAPACITY) throw;
          ++from;
        }
      }
      if (!b)
        fail(CXLPOOL_E_CAPACITY, std::string(kWho) + ": no room for block " + std::to_string(i) + " of " +
                                     std::to_string(n) + " (" + std::to_string(g_.block_bytes) +
                                     " bytes each) in the pools given");
      blocks_.push_back({pools[from], b});
    }
  } catch (...) {
    release_all();
    throw;
  }
}

View::~View() { release_all(); }

void* View::block_writable(size_t i) const {
  if (!landing_)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         "cxlpool_kv_view_block_writable: an imported view is read-only (its blocks are the exporter's)");
  return const_cast<void*>(block(i));
}

const void* View::block(size_t i) const {
  const auto& [p, b] = blocks_[i];
  if (!p) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_kv_view_block: the block's pool was closed");
  p->check_usable();
  return b;
}

void View::pool_gone(const shared::SharedPool* p) noexcept {
  for (auto& e : blocks_)
    if (e.first == p) e.first = nullptr;
}

void View::release_all() noexcept {
  for (auto& [p, b] : blocks_) {
    if (!p) continue;
    try {
      if (landing_)
        p->free(b);
      else
        p->release(b);
    } catch (...) {
    }
  }
  blocks_.clear();
}

}  // namespace cxlpool::detail::kv

// SPDX-License-Identifier: MIT
// KV cache geometry: the validated shape of a model's keys and values (layers, KV heads, head
// dimension, element size, tokens per block), its sizes and the block layout, the presets of
// known models, and the 128-bit content hash that names a block of tokens after a prefix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlpool/kvcache.h"

namespace cxlpool::detail::kv {

struct Geometry {
  cxlpool_kv_geometry_t c{};  // as given (validated)
  uint32_t dtype_bytes = 0;
  uint64_t bytes_per_token = 0;  // 2 (keys, values) x layers x kv_heads x head_dim x dtype
  uint64_t block_bytes = 0;
  uint64_t row_bytes = 0;  // one token of one layer's keys (or values): kv_heads x head_dim x dtype
};

// Validates g (each bad field named, with `who` in front) and derives its sizes. Throws
// Failure(INVALID_ARGUMENT).
Geometry make_geometry(const cxlpool_kv_geometry_t& g, const char* who);
// The preset named model, or throws Failure(NOT_FOUND) listing the known ones.
cxlpool_kv_geometry_t preset(const std::string& model, uint32_t tokens_per_block);
bool same_shape(const cxlpool_kv_geometry_t& a, const cxlpool_kv_geometry_t& b) noexcept;

struct Hash128 {
  uint64_t hi = 0, lo = 0;
  bool operator==(const Hash128& o) const noexcept { return hi == o.hi && lo == o.lo; }
};
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const noexcept { return size_t(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull)); }
};
// The name of a block: its tokens after the prefix named `parent` (the zero hash for the
// first block). Not cryptographic: the arena also compares tokens and parent on every hit.
Hash128 chain_hash(const Hash128& parent, const int32_t* tokens, size_t n) noexcept;
// A 64-bit check of n bytes (block tables and handles in transit).
uint64_t check64(const void* data, size_t n, uint64_t seed) noexcept;

}  // namespace cxlpool::detail::kv

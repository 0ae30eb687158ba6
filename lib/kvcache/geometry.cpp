// SPDX-License-Identifier: MIT
// KV cache geometry (geometry.hpp): validation, sizes, presets, hashes.
#include "kvcache/geometry.hpp"

#include <cstring>

#include "common/error.hpp"
#include "common/random.hpp"

namespace cxlpool::detail::kv {
namespace {

struct Preset {
  const char* name;
  uint32_t layers, kv_heads, head_dim;
  cxlpool_kv_dtype_t dtype;
};
// Published model configurations (config.json of each: num_hidden_layers,
// num_key_value_heads, hidden_size / num_attention_heads, torch_dtype).
constexpr Preset kPresets[] = {
    {"opt-6.7b", 32, 32, 128, CXLPOOL_KV_FP16},  {"opt-13b", 40, 40, 128, CXLPOOL_KV_FP16},
    {"llama-3-8b", 32, 8, 128, CXLPOOL_KV_BF16}, {"llama-3-70b", 80, 8, 128, CXLPOOL_KV_BF16},
    {"mistral-7b", 32, 8, 128, CXLPOOL_KV_BF16},
};

constexpr auto mix = mix64;

}  // namespace

Geometry make_geometry(const cxlpool_kv_geometry_t& g, const char* who) {
  auto bad = [&](const std::string& what) {
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": geometry " + what);
  };
  if (g.layers < 1 || g.layers > 1024) bad("layers=" + std::to_string(g.layers) + " (1..1024)");
  if (g.kv_heads < 1 || g.kv_heads > 1024) bad("kv_heads=" + std::to_string(g.kv_heads) + " (1..1024)");
  if (g.head_dim < 1 || g.head_dim > 4096) bad("head_dim=" + std::to_string(g.head_dim) + " (1..4096)");
  if (g.tokens_per_block < 1 || g.tokens_per_block > 65536)
    bad("tokens_per_block=" + std::to_string(g.tokens_per_block) + " (1..65536)");
  for (uint32_t r : g.reserved)
    if (r) bad("reserved fields must be zero");
  Geometry out;
  out.c = g;
  switch (g.dtype) {
    case CXLPOOL_KV_FP16:
    case CXLPOOL_KV_BF16:
      out.dtype_bytes = 2;
      break;
    case CXLPOOL_KV_FP8:
      out.dtype_bytes = 1;
      break;
    case CXLPOOL_KV_FP32:
      out.dtype_bytes = 4;
      break;
    default:
      bad("dtype=" + std::to_string(g.dtype) + " (CXLPOOL_KV_FP16, BF16, FP8 or FP32)");
  }
  out.row_bytes = uint64_t(g.kv_heads) * g.head_dim * out.dtype_bytes;
  out.bytes_per_token = 2 * uint64_t(g.layers) * out.row_bytes;
  out.block_bytes = out.bytes_per_token * g.tokens_per_block;
  if (out.block_bytes > (uint64_t(4) << 30))
    bad("makes blocks of " + std::to_string(out.block_bytes) + " bytes (at most 4 GiB)");
  return out;
}

cxlpool_kv_geometry_t preset(const std::string& model, uint32_t tokens_per_block) {
  std::string known;
  for (const Preset& p : kPresets) {
    if (model == p.name) {
      cxlpool_kv_geometry_t g{};
      g.layers = p.layers;
      g.kv_heads = p.kv_heads;
      g.head_dim = p.head_dim;
      g.dtype = p.dtype;
      g.tokens_per_block = tokens_per_block;
      return g;
    }
    known += known.empty() ? "" : ", ";
    known += p.name;
  }
  fail(CXLPOOL_E_NOT_FOUND, "cxlpool_kv_geometry_preset: no preset '" + model + "' (known: " + known + ")");
}

bool same_shape(const cxlpool_kv_geometry_t& a, const cxlpool_kv_geometry_t& b) noexcept {
  return a.layers == b.layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.dtype == b.dtype &&
         a.tokens_per_block == b.tokens_per_block;
}

Hash128 chain_hash(const Hash128& parent, const int32_t* tokens, size_t n) noexcept {
  uint64_t a = mix(parent.hi ^ 0x243f6a8885a308d3ull), b = mix(parent.lo ^ 0x13198a2e03707344ull);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t = uint64_t(uint32_t(tokens[i])) | (uint64_t(i) << 32);
    a = mix(a ^ t) + 0x9e3779b97f4a7c15ull;
    b = mix(b + t * 0xff51afd7ed558ccdull) ^ a;
  }
  return Hash128{mix(a ^ n), mix(b ^ (n << 1))};
}

uint64_t check64(const void* data, size_t n, uint64_t seed) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = mix(seed ^ n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h ^ w) + 0x9e3779b97f4a7c15ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix(h ^ tail ^ (uint64_t(n - i) << 56));
}

}  // namespace cxlpool::detail::kv

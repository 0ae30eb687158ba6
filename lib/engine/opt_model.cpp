// SPDX-License-Identifier: MIT
// The OPT forward pass (opt_model.hpp), as Hugging Face's OPTDecoder computes it with
// do_layer_norm_before=True: q is scaled after its bias, LayerNorm eps 1e-5, no embedding scale.
#include "engine/opt_model.hpp"

#include <cmath>

#include "engine/attention.hpp"
#include "engine/error.hpp"
#include "engine/kernels.hpp"

namespace cxlpool::engine {
namespace {

constexpr float kLayerNormEps = 1e-5f;

void layer_norm(const float* x, size_t n, size_t d, const float* w, const float* b, float* y) {
  for (size_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    float mean = 0;
    for (size_t i = 0; i < d; ++i) mean += xr[i];
    mean /= float(d);
    float var = 0;
    for (size_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= float(d);
    const float inv = 1.0f / std::sqrt(var + kLayerNormEps);
    for (size_t i = 0; i < d; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

}  // namespace

OptModel::OptModel(OptWeights weights, unsigned threads) : w_(std::move(weights)), pool_(threads) {
  w_.config.validate("OptModel");
}

cxlpool_kv_geometry_t OptModel::kv_geometry(cxlpool_kv_dtype_t dtype, uint32_t tokens_per_block) const {
  cxlpool_kv_geometry_t g{};
  g.layers = w_.config.layers;
  g.kv_heads = w_.config.heads;
  g.head_dim = w_.config.head_dim();
  g.dtype = dtype;
  g.tokens_per_block = tokens_per_block;
  return g;
}

void OptModel::linear(const float* x, size_t n, size_t in, const std::vector<float>& w, const float* b, size_t out,
                      float* y) {
  const Kernels& k = kernels();
  constexpr size_t kCols = 64;
  pool_.run((out + kCols - 1) / kCols, [&](size_t task) {
    const size_t c0 = task * kCols, c1 = std::min(out, c0 + kCols);
    k.linear_cols(x, n, in, w.data(), b, c0, c1, out, y);
  });
}

std::vector<float> OptModel::forward(KvStore& kv, const int32_t* tokens, size_t n, uint64_t first, bool write_kv,
                                     std::vector<float>* all_logits) {
  const OptConfig& c = w_.config;
  const cxlpool_kv_geometry_t& g = kv.geometry();
  if (g.layers != c.layers || g.kv_heads != c.heads || g.head_dim != c.head_dim())
    fail("forward: the KV store's geometry is not this model's");
  if (n == 0) fail("forward: no tokens");
  if (first + n > kv.tokens())
    fail("forward: positions up to " + std::to_string(first + n) + " but the store holds " +
         std::to_string(kv.tokens()));
  if (first + n > c.max_positions)
    fail("forward: position " + std::to_string(first + n - 1) + " beyond the model's " +
         std::to_string(c.max_positions) + " positions");
  const size_t d = c.hidden, f = c.ffn;
  std::vector<float> x(n * d), h(n * d), q(n * d), k(n * d), v(n * d), att(n * d), ff(n * f);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || uint32_t(tokens[i]) >= c.vocab)
      fail("forward: token id " + std::to_string(tokens[i]) + " outside the vocabulary (0.." +
           std::to_string(c.vocab - 1) + ")");
    const float* e = w_.embed_tokens.data() + size_t(tokens[i]) * d;
    const float* p = w_.embed_positions.data() + size_t(first + i + kOptPositionOffset) * d;
    for (size_t j = 0; j < d; ++j) x[i * d + j] = e[j] + p[j];
  }
  const float scale = 1.0f / std::sqrt(float(c.head_dim()));
  const Kernels& kern = kernels();
  for (uint32_t l = 0; l < c.layers; ++l) {
    const OptLayerWeights& L = w_.layers[l];
    layer_norm(x.data(), n, d, L.attn_ln_w.data(), L.attn_ln_b.data(), h.data());
    linear(h.data(), n, d, L.q_w, L.q_b.data(), d, q.data());
    for (float& e : q) e *= scale;
    if (write_kv) {
      linear(h.data(), n, d, L.k_w, L.k_b.data(), d, k.data());
      linear(h.data(), n, d, L.v_w, L.v_b.data(), d, v.data());
      for (size_t i = 0; i < n; ++i) {
        kern.store_row(k.data() + i * d, g.dtype, d, kv.writable_row(l, 0, first + i));
        kern.store_row(v.data() + i * d, g.dtype, d, kv.writable_row(l, 1, first + i));
      }
    }
    attention(pool_, kv, l, q.data(), n, first, att.data());
    linear(att.data(), n, d, L.out_w, L.out_b.data(), d, h.data());
    for (size_t i = 0; i < n * d; ++i) x[i] += h[i];
    layer_norm(x.data(), n, d, L.ffn_ln_w.data(), L.ffn_ln_b.data(), h.data());
    linear(h.data(), n, d, L.fc1_w, L.fc1_b.data(), f, ff.data());
    for (float& e : ff) e = e > 0 ? e : 0;
    linear(ff.data(), n, f, L.fc2_w, L.fc2_b.data(), d, h.data());
    for (size_t i = 0; i < n * d; ++i) x[i] += h[i];
  }
  // Logits: only the last token's unless every token's is asked for.
  const size_t from = all_logits ? 0 : n - 1, rows = n - from;
  layer_norm(x.data() + from * d, rows, d, w_.final_ln_w.data(), w_.final_ln_b.data(), h.data());
  std::vector<float> logits(rows * c.vocab);
  const std::vector<float>& out = w_.lm_head.empty() ? w_.embed_tokens : w_.lm_head;
  linear(h.data(), rows, d, out, nullptr, c.vocab, logits.data());
  if (!all_logits) return logits;
  *all_logits = logits;
  return std::vector<float>(logits.end() - c.vocab, logits.end());
}

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// The OPT forward pass (decoder-only): token + learned position embeddings (OPT's +2 offset),
// per layer pre-LayerNorm multi-head causal self-attention over the KV blocks and a ReLU FFN,
// each with its residual, the final LayerNorm, logits by the tied output embedding. fp32
// compute; keys and values stored in the KV store's dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/kv_store.hpp"
#include "engine/opt_weights.hpp"
#include "engine/thread_pool.hpp"

namespace cxlpool::engine {

class OptModel {
 public:
  // threads: as ThreadPool (0: every CPU).
  explicit OptModel(OptWeights weights, unsigned threads = 0);

  const OptConfig& config() const { return w_.config; }
  const OptWeights& weights() const { return w_; }
  ThreadPool& pool() { return pool_; }
  // The KV geometry of this model: layers, kv heads = heads, head_dim; dtype FP32, FP16 or BF16.
  cxlpool_kv_geometry_t kv_geometry(cxlpool_kv_dtype_t dtype, uint32_t tokens_per_block) const;

  // Runs tokens[0..n) at positions first..first+n-1, which the store already holds slots for
  // (appended). write_kv: their keys and values are computed and written into the blocks;
  // otherwise they are there already (a prefix-cache hit, an imported view) and are only read.
  // Returns the logits of the last token; all_logits (may be null) gets every token's, n x vocab.
  std::vector<float> forward(KvStore& kv, const int32_t* tokens, size_t n, uint64_t first, bool write_kv,
                             std::vector<float>* all_logits = nullptr);

 private:
  void linear(const float* x, size_t n, size_t in, const std::vector<float>& w, const float* b, size_t out, float* y);

  OptWeights w_;
  ThreadPool pool_;
};

}  // namespace cxlpool::engine

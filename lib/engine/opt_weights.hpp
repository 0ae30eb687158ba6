// SPDX-License-Identifier: MIT
// An OPT model's weights in fp32, as Hugging Face lays them out (Linear weights [out, in]):
// loaded from a safetensors checkpoint (fp16, bf16 or fp32, converted on load; every expected
// tensor present with its shape, nothing unexpected), or made from a seed for tests and the
// bench (no download).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/opt_config.hpp"

namespace cxlpool::engine {

struct OptLayerWeights {
  std::vector<float> q_w, q_b, k_w, k_b, v_w, v_b, out_w, out_b;  // self_attn.{q,k,v,out}_proj
  std::vector<float> attn_ln_w, attn_ln_b;                        // self_attn_layer_norm
  std::vector<float> fc1_w, fc1_b, fc2_w, fc2_b;
  std::vector<float> ffn_ln_w, ffn_ln_b;  // final_layer_norm (of the layer)
};

struct OptWeights {
  OptConfig config;
  std::vector<float> embed_tokens;     // [vocab, d]
  std::vector<float> embed_positions;  // [max_positions + 2, d]
  std::vector<OptLayerWeights> layers;
  std::vector<float> final_ln_w, final_ln_b;
  std::vector<float> lm_head;  // [vocab, d]; empty: tied to embed_tokens (OPT's default)

  const float* output_embedding() const { return lm_head.empty() ? embed_tokens.data() : lm_head.data(); }
  // The tensors in opt_tensor_specs() order (lm_head excluded), for loading and writing.
  std::vector<std::vector<float>*> tensors();
  std::vector<const std::vector<float>*> tensors() const;
};

struct LoadedCheckpoint {
  OptWeights weights;
  std::string model_file, config_file;  // config_file empty: the shape was inferred
  std::string source_dtype;             // "F16", "BF16", "F32" or "mixed"
};

// path: a directory holding model.safetensors (and config.json, used when present), or a
// .safetensors file (a config.json next to it is used when present).
LoadedCheckpoint load_opt_checkpoint(const std::string& path);

// Weights from a seed (uniform; scales in opt_weights.cpp). The same seed gives the same bits
// on every machine.
OptWeights random_opt_weights(const OptConfig& config, uint64_t seed);

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// The shape of an OPT model (decoder-only, pre-LayerNorm, learned positions) and where it
// comes from: a Hugging Face config.json (only what this engine computes is accepted: OPT,
// do_layer_norm_before, ReLU, word_embed_proj_dim == hidden_size), or the checkpoint's tensor
// shapes. The Hugging Face tensor names of each weight are listed here too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cxlpool::engine {

class SafetensorsFile;

struct OptConfig {
  uint32_t hidden = 0;         // hidden_size (d)
  uint32_t heads = 0;          // num_attention_heads
  uint32_t layers = 0;         // num_hidden_layers
  uint32_t ffn = 0;            // ffn_dim
  uint32_t vocab = 0;          // vocab_size
  uint32_t max_positions = 0;  // max_position_embeddings (the position table has 2 more rows)

  uint32_t head_dim() const { return heads ? hidden / heads : 0; }
  uint64_t parameters() const;
  // Throws engine::Error naming `what` and the field when a value is out of range.
  void validate(const std::string& what) const;
  std::string describe() const;
};

// OPT's learned positional embedding table starts 2 rows in (a fairseq legacy: padding_idx 1).
constexpr uint32_t kOptPositionOffset = 2;

// Reads a Hugging Face config.json; refuses what this engine does not compute, saying why.
OptConfig read_opt_config(const std::string& path);
// The shape from the tensors (heads: from a config.json, or the published OPT sizes by hidden
// size; otherwise an error asks for config.json). prefix: "model.decoder." or "decoder.".
OptConfig infer_opt_config(const SafetensorsFile& file, const std::string& prefix);
// The checkpoint's tensor name prefix ("model.decoder." or "decoder."); an error otherwise.
std::string opt_prefix(const SafetensorsFile& file);

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
};
// Every tensor of the model under prefix, in a fixed order (lm_head excluded: tied).
std::vector<TensorSpec> opt_tensor_specs(const OptConfig& c, const std::string& prefix);

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// Writes a safetensors file and an OPT config.json: the checkpoints the tests and the demo
// make from random weights (no download), and the raw writer the reader's tests build their
// hand-made (and broken) files with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/opt_weights.hpp"
#include "engine/safetensors.hpp"

namespace cxlpool::engine {

struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  const float* data = nullptr;  // shape's product elements, converted to dtype
};

// The bytes of a safetensors file (header padded with spaces to 8 bytes, as Hugging Face's).
std::string safetensors_bytes(const std::vector<TensorToWrite>& tensors,
                              const std::vector<std::pair<std::string, std::string>>& metadata = {});
void write_file(const std::string& path, const std::string& bytes);

// dir/model.safetensors (names "model.decoder.*", lm_head left out: tied) and dir/config.json.
void write_opt_checkpoint(const std::string& dir, const OptWeights& w, Dtype dtype);

}  // namespace cxlpool::engine

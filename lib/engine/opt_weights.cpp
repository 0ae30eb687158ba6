// SPDX-License-Identifier: MIT
// Loading and making OPT weights (opt_weights.hpp).
#include "engine/opt_weights.hpp"

#include <sys/stat.h>

#include <cmath>
#include <set>

#include "engine/error.hpp"
#include "engine/safetensors.hpp"

namespace cxlpool::engine {
namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0;
}

template <class W, class V>
std::vector<V*> layer_tensors(W& l) {
  return {&l.q_w,       &l.q_b,       &l.k_w,   &l.k_b,   &l.v_w,   &l.v_b,   &l.out_w,    &l.out_b,
          &l.attn_ln_w, &l.attn_ln_b, &l.fc1_w, &l.fc1_b, &l.fc2_w, &l.fc2_b, &l.ffn_ln_w, &l.ffn_ln_b};
}

// splitmix64: a fixed, portable stream.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(double(next() >> 40) / double(1ull << 24) * 2.0 - 1.0); }  // [-1, 1)
};

}  // namespace

std::vector<std::vector<float>*> OptWeights::tensors() {
  std::vector<std::vector<float>*> t{&embed_tokens, &embed_positions};
  for (auto& l : layers)
    for (auto* p : layer_tensors<OptLayerWeights, std::vector<float>>(l)) t.push_back(p);
  t.push_back(&final_ln_w);
  t.push_back(&final_ln_b);
  return t;
}

std::vector<const std::vector<float>*> OptWeights::tensors() const {
  std::vector<const std::vector<float>*> t{&embed_tokens, &embed_positions};
  for (const auto& l : layers)
    for (const auto* p : layer_tensors<const OptLayerWeights, const std::vector<float>>(l)) t.push_back(p);
  t.push_back(&final_ln_w);
  t.push_back(&final_ln_b);
  return t;
}

LoadedCheckpoint load_opt_checkpoint(const std::string& path) {
  LoadedCheckpoint out;
  std::string dir;
  if (is_dir(path)) {
    dir = path;
    out.model_file = path + "/model.safetensors";
    if (!exists(out.model_file) && exists(path + "/model.safetensors.index.json"))
      fail(path +
           ": a sharded checkpoint (model.safetensors.index.json): not supported; merge the shards into one "
           "model.safetensors");
  } else {
    out.model_file = path;
    const size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  if (exists(dir + "/config.json")) out.config_file = dir + "/config.json";
  const SafetensorsFile file(out.model_file);
  const std::string prefix = opt_prefix(file);
  OptConfig c = out.config_file.empty() ? infer_opt_config(file, prefix) : read_opt_config(out.config_file);
  const std::vector<TensorSpec> specs = opt_tensor_specs(c, prefix);
  // Nothing unexpected: a tensor this engine would ignore means a model it does not compute.
  std::set<std::string> expected;
  for (const auto& s : specs) expected.insert(s.name);
  for (const auto& [name, t] : file.tensors())
    if (!expected.count(name) && name != "lm_head.weight")
      fail(out.model_file + ": unexpected tensor \"" + shown(name) + "\" for OPT (" + c.describe() +
           (out.config_file.empty() ? ", inferred" : ", from " + out.config_file) + ")");
  OptWeights& w = out.weights;
  w.config = c;
  w.layers.resize(c.layers);
  std::vector<std::vector<float>*> dst = w.tensors();
  std::set<std::string> dtypes;
  for (size_t i = 0; i < specs.size(); ++i) {
    *dst[i] = file.read_f32(specs[i].name, specs[i].shape);  // missing or misshapen: named
    dtypes.insert(dtype_name(file.find(specs[i].name)->dtype));
  }
  if (file.find("lm_head.weight")) w.lm_head = file.read_f32("lm_head.weight", {c.vocab, c.hidden});
  out.source_dtype = dtypes.size() == 1 ? *dtypes.begin() : "mixed";
  return out;
}

OptWeights random_opt_weights(const OptConfig& config, uint64_t seed) {
  config.validate("random_opt_weights");
  OptWeights w;
  w.config = config;
  w.layers.resize(config.layers);
  const std::vector<TensorSpec> specs = opt_tensor_specs(config, "model.decoder.");
  std::vector<std::vector<float>*> dst = w.tensors();
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& t = specs[i];
    const uint64_t n = t.shape.size() == 2 ? t.shape[0] * t.shape[1] : t.shape[0];
    dst[i]->resize(size_t(n));
    // Scales that keep every part of the model in play (a model whose residual stream is all
    // token embedding only repeats its input): embeddings and each Linear's output of about
    // unit variance (weights uniform in +-sqrt(3 / in)), LayerNorm weights near 1.
    const bool embedding = t.name.find("embed_") != std::string::npos;
    const bool ln = t.name.find("layer_norm") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    float scale = 0.1f, offset = 0;
    if (embedding) {
      scale = 0.2f;
    } else if (ln && !bias) {
      offset = 1.0f;
    } else if (!bias) {
      scale = std::sqrt(3.0f / float(t.shape[1]));
    }
    for (float& x : *dst[i]) x = offset + scale * rng.uniform();
  }
  return w;
}

}  // namespace cxlpool::engine

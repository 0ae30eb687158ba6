// SPDX-License-Identifier: MIT
// OPT configuration (opt_config.hpp): config.json, shape inference, tensor names.
#include "engine/opt_config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "engine/error.hpp"
#include "engine/json_value.hpp"
#include "engine/safetensors.hpp"

namespace cxlpool::engine {
namespace {

std::string read_small_file(const std::string& path, size_t limit) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);  // a FIFO: refused, not waited on
  if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail(path + ": not a regular file");
  }
  if (uint64_t(st.st_size) > limit) {
    close(fd);
    fail(path + ": " + std::to_string(st.st_size) + " bytes: larger than a config file (" + std::to_string(limit) +
         ")");
  }
  std::string text(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t k = read(fd, text.data() + got, text.size() - got);
    if (k <= 0) {
      close(fd);
      fail(path + ": read failed");
    }
    got += size_t(k);
  }
  close(fd);
  return text;
}

}  // namespace

uint64_t OptConfig::parameters() const {
  const uint64_t d = hidden, f = ffn;
  const uint64_t per_layer = 4 * (d * d + d) + 2 * d * f + f + d + 4 * d;
  return uint64_t(vocab) * d + uint64_t(max_positions + kOptPositionOffset) * d + layers * per_layer + 2 * d;
}

void OptConfig::validate(const std::string& what) const {
  auto bad = [&](const std::string& field, uint64_t v, const std::string& range) {
    fail(what + ": " + field + " = " + std::to_string(v) + " (" + range + ")");
  };
  if (hidden < 1 || hidden > 65536) bad("hidden_size", hidden, "1..65536");
  if (heads < 1 || heads > 1024) bad("num_attention_heads", heads, "1..1024");
  if (hidden % heads) bad("hidden_size", hidden, "a multiple of num_attention_heads = " + std::to_string(heads));
  if (head_dim() > 4096) bad("hidden_size / num_attention_heads", head_dim(), "at most 4096");
  if (layers < 1 || layers > 1024) bad("num_hidden_layers", layers, "1..1024");
  if (ffn < 1 || ffn > 262144) bad("ffn_dim", ffn, "1..262144");
  if (vocab < 1 || vocab > 1048576) bad("vocab_size", vocab, "1..1048576");
  if (max_positions < 1 || max_positions > 1048576) bad("max_position_embeddings", max_positions, "1..1048576");
}

std::string OptConfig::describe() const {
  return std::to_string(layers) + " layers, d=" + std::to_string(hidden) + ", " + std::to_string(heads) + " heads of " +
         std::to_string(head_dim()) + ", ffn " + std::to_string(ffn) + ", vocab " + std::to_string(vocab) +
         ", max positions " + std::to_string(max_positions) + " (" + std::to_string(parameters()) + " parameters)";
}

OptConfig read_opt_config(const std::string& path) {
  const JsonValue doc = parse_json(read_small_file(path, 1 << 20), path);
  if (!doc.is_object()) fail(path + ": not a JSON object");
  auto u32 = [&](const char* key, uint32_t* out) {
    const JsonValue* v = doc.find(key);
    if (!v) fail(path + ": \"" + key + "\" is missing");
    uint64_t x = 0;
    if (!v->as_u64(&x) || x > UINT32_MAX) fail(path + ": \"" + key + "\" is not a non-negative integer below 2^32");
    *out = uint32_t(x);
  };
  OptConfig c;
  u32("hidden_size", &c.hidden);
  u32("num_attention_heads", &c.heads);
  u32("num_hidden_layers", &c.layers);
  u32("ffn_dim", &c.ffn);
  u32("vocab_size", &c.vocab);
  u32("max_position_embeddings", &c.max_positions);
  // What this engine computes; anything else is refused rather than computed wrongly.
  if (const JsonValue* v = doc.find("model_type"); v && !(v->is_string() && v->string() == "opt"))
    fail(path + ": model_type is not \"opt\": only OPT models are supported");
  if (const JsonValue* v = doc.find("do_layer_norm_before"); v && !(v->is_bool() && v->boolean()))
    fail(path + ": do_layer_norm_before is not true (post-LayerNorm, as opt-350m): not supported");
  if (const JsonValue* v = doc.find("activation_function"); v && !(v->is_string() && v->string() == "relu"))
    fail(path + ": activation_function is not \"relu\": not supported");
  if (const JsonValue* v = doc.find("word_embed_proj_dim")) {
    uint64_t x = 0;
    if (!v->as_u64(&x) || (c.hidden != 0 && x != c.hidden))  // (a hidden_size of 0 is named below)
      fail(path +
           ": word_embed_proj_dim differs from hidden_size (project_in/project_out, as opt-350m): not supported");
  }
  if (const JsonValue* v = doc.find("enable_bias"); v && !(v->is_bool() && v->boolean()))
    fail(path + ": enable_bias is not true: not supported");
  if (const JsonValue* v = doc.find("layer_norm_elementwise_affine"); v && !(v->is_bool() && v->boolean()))
    fail(path + ": layer_norm_elementwise_affine is not true: not supported");
  c.validate(path);
  return c;
}

std::string opt_prefix(const SafetensorsFile& file) {
  for (const char* p : {"model.decoder.", "decoder."})
    if (file.find(std::string(p) + "embed_tokens.weight")) return p;
  fail(file.path() +
       ": no tensor \"model.decoder.embed_tokens.weight\" (nor \"decoder.embed_tokens.weight\"): not an OPT "
       "checkpoint with Hugging Face names");
}

OptConfig infer_opt_config(const SafetensorsFile& file, const std::string& prefix) {
  auto shape_of = [&](const std::string& name, size_t dims) {
    const TensorInfo* t = file.find(prefix + name);
    if (!t) fail(file.path() + ": tensor \"" + prefix + name + "\" is missing");
    if (t->shape.size() != dims)
      fail(file.path() + ": tensor \"" + prefix + name + "\" has shape " + shape_text(t->shape) + ", expected " +
           std::to_string(dims) + " dimensions");
    for (uint64_t d : t->shape)
      if (d > UINT32_MAX) fail(file.path() + ": tensor \"" + prefix + name + "\" is too large");
    return t->shape;
  };
  OptConfig c;
  const auto emb = shape_of("embed_tokens.weight", 2);
  c.vocab = uint32_t(emb[0]);
  c.hidden = uint32_t(emb[1]);
  const auto pos = shape_of("embed_positions.weight", 2);
  if (pos[0] <= kOptPositionOffset)
    fail(file.path() + ": tensor \"" + prefix + "embed_positions.weight\" has " + std::to_string(pos[0]) +
         " rows: OPT's table has max_position_embeddings + 2");
  c.max_positions = uint32_t(pos[0] - kOptPositionOffset);
  // Layers: the highest N of "layers.N." present, and every one below it (checked when loading).
  std::set<uint64_t> seen;
  const std::string lp = prefix + "layers.";
  for (const auto& [name, t] : file.tensors()) {
    if (name.compare(0, lp.size(), lp) != 0) continue;
    uint64_t n = 0;
    size_t i = lp.size();
    if (i >= name.size() || name[i] < '0' || name[i] > '9') continue;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 1'000'000; ++i)
      n = n * 10 + uint64_t(name[i] - '0');
    seen.insert(n);
  }
  if (seen.empty()) fail(file.path() + ": no tensor \"" + lp + "0. ...\": no layers");
  c.layers = uint32_t(std::min<uint64_t>(*seen.rbegin() + 1, 1u << 20));
  c.ffn = uint32_t(shape_of("layers.0.fc1.weight", 2)[0]);
  // Published OPT sizes (hidden_size -> num_attention_heads), from their config.json files.
  static const uint32_t kHeads[][2] = {{768, 12},  {1024, 16}, {2048, 32}, {2560, 32}, {4096, 32},
                                       {5120, 40}, {7168, 56}, {9216, 72}, {12288, 96}};
  for (const auto& h : kHeads)
    if (h[0] == c.hidden) c.heads = h[1];
  if (!c.heads)
    fail(file.path() + ": hidden size " + std::to_string(c.hidden) +
         " is not a published OPT size: the number of heads cannot be inferred; put its config.json next to it");
  c.validate(file.path());
  return c;
}

std::vector<TensorSpec> opt_tensor_specs(const OptConfig& c, const std::string& prefix) {
  const uint64_t d = c.hidden, f = c.ffn;
  std::vector<TensorSpec> s;
  s.push_back({prefix + "embed_tokens.weight", {c.vocab, d}});
  s.push_back({prefix + "embed_positions.weight", {uint64_t(c.max_positions) + kOptPositionOffset, d}});
  for (uint32_t l = 0; l < c.layers; ++l) {
    const std::string p = prefix + "layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      s.push_back({p + "self_attn." + proj + ".weight", {d, d}});
      s.push_back({p + "self_attn." + proj + ".bias", {d}});
    }
    s.push_back({p + "self_attn_layer_norm.weight", {d}});
    s.push_back({p + "self_attn_layer_norm.bias", {d}});
    s.push_back({p + "fc1.weight", {f, d}});
    s.push_back({p + "fc1.bias", {f}});
    s.push_back({p + "fc2.weight", {d, f}});
    s.push_back({p + "fc2.bias", {d}});
    s.push_back({p + "final_layer_norm.weight", {d}});
    s.push_back({p + "final_layer_norm.bias", {d}});
  }
  s.push_back({prefix + "final_layer_norm.weight", {d}});
  s.push_back({prefix + "final_layer_norm.bias", {d}});
  return s;
}

}  // namespace cxlpool::engine

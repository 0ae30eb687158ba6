// SPDX-License-Identifier: MIT
// The safetensors and config.json writer (checkpoint_writer.hpp).
#include "engine/checkpoint_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/error.hpp"
#include "engine/half.hpp"

namespace cxlpool::engine {

std::string safetensors_bytes(const std::vector<TensorToWrite>& tensors,
                              const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i)
      header += (i ? ",\"" : "\"") + metadata[i].first + "\":\"" + metadata[i].second + "\"";
    header += "}";
  }
  std::string data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    uint64_t n = 1;
    for (uint64_t d : t.shape) n *= d;
    const uint64_t begin = data.size();
    for (uint64_t k = 0; k < n; ++k) {
      const float x = t.data[k];
      if (t.dtype == Dtype::kF32) {
        char b[4];
        std::memcpy(b, &x, 4);
        data.append(b, 4);
      } else {
        const uint16_t h = t.dtype == Dtype::kF16 ? float_to_fp16(x) : float_to_bf16(x);
        data += char(h & 0xff);
        data += char(h >> 8);
      }
    }
    header += (i || !metadata.empty() ? ",\"" : "\"") + t.name + "\":{\"dtype\":\"" + dtype_name(t.dtype) +
              "\",\"shape\":" + shape_text(t.shape) + ",\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(data.size()) + "]}";
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  return out + header + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(path + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = write(fd, bytes.data() + done, bytes.size() - done);
    if (k <= 0) {
      close(fd);
      fail(path + ": write failed");
    }
    done += size_t(k);
  }
  if (close(fd) != 0) fail(path + ": close failed");
}

void write_opt_checkpoint(const std::string& dir, const OptWeights& w, Dtype dtype) {
  const OptConfig& c = w.config;
  const std::vector<TensorSpec> specs = opt_tensor_specs(c, "model.decoder.");
  const std::vector<const std::vector<float>*> src = w.tensors();
  std::vector<TensorToWrite> t;
  for (size_t i = 0; i < specs.size(); ++i) t.push_back({specs[i].name, dtype, specs[i].shape, src[i]->data()});
  if (!w.lm_head.empty()) t.push_back({"lm_head.weight", dtype, {c.vocab, c.hidden}, w.lm_head.data()});
  write_file(dir + "/model.safetensors", safetensors_bytes(t, {{"format", "pt"}}));
  const std::string config =
      "{\n  \"model_type\": \"opt\",\n  \"architectures\": [\"OPTForCausalLM\"],\n  \"hidden_size\": " +
      std::to_string(c.hidden) + ",\n  \"num_attention_heads\": " + std::to_string(c.heads) +
      ",\n  \"num_hidden_layers\": " + std::to_string(c.layers) + ",\n  \"ffn_dim\": " + std::to_string(c.ffn) +
      ",\n  \"vocab_size\": " + std::to_string(c.vocab) +
      ",\n  \"max_position_embeddings\": " + std::to_string(c.max_positions) +
      ",\n  \"word_embed_proj_dim\": " + std::to_string(c.hidden) +
      ",\n  \"do_layer_norm_before\": true,\n  \"activation_function\": \"relu\",\n  \"enable_bias\": true,\n"
      "  \"torch_dtype\": \"" +
      std::string(dtype == Dtype::kF32   ? "float32"
                  : dtype == Dtype::kF16 ? "float16"
                                         : "bfloat16") +
      "\"\n}\n";
  write_file(dir + "/config.json", config);
}

}  // namespace cxlpool::engine

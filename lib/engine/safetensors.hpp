// SPDX-License-Identifier: MIT
// Reader of the safetensors format (Hugging Face): an 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {string: string}}, then the data, offsets relative to its start. Everything is validated
// before a byte of data is used: the header length against the file (and at most 100 MB, as
// the reference implementation), the JSON (strict), every dtype, shape and offset pair, the
// byte span against shape x element size, and the data region covered exactly once (no
// overlap, no hole, nothing after). Errors name the file, the tensor and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cxlpool::engine {

enum class Dtype { kF16, kBF16, kF32 };
const char* dtype_name(Dtype d);
size_t dtype_size(Dtype d);

struct TensorInfo {
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data
  uint64_t elements() const;
};

class SafetensorsFile {
 public:
  // Opens path and validates its header; throws engine::Error naming it.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // The tensor converted to fp32; its shape must be `shape` (an error names both otherwise).
  std::vector<float> read_f32(const std::string& name, const std::vector<uint64_t>& shape) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_text(const std::vector<uint64_t>& shape);

}  // namespace cxlpool::engine

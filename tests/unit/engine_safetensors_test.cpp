// SPDX-License-Identifier: MIT
// The safetensors reader and the OPT checkpoint loader against hand-made files: a good file
// (fp32, fp16, bf16; metadata; unaligned data); truncated files; hostile header lengths (0,
// beyond the file, 2^63, 2^64-1, above the 16 MiB limit); a FIFO; a file that shrinks after it
// was opened; malformed JSON of every kind; wrong
// and unknown dtypes; shapes that disagree with their byte spans; offsets out of bounds,
// overlapping, leaving holes; missing, misshapen and unexpected tensors; config.json values
// this engine does not compute. Each is refused with a message naming the file, the tensor and
// what is wrong; none crashes (the suite runs under ASan and UBSan too).
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/checkpoint_writer.hpp"
#include "engine/error.hpp"
#include "engine/opt_weights.hpp"
#include "engine/safetensors.hpp"
#include "test_support.hpp"

using namespace cxlpool::engine;
using Catch::Contains;

namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}
// A file from a header text and data bytes (the header length is the text's).
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

struct Files {
  cxlpool_test::ScratchDir dir;
  int n = 0;
  std::string put(const std::string& bytes) {
    const std::string p = dir.path() + "/f" + std::to_string(n++) + ".safetensors";
    write_file(p, bytes);
    return p;
  }
};

// Opening path fails with a message containing every one of `parts` (and the path).
void refused(const std::string& path, std::initializer_list<const char*> parts) {
  try {
    SafetensorsFile f(path);
    FAIL("accepted: " << path);
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find(path) != std::string::npos);
    for (const char* p : parts) CHECK(m.find(p) != std::string::npos);
  }
}

const std::string kTwo = std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // fp32 1.0, 2.0

}  // namespace

TEST_CASE("safetensors: a good file, every dtype", "[unit]") {
  Files f;
  const float v[] = {1.0f, -2.5f, 0.1f, 65504.0f, 1e-6f, 3.0f};
  std::vector<TensorToWrite> t = {{"a", Dtype::kF32, {2, 3}, v},
                                  {"b", Dtype::kF16, {6}, v},
                                  {"c", Dtype::kBF16, {3, 2}, v},
                                  {"empty", Dtype::kF32, {0, 4}, v}};
  const std::string path = f.put(safetensors_bytes(t, {{"format", "pt"}}));
  SafetensorsFile s(path);
  CHECK(s.tensors().size() == 4);
  CHECK(s.metadata().at("format") == "pt");
  const auto a = s.read_f32("a", {2, 3});
  CHECK(std::memcmp(a.data(), v, sizeof v) == 0);
  const auto b = s.read_f32("b", {6});
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -2.5f);
  CHECK(b[3] == 65504.0f);
  CHECK(std::fabs(b[2] - 0.1f) < 1e-4f);
  CHECK(std::fabs(b[4] - 1e-6f) < 1e-7f);  // an fp16 subnormal
  const auto c = s.read_f32("c", {3, 2});
  CHECK(c[0] == 1.0f);
  CHECK(std::fabs(c[2] - 0.1f) < 1e-3f);
  CHECK(s.read_f32("empty", {0, 4}).empty());
  REQUIRE_THROWS_WITH(s.read_f32("a", {3, 2}), Contains("has shape [2, 3], expected [3, 2]"));
  REQUIRE_THROWS_WITH(s.read_f32("nope", {1}), Contains("tensor \"nope\" is missing"));
  // Unaligned data (a header whose length is not a multiple of 4) reads the same.
  const std::string odd = f.put(file_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )", kTwo));
  CHECK(SafetensorsFile(odd).read_f32("x", {2}) == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("safetensors: truncated files and hostile header lengths", "[unit]") {
  Files f;
  const float v[] = {1, 2, 3, 4};
  const std::string good = safetensors_bytes({{"w", Dtype::kF32, {4}, v}});
  refused(f.put(""), {"0 bytes", "shorter than the 8-byte header length"});
  refused(f.put(good.substr(0, 5)), {"5 bytes", "shorter than"});
  refused(f.put(good.substr(0, 20)), {"beyond the file's end", "truncated"});            // header cut
  refused(f.put(good.substr(0, good.size() - 3)), {"tensor \"w\"", "beyond the data"});  // data cut
  refused(f.put(le64(0) + "{}"), {"header length is 0"});
  refused(f.put(le64(uint64_t(1) << 63) + "{}"), {"header length 9223372036854775808", "beyond the file's end"});
  refused(f.put(le64(UINT64_MAX) + "{}"), {"header length 18446744073709551615", "beyond the file's end"});
  refused(f.put(le64(1000) + std::string(100, ' ')), {"header length 1000", "beyond the file's end (108 bytes)"});
  // Above the 16 MiB limit although the file is long enough: a sparse file of 16 MiB + 16.
  {
    const std::string p = f.dir.path() + "/huge.safetensors";
    write_file(p, le64((16u << 20) + 1));
    REQUIRE(truncate(p.c_str(), (16u << 20) + 16) == 0);
    refused(p, {"exceeds the 16 MiB this reader accepts"});
  }
  refused(f.dir.path(), {"not a regular file"});
  // A FIFO is refused at once, not waited on (no writer ever comes).
  {
    const std::string p = f.dir.path() + "/fifo.safetensors";
    REQUIRE(mkfifo(p.c_str(), 0600) == 0);
    refused(p, {"not a regular file"});
  }
  // A file cut short after it was opened: reading a tensor is an error, not a SIGBUS.
  {
    const float ones[1024] = {1.0f};
    const std::string p =
        f.put(safetensors_bytes({{"w", Dtype::kF16, {1024}, ones}, {"x", Dtype::kF32, {1024}, ones}}, {}));
    SafetensorsFile s(p);
    REQUIRE(truncate(p.c_str(), 200) == 0);
    REQUIRE_THROWS_WITH(s.read_f32("w", {1024}), Contains("the file shrank while it was read"));
    REQUIRE_THROWS_WITH(s.read_f32("x", {1024}), Contains("the file shrank while it was read"));
  }
  refused(f.dir.path() + "/absent", {"cannot open"});
}

TEST_CASE("safetensors: malformed JSON headers", "[unit]") {
  Files f;
  const char* bad[][2] = {
      {"{", "expected a string key"},
      {"{\"a\":", "unexpected end of text"},
      {"[]", "not an object"},
      {"{\"a\":1,}", "expected a string key"},
      {"{\"a\" 1}", "expected ':'"},
      {"{\"a\":01}", "leading zero"},
      {"{\"a\":\"x\ny\"}", "control character"},
      {"{\"a\":\"\\q\"}", "invalid escape"},
      {"{\"a\":\"\\ud800\"}", "lone high surrogate"},
      {"{\"a\":\"\xc3\x28\"}", "invalid UTF-8"},
      {"{\"a\":tru}", "invalid literal"},
      {"{\"a\":1} x", "unexpected text after the value"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},\"a\":{}}", "duplicate key \"a\""},
      {"{\"a\":-}", "invalid value"},
      {"{\"a\":1.}", "digits expected after '.'"},
  };
  for (const auto& b : bad) refused(f.put(file_of(b[0], "")), {"JSON", b[1]});
  std::string deep(200, '[');
  refused(f.put(file_of("{\"a\":" + deep, "")), {"nested deeper than 64"});
  refused(f.put(file_of(std::string("{\"a\":\"") + std::string(1, '\0') + "\"}", "")), {"control character"});
}

TEST_CASE("safetensors: tensor entries that lie", "[unit]") {
  Files f;
  auto one = [&](const std::string& entry, const std::string& data = kTwo) {
    return f.put(file_of("{\"w\":" + entry + "}", data));
  };
  refused(one(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"), {"tensor \"w\"", "dtype F64 is not supported"});
  // A name with a newline and a terminal escape is shown escaped: the message stays one line.
  {
    const std::string p =
        f.put(file_of(R"({"evil\n\u001b[31mFAKE":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", kTwo));
    refused(p, {"tensor \"evil\\x0a\\x1b[31mFAKE\"", "unknown dtype"});
    try {
      SafetensorsFile s(p);
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find_first_of("\n\x1b") == std::string::npos);
    }
  }
  refused(one(R"({"dtype":"Q4","shape":[2],"data_offsets":[0,8]})"), {"unknown dtype \"Q4\""});
  refused(one(R"({"dtype":7,"shape":[2],"data_offsets":[0,8]})"), {"dtype is not a string"});
  refused(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
          {"shape [3] of F32 needs 12 bytes but data_offsets span 8"});
  refused(one(R"({"dtype":"F16","shape":[2],"data_offsets":[0,8]})"), {"needs 4 bytes but data_offsets span 8"});
  refused(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]})"),
          {"needs more bytes than the file has"});
  refused(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), {"non-negative integer"});
  refused(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"), {"non-negative integer"});
  refused(one(R"({"dtype":"F32","shape":[99999999999999999999999],"data_offsets":[0,8]})"), {"non-negative integer"});
  refused(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,16]})"), {"end 16 is beyond the data (8 bytes"});
  refused(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"), {"ends before it begins"});
  refused(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), {"data_offsets is not [begin, end]"});
  refused(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]})"), {"beyond the data"});
  refused(one(R"({"dtype":"F32","shape":[2]})"), {"needs dtype, shape and data_offsets"});
  refused(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})"), {"unknown field \"extra\""});
  refused(one(R"([1,2])"), {"is an array, not an object"});
  refused(f.put(file_of(R"({"__metadata__":{"a":1}})", "")), {"__metadata__ \"a\" is not a string"});
  // Offsets: overlap, holes, bytes after the last tensor.
  const std::string four(16, '\0');
  refused(f.put(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        four)),
          {"tensor \"b\" [4, 12) overlaps tensor \"a\""});
  refused(f.put(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                        four)),
          {"bytes [8, 12) of the data belong to no tensor"});
  refused(f.put(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", four)),
          {"the data is 16 bytes but the tensors end at 8"});
  refused(f.put(file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        kTwo)),
          {"overlaps"});
}

TEST_CASE("OPT checkpoints: missing, misshapen and unexpected tensors, config.json", "[unit]") {
  cxlpool_test::ScratchDir dir;
  const OptConfig c{16, 2, 2, 24, 40, 12};
  const OptWeights w = random_opt_weights(c, 3);
  write_opt_checkpoint(dir.path(), w, Dtype::kF16);
  const std::string model = dir.path() + "/model.safetensors", config = dir.path() + "/config.json";
  CHECK(load_opt_checkpoint(dir.path()).weights.config.layers == 2);
  CHECK(load_opt_checkpoint(model).config_file == config);  // a file: config.json next to it
  // The tensors of the good file, to rebuild it with one thing wrong.
  std::vector<TensorSpec> specs = opt_tensor_specs(c, "model.decoder.");
  const auto src = w.tensors();
  auto rebuild = [&](auto&& change) {
    std::vector<TensorToWrite> t;
    for (size_t i = 0; i < specs.size(); ++i) t.push_back({specs[i].name, Dtype::kF32, specs[i].shape, src[i]->data()});
    change(t);
    write_file(model, safetensors_bytes(t));
  };
  auto load_error = [&]() -> std::string {
    try {
      load_opt_checkpoint(dir.path());
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  rebuild([](std::vector<TensorToWrite>& t) { t.erase(t.begin() + 5); });
  CHECK_THAT(load_error(), Contains("tensor \"model.decoder.layers.0.self_attn.k_proj.bias\" is missing"));
  rebuild([](std::vector<TensorToWrite>& t) { t[2].shape = {4, 64}; });
  CHECK_THAT(load_error(),
             Contains("\"model.decoder.layers.0.self_attn.q_proj.weight\" has shape [4, 64], expected [16, 16]"));
  std::vector<float> extra(16);
  rebuild([&](std::vector<TensorToWrite>& t) {
    t.push_back({"model.decoder.project_in.weight", Dtype::kF32, {16}, extra.data()});
  });
  CHECK_THAT(load_error(), Contains("unexpected tensor \"model.decoder.project_in.weight\""));
  rebuild([](std::vector<TensorToWrite>& t) {
    t[1].shape = {14, 16};
    t[1].shape[0] = 13;
  });
  CHECK_THAT(load_error(), Contains("embed_positions.weight\" has shape [13, 16], expected [14, 16]"));
  // lm_head present (untied) is used; "decoder." names are accepted.
  rebuild([&](std::vector<TensorToWrite>& t) {
    for (auto& x : t) x.name = x.name.substr(6);  // "model." dropped
    t.push_back({"lm_head.weight", Dtype::kF32, {40, 16}, src[0]->data()});
  });
  {
    const LoadedCheckpoint l = load_opt_checkpoint(dir.path());
    CHECK(l.weights.lm_head.size() == 40 * 16);
    CHECK(l.weights.lm_head[0] == (*src[0])[0]);
  }
  // Without config.json the shape is inferred; heads only for published OPT sizes.
  rebuild([](std::vector<TensorToWrite>&) {});
  REQUIRE(unlink(config.c_str()) == 0);
  CHECK_THAT(load_error(), Contains("hidden size 16 is not a published OPT size") && Contains("config.json"));
  // config.json: what the engine does not compute is refused, saying why.
  auto config_error = [&](const std::string& text) {
    write_file(config, text);
    return load_error();
  };
  const std::string base =
      R"("hidden_size":16,"num_attention_heads":2,"num_hidden_layers":2,"ffn_dim":24,"vocab_size":40,)"
      R"("max_position_embeddings":12)";
  CHECK(config_error("{" + base + "}") == "accepted");
  CHECK_THAT(config_error("{" + base + R"(,"do_layer_norm_before":false})"),
             Contains("do_layer_norm_before is not true"));
  CHECK_THAT(config_error("{" + base + R"(,"model_type":"llama"})"), Contains("model_type is not \"opt\""));
  CHECK_THAT(config_error("{" + base + R"(,"word_embed_proj_dim":8})"), Contains("word_embed_proj_dim differs"));
  CHECK_THAT(config_error("{" + base + R"(,"activation_function":"gelu"})"), Contains("activation_function"));
  CHECK_THAT(config_error(R"({"hidden_size":16})"), Contains("\"num_attention_heads\" is missing"));
  CHECK_THAT(config_error(R"({"hidden_size":16,"num_attention_heads":3,"num_hidden_layers":2,"ffn_dim":24,)"
                          R"("vocab_size":40,"max_position_embeddings":12})"),
             Contains("a multiple of num_attention_heads"));
  CHECK_THAT(config_error("{" + base + ",}"), Contains("config.json: JSON"));
  // A config that disagrees with the tensors: the tensor is named.
  CHECK_THAT(config_error(R"({"hidden_size":16,"num_attention_heads":2,"num_hidden_layers":3,"ffn_dim":24,)"
                          R"("vocab_size":40,"max_position_embeddings":12})"),
             Contains("\"model.decoder.layers.2.self_attn.q_proj.weight\" is missing"));
  CHECK_THAT(config_error(R"({"hidden_size":16,"num_attention_heads":2,"num_hidden_layers":2,"ffn_dim":32,)"
                          R"("vocab_size":40,"max_position_embeddings":12})"),
             Contains("fc1.weight\" has shape [24, 16], expected [32, 16]"));
}

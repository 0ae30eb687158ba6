// SPDX-License-Identifier: MIT
// A small strict JSON parser (RFC 8259) for the two JSON texts the engine reads: a
// safetensors header and a Hugging Face config.json. Both come from files a user names, so the
// parser is strict and bounded: duplicate keys, trailing commas, leading zeros, control
// characters in strings, lone surrogates and nesting deeper than 64 are errors, each reported
// with its byte offset. lib/common has only a writer, and the engine (like lib/ucx) sees only
// the public headers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::engine {

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool boolean() const { return bool_; }
  const std::string& string() const { return string_; }
  // The number as written (so integers beyond 2^53 keep every digit).
  const std::string& number_text() const { return string_; }
  // The number as an unsigned integer, when it is one (digits only, below 2^64).
  bool as_u64(uint64_t* out) const;
  const std::vector<JsonValue>& array() const { return array_; }
  // Members in the order of the text.
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }
  const JsonValue* find(std::string_view key) const;
  static const char* kind_name(Kind k);

 private:
  friend class JsonParser;
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  std::string string_;
  std::vector<JsonValue> array_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses text; throws engine::Error "<what>: JSON: <problem> at byte N".
JsonValue parse_json(std::string_view text, const std::string& what);

}  // namespace cxlpool::engine

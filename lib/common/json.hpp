// SPDX-License-Identifier: MIT
// A minimal streaming JSON writer (objects, arrays, strings, numbers, booleans, null) with
// correct string escaping. Used for every --json output and cxlpool_*_to_json function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::detail {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view k);
  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(int64_t v);
  JsonWriter& value(uint64_t v);
  JsonWriter& value(int v) { return value(int64_t(v)); }
  JsonWriter& value(unsigned v) { return value(uint64_t(v)); }
  JsonWriter& value(double v);
  JsonWriter& value(bool v);
  JsonWriter& null();
  const std::string& str() const { return out_; }

 private:
  void separate();
  void close(char bracket);
  void write_string(std::string_view s);
  void newline();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace cxlpool::detail

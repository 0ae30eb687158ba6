// SPDX-License-Identifier: MIT
// Minimal JSON writer; output is indented two spaces per level for readability.
#include "common/json.hpp"

#include <cmath>
#include <cstdio>

#include "common/utf8.hpp"

namespace cxlpool::detail {

void JsonWriter::newline() {
  out_ += '\n';
  out_.append(2 * first_.size(), ' ');
}

void JsonWriter::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
    newline();
  }
}

JsonWriter& JsonWriter::begin_object() {
  separate();
  out_ += '{';
  first_.push_back(true);
  return *this;
}
void JsonWriter::close(char bracket) {
  bool empty = first_.back();
  first_.pop_back();
  if (!empty) newline();
  out_ += bracket;
}
JsonWriter& JsonWriter::end_object() {
  close('}');
  return *this;
}
JsonWriter& JsonWriter::begin_array() {
  separate();
  out_ += '[';
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::end_array() {
  close(']');
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view k) {
  separate();
  write_string(k);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  separate();
  write_string(s);
  return *this;
}

// Strings come from file names, sysfs and pools that anyone may have written: the output is
// valid UTF-8 JSON whatever they hold, escaped as everywhere else (common/utf8.hpp: a byte
// that is not UTF-8 is the text \\xNN, a backslash two, so the two cannot be confused).
void JsonWriter::write_string(std::string_view s) {
  out_ += '"';
  out_ += json_escaped(s);
  out_ += '"';
}

JsonWriter& JsonWriter::value(int64_t v) {
  separate();
  out_ += std::to_string(v);
  return *this;
}
JsonWriter& JsonWriter::value(uint64_t v) {
  separate();
  out_ += std::to_string(v);
  return *this;
}
JsonWriter& JsonWriter::value(double v) {
  if (!std::isfinite(v)) return null();
  separate();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  out_ += buf;
  return *this;
}
JsonWriter& JsonWriter::value(bool v) {
  separate();
  out_ += v ? "true" : "false";
  return *this;
}
JsonWriter& JsonWriter::null() {
  separate();
  out_ += "null";
  return *this;
}

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The engine's one error type. The engine is a C++ library used by C++ programs (examples,
// tests, bench): a failure throws engine::Error whose text names the file, tensor or argument
// and what is wrong; calls into libcxlpool that fail carry cxlpool_last_error_message().
#pragma once

#include <stdexcept>
#include <string>

namespace cxlpool::engine {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& what) { throw Error(what); }

// A name from a file, fit for a one-line message: control bytes (a newline, an escape
// sequence) as \xNN, at most 200 bytes.
inline std::string shown(const std::string& name) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < name.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += char(c);
    }
  }
  if (name.size() > 200) out += "...";
  return out;
}

}  // namespace cxlpool::engine

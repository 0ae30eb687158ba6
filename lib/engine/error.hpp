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

}  // namespace cxlpool::engine

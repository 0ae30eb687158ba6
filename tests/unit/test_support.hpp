// SPDX-License-Identifier: MIT
// Helpers shared by unit tests: fixture paths, visible skips, scratch directories, and
// scoped environment variables.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

namespace cxlpool_test {

inline std::string fixture(const std::string& tree) { return std::string(CXLPOOL_FIXTURE_DIR) + "/" + tree + "/sys"; }

// A visible skip: CTest reports the test as skipped (SKIP_REGULAR_EXPRESSION), and with
// CXLPOOL_REQUIRE_ALL_TESTS=ON it is a failure instead.
#define CXLPOOL_SKIP(reason)                                                  \
  do {                                                                        \
    if (CXLPOOL_REQUIRE_ALL_TESTS) FAIL("required test skipped: " << reason); \
    std::printf("CXLPOOL-SKIP: %s\n", std::string(reason).c_str());           \
    return;                                                                   \
  } while (0)

class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/cxlpool-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace cxlpool_test

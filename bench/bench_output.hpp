// SPDX-License-Identifier: MIT
// What the benchmark drivers share: the files they are asked to write (--json, --plot), opened
// as the library opens files a user names (lib/os/safe_path.hpp), never through another user's
// link nor over another user's file, a file of ours emptied only after those checks; the
// build-type gate; comma lists.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "os/safe_path.hpp"

inline FILE* open_bench_output(const std::string& path) {
  cxlpool::os::PathWhy why;
  const int fd = cxlpool::os::open_user_output(path.c_str(), cxlpool::os::OutputMode::kTruncate, &why);
  if (fd < 0) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), why.text);
    return nullptr;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // opened without blocking, written blocking
  FILE* f = fdopen(fd, "w");
  if (!f) close(fd);
  return f;
}

// "a,b,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  for (size_t a = 0, b; a <= s.size(); a = b + 1) {
    b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    out.push_back(s.substr(a, b - a));
  }
  return out;
}

// Benchmarks run from a Release build (build_type). A first argument --any-build lets the test
// suite run the demo on its own build; the figures are then labelled a smoke run. The index of
// the first option after it, or -1 (said on stderr) when the build may not run.
inline int bench_options_start(const char* name, const std::string& build_type, int argc, char** argv) {
  const bool any_build = argc > 1 && std::string(argv[1]) == "--any-build";
  if (build_type != "Release") {
    if (!any_build) {
      std::fprintf(stderr, "%s: built as %s; benchmarks need CMAKE_BUILD_TYPE=Release\n", name, build_type.c_str());
      return -1;
    }
    std::printf("%s: built as %s, not Release: these figures are a smoke run, not a benchmark\n", name,
                build_type.c_str());
  }
  return any_build ? 2 : 1;
}

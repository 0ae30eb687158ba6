// SPDX-License-Identifier: MIT
// Files a benchmark is asked to write (--json, --plot): opened as the library opens files a
// user names (lib/os/safe_path.hpp), never through another user's link nor over another
// user's file; a file of ours is emptied only after those checks.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

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

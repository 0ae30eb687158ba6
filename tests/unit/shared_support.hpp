// SPDX-License-Identifier: MIT
// What the shared-pool tests (shared_pool_test, compose_test) share: unique pool names,
// parameters with short heartbeats (participants killed by a test are found dead quickly), and
// a child's exit status.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "cxlpool/shared.h"

inline std::string unique_name(const char* tag) {
  return std::string("cxlpool-test-") + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
}

struct Params {
  cxlpool_shared_params_t* p = nullptr;
  explicit Params(uint64_t size = 64u << 20, uint32_t hb = 5, uint32_t timeout = 100, uint32_t stopped = 0) {
    REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_size(p, size) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_extent_size(p, 1u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_lease_timing(p, hb, timeout) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_stopped_timeout(p, stopped) == CXLPOOL_OK);
  }
  ~Params() { cxlpool_shared_params_destroy(p); }
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;
};

// A child's exit status, or 128 + the signal that ended it.
inline int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

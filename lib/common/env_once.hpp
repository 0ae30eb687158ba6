// SPDX-License-Identifier: MIT
// A process option read once from the environment (CXLPOOL_CONTROL, CXLPOOL_STAT_PAGE,
// CXLPOOL_TIERING): the first call reads it and starts what it asks for; a Failure there is
// thrown again by every later call, so each pool a program creates gets the same answer, not an
// error from the first and silence after.
#pragma once

#include <mutex>
#include <optional>

#include "common/error.hpp"

namespace cxlpool::detail {

class EnvOnce {
 public:
  // Runs read() on the first call only (outside the lock: it may start threads that take
  // their own locks); later calls rethrow its Failure, if it had one.
  template <class F>
  void run(F&& read) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) throw *failed_;
      if (claimed_) return;
      claimed_ = true;
    }
    try {
      read();
    } catch (const Failure& f) {
      std::lock_guard<std::mutex> lock(mu_);
      failed_.emplace(f);
      throw;
    }
  }

 private:
  std::mutex mu_;
  bool claimed_ = false;
  std::optional<Failure> failed_;
};

}  // namespace cxlpool::detail

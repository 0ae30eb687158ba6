// SPDX-License-Identifier: MIT
// A process option read once from the environment (CXLPOOL_CONTROL, CXLPOOL_STAT_PAGE,
// CXLPOOL_TIERING): the first call reads it and starts what it asks for; a Failure there is
// thrown again by every later call, so each pool a program creates gets the same answer, not an
// error from the first and silence after.
#pragma once

#include <atomic>

#include "common/error.hpp"

namespace cxlpool::detail {

class EnvOnce {
 public:
  // Runs read() on the first call only; later calls rethrow its Failure, if it had one. No
  // lock: a fork() at any point leaves the child nothing held.
  template <class F>
  void run(F&& read) {
    if (const Failure* f = failed_.load(std::memory_order_acquire)) throw *f;
    if (claimed_.exchange(true, std::memory_order_acq_rel)) return;
    try {
      read();
    } catch (const Failure& f) {
      failed_.store(new Failure(f), std::memory_order_release);  // kept for the process's life
      throw;
    }
  }

 private:
  std::atomic<bool> claimed_{false};
  std::atomic<const Failure*> failed_{nullptr};
};

}  // namespace cxlpool::detail

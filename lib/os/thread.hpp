// SPDX-License-Identifier: MIT
// The threads cxlpool starts for itself (the stats publisher, the tiering engine): std::thread
// semantics minus what cxlpool does not use, with a stack of a size the caller chooses, as
// the default 8 MiB of each would count against a program's RLIMIT_AS, and marked as
// cxlpool's (own_threads.hpp), so that they never keep a program alive.
#pragma once

#include <cstddef>
#include <functional>

namespace cxlpool::os {

class Thread {
 public:
  Thread() = default;
  Thread(const Thread&) = delete;
  Thread& operator=(const Thread&) = delete;
  ~Thread() { join(); }

  // Runs fn on a new thread named name ("cxlpool/...", own_threads.hpp) with stack_bytes of
  // stack (prim::start_thread: doubled where the C library needs more). Throws
  // Failure(CXLPOOL_E_OS) naming what when it cannot start; one start per Thread until joined.
  void start(std::function<void()> fn, size_t stack_bytes, const char* what, const char* name);
  bool joinable() const noexcept { return started_; }
  // Waits for the thread to return; nothing when none was started.
  void join() noexcept;

 private:
  static void* trampoline(void* self) noexcept;
  std::function<void()> fn_;
  const char* name_ = nullptr;
  unsigned long id_ = 0;
  bool started_ = false;
};

}  // namespace cxlpool::os

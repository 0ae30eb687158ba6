// SPDX-License-Identifier: MIT
// os::Thread (thread.hpp): a pthread with a chosen stack size through prim::start_thread.
#include "os/thread.hpp"

#include <cstring>
#include <string>

#include "common/error.hpp"
#include "os/own_threads.hpp"
#include "os/prim.hpp"

namespace cxlpool::os {

void* Thread::trampoline(void* self) noexcept {
  auto* t = static_cast<Thread*>(self);
  OwnThread mark(t->name_);
  t->fn_();
  return nullptr;
}

void Thread::start(std::function<void()> fn, size_t stack_bytes, const char* what, const char* name) {
  if (started_) detail::fail(CXLPOOL_E_BUSY, std::string(what) + ": the thread runs already");
  fn_ = std::move(fn);
  name_ = name;
  if (int e = prim::start_thread(trampoline, this, stack_bytes, false, &id_)) {
    fn_ = nullptr;
    detail::fail(CXLPOOL_E_OS, std::string(what) + ": pthread_create: " + std::strerror(e));
  }
  started_ = true;
}

void Thread::join() noexcept {
  if (!started_) return;
  prim::join_thread(id_);
  started_ = false;
  fn_ = nullptr;
}

}  // namespace cxlpool::os

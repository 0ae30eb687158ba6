// SPDX-License-Identifier: MIT
// The engine's worker threads (thread_pool.hpp). Tasks are handed out under one mutex: they
// are coarse (a block of output columns, a head's tile of queries), so the lock is cheap.
#include "engine/thread_pool.hpp"

#include <algorithm>

namespace cxlpool::engine {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, 256u);
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain(std::unique_lock<std::mutex>& lock) {
  // Takes tasks until none is left; mu_ is held on entry and on return.
  while (next_ < tasks_) {
    const size_t i = next_++;
    const auto* fn = fn_;
    ++busy_;
    lock.unlock();
    (*fn)(i);
    lock.lock();
    if (--busy_ == 0 && next_ >= tasks_) done_.notify_all();
  }
}

void ThreadPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  size_t seen = generation_;
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    drain(lock);
  }
}

void ThreadPool::run(size_t tasks, const std::function<void(size_t)>& fn) {
  if (tasks == 0) return;
  if (workers_.empty() || tasks == 1) {
    for (size_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  fn_ = &fn;
  tasks_ = tasks;
  next_ = 0;
  ++generation_;
  wake_.notify_all();
  drain(lock);
  done_.wait(lock, [&] { return busy_ == 0 && next_ >= tasks_; });
  fn_ = nullptr;
  tasks_ = 0;
}

}  // namespace cxlpool::engine

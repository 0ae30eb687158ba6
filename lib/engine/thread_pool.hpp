// SPDX-License-Identifier: MIT
// A fixed set of worker threads for the engine's loops: run(tasks, fn) calls fn(0..tasks-1)
// on the caller and the workers and returns when all are done. Every task writes its own
// outputs with a fixed order of arithmetic, so results do not depend on the thread count
// (the prefill and decode processes must agree bit for bit).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cxlpool::engine {

class ThreadPool {
 public:
  // threads: total, the caller included (0: the machine's CPUs); 1 runs everything inline.
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned threads() const { return unsigned(workers_.size()) + 1; }
  // Not reentrant: one run at a time (from one thread).
  void run(size_t tasks, const std::function<void(size_t)>& fn);

 private:
  void work();
  void drain(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t tasks_ = 0, next_ = 0, busy_ = 0, generation_ = 0;
  bool stop_ = false;
};

}  // namespace cxlpool::engine

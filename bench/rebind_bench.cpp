// SPDX-License-Identifier: MIT
// Movable residency against its peers in one run: Device::move_reservation of a fully
// committed range (memfd <-> numa, shm <-> numa), memcpy of the same bytes into fresh memory
// (mmap + copy: the same page faults) and into memory already faulted in, and a naive move
// that copies page by page (mmap 4 KiB, copy, mremap over the old page). Sizes 64 KiB, 2 MiB,
// 4 MiB. bench/run_rebind_bench.py prints the table and ratios. Also what a move checks under its
// fence (os/io_pins.hpp), against the process's descriptors and threads: io_uring registered
// buffers and reads in flight. And what commits on both devices wait while a 1 GiB move runs
// (commit_during_move). Refuses a non-Release build.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "os/io_pins.hpp"

namespace {

using cxlpool::detail::BackingSpec;
using cxlpool::detail::Device;
using cxlpool::detail::Sharing;

constexpr size_t kMiB = size_t(1) << 20;

std::unique_ptr<Device> make(const std::string& kind, size_t capacity = 256 * kMiB) {
  static int counter = 0;
  BackingSpec spec;
  spec.device_name = kind + std::to_string(++counter);
  spec.capacity = capacity;
  if (kind == "numa") {
    spec.kind = CXLPOOL_BACKING_NUMA;
    spec.numa_node = 0;
  } else if (kind == "memfd") {
    spec.kind = CXLPOOL_BACKING_MEMFD;
  } else {
    spec.kind = CXLPOOL_BACKING_SHM;
    spec.path = "cxlpool-rebind-bench-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  }
  return std::make_unique<Device>(spec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One move per iteration, alternating direction, of a reservation whose pages are all there.
void BM_rebind(benchmark::State& state, const char* a, const char* b) {
  const size_t size = size_t(state.range(0));
  auto one = make(a), two = make(b);
  void* base = nullptr;
  if (one->reserve(size, std::min(size, 2 * kMiB), 0, Sharing::kPrivate, 1, &base, nullptr) ||
      one->commit(base, size, false, 1, nullptr)) {
    state.SkipWithError("reserve/commit failed");
    return;
  }
  std::memset(base, 7, size);
  Device* from = one.get();
  Device* to = two.get();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (from->move_reservation(base, *to, nullptr, nullptr) != CXLPOOL_OK) {
      state.SkipWithError("move failed");
      break;
    }
    state.SetIterationTime(seconds_since(t0));
    std::swap(from, to);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(size));
  from->release(base, 1, nullptr);
}

// memcpy of the same bytes into fresh anonymous memory (faults included) or into memory
// already faulted in (hot = true).
void BM_memcpy(benchmark::State& state, bool hot) {
  const size_t size = size_t(state.range(0));
  void* src = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* warm = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::memset(src, 7, size);
  std::memset(warm, 1, size);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    void* dst = hot ? warm : mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memcpy(dst, src, size);
    benchmark::DoNotOptimize(dst);
    state.SetIterationTime(seconds_since(t0));
    if (!hot) munmap(dst, size);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(size));
  munmap(src, size);
  munmap(warm, size);
}

// A naive move: page by page, fresh page, copy, mremap over the old one.
void BM_naive_4k(benchmark::State& state) {
  const size_t size = size_t(state.range(0));
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto* base = static_cast<char*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  std::memset(base, 7, size);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < size; off += page) {
      void* fresh = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      std::memcpy(fresh, base + off, page);
      if (mremap(fresh, page, page, MREMAP_MAYMOVE | MREMAP_FIXED, base + off) == MAP_FAILED) {
        state.SkipWithError("mremap failed");
        break;
      }
    }
    state.SetIterationTime(seconds_since(t0));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(size));
  munmap(base, size);
}

// The two checks a move makes under its fence, in a process holding range(0) more descriptors
// (/dev/null) and range(1) more threads (blocked, as idle threads are).
void BM_io_pins(benchmark::State& state, bool rings) {
  std::vector<int> fds;
  for (int64_t i = 0; i < state.range(0); ++i) fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::vector<std::thread> idle;
  for (int64_t i = 0; i < state.range(1); ++i)
    idle.emplace_back([&] {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop; });
    });
  for (auto _ : state) {
    auto r = rings ? cxlpool::os::io_pins::registered_buffers(0x10000, 0x20000)
                   : cxlpool::os::io_pins::reads_in_flight(0x10000, 0x20000);
    benchmark::DoNotOptimize(r);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (auto& t : idle) t.join();
  for (int fd : fds) close(fd);
}

// What other users of the two devices wait while a move runs: one thread moves a reservation
// of range(0) bytes, all committed, between two devices (a staged copy: shm to memfd and
// back); one thread per device commits and decommits 64 KiB of another reservation of its
// own in a loop meanwhile. Counters: the commits' p50, p99 and longest latency (us) while the
// move ran, and the move's own time.
void BM_commit_during_move(benchmark::State& state) {
  const size_t size = size_t(state.range(0)), chunk = 64 << 10;
  auto one = make("shm", size + 256 * kMiB), two = make("memfd", size + 256 * kMiB);
  void* base = nullptr;
  if (one->reserve(size, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) ||
      one->commit(base, size, true, 1, nullptr)) {
    state.SkipWithError("reserve/commit failed");
    return;
  }
  std::memset(base, 7, size);
  void* side[2] = {};
  for (int i = 0; i < 2; ++i)
    if ((i ? two : one)->reserve(64 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 2, &side[i], nullptr)) {
      state.SkipWithError("reserve failed");
      return;
    }
  Device* from = one.get();
  Device* to = two.get();
  std::vector<double> waits;
  double longest = 0, move_s = 0;
  for (auto _ : state) {
    std::atomic<bool> moving{true};
    std::vector<double> lat[2];
    std::vector<std::thread> users;
    for (int i = 0; i < 2; ++i)
      users.emplace_back([&, i] {
        Device* d = i ? two.get() : one.get();
        for (size_t off = 0; moving.load(std::memory_order_relaxed); off = (off + chunk) % (64 * kMiB)) {
          char* at = static_cast<char*>(side[i]) + off;
          const auto t0 = std::chrono::steady_clock::now();
          if (d->commit(at, chunk, false, 2, nullptr) != CXLPOOL_OK) break;
          lat[i].push_back(seconds_since(t0) * 1e6);
          d->decommit(at, chunk, 2, nullptr);
        }
      });
    const auto t0 = std::chrono::steady_clock::now();
    const cxlpool_status_t st = from->move_reservation(base, *to, nullptr, nullptr);
    const double took = seconds_since(t0);
    moving = false;
    for (auto& u : users) u.join();
    if (st != CXLPOOL_OK) {
      state.SkipWithError("move failed");
      break;
    }
    state.SetIterationTime(took);
    move_s += took;
    for (auto& l : lat)
      for (double us : l) {
        waits.push_back(us);
        longest = std::max(longest, us);
      }
    std::swap(from, to);
  }
  std::sort(waits.begin(), waits.end());
  auto pct = [&](double q) { return waits.empty() ? 0.0 : waits[size_t(q * double(waits.size() - 1))]; };
  state.counters["commit_p50_us"] = pct(0.5);
  state.counters["commit_p99_us"] = pct(0.99);
  state.counters["commit_max_us"] = longest;
  state.counters["commits"] = double(waits.size());
  state.counters["move_ms"] = state.iterations() ? move_s * 1e3 / double(state.iterations()) : 0;
  from->release(base, 1, nullptr);
  one->release(side[0], 2, nullptr);
  two->release(side[1], 2, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (std::string(CXLPOOL_BENCH_BUILD_TYPE) != "Release") {
    std::fprintf(stderr, "rebind_bench: built as %s; benchmarks need CMAKE_BUILD_TYPE=Release\n",
                 CXLPOOL_BENCH_BUILD_TYPE);
    return 2;
  }
  for (int64_t size : {int64_t(64 << 10), int64_t(2 * kMiB), int64_t(4 * kMiB)}) {
    benchmark::RegisterBenchmark("rebind/memfd-numa", BM_rebind, "memfd", "numa")->Arg(size)->UseManualTime();
    benchmark::RegisterBenchmark("rebind/shm-numa", BM_rebind, "shm", "numa")->Arg(size)->UseManualTime();
    benchmark::RegisterBenchmark("memcpy/fresh", BM_memcpy, false)->Arg(size)->UseManualTime();
    benchmark::RegisterBenchmark("memcpy/hot", BM_memcpy, true)->Arg(size)->UseManualTime();
    benchmark::RegisterBenchmark("naive_4k", BM_naive_4k)->Arg(size)->UseManualTime();
  }
  for (int64_t fds : {int64_t(0), int64_t(1000), int64_t(10000)})
    benchmark::RegisterBenchmark("io_pins/registered_buffers", BM_io_pins, true)->Args({fds, 0});
  for (int64_t threads : {int64_t(0), int64_t(100), int64_t(1000)})
    benchmark::RegisterBenchmark("io_pins/reads_in_flight", BM_io_pins, false)->Args({0, threads});
  benchmark::RegisterBenchmark("commit_during_move", BM_commit_during_move)
      ->Arg(int64_t(1024 * kMiB))
      ->Iterations(4)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// SPDX-License-Identifier: MIT
// What reserving a device's room costs on the commit path (docs/backing.md, "Room"), per
// backing, against the same system calls without it, in one run. One 64 KiB slice per
// iteration: Device::commit, then (touch) a write to each of its 16 pages, then decommit.
//   cxlpool_private  a private range: anonymous memory (the file is not used)
//   peer_file_private  the same calls on a MAP_PRIVATE mapping of the file (cxlpool before)
//   peer_anonymous     the same calls on plain anonymous memory (no bookkeeping)
//   cxlpool_shared   a shared range: the commit takes the file's room (fallocate)
//   peer_shared_bare   mprotect + MADV_REMOVE on the shared mapping, no room taken (unsafe)
//   peer_shared_populate the same plus MADV_POPULATE_WRITE (how cxlpool took room before)
// Backings: memfd, a file in /dev/shm (tmpfs), a file in /var/tmp (a disk filesystem).
// Prints the ratios. Refuses a non-Release build.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "device/device.hpp"

namespace {

using cxlpool::detail::BackingSpec;
using cxlpool::detail::Device;
using cxlpool::detail::Sharing;

constexpr size_t kSlice = 64 << 10, kSlices = 64, kPage = 4096;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

std::string dir_of(const std::string& backing) { return backing == "shm" ? "/dev/shm" : "/var/tmp"; }

std::unique_ptr<Device> make(const std::string& backing) {
  static int counter = 0;
  BackingSpec spec;
  spec.device_name = "room-" + backing + std::to_string(++counter);
  spec.capacity = 64 << 20;
  spec.kind = backing == "memfd" ? CXLPOOL_BACKING_MEMFD : CXLPOOL_BACKING_FILE;
  if (backing != "memfd")
    spec.path = dir_of(backing) + "/cxlpool-room-bench-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  return std::make_unique<Device>(spec);
}

void touch(char* p) {
  for (size_t off = 0; off < kSlice; off += kPage) static_cast<volatile char*>(p)[off] = 1;
}

// A fresh unnamed file of the backing, kSlices slices long.
int open_file(const std::string& backing) {
  int fd = backing == "memfd" ? memfd_create("room-bench", MFD_CLOEXEC)
                              : open(dir_of(backing).c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 && ftruncate(fd, off_t(kSlice * kSlices)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void BM_cxlpool(benchmark::State& state, const char* backing, bool shared) {
  const bool do_touch = state.range(0) != 0;
  auto dev = make(backing);
  void* base = nullptr;
  if (dev->reserve(kSlice * kSlices, kSlice, 0, shared ? Sharing::kShared : Sharing::kPrivate, 1, &base, nullptr)) {
    state.SkipWithError("reserve failed");
    return;
  }
  auto* p = static_cast<char*>(base);
  size_t i = 0;
  for (auto _ : state) {
    char* s = p + (i++ % kSlices) * kSlice;
    if (dev->commit(s, kSlice, false, 1, nullptr)) {
      state.SkipWithError("commit failed");
      break;
    }
    if (do_touch) touch(s);
    dev->decommit(s, kSlice, 1, nullptr);
  }
  dev->release(base, 1, nullptr);
}

// The system calls of a commit and a decommit on a mapping of kind `how`, without cxlpool.
enum class Peer { kFilePrivate, kAnonymous, kSharedBare, kSharedPopulate };

void BM_peer(benchmark::State& state, const char* backing, Peer how) {
  const bool do_touch = state.range(0) != 0;
  const size_t len = kSlice * kSlices;
  int fd = how == Peer::kAnonymous ? -1 : open_file(backing);
  if (how != Peer::kAnonymous && fd < 0) {
    state.SkipWithError("cannot open a file");
    return;
  }
  const bool shared = how == Peer::kSharedBare || how == Peer::kSharedPopulate;
  void* m = how == Peer::kAnonymous
                ? mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                : mmap(nullptr, len, PROT_NONE, shared ? MAP_SHARED : MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  auto* p = static_cast<char*>(m);
  size_t i = 0;
  for (auto _ : state) {
    char* s = p + (i++ % kSlices) * kSlice;
    mprotect(s, kSlice, PROT_READ | PROT_WRITE);
    if (how == Peer::kSharedPopulate) madvise(s, kSlice, MADV_POPULATE_WRITE);
    if (do_touch) touch(s);
    madvise(s, kSlice, shared ? MADV_REMOVE : MADV_DONTNEED);
    mprotect(s, kSlice, PROT_NONE);
  }
  munmap(m, len);
  if (fd >= 0) close(fd);
}

#define ROOM_BACKING(b)                                                                                   \
  BENCHMARK_CAPTURE(BM_cxlpool, private_##b, #b, false)->ArgName("touch")->Arg(0)->Arg(1);                \
  BENCHMARK_CAPTURE(BM_peer, file_private_##b, #b, Peer::kFilePrivate)->ArgName("touch")->Arg(0)->Arg(1); \
  BENCHMARK_CAPTURE(BM_cxlpool, shared_##b, #b, true)->ArgName("touch")->Arg(0)->Arg(1);                  \
  BENCHMARK_CAPTURE(BM_peer, shared_bare_##b, #b, Peer::kSharedBare)->ArgName("touch")->Arg(0)->Arg(1);   \
  BENCHMARK_CAPTURE(BM_peer, shared_populate_##b, #b, Peer::kSharedPopulate)->ArgName("touch")->Arg(0)->Arg(1)
ROOM_BACKING(memfd);
ROOM_BACKING(shm);
ROOM_BACKING(disk);
BENCHMARK_CAPTURE(BM_peer, anonymous, "none", Peer::kAnonymous)->ArgName("touch")->Arg(0)->Arg(1);

// Console output plus the ratios that answer "what does the reservation cost".
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  // Medians when repeated (--benchmark_repetitions), else the one run; wall and CPU time (on a
  // loaded machine CPU time is the steadier figure).
  void ReportRuns(const std::vector<Run>& runs) override {
    for (auto& r : runs) {
      if (r.error_occurred) continue;
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
      if (r.run_type == Run::RT_Iteration && r.repetitions > 1) continue;
      times_[r.run_name.str()] = {r.GetAdjustedRealTime(), r.GetAdjustedCPUTime()};
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    auto t = [&](const std::string& n) {
      auto it = times_.find(n);
      return it == times_.end() ? std::pair<double, double>{0, 0} : it->second;
    };
    std::printf("\nratios per 64 KiB slice (wall time, CPU time):\n");
    for (const char* b : {"memfd", "shm", "disk"})
      for (int touch : {0, 1}) {
        const std::string a = "/touch:" + std::to_string(touch);
        auto ratio = [&](const std::string& x, const std::string& y) {
          const auto tx = t(x + a), ty = t(y + a);
          std::printf("  %-5s touch=%d %-30s / %-34s %6.2fx %6.2fx\n", b, touch, x.c_str(), y.c_str(),
                      ty.first > 0 ? tx.first / ty.first : 0.0, ty.second > 0 ? tx.second / ty.second : 0.0);
        };
        ratio("BM_cxlpool/shared_" + std::string(b), "BM_peer/shared_bare_" + std::string(b));
        ratio("BM_cxlpool/shared_" + std::string(b), "BM_peer/shared_populate_" + std::string(b));
        ratio("BM_cxlpool/private_" + std::string(b), "BM_peer/file_private_" + std::string(b));
        ratio("BM_cxlpool/private_" + std::string(b), "BM_peer/anonymous");
      }
  }

 private:
  std::map<std::string, std::pair<double, double>> times_;
};

}  // namespace

int main(int argc, char** argv) {
  if (std::strcmp(CXLPOOL_BENCH_BUILD_TYPE, "Release") != 0) {
    std::fprintf(stderr, "room_bench: refusing to report from a %s build; configure with -DCMAKE_BUILD_TYPE=Release\n",
                 *CXLPOOL_BENCH_BUILD_TYPE ? CXLPOOL_BENCH_BUILD_TYPE : "unspecified");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

// SPDX-License-Identifier: MIT
// Shared pools (include/cxlpool/shared.h) against Boost.Interprocess in one run: alloc/free
// throughput of 1, 2 and 4 processes on one pool in /dev/shm, publish/acquire per size on a
// non-coherent and a coherent pool, handle round trips, the detection and recovery of dead
// participants, the CPU the watch takes at rest, a breakdown of what one cxlpool alloc+free
// pays for, and counts of live participants wrongly evicted (hazard/). bench/run_shared_bench.py
// runs it and prints the tables. Refuses to run from a non-Release build.
//
// Multi-process figures fork their children (each opens the pool or the segment itself, as a
// real participant would), warm up, wait at a barrier, then run the same number of operations;
// the time is from the barrier to the last child done (manual time, one iteration per
// repetition: repeat with --benchmark_repetitions and take the median).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/shared.h"
#include "shared/layout.hpp"  // only to read a slot's eviction word: when recovery of a dead one began

namespace {

namespace bip = boost::interprocess;

uint64_t g_ops = 400000;    // timed alloc+free pairs per process
uint64_t g_warmup = 50000;  // untimed pairs per process before the barrier
constexpr uint64_t kThroughputPool = 256u << 20;

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

uint64_t cpu_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

std::string unique_name(const char* tag) {
  static int counter = 0;
  return std::string("cxlpool-bench-") + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= size_t(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= size_t(r);
  }
  return true;
}

int wait_child(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Parameters with the size set; timing 0 keeps the defaults (10 ms / 5000 ms / 10 minutes
// stopped). A timing given is also the stopped timeout: the SIGSTOP rows measure it.
cxlpool_shared_params_t* make_params(uint64_t size, cxlpool_coherence_t coherence, uint32_t hb_ms = 0,
                                     uint32_t timeout_ms = 0) {
  cxlpool_shared_params_t* p = nullptr;
  if (cxlpool_shared_params_create(&p) != CXLPOOL_OK || cxlpool_shared_params_set_size(p, size) != CXLPOOL_OK ||
      cxlpool_shared_params_set_coherence(p, coherence) != CXLPOOL_OK ||
      (hb_ms != 0 && cxlpool_shared_params_set_lease_timing(p, hb_ms, timeout_ms) != CXLPOOL_OK) ||
      (hb_ms != 0 && cxlpool_shared_params_set_stopped_timeout(p, timeout_ms) != CXLPOOL_OK)) {
    std::fprintf(stderr, "shared_bench: parameters: %s\n", cxlpool_last_error_message());
    std::exit(1);
  }
  return p;
}

cxlpool_shared_pool_t* create_pool(const std::string& device, uint64_t size, cxlpool_coherence_t coherence,
                                   uint32_t hb_ms = 0, uint32_t timeout_ms = 0) {
  cxlpool_shared_params_t* params = make_params(size, coherence, hb_ms, timeout_ms);
  cxlpool_shared_pool_t* pool = nullptr;
  if (cxlpool_shared_pool_create(device.c_str(), params, 0, &pool) != CXLPOOL_OK) {
    std::fprintf(stderr, "shared_bench: create %s: %s\n", device.c_str(), cxlpool_last_error_message());
    std::exit(1);
  }
  cxlpool_shared_params_destroy(params);
  return pool;
}

// ---- The two heaps, same interface ------------------------------------------------------

struct CxlpoolHeap {
  cxlpool_shared_pool_t* pool = nullptr;
  void* alloc(size_t n) {
    void* p = nullptr;
    return cxlpool_shared_alloc(pool, n, &p) == CXLPOOL_OK ? p : nullptr;
  }
  bool free(void* p) { return cxlpool_shared_free(pool, p) == CXLPOOL_OK; }
  static const char* last_error() { return cxlpool_last_error_message(); }
};

struct BoostHeap {
  bip::managed_shared_memory* segment = nullptr;
  void* alloc(size_t n) { return segment->allocate(n, std::nothrow); }
  bool free(void* p) {
    segment->deallocate(p);
    return true;
  }
  static const char* last_error() { return "allocate returned null"; }
};

// Request sizes: all 256 B, or uniform in [128, 4096] from a fixed seed (the same sequence for
// both heaps; each process its own stream).
constexpr size_t kSizeTable = 4096;
std::vector<uint32_t> size_table(bool mixed, unsigned seed) {
  std::vector<uint32_t> t(kSizeTable, 256);
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  if (mixed)
    for (auto& s : t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      s = 128 + uint32_t((x >> 33) % (4096 - 128 + 1));
    }
  return t;
}

// The loop measured: alloc, write one word, free; with burst > 1, burst allocations (each
// written) then their frees in the same order, so that many blocks are live at once and a
// per-process block cache cannot serve them all (cxlpool's holds 64 of 256 B).
constexpr uint64_t kBurst = 512;
template <class Heap>
bool alloc_write_free(Heap& heap, const std::vector<uint32_t>& sizes, uint64_t ops, uint64_t burst) {
  std::vector<void*> live(burst);
  for (uint64_t i = 0; i < ops; i += burst) {
    const uint64_t n = std::min(burst, ops - i);
    for (uint64_t k = 0; k < n; ++k) {
      void* p = heap.alloc(sizes[(i + k) % kSizeTable]);
      if (!p) return false;
      *static_cast<volatile uint64_t*>(p) = i + k;
      live[k] = p;
    }
    for (uint64_t k = 0; k < n; ++k)
      if (!heap.free(live[k])) return false;
  }
  return true;
}

struct ChildResult {
  uint64_t start_ns = 0, end_ns = 0, ops = 0;
  uint64_t cpu_ns = 0;  // this process's CPU time in the timed loop (time taken by other work excluded)
  int32_t error = 0;    // 0 ok; else which step failed
  char message[228] = {};
};
static_assert(sizeof(ChildResult) <= PIPE_BUF, "one atomic pipe write per child");

void note_error(ChildResult* r, int32_t step, const char* why) {
  r->error = step;
  std::snprintf(r->message, sizeof r->message, "step %d: %s", int(step), why);
}

enum class Impl { kCxlpool, kBoost };

// One child: open the heap, warm up, barrier, timed loop, report.
template <class Heap>
ChildResult child_run(Heap& heap, bool mixed, uint64_t burst, unsigned index, int ready_fd, int go_fd) {
  ChildResult r;
  const auto sizes = size_table(mixed, index);
  if (!alloc_write_free(heap, sizes, g_warmup, burst)) note_error(&r, 2, heap.last_error());
  char byte = 1;
  if (!write_all(ready_fd, &byte, 1)) note_error(&r, 3, "ready pipe");
  if (read(go_fd, &byte, 1) != 0) note_error(&r, 4, "go pipe");  // the parent closes its end: EOF for all at once
  const uint64_t cpu0 = cpu_now_ns();
  r.start_ns = now_ns();
  if (r.error == 0 && !alloc_write_free(heap, sizes, g_ops, burst)) note_error(&r, 5, heap.last_error());
  r.end_ns = now_ns();
  r.cpu_ns = cpu_now_ns() - cpu0;
  r.ops = g_ops;
  return r;
}

void BM_alloc_free(benchmark::State& state, Impl impl, bool mixed, uint64_t burst, int procs) {
  const std::string name = unique_name(impl == Impl::kCxlpool ? "tput" : "tput-boost");
  const std::string device = "shm:" + name;
  std::unique_ptr<bip::managed_shared_memory> boost_seg;
  cxlpool_shared_pool_t* creator = nullptr;
  if (impl == Impl::kCxlpool) {
    // The creator stays (idle) until the children are done, so each child joins a slot never
    // used before: a joiner reusing a slot can be declared dead while it joins (its new pid is
    // seen with the previous occupant's start time; see docs/shared.md, "Measured"). The lease
    // is 3 s instead of 300 ms: on a loaded 2-CPU host a busy 4-process run once had a child
    // evicted; the heartbeat (10 ms) and so the cost per call are the defaults'.
    creator = create_pool(device, kThroughputPool, CXLPOOL_COHERENCE_HOST, 10, 3000);
  } else {
    bip::shared_memory_object::remove(name.c_str());
    boost_seg = std::make_unique<bip::managed_shared_memory>(bip::create_only, name.c_str(), kThroughputPool);
  }
  for (auto _ : state) {
    int ready[2], go[2], result[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(result) != 0) {
      state.SkipWithError("pipe failed");
      break;
    }
    std::vector<pid_t> kids;
    for (int k = 0; k < procs; ++k) {
      pid_t pid = fork();
      if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        close(result[0]);
        ChildResult r;
        if (impl == Impl::kCxlpool) {
          CxlpoolHeap heap;
          if (cxlpool_shared_pool_open(device.c_str(), nullptr, &heap.pool) == CXLPOOL_OK) {
            r = child_run(heap, mixed, burst, unsigned(k), ready[1], go[0]);
            cxlpool_shared_pool_close(heap.pool);
          } else {
            note_error(&r, 1, cxlpool_last_error_message());
          }
        } else {
          try {
            bip::managed_shared_memory seg(bip::open_only, name.c_str());
            BoostHeap heap{&seg};
            r = child_run(heap, mixed, burst, unsigned(k), ready[1], go[0]);
          } catch (const std::exception& e) {
            note_error(&r, 1, e.what());
          }
        }
        if (r.error == 1) {  // never reached the barrier: count as ready so the parent goes on
          char byte = 0;
          (void)write_all(ready[1], &byte, 1);
        }
        (void)write_all(result[1], &r, sizeof r);
        _exit(0);
      }
      kids.push_back(pid);
    }
    close(ready[1]);
    close(go[0]);
    close(result[1]);
    for (int k = 0; k < procs; ++k) {
      char byte = 0;
      (void)read_all(ready[0], &byte, 1);
    }
    close(go[1]);  // go
    std::vector<ChildResult> rs(size_t(procs), ChildResult{});
    bool ok = true;
    for (auto& r : rs) ok = read_all(result[0], &r, sizeof r) && ok;
    for (pid_t pid : kids) ok = wait_child(pid) == 0 && ok;
    close(ready[0]);
    close(result[0]);
    uint64_t first = UINT64_MAX, last = 0, total = 0;
    double per_proc = 0, per_cpu_s = 0, cpu_total = 0;
    std::string failure = "a child failed";
    for (auto& r : rs) {
      if (r.error != 0) failure = r.message;
      ok = ok && r.error == 0;
      first = std::min(first, r.start_ns);
      last = std::max(last, r.end_ns);
      total += r.ops;
      per_proc += double(r.ops) / (double(r.end_ns - r.start_ns) * 1e-9);
      per_cpu_s += double(r.ops) / (double(std::max<uint64_t>(r.cpu_ns, 1)) * 1e-9);
      cpu_total += double(r.cpu_ns) * 1e-9;
    }
    if (!ok) {
      state.SkipWithError(failure.c_str());
      break;
    }
    const double wall = double(last - first) * 1e-9;
    state.SetIterationTime(wall);
    state.counters["procs"] = procs;
    state.counters["ops_total"] = double(total);
    state.counters["agg_ops_per_s"] = double(total) / wall;
    state.counters["per_proc_ops_per_s"] = per_proc / procs;
    state.counters["per_proc_ops_per_cpu_s"] = per_cpu_s / procs;  // ops per second of CPU actually received
    state.counters["cpus_used"] = cpu_total / wall;                // of the machine's CPUs, on average
  }
  if (impl == Impl::kCxlpool) {
    cxlpool_shared_pool_close(creator);
    cxlpool_shared_pool_unlink(device.c_str());
  } else {
    bip::shared_memory_object::remove(name.c_str());
  }
}

// ---- Publish / acquire ------------------------------------------------------------------

// A coherent (HOST) and a non-coherent (NONE) pool, one block per measured size.
struct CoherencePools {
  std::string names[2];
  cxlpool_shared_pool_t* pools[2] = {nullptr, nullptr};
  std::vector<void*> blocks[2];
  static constexpr size_t kSizes[4] = {64, 4096, 65536, 1u << 20};
  CoherencePools() {
    const cxlpool_coherence_t modes[2] = {CXLPOOL_COHERENCE_NONE, CXLPOOL_COHERENCE_HOST};
    for (int m = 0; m < 2; ++m) {
      names[m] = unique_name(m == 0 ? "none" : "host");
      pools[m] = create_pool("shm:" + names[m], 64u << 20, modes[m]);
      for (size_t s : kSizes) {
        void* p = nullptr;
        if (cxlpool_shared_alloc(pools[m], s, &p) != CXLPOOL_OK) std::exit(1);
        std::memset(p, 1, s);
        blocks[m].push_back(p);
      }
    }
  }
  ~CoherencePools() {
    for (int m = 0; m < 2; ++m) {
      cxlpool_shared_pool_close(pools[m]);
      cxlpool_shared_pool_unlink(("shm:" + names[m]).c_str());
    }
  }
};
// Made on first use (a run filtered to other figures has no extra heartbeat threads).
std::unique_ptr<CoherencePools> g_coherence;
CoherencePools& coherence_pools() {
  if (!g_coherence) g_coherence = std::make_unique<CoherencePools>();
  return *g_coherence;
}

enum class CohOp { kPublish, kPublishDirty, kAcquire, kAcquireRead };

// m: 0 NONE, 1 HOST. Dirty: one store per line first (the writer's real pattern); read: one
// load per line after acquiring (the reader's). The HOST rows are the same loops with no-op calls.
void BM_coherence(benchmark::State& state, CohOp op, int m, int size_index) {
  const size_t n = CoherencePools::kSizes[size_index];
  auto* p = static_cast<char*>(coherence_pools().blocks[m][size_t(size_index)]);
  const size_t lines = n / 64;
  uint64_t sum = 0, i = 0;
  for (auto _ : state) {
    switch (op) {
      case CohOp::kPublish:
        cxlpool_publish(p, n);
        break;
      case CohOp::kPublishDirty:
        for (size_t l = 0; l < lines; ++l) *reinterpret_cast<volatile uint64_t*>(p + l * 64) = i;
        cxlpool_publish(p, n);
        break;
      case CohOp::kAcquire:
        cxlpool_acquire(p, n);
        break;
      case CohOp::kAcquireRead:
        cxlpool_acquire(p, n);
        for (size_t l = 0; l < lines; ++l) sum += *reinterpret_cast<volatile uint64_t*>(p + l * 64);
        break;
    }
    ++i;
  }
  benchmark::DoNotOptimize(sum);
  state.counters["bytes"] = double(n);
  state.counters["lines"] = double(lines);
}

// ---- Handles ------------------------------------------------------------------------------

// Two participants in this process (each open is its own slot): a owns, b imports.
struct HandlePools {
  std::string name;
  cxlpool_shared_pool_t* a = nullptr;
  cxlpool_shared_pool_t* b = nullptr;
  HandlePools() {
    name = unique_name("handles");
    a = create_pool("shm:" + name, 64u << 20, CXLPOOL_COHERENCE_HOST);
    if (cxlpool_shared_pool_open(("shm:" + name).c_str(), nullptr, &b) != CXLPOOL_OK) std::exit(1);
  }
  ~HandlePools() {
    cxlpool_shared_pool_close(b);
    cxlpool_shared_pool_close(a);
    cxlpool_shared_pool_unlink(("shm:" + name).c_str());
  }
};
std::unique_ptr<HandlePools> g_handles;
HandlePools& handle_pools() {
  if (!g_handles) g_handles = std::make_unique<HandlePools>();
  return *g_handles;
}

enum class HandleOp { kExport, kImportRelease, kRoundTrip, kLifecycle, kAllocFree };

void BM_handle(benchmark::State& state, HandleOp op) {
  cxlpool_shared_pool_t* a = handle_pools().a;
  cxlpool_shared_pool_t* b = handle_pools().b;
  void* p = nullptr;
  if (op != HandleOp::kLifecycle && op != HandleOp::kAllocFree && cxlpool_shared_alloc(a, 256, &p) != CXLPOOL_OK) {
    state.SkipWithError("alloc failed");
    return;
  }
  cxlpool_shared_handle_t h{};
  if (p && cxlpool_shared_export(a, p, &h) != CXLPOOL_OK) {
    state.SkipWithError("export failed");
    return;
  }
  bool ok = true;
  for (auto _ : state) {
    void* q = nullptr;
    switch (op) {
      case HandleOp::kExport:
        ok = cxlpool_shared_export(a, p, &h) == CXLPOOL_OK;
        break;
      case HandleOp::kImportRelease:
        ok = cxlpool_shared_import(b, &h, &q, nullptr) == CXLPOOL_OK && cxlpool_shared_release(b, q) == CXLPOOL_OK;
        break;
      case HandleOp::kRoundTrip:
        ok = cxlpool_shared_export(a, p, &h) == CXLPOOL_OK && cxlpool_shared_import(b, &h, &q, nullptr) == CXLPOOL_OK &&
             cxlpool_shared_release(b, q) == CXLPOOL_OK;
        break;
      case HandleOp::kLifecycle:
        ok = cxlpool_shared_alloc(a, 256, &p) == CXLPOOL_OK && cxlpool_shared_export(a, p, &h) == CXLPOOL_OK &&
             cxlpool_shared_import(b, &h, &q, nullptr) == CXLPOOL_OK && cxlpool_shared_release(b, q) == CXLPOOL_OK &&
             cxlpool_shared_free(a, p) == CXLPOOL_OK;
        break;
      case HandleOp::kAllocFree:
        ok = cxlpool_shared_alloc(a, 256, &p) == CXLPOOL_OK && cxlpool_shared_free(a, p) == CXLPOOL_OK;
        break;
    }
    if (!ok) {
      state.SkipWithError(cxlpool_last_error_message());
      break;
    }
  }
  if (p && op != HandleOp::kLifecycle && op != HandleOp::kAllocFree) cxlpool_shared_free(a, p);
}

// Boost's counterpart: a handle is an offset from the segment base (no validation, no lease).
void BM_handle_boost(benchmark::State& state) {
  const std::string name = unique_name("handles-boost");
  bip::shared_memory_object::remove(name.c_str());
  {
    bip::managed_shared_memory seg(bip::create_only, name.c_str(), 64u << 20);
    void* p = seg.allocate(256);
    for (auto _ : state) {
      auto h = seg.get_handle_from_address(p);
      benchmark::DoNotOptimize(h);
      void* q = seg.get_address_from_handle(h);
      benchmark::DoNotOptimize(q);
    }
    seg.deallocate(p);
  }
  bip::shared_memory_object::remove(name.c_str());
}

// ---- Dead participants ------------------------------------------------------------------

enum class Death { kKill, kStop };
enum class Fill { kFew, kQuarter, kQuarterExported };

// Reads a slot's eviction word (layout.hpp: line 1 word 0, phase in the low 8 bits).
struct EvictionWatch {
  const std::byte* base = nullptr;
  size_t len = 0;
  uint64_t slots_offset = 0;
  bool map(const std::string& name) {
    int fd = open(("/dev/shm/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    cxlpool::detail::shared::Superblock sb{};
    const bool ok = pread(fd, &sb, sizeof sb, 0) == ssize_t(sizeof sb);
    len = sb.slots_offset + size_t{sb.hosts} * sb.slots_per_host * cxlpool::detail::shared::kSlotBytes;
    void* m = ok ? mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) return false;
    base = static_cast<const std::byte*>(m);
    slots_offset = sb.slots_offset;
    return true;
  }
  ~EvictionWatch() {
    if (base) munmap(const_cast<std::byte*>(base), len);
  }
  uint8_t phase(uint32_t slot) const {
    const auto* w = reinterpret_cast<const uint64_t*>(
        base + slots_offset + uint64_t{slot} * cxlpool::detail::shared::kSlotBytes + cxlpool::detail::shared::kLine);
    return uint8_t(__atomic_load_n(w, __ATOMIC_ACQUIRE) & 0xff);
  }
};

// The parent creates the pool and stays a participant (the survivor that recovers); a child
// joins, allocates 256 B blocks (few: 1000; quarter: a quarter of the pool's bytes, optionally
// all exported, so recovery probes every live slot's leases per block), reports its slot, then
// is killed or stopped. Time from kill(2) to the survivor's eviction word "recovering"
// (detection) and to recovered_slots counting it (recovery done).
void BM_recovery(benchmark::State& state, Death death, uint64_t pool_bytes, Fill fill, uint32_t hb_ms,
                 uint32_t timeout_ms) {
  for (auto _ : state) {
    const std::string name = unique_name("recover");
    const std::string device = "shm:" + name;
    cxlpool_shared_pool_t* pool = create_pool(device, pool_bytes, CXLPOOL_COHERENCE_HOST, hb_ms, timeout_ms);
    EvictionWatch watch;
    int ready[2];
    if (!watch.map(name) || pipe(ready) != 0) {
      state.SkipWithError("cannot map the pool or make a pipe");
      cxlpool_shared_pool_close(pool);
      cxlpool_shared_pool_unlink(device.c_str());
      break;
    }
    const uint64_t blocks = fill == Fill::kFew ? 1000 : pool_bytes / 4 / 256;
    pid_t child = fork();
    if (child == 0) {
      close(ready[0]);
      cxlpool_shared_pool_t* c = nullptr;
      if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
      for (uint64_t k = 0; k < blocks; ++k) {
        void* p = nullptr;
        if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK) _exit(3);
        cxlpool_shared_handle_t h{};
        if (fill == Fill::kQuarterExported && cxlpool_shared_export(c, p, &h) != CXLPOOL_OK) _exit(4);
      }
      cxlpool_shared_info_t i{};
      if (cxlpool_shared_pool_info(c, &i) != CXLPOOL_OK) _exit(5);
      uint64_t msg[2] = {i.slot, i.extents_mine};
      if (!write_all(ready[1], msg, sizeof msg)) _exit(6);
      for (;;) pause();
    }
    close(ready[1]);
    uint64_t msg[2] = {0, 0};
    const bool ready_ok = read_all(ready[0], msg, sizeof msg);
    close(ready[0]);
    if (!ready_ok) {
      state.SkipWithError("the child failed to join or fill the pool");
      kill(child, SIGKILL);
      wait_child(child);
      cxlpool_shared_pool_close(pool);
      cxlpool_shared_pool_unlink(device.c_str());
      break;
    }
    const auto slot = uint32_t(msg[0]);
    cxlpool_shared_info_t before{};
    cxlpool_shared_pool_info(pool, &before);
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * hb_ms + 5));  // the survivor has seen it beat
    const uint64_t t0 = now_ns();
    kill(child, death == Death::kKill ? SIGKILL : SIGSTOP);
    uint64_t t_detect = 0, t_done = 0, stall = 0;
    const uint64_t deadline = t0 + uint64_t{timeout_ms} * 10 * 1000000u + 10000000000ull;
    while (now_ns() < deadline) {
      const uint8_t ph = watch.phase(slot);
      const uint64_t t = now_ns();
      if (ph != cxlpool::detail::shared::kEvictNone && t_detect == 0) t_detect = t;
      if (ph == cxlpool::detail::shared::kEvictRecovering && stall == 0) {
        // Caught mid-recovery: how long does the survivor's own allocation wait meanwhile?
        void* p = nullptr;
        if (cxlpool_shared_alloc(pool, 256, &p) == CXLPOOL_OK) cxlpool_shared_free(pool, p);
        stall = now_ns() - t;
      }
      if (ph == cxlpool::detail::shared::kEvictDone) {
        cxlpool_shared_info_t i{};
        while (cxlpool_shared_pool_info(pool, &i) == CXLPOOL_OK && i.recovered_slots == before.recovered_slots &&
               now_ns() < deadline) {
        }
        t_done = now_ns();
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    kill(child, SIGKILL);
    wait_child(child);
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(device.c_str());
    if (t_done == 0) {
      state.SkipWithError("the dead participant was not recovered in time");
      break;
    }
    state.SetIterationTime(double(t_done - t0) * 1e-9);
    state.counters["detect_ms"] = double(t_detect - t0) * 1e-6;
    state.counters["recover_ms"] = double(t_done - t_detect) * 1e-6;
    state.counters["stall_ms"] = double(stall) * 1e-6;  // 0: recovery ended before a poll saw it running
    state.counters["extents_adopted"] = double(msg[1]);
    state.counters["blocks"] = double(blocks);
    state.counters["extents_total"] = double(before.extents_total);
    state.counters["heartbeat_ms"] = hb_ms;
    state.counters["timeout_ms"] = timeout_ms;
  }
}

// ---- The watch at rest ------------------------------------------------------------------

// CPU the heartbeat threads of n idle participants take (n opens in this process, each its own
// slot and thread): every heartbeat each one looks at the n-1 others, reading /proc per peer.
void BM_watch_idle(benchmark::State& state, int participants) {
  const std::string name = unique_name("watch");
  std::vector<cxlpool_shared_pool_t*> pools;
  pools.push_back(create_pool("shm:" + name, 64u << 20, CXLPOOL_COHERENCE_HOST));
  for (int k = 1; k < participants; ++k) {
    cxlpool_shared_pool_t* p = nullptr;
    if (cxlpool_shared_pool_open(("shm:" + name).c_str(), nullptr, &p) != CXLPOOL_OK) {
      state.SkipWithError(cxlpool_last_error_message());
      break;
    }
    pools.push_back(p);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // every thread has started beating
  for (auto _ : state) {
    timespec c0{}, c1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    const uint64_t t0 = now_ns();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double wall = double(now_ns() - t0) * 1e-9;
    const double cpu = double(c1.tv_sec - c0.tv_sec) + double(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    state.SetIterationTime(wall);
    state.counters["participants"] = participants;
    state.counters["cpu_percent"] = 100.0 * cpu / wall;  // of one CPU, all participants together
    state.counters["cpu_percent_each"] = 100.0 * cpu / wall / participants;
  }
  for (auto it = pools.rbegin(); it != pools.rend(); ++it) cxlpool_shared_pool_close(*it);
  cxlpool_shared_pool_unlink(("shm:" + name).c_str());
}

// ---- Hazards: counts of live participants evicted (docs/shared.md, "Problems found") ----------

// A watcher (heartbeat 1 ms, lease 10 s: only the pid check can fire) and children that join
// one after the other, each into the slot the previous one left: how many live joiners are
// declared dead while joining.
void BM_join_reused_slot(benchmark::State& state, int rounds) {
  for (auto _ : state) {
    const std::string name = unique_name("join");
    const std::string device = "shm:" + name;
    cxlpool_shared_pool_t* creator = create_pool(device, 16u << 20, CXLPOOL_COHERENCE_HOST, 1, 10000);
    cxlpool_shared_pool_t* watcher = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &watcher) != CXLPOOL_OK) {
      state.SkipWithError(cxlpool_last_error_message());
      break;
    }
    cxlpool_shared_pool_close(creator);  // slot 0 free, its pid and start time left behind
    const uint64_t t0 = now_ns();
    int evicted = 0, failed = 0;
    for (int r = 0; r < rounds; ++r) {
      pid_t child = fork();
      if (child == 0) {
        cxlpool_shared_pool_t* me = nullptr;
        if (cxlpool_shared_pool_open(device.c_str(), nullptr, &me) != CXLPOOL_OK) _exit(2);
        usleep(3000);  // a few of the watcher's heartbeats
        void* p = nullptr;
        const cxlpool_status_t st = cxlpool_shared_alloc(me, 256, &p);
        if (st == CXLPOOL_OK) cxlpool_shared_free(me, p);
        cxlpool_shared_pool_close(me);
        _exit(st == CXLPOOL_E_EVICTED ? 1 : st == CXLPOOL_OK ? 0 : 3);
      }
      const int code = wait_child(child);
      evicted += code == 1;
      failed += code != 0 && code != 1;
    }
    cxlpool_shared_info_t info{};
    cxlpool_shared_pool_info(watcher, &info);
    cxlpool_shared_pool_close(watcher);
    cxlpool_shared_pool_unlink(device.c_str());
    state.SetIterationTime(double(now_ns() - t0) * 1e-9);
    state.counters["rounds"] = rounds;
    state.counters["live_joiners_evicted"] = evicted;
    state.counters["watcher_recovered"] = double(info.recovered_slots);
    state.counters["other_failures"] = failed;
  }
}

// Two participants in one child process; the whole process is stopped past the lease (default
// 300 ms) and resumed: in how many rounds does one evict the other?
void BM_stalled_observer(benchmark::State& state, int rounds, int stop_ms) {
  for (auto _ : state) {
    const uint64_t t0 = now_ns();
    int evictions = 0, failed = 0;
    for (int r = 0; r < rounds; ++r) {
      const std::string device = "shm:" + unique_name("stall");
      int ready[2];
      if (pipe(ready) != 0) break;
      pid_t child = fork();
      if (child == 0) {
        close(ready[0]);
        cxlpool_shared_pool_t* a = create_pool(device, 16u << 20, CXLPOOL_COHERENCE_HOST);
        cxlpool_shared_pool_t* b = nullptr;
        if (cxlpool_shared_pool_open(device.c_str(), nullptr, &b) != CXLPOOL_OK) _exit(2);
        char byte = 1;
        if (!write_all(ready[1], &byte, 1)) _exit(3);
        std::this_thread::sleep_for(std::chrono::milliseconds(150 + stop_ms + 200));  // stopped meanwhile
        void* p = nullptr;
        cxlpool_status_t sa = cxlpool_shared_alloc(a, 256, &p);
        if (sa == CXLPOOL_OK) cxlpool_shared_free(a, p);
        cxlpool_status_t sb = cxlpool_shared_alloc(b, 256, &p);
        if (sb == CXLPOOL_OK) cxlpool_shared_free(b, p);
        cxlpool_shared_pool_close(b);
        cxlpool_shared_pool_close(a);
        cxlpool_shared_pool_unlink(device.c_str());
        _exit(sa == CXLPOOL_E_EVICTED || sb == CXLPOOL_E_EVICTED ? 1 : sa == CXLPOOL_OK && sb == CXLPOOL_OK ? 0 : 4);
      }
      close(ready[1]);
      char byte = 0;
      const bool ok = read_all(ready[0], &byte, 1);
      close(ready[0]);
      if (ok) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        kill(child, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(stop_ms));
        kill(child, SIGCONT);
      }
      const int code = wait_child(child);
      evictions += code == 1;
      failed += code != 0 && code != 1;
    }
    state.SetIterationTime(double(now_ns() - t0) * 1e-9);
    state.counters["rounds"] = rounds;
    state.counters["stop_ms"] = stop_ms;
    state.counters["rounds_with_eviction"] = evictions;
    state.counters["other_failures"] = failed;
  }
}

// ---- Breakdown: what one call pays for --------------------------------------------------

// Same-host liveness (watch.cpp) reads these per other participant per heartbeat; the bench
// replays the reads to price them.
ssize_t read_small(const char* path, char* buf, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  return n;
}

enum class Part { kGetpid, kClock, kMutex, kLivenessProbe, kInfo, kAllocFreeNone, kCxlpoolAllocFree, kBoostAllocFree };

void BM_part(benchmark::State& state, Part part) {
  std::mutex mu;
  char buf[1024];
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(getpid()));
  std::string name;
  cxlpool_shared_pool_t* pool = nullptr;
  std::unique_ptr<bip::managed_shared_memory> seg;
  if (part == Part::kInfo || part == Part::kCxlpoolAllocFree || part == Part::kAllocFreeNone) {
    name = unique_name("part");
    pool = create_pool("shm:" + name, kThroughputPool,
                       part == Part::kAllocFreeNone ? CXLPOOL_COHERENCE_NONE : CXLPOOL_COHERENCE_HOST);
  }
  if (part == Part::kBoostAllocFree) {
    name = unique_name("part-boost");
    bip::shared_memory_object::remove(name.c_str());
    seg = std::make_unique<bip::managed_shared_memory>(bip::create_only, name.c_str(), kThroughputPool);
  }
  CxlpoolHeap cxl{pool};
  BoostHeap boost{seg.get()};
  uint64_t i = 0;
  for (auto _ : state) {
    switch (part) {
      case Part::kGetpid:
        benchmark::DoNotOptimize(syscall(SYS_getpid));
        break;
      case Part::kClock:
        benchmark::DoNotOptimize(now_ns());
        break;
      case Part::kMutex: {
        std::lock_guard<std::mutex> lock(mu);
        benchmark::ClobberMemory();
        break;
      }
      case Part::kLivenessProbe: {
        struct stat st {};
        benchmark::DoNotOptimize(read_small("/proc/sys/kernel/random/boot_id", buf, sizeof buf));
        benchmark::DoNotOptimize(stat("/proc/self/ns/pid", &st));
        benchmark::DoNotOptimize(read_small(path, buf, sizeof buf));
        break;
      }
      case Part::kInfo: {
        cxlpool_shared_info_t info{};
        benchmark::DoNotOptimize(cxlpool_shared_pool_info(pool, &info));
        break;
      }
      case Part::kAllocFreeNone:
      case Part::kCxlpoolAllocFree: {
        void* p = cxl.alloc(256);
        *static_cast<volatile uint64_t*>(p) = ++i;
        cxl.free(p);
        break;
      }
      case Part::kBoostAllocFree: {
        void* p = boost.alloc(256);
        *static_cast<volatile uint64_t*>(p) = ++i;
        boost.free(p);
        break;
      }
    }
  }
  if (pool) {
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(("shm:" + name).c_str());
  }
  if (seg) {
    seg.reset();
    bip::shared_memory_object::remove(name.c_str());
  }
}

void register_all() {
  for (int workload = 0; workload < 3; ++workload)
    for (int procs : {1, 2, 4})
      for (Impl impl : {Impl::kCxlpool, Impl::kBoost}) {
        const bool mixed = workload == 1;
        const uint64_t burst = workload == 2 ? kBurst : 1;
        const char* sizes = workload == 0 ? "256B" : workload == 1 ? "mixed128-4096" : "256B-burst512";
        const std::string n = std::string("alloc_free/") + (impl == Impl::kCxlpool ? "cxlpool" : "boost") + "/" +
                              sizes + "/procs:" + std::to_string(procs);
        benchmark::RegisterBenchmark(n.c_str(), BM_alloc_free, impl, mixed, burst, procs)
            ->Iterations(1)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
  const char* op_names[] = {"publish", "publish_dirty", "acquire", "acquire_read"};
  for (int op = 0; op < 4; ++op)
    for (int m = 0; m < 2; ++m)
      for (int s = 0; s < 4; ++s) {
        const std::string n = std::string("coherence/") + op_names[op] + "/" + (m == 0 ? "none" : "host") + "/" +
                              std::to_string(CoherencePools::kSizes[s]) + "B";
        benchmark::RegisterBenchmark(n.c_str(), BM_coherence, CohOp(op), m, s);
      }
  const char* handle_names[] = {"export", "import_release", "roundtrip", "lifecycle", "alloc_free"};
  for (int op = 0; op < 5; ++op)
    benchmark::RegisterBenchmark((std::string("handle/cxlpool/") + handle_names[op]).c_str(), BM_handle, HandleOp(op));
  benchmark::RegisterBenchmark("handle/boost/offset_roundtrip", BM_handle_boost);
  const char* part_names[] = {"getpid_syscall",          "clock_monotonic",      "std_mutex",
                              "liveness_probe",          "cxlpool_info",         "cxlpool_alloc_free_256B_none",
                              "cxlpool_alloc_free_256B", "boost_alloc_free_256B"};
  for (int p = 0; p < 8; ++p)
    benchmark::RegisterBenchmark((std::string("part/") + part_names[p]).c_str(), BM_part, Part(p));
  struct R {
    Death death;
    uint64_t mib;
    Fill fill;
    uint32_t hb, timeout;
  };
  std::vector<R> rs;
  for (uint64_t mib : {64, 256, 1024})
    for (Fill f : {Fill::kFew, Fill::kQuarter, Fill::kQuarterExported}) rs.push_back({Death::kKill, mib, f, 10, 300});
  for (uint64_t mib : {64, 256, 1024}) rs.push_back({Death::kStop, mib, Fill::kFew, 10, 300});
  rs.push_back({Death::kKill, 256, Fill::kFew, 2, 20});
  rs.push_back({Death::kStop, 256, Fill::kFew, 2, 20});
  benchmark::RegisterBenchmark("hazard/join_reused_slot", BM_join_reused_slot, 300)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (int stop_ms : {200, 500})
    benchmark::RegisterBenchmark(("hazard/stalled_observer/stop:" + std::to_string(stop_ms) + "ms").c_str(),
                                 BM_stalled_observer, 6, stop_ms)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  for (int n : {2, 8, 32})
    benchmark::RegisterBenchmark(("watch/idle/participants:" + std::to_string(n)).c_str(), BM_watch_idle, n)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  const char* fill_names[] = {"few", "quarter", "quarter_exported"};
  for (const R& r : rs) {
    const std::string n = std::string("recovery/") + (r.death == Death::kKill ? "kill" : "stop") + "/" +
                          std::to_string(r.mib) + "MiB/" + fill_names[int(r.fill)] + "/hb" + std::to_string(r.hb) +
                          "ms_timeout" + std::to_string(r.timeout) + "ms";
    benchmark::RegisterBenchmark(n.c_str(), BM_recovery, r.death, r.mib << 20, r.fill, r.hb, r.timeout)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (std::strcmp(CXLPOOL_BENCH_BUILD_TYPE, "Release") != 0) {
    std::fprintf(stderr,
                 "shared_bench: refusing to report from a %s build; configure with -DCMAKE_BUILD_TYPE=Release\n",
                 *CXLPOOL_BENCH_BUILD_TYPE ? CXLPOOL_BENCH_BUILD_TYPE : "unspecified");
    return 2;
  }
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--ops=", 6) == 0)
      g_ops = std::strtoull(argv[i] + 6, nullptr, 10);
    else if (std::strncmp(argv[i], "--warmup=", 9) == 0)
      g_warmup = std::strtoull(argv[i] + 9, nullptr, 10);
    else
      rest.push_back(argv[i]);
  }
  register_all();
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("ops_per_process", std::to_string(g_ops));
  benchmark::AddCustomContext("warmup_per_process", std::to_string(g_warmup));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_coherence.reset();
  g_handles.reset();
  return 0;
}

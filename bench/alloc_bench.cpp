// SPDX-License-Identifier: MIT
// Allocator workloads, identical code for every allocator, selected with --allocator:
//   system        malloc/free of the process (glibc, or jemalloc/mimalloc/tcmalloc under
//                 LD_PRELOAD: bench/run_alloc_bench.py runs each in the same session)
//   memkind       memkind_malloc(MEMKIND_DEFAULT) through dlopen of libmemkind.so.0
//   cxlpool-near  cxlpool_malloc on a pool bound to the near tier (node0)
//   cxlpool-far   cxlpool_malloc on a pool bound to an emulated far device (memfd)
//   cxlpool       cxlpool_malloc on a pool over node0 and the far device with --policy=POLICY
// Workloads: hot 64 B malloc+free; 1M objects of 16-512 B freed in shuffled order; a
// 2-thread producer/consumer with cross-thread frees; realloc growth; large blocks 64 KiB-4 MiB;
// threads_short/N and threads_long/N: N threads at once, each keeping up to 64 blocks of
// 1 B-64 KiB (log-uniform, written whole) through 1,000 replacements, then freeing them as it
// exits (short) or only once every thread is done (long: the peak holds all their blocks).
// Their peak RSS is the process's: run one per process (bench/run_alloc_bench.py does).
// Refuses to run from a non-Release build.
#include <benchmark/benchmark.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace {

struct Allocator {
  void* (*alloc)(size_t) = nullptr;
  void (*release)(void*) = nullptr;
  void* (*resize)(void*, size_t) = nullptr;
};
Allocator g;

// cxlpool entry points bound to one pool.
cxlpool_pool_t* g_pool = nullptr;
void* cx_alloc(size_t n) { return cxlpool_malloc(g_pool, n); }
void cx_free(void* p) { cxlpool_free(p); }
void* cx_realloc(void* p, size_t n) { return cxlpool_realloc(g_pool, p, n); }

// memkind through dlopen, so its library never takes over the process's malloc.
using memkind_t = void*;
memkind_t* g_memkind_default = nullptr;
void* (*mk_malloc)(memkind_t, size_t) = nullptr;
void (*mk_free)(memkind_t, void*) = nullptr;
void* (*mk_realloc)(memkind_t, void*, size_t) = nullptr;
void* mk_alloc(size_t n) { return mk_malloc(*g_memkind_default, n); }
void mk_release(void* p) { mk_free(*g_memkind_default, p); }
void* mk_resize(void* p, size_t n) { return mk_realloc(*g_memkind_default, p, n); }

bool setup(const std::string& which, const std::string& policy) {
  if (which == "system") {
    g = {&std::malloc, &std::free, &std::realloc};
    return true;
  }
  if (which == "memkind") {
    void* h = dlopen("libmemkind.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::fprintf(stderr, "alloc_bench: %s\n", dlerror());
      return false;
    }
    g_memkind_default = static_cast<memkind_t*>(dlsym(h, "MEMKIND_DEFAULT"));
    mk_malloc = reinterpret_cast<void* (*)(memkind_t, size_t)>(dlsym(h, "memkind_malloc"));
    mk_free = reinterpret_cast<void (*)(memkind_t, void*)>(dlsym(h, "memkind_free"));
    mk_realloc = reinterpret_cast<void* (*)(memkind_t, void*, size_t)>(dlsym(h, "memkind_realloc"));
    if (!g_memkind_default || !mk_malloc || !mk_free || !mk_realloc) return false;
    g = {&mk_alloc, &mk_release, &mk_resize};
    return true;
  }
  if (which == "cxlpool-near" || which == "cxlpool-far" || which == "cxlpool") {
    cxlpool_config_t* c = nullptr;
    cxlpool_topology_t* topo = nullptr;
    cxlpool_pool_params_t* p = nullptr;
    cxlpool_config_create(&c);
    cxlpool_config_set_devices(c, "cxlfar:backing=shm,size=8G");
    cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC);
    bool ok = cxlpool_topology_discover(c, &topo) == CXLPOOL_OK;
    cxlpool_pool_params_create(&p);
    cxlpool_pool_params_set_devices(p, which == "cxlpool-near"  ? "node0"
                                       : which == "cxlpool-far" ? "cxlfar"
                                                                : "node0,cxlfar");
    if (which == "cxlpool") cxlpool_pool_params_set_policy(p, policy.c_str());
    ok = ok && cxlpool_pool_create(topo, p, &g_pool) == CXLPOOL_OK;
    if (!ok) std::fprintf(stderr, "alloc_bench: %s\n", cxlpool_last_error_message());
    cxlpool_pool_params_destroy(p);
    cxlpool_topology_destroy(topo);
    cxlpool_config_destroy(c);
    g = {&cx_alloc, &cx_free, &cx_realloc};
    return ok;
  }
  std::fprintf(stderr, "alloc_bench: unknown allocator '%s' (system, memkind, cxlpool-near, cxlpool-far, cxlpool)\n",
               which.c_str());
  return false;
}

// Harness arrays (sizes, order, pointers) live in one mmap'd, huge-page-advised buffer, never
// in the allocator under test: otherwise whichever allocator serves std::vector changes the
// harness's own cache and TLB behaviour (mimalloc hands out huge pages, glibc does not).
template <class T>
class HarnessArray {
 public:
  explicit HarnessArray(size_t n) : n_(n), bytes_((n * sizeof(T) + (2u << 20) - 1) & ~size_t((2u << 20) - 1)) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    madvise(p, bytes_, MADV_HUGEPAGE);
    data_ = static_cast<T*>(p);
  }
  ~HarnessArray() { munmap(data_, bytes_); }
  T& operator[](size_t i) { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + n_; }

 private:
  size_t n_, bytes_;
  T* data_;
};

void BM_hot_64B(benchmark::State& state) {
  for (auto _ : state) {
    void* p = g.alloc(64);
    benchmark::DoNotOptimize(p);
    g.release(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_shuffled_1M_16_512B(benchmark::State& state) {
  constexpr size_t kCount = 1'000'000;
  std::mt19937_64 rng(42);
  HarnessArray<uint32_t> sizes(kCount), order(kCount);
  HarnessArray<void*> ptrs(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    sizes[i] = uint32_t(16 + rng() % 497);
    order[i] = uint32_t(i);
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (auto _ : state) {
    for (size_t i = 0; i < kCount; ++i) {
      ptrs[i] = g.alloc(sizes[i]);
      static_cast<char*>(ptrs[i])[0] = char(i);
    }
    for (size_t i = 0; i < kCount; ++i) g.release(ptrs[order[i]]);
  }
  state.SetItemsProcessed(int64_t(state.iterations() * kCount));
}

void BM_producer_consumer_2T(benchmark::State& state) {
  constexpr size_t kCount = 1'000'000, kRing = 4096;
  HarnessArray<std::atomic<void*>> ring(kRing);
  for (auto _ : state) {
    for (auto& r : ring) r.store(nullptr, std::memory_order_relaxed);
    std::thread consumer([&] {
      size_t tail = 0;
      for (size_t n = 0; n < kCount; ++n) {
        void* p;
        while (!(p = ring[tail].load(std::memory_order_acquire))) std::this_thread::yield();
        ring[tail].store(nullptr, std::memory_order_relaxed);
        tail = (tail + 1) % kRing;
        g.release(p);  // freed by the other thread
      }
    });
    size_t head = 0;
    for (size_t n = 0; n < kCount; ++n) {
      void* p = g.alloc(64 + (n & 127) * 2);
      static_cast<char*>(p)[0] = 1;
      while (ring[head].load(std::memory_order_acquire)) std::this_thread::yield();
      ring[head].store(p, std::memory_order_release);
      head = (head + 1) % kRing;
    }
    consumer.join();
  }
  state.SetItemsProcessed(int64_t(state.iterations() * kCount));
}

void BM_realloc_growth(benchmark::State& state) {
  int64_t ops = 0;
  for (auto _ : state) {
    void* p = g.alloc(16);
    for (size_t n = 32; n <= 64 * 1024; n += 16 + (n >> 4)) {
      p = g.resize(p, n);
      static_cast<char*>(p)[n - 1] = 1;
      ++ops;
    }
    g.release(p);
  }
  state.SetItemsProcessed(ops);
}

void BM_large_64K_4M(benchmark::State& state) {
  static const size_t sizes[] = {64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20};
  constexpr size_t kLive = 8;
  void* live[kLive] = {};
  size_t i = 0;
  for (auto _ : state) {
    size_t slot = i % kLive;
    if (live[slot]) g.release(live[slot]);
    size_t n = sizes[i % 7];
    live[slot] = g.alloc(n);
    static_cast<char*>(live[slot])[0] = 1;
    static_cast<char*>(live[slot])[n - 1] = 1;
    ++i;
  }
  for (void* p : live)
    if (p) g.release(p);
  state.SetItemsProcessed(state.iterations());
}

// One thread of threads_short / threads_long.
struct StormThread {
  std::atomic<int64_t>* nulls;
  std::atomic<int>* alive;  // threads inside storm_thread now
  std::atomic<int>* peak_alive;
  pthread_barrier_t* all_done;  // null: short-lived
  uint64_t seed;
};

void* storm_thread(void* arg) {
  auto* t = static_cast<StormThread*>(arg);
  // How many threads overlap is what a short-lived storm's peak RSS follows.
  const int now = t->alive->fetch_add(1, std::memory_order_relaxed) + 1;
  for (int peak = t->peak_alive->load(std::memory_order_relaxed);
       now > peak && !t->peak_alive->compare_exchange_weak(peak, now, std::memory_order_relaxed);) {
  }
  uint64_t s = t->seed;
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  void* slot[64] = {};
  int64_t nulls = 0;
  for (int i = 0; i < 1000; ++i) {
    unsigned k = unsigned(next() % 64);
    if (slot[k]) g.release(slot[k]);
    size_t n = 1 + next() % (size_t(1) << (next() % 17));
    slot[k] = g.alloc(n);
    if (slot[k])
      std::memset(slot[k], int(n), n);
    else
      ++nulls;
  }
  if (t->all_done) pthread_barrier_wait(t->all_done);
  for (void* p : slot)
    if (p) g.release(p);
  t->nulls->fetch_add(nulls, std::memory_order_relaxed);
  t->alive->fetch_sub(1, std::memory_order_relaxed);
  return nullptr;
}

void storm(benchmark::State& state, bool together) {
  const auto n = size_t(state.range(0));
  std::atomic<int64_t> nulls{0};
  std::atomic<int> alive{0}, peak_alive{0};
  int64_t failed_starts = 0;
  std::vector<pthread_t> tids(n);
  std::vector<StormThread> args(n);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (auto _ : state) {
    pthread_barrier_t all_done;
    pthread_barrier_init(&all_done, nullptr, unsigned(n));
    size_t started = 0;
    for (size_t i = 0; i < n; ++i) {
      args[i] = {&nulls, &alive, &peak_alive, together ? &all_done : nullptr, 0x9E3779B97F4A7C15ull * (i + 1)};
      if (pthread_create(&tids[started], &attr, storm_thread, &args[i]) == 0) ++started;
    }
    // A thread that could not start would leave the others at the barrier for ever.
    if (started < n) {
      failed_starts += int64_t(n - started);
      if (together) std::abort();
    }
    for (size_t i = 0; i < started; ++i) pthread_join(tids[i], nullptr);
    pthread_barrier_destroy(&all_done);
  }
  pthread_attr_destroy(&attr);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  state.SetItemsProcessed(int64_t(state.iterations() * n * 1000));
  state.counters["null_mallocs"] = double(nulls.load());
  state.counters["failed_thread_starts"] = double(failed_starts);
  state.counters["peak_threads_alive"] = double(peak_alive.load());
  state.counters["process_peak_rss_mib"] = double(ru.ru_maxrss) / 1024.0;
}

void BM_threads_short(benchmark::State& state) { storm(state, false); }
void BM_threads_long(benchmark::State& state) { storm(state, true); }

BENCHMARK(BM_hot_64B);
BENCHMARK(BM_shuffled_1M_16_512B)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_producer_consumer_2T)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_realloc_growth)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_large_64K_4M);
BENCHMARK(BM_threads_short)->Arg(1)->Arg(8)->Arg(64)->Arg(500)->Arg(2000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_threads_long)->Arg(1)->Arg(8)->Arg(64)->Arg(500)->Arg(2000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  if (std::strcmp(CXLPOOL_BENCH_BUILD_TYPE, "Release") != 0) {
    std::fprintf(stderr, "alloc_bench: refusing to report from a %s build; configure with -DCMAKE_BUILD_TYPE=Release\n",
                 *CXLPOOL_BENCH_BUILD_TYPE ? CXLPOOL_BENCH_BUILD_TYPE : "unspecified");
    return 2;
  }
  std::string which = "system", policy = "bind:near";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--allocator=", 12) == 0)
      which = argv[i] + 12;
    else if (std::strncmp(argv[i], "--policy=", 9) == 0)
      policy = argv[i] + 9;
    else
      rest.push_back(argv[i]);
  }
  if (!setup(which, policy)) return 1;
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::AddCustomContext("allocator", which);
  if (which == "cxlpool") benchmark::AddCustomContext("policy", policy);
  if (const char* pre = std::getenv("LD_PRELOAD")) benchmark::AddCustomContext("ld_preload", pre);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

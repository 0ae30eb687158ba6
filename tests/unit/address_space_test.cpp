// SPDX-License-Identifier: MIT
// The allocator under an RLIMIT_AS (docs/allocator.md, "Address space"): blocks above 32 KiB
// and huge blocks reserve only their own bytes (to the page) and the rest of their last segment is the
// program's (a mapping there is foreign to free, usable_size and ptr_info); a failing
// allocation gives back what is free and retries, so the largest block that fits after a
// workload of many small ones is nearly all the address space left, and memory that cannot
// fit is NULL + ENOMEM; the limited mode's paths (tight pages, the fullest segment first, spans
// above 32 KiB, class pages for them once cxlpool's mappings are past half their budget) under
// threads. Threads that only call the
// allocator get no glibc malloc arena from it (each reserves 64 MiB of the limit), and hundreds
// of them under a limit with room get no NULL. The real-limit cases run in a forked child and
// skip under sanitizers (their shadow memory needs the address space); the forced mode runs
// everywhere.
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "alloc/pool.hpp"
#include "common/error.hpp"
#include "device/device.hpp"
#include "os/os.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

namespace A = cxlpool::detail::alloc;

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// A pool over one emulated device (numa:0 or a memfd), bind to it.
struct TestPool {
  explicit TestPool(const std::string& backing) {
    cxlpool::detail::DiscoverOptions o;
    o.ignore_env = true;
    o.no_hwloc = true;
    o.no_default_device = true;
    o.devices = "dev:backing=" + backing + ",size=4G,tier=0";
    topo = cxlpool::detail::discover(o);
    A::PoolOptions po;
    po.name = "as";
    po.policy = "bind:dev";
    pool = A::pool_create(topo, po);
  }
  ~TestPool() { A::pool_destroy(pool); }
  // The statistics of the pool's device "dev" (not necessarily its first).
  A::DeviceStats dev_stats() const {
    for (int i = 0; i < A::pool_device_count(pool); ++i)
      if (A::pool_device_name(pool, i) == "dev") return A::pool_device_stats(pool, i);
    return {};
  }
  cxlpool::detail::Topology topo;
  A::Pool* pool = nullptr;
};

size_t vm_size() {
  FILE* f = std::fopen("/proc/self/statm", "re");
  REQUIRE(f);
  unsigned long pages = 0;
  REQUIRE(std::fscanf(f, "%lu", &pages) == 1);
  std::fclose(f);
  return pages * size_t(sysconf(_SC_PAGESIZE));
}

// The most address space the process has held (VmPeak).
size_t vm_peak() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmPeak: %zu kB", &kib) == 1) break;
  std::fclose(f);
  return kib * kKiB;
}

// Runs body in a forked child (its RLIMIT_AS is its own); the child's exit status says
// whether every check held, its stderr says which did not.
void in_child(void (*body)(bool* ok)) {
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    bool ok = true;
    body(&ok);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

#define CHILD_CHECK(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      *ok = false;                                                            \
    }                                                                         \
  } while (0)

// Sets this process's RLIMIT_AS to limit; false (and *ok false, said on stderr) if it cannot.
bool limit_address_space(size_t limit, bool* ok) {
  struct rlimit rl {
    limit, limit
  };
  if (setrlimit(RLIMIT_AS, &rl) == 0) return true;
  std::fprintf(stderr, "setrlimit: %s\n", std::strerror(errno));
  *ok = false;
  return false;
}

// The largest block (MiB) pool_malloc hands out now, by bisection; every failure is NULL +
// ENOMEM.
size_t largest_mib(A::Pool* pool, size_t hi_mib, bool* ok) {
  size_t lo = 0, hi = hi_mib;
  while (lo < hi) {
    size_t mid = (lo + hi + 1) / 2;
    errno = 0;
    void* p = A::pool_malloc(pool, mid * kMiB);
    if (p) {
      std::memset(p, 1, mid * kMiB);
      A::free_any(p);
      lo = mid;
    } else {
      CHILD_CHECK(errno == ENOMEM);
      hi = mid - 1;
    }
  }
  return lo;
}

void many_small_then_largest(const char* backing, bool* ok) {
  // The allocator's own threads (the purger) allocate with glibc's malloc here, outside the
  // interposer: one arena, or each would reserve 64 MiB of the limit.
  mallopt(M_ARENA_MAX, 1);
  A::set_address_space_limited(-1);
  const size_t limit = vm_size() + 192 * kMiB;
  if (!limit_address_space(limit, ok)) return;
  TestPool t(backing);
  CHILD_CHECK(A::address_space_limited());
  std::mt19937 rng(7);
  std::vector<void*> kept;
  // Many small blocks of many classes, a buffer grown by realloc through the medium classes
  // into huge ones, then most small blocks freed in random order.
  for (int i = 0; i < 100000; ++i) {
    void* p = A::pool_malloc(t.pool, 16 + rng() % 500);
    CHILD_CHECK(p);
    if (p) kept.push_back(p);
  }
  void* grown = nullptr;
  for (size_t n = 1024; n <= 24 * kMiB; n = n * 9 / 8 + 1) {
    void* q = A::pool_realloc(t.pool, grown, n);
    CHILD_CHECK(q);
    if (!q) break;
    std::memset(q, 2, 64);
    grown = q;
  }
  std::shuffle(kept.begin(), kept.end(), rng);
  for (size_t i = 0; i < kept.size() * 3 / 4; ++i) A::free_any(kept[i]);
  kept.erase(kept.begin(), kept.begin() + long(kept.size() * 3 / 4));
  // Nearly every byte of address space the limit leaves is one allocation away: what the
  // pool reserved and does not use is given back when the allocation first fails.
  const size_t left = (limit - vm_size()) / kMiB;
  const size_t got = largest_mib(t.pool, limit / kMiB, ok);
  std::fprintf(stderr, "%s: %zu MiB of address space left, largest block %zu MiB\n", backing, left, got);
  CHILD_CHECK(got * 10 >= left * 9);
  // Past the limit: NULL + ENOMEM, for small and huge requests alike, and nothing breaks.
  std::vector<void*> fill;
  for (;;) {
    errno = 0;
    void* p = A::pool_malloc(t.pool, 64 * kKiB);
    if (!p) {
      CHILD_CHECK(errno == ENOMEM);
      break;
    }
    fill.push_back(p);
  }
  errno = 0;
  CHILD_CHECK(A::pool_malloc(t.pool, 8 * kMiB) == nullptr && errno == ENOMEM);
  // The cause is the limit, not the device (which has gigabytes of room), and the message says so.
  const cxlpool_error_info_t why = cxlpool::detail::last_error();
  std::fprintf(stderr, "%s: past the limit: %s\n", backing, why.message);
  CHILD_CHECK(why.status == CXLPOOL_E_NO_MEMORY);
  CHILD_CHECK(std::strstr(why.message, "no address space for 8388608 bytes: RLIMIT_AS is") != nullptr);
  for (int i = 0; i < 100000; ++i) {  // small blocks until they run out too
    void* p = A::pool_malloc(t.pool, 48);
    if (!p) break;
    fill.push_back(p);
  }
  for (void* p : fill) A::free_any(p);
  for (void* p : kept) A::free_any(p);
  A::free_any(grown);
  // All of it comes back: the largest block is again nearly all that is left.
  const size_t left2 = (limit - vm_size()) / kMiB;
  const size_t got2 = largest_mib(t.pool, limit / kMiB, ok);
  std::fprintf(stderr, "%s: after freeing everything %zu MiB left, largest block %zu MiB\n", backing, left2, got2);
  CHILD_CHECK(got2 * 10 >= left2 * 9 && got2 >= 160);
}

}  // namespace

TEST_CASE("under an RLIMIT_AS the largest block after many small ones takes nearly all that is left", "[unit]") {
  if (kSanitized) CXLPOOL_SKIP("a sanitizer's shadow memory needs more address space than the limit leaves");
  in_child([](bool* ok) { many_small_then_largest("numa:0", ok); });
  in_child([](bool* ok) { many_small_then_largest("memfd", ok); });
}

TEST_CASE("spans under an RLIMIT_AS reserve their own bytes, and the rest of the segment is foreign", "[unit]") {
  A::set_address_space_limited(1);
  TestPool t("numa:0");
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  for (size_t size : {size_t(40000), 200 * kKiB + 1, 6 * kMiB + 100}) {
    INFO("block of " << size << " bytes");
    const size_t reserved = (size + page - 1) / page * page;
    unsigned char* p = nullptr;
    void* q = MAP_FAILED;
    A::PtrInfo pi;
    // The page right after the block is free address space: anyone may map it, and another
    // thread's mmap (a sanitizer's runtime, say) may take it first; then the block is given back
    // and the next one tried.
    for (int attempt = 0; attempt < 50 && q == MAP_FAILED; ++attempt) {
      p = static_cast<unsigned char*>(A::pool_malloc(t.pool, size));
      REQUIRE(p);
      REQUIRE(A::ptr_info(p, &pi));
      CHECK(pi.huge);  // above 32 KiB: a reservation of its own, its bytes rounded to the page
      CHECK(A::usable_size(p) == reserved);
      std::memset(p, 0x5a, size);
      void* want = p + reserved;
      q = mmap(want, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (q != MAP_FAILED) {
        REQUIRE(q == want);
      } else {
        REQUIRE(errno == EEXIST);
        A::free_any(p);
        A::pool_trim(t.pool);
      }
    }
    REQUIRE(q != MAP_FAILED);
    // ... and the allocator calls that mapping foreign, even though its page map entry
    // names the span.
    CHECK_FALSE(A::owns(q));
    CHECK(A::usable_size(q) == 0);
    CHECK_FALSE(A::ptr_info(q, &pi));
    CHECK_FALSE(A::free_any(q));
    CHECK(A::owns(p));
    CHECK(A::usable_size(p) == reserved);
    CHECK(p[0] == 0x5a);
    CHECK(p[size - 1] == 0x5a);
    CHECK(A::free_any(p));
    A::pool_trim(t.pool);  // released, not cached
    // Released: a second free of the block is recognised and ignored (its first segment is
    // address space given back). The page after a span of several segments is still foreign;
    // after a span within one segment it is in that given-back segment, where a free is
    // ignored too (docs/allocator.md, "Invalid and double frees").
    CHECK(A::free_any(p));
    CHECK(A::free_any(q) == (size <= 4 * kMiB));
    CHECK(munmap(q, page) == 0);
  }
}

TEST_CASE("past half the mapping budget, blocks above 32 KiB come from class pages under an RLIMIT_AS", "[unit]") {
  A::set_address_space_limited(1);
  struct BudgetReset {
    ~BudgetReset() { cxlpool::detail::set_vma_budget(0); }
  } reset;
  TestPool t("numa:0");
  // Spans while cxlpool's mappings are under half their budget...
  void* span = A::pool_malloc(t.pool, 40000);
  REQUIRE(span);
  A::PtrInfo pi;
  REQUIRE(A::ptr_info(span, &pi));
  CHECK(pi.huge);
  // ... class pages past it: every block is still had, none is a mapping of its own.
  cxlpool::detail::set_vma_budget(int64_t(cxlpool::detail::vma_use().vmas) + 1);
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) {
    void* p = A::pool_malloc(t.pool, 40000 + size_t(i) * 512);
    REQUIRE(p);
    REQUIRE(A::ptr_info(p, &pi));
    CHECK_FALSE(pi.huge);
    std::memset(p, i, 40000);
    blocks.push_back(p);
  }
  for (void* p : blocks) CHECK(A::free_any(p));
  CHECK(A::free_any(span));
}

TEST_CASE("the limited mode's paths under threads: exact spans, tight pages, remote frees", "[unit]") {
  A::set_address_space_limited(1);
  TestPool t("memfd");
  constexpr int kThreads = 4;
  std::vector<std::vector<std::pair<unsigned char*, size_t>>> handoff(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int id = 0; id < kThreads; ++id)
    threads.emplace_back([&, id] {
      std::mt19937 rng(unsigned(id) + 1);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 4000; ++i) {
        // Mostly small, some medium (tight pages, spans above 128 KiB), a few huge.
        const unsigned r = rng() % 100;
        const size_t n = r < 80   ? 1 + rng() % 2048
                         : r < 97 ? 8 * kKiB + rng() % (256 * kKiB)
                                  : kMiB + rng() % (3 * kMiB);
        auto* p = static_cast<unsigned char*>(A::pool_malloc(t.pool, n));
        if (!p) {
          bad.fetch_add(1);
          continue;
        }
        std::memset(p, int(n & 0xff), n);
        live.emplace_back(p, n);
        if (live.size() > 200) {
          size_t k = rng() % live.size();
          auto [q, m] = live[k];
          if (q[0] != (m & 0xff) || q[m - 1] != (m & 0xff)) bad.fetch_add(1);
          A::free_any(q);
          live[k] = live.back();
          live.pop_back();
        }
      }
      handoff[size_t(id)] = std::move(live);
    });
  for (auto& th : threads) th.join();
  // Every thread's blocks are freed by another thread (remote frees into exited threads' pages).
  for (int id = 0; id < kThreads; ++id)
    threads[size_t(id)] = std::thread([&, id] {
      for (auto [q, m] : handoff[size_t((id + 1) % kThreads)]) {
        if (q[0] != (m & 0xff) || q[m - 1] != (m & 0xff)) bad.fetch_add(1);
        A::free_any(q);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  A::pool_trim(t.pool);
  const A::DeviceStats s = t.dev_stats();
  CHECK(s.allocations > 0);
  CHECK(s.allocated_bytes == 0);
  CHECK(s.resident_bytes == s.device_committed_bytes);
}

namespace {

// glibc's malloc arenas: one <heap> per arena in malloc_info's report.
int glibc_arenas() {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  REQUIRE(f);
  REQUIRE(malloc_info(0, f) == 0);
  std::fclose(f);
  int n = 0;
  for (const char* at = text; (at = std::strstr(at, "<heap nr=")); ++at) ++n;
  std::free(text);
  return n;
}

// What each storm thread does: up to `slots` live blocks of 1 B .. 2^size_bits B
// (log-uniform), replaced `replacements` times at random, on a stack of stack_kib.
struct StormShape {
  int threads;
  int replacements;
  int slots = 64;
  unsigned size_bits = 18;
  size_t stack_kib = 256;
  bool hold = false;  // every thread keeps its blocks until all have done their replacements
};

struct StormArgs {
  A::Pool* pool;
  uint64_t seed;
  const StormShape* shape;
  pthread_barrier_t* start;  // all threads alive at once
  pthread_barrier_t* end;    // shape->hold: all threads still holding their blocks at once
  std::atomic<long>* nulls;
  std::atomic<long>* bad;
};

// The bench's threads workload, through the allocator alone.
void* storm_thread(void* arg) {
  auto* a = static_cast<StormArgs*>(arg);
  pthread_barrier_wait(a->start);
  uint64_t x = a->seed;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  unsigned char* live[64] = {};
  size_t sizes[64] = {};
  const int slots = std::min(a->shape->slots, 64);
  for (int i = 0; i < a->shape->replacements; ++i) {
    const unsigned k = unsigned(next() % unsigned(slots));
    if (live[k]) {
      if (live[k][0] != (sizes[k] & 0xff) || live[k][sizes[k] - 1] != (sizes[k] & 0xff)) a->bad->fetch_add(1);
      A::free_any(live[k]);
    }
    const size_t n = size_t(1) << (next() % a->shape->size_bits);
    sizes[k] = n + next() % n;
    live[k] = static_cast<unsigned char*>(A::pool_malloc(a->pool, sizes[k]));
    if (!live[k]) {
      a->nulls->fetch_add(1);
      continue;
    }
    live[k][0] = live[k][sizes[k] - 1] = static_cast<unsigned char>(sizes[k] & 0xff);
  }
  if (a->end) pthread_barrier_wait(a->end);
  for (unsigned char* p : live)
    if (p) A::free_any(p);
  return nullptr;
}

// Runs shape.threads storm threads started together; false if one could not start.
bool storm(A::Pool* pool, const StormShape& shape, std::atomic<long>* nulls, std::atomic<long>* bad) {
  const auto threads = size_t(shape.threads);
  pthread_barrier_t start, end;
  pthread_barrier_init(&start, nullptr, unsigned(threads));
  pthread_barrier_init(&end, nullptr, unsigned(threads));
  std::vector<StormArgs> args(threads);
  std::vector<pthread_t> tids(threads);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, shape.stack_kib * kKiB);
  size_t started = 0;
  for (size_t i = 0; i < threads; ++i) {
    args[i] = {pool, 0x9E3779B97F4A7C15ull * (i + 1), &shape, &start, shape.hold ? &end : nullptr, nulls, bad};
    if (pthread_create(&tids[i], &attr, storm_thread, &args[i]) != 0) break;
    ++started;
  }
  pthread_attr_destroy(&attr);
  // Threads that did not start still pass the barriers, so the ones that did are released.
  for (size_t i = started; i < threads; ++i) pthread_barrier_wait(&start);
  if (shape.hold)
    for (size_t i = started; i < threads; ++i) pthread_barrier_wait(&end);
  for (size_t i = 0; i < started; ++i) pthread_join(tids[i], nullptr);
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&end);
  return started == threads;
}

}  // namespace

TEST_CASE("threads that only allocate get no glibc malloc arena from the allocator", "[unit]") {
  if (kSanitized) CXLPOOL_SKIP("a sanitizer's malloc replaces glibc's, whose arenas this counts");
  // No purger: starting a thread allocates (pthread_create's own bookkeeping) on the thread
  // that starts it, which is not the allocator's doing.
  const uint64_t delay = A::purge_delay_ms();
  A::set_purge_delay_ms(0);
  for (const char* backing : {"numa:0", "memfd"}) {
    INFO("backing " << backing);
    TestPool t(backing);
    const int before = glibc_arenas();
    std::atomic<long> nulls{0}, bad{0};
    // New pages, segments and regions, spans and huge blocks, committed and given back, on 8
    // threads that call nothing else.
    REQUIRE(storm(t.pool, {.threads = 8, .replacements = 3000}, &nulls, &bad));
    CHECK(nulls.load() == 0);
    CHECK(bad.load() == 0);
    CHECK(glibc_arenas() == before);
  }
  A::set_purge_delay_ms(delay);
}

TEST_CASE("hundreds of threads under an RLIMIT_AS with room get no NULL", "[unit]") {
  if (kSanitized) CXLPOOL_SKIP("a sanitizer's shadow memory needs more address space than the limit leaves");
  in_child([](bool* ok) {
    A::set_address_space_limited(-1);
    // 192 threads holding up to 64 blocks of up to 256 KiB each at once: about 260 MiB live,
    // 48 MiB of stacks; the limit leaves 640 MiB. Threads of their own per glibc arena (64 MiB
    // each, up to 8 per CPU) would take it all.
    const size_t limit = vm_size() + 640 * kMiB;
    if (!limit_address_space(limit, ok)) return;
    TestPool t("numa:0");
    CHILD_CHECK(A::address_space_limited());
    std::atomic<long> nulls{0}, bad{0};
    const bool all = storm(t.pool, {.threads = 192, .replacements = 1500}, &nulls, &bad);
    std::fprintf(stderr, "192 threads under a limit of %zu MiB: %ld NULL, address space at most %zu MiB\n",
                 limit / kMiB, nulls.load(), vm_peak() / kMiB);
    CHILD_CHECK(all);
    CHILD_CHECK(nulls.load() == 0);
    CHILD_CHECK(bad.load() == 0);
  });
}

TEST_CASE("two thousand threads alive at once under an RLIMIT_AS get no NULL", "[unit]") {
  if (kSanitized) CXLPOOL_SKIP("a sanitizer's shadow memory needs more address space than the limit leaves");
  in_child([](bool* ok) {
    A::set_address_space_limited(-1);
    // 2,000 threads, each holding 4 blocks of up to 32 KiB until all are done: about 26 MiB
    // live. The limit leaves 256 MiB beyond their stacks. A page of its own for every class a
    // thread uses often (a slice of 64 KiB or more each) would need gigabytes.
    const StormShape shape{
        .threads = 2000, .replacements = 2000, .slots = 4, .size_bits = 15, .stack_kib = 64, .hold = true};
    const size_t stacks = size_t(shape.threads) * (shape.stack_kib + 4) * kKiB;
    const size_t limit = vm_size() + stacks + 256 * kMiB;
    if (!limit_address_space(limit, ok)) return;
    TestPool t("numa:0");
    CHILD_CHECK(A::address_space_limited());
    std::atomic<long> nulls{0}, bad{0};
    const bool all = storm(t.pool, shape, &nulls, &bad);
    std::fprintf(stderr, "2000 threads under a limit of %zu MiB: %ld NULL, address space at most %zu MiB\n",
                 limit / kMiB, nulls.load(), vm_peak() / kMiB);
    CHILD_CHECK(all);
    CHILD_CHECK(nulls.load() == 0);
    CHILD_CHECK(bad.load() == 0);
  });
}

TEST_CASE("a NULL at vm.max_map_count says so, and allocation works again once mappings are freed", "[unit]") {
  if (kSanitized) CXLPOOL_SKIP("a sanitizer needs mappings of its own to report anything");
  const uint64_t max_maps = cxlpool::os::max_map_count();
  if (max_maps > 300000)
    CXLPOOL_SKIP("vm.max_map_count is " + std::to_string(max_maps) + ": too many mappings to fill here");
  in_child([](bool* ok) {
    A::set_address_space_limited(0);
    TestPool t("memfd");
    A::free_any(A::pool_malloc(t.pool, 64));  // the thread's heap, made while mappings are left
    // Every other page of one reservation made readable: each change splits it, until the
    // kernel refuses a mapping more (ENOMEM).
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t pages = size_t(cxlpool::os::max_map_count()) * 2 + 16;
    auto* filler = static_cast<char*>(mmap(nullptr, pages * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    CHILD_CHECK(filler != MAP_FAILED);
    if (filler == MAP_FAILED) return;
    // A failing allocation first gives back what the pool holds free (a mapping less), so the
    // mappings are filled again after each block that still came.
    size_t split = 0, next = 1;
    std::vector<void*> got;
    void* p = nullptr;
    for (int tries = 0; tries < 32; ++tries) {
      for (; next < pages; next += 2, ++split)
        if (mprotect(filler + next * page, page, PROT_READ) != 0) break;
      errno = 0;
      p = A::pool_malloc(t.pool, 8 * kMiB);
      if (!p) break;
      got.push_back(p);
    }
    const cxlpool_error_info_t why = cxlpool::detail::last_error();
    std::fprintf(stderr, "after %zu splits: %s\n", split, p ? "allocated" : why.message);
    CHILD_CHECK(p == nullptr && errno == ENOMEM);
    CHILD_CHECK(why.status == CXLPOOL_E_NO_MEMORY);
    CHILD_CHECK(std::strstr(why.message, "no mapping left for 8388608 bytes: the process holds") != nullptr);
    CHILD_CHECK(std::strstr(why.message, "vm.max_map_count is") != nullptr);
    munmap(filler, pages * page);
    void* q = A::pool_malloc(t.pool, 8 * kMiB);
    CHILD_CHECK(q != nullptr);
    A::free_any(q);
    for (void* b : got) A::free_any(b);
  });
}

TEST_CASE("threads beyond 8 per CPU under a limit allocate without heaps of their own, and every block is counted",
          "[unit]") {
  // The limit is declared, not set: this runs under the sanitizers too (no RLIMIT_AS for their
  // shadow memory to exceed), with more threads than get heaps, all alive at once.
  A::set_address_space_limited(1);
  {
    TestPool t("numa:0");
    std::atomic<long> nulls{0}, bad{0};
    const StormShape shape{.threads = 48, .replacements = 400, .slots = 8, .size_bits = 16, .hold = true};
    REQUIRE(storm(t.pool, shape, &nulls, &bad));
    CHECK(nulls.load() == 0);
    CHECK(bad.load() == 0);
    const A::DeviceStats s = t.dev_stats();
    CHECK(s.allocations == uint64_t(shape.threads) * uint64_t(shape.replacements));
    CHECK(s.frees == s.allocations);
    CHECK(s.allocated_bytes == 0);
    CHECK(s.double_frees == 0);
    CHECK(s.invalid_frees == 0);
  }
  A::set_address_space_limited(-1);
}

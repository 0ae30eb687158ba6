// SPDX-License-Identifier: MIT
// The allocator through the public C API: the malloc-contract conformance battery on every
// backing kind, placement for every policy, weighted interleave ratio, exhaustion and
// recovery, pointer information and statistics.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

using cxlpool_test::ScratchDir;

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

std::string alloc_shm_name() { return "cxlpool-alloc-" + std::to_string(getpid()); }

// The devices every allocator test draws from.
struct Fixture : cxlpool_test::CapiTopology {
  std::string shm_name = alloc_shm_name();
  Fixture()
      : CapiTopology(
            "cxlA:backing=shm,size=512M,latency=300ns,bandwidth=10GB/s;"
            "cxlB:backing=shm,size=256M,latency=500ns,bandwidth=5GB/s;"
            "small:backing=shm,size=16M;"
            "shm0:backing=shm:" +
            alloc_shm_name() +
            ",size=256M;"
            "file0:backing=file:$DIR/pool,size=256M;"
            "n0:backing=numa:0,size=256M") {}
};

std::string device_of(const void* p) {
  cxlpool_ptr_info_t info;
  REQUIRE(cxlpool_ptr_info(p, &info) == CXLPOOL_OK);
  return info.device_name;
}

// The malloc contract, on whatever pool.
void conformance(cxlpool_pool_t* pool) {
  // Size 0: unique, freeable.
  void* a = cxlpool_malloc(pool, 0);
  void* b = cxlpool_malloc(pool, 0);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a != b);
  CHECK(cxlpool_usable_size(a) >= 1);
  cxlpool_free(a);
  cxlpool_free(b);
  // Every size up to 3 MiB in a geometric-ish sweep: usable >= requested, aligned to 16,
  // writable to the last byte, no overlap with its neighbour.
  std::vector<std::pair<char*, size_t>> blocks;
  for (size_t n = 1; n <= 3 * kMiB; n = n < 64 ? n + 1 : n + n / 7) {
    char* p = static_cast<char*>(cxlpool_malloc(pool, n));
    REQUIRE(p);
    CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0);
    CHECK(cxlpool_usable_size(p) >= n);
    std::memset(p, int(n & 0xff), n);
    blocks.emplace_back(p, n);
  }
  for (auto& [p, n] : blocks) {
    CHECK(static_cast<unsigned char>(p[0]) == (n & 0xff));
    CHECK(static_cast<unsigned char>(p[n - 1]) == (n & 0xff));
    cxlpool_free(p);
  }
  // Every alignment class.
  for (size_t align = 1; align <= 8 * kMiB; align <<= 1)
    for (size_t n : {size_t(1), size_t(100), align, align + 1, 3 * align / 2}) {
      void* p = cxlpool_aligned_alloc(pool, align, n);
      REQUIRE(p);
      CHECK(reinterpret_cast<uintptr_t>(p) % align == 0);
      CHECK(cxlpool_usable_size(p) >= n);
      std::memset(p, 0x5a, n);
      cxlpool_free(p);
      void* q = reinterpret_cast<void*>(0x1);
      if (align >= sizeof(void*)) {
        CHECK(cxlpool_posix_memalign(pool, &q, align, n) == 0);
        CHECK(reinterpret_cast<uintptr_t>(q) % align == 0);
        cxlpool_free(q);
      }
    }
  for (size_t bad : {size_t(0), size_t(3), size_t(24), size_t(48)}) {
    errno = 0;
    CHECK(cxlpool_aligned_alloc(pool, bad, 64) == nullptr);
    CHECK(errno == EINVAL);
    void* untouched = reinterpret_cast<void*>(0x1234);
    CHECK(cxlpool_posix_memalign(pool, &untouched, bad, 64) == EINVAL);
    CHECK(untouched == reinterpret_cast<void*>(0x1234));
  }
  void* untouched = reinterpret_cast<void*>(0x1234);
  CHECK(cxlpool_posix_memalign(pool, &untouched, 4, 64) == EINVAL);  // below sizeof(void*)
  // Impossible sizes: NULL + ENOMEM, never an under-allocation.
  for (size_t huge : {SIZE_MAX, SIZE_MAX - 15, SIZE_MAX / 2, size_t(1) << 62, size_t(1) << 50}) {
    errno = 0;
    CHECK(cxlpool_malloc(pool, huge) == nullptr);
    CHECK(errno == ENOMEM);
    // The refusal's own message, never a message left by an earlier call.
    CHECK(std::string(cxlpool_last_error_message()).find(std::to_string(huge) + " bytes is past") != std::string::npos);
    errno = 0;
    CHECK(cxlpool_aligned_alloc(pool, 64, huge) == nullptr);
    CHECK(errno == ENOMEM);
    CHECK(cxlpool_posix_memalign(pool, &untouched, 64, huge) == ENOMEM);
    CHECK(untouched == reinterpret_cast<void*>(0x1234));
  }
  for (auto [n, s] : {std::pair<size_t, size_t>{SIZE_MAX, 2}, {size_t(1) << 33, size_t(1) << 33}, {3, SIZE_MAX / 2}}) {
    errno = 0;
    CHECK(cxlpool_calloc(pool, n, s) == nullptr);
    CHECK(errno == ENOMEM);
  }
  // calloc zeroes, also on reused memory.
  for (int round = 0; round < 2; ++round) {
    unsigned char* z = static_cast<unsigned char*>(cxlpool_calloc(pool, 1000, 7));
    REQUIRE(z);
    CHECK(std::all_of(z, z + 7000, [](unsigned char c) { return c == 0; }));
    std::memset(z, 0xff, 7000);
    cxlpool_free(z);
  }
  // realloc: NULL, growth keeps contents, shrink, 0 frees.
  char* r = static_cast<char*>(cxlpool_realloc(pool, nullptr, 10));
  REQUIRE(r);
  std::memcpy(r, "cxlpool!!", 10);
  for (size_t n : {size_t(100), size_t(5000), size_t(300 * kKiB), size_t(3 * kMiB), size_t(50), size_t(9)}) {
    r = static_cast<char*>(cxlpool_realloc(pool, r, n));
    REQUIRE(r);
    CHECK(std::memcmp(r, "cxlpool!!", 9) == 0);
    CHECK(cxlpool_usable_size(r) >= n);
  }
  errno = 0;
  CHECK(cxlpool_realloc(pool, r, SIZE_MAX) == nullptr);  // failure leaves the block alone
  CHECK(errno == ENOMEM);
  CHECK(std::memcmp(r, "cxlpool!!", 9) == 0);
  CHECK(cxlpool_realloc(pool, r, 0) == nullptr);  // frees (glibc behaviour)
  // free(NULL) and errno preservation.
  errno = 1234;
  cxlpool_free(nullptr);
  void* f = cxlpool_malloc(pool, 100);
  errno = 4321;
  cxlpool_free(f);
  CHECK(errno == 4321);
  int on_stack = 0;
  cxlpool_free(&on_stack);  // foreign: ignored, never parsed
  CHECK(cxlpool_usable_size(&on_stack) == 0);
}

}  // namespace

TEST_CASE("malloc conformance on every backing kind", "[unit][numa]") {
  Fixture fx;
  for (const char* dev : {"node0", "n0", "cxlA", "shm0", "file0"}) {
    INFO("device " << dev);
    cxlpool_pool_t* pool = fx.pool(dev, "bind:" + std::string(dev));
    conformance(pool);
    void* p = cxlpool_malloc(pool, 1000);
    CHECK(device_of(p) == dev);
    cxlpool_free(p);
    CHECK(cxlpool_pool_destroy(pool) == CXLPOOL_OK);
  }
}

TEST_CASE("malloc conformance on a real devdax device", "[unit]") {
  // /dev/zero cannot stand in here: its shared mappings ignore the file offset, which the
  // allocator's device ranges rely on. Runs where the kernel lists a device in devdax mode.
  cxlpool_config_t* c = nullptr;
  cxlpool_config_create(&c);
  cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_topology_t* topo = nullptr;
  REQUIRE(cxlpool_topology_discover(c, &topo) == CXLPOOL_OK);
  cxlpool_config_destroy(c);
  size_t n = 0;
  cxlpool_topology_target_count(topo, &n);
  std::string dax;
  for (size_t i = 0; i < n; ++i) {
    cxlpool_target_info_t info;
    cxlpool_topology_get_target(topo, i, &info);
    if (info.kind == CXLPOOL_TARGET_DAX && access(info.backing_path, R_OK | W_OK) == 0) dax = info.name;
  }
  if (dax.empty()) {
    cxlpool_topology_destroy(topo);
    CXLPOOL_SKIP("no device-DAX device in devdax mode on this machine");
  }
  cxlpool_pool_params_t* p = nullptr;
  cxlpool_pool_params_create(&p);
  cxlpool_pool_params_set_devices(p, dax.c_str());
  cxlpool_pool_t* pool = nullptr;
  cxlpool_status_t st = cxlpool_pool_create(topo, p, &pool);
  cxlpool_pool_params_destroy(p);
  if (st == CXLPOOL_E_NOT_SUPPORTED) {  // e.g. 2 MiB device alignment
    std::string why = cxlpool_last_error_message();
    cxlpool_topology_destroy(topo);
    CXLPOOL_SKIP(why);
  }
  INFO(cxlpool_last_error_message());
  REQUIRE(st == CXLPOOL_OK);
  conformance(pool);
  cxlpool_pool_destroy(pool);
  cxlpool_topology_destroy(topo);
}

TEST_CASE("the default pool serves NULL-pool calls", "[unit]") {
  void* p = cxlpool_malloc(nullptr, 123);
  REQUIRE(p);
  cxlpool_pool_t* def = nullptr;
  REQUIRE(cxlpool_pool_default(&def) == CXLPOOL_OK);
  cxlpool_ptr_info_t info;
  REQUIRE(cxlpool_ptr_info(p, &info) == CXLPOOL_OK);
  CHECK(info.pool == def);
  CHECK(info.tier == 0);
  cxlpool_free(p);
  CHECK(cxlpool_pool_destroy(def) == CXLPOOL_E_INVALID_ARGUMENT);
  conformance(nullptr);
}

TEST_CASE("bind on a NUMA node: pages verified with move_pages", "[unit][numa]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("node0,cxlA", "bind:node0");
  std::vector<char*> v;
  for (int i = 0; i < 256; ++i) {
    char* p = static_cast<char*>(cxlpool_malloc(pool, 16 * kKiB));
    std::memset(p, 1, 16 * kKiB);
    v.push_back(p);
  }
  for (char* p : v) {
    void* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095));
    int node = -1;
    REQUIRE(cxlpool_memory_query_nodes(page, 1, &node) == CXLPOOL_OK);
    CHECK(node == 0);
    CHECK(device_of(p) == "node0");
    cxlpool_free(p);
  }
  cxlpool_pool_destroy(pool);
}

TEST_CASE("preferred: falls back in order when the first device is full", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("small,cxlA", "preferred:small,cxlA");
  std::map<std::string, size_t> bytes;
  std::vector<void*> v;
  for (int i = 0; i < 512; ++i) {  // 32 MiB through a 16 MiB first choice
    void* p = cxlpool_malloc(pool, 64 * kKiB);
    REQUIRE(p);
    bytes[device_of(p)] += 64 * kKiB;
    v.push_back(p);
  }
  CHECK(bytes["small"] >= 12 * kMiB);
  CHECK(bytes["small"] <= 16 * kMiB);
  CHECK(bytes["cxlA"] >= 16 * kMiB);
  cxlpool_stats_t far{};
  cxlpool_pool_get_stats(pool, 1, &far);
  CHECK(far.fallbacks > 0);
  for (void* p : v) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("spill: near until the watermark, then far", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("small,cxlA", "spill:near=small,far=cxlA,watermark=50%");
  std::vector<void*> v;
  size_t on_small = 0;
  for (int i = 0; i < 256; ++i) {
    void* p = cxlpool_malloc(pool, 60 * kKiB);
    REQUIRE(p);
    if (device_of(p) == "small") on_small += 64 * kKiB;
    v.push_back(p);
  }
  cxlpool_stats_t small{};
  cxlpool_pool_get_stats(pool, 0, &small);
  CHECK(small.resident_bytes >= 8 * kMiB);             // reached the watermark ...
  CHECK(small.resident_bytes <= 8 * kMiB + 1 * kMiB);  // ... and stopped within one page of it
  CHECK(on_small <= small.resident_bytes);
  for (void* p : v) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("threshold: large allocations go to the far tier", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("node0,cxlA", "threshold:size=1M,tier=far");
  void* small = cxlpool_malloc(pool, 1000);
  void* below = cxlpool_malloc(pool, kMiB - 1);
  void* at = cxlpool_malloc(pool, kMiB);
  void* big = cxlpool_malloc(pool, 8 * kMiB);
  CHECK(device_of(small) == "node0");
  CHECK(device_of(below) == "node0");
  CHECK(device_of(at) == "cxlA");
  CHECK(device_of(big) == "cxlA");
  const char* text = nullptr;
  cxlpool_pool_policy(pool, &text);
  CHECK(std::string(text) == "threshold:size=1048576,device=cxlA");
  for (void* p : {small, below, at, big}) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("ratio: pages split by bytes between devices", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("cxlA,cxlB", "ratio:cxlA=1,cxlB=3");
  std::vector<void*> v;
  for (int i = 0; i < 20000; ++i) v.push_back(cxlpool_malloc(pool, 4096));
  cxlpool_stats_t a{}, b{};
  cxlpool_pool_get_stats(pool, 0, &a);
  cxlpool_pool_get_stats(pool, 1, &b);
  double ratio = double(b.active_bytes) / double(a.active_bytes);
  CHECK(ratio == Approx(3.0).epsilon(0.05));
  for (void* p : v) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("weighted interleave: within 2% of the weights over 10,000 pages", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("cxlA,cxlB", "interleave:cxlA=3,cxlB=1");
  std::map<std::string, size_t> pages;
  std::vector<void*> v;
  for (int i = 0; i < 10000; ++i) {
    void* p = cxlpool_malloc(pool, 4096);  // one 4 KiB page each
    REQUIRE(p);
    ++pages[device_of(p)];
    v.push_back(p);
  }
  double ratio = double(pages["cxlA"]) / double(pages["cxlB"]);
  INFO("cxlA " << pages["cxlA"] << " cxlB " << pages["cxlB"]);
  CHECK(ratio == Approx(3.0).epsilon(0.02));
  // Huge blocks interleave one block at a time.
  std::map<std::string, size_t> huge;
  for (int i = 0; i < 40; ++i) {
    void* p = cxlpool_malloc(pool, 2 * kMiB);
    ++huge[device_of(p)];
    v.push_back(p);
  }
  CHECK(huge["cxlA"] == 30);
  CHECK(huge["cxlB"] == 10);
  for (void* p : v) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("hints and per-call device overrides", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("node0,cxlA,cxlB", "hint:cold=cxlA,read_mostly=cxlB|bind:near");
  cxlpool_hint_t cold{CXLPOOL_HINT_COLD, -1}, rm{CXLPOOL_HINT_READ_MOSTLY, -1}, hot{CXLPOOL_HINT_HOT, -1};
  void* a = cxlpool_malloc_hint(pool, 100, &cold);
  void* b = cxlpool_malloc_hint(pool, 100, &rm);
  void* c = cxlpool_malloc_hint(pool, 100, &hot);  // no rule for hot: falls through
  void* d = cxlpool_malloc(pool, 100);
  int far2 = -1;
  REQUIRE(cxlpool_pool_find_device(pool, "cxlB", &far2) == CXLPOOL_OK);
  cxlpool_hint_t forced{0, far2};
  void* e = cxlpool_malloc_hint(pool, 3 * kMiB, &forced);
  CHECK(device_of(a) == "cxlA");
  CHECK(device_of(b) == "cxlB");
  CHECK(device_of(c) == "node0");
  CHECK(device_of(d) == "node0");
  CHECK(device_of(e) == "cxlB");
  cxlpool_hint_t bad{0, 99};
  errno = 0;
  CHECK(cxlpool_malloc_hint(pool, 100, &bad) == nullptr);
  CHECK(errno == EINVAL);
  for (void* p : {a, b, c, d, e}) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("exhaustion: NULL + ENOMEM when full, recovery after frees", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("small", "bind:small");
  for (size_t size : {size_t(64 * kKiB), size_t(100), size_t(2 * kMiB)}) {
    INFO("block size " << size);
    std::vector<void*> v;
    for (;;) {
      errno = 0;
      void* p = cxlpool_malloc(pool, size);
      if (!p) {
        CHECK(errno == ENOMEM);
        break;
      }
      static_cast<char*>(p)[0] = 1;  // touching never faults: commits are checked up front
      v.push_back(p);
      REQUIRE(v.size() < 1000000);
    }
    CHECK(v.size() * size >= 8 * kMiB);  // at least half the 16 MiB device was usable
    cxlpool_stats_t s{};
    cxlpool_pool_get_stats(pool, 0, &s);
    CHECK(s.failures > 0);
    CHECK(s.resident_bytes <= 16 * kMiB);
    for (void* p : v) cxlpool_free(p);
    cxlpool_pool_trim(pool, nullptr);
    void* again = cxlpool_malloc(pool, size);
    CHECK(again != nullptr);
    cxlpool_free(again);
  }
  cxlpool_pool_destroy(pool);
}

TEST_CASE("statistics: counts, live bytes, JSON", "[unit]") {
  Fixture fx;
  cxlpool_pool_t* pool = fx.pool("node0,cxlA", "threshold:size=64K,tier=far");
  std::vector<void*> v;
  for (int i = 0; i < 100; ++i) v.push_back(cxlpool_malloc(pool, 1000));
  for (int i = 0; i < 10; ++i) v.push_back(cxlpool_malloc(pool, 100 * kKiB));
  cxlpool_stats_t near{}, far{}, all{};
  cxlpool_pool_get_stats(pool, 0, &near);
  cxlpool_pool_get_stats(pool, 1, &far);
  cxlpool_pool_get_stats(pool, -1, &all);
  CHECK(near.allocations == 100);
  CHECK(far.allocations == 10);
  CHECK(near.allocated_bytes == 100 * 1008);  // 1000 B rounds up to the 1008 B class
  CHECK(far.allocated_bytes >= 10 * 100 * kKiB);
  CHECK(all.allocations == 110);
  CHECK(near.resident_bytes > 0);
  CHECK(near.peak_resident_bytes >= near.resident_bytes);
  for (void* p : v) cxlpool_free(p);
  cxlpool_pool_get_stats(pool, -1, &all);
  CHECK(all.frees == 110);
  CHECK(all.allocated_bytes == 0);
  char* json = nullptr;
  REQUIRE(cxlpool_pool_stats_json(pool, &json) == CXLPOOL_OK);
  CHECK(std::string(json).find("\"device\": \"cxlA\"") != std::string::npos);
  cxlpool_string_free(json);
  cxlpool_stats_t bad{};
  CHECK(cxlpool_pool_get_stats(pool, 7, &bad) == CXLPOOL_E_NOT_FOUND);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("pool creation errors name the problem", "[unit]") {
  Fixture fx;
  cxlpool_pool_params_t* p = nullptr;
  cxlpool_pool_params_create(&p);
  cxlpool_pool_t* out = reinterpret_cast<cxlpool_pool_t*>(0x1);
  cxlpool_pool_params_set_policy(p, "spill:near=node0,far=nowhere,watermark=80%");
  CHECK(cxlpool_pool_create(fx.topo, p, &out) == CXLPOOL_E_CONFIG);
  CHECK(std::string(cxlpool_last_error_message()).find("'nowhere'") != std::string::npos);
  CHECK(out == reinterpret_cast<cxlpool_pool_t*>(0x1));
  cxlpool_pool_params_set_policy(p, "bind:near");
  cxlpool_pool_params_set_devices(p, "node0,ghost");
  CHECK(cxlpool_pool_create(fx.topo, p, &out) == CXLPOOL_E_NOT_FOUND);
  CHECK(std::string(cxlpool_last_error_message()).find("'ghost'") != std::string::npos);
  cxlpool_pool_params_set_devices(p, "node0,node0");
  CHECK(cxlpool_pool_create(fx.topo, p, &out) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_pool_params_destroy(p);
}

namespace {
long resident_kib() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? resident * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}
std::string thp_mode() {
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return "never";
  char line[128] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  const std::string s = got ? line : "";
  return s.find("[never]") != std::string::npos || s.empty() ? "never" : "on";
}
}  // namespace

TEST_CASE("a pool's first small block costs the process kilobytes, not a huge page of descriptors", "[unit]") {
  // With transparent huge pages on, memory advised for them is resident 2 MiB at a time from
  // its first touch; a small heap's segment descriptors must not be.
  if (thp_mode() == "never") CXLPOOL_SKIP("transparent huge pages are off: nothing here could be a huge page");
  cxlpool_test::CapiTopology topo("n0:backing=numa:0,size=256M");
  cxlpool_pool_t* pool = topo.pool("n0", "bind:n0");
  const long before = resident_kib();
  void* p = cxlpool_malloc(pool, 64);
  REQUIRE(p);
  std::memset(p, 1, 64);
  const long after = resident_kib();
  INFO("resident before " << before << " KiB, after " << after << " KiB");
  REQUIRE(before > 0);
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer's shadow of what the first malloc touches counts too (about 1.2 MiB); a huge
  // page of descriptors would still be 2 MiB on its own.
  constexpr long kBound = 2000;
#else
  constexpr long kBound = 1024;
#endif
  CHECK(after - before < kBound);
  cxlpool_free(p);
}

namespace {
// Allocates one block of each size on a thread pinned to cpu, frees them, and exits; false
// when the thread could not be pinned there.
bool blocks_on_cpu(cxlpool_pool_t* pool, int cpu, const std::vector<size_t>& sizes) {
  bool pinned = false, all = true;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pinned = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0 && sched_getcpu() == cpu;
    if (!pinned) return;
    std::vector<void*> v;
    for (size_t n : sizes) v.push_back(cxlpool_malloc(pool, n));
    for (void* p : v) {
      all = all && p;
      if (p) std::memset(p, 1, 8);
      cxlpool_free(p);
    }
  });
  t.join();
  REQUIRE(all);
  return pinned;
}
}  // namespace

TEST_CASE("threads that never overlap share one central heap, whichever CPUs they run on", "[unit]") {
  // A thread's first blocks of each class come from a central heap per CPU, and each central
  // heap holds a page of every class its threads touched: made for every CPU a lone thread
  // happened to run on, they multiplied that memory by the number of CPUs (docs/allocator.md).
  cpu_set_t allowed;
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int first = -1, second = -1;
  for (int c = 0; c < CPU_SETSIZE && second < 0; ++c)
    if (CPU_ISSET(c, &allowed)) {
      if (first < 0)
        first = c;
      else if (c % 4 != first % 4)  // central heaps are picked by CPU number modulo 4
        second = c;
    }
  if (second < 0) CXLPOOL_SKIP("this process may run on fewer than two CPUs of different central heaps");
  cxlpool_test::CapiTopology topo("n0:backing=numa:0,size=256M");
  cxlpool_pool_t* pool = topo.pool("n0", "bind:n0");
  const std::vector<size_t> sizes = {16, 64, 200, 1000, 5000, 12000, 40000, 100000};
  if (!blocks_on_cpu(pool, first, sizes)) CXLPOOL_SKIP("could not pin a thread to CPU " + std::to_string(first));
  cxlpool_stats_t after_first{}, after_second{};
  REQUIRE(cxlpool_pool_get_stats(pool, -1, &after_first) == CXLPOOL_OK);
  REQUIRE(after_first.active_bytes > 0);
  if (!blocks_on_cpu(pool, second, sizes)) CXLPOOL_SKIP("could not pin a thread to CPU " + std::to_string(second));
  REQUIRE(cxlpool_pool_get_stats(pool, -1, &after_second) == CXLPOOL_OK);
  INFO("CPUs " << first << " and " << second << ": active " << after_first.active_bytes << " then "
               << after_second.active_bytes << " bytes");
  CHECK(after_second.active_bytes <= after_first.active_bytes);  // the second thread carved no page
  CHECK(after_second.allocations == 2 * sizes.size());
  cxlpool_pool_destroy(pool);
}

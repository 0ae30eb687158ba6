// SPDX-License-Identifier: MIT
// The one fork registration (lib/lifecycle/lifecycle.cpp) with every component busy at once:
// private pools on a copy-on-write and a copy device, the tiering engine moving units on
// hints, the stats publisher, a shared pool's heartbeat and watch passes, a KV arena on it, all
// with threads inside them while the main thread forks. No fork may hang, and each child finds
// every component as a fork leaves it. CTest runs it twice: linked, and with the interposer
// preloaded as well (two copies of the allocator, whose handlers must interleave as
// lifecycle.cpp says).
#include <dirent.h>
#if defined(__SANITIZE_ADDRESS__)
#include <execinfo.h>
#include <link.h>
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::string unique_name(const char* tag) {
  return std::string("cxlpool-test-") + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
}

// True when this process holds its stats page's descriptor.
bool has_stats_page() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return false;
  bool found = false;
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n > 0 && std::strncmp(target, "/memfd:cxlpool-stats", 20) == 0) found = true;
  }
  closedir(d);
  return found;
}

bool tiering_running() {
  char* s = nullptr;
  if (cxlpool_tiering_stats_json(&s) != CXLPOOL_OK) return false;
  const bool running = std::strstr(s, "\"running\": true") || std::strstr(s, "\"running\":true");
  cxlpool_string_free(s);
  return running;
}

struct ShmPool {
  std::string name, device;
  cxlpool_shared_pool_t* pool = nullptr;
  ShmPool() {
    name = unique_name("lifecycle");
    device = "shm:" + name;
    cxlpool_shared_params_t* p = nullptr;
    REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_size(p, 64u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_extent_size(p, 1u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_lease_timing(p, 5, 100) == CXLPOOL_OK);  // a watch pass every 5 ms
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_OK);
    cxlpool_shared_params_destroy(p);
  }
  ~ShmPool() {
    if (pool) cxlpool_shared_pool_close(pool);
    unlink(("/dev/shm/" + name).c_str());
  }
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;
};

#if defined(__SANITIZE_ADDRESS__)
// gcc 12's AddressSanitizer has no fork handlers for its own allocator: a child forked while
// another thread held one of its size-class locks waits for it forever at that class's next
// refill (any multithreaded program built with it does). Such a hang is told apart from one of
// cxlpool's by where the child waits when the alarm comes: inside the sanitizer's runtime.
constexpr int kSanitizerHang = 99;
uintptr_t g_asan_lo = 0, g_asan_hi = 0;

int find_asan(dl_phdr_info* info, size_t, void*) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libasan.so")) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
    g_asan_lo = g_asan_lo ? std::min(g_asan_lo, lo) : lo;
    g_asan_hi = std::max(g_asan_hi, hi);
  }
  return 1;
}

void prepare_hang_probe() {
  dl_iterate_phdr(find_asan, nullptr);
  void* pcs[4];
  backtrace(pcs, 4);  // loads the unwinder now: the child's handler must not allocate
}

void on_child_alarm(int) {
  alarm(5);  // SA_RESETHAND: a second alarm while unwinding kills the child as hung
  void* pcs[8];
  const int n = backtrace(pcs, 8);
  // pcs[0] is this handler and pcs[1] the signal return; the frames after them are where the
  // child was waiting.
  for (int i = 2; i < n && i < 5; ++i) {
    const auto pc = reinterpret_cast<uintptr_t>(pcs[i]);
    if (pc >= g_asan_lo && pc < g_asan_hi) _exit(kSanitizerHang);
  }
  signal(SIGALRM, SIG_DFL);
  raise(SIGALRM);
}

void arm_child_alarm() {
  struct sigaction sa {};
  sa.sa_handler = on_child_alarm;
  sa.sa_flags = SA_NODEFER | SA_RESETHAND;
  sigaction(SIGALRM, &sa, nullptr);
  alarm(30);
}
#else
void prepare_hang_probe() {}
void arm_child_alarm() { alarm(30); }  // a hang in the child becomes a failure, not a stuck suite
#endif

}  // namespace

TEST_CASE("forks while every component is busy never hang, and each child finds every component as a fork leaves it",
          "[lifecycle]") {
  setenv("CXLPOOL_STAT_INTERVAL_MS", "10", 1);
  REQUIRE(cxlpool_tiering_start("monitors=hint,interval=20ms") == CXLPOOL_OK);  // before the pool: 4 MiB units
  cxlpool_test::CapiTopology topo(
      "fast:backing=shm,size=128M,tier=0;slow:backing=file:$DIR/slow,size=256M,tier=1,fork=copy",
      CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_pool_t* pool = topo.pool("fast,slow", "interleave:fast=1,slow=1");
  ShmPool shared;

  cxlpool_kv_geometry_t g{};
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.dtype = CXLPOOL_KV_FP16;
  g.tokens_per_block = 16;
  cxlpool_kv_arena_t* arena = nullptr;
  REQUIRE(cxlpool_kv_arena_create(&g, &shared.pool, 1, nullptr, &arena) == CXLPOOL_OK);

  REQUIRE(has_stats_page());
  REQUIRE(tiering_running());

  std::atomic<bool> stop{false};
  std::atomic<int> thread_failures{0};
  std::vector<std::thread> threads;
  // Private pools: small blocks, central-heap blocks and huge spans, and units the engine moves.
  threads.emplace_back([&] {
    std::vector<void*> held;
    for (unsigned k = 0; !stop.load(); ++k) {
      const size_t size = k % 97 == 0 ? 5 * kMiB : k % 7 == 0 ? 20000 : 100;
      void* p = cxlpool_malloc(pool, size);
      if (!p) {
        ++thread_failures;
        continue;
      }
      std::memset(p, int(k), size < 4096 ? size : 4096);
      if (size > kMiB) cxlpool_hint_access(p, size, 1000);
      held.push_back(p);
      if (held.size() > 64) {
        for (void* h : held) cxlpool_free(h);
        held.clear();
      }
    }
    for (void* h : held) cxlpool_free(h);
  });
  // The shared pool: its lock is taken and its extents change while the watch thread passes.
  threads.emplace_back([&] {
    while (!stop.load()) {
      void* q = nullptr;
      if (cxlpool_shared_alloc(shared.pool, 512 + 4096 * (std::rand() % 4), &q) != CXLPOOL_OK) {
        ++thread_failures;
        continue;
      }
      cxlpool_shared_free(shared.pool, q);
    }
  });
  // A KV arena on the shared pool: sequences made, grown, sealed and dropped.
  threads.emplace_back([&] {
    std::vector<int32_t> tokens(64);
    for (int32_t k = 0; !stop.load(); ++k) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(k % 5) * 1000 + int32_t(i);
      cxlpool_kv_seq_t* s = nullptr;
      if (cxlpool_kv_seq_create(arena, &s) != CXLPOOL_OK) {
        ++thread_failures;
        continue;
      }
      if (cxlpool_kv_seq_append(s, tokens.data(), tokens.size(), nullptr) != CXLPOOL_OK ||
          cxlpool_kv_seq_seal(s, tokens.size()) != CXLPOOL_OK)
        ++thread_failures;
      cxlpool_kv_seq_destroy(s);
    }
  });

  constexpr int kForks = 100;
  int hung = 0, failed = 0, last_code = 0, sanitizer_hangs = 0;
  prepare_hang_probe();
  for (int i = 0; i < kForks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(i % 5));  // land in different moments
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      arm_child_alarm();
      int code = 0;
      // The allocator: the child's own heap, on both devices (its copy of the copy device).
      void* small = cxlpool_malloc(pool, 100);
      void* big = cxlpool_malloc(pool, 5 * kMiB);
      if (!small || !big) code |= 1;
      if (big) std::memset(big, 7, 5 * kMiB);
      cxlpool_free(small);
      cxlpool_free(big);
      // The shared pool: not a participant.
      void* q = nullptr;
      if (cxlpool_shared_alloc(shared.pool, 512, &q) != CXLPOOL_E_NOT_SUPPORTED) code |= 2;
      // Tiering: no engine in the child; stats: no page.
      if (tiering_running()) code |= 4;
      if (has_stats_page()) code |= 8;
      // The child forks in turn: nothing a thread of the parent was doing when the snapshot was
      // taken (a watch pass counting itself in, a move) is left for it to wait on.
      const pid_t grandchild = fork();
      if (grandchild == 0) _exit(0);
      int gstatus = 0;
      if (grandchild < 0 || waitpid(grandchild, &gstatus, 0) != grandchild || !WIFEXITED(gstatus) ||
          WEXITSTATUS(gstatus) != 0)
        code |= 16;
      _exit(code);
    }
    int status = 0;
    // A parent's fork() that returned at all did not hang in prepare; the child may still hang.
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) ++hung;
#if defined(__SANITIZE_ADDRESS__)
    else if (WIFEXITED(status) && WEXITSTATUS(status) == kSanitizerHang)
      ++sanitizer_hangs;
#endif
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      last_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
  }
  stop = true;
  for (auto& t : threads) t.join();
  INFO("last failed child's code " << last_code
                                   << " (1 allocator, 2 shared pool, 4 tiering, 8 stats, 16 its own fork)");
  CHECK(hung == 0);
  CHECK(failed == 0);
  if (sanitizer_hangs > 0)
    WARN(sanitizer_hangs << " of " << kForks
                         << " children waited on a lock of AddressSanitizer's allocator that another thread held at "
                            "the fork (gcc 12's ASan has no fork handlers; not cxlpool's)");
  CHECK(sanitizer_hangs <= kForks / 10);
  CHECK(thread_failures.load() == 0);

  // The parent's components went on through every fork.
  cxlpool_shared_info_t info{};
  REQUIRE(cxlpool_shared_pool_info(shared.pool, &info) == CXLPOOL_OK);
  CHECK(info.participants == 1);
  CHECK(tiering_running());
  CHECK(has_stats_page());
  void* p = cxlpool_malloc(pool, 100);
  CHECK(p);
  cxlpool_free(p);

  CHECK(cxlpool_kv_arena_destroy(arena) == CXLPOOL_OK);
  cxlpool_tiering_stop();
  cxlpool_pool_destroy(pool);
}

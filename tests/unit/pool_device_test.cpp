// SPDX-License-Identifier: MIT
// Pools and the device model through the public C API: fork() semantics of private and shared
// pools on every backing and under several policies; several pools on one device (disjoint
// memory, one capacity ledger, spill decided by the device's committed bytes); interior and
// double frees in every local/remote order with exact statistics; free memory returning to
// the device when the program goes idle, and all of it on trim; a nearly full device keeping
// offsets for huge blocks.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

struct Topo : cxlpool_test::CapiTopology {
  explicit Topo(const std::string& devices)
      : CapiTopology(devices, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) {}
};

struct Block {
  unsigned char* p;
  size_t n;
};

// Sizes from 16 B to 8 MiB: small classes, multi-slice pages, huge spans.
std::vector<Block> allocate_mix(cxlpool_pool_t* pool, unsigned char pattern) {
  std::vector<Block> out;
  for (size_t n : {16ul, 48ul, 200ul, 1000ul, 4096ul, 30000ul, 100000ul, 700000ul, 2 * kMiB, 8 * kMiB})
    for (int i = 0; i < 8; ++i) {
      auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, n));
      if (!p) return {};
      std::memset(p, pattern, n);
      out.push_back({p, n});
    }
  return out;
}

bool holds(const std::vector<Block>& blocks, unsigned char pattern) {
  for (auto& b : blocks)
    for (size_t i = 0; i < b.n; i += 509)
      if (b.p[i] != pattern || b.p[b.n - 1] != pattern) return false;
  return !blocks.empty();
}

void fill(const std::vector<Block>& blocks, unsigned char pattern) {
  for (auto& b : blocks) std::memset(b.p, pattern, b.n);
}

void send(int fd) { REQUIRE(write(fd, "x", 1) == 1); }
void await(int fd) {
  char c;
  REQUIRE(read(fd, &c, 1) == 1);
}

// Parent and child each write their own pattern over the blocks allocated before fork, then
// allocate and fill new blocks; each must see only its own bytes. Lock-step through pipes so
// every interleaving that could leak is exercised: child writes first, parent checks; parent
// writes, child checks. Returns what went wrong, or "".
std::string fork_differential(cxlpool_pool_t* pool) {
  std::vector<Block> before = allocate_mix(pool, 0x11);
  if (before.empty()) return "allocation before fork failed";
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    if (!holds(before, 0x11)) code |= 1;  // the child starts with the parent's bytes
    fill(before, 0x22);
    std::vector<Block> mine = allocate_mix(pool, 0x33);
    if (mine.empty()) code |= 2;
    // Free half of the inherited blocks and reuse the space: only the child's copy changes.
    for (size_t i = 0; i < before.size(); i += 2) cxlpool_free(before[i].p);
    std::vector<Block> again = allocate_mix(pool, 0x44);
    send(to_parent[1]);
    await(to_child[0]);  // the parent has written everything it writes
    std::vector<Block> kept;
    for (size_t i = 1; i < before.size(); i += 2) kept.push_back(before[i]);
    if (!holds(kept, 0x22)) code |= 4;
    if (!holds(mine, 0x33)) code |= 8;
    if (!holds(again, 0x44)) code |= 16;
    _exit(code);
  }
  close(to_parent[1]);  // a child that dies makes the reads below end, not block
  close(to_child[0]);
  std::string problem;
  char c;
  if (read(to_parent[0], &c, 1) != 1) problem += "the child died before writing; ";
  if (!holds(before, 0x11)) problem += "the child's writes reached the parent; ";
  std::vector<Block> mine = allocate_mix(pool, 0x55);
  fill(before, 0x66);
  (void)!write(to_child[1], "x", 1);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    problem += "child status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status)) +
               " (1: inherited bytes, 4: parent's writes reached the child, 8/16: child's new blocks); ";
  if (!holds(before, 0x66) || !holds(mine, 0x55)) problem += "the parent's own blocks changed; ";
  for (auto& b : before) cxlpool_free(b.p);
  for (auto& b : mine) cxlpool_free(b.p);
  close(to_parent[0]);
  close(to_child[1]);
  return problem;
}

cxlpool_stats_t stats(cxlpool_pool_t* pool, int device = -1) {
  cxlpool_stats_t s{};
  REQUIRE(cxlpool_pool_get_stats(pool, device, &s) == CXLPOOL_OK);
  return s;
}

// The purger returns idle memory in the background, within about two delays on an idle machine
// and later on a busy or slower one: wait for it (60 s at most, a hang guard) instead of for a
// time that holds only on a machine as fast as this one. Returns the resident bytes and the wait.
std::pair<uint64_t, long> wait_for_resident_below(cxlpool_pool_t* pool, uint64_t limit) {
  long waited_ms = 0;
  uint64_t resident = stats(pool).resident_bytes;
  for (; resident >= limit && waited_ms < 60000; waited_ms += 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    resident = stats(pool).resident_bytes;
  }
  return {resident, waited_ms};
}

}  // namespace

TEST_CASE("private pools: a forked child gets its own copy on every backing, under every policy",
          "[unit][numa][slow]") {
  const std::string shm = "cxlpool-fork-" + std::to_string(getpid());
  Topo t("mf:backing=shm,size=512M;mfc:backing=shm,size=512M,fork=copy;sh:backing=shm:" + shm +
         ",size=512M;fl:backing=file:$DIR/heap,size=512M;flc:backing=file:$DIR/copy,size=512M,fork=copy;"
         "n0:backing=numa:0,size=512M,latency=90ns");
  for (const char* dev : {"mf", "mfc", "sh", "fl", "flc", "n0"}) {
    for (std::string policy : {std::string("bind:") + dev, "threshold:size=64K,device=" + std::string(dev) + "|bind:n0",
                               "interleave:n0=1," + std::string(dev) + "=1"}) {
      if (std::string(dev) == "n0" && policy.rfind("bind", 0) != 0) continue;
      INFO("device " << dev << ", policy " << policy);
      std::string devices = std::string(dev) == "n0" ? "n0" : "n0," + std::string(dev);
      cxlpool_pool_t* pool = t.pool(devices, policy);
      CHECK(fork_differential(pool) == "");
      cxlpool_pool_destroy(pool);
    }
  }
}

TEST_CASE("shared pools: a forked child sees the same memory and cannot allocate from it", "[unit]") {
  Topo t("mf:backing=shm,size=64M;fl:backing=file:$DIR/heap,size=64M;n0:backing=numa:0,size=64M");
  for (const char* dev : {"mf", "fl", "n0"}) {
    INFO("device " << dev);
    cxlpool_pool_t* pool = t.pool(dev, std::string("bind:") + dev, CXLPOOL_SHARING_SHARED);
    auto* small = static_cast<unsigned char*>(cxlpool_malloc(pool, 256));
    auto* big = static_cast<unsigned char*>(cxlpool_malloc(pool, 3 * kMiB));
    REQUIRE(small);
    REQUIRE(big);
    std::memset(small, 1, 256);
    std::memset(big, 1, 3 * kMiB);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 0;
      small[10] = 42;
      big[3 * kMiB - 1] = 43;
      errno = 0;
      if (cxlpool_malloc(pool, 64) != nullptr || errno != ENOMEM) code |= 1;
      if (cxlpool_malloc(pool, 4 * kMiB) != nullptr) code |= 2;
      cxlpool_free(small);  // ignored: the heap is the parent's
      _exit(code);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(small[10] == 42);  // the child's writes are here
    CHECK(big[3 * kMiB - 1] == 43);
    void* again = cxlpool_malloc(pool, 64);  // the parent still allocates
    CHECK(again);
    CHECK(again != small);
    cxlpool_free(again);
    cxlpool_free(small);
    cxlpool_free(big);
    cxlpool_pool_destroy(pool);
  }
}

TEST_CASE("pools on one device: disjoint blocks, one capacity ledger", "[unit]") {
  const std::string shm = "cxlpool-two-" + std::to_string(getpid());
  Topo t("sh:backing=shm:" + shm + ",size=256M;fl:backing=file:$DIR/heap,size=256M;mf:backing=shm,size=256M");
  for (const char* dev : {"sh", "fl", "mf"}) {
    INFO("device " << dev);
    cxlpool_pool_t* a = t.pool(dev, "bind:near");
    cxlpool_pool_t* b = t.pool(dev, "bind:near");
    std::vector<Block> in_a = allocate_mix(a, 0xa1), in_b;
    for (size_t n : {64ul, 5000ul, 2 * kMiB})
      for (int i = 0; i < 4; ++i) {
        auto* p = static_cast<unsigned char*>(cxlpool_malloc(b, n));
        REQUIRE(p);
        std::memset(p, 0xb2, n);
        in_b.push_back({p, n});
      }
    CHECK(holds(in_a, 0xa1));
    CHECK(holds(in_b, 0xb2));
    for (auto& x : in_a)
      for (auto& y : in_b) CHECK((x.p + x.n <= y.p || y.p + y.n <= x.p));
    // Capacity is the device's: both pools' commits are one figure, and the second pool
    // cannot take what the first holds.
    cxlpool_stats_t sa = stats(a), sb = stats(b);
    CHECK(sa.device_committed_bytes == sb.device_committed_bytes);
    CHECK(sa.device_committed_bytes >= sa.resident_bytes + sb.resident_bytes);
    CHECK(sa.capacity_bytes == 256 * kMiB);
    REQUIRE(in_a.size() == 80);
    std::vector<void*> hog;
    while (void* p = cxlpool_malloc(a, 4 * kMiB)) hog.push_back(p);
    CHECK(cxlpool_malloc(b, 4 * kMiB) == nullptr);  // the device is full, whichever pool asks
    for (void* p : hog) cxlpool_free(p);
    for (auto& x : in_a) cxlpool_free(x.p);
    for (auto& y : in_b) cxlpool_free(y.p);
    cxlpool_pool_destroy(a);
    cxlpool_pool_destroy(b);
  }
}

TEST_CASE("spill reads the near device's ledger, whichever pool filled it", "[unit]") {
  Topo t("near0:backing=shm,size=64M,latency=90ns;far0:backing=shm,size=256M,latency=400ns");
  cxlpool_pool_t* filler = t.pool("near0", "bind:near0");
  cxlpool_pool_t* spill = t.pool("near0,far0", "spill:near=near0,far=far0,watermark=50%");
  void* p = cxlpool_malloc(spill, 100);
  cxlpool_ptr_info_t info;
  REQUIRE(cxlpool_ptr_info(p, &info) == CXLPOOL_OK);
  CHECK(std::string(info.device_name) == "near0");
  std::vector<void*> hog;
  for (int i = 0; i < 10; ++i) hog.push_back(cxlpool_malloc(filler, 4 * kMiB));  // 40 of 64 MiB
  void* q = cxlpool_malloc(spill, 100000);  // a new page: decided by the device's 62% committed
  REQUIRE(cxlpool_ptr_info(q, &info) == CXLPOOL_OK);
  CHECK(std::string(info.device_name) == "far0");
  for (void* h : hog) cxlpool_free(h);
  cxlpool_free(p);
  cxlpool_free(q);
  cxlpool_pool_destroy(spill);
  cxlpool_pool_destroy(filler);
}

TEST_CASE("interior, foreign and double frees never release a block, in every order", "[unit]") {
  Topo t("mf:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
  auto live_bytes = [&] { return stats(pool).allocated_bytes; };
  for (size_t n : {64ul, 3000ul, 200000ul, 3 * kMiB}) {
    INFO("block size " << n);
    const uint64_t base = live_bytes();
    auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, n));
    REQUIRE(p);
    std::memset(p, 0x5c, n);
    const uint64_t with_p = live_bytes();
    cxlpool_stats_t s0 = stats(pool);
    cxlpool_free(p + 16);  // interior
    cxlpool_free(p + n - 1);
    CHECK(live_bytes() == with_p);
    CHECK(stats(pool).invalid_frees == s0.invalid_frees + 2);
    CHECK(cxlpool_usable_size(p + 16) == 0);
    // The block is still ours: nothing else gets it.
    std::vector<void*> others;
    for (int i = 0; i < 64; ++i) {
      void* q = cxlpool_malloc(pool, n);
      CHECK(q != p);
      others.push_back(q);
    }
    CHECK(p[0] == 0x5c);
    for (void* q : others) cxlpool_free(q);

    enum Who { kHere, kThere };
    for (auto [first, second] : {std::pair{kHere, kHere}, {kHere, kThere}, {kThere, kHere}, {kThere, kThere}}) {
      INFO("first free " << (first == kHere ? "local" : "remote") << ", second "
                         << (second == kHere ? "local" : "remote"));
      auto* b = static_cast<unsigned char*>(cxlpool_malloc(pool, n));
      REQUIRE(b);
      uint64_t doubles = stats(pool).double_frees, frees = stats(pool).frees;
      auto free_by = [&](Who who) {
        if (who == kHere)
          cxlpool_free(b);
        else
          std::thread([&] { cxlpool_free(b); }).join();
      };
      free_by(first);
      free_by(second);
      CHECK(stats(pool).double_frees == doubles + 1);
      CHECK(stats(pool).frees == frees + 1);
      // Two allocations never get the same block, whichever thread asks.
      void* x = cxlpool_malloc(pool, n);
      void* y = nullptr;
      std::thread([&] { y = cxlpool_malloc(pool, n); }).join();
      void* z = cxlpool_malloc(pool, n);
      CHECK(x != y);
      CHECK(x != z);
      CHECK(y != z);
      cxlpool_free(x);
      cxlpool_free(y);
      cxlpool_free(z);
    }
    cxlpool_free(p);
    CHECK(live_bytes() == base);
  }
  int on_stack = 0;
  cxlpool_free(&on_stack);  // foreign: not ours, nothing happens
  cxlpool_pool_destroy(pool);
}

// A thread's last block from malloc's fast path is freed without the lookup chain (the
// allocator remembers where it lives). The memory is only a cache: each case below leaves it
// pointing at a block that is no longer what it was, and the free must then be judged as if
// it went the long way.
TEST_CASE("the free of a thread's last block is judged like any other once the block changed", "[unit]") {
  Topo t("mf:backing=shm,size=256M");
  // Past the warm-up (a thread's first blocks of a class come from the shared heaps), so the
  // next block is from the thread's own page, the path that remembers it.
  auto own_page_block = [](cxlpool_pool_t* pool, size_t n) {
    std::vector<void*> warm;
    for (int i = 0; i < 300; ++i) warm.push_back(cxlpool_malloc(pool, n));
    for (void* w : warm) cxlpool_free(w);
    return static_cast<unsigned char*>(cxlpool_malloc(pool, n));
  };

  // p, the thread's last block (the second of its page), is freed by another thread with the
  // page's first; the page empties, is trimmed, and is carved again for blocks of another
  // class, the first of which now holds p's address inside it. A late second free of p is an
  // interior pointer then: ignored, and the new blocks (the second among them, whose bit p's
  // old index names) stay live. The new blocks are aligned allocations, which never pass
  // malloc's fast path: nothing replaces p as the thread's last block meanwhile.
  auto recarved = [&](bool same_thread) {
    cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
    std::vector<void*> warm, others;
    unsigned char *first = nullptr, *p = nullptr;
    size_t covering = 0;
    uint64_t ignored_before = 0, ignored_after = 0;
    auto aligned_3k = [&] { return static_cast<unsigned char*>(cxlpool_aligned_alloc(pool, 1024, 3072)); };
    auto carve_over_p = [&] {
      for (int i = 0; i < 4000 && !covering; ++i) {
        unsigned char* q = aligned_3k();
        if (!q) return;
        others.push_back(q);
        if (q < p && p < q + 3072) covering = others.size();
      }
      for (int i = 0; i < 4; ++i) others.push_back(aligned_3k());  // its neighbours
    };
    std::thread owner([&] {
      for (int i = 0; i < 32; ++i) warm.push_back(cxlpool_malloc(pool, 64));  // the warm-up
      first = static_cast<unsigned char*>(cxlpool_malloc(pool, 64));          // its own page
      p = static_cast<unsigned char*>(cxlpool_malloc(pool, 64));
      if (!first || !p) return;
      // The thread's warm-up of the new class now, so that what it carves later is its own.
      if (same_thread)
        for (int i = 0; i < 32; ++i) warm.push_back(aligned_3k());
      std::thread([&] {
        cxlpool_free(p);
        cxlpool_free(first);
      }).join();
      uint64_t released = 0;
      if (cxlpool_pool_trim(pool, &released) != CXLPOOL_OK) return;  // folds, retires the page
      if (same_thread)
        carve_over_p();
      else
        std::thread(carve_over_p).join();
      ignored_before = stats(pool).double_frees + stats(pool).invalid_frees;
      cxlpool_free(p);
      ignored_after = stats(pool).double_frees + stats(pool).invalid_frees;
    });
    owner.join();
    REQUIRE(p);
    REQUIRE(covering);  // the premise: a new block holds p's address
    CHECK(p == first + 64);
    CHECK(ignored_after == ignored_before + 1);
    for (void* q : others) CHECK(cxlpool_usable_size(q) >= 3072);
    std::vector<void*> more;
    for (int i = 0; i < 300; ++i) {
      void* m = aligned_3k();
      CHECK(std::find(others.begin(), others.end(), m) == others.end());
      more.push_back(m);
    }
    for (void* m : more) cxlpool_free(m);
    for (void* q : others) cxlpool_free(q);
    for (void* w : warm) cxlpool_free(w);
    cxlpool_pool_destroy(pool);
  };
  SECTION("freed elsewhere, its page carved again by another thread") { recarved(false); }
  SECTION("freed elsewhere, its page carved again by its own thread") { recarved(true); }

  SECTION("its pool destroyed and another made in the same registry slot") {
    cxlpool_pool_t* first = t.pool("mf", "bind:mf");
    cxlpool_pool_t* second = nullptr;
    bool ran = false;
    std::thread worker([&] {
      unsigned char* p = own_page_block(first, 64);
      if (!p) return;
      std::thread([&] { cxlpool_pool_destroy(first); }).join();
      std::thread([&] { second = t.pool("mf", "bind:mf"); }).join();
      // This thread's first block of the new pool comes from a shared heap: its last block
      // is still p, of a pool that no longer exists.
      void* q = second ? cxlpool_malloc(second, 64) : nullptr;
      if (!q) return;
      ran = true;
      const cxlpool_stats_t before = stats(second);
      cxlpool_free(p);
      const cxlpool_stats_t after = stats(second);
      CHECK(after.frees == before.frees);
      CHECK(after.allocated_bytes == before.allocated_bytes);
      // p's address may hold the new pool's blocks now: none of them is handed out twice.
      std::vector<void*> blocks{q};
      for (int i = 0; i < 2000; ++i) blocks.push_back(cxlpool_malloc(second, 64));
      std::sort(blocks.begin(), blocks.end());
      CHECK(std::adjacent_find(blocks.begin(), blocks.end()) == blocks.end());
      for (void* b : blocks) cxlpool_free(b);
    });
    worker.join();
    CHECK(ran);
    cxlpool_pool_destroy(second);
  }

  SECTION("freed twice by its thread, with another thread's free between") {
    cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
    std::thread([&] {
      unsigned char* p = own_page_block(pool, 200);
      CHECK(p);
      if (!p) return;
      const uint64_t doubles = stats(pool).double_frees;
      cxlpool_free(p);
      std::thread([&] { cxlpool_free(p); }).join();
      cxlpool_free(p);
      CHECK(stats(pool).double_frees == doubles + 2);
      void* a = cxlpool_malloc(pool, 200);
      void* b = cxlpool_malloc(pool, 200);
      CHECK(a != b);
      cxlpool_free(a);
      cxlpool_free(b);
    }).join();
    cxlpool_pool_destroy(pool);
  }
}

TEST_CASE("freed memory returns to the device when the program goes idle, and all of it on trim", "[unit]") {
  Topo t("mf:backing=shm,size=2G");
  cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
  std::vector<void*> blocks;
  for (int i = 0; i < 200000; ++i) {  // ~300 MiB across classes, pages and huge blocks
    size_t n = i % 1000 == 0 ? 2 * kMiB : 16 + size_t(i % 97) * 31;
    void* p = cxlpool_malloc(pool, n);
    REQUIRE(p);
    std::memset(p, 1, n);
    blocks.push_back(p);
  }
  const uint64_t busy = stats(pool).resident_bytes;
  for (size_t i = 0; i < blocks.size(); ++i) cxlpool_free(blocks[(i * 7919) % blocks.size()]);
  blocks.clear();
  // No more calls into the allocator: the purger alone brings it down.
  const auto [idle, waited_ms] = wait_for_resident_below(pool, 8 * kMiB);
  INFO("resident busy " << busy / kMiB << " MiB, idle " << idle / kMiB << " MiB after " << waited_ms << " ms");
  CHECK(busy > 200 * kMiB);
  CHECK(idle < 8 * kMiB);  // at most the current pages of this thread
  uint64_t released = 0;
  REQUIRE(cxlpool_pool_trim(pool, &released) == CXLPOOL_OK);
  CHECK(stats(pool).resident_bytes == 0);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("large alignments come from address space, not from the device", "[unit]") {
  Topo t("mf:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    void* p = cxlpool_aligned_alloc(pool, 256 * kMiB, 64);
    REQUIRE(p);
    CHECK(reinterpret_cast<uintptr_t>(p) % (256 * kMiB) == 0);
    std::memset(p, 1, 64);
    blocks.push_back(p);
  }
  CHECK(stats(pool).device_committed_bytes <= 4 * 64 * kKiB);  // four 64 KiB granules, not 1 GiB
  for (void* p : blocks) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("a device nearly full of huge blocks still serves huge blocks after a small one", "[unit]") {
  // The small block's region takes device offsets for its free segments too; it must leave the
  // device's last free offsets to the huge blocks that fit in the capacity.
  Topo t("mf:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
  std::vector<void*> blocks;
  for (int i = 0; i < 60; ++i) {
    void* p = cxlpool_malloc(pool, 4 * kMiB);
    REQUIRE(p);
    blocks.push_back(p);
  }
  void* small = cxlpool_malloc(pool, 64);
  REQUIRE(small);
  int more = 0;
  while (void* p = cxlpool_malloc(pool, 4 * kMiB)) {
    blocks.push_back(p);
    ++more;
  }
  // 16 MiB were free; the small block's page took 64 KiB of them.
  CHECK(more == 3);
  // The failure says why.
  CHECK(errno == ENOMEM);
  const std::string why = cxlpool_last_error_message();
  CHECK(why.find("no room for 4194304 bytes on device 'mf'") != std::string::npos);
  CHECK(why.find("of 256.0 MiB committed") != std::string::npos);
  cxlpool_free(small);
  for (void* p : blocks) cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("pages of an exited thread that other threads emptied return when idle", "[unit]") {
  Topo t("mf:backing=shm,size=1G");
  cxlpool_pool_t* pool = t.pool("mf", "bind:mf");
  std::vector<void*> blocks(200000);
  std::thread([&] {
    for (auto& p : blocks) {
      p = cxlpool_malloc(pool, 1000);
      std::memset(p, 1, 64);
    }
  }).join();  // the allocating thread is gone: its pages are abandoned
  const uint64_t busy = stats(pool).resident_bytes;
  for (void* p : blocks) cxlpool_free(p);  // remote frees into abandoned pages
  const auto [idle, waited_ms] = wait_for_resident_below(pool, 8 * kMiB);
  INFO("resident busy " << busy / kMiB << " MiB, idle " << idle / kMiB << " MiB after " << waited_ms << " ms");
  CHECK(busy > 150 * kMiB);
  CHECK(idle < 8 * kMiB);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("a fork child that frees nothing gives back what the parent's other threads had freed", "[unit]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  CXLPOOL_SKIP("under g++'s sanitizers a fork child starts no purger (alloc/segment.cpp)");
#endif
  Topo t("n0:backing=numa:0,size=1G");
  cxlpool_pool_t* pool = t.pool("n0", "bind:n0");
  // Two threads fill 48 MiB each, free it all and stay alive: their heaps keep the pages.
  std::mutex mu;
  std::condition_variable cv;
  int filled = 0;
  bool done = false;
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&] {
      std::vector<void*> v(48 * 1024);
      for (void*& p : v) {
        p = cxlpool_malloc(pool, 1024);
        if (p) std::memset(p, 1, 1024);
      }
      for (void* p : v) cxlpool_free(p);
      std::unique_lock<std::mutex> lock(mu);
      ++filled;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return filled == 2; });
  }
  const uint64_t busy = stats(pool).resident_bytes;
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(120);  // a hang guard
    // Its own small block, nothing freed: only the heaps fork abandoned ask for the purge.
    void* mine = cxlpool_malloc(pool, 64);
    if (mine) std::memset(mine, 2, 64);
    const auto [idle, waited_ms] = wait_for_resident_below(pool, 16 * kMiB);
    (void)waited_ms;
    _exit(idle < 16 * kMiB ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  for (auto& th : threads) th.join();
  INFO("resident before the fork " << busy / kMiB << " MiB");
  CHECK(busy > 64 * kMiB);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  cxlpool_pool_destroy(pool);
}

// SPDX-License-Identifier: MIT
// The VMA budget (device/device.hpp VmaUse): the device layer's model of its mappings equals
// what the kernel shows in /proc/self/maps through random commits and decommits on every
// backing kind; past the budget a decommit frees the pages but keeps the range accessible and
// committed (BUSY, the ledger unchanged), a copy move is refused (CAPACITY) and a kernel
// move is not; a pool under a tiny budget keeps allocating, freeing and purging with exact
// ledgers.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "alloc/pool.hpp"
#include "device/device.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

using cxlpool::detail::BackingSpec;
using cxlpool::detail::Device;
using cxlpool::detail::set_vma_budget;
using cxlpool::detail::Sharing;
using cxlpool::detail::vma_use;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kPage = 4096;

std::unique_ptr<Device> make(const std::string& kind) {
  static int counter = 0;
  BackingSpec spec;
  spec.device_name = "vma-" + kind + std::to_string(++counter);
  spec.capacity = 256 * kMiB;
  if (kind == "numa") {
    spec.kind = CXLPOOL_BACKING_NUMA;
    spec.numa_node = 0;
  } else if (kind == "memfd") {
    spec.kind = CXLPOOL_BACKING_MEMFD;
  } else if (kind == "shm") {
    spec.kind = CXLPOOL_BACKING_SHM;
    spec.path = "cxlpool-test-vma-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  } else {
    spec.kind = CXLPOOL_BACKING_FILE;
    spec.path = "/tmp/cxlpool-test-vma-" + std::to_string(getpid()) + "-" + std::to_string(counter);
  }
  return std::make_unique<Device>(spec);
}

// Lines of /proc/self/maps inside [lo, hi): the kernel's mappings there.
int64_t kernel_vmas(uintptr_t lo, uintptr_t hi) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  REQUIRE(f);
  int64_t n = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line, "%lx-%lx", &a, &b) == 2 && a < hi && b > lo) ++n;
  }
  std::fclose(f);
  return n;
}

bool resident(const void* p) {
  unsigned char v = 0;
  REQUIRE(mincore(const_cast<void*>(p), kPage, &v) == 0);
  return v & 1;
}

struct BudgetReset {
  ~BudgetReset() { set_vma_budget(0); }
};

}  // namespace

TEST_CASE("the model of cxlpool's mappings is what the kernel shows, on every backing", "[vma]") {
  for (const char* kind : {"numa", "memfd", "shm", "file"}) {
    DYNAMIC_SECTION(kind) {
      auto dev = make(kind);
      const int64_t before = int64_t(vma_use().vmas);
      void* base = nullptr;
      REQUIRE(dev->reserve(16 * kMiB, 2 * kMiB, 20 * kMiB, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
      const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + 20 * kMiB;
      CHECK(int64_t(vma_use().vmas) - before == kernel_vmas(lo, hi));
      std::mt19937 rng(7);
      auto* p = static_cast<unsigned char*>(base);
      for (int op = 0; op < 600; ++op) {
        const size_t first = rng() % 4096, pages = 1 + rng() % 24;
        const size_t len = std::min(pages, 4096 - first) * kPage;
        if (rng() % 2)
          REQUIRE(dev->commit(p + first * kPage, len, false, 1, nullptr) == CXLPOOL_OK);
        else
          REQUIRE(dev->decommit(p + first * kPage, len, 1, nullptr) == CXLPOOL_OK);
        if (op % 50 == 49) {
          INFO("after operation " << op);
          REQUIRE(int64_t(vma_use().vmas) - before == kernel_vmas(lo, hi));
        }
      }
      REQUIRE(dev->release(base, 1, nullptr) == CXLPOOL_OK);
      CHECK(int64_t(vma_use().vmas) == before);
    }
  }
}

TEST_CASE("past the budget a decommit frees the pages and keeps the range committed and accessible", "[vma]") {
  BudgetReset reset;
  auto dev = make("numa");  // anonymous: a freed page is visibly gone (mincore) and reads as zero
  void* base = nullptr;
  REQUIRE(dev->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  auto* p = static_cast<unsigned char*>(base);
  REQUIRE(dev->commit(p, 4 * kMiB, false, 1, nullptr) == CXLPOOL_OK);
  std::memset(p, 7, 4 * kMiB);
  const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + 4 * kMiB;
  set_vma_budget(int64_t(vma_use().vmas) + 10);  // room for five holes
  const uint64_t refusals = vma_use().refusals;
  int refused = 0;
  for (size_t page = 1; page < 64; page += 2) {
    cxlpool::detail::DeviceError err;
    const uint64_t committed = dev->committed();
    cxlpool_status_t st = dev->decommit(p + page * kPage, kPage, 1, &err);
    if (st == CXLPOOL_OK) {
      CHECK(dev->committed() == committed - kPage);
      continue;
    }
    REQUIRE(st == CXLPOOL_E_BUSY);
    ++refused;
    CHECK(dev->committed() == committed);  // still counted
    CHECK(!resident(p + page * kPage));    // but freed
    CHECK(p[page * kPage] == 0);           // and accessible: a fresh zero page
    p[page * kPage] = 1;                   // writable
    CHECK(dev->describe("decommit", p + page * kPage, kPage, err).find("vm.max_map_count") != std::string::npos);
  }
  CHECK(refused == 32 - 5);
  CHECK(vma_use().refusals - refusals == uint64_t(refused));
  CHECK(vma_use().vmas <= vma_use().budget);
  CHECK(kernel_vmas(lo, hi) == 1 + 2 * 5);
  REQUIRE(dev->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("past the budget a copy move is refused and changes nothing", "[vma]") {
  BudgetReset reset;
  auto dev = make("memfd"), far = make("numa");
  void* base = nullptr;
  REQUIRE(dev->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  auto* p = static_cast<unsigned char*>(base);
  for (size_t page = 0; page < 64; page += 2) REQUIRE(dev->commit(p + page * kPage, kPage, false, 1, nullptr) == 0);
  for (size_t page = 0; page < 64; page += 2) p[page * kPage] = 7;
  const uint64_t committed = dev->committed();
  set_vma_budget(int64_t(vma_use().vmas) + 10);  // less than the staging mapping needs
  cxlpool::detail::DeviceError err;
  CHECK(dev->move_reservation(base, *far, nullptr, &err) == CXLPOOL_E_CAPACITY);
  CHECK(std::string(err.call) == "VMA budget");
  CHECK(dev->describe("move", base, 4 * kMiB, err).find("vm.max_map_count") != std::string::npos);
  CHECK(dev->committed() == committed);
  CHECK(far->committed() == 0);
  set_vma_budget(0);
  REQUIRE(dev->move_reservation(base, *far, nullptr, nullptr) == CXLPOOL_OK);
  for (size_t page = 0; page < 64; page += 2) REQUIRE(p[page * kPage] == 7);
  CHECK(far->committed() == committed);
  REQUIRE(far->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("a kernel move between NUMA nodes needs no staging and is not refused", "[vma]") {
  BudgetReset reset;
  auto a = make("numa"), b = make("numa");
  void* base = nullptr;
  REQUIRE(a->reserve(4 * kMiB, 2 * kMiB, 0, Sharing::kPrivate, 1, &base, nullptr) == CXLPOOL_OK);
  auto* p = static_cast<unsigned char*>(base);
  REQUIRE(a->commit(p, kMiB, false, 1, nullptr) == CXLPOOL_OK);
  REQUIRE(a->commit(p + 2 * kMiB, kMiB, false, 1, nullptr) == CXLPOOL_OK);
  std::memset(p, 3, kMiB);
  set_vma_budget(int64_t(vma_use().vmas));  // no room at all
  REQUIRE(a->move_reservation(base, *b, nullptr, nullptr) == CXLPOOL_OK);
  CHECK(p[kMiB - 1] == 3);
  REQUIRE(b->release(base, 1, nullptr) == CXLPOOL_OK);
}

TEST_CASE("a pool under a tiny budget allocates, frees and purges with exact ledgers", "[vma]") {
  BudgetReset reset;
  namespace A = cxlpool::detail::alloc;
  cxlpool::detail::DiscoverOptions o;
  o.ignore_env = true;
  o.no_hwloc = true;
  o.no_default_device = true;
  o.devices = "slow:backing=memfd,size=256M,tier=1";
  cxlpool::detail::Topology topo = cxlpool::detail::discover(o);
  A::PoolOptions po;
  po.name = "vma";
  A::Pool* pool = A::pool_create(topo, po);
  set_vma_budget(int64_t(vma_use().vmas) + 4);
  std::mt19937 rng(3);
  std::vector<void*> live;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 200; ++i) {
      void* q = A::pool_malloc(pool, 1 + rng() % (200 * 1024));
      REQUIRE(q);
      std::memset(q, 1, 64);
      live.push_back(q);
    }
    for (size_t i = 0; i < live.size(); i += 2) A::free_any(live[i]);
    std::vector<void*> kept;
    for (size_t i = 1; i < live.size(); i += 2) kept.push_back(live[i]);
    live.swap(kept);
    const uint64_t before_trim = vma_use().vmas;
    A::pool_trim(pool);
    const A::DeviceStats s = A::pool_device_stats(pool, 0);
    REQUIRE(s.resident_bytes == s.device_committed_bytes);
    // Reserves and commits may pass the budget (refusing them would fail allocations the
    // kernel allows); returning memory never adds mappings past it.
    REQUIRE(vma_use().vmas <= std::max(before_trim, vma_use().budget));
  }
  CHECK(vma_use().refusals > 0);
  for (void* q : live) A::free_any(q);
  A::pool_destroy(pool);
}

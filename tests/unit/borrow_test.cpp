// SPDX-License-Identifier: MIT
// Borrowed capacity (backing=pool:QUOTA@LOCATION, docs/compose.md "Programs follow"): a
// private pool's device whose memory is a shared pool's extents on one quota's account. It
// grows as the program allocates, within the quota's grant; a refusal is demand a composer
// sees; a lowered grant takes runs back after moving what they hold, the data intact; runs
// left empty go back; a closed device or a dead process returns everything.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/compose.h"
#include "elastic_support.hpp"
#include "shared_support.hpp"

namespace {

using namespace cxlpool_test::elastic;

// A shared pool of 1 MiB extents with quotas a and b of `quota_mib` each.
struct SharedPoolFile {
  std::string name, device;
  explicit SharedPoolFile(const char* tag, uint64_t size_mib = 128, uint64_t quota_mib = 32,
                          const char* domain = nullptr)
      : name(unique_name(tag)), device("shm:" + name) {
    Params params(size_mib << 20);
    if (domain) REQUIRE(cxlpool_shared_params_set_failure_domain(params.p, domain) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_add_quota(params.p, "a", quota_mib << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_add_quota(params.p, "b", quota_mib << 20) == CXLPOOL_OK);
    cxlpool_shared_pool_t* creator = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &creator) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(creator) == CXLPOOL_OK);
  }
  ~SharedPoolFile() { unlink(("/dev/shm/" + name).c_str()); }
  cxlpool_shared_pool_t* open(const char* quota) const {
    Params qp;
    REQUIRE(cxlpool_shared_params_set_quota(qp.p, quota) == CXLPOOL_OK);
    cxlpool_shared_pool_t* p = nullptr;
    INFO(cxlpool_last_error_message());
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), qp.p, &p) == CXLPOOL_OK);
    return p;
  }
};

// A borrowed near device on quota a (4 MiB at open) and the 256 MiB device it spills to, where
// a reclaim moves what the runs it takes back hold.
std::string lent_with_spare(const SharedPoolFile& sp) {
  return "lent:backing=pool:a@" + sp.device + ",size=4M;spare:backing=shm,size=256M";
}
constexpr const char* kSpillToSpare = "spill:near=lent,far=spare,watermark=95%";

cxlpool_compose_quota_t quota_state(cxlpool_shared_pool_t* p, const char* name) {
  cxlpool_compose_state_t s{};
  REQUIRE(cxlpool_compose_get_state(p, 10000, &s) == CXLPOOL_OK);
  for (uint32_t q = 0; q < s.quota_count; ++q)
    if (std::string(s.quotas[q].name) == name) return s.quotas[q];
  FAIL("no quota " << name);
  return {};
}

// Polls cond every 10 ms for up to 30 s (a bound for a loaded machine, not a timing claim).
template <class F>
bool eventually(F&& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

bool checked_clean(const std::string& device) {
  cxlpool_shared_check_report_t r{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_shared_pool_check(device.c_str(), nullptr, 0, &r) == CXLPOOL_OK);
  INFO("leaked " << r.leaked_blocks << " corrupt " << r.corrupt_words << " orphans " << r.orphan_extents << " dead "
                 << r.dead_participants << " dangling " << r.dangling_leases);
  return r.leaked_blocks == 0 && r.corrupt_words == 0 && r.orphan_extents == 0 && r.dead_participants == 0 &&
         r.dangling_leases == 0;
}

// A device counter from the pool's statistics JSON (the first device's).
uint64_t json_counter(cxlpool_pool_t* pool, const char* key) {
  char* json = nullptr;
  REQUIRE(cxlpool_pool_stats_json(pool, &json) == CXLPOOL_OK);
  const std::string text = json;
  cxlpool_string_free(json);
  const size_t at = text.find(std::string("\"") + key + "\":");
  REQUIRE(at != std::string::npos);
  return std::stoull(text.substr(at + std::strlen(key) + 3));
}

}  // namespace

TEST_CASE("borrow: a pool device's capacity is its quota's extents, borrowed as it fills", "[borrow]") {
  SharedPoolFile sp("borrow-grow");
  cxlpool_shared_pool_t* watcher = sp.open("b");
  Topo t("lent:backing=pool:a@" + sp.device + ",size=4M");
  cxlpool_pool_t* pool = t.pool("lent", "bind:lent");
  PoolGuard guard{pool};
  CHECK(capacity_of("lent").capacity_bytes == 4 * kMiB);
  CHECK(quota_state(watcher, "a").used_extents == 4);

  // Fresh memory from the pool reads zero whatever another participant left there.
  {
    cxlpool_shared_pool_t* other = sp.open("a");
    std::vector<void*> dirty;
    void* b = nullptr;
    while (cxlpool_shared_alloc(other, 1u << 20, &b) == CXLPOOL_OK) {
      std::memset(b, 0xab, 1u << 20);
      dirty.push_back(b);
    }
    CHECK(dirty.size() == 28);  // the quota's 32 less the device's 4
    for (void* d : dirty) REQUIRE(cxlpool_shared_free(other, d) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(other) == CXLPOOL_OK);
  }
  auto* big = static_cast<unsigned char*>(cxlpool_malloc(pool, 6 * kMiB));
  INFO(cxlpool_last_error_message());
  REQUIRE(big != nullptr);
  bool zero = true;
  for (size_t i = 0; i < 6 * kMiB; i += 512) zero &= big[i] == 0;
  CHECK(zero);
  CHECK(capacity_of("lent").capacity_bytes >= 10 * kMiB);

  // Up to the grant, then NULL under bind (nothing else to go to), a refusal counted and
  // demand recorded for a composer.
  std::vector<Block> blocks;
  for (unsigned i = 0;; ++i) {
    Block blk{static_cast<unsigned char*>(cxlpool_malloc(pool, kMiB)), kMiB, i};
    if (!blk.p) break;
    fill(blk);
    blocks.push_back(blk);
    REQUIRE(blocks.size() < 64);
  }
  CHECK(blocks.size() >= 16);
  CHECK(all_intact(blocks));
  CHECK(capacity_of("lent").capacity_bytes <= 32 * kMiB);
  CHECK(json_counter(pool, "borrow_refusals") > 0);
  CHECK(quota_state(watcher, "a").demand_extents > 0);

  // A grant raises what the device may borrow (taken from the idle quota b).
  uint64_t taken = 0;
  REQUIRE(cxlpool_compose_reclaim(watcher, "b", 16, 10000, 10000, &taken) == CXLPOOL_OK);
  REQUIRE(cxlpool_compose_grant(watcher, "a", 16, 10000) == CXLPOOL_OK);
  void* more = cxlpool_malloc(pool, 8 * kMiB);
  CHECK(more != nullptr);
  CHECK(capacity_of("lent").capacity_bytes > 32 * kMiB);
  CHECK(all_intact(blocks));
  cxlpool_free(more);
  cxlpool_free(big);
  for (const Block& blk : blocks) cxlpool_free(blk.p);
  REQUIRE(cxlpool_shared_pool_close(watcher) == CXLPOOL_OK);
}

TEST_CASE("borrow: a lowered grant takes runs back, moving what they hold, and empty runs go back", "[borrow]") {
  if (!copies_fenced())
    CXLPOOL_SKIP("moves need a userfaultfd that handles kernel faults (root or vm.unprivileged_userfaultfd)");
  SharedPoolFile sp("borrow-reclaim");
  cxlpool_shared_pool_t* composer = sp.open("b");
  Topo t(lent_with_spare(sp));
  cxlpool_pool_t* pool = t.pool("lent,spare", kSpillToSpare);
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 24 * kMiB);
  CHECK(capacity_of("lent").capacity_bytes >= 24 * kMiB);
  const uint64_t used = quota_state(composer, "a").used_extents;
  CHECK(used >= 24);

  // Reclaim 16 extents of quota a: the device's runs go back, their data moved to spare.
  uint64_t reclaimed = 0;
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_compose_reclaim(composer, "a", 16, 30000, 10000, &reclaimed) == CXLPOOL_OK);
  CHECK(reclaimed == 16);
  CHECK(quota_state(composer, "a").used_extents <= quota_state(composer, "a").granted_extents);
  CHECK(all_intact(blocks));
  CHECK(capacity_of("lent").evacuated_bytes > 0);
  CHECK(stats_of(pool, 1).resident_bytes > 0);

  // Freed, the runs stay empty and go back (one kept for the next allocation).
  for (const Block& blk : blocks) cxlpool_free(blk.p);
  REQUIRE(cxlpool_pool_trim(pool, nullptr) == CXLPOOL_OK);
  // An idle device keeps twice its target room (2 x 4 MiB here) and whatever part of a run
  // that leaves (runs go back whole, and are at most a quarter of what the device held).
  CHECK(eventually([&] { return quota_state(composer, "a").used_extents <= 16; }));
  INFO("used " << quota_state(composer, "a").used_extents << " capacity " << capacity_of("lent").capacity_bytes
               << " committed " << capacity_of("lent").committed_bytes);
  CHECK(capacity_of("lent").capacity_bytes <= 16 * kMiB);
  CHECK(checked_clean(sp.device));
  REQUIRE(cxlpool_shared_pool_close(composer) == CXLPOOL_OK);
}

// A composer lowering and raising the grant while threads allocate: runs borrowed, returned
// and borrowed again (each zeroed by the borrower) never hold a live block. A run the device
// had not yet put online looked empty to the follower, went back, and the next borrow zeroed
// blocks the device had since placed there.
TEST_CASE("borrow: blocks keep their data while a composer lowers and raises the grant", "[borrow]") {
  if (!copies_fenced())
    CXLPOOL_SKIP("moves need a userfaultfd that handles kernel faults (root or vm.unprivileged_userfaultfd)");
  SharedPoolFile sp("borrow-churn");
  cxlpool_shared_pool_t* composer = sp.open("b");
  Topo t(lent_with_spare(sp));
  cxlpool_pool_t* pool = t.pool("lent,spare", kSpillToSpare);
  PoolGuard guard{pool};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> damaged{0}, allocations{0};
  auto worker = [&](unsigned id) {
    std::vector<Block> live(64, Block{nullptr, 0, 0});
    unsigned r = id * 7919 + 1, seed = id << 20;
    auto next = [&] { return r = r * 1103515245u + 12345u; };
    while (!stop.load()) {
      Block& b = live[next() % live.size()];
      if (b.p) {
        damaged += !intact(b);
        cxlpool_free(b.p);
      }
      // Multiples of 8: fill() marks the last byte too, over the mark of a size 256k+1.
      const size_t n = (next() % 4 == 0 ? 256 * 1024 + next() % (768 * 1024) : 64 + next() % 4000) & ~size_t(7);
      b = Block{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, ++seed};
      if (b.p) {
        fill(b);
        ++allocations;
      }
    }
    for (Block& b : live)
      if (b.p) {
        damaged += !intact(b);
        cxlpool_free(b.p);
      }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 4; ++i) threads.emplace_back(worker, i + 1);
  // The working set (about 40 MiB) is more than the quota's 32: the device borrows all it may.
  CHECK(eventually([&] { return capacity_of("lent").capacity_bytes >= 24 * kMiB; }));
  // Rounds, not a duration. Each lowers the grant to 6 extents under what the quota uses, so
  // the follower must give back runs (moving what they hold), then raises it again for the
  // device to borrow anew.
  int unaccounted = 0;
  for (int round = 0; round < 100; ++round) {
    const cxlpool_compose_quota_t q = quota_state(composer, "a");
    const uint64_t cut = std::min<uint64_t>(q.granted_extents - 1, q.granted_extents - q.used_extents + 6);
    uint64_t took = 0;
    const cxlpool_status_t s = cxlpool_compose_reclaim(composer, "a", cut, 2000, 10000, &took);
    CHECK((s == CXLPOOL_OK || s == CXLPOOL_E_BUSY));
    if (took) REQUIRE(cxlpool_compose_grant(composer, "a", took, 10000) == CXLPOOL_OK);
    // All the device's capacity is runs on quota a's account (read first: a run is borrowed
    // before it is added, and withdrawn before it goes back).
    const uint64_t capacity = capacity_of("lent").capacity_bytes;
    unaccounted += capacity > quota_state(composer, "a").used_extents * kMiB;
  }
  stop = true;
  for (std::thread& th : threads) th.join();
  INFO("allocations " << allocations.load());
  CHECK(allocations.load() > 0);
  CHECK(damaged.load() == 0);
  CHECK(unaccounted == 0);
  REQUIRE(cxlpool_shared_pool_close(composer) == CXLPOOL_OK);
}

TEST_CASE("borrow: a closed device and a killed process give every run back", "[borrow]") {
  SharedPoolFile sp("borrow-close");
  cxlpool_shared_pool_t* watcher = sp.open("b");
  {
    Topo t("lent:backing=pool:a@" + sp.device + ",size=8M");
    cxlpool_pool_t* pool = t.pool("lent", "bind:lent");
    void* p = cxlpool_malloc(pool, 12 * kMiB);
    CHECK(p != nullptr);
    CHECK(quota_state(watcher, "a").used_extents >= 20);
    cxlpool_free(p);
    cxlpool_pool_destroy(pool);
  }
  CHECK(eventually([&] { return quota_state(watcher, "a").used_extents == 0; }));

  const pid_t child = fork();
  if (child == 0) {
    Topo t("lent:backing=pool:a@" + sp.device + ",size=16M");
    cxlpool_pool_params_t* params = nullptr;
    cxlpool_pool_params_create(&params);
    cxlpool_pool_params_set_devices(params, "lent");
    cxlpool_pool_params_set_policy(params, "bind:lent");
    cxlpool_pool_t* pool = nullptr;
    if (cxlpool_pool_create(t.topo, params, &pool) != CXLPOOL_OK) {
      std::fprintf(stderr, "child: %s\n", cxlpool_last_error_message());
      _exit(1);
    }
    void* p = cxlpool_malloc(pool, 4 * kMiB);
    if (p) std::memset(p, 1, 4 * kMiB);
    pause();
    _exit(0);
  }
  CHECK(eventually([&] { return quota_state(watcher, "a").used_extents >= 16; }));
  kill(child, SIGKILL);
  CHECK(wait_exit(child) == 128 + SIGKILL);
  CHECK(eventually([&] { return quota_state(watcher, "a").used_extents == 0; }));
  CHECK(checked_clean(sp.device));
  REQUIRE(cxlpool_shared_pool_close(watcher) == CXLPOOL_OK);
}

TEST_CASE("borrow: bad declarations and manual growth are refused with the reason", "[borrow]") {
  SharedPoolFile sp("borrow-bad");
  struct Case {
    std::string devices, words;
  } cases[] = {
      {"x:backing=pool:", "names its shared pool"},
      {"x:backing=pool:a@numa:0", "cannot hold a shared pool"},
      {"x:backing=pool:b%d@" + sp.device, "bad quota name"},
      {"x:backing=pool:zz@" + sp.device, "no quota named 'zz'"},
      {"x:backing=pool:a@shm:cxlpool-test-no-such-pool", "cxlpool-test-no-such-pool"},
      {"x:backing=pool:a@" + sp.device + ",fork=cow", "impossible on a pool device"},
  };
  for (const Case& c : cases) {
    INFO(c.devices);
    cxlpool_topology_t* topo = nullptr;
    cxlpool_config_t* cfg = nullptr;
    REQUIRE(cxlpool_config_create(&cfg) == CXLPOOL_OK);
    REQUIRE(cxlpool_config_set_devices(cfg, c.devices.c_str()) == CXLPOOL_OK);
    REQUIRE(cxlpool_config_set_flags(cfg, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC) == CXLPOOL_OK);
    const cxlpool_status_t s = cxlpool_topology_discover(cfg, &topo);
    const std::string msg = cxlpool_last_error_message();
    INFO(msg);
    CHECK(s == CXLPOOL_E_CONFIG);
    CHECK(msg.find(c.words) != std::string::npos);
    if (topo) cxlpool_topology_destroy(topo);
    cxlpool_config_destroy(cfg);
  }

  // A quota at its grant at open: the device opens empty and keeps asking, so the quota's
  // demand stays written for a composer; an allocation meanwhile fails naming the refusal;
  // once the quota has room the device borrows its size.
  {
    cxlpool_shared_pool_t* watcher = sp.open("b");
    cxlpool_shared_pool_t* holder = sp.open("a");
    std::vector<void*> held;
    void* b = nullptr;
    while (cxlpool_shared_alloc(holder, 1u << 20, &b) == CXLPOOL_OK) held.push_back(b);
    Topo t("big:backing=pool:a@" + sp.device + ",size=8M");
    cxlpool_pool_t* pool = t.pool("big", "bind:big");
    PoolGuard guard{pool};
    CHECK(capacity_of("big").capacity_bytes == 0);
    CHECK(cxlpool_malloc(pool, 4096) == nullptr);
    const std::string msg = cxlpool_last_error_message();
    INFO(msg);
    CHECK(msg.find("borrowing") != std::string::npos);
    CHECK(msg.find("quota \"a\" is full") != std::string::npos);
    // Still wanted after the follower's retries (each a refused claim).
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK(quota_state(watcher, "a").demand_extents > 0);
    for (void* h : held) REQUIRE(cxlpool_shared_free(holder, h) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(holder) == CXLPOOL_OK);
    CHECK(eventually([&] { return capacity_of("big").capacity_bytes >= 8 * kMiB; }));
    void* p = cxlpool_malloc(pool, 4096);
    CHECK(p != nullptr);
    cxlpool_free(p);
    REQUIRE(cxlpool_shared_pool_close(watcher) == CXLPOOL_OK);
  }

  // Its capacity is borrowed, never added by hand.
  Topo t("lent:backing=pool:a@" + sp.device + ",size=4M");
  cxlpool_pool_t* pool = t.pool("lent", "bind:lent");
  PoolGuard guard{pool};
  cxlpool_capacity_report_t r{};
  CHECK(cxlpool_device_add_extent("lent", 0, 4 * kMiB, &r) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(std::string(cxlpool_last_error_message()).find("borrowed") != std::string::npos);
}

TEST_CASE("borrow: a fork child gets its own copy, never the pool's extents", "[borrow]") {
  SharedPoolFile sp("borrow-fork");
  cxlpool_shared_pool_t* watcher = sp.open("b");
  Topo t("lent:backing=pool:a@" + sp.device + ",size=8M");
  cxlpool_pool_t* pool = t.pool("lent", "bind:lent");
  PoolGuard guard{pool};
  auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, 3 * kMiB));
  REQUIRE(p != nullptr);
  std::memset(p, 7, 3 * kMiB);
  const uint64_t used = quota_state(watcher, "a").used_extents;
  const pid_t child = fork();
  if (child == 0) {
    // The parent's bytes, in memory of the child's own: writing them changes nothing of the
    // parent's, and the child borrows nothing (its device cannot grow from the pool).
    bool same = p[0] == 7 && p[3 * kMiB - 1] == 7;
    std::memset(p, 9, 3 * kMiB);
    void* more = cxlpool_malloc(pool, 16 * kMiB);
    _exit(same && more == nullptr ? 0 : 1);
  }
  CHECK(wait_exit(child) == 0);
  bool intact = true;
  for (size_t i = 0; i < 3 * kMiB; i += 4096) intact &= p[i] == 7;
  CHECK(intact);
  CHECK(quota_state(watcher, "a").used_extents == used);
  cxlpool_free(p);
  REQUIRE(cxlpool_shared_pool_close(watcher) == CXLPOOL_OK);
}

namespace {

struct LostSeen {
  std::atomic<uint64_t> ranges{0}, committed{0};
};
void count_lost(const char* device, void*, size_t, uint64_t committed, void* ctx) {
  if (std::string(device) != "r1") return;
  auto* seen = static_cast<LostSeen*>(ctx);
  seen->ranges.fetch_add(1);
  seen->committed.fetch_add(committed);
}

// Where a block lives now (the resident device's index in the pool).
int device_of(const void* p) {
  cxlpool_ptr_info_t info{};
  REQUIRE(cxlpool_ptr_info(p, &info) == CXLPOOL_OK);
  return info.device;
}

bool reads_zero(const Block& b) {
  for (size_t i = 0; i < b.n; i += 256)
    if (b.p[i] != 0) return false;
  return b.p[b.n - 1] == 0;
}

}  // namespace

// Two pools in two failure domains, a program borrowing from both (spill: near r1 from rack1,
// far r2 from rack2). Pool rack1's file is cut to nothing under the program: its runs are taken
// away without a byte of them touched (a touch of a truncated file's pages is SIGBUS), what
// the program held there reads as zeros at the same addresses, the loss is reported, and
// allocations go on in rack2, whose blocks keep their data.
TEST_CASE("borrow: a failed pool's runs are lost and reported, and allocations go to the other failure domain",
          "[borrow]") {
  SharedPoolFile rack1("borrow-rack1", 128, 32, "rack1"), rack2("borrow-rack2", 128, 32, "rack2");
  LostSeen seen;
  REQUIRE(cxlpool_device_set_lost_handler(count_lost, &seen) == CXLPOOL_OK);
  struct HandlerGuard {
    ~HandlerGuard() { cxlpool_device_set_lost_handler(nullptr, nullptr); }
  } handler_guard;
  {
    Topo t("r1:backing=pool:a@" + rack1.device + ",size=8M;r2:backing=pool:a@" + rack2.device + ",size=4M");
    cxlpool_pool_t* pool = t.pool("r1,r2", "spill:near=r1,far=r2,watermark=95%");
    PoolGuard guard{pool};

    // Blocks on both devices: near first, far once near's watermark is reached.
    std::vector<Block> on_near, on_far;
    for (unsigned i = 0; on_far.size() < 4 || on_near.size() < 4; ++i) {
      REQUIRE(i < 400);
      const size_t n = (i % 3 == 0 ? 1000 : i % 3 == 1 ? 200000 : 2 * kMiB) + 8 * (i % 5);
      Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, i};
      INFO(cxlpool_last_error_message());
      REQUIRE(b.p != nullptr);
      fill(b);
      (device_of(b.p) == 0 ? on_near : on_far).push_back(b);
    }
    const uint64_t near_capacity = capacity_of("r1").capacity_bytes;
    CHECK(near_capacity >= 8 * kMiB);

    // The pool of rack1 fails under the program: its file cut to nothing.
    {
      const int fd = ::open(("/dev/shm/" + rack1.name).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
      REQUIRE(fd >= 0);
      REQUIRE(ftruncate(fd, 0) == 0);
      close(fd);
    }
    INFO("near: capacity " << capacity_of("r1").capacity_bytes << " lost " << capacity_of("r1").lost_bytes);
    CHECK(eventually([&] { return capacity_of("r1").capacity_bytes == 0 && seen.ranges.load() > 0; }));

    // What was there reads as zeros at the same addresses, and takes writes; nothing faulted.
    uint64_t near_bytes = 0;
    for (const Block& b : on_near) {
      CHECK(reads_zero(b));
      fill(b);
      CHECK(intact(b));
      near_bytes += b.n;
    }
    CHECK(all_intact(on_far));
    // Reported: the lost handler, the device's counters (committed bytes, at least the blocks').
    const cxlpool_device_capacity_t c = capacity_of("r1");
    CHECK(c.lost_bytes >= near_bytes);
    CHECK(c.lost_bytes == seen.committed.load());
    CHECK(c.forced > 0);

    // Allocations go on in rack2 only; near never grows again and says why.
    std::vector<Block> after;
    for (unsigned i = 0; i < 24; ++i) {
      Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, i % 2 ? kMiB : 3000)), i % 2 ? kMiB : 3000, 1000 + i};
      INFO(cxlpool_last_error_message());
      REQUIRE(b.p != nullptr);
      fill(b);
      CHECK(device_of(b.p) == 1);
      after.push_back(b);
    }
    CHECK(all_intact(after));
    CHECK(all_intact(on_far));
    CHECK(capacity_of("r1").capacity_bytes == 0);
    {
      cxlpool_pool_t* bound = t.pool("r1", "bind:r1");
      PoolGuard bound_guard{bound};
      CHECK(cxlpool_malloc(bound, kMiB) == nullptr);
      const std::string why = cxlpool_last_error_message();
      INFO(why);
      CHECK(why.find("failure domain rack1") != std::string::npos);
    }

    for (const Block& b : on_near) cxlpool_free(b.p);
    for (const Block& b : on_far) cxlpool_free(b.p);
    for (const Block& b : after) cxlpool_free(b.p);
  }
  // The devices closed: rack2 got every run back.
  CHECK(eventually([&] { return checked_clean(rack2.device); }));
}

// Threads keep writing into their blocks on a device while its pool's file is removed (a
// failure that leaves the memory readable): the blocks are replaced under them, each page
// readable and writable at every instant, so no write faults, and the writes after the loss
// land in the program's own memory.
TEST_CASE("borrow: threads writing while their pool's file is removed never fault", "[borrow]") {
#if defined(__SANITIZE_THREAD__)
  // The race is the point: TSan models the replacing mmap as a write of the whole range.
  CXLPOOL_SKIP("TSan reports the threads' writes racing the replacing mmap, which is what this test makes happen");
#endif
  SharedPoolFile rack1("borrow-unlinked", 128, 32, "rack1"), rack2("borrow-spare", 128, 32, "rack2");
  {
    Topo t("r1:backing=pool:a@" + rack1.device + ",size=16M;r2:backing=pool:a@" + rack2.device + ",size=4M");
    cxlpool_pool_t* pool = t.pool("r1,r2", "spill:near=r1,far=r2,watermark=95%");
    PoolGuard guard{pool};
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> rounds[2] = {0, 0};
    std::vector<std::thread> writers;
    for (int w = 0; w < 2; ++w)
      writers.emplace_back([&, w] {
        auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, 2 * kMiB));
        if (!p) return;
        for (unsigned char v = 1; !stop.load(std::memory_order_relaxed); ++v) {
          for (size_t i = 0; i < 2 * kMiB; i += 4096) p[i] = v;
          rounds[w].fetch_add(1, std::memory_order_relaxed);
        }
        // The last pass's bytes are all there: the memory is the program's, not read-only.
        const unsigned char last = p[0];
        bool same = true;
        for (size_t i = 0; i < 2 * kMiB; i += 4096) same &= p[i] == last;
        if (!same) rounds[w].store(0);
        cxlpool_free(p);
      });
    while (rounds[0].load() == 0 || rounds[1].load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(unlink(("/dev/shm/" + rack1.name).c_str()) == 0);
    const bool lost = eventually([&] { return capacity_of("r1").capacity_bytes == 0; });
    const uint64_t at_loss[2] = {rounds[0].load(), rounds[1].load()};
    // They go on writing after the loss.
    CHECK(eventually([&] { return rounds[0].load() > at_loss[0] + 10 && rounds[1].load() > at_loss[1] + 10; }));
    stop = true;
    for (auto& w : writers) w.join();
    CHECK(lost);
    CHECK(capacity_of("r1").lost_bytes >= 4 * kMiB);
    CHECK(rounds[0].load() > 0);
    CHECK(rounds[1].load() > 0);
  }
  CHECK(eventually([&] { return checked_clean(rack2.device); }));
}

// SPDX-License-Identifier: MIT
// Elastic capacity through the public C API (cxlpool/device.h): a device grows and shrinks
// while pools hold memory on it. Live blocks keep their bytes and addresses, ledgers stay
// exact, the withdrawn range's memory is really freed, spill follows the capacity both ways,
// and what cannot move makes a withdrawal BUSY, naming it, with nothing changed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "elastic_support.hpp"
#include "test_support.hpp"

namespace {

using namespace cxlpool_test::elastic;

// The two devices most tests move units between: a small fast one and a larger slow one.
constexpr const char* kFastSlow = "fast:backing=shm,size=64M,latency=90ns;slow:backing=shm,size=256M,latency=400ns";

std::string device_of(const void* p) {
  cxlpool_ptr_info_t info{};
  REQUIRE(cxlpool_ptr_info(p, &info) == CXLPOOL_OK);
  return info.device_name;
}

// The device the policy chose for the next block of 64 KiB of pool (the block stays
// allocated): the device whose allocation count rises. (Where its bytes are can differ: a
// unit that a withdrawal moved to another device keeps serving its free blocks there.)
std::string next_block_device(cxlpool_pool_t* pool, std::vector<void*>* keep) {
  const uint64_t before[2] = {stats_of(pool, 0).allocations, stats_of(pool, 1).allocations};
  void* p = cxlpool_malloc(pool, 64 * 1024);
  REQUIRE(p != nullptr);
  keep->push_back(p);
  for (int d : {0, 1})
    if (stats_of(pool, d).allocations > before[d]) {
      const char* name = nullptr;
      int tier = 0;
      REQUIRE(cxlpool_pool_get_device(pool, d, &name, &tier) == CXLPOOL_OK);
      return name;
    }
  return "";
}

// Shrinks `device` so that units leave it, frees every block, grows it again: nothing the
// program freed meanwhile comes back (no unit returned, the device's committed bytes unchanged).
void free_while_away_then_grow(const char* device, uint64_t small, uint64_t full, const std::vector<void*>& blocks) {
  cxlpool_capacity_report_t r{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_resize(device, small, &r) == CXLPOOL_OK);
  REQUIRE(r.evacuated_units > 0);
  for (void* p : blocks) cxlpool_free(p);
  const uint64_t before = capacity_of(device).committed_bytes;
  REQUIRE(cxlpool_device_resize(device, full, &r) == CXLPOOL_OK);
  CHECK(r.returned_units == 0);
  CHECK(r.returned_bytes == 0);
  CHECK(capacity_of(device).committed_bytes == before);
}

}  // namespace

TEST_CASE("a device grows while a pool spills: new capacity is used at once", "[unit]") {
  Topo t(kFastSlow);
  cxlpool_pool_t* pool = t.pool("fast,slow", "spill:near=fast,far=slow,watermark=50%");
  PoolGuard guard{pool};
  std::vector<void*> keep;
  // Fill near to its watermark: the next blocks spill.
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  CHECK(next_block_device(pool, &keep) == "slow");
  cxlpool_capacity_report_t r{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_resize("fast", 256 * kMiB, &r) == CXLPOOL_OK);
  CHECK(r.capacity_before == 64 * kMiB);
  CHECK(r.capacity_after == 256 * kMiB);
  CHECK(capacity_of("fast").capacity_bytes == 256 * kMiB);
  CHECK(capacity_of("fast").grows >= 1);
  CHECK(stats_of(pool, 0).capacity_bytes == 256 * kMiB);
  CHECK(next_block_device(pool, &keep) == "fast");  // below the watermark again
  // The new capacity is usable, not only counted: fill it past the old capacity.
  std::vector<Block> more = allocate_until(pool, 0, 120 * kMiB);
  CHECK(stats_of(pool, 0).resident_bytes >= 120 * kMiB);
  CHECK(all_intact(blocks));
  CHECK(all_intact(more));
  for (void* p : keep) cxlpool_free(p);
  for (const Block& b : blocks) cxlpool_free(b.p);
  for (const Block& b : more) cxlpool_free(b.p);
}

TEST_CASE(
    "a pool at 70% of a device that shrinks by half: bytes intact at the same addresses, ledgers exact, "
    "the range freed, spill follows both ways",
    "[unit]") {
  // Three fast devices: a file (its private memory is anonymous memory: the offsets are
  // bookkeeping), a memfd with fork=copy (the bytes live in the file, so what the withdrawn
  // range held shows as the file's allocated blocks; shmem, which a fence covers), and a NUMA
  // node (capacity only: no offsets behind it).
  for (const char* backing : {"file:$DIR/fast", "shm,fork=copy", "numa:0"}) {
    DYNAMIC_SECTION("fast device " << backing) {
      const bool in_file = std::strstr(backing, "fork=copy") != nullptr, numa = std::strstr(backing, "numa") != nullptr;
      Topo t(std::string("fast:backing=") + backing + ",size=256M,latency=90ns;slow:backing=shm,size=1G,latency=400ns");
      const std::string dir = in_file ? "/memfd:cxlpool:fast " : t.dir.path() + "/#";
      cxlpool_pool_t* pool = t.pool("fast,slow", "spill:near=fast,far=slow,watermark=95%");
      PoolGuard guard{pool};
      std::vector<Block> blocks = allocate_until(pool, 0, 180 * kMiB);
      for (const Block& b : blocks) REQUIRE(device_of(b.p) == "fast");
      cxlpool_capacity_report_t r{};
      const cxlpool_status_t st = cxlpool_device_resize("fast", 128 * kMiB, &r);
      const std::string message = st ? cxlpool_last_error_message() : "";
      INFO(message);
      CHECK(all_intact(blocks));
      if (!copies_fenced()) {
        // Nothing can be copied to another device here: BUSY, saying why, nothing lost.
        CHECK(st == CXLPOOL_E_BUSY);
        CHECK(message.find("write fence") != std::string::npos);
        CHECK(capacity_of("fast").capacity_bytes == 256 * kMiB);
        CHECK(capacity_of("fast").refusals >= 1);
        continue;
      }
      REQUIRE(st == CXLPOOL_OK);
      CHECK(r.capacity_before == 256 * kMiB);
      CHECK(r.capacity_after == 128 * kMiB);
      CHECK(r.evacuated_units > 0);
      CHECK(r.evacuated_bytes >= 180 * kMiB - 128 * kMiB);
      const cxlpool_device_capacity_t fast = capacity_of("fast");
      CHECK(fast.capacity_bytes == 128 * kMiB);
      CHECK(fast.space_bytes == 128 * kMiB);
      CHECK(fast.committed_bytes <= 128 * kMiB);
      CHECK(fast.shrinks >= 1);
      CHECK(fast.evacuated_bytes == r.evacuated_bytes);
      // Every block where it was, with its bytes; some of them now on far.
      size_t on_far = 0;
      for (const Block& b : blocks) on_far += device_of(b.p) == "slow";
      CHECK(on_far > 0);
      // Ledgers: the pool is the only user of both devices.
      for (int d : {0, 1}) {
        const cxlpool_stats_t s = stats_of(pool, d);
        CHECK(s.resident_bytes == s.device_committed_bytes);
      }
      CHECK(stats_of(pool, 0).capacity_bytes == 128 * kMiB);
      // The withdrawn range is gone from the file: shorter, and no more allocated than committed.
      if (!numa) {
        const FileUse files = files_in(dir);
        CHECK(files.files >= 1);
        CHECK(files.size == 128 * kMiB);
        CHECK(files.allocated <= fast.committed_bytes);
      }
      // Spill reads the new capacity: once fast is at 95% of 128 MiB (or has no room left in
      // its offsets), new blocks go to slow.
      std::vector<void*> keep;
      bool spilled = false;
      for (int i = 0; i < 4096 && !spilled; ++i) spilled = next_block_device(pool, &keep) == "slow";
      CHECK(spilled);
      CHECK(capacity_of("fast").committed_bytes <= 128 * kMiB);
      // Grown back: spill comes back to fast.
      REQUIRE(cxlpool_device_resize("fast", 256 * kMiB, &r) == CXLPOOL_OK);
      CHECK(capacity_of("fast").capacity_bytes == 256 * kMiB);
      if (!numa) CHECK(files_in(dir).size == 256 * kMiB);
      CHECK(next_block_device(pool, &keep) == "fast");
      CHECK(all_intact(blocks));
      for (void* p : keep) cxlpool_free(p);
      for (const Block& b : blocks) cxlpool_free(b.p);
    }
  }
}

TEST_CASE("withdrawing the offsets a pool's private memory holds moves bookkeeping, not bytes", "[unit]") {
  // A single-device pool: nothing can go to another device, and nothing needs to. Its
  // regions sit at the lowest offsets (first fit); withdrawing those gives them others.
  Topo t("dev:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 60 * kMiB);
  cxlpool_capacity_report_t r{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_withdraw_extent("dev", 0, 64 * kMiB, &r) == CXLPOOL_OK);
  CHECK(r.relocated > 0);
  CHECK(r.evacuated_units == 0);
  CHECK(r.capacity_after == 192 * kMiB);
  CHECK(all_intact(blocks));
  uint64_t pairs[8];
  size_t n = 0;
  REQUIRE(cxlpool_device_get_extents("dev", pairs, 4, &n) == CXLPOOL_OK);
  REQUIRE(n == 1);
  CHECK(pairs[0] == 64 * kMiB);
  CHECK(pairs[1] == 256 * kMiB);
  // Still a working pool: it allocates, frees and fills what is left.
  std::vector<Block> more = allocate_until(pool, 0, 150 * kMiB);
  CHECK(all_intact(more));
  CHECK(capacity_of("dev").committed_bytes <= 192 * kMiB);
  // The extent comes back as it was.
  REQUIRE(cxlpool_device_add_extent("dev", 0, 64 * kMiB, &r) == CXLPOOL_OK);
  CHECK(capacity_of("dev").capacity_bytes == 256 * kMiB);
  REQUIRE(cxlpool_device_get_extents("dev", pairs, 4, &n) == CXLPOOL_OK);
  CHECK(n == 1);
  for (const Block& b : blocks) cxlpool_free(b.p);
  for (const Block& b : more) cxlpool_free(b.p);
}

TEST_CASE("a withdrawal that cannot move what it holds is BUSY, names it, and changes nothing", "[unit]") {
  Topo t("dev:backing=shm,size=256M;other:backing=shm,size=256M");
  SECTION("a pool with one device, past the new capacity") {
    cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
    PoolGuard guard{pool};
    std::vector<Block> blocks = allocate_until(pool, 0, 200 * kMiB);
    cxlpool_capacity_report_t r{};
    CHECK(cxlpool_device_resize("dev", 128 * kMiB, &r) == CXLPOOL_E_BUSY);
    const std::string message = cxlpool_last_error_message();
    INFO(message);
    CHECK(message.find("device 'dev'") != std::string::npos);
    CHECK(message.find("the pool has no other device") != std::string::npos);
    CHECK(message.find("a unit of pool '") != std::string::npos);
    CHECK(message.find("stays online") != std::string::npos);
    CHECK(r.capacity_after == 256 * kMiB);
    CHECK(capacity_of("dev").capacity_bytes == 256 * kMiB);
    CHECK(capacity_of("dev").refusals == 1);
    CHECK(all_intact(blocks));
    // The capacity is whole again: the pool, past what the withdrawal would have left, takes
    // more (a few MiB: an fd device near full may have no run of offsets for a huge block,
    // docs/allocator.md "Known limit").
    cxlpool_stats_t now{};
    REQUIRE(cxlpool_pool_get_stats(pool, 0, &now) == CXLPOOL_OK);
    std::vector<Block> more = allocate_until(pool, 0, now.resident_bytes + 4 * kMiB);
    CHECK(all_intact(more));
    for (const Block& b : blocks) cxlpool_free(b.p);
    for (const Block& b : more) cxlpool_free(b.p);
  }
  SECTION("a raw backing's shared range") {
    cxlpool_backing_t* b = open_backing(t, "dev");
    void* p = nullptr;
    REQUIRE(cxlpool_backing_reserve(b, 8 * kMiB, 0, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_backing_commit(b, p, 8 * kMiB, 0) == CXLPOOL_OK);
    std::memset(p, 0x5a, 8 * kMiB);
    uint64_t off = 0;
    REQUIRE(cxlpool_backing_offset_of(b, p, &off) == CXLPOOL_OK);
    CHECK(cxlpool_device_withdraw_extent("dev", off, 8 * kMiB, nullptr) == CXLPOOL_E_BUSY);
    const std::string message = cxlpool_last_error_message();
    INFO(message);
    CHECK(message.find("shared with other processes") != std::string::npos);
    CHECK(static_cast<unsigned char*>(p)[8 * kMiB - 1] == 0x5a);
    cxlpool_backing_caps_t caps{};
    REQUIRE(cxlpool_backing_get_caps(b, &caps) == CXLPOOL_OK);
    CHECK(caps.capacity_bytes == 256 * kMiB);
    // A raw backing's mapping of a withdrawn range is refused.
    REQUIRE(cxlpool_device_withdraw_extent("dev", 128 * kMiB, 64 * kMiB, nullptr) == CXLPOOL_OK);
    void* m = nullptr;
    CHECK(cxlpool_backing_map(b, 150 * kMiB, 4 * kMiB, &m) == CXLPOOL_E_CAPACITY);
    REQUIRE(cxlpool_backing_get_caps(b, &caps) == CXLPOOL_OK);
    CHECK(caps.capacity_bytes == 192 * kMiB);
    REQUIRE(cxlpool_backing_release(b, p) == CXLPOOL_OK);
    REQUIRE(cxlpool_backing_close(b) == CXLPOOL_OK);
  }
}

TEST_CASE("capacity changes refuse bad arguments with a clear error", "[unit]") {
  Topo t("dev:backing=shm,size=64M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  void* p = cxlpool_malloc(pool, 100);
  REQUIRE(p != nullptr);
  CHECK(cxlpool_device_resize("nosuch", 64 * kMiB, nullptr) == CXLPOOL_E_NOT_FOUND);
  CHECK(std::string(cxlpool_last_error_message()).find("not open in this process") != std::string::npos);
  CHECK(cxlpool_device_resize(nullptr, 64 * kMiB, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_resize("dev", 64 * kMiB + 1, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_resize("dev", kMiB, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_withdraw_extent("dev", 4096, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_withdraw_extent("dev", 100, 4096, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_withdraw_extent("dev", 64 * kMiB, 4096, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("not all online") != std::string::npos);
  CHECK(cxlpool_device_withdraw_extent("dev", UINT64_MAX - 4095, 4096, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_add_extent("dev", 0, 4096, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("online already") != std::string::npos);
  CHECK(cxlpool_device_add_extent("dev", UINT64_MAX - 4095, 4096, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);  // wraps
  CHECK(cxlpool_device_add_extent("dev", uint64_t(1) << 51, 4096, nullptr) == CXLPOOL_E_CAPACITY);
  CHECK(cxlpool_device_resize("dev", 64 * kMiB, nullptr) == CXLPOOL_OK);  // no change
  CHECK(capacity_of("dev").capacity_bytes == 64 * kMiB);
  cxlpool_free(p);
}

TEST_CASE("fork during capacity changes: the child gets a whole device and can change it itself", "[unit]") {
  // One thread withdraws and adds back an extent the pool's memory holds (offsets relocated,
  // no bytes moved: no fence needed) while the main thread forks. Each child checks its
  // blocks, that its capacity is the sum of its extents (a withdrawal the parent had running
  // is not half-done in the child), and changes the capacity itself.
  Topo t("dev:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 60 * kMiB);
  std::atomic<bool> stop{false};
  std::atomic<int> changes{0};
  std::thread flapper([&] {
    while (!stop.load()) {
      if (cxlpool_device_withdraw_extent("dev", 0, 64 * kMiB, nullptr) == CXLPOOL_OK &&
          cxlpool_device_add_extent("dev", 0, 64 * kMiB, nullptr) == CXLPOOL_OK)
        changes.fetch_add(1);
    }
  });
  int children = 0, good = 0;
  for (; children < 150 || changes.load() < 20; ++children) {
    if (children > 2000) break;
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(60);
      int code = 0;
      if (!all_intact(blocks)) code |= 1;
      cxlpool_device_capacity_t c{};
      uint64_t pairs[16], sum = 0;
      size_t n = 0;
      if (cxlpool_device_get_capacity("dev", &c) != CXLPOOL_OK ||
          cxlpool_device_get_extents("dev", pairs, 8, &n) != CXLPOOL_OK || n > 8)
        code |= 2;
      for (size_t i = 0; i < n && i < 8; ++i) sum += pairs[2 * i + 1] - pairs[2 * i];
      // Before or after one of the parent's whole changes, never inside one.
      const bool whole = c.capacity_bytes == 256 * kMiB;
      if (sum != c.capacity_bytes || (!whole && c.capacity_bytes != 192 * kMiB)) code |= 4;
      if ((whole ? cxlpool_device_withdraw_extent("dev", 0, 64 * kMiB, nullptr)
                 : cxlpool_device_add_extent("dev", 0, 64 * kMiB, nullptr)) != CXLPOOL_OK)
        code |= 8;
      if (!all_intact(blocks)) code |= 16;
      void* p = cxlpool_malloc(pool, 100000);
      if (!p) code |= 32;
      cxlpool_free(p);
      _exit(code);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    INFO("child " << children << " status " << status);
    CHECK(WIFEXITED(status));
    if (WIFEXITED(status)) {
      CHECK(WEXITSTATUS(status) == 0);
      good += WEXITSTATUS(status) == 0;
    }
  }
  stop = true;
  flapper.join();
  CHECK(good == children);
  CHECK(changes.load() >= 20);
  CHECK(all_intact(blocks));
  for (const Block& b : blocks) cxlpool_free(b.p);
}

namespace {
// The tiering engine's counter `key` from its statistics JSON.
uint64_t tiering_counter(const char* key) {
  char* json = nullptr;
  REQUIRE(cxlpool_tiering_stats_json(&json) == CXLPOOL_OK);
  const std::string text = json;
  cxlpool_string_free(json);
  const size_t at = text.find(std::string("\"") + key + "\": ");
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + std::strlen(key) + 4, nullptr, 10);
}
}  // namespace

TEST_CASE("a withdrawal while the tiering engine watches the units: its monitors stand aside", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no write fence here: moves that copy are refused (another test checks how)");
  Topo t(kFastSlow);
  REQUIRE(cxlpool_tiering_start("interval=20ms") == CXLPOOL_OK);
  struct Stop {
    ~Stop() { cxlpool_tiering_stop(); }
  } stop;
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  // The engine has collected from its monitors at least twice: they are armed on the units.
  const uint64_t scans = tiering_counter("scans");
  for (int i = 0; i < 100000 && tiering_counter("scans") < scans + 2; ++i) usleep(1000);
  REQUIRE(tiering_counter("scans") >= scans + 2);
  cxlpool_capacity_report_t r{};
  const cxlpool_status_t st = cxlpool_device_resize("fast", 16 * kMiB, &r);
  INFO(cxlpool_last_error_message());
  CHECK(st == CXLPOOL_OK);
  CHECK(r.evacuated_units > 0);
  CHECK(all_intact(blocks));
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("a withdrawal the other devices have no room for is refused before anything moves", "[unit]") {
  Topo t("fast:backing=shm,size=64M,latency=90ns;slow:backing=shm,size=16M,latency=400ns");
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 48 * kMiB);
  const uint64_t slow_before = capacity_of("slow").committed_bytes;
  cxlpool_capacity_report_t r{};
  CHECK(cxlpool_device_resize("fast", 16 * kMiB, &r) == CXLPOOL_E_BUSY);
  const std::string message = cxlpool_last_error_message();
  INFO(message);
  CHECK(message.find("have room for") != std::string::npos);
  CHECK(message.find("Success") == std::string::npos);
  CHECK(r.evacuated_units == 0);
  CHECK(capacity_of("slow").committed_bytes == slow_before);
  CHECK(capacity_of("fast").capacity_bytes == 64 * kMiB);
  for (const Block& b : blocks) CHECK(device_of(b.p) == "fast");
  CHECK(all_intact(blocks));
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("units a withdrawal moved go home when the device grows again", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no write fence here: moves that copy are refused (another test checks how)");
  Topo t(kFastSlow);
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  cxlpool_capacity_report_t r{};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_resize("fast", 8 * kMiB, &r) == CXLPOOL_OK);
  REQUIRE(r.evacuated_units > 0);
  size_t away = 0;
  for (const Block& b : blocks) away += device_of(b.p) == "slow";
  CHECK(away > 0);
  REQUIRE(cxlpool_device_resize("fast", 64 * kMiB, &r) == CXLPOOL_OK);
  CHECK(r.returned_units > 0);
  CHECK(r.returned_bytes > 0);
  for (const Block& b : blocks) CHECK(device_of(b.p) == "fast");
  CHECK(all_intact(blocks));
  // bind:fast places on fast again, small and large.
  std::vector<void*> keep;
  for (size_t n : {1000ul, 8ul << 20}) {
    void* p = cxlpool_malloc(pool, n);
    REQUIRE(p != nullptr);
    keep.push_back(p);
    CHECK(device_of(p) == "fast");
  }
  for (void* p : keep) cxlpool_free(p);
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("units pinned away from home go back to their pinned device when it grows again", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no write fence here: moves that copy are refused (another test checks how)");
  Topo t(kFastSlow);
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  INFO(cxlpool_last_error_message());
  for (const Block& b : blocks) REQUIRE(cxlpool_pin(b.p, b.n, 1) == CXLPOOL_OK);
  for (const Block& b : blocks) REQUIRE(device_of(b.p) == "slow");
  // The pinned device goes almost away: the pinned units have to leave it (for fast, their home).
  cxlpool_capacity_report_t r{};
  REQUIRE(cxlpool_device_resize("slow", 4 * kMiB, &r) == CXLPOOL_OK);
  REQUIRE(r.evacuated_units > 0);
  size_t away = 0;
  for (const Block& b : blocks) away += device_of(b.p) == "fast";
  REQUIRE(away > 0);
  std::vector<const Block*> repinned;
  SECTION("without a new pin, all of them") {}
  SECTION("except those pinned to where they are now") {
    for (const Block& b : blocks)
      if (b.n == 8 * kMiB && device_of(b.p) == "fast") {
        REQUIRE(cxlpool_pin(b.p, b.n, 0) == CXLPOOL_OK);
        repinned.push_back(&b);
      }
    REQUIRE(!repinned.empty());
  }
  REQUIRE(cxlpool_device_resize("slow", 256 * kMiB, &r) == CXLPOOL_OK);
  CHECK(r.returned_units > 0);
  for (const Block& b : blocks) {
    const bool stays = std::find(repinned.begin(), repinned.end(), &b) != repinned.end();
    CHECK(device_of(b.p) == (stays ? "fast" : "slow"));
  }
  CHECK(all_intact(blocks));
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("units a withdrawal moved and the program then freed do not come back", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no write fence here: moves that copy are refused (another test checks how)");
  Topo t(kFastSlow);
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(cxlpool_malloc(pool, 2 * kMiB));
    REQUIRE(blocks.back() != nullptr);
    std::memset(blocks.back(), i, 2 * kMiB);
  }
  free_while_away_then_grow("fast", 4 * kMiB, 64 * kMiB, blocks);
}

TEST_CASE("a return moves what the program still holds, not memory it freed", "[unit]") {
  if (!copies_fenced()) CXLPOOL_SKIP("no write fence here: moves that copy are refused (another test checks how)");
  Topo t(kFastSlow);
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:fast");
  PoolGuard guard{pool};
  cxlpool_capacity_report_t r{};
  INFO(cxlpool_last_error_message());
  SECTION("huge blocks pinned away, sent home, freed there: nothing goes back to the pinned device") {
    // Freed at home, a huge block's span stays committed in the pool's cache for reuse.
    std::vector<void*> blocks;
    for (int i = 0; i < 6; ++i) {
      blocks.push_back(cxlpool_malloc(pool, 2 * kMiB));
      REQUIRE(blocks.back() != nullptr);
      std::memset(blocks.back(), i + 1, 2 * kMiB);
      REQUIRE(cxlpool_pin(blocks.back(), 2 * kMiB, 1) == CXLPOOL_OK);
    }
    free_while_away_then_grow("slow", 4 * kMiB, 256 * kMiB, blocks);
  }
  SECTION("small blocks sent away, three quarters freed: the return copies the rest") {
    std::vector<void*> blocks;
    for (int i = 0; i < 512; ++i) {  // 32 MiB
      blocks.push_back(cxlpool_malloc(pool, 64 * 1024));
      REQUIRE(blocks.back() != nullptr);
      std::memset(blocks.back(), i, 64 * 1024);
    }
    REQUIRE(cxlpool_device_resize("fast", 4 * kMiB, &r) == CXLPOOL_OK);
    REQUIRE(r.evacuated_bytes >= 24 * kMiB);
    for (size_t i = 0; i < 384; ++i) cxlpool_free(blocks[i]);  // the first 24 MiB: whole pages
    REQUIRE(cxlpool_device_resize("fast", 64 * kMiB, &r) == CXLPOOL_OK);
    CHECK(r.returned_units > 0);
    CHECK(r.returned_bytes <= 8 * kMiB + 2 * kMiB);  // the 8 MiB still held, a page or two besides
    for (size_t i = 384; i < blocks.size(); ++i) {
      CHECK(device_of(blocks[i]) == "fast");
      CHECK(static_cast<unsigned char*>(blocks[i])[64 * 1024 - 1] == static_cast<unsigned char>(i));
      cxlpool_free(blocks[i]);
    }
  }
}

TEST_CASE("storage opened after a capacity change has the device's offsets", "[unit]") {
  // The shared storage of a raw backing opens on its first reservation: after a growth and a
  // withdrawal it must hand out the grown offsets and none of the withdrawn ones.
  Topo t("dev:backing=shm,size=64M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_device_resize("dev", 256 * kMiB, nullptr) == CXLPOOL_OK);
  REQUIRE(cxlpool_device_withdraw_extent("dev", 0, 32 * kMiB, nullptr) == CXLPOOL_OK);
  cxlpool_backing_t* b = open_backing(t, "dev");
  void* p = nullptr;
  REQUIRE(cxlpool_backing_reserve(b, 200 * kMiB, 0, &p) == CXLPOOL_OK);
  uint64_t off = 0;
  REQUIRE(cxlpool_backing_offset_of(b, p, &off) == CXLPOOL_OK);
  CHECK(off >= 32 * kMiB);
  CHECK(off + 200 * kMiB <= 256 * kMiB);
  REQUIRE(cxlpool_backing_commit(b, p, 200 * kMiB, 0) == CXLPOOL_OK);
  std::memset(p, 1, 200 * kMiB);
  REQUIRE(cxlpool_backing_release(b, p) == CXLPOOL_OK);
  REQUIRE(cxlpool_backing_close(b) == CXLPOOL_OK);
}

TEST_CASE("a shared pool's device is in the registry: its size, this process's bytes, and no capacity change",
          "[unit]") {
  const std::string name = "cxlpool-test-elastic-shared-" + std::to_string(getpid());
  const std::string location = "shm:" + name;
  // Declared before the pool exists (discovery refuses a name that holds an object already).
  Topo t("x:backing=" + location + ",size=16M,latency=90ns");
  cxlpool_shared_params_t* params = nullptr;
  REQUIRE(cxlpool_shared_params_create(&params) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(params, 64 * kMiB) == CXLPOOL_OK);
  cxlpool_shared_pool_t* shared = nullptr;
  INFO(cxlpool_last_error_message());
  REQUIRE(cxlpool_shared_pool_create(location.c_str(), params, 0, &shared) == CXLPOOL_OK);
  cxlpool_shared_params_destroy(params);
  struct Unlink {
    std::string location;
    ~Unlink() { cxlpool_shared_pool_unlink(location.c_str()); }
  } unlink_at_end{location};

  cxlpool_device_capacity_t c{};
  REQUIRE(cxlpool_device_get_capacity(location.c_str(), &c) == CXLPOOL_OK);
  CHECK(c.capacity_bytes >= 64 * kMiB);
  CHECK(c.capacity_bytes < 80 * kMiB);
  CHECK(c.extents == 1);
  const uint64_t before = c.committed_bytes;
  void* big = nullptr;
  REQUIRE(cxlpool_shared_alloc(shared, 4 * kMiB, &big) == CXLPOOL_OK);
  REQUIRE(cxlpool_device_get_capacity(("/dev/shm/" + name).c_str(), &c) == CXLPOOL_OK);  // by its path
  CHECK(c.committed_bytes >= before + 4 * kMiB);
  REQUIRE(cxlpool_shared_free(shared, big) == CXLPOOL_OK);
  REQUIRE(cxlpool_device_get_capacity(location.c_str(), &c) == CXLPOOL_OK);
  CHECK(c.committed_bytes == before);

  // No capacity change: BUSY, naming the pool and why.
  cxlpool_capacity_report_t r{};
  CHECK(cxlpool_device_resize(location.c_str(), 32 * kMiB, &r) == CXLPOOL_E_BUSY);
  std::string message = cxlpool_last_error_message();
  CHECK(message.find("shared pool '" + location + "'") != std::string::npos);
  CHECK(message.find("fixed when it was created") != std::string::npos);
  CHECK(r.capacity_before == c.capacity_bytes);
  CHECK(cxlpool_device_withdraw_extent(location.c_str(), 0, 4 * kMiB, &r) == CXLPOOL_E_BUSY);
  // Waiting cannot change that: a release request is refused at once, not at its deadline (a
  // wait would outlast the test's time limit), forced or not.
  CHECK(cxlpool_device_release_extent(location.c_str(), 0, 4 * kMiB, 3600 * 1000, 0, &r) == CXLPOOL_E_BUSY);
  CHECK(cxlpool_device_release_extent(location.c_str(), 0, 4 * kMiB, 3600 * 1000, CXLPOOL_RELEASE_FORCE, &r) ==
        CXLPOOL_E_BUSY);
  // All of it is one extent, however the device is spelled.
  uint64_t pair[2] = {};
  size_t count = 0;
  REQUIRE(cxlpool_device_get_extents(location.c_str(), pair, 1, &count) == CXLPOOL_OK);
  CHECK(count == 1);
  CHECK(pair[0] == 0);
  CHECK(pair[1] == c.capacity_bytes);
  const std::string link = t.dir.path() + "/link";
  REQUIRE(symlink(("/dev/shm/" + name).c_str(), link.c_str()) == 0);
  for (const std::string& spelling : {"/dev/shm/./" + name, "file:/dev/shm/" + name, link, "file:" + link}) {
    INFO(spelling);
    CHECK(cxlpool_device_get_capacity(spelling.c_str(), &c) == CXLPOOL_OK);
    CHECK(cxlpool_device_resize(spelling.c_str(), 32 * kMiB, &r) == CXLPOOL_E_BUSY);
  }
  // A fork child is no participant: it has no shared pool's device open.
  const pid_t child = fork();
  if (child == 0) {
    cxlpool_device_capacity_t cc{};
    _exit(cxlpool_device_get_capacity(location.c_str(), &cc) == CXLPOOL_E_NOT_FOUND ? 0 : 1);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // The private device declared on the same object is refused while the pool is open here.
  cxlpool_pool_params_t* p = nullptr;
  REQUIRE(cxlpool_pool_params_create(&p) == CXLPOOL_OK);
  cxlpool_pool_params_set_devices(p, "x");
  cxlpool_pool_t* priv = nullptr;
  CHECK(cxlpool_pool_create(t.topo, p, &priv) == CXLPOOL_E_BUSY);
  message = cxlpool_last_error_message();
  CHECK(message.find("holds a shared pool this process has open") != std::string::npos);
  CHECK(priv == nullptr);

  // Closed, the record goes with it; a pool of the private device then refuses the object for
  // what it is (a shared pool's device), and the name is no device of this process any more.
  REQUIRE(cxlpool_shared_pool_close(shared) == CXLPOOL_OK);
  CHECK(cxlpool_device_get_capacity(location.c_str(), &c) == CXLPOOL_E_NOT_FOUND);
  CHECK(cxlpool_pool_create(t.topo, p, &priv) != CXLPOOL_OK);
  CHECK(priv == nullptr);
  cxlpool_pool_params_destroy(p);
}

TEST_CASE("a shared pool is refused on a device a private pool of this process holds", "[unit]") {
  const std::string name = "cxlpool-test-elastic-private-" + std::to_string(getpid());
  const std::string location = "shm:" + name;
  Topo t("x:backing=" + location + ",size=16M,latency=90ns");
  cxlpool_pool_t* pool = t.pool("x", "bind:x");
  PoolGuard guard{pool};
  cxlpool_shared_params_t* params = nullptr;
  REQUIRE(cxlpool_shared_params_create(&params) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(params, 16 * kMiB) == CXLPOOL_OK);
  cxlpool_shared_pool_t* shared = nullptr;
  CHECK(cxlpool_shared_pool_create(location.c_str(), params, 0, &shared) == CXLPOOL_E_BUSY);
  const std::string message = cxlpool_last_error_message();
  INFO(message);
  CHECK(message.find("private device 'x'") != std::string::npos);
  CHECK(shared == nullptr);
  CHECK(access(("/dev/shm/" + name).c_str(), F_OK) != 0);  // nothing was created
  cxlpool_shared_params_destroy(params);
}

TEST_CASE("a numa device never grows past its node's memory", "[unit]") {
  Topo t("n0:backing=numa:0,size=64M;slow:backing=shm,size=256M,latency=400ns");
  cxlpool_pool_t* pool = t.pool("n0,slow", "spill:near=n0,far=slow,watermark=50%");
  PoolGuard guard{pool};
  cxlpool_device_capacity_t c{};
  REQUIRE(cxlpool_device_get_capacity("n0", &c) == CXLPOOL_OK);
  const uint64_t node = c.max_space_bytes;  // the node's memory now
  CHECK(node >= 64 * kMiB);
  CHECK(node < (uint64_t{1} << 50));
  cxlpool_capacity_report_t r{};
  const uint64_t beyond = (node / kMiB + 1024) * kMiB;  // page- and MiB-aligned, past the node
  CHECK(cxlpool_device_resize("n0", beyond, &r) == CXLPOOL_E_CAPACITY);
  std::string message = cxlpool_last_error_message();
  INFO(message);
  CHECK(message.find("more than node 0 has") != std::string::npos);
  CHECK(cxlpool_device_add_extent("n0", beyond, beyond, &r) == CXLPOOL_E_CAPACITY);
  const uint64_t pair[2] = {beyond, 2 * beyond};
  cxlpool_status_t verdict = CXLPOOL_OK;
  CHECK(cxlpool_device_offer_extents("n0", pair, 1, &verdict, &r) == CXLPOOL_E_CAPACITY);
  CHECK(verdict == CXLPOOL_E_CAPACITY);
  REQUIRE(cxlpool_device_get_capacity("n0", &c) == CXLPOOL_OK);
  CHECK(c.capacity_bytes == 64 * kMiB);
  CHECK(c.grows == 0);
  // Within the node's memory it grows as before.
  CHECK(cxlpool_device_resize("n0", 128 * kMiB, &r) == CXLPOOL_OK);
}

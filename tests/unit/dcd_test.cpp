// SPDX-License-Identifier: MIT
// Dynamic capacity through the public C API (cxlpool/device.h): offers accepted or rejected
// extent by extent, a release retried until its deadline, and a forced release that takes a
// range whatever holds it: what could not move loses its memory there, and the loss is
// reported range by range (report, counters, the lost handler), never silent. The addresses
// stay valid, their offsets are never handed out again, and commits there are refused.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "cxlpool/cxlpool.hpp"
#include "elastic_support.hpp"
#include "test_support.hpp"

namespace {

using namespace cxlpool_test::elastic;

struct LostSeen {
  std::string device;
  uintptr_t addr;
  size_t len;
  uint64_t committed;
};
std::vector<LostSeen>* g_seen = nullptr;

void on_lost(const char* device, void* addr, size_t len, uint64_t committed, void* ctx) {
  CHECK(ctx == &g_seen);
  g_seen->push_back({device, reinterpret_cast<uintptr_t>(addr), len, committed});
}

// A forced release of [offset, offset+length) of device, with the lost handler recording what it
// is called with in *seen.
cxlpool_status_t force_release(const char* device, uint64_t offset, uint64_t length, cxlpool_capacity_report_t* r,
                               std::vector<LostSeen>* seen) {
  g_seen = seen;
  REQUIRE(cxlpool_device_set_lost_handler(on_lost, &g_seen) == CXLPOOL_OK);
  const cxlpool_status_t s = cxlpool_device_release_extent(device, offset, length, 0, CXLPOOL_RELEASE_FORCE, r);
  REQUIRE(cxlpool_device_set_lost_handler(nullptr, nullptr) == CXLPOOL_OK);
  g_seen = nullptr;
  return s;
}

// Whether [p, p+n) overlaps a lost range.
bool touches(const std::vector<LostSeen>& lost, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const LostSeen& l : lost)
    if (a < l.addr + l.len && l.addr < a + n) return true;
  return false;
}

// Every byte of b inside a lost range reads zero, every other one as written.
bool zeros_where_lost(const Block& b, const std::vector<LostSeen>& lost) {
  for (size_t i = 0; i < b.n; i += 256) {
    const bool gone = touches(lost, b.p + i, 1);
    const unsigned char want = gone ? 0 : static_cast<unsigned char>(b.seed + i / 256);
    if (b.p[i] != want) return false;
  }
  const bool gone = touches(lost, b.p + b.n - 1, 1);
  return b.p[b.n - 1] == (gone ? 0 : static_cast<unsigned char>(b.seed));
}

}  // namespace

TEST_CASE("an offer is judged extent by extent: accepted ones are capacity at once", "[unit]") {
  Topo t("dev:backing=shm,size=64M,max_size=256M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  const uint64_t pairs[] = {64 * kMiB,  64 * kMiB,  // accepted
                            100 * kMiB, 8 * kMiB,   // overlaps the first: rejected
                            512 * kMiB, 64 * kMiB,  // past max_size: rejected
                            192 * kMiB, 64 * kMiB,  // accepted (a hole before it stays offline)
                            300 * kMiB, 12345};     // not page-aligned: rejected
  cxlpool_status_t verdicts[5] = {};
  cxlpool_capacity_report_t r{};
  CHECK(cxlpool_device_offer_extents("dev", pairs, 5, verdicts, &r) == CXLPOOL_E_INVALID_ARGUMENT);
  const std::string message = cxlpool_last_error_message();
  INFO(message);
  CHECK(verdicts[0] == CXLPOOL_OK);
  CHECK(verdicts[1] == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(verdicts[2] == CXLPOOL_E_CAPACITY);
  CHECK(verdicts[3] == CXLPOOL_OK);
  CHECK(verdicts[4] == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(message.find("2 accepted") != std::string::npos);
  CHECK(message.find("extent #1 rejected") != std::string::npos);
  CHECK(message.find("extent #2 rejected") != std::string::npos);
  CHECK(message.find("max_size") != std::string::npos);
  CHECK(r.capacity_before == 64 * kMiB);
  CHECK(r.capacity_after == 192 * kMiB);
  const cxlpool_device_capacity_t c = capacity_of("dev");
  CHECK(c.capacity_bytes == 192 * kMiB);
  CHECK(c.max_space_bytes == 256 * kMiB);
  CHECK(c.extents == 2);
  // The pool uses what was accepted.
  std::vector<Block> blocks = allocate_until(pool, 0, 150 * kMiB);
  CHECK(all_intact(blocks));
  for (const Block& b : blocks) cxlpool_free(b.p);
  // Bad arguments.
  CHECK(cxlpool_device_offer_extents("dev", nullptr, 1, nullptr, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_offer_extents("dev", pairs, 0, nullptr, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_offer_extents("nosuch", pairs, 1, nullptr, nullptr) == CXLPOOL_E_NOT_FOUND);
  const uint64_t wraps[] = {4096, ~uint64_t(0) - 100};
  CHECK(cxlpool_device_offer_extents("dev", wraps, 1, verdicts, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
}

TEST_CASE("max_size bounds growth of every kind of request", "[unit]") {
  Topo t("dev:backing=shm,size=64M,max_size=128M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  CHECK(cxlpool_device_resize("dev", 192 * kMiB, nullptr) == CXLPOOL_E_CAPACITY);
  CHECK(cxlpool_device_add_extent("dev", 128 * kMiB, 4 * kMiB, nullptr) == CXLPOOL_E_CAPACITY);
  CHECK(cxlpool_device_resize("dev", 128 * kMiB, nullptr) == CXLPOOL_OK);
  CHECK(capacity_of("dev").capacity_bytes == 128 * kMiB);
}

TEST_CASE("a release waits for its deadline: the holder frees, the range goes", "[unit]") {
  Topo t("dev:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");  // one device: nothing can move
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 200 * kMiB);
  SECTION("without force the range stays at the deadline, BUSY, naming the holder") {
    cxlpool_capacity_report_t r{};
    CHECK(cxlpool_device_release_extent("dev", 128 * kMiB, 128 * kMiB, 300, 0, &r) == CXLPOOL_E_BUSY);
    const std::string message = cxlpool_last_error_message();
    INFO(message);
    CHECK(message.find("still held at the deadline") != std::string::npos);
    CHECK(message.find("the pool has no other device") != std::string::npos);
    CHECK(r.lost_units == 0);
    CHECK(capacity_of("dev").capacity_bytes == 256 * kMiB);
    CHECK(capacity_of("dev").refusals >= 1);
    CHECK(all_intact(blocks));
  }
  SECTION("the program frees what held it before the deadline") {
    const uint64_t refusals = capacity_of("dev").refusals;
    std::atomic<cxlpool_status_t> status{CXLPOOL_E_INTERNAL};
    cxlpool_capacity_report_t r{};
    std::thread releaser([&] { status = cxlpool_device_release_extent("dev", 128 * kMiB, 128 * kMiB, 600000, 0, &r); });
    // Once a first attempt was refused, the program gives its memory back.
    while (capacity_of("dev").refusals == refusals) std::this_thread::yield();
    for (const Block& b : blocks) cxlpool_free(b.p);
    blocks.clear();
    releaser.join();
    INFO(cxlpool_last_error_message());
    CHECK(status == CXLPOOL_OK);
    CHECK(r.lost_units == 0);
    CHECK(r.capacity_after == 128 * kMiB);
    CHECK(capacity_of("dev").capacity_bytes == 128 * kMiB);
  }
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("a forced release takes the range: what could not move is lost, reported, and reads as zeros", "[unit]") {
  Topo t("dev:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 200 * kMiB);
  std::vector<LostSeen> seen;
  cxlpool_capacity_report_t r{};
  REQUIRE(force_release("dev", 128 * kMiB, 128 * kMiB, &r, &seen) == CXLPOOL_OK);
  CHECK(r.capacity_after == 128 * kMiB);
  CHECK(r.lost_units >= 1);
  CHECK(r.lost_units == seen.size());
  uint64_t committed = 0;
  for (const LostSeen& l : seen) {
    CHECK(l.device == "dev");
    committed += l.committed;
  }
  CHECK(r.lost_bytes == committed);
  CHECK(r.lost_bytes > 0);
  const cxlpool_device_capacity_t c = capacity_of("dev");
  CHECK(c.capacity_bytes == 128 * kMiB);
  CHECK(c.forced == 1);
  CHECK(c.shrinks == 1);
  CHECK(c.lost_units == r.lost_units);
  CHECK(c.lost_bytes == r.lost_bytes);
  // Bytes in the lost ranges read as zeros; every other byte is as written. No signal.
  size_t hit = 0;
  for (const Block& b : blocks) {
    CHECK(zeros_where_lost(b, seen));
    hit += touches(seen, b.p, b.n);
  }
  CHECK(hit > 0);
  // The addresses stay valid and writable where they are committed.
  for (const Block& b : blocks) {
    fill(b);
    CHECK(intact(b));
  }
  // The committed bytes still count (above the capacity now): new commits wait for frees.
  CHECK(c.committed_bytes > c.capacity_bytes);
  // Freed, the pool's memory goes back; offsets of the lost range are never handed out, and
  // the device serves its remaining capacity.
  for (const Block& b : blocks) cxlpool_free(b.p);
  REQUIRE(cxlpool_pool_trim(pool, nullptr) == CXLPOOL_OK);
  CHECK(capacity_of("dev").committed_bytes <= 128 * kMiB);
  std::vector<Block> again = allocate_until(pool, 0, 96 * kMiB);
  CHECK(all_intact(again));
  for (const Block& b : again) cxlpool_free(b.p);
  // The range comes back online as new capacity.
  REQUIRE(cxlpool_device_add_extent("dev", 128 * kMiB, 128 * kMiB, nullptr) == CXLPOOL_OK);
  std::vector<Block> more = allocate_until(pool, 0, 200 * kMiB);
  CHECK(all_intact(more));
  for (const Block& b : more) cxlpool_free(b.p);
}

TEST_CASE("a forced release of a raw backing's shared range: zeros, valid addresses, offsets kept", "[unit]") {
  Topo t("dev:backing=shm,size=64M");
  cxlpool_backing_t* b = open_backing(t, "dev");
  // The range at the end of the device's file: a file shortened under a mapping is SIGBUS.
  void* filler = nullptr;
  REQUIRE(cxlpool_backing_reserve(b, 56 * kMiB, 0, &filler) == CXLPOOL_OK);
  void* p = nullptr;
  REQUIRE(cxlpool_backing_reserve(b, 8 * kMiB, 0, &p) == CXLPOOL_OK);
  REQUIRE(cxlpool_backing_commit(b, p, 4 * kMiB, 0) == CXLPOOL_OK);
  std::memset(p, 0x5a, 4 * kMiB);
  uint64_t off = 0;
  REQUIRE(cxlpool_backing_offset_of(b, p, &off) == CXLPOOL_OK);
  REQUIRE(off == 56 * kMiB);
  cxlpool_capacity_report_t r{};
  // Without force: BUSY, nothing lost.
  CHECK(cxlpool_device_release_extent("dev", off, 8 * kMiB, 0, 0, &r) == CXLPOOL_E_BUSY);
  CHECK(static_cast<unsigned char*>(p)[0] == 0x5a);
  REQUIRE(cxlpool_device_release_extent("dev", off, 8 * kMiB, 0, CXLPOOL_RELEASE_FORCE, &r) == CXLPOOL_OK);
  CHECK(r.lost_units == 1);
  CHECK(r.lost_bytes == 4 * kMiB);
  auto* bytes = static_cast<unsigned char*>(p);
  CHECK(bytes[0] == 0);
  CHECK(bytes[4 * kMiB - 1] == 0);
  bytes[100] = 7;  // still mapped and writable: no SIGBUS
  CHECK(bytes[100] == 7);
  // Committing more of the lost range is refused, saying why.
  CHECK(cxlpool_backing_commit(b, bytes + 4 * kMiB, 4 * kMiB, 0) == CXLPOOL_E_CAPACITY);
  CHECK(std::string(cxlpool_last_error_message()).find("forced release") != std::string::npos);
  // The range back online: a new reservation never gets the lost reservation's offsets.
  REQUIRE(cxlpool_device_add_extent("dev", off, 8 * kMiB, nullptr) == CXLPOOL_OK);
  REQUIRE(cxlpool_backing_release(b, filler) == CXLPOOL_OK);
  std::vector<void*> fresh;
  for (;;) {
    void* q = nullptr;
    if (cxlpool_backing_reserve(b, 4 * kMiB, 0, &q) != CXLPOOL_OK) break;
    uint64_t qo = 0;
    REQUIRE(cxlpool_backing_offset_of(b, q, &qo) == CXLPOOL_OK);
    CHECK((qo + 4 * kMiB <= off || qo >= off + 8 * kMiB));
    fresh.push_back(q);
  }
  CHECK(fresh.size() == (64 - 8) / 4);
  for (void* q : fresh) REQUIRE(cxlpool_backing_release(b, q) == CXLPOOL_OK);
  REQUIRE(cxlpool_backing_release(b, p) == CXLPOOL_OK);
  REQUIRE(cxlpool_backing_close(b) == CXLPOOL_OK);
}

// Lost pages a reservation maps shared from the device's file are zeroed in place, not punched
// out: a touch never needs a page of the filesystem again (SIGBUS when it is full) and the file
// does not grow back at offline offsets.
TEST_CASE("lost pages kept in a file read as zeros without taking the file's room again", "[unit]") {
  cxlpool_test::ScratchDir dir;
  // fork=copy: the pool's private memory is a shared mapping of the device's file.
  Topo t("dev:backing=file:" + dir.path() + "/heap,size=64M,fork=copy");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  std::vector<LostSeen> seen;
  cxlpool_capacity_report_t r{};
  REQUIRE(force_release("dev", 0, 32 * kMiB, &r, &seen) == CXLPOOL_OK);
  REQUIRE(r.lost_units > 0);
  const FileUse before = files_in(dir.path());
  for (const Block& b : blocks) CHECK(zeros_where_lost(b, seen));
  for (const Block& b : blocks) {  // written again: the pages are still the file's
    fill(b);
    CHECK(intact(b));
  }
  const FileUse after = files_in(dir.path());
  CHECK(after.allocated == before.allocated);
  for (const Block& b : blocks) cxlpool_free(b.p);
}

// A fork child's view of its parent's shared memory is the parent's: a forced release in the
// child takes the range from the child's device, never the parent's bytes.
TEST_CASE("a forced release in a fork child leaves its parent's shared memory alone", "[unit]") {
  Topo t("dev:backing=shm,size=64M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev", CXLPOOL_SHARING_SHARED);
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 16 * kMiB);
  const pid_t child = fork();
  if (child == 0) {
    cxlpool_capacity_report_t r{};
    const cxlpool_status_t s = cxlpool_device_release_extent("dev", 0, 32 * kMiB, 0, CXLPOOL_RELEASE_FORCE, &r);
    _exit(s == CXLPOOL_OK ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(all_intact(blocks));
  CHECK(capacity_of("dev").forced == 0);
  CHECK(capacity_of("dev").capacity_bytes == 64 * kMiB);
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("a forced release moves what can move first, and without a write fence the rest is lost", "[unit]") {
  Topo t("dev:backing=shm,size=256M;other:backing=shm,size=512M");
  cxlpool_pool_t* pool = t.pool("dev,other", "bind:dev");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 200 * kMiB);
  std::vector<LostSeen> seen;
  cxlpool_capacity_report_t r{};
  const cxlpool_status_t s = force_release("dev", 64 * kMiB, 192 * kMiB, &r, &seen);
  INFO(cxlpool_last_error_message());
  REQUIRE(s == CXLPOOL_OK);
  CHECK(capacity_of("dev").capacity_bytes == 64 * kMiB);
  if (copies_fenced()) {
    // Every unit moved to `other` (or took other offsets): a plain withdrawal was enough,
    // nothing was forced, nothing lost.
    CHECK(capacity_of("dev").forced == 0);
    CHECK(r.lost_units == 0);
    CHECK(seen.empty());
    CHECK(r.evacuated_units + r.relocated > 0);
    CHECK(all_intact(blocks));
  } else {
    // Nothing could be copied: the units in the range lost it, each one reported.
    CHECK(capacity_of("dev").forced == 1);
    CHECK(r.lost_units > 0);
    CHECK(r.lost_units == seen.size());
  }
  for (const Block& b : blocks) CHECK(zeros_where_lost(b, seen));
  CHECK(capacity_of("dev").lost_bytes == r.lost_bytes);
  for (const Block& b : blocks) cxlpool_free(b.p);
}

TEST_CASE("release and offer refuse bad arguments and the C++ layer throws", "[unit]") {
  Topo t("dev:backing=shm,size=64M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  // A forced release of what nothing holds takes nothing by force: the counter says so.
  REQUIRE(cxlpool_device_release_extent("dev", 60 * kMiB, 4 * kMiB, 0, CXLPOOL_RELEASE_FORCE, nullptr) == CXLPOOL_OK);
  CHECK(capacity_of("dev").forced == 0);
  CHECK(capacity_of("dev").capacity_bytes == 60 * kMiB);
  REQUIRE(cxlpool_device_add_extent("dev", 60 * kMiB, 4 * kMiB, nullptr) == CXLPOOL_OK);
  CHECK(cxlpool_device_release_extent("dev", 0, 4 * kMiB, 0, 0x80, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_release_extent("dev", 1, 4 * kMiB, 0, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_release_extent("dev", 0, 4 * kMiB, 86400001u, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_release_extent("dev", 64 * kMiB, 4 * kMiB, 0, CXLPOOL_RELEASE_FORCE, nullptr) ==
        CXLPOOL_E_INVALID_ARGUMENT);  // not online: nothing to force
  CHECK(cxlpool_device_release_extent(nullptr, 0, 4 * kMiB, 0, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_device_release_extent("nosuch", 0, 4 * kMiB, 0, 0, nullptr) == CXLPOOL_E_NOT_FOUND);
  CHECK_THROWS_AS(cxlpool::device::release_extent("dev", 1, 4096), cxlpool::Error);
  const cxlpool_capacity_report_t r = cxlpool::device::offer_extents("dev", {{64 * kMiB, 16 * kMiB}});
  CHECK(r.capacity_after == 80 * kMiB);
  const cxlpool_capacity_report_t back = cxlpool::device::release_extent("dev", 64 * kMiB, 16 * kMiB, 1000, true);
  CHECK(back.capacity_after == 64 * kMiB);
  CHECK(back.lost_units == 0);
}

TEST_CASE("after a forced release the pool allocates on in the capacity left, never in the lost range", "[unit]") {
  Topo t("dev:backing=shm,size=128M");
  cxlpool_pool_t* pool = t.pool("dev", "bind:dev");
  PoolGuard guard{pool};
  // Small blocks filling the device: more than the 96 MiB of capacity left after the release,
  // so not everything in the range can take other offsets, whatever the layout (an RLIMIT_AS
  // makes smaller regions). Not to the brim: which offsets the regions and huge spans hold
  // depends on when the purger ran, and near 120 MiB committed every offset can be reserved.
  std::vector<Block> blocks;
  for (unsigned i = 0; capacity_of("dev").committed_bytes < 112 * kMiB; ++i) {
    const size_t n = i % 3 == 0 ? 70000 : i % 3 == 1 ? 3000 : 300000;
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, i};
    INFO("block " << i << " of " << n << " bytes; committed " << capacity_of("dev").committed_bytes << ": "
                  << cxlpool_last_error_message());
    REQUIRE(b.p != nullptr);
    fill(b);
    blocks.push_back(b);
  }
  std::vector<LostSeen> seen;
  cxlpool_capacity_report_t r{};
  REQUIRE(force_release("dev", 32 * kMiB, 32 * kMiB, &r, &seen) == CXLPOOL_OK);
  REQUIRE(r.lost_units >= 1);
  // Room again: the blocks outside the lost ranges are freed, and three in four of those in
  // them, so the lost units live on with free slices (some committed, some not) next to live
  // blocks.
  std::vector<Block> kept;
  size_t in_range = 0;
  for (const Block& b : blocks)
    (touches(seen, b.p, b.n) && in_range++ % 4 == 0 ? kept.push_back(b) : cxlpool_free(b.p));
  REQUIRE(!kept.empty());
  REQUIRE(cxlpool_pool_trim(pool, nullptr) == CXLPOOL_OK);
  INFO("committed " << capacity_of("dev").committed_bytes << " of " << capacity_of("dev").capacity_bytes);
  // What is left of the capacity serves new blocks of every size. A heap's current page in a
  // lost unit hands out the committed free blocks of its current 64-block word, then nothing
  // more: after that no block is in a lost range.
  std::vector<Block> more;
  size_t last_in_lost = 0;
  for (unsigned i = 0; i < 1000; ++i) {
    const size_t n = i % 3 == 0 ? 70000 : i % 3 == 1 ? 3000 : 300000;
    const cxlpool_device_capacity_t c = capacity_of("dev");
    if (c.committed_bytes + 8 * kMiB > c.capacity_bytes) break;  // slack for scattered free slices
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, 5000 + i};
    INFO("block " << i << " of " << n << " bytes; committed " << c.committed_bytes << " of " << c.capacity_bytes);
    REQUIRE(b.p != nullptr);
    if (touches(seen, b.p, b.n)) last_in_lost = more.size() + 1;
    fill(b);
    more.push_back(b);
  }
  CHECK(more.size() > 400);
  CHECK(last_in_lost < 3 * 64 * 2);  // three classes, the thread's heap and a central heap
  CHECK(all_intact(more));
  // The range comes back: the units that lost it serve from it again, and the device fills
  // (to 112 of 128 MiB: as above, nearer the brim every offset can be held by then).
  REQUIRE(cxlpool_device_add_extent("dev", 32 * kMiB, 32 * kMiB, nullptr) == CXLPOOL_OK);
  for (unsigned i = 0;; ++i) {
    const cxlpool_device_capacity_t c = capacity_of("dev");
    if (c.committed_bytes + 16 * kMiB > c.capacity_bytes) break;
    const size_t n = i % 3 == 0 ? 70000 : i % 3 == 1 ? 3000 : 300000;
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, 9000 + i};
    INFO("refill block " << i << "; committed " << c.committed_bytes << " of " << c.capacity_bytes);
    REQUIRE(b.p != nullptr);
    fill(b);
    more.push_back(b);
  }
  CHECK(all_intact(more));
  for (const Block& b : kept) cxlpool_free(b.p);
  for (const Block& b : more) cxlpool_free(b.p);
}

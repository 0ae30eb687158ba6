// SPDX-License-Identifier: MIT
// The KV cache through the C API: geometry presets and limits; an arena's blocks, prefix
// sharing (exact: the same tokens after another prefix are not shared), reference counts and
// sealing; eviction of idle cached blocks from the near pool to the far one and out, never of
// held ones, CAPACITY leaving the sequence unchanged; promotion of far hits; handoff to a
// second participant and to another process (kv_peer): bytes equal, 1,000 handoffs of random
// sizes with every CPU saturated by hogs and nobody evicted; forged, damaged and withdrawn
// handles refused; a consumer killed with SIGKILL while holding a view: the producer reclaims
// everything as soon as its process is gone.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_hogs.hpp"
#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace {

std::string unique_name(const char* tag) {
  return std::string("cxlpool-kvtest-") + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
}

// A shared pool on /dev/shm, removed at scope exit; 5 ms heartbeat, 100 ms lease timeout (far
// below what a saturated machine stalls a thread: same-host participants are judged by their
// process, never by silence).
struct ShmPool {
  std::string name, device;
  cxlpool_shared_pool_t* pool = nullptr;
  explicit ShmPool(const char* tag, uint64_t size = 64u << 20, uint32_t stopped_timeout_ms = 0) {
    name = unique_name(tag);
    device = "shm:" + name;
    cxlpool_shared_params_t* p = nullptr;
    REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_size(p, size) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_extent_size(p, 1u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_lease_timing(p, 5, 100) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_stopped_timeout(p, stopped_timeout_ms) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_OK);
    cxlpool_shared_params_destroy(p);
  }
  ~ShmPool() {
    if (pool) cxlpool_shared_pool_close(pool);
    unlink(("/dev/shm/" + name).c_str());
  }
  cxlpool_shared_pool_t* open_again() const {
    cxlpool_shared_pool_t* other = nullptr;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &other) == CXLPOOL_OK);
    return other;
  }
};

// A small model: 2 layers x 2 KV heads x 64, fp16, 16 tokens per block: 1 KiB per token,
// 16 KiB per block.
cxlpool_kv_geometry_t small_geometry() {
  cxlpool_kv_geometry_t g{};
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.dtype = CXLPOOL_KV_FP16;
  g.tokens_per_block = 16;
  return g;
}
constexpr size_t kBlock = 16 << 10;

struct Arena {
  cxlpool_kv_arena_t* a = nullptr;
  Arena(std::vector<cxlpool_shared_pool_t*> pools, uint64_t max0 = 0, uint64_t max1 = 0,
        cxlpool_kv_geometry_t g = small_geometry()) {
    cxlpool_kv_params_t* p = nullptr;
    REQUIRE(cxlpool_kv_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_params_set_max_blocks(p, 0, max0) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_params_set_max_blocks(p, 1, max1) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_arena_create(&g, pools.data(), pools.size(), p, &a) == CXLPOOL_OK);
    cxlpool_kv_params_destroy(p);
  }
  ~Arena() { CHECK(cxlpool_kv_arena_destroy(a) == CXLPOOL_OK); }
  cxlpool_kv_stats_t stats() const {
    cxlpool_kv_stats_t s{};
    REQUIRE(cxlpool_kv_arena_stats(a, &s) == CXLPOOL_OK);
    return s;
  }
};

struct Seq {
  cxlpool_kv_seq_t* s = nullptr;
  explicit Seq(const Arena& a) { REQUIRE(cxlpool_kv_seq_create(a.a, &s) == CXLPOOL_OK); }
  ~Seq() {
    if (s) CHECK(cxlpool_kv_seq_destroy(s) == CXLPOOL_OK);
  }
  void reset() {
    REQUIRE(cxlpool_kv_seq_destroy(s) == CXLPOOL_OK);
    s = nullptr;
  }
  size_t append(const std::vector<int32_t>& t) {
    size_t reused = 99999;
    REQUIRE(cxlpool_kv_seq_append(s, t.data(), t.size(), &reused) == CXLPOOL_OK);
    return reused;
  }
  unsigned char* block(uint64_t i, uint32_t* tier = nullptr) {
    void* p = nullptr;
    REQUIRE(cxlpool_kv_seq_block(s, i, &p, tier) == CXLPOOL_OK);
    return static_cast<unsigned char*>(p);
  }
  cxlpool_kv_seq_info_t info() {
    cxlpool_kv_seq_info_t i{};
    REQUIRE(cxlpool_kv_seq_info(s, &i) == CXLPOOL_OK);
    return i;
  }
  // Fills blocks [from, blocks) with a pattern of (seed, block) and seals everything.
  void fill_and_seal(unsigned seed, uint64_t from = 0) {
    const auto i = info();
    for (uint64_t b = from; b < i.blocks; ++b) std::memset(block(b), int((seed * 31 + b) & 0xff), kBlock);
    REQUIRE(cxlpool_kv_seq_seal(s, i.tokens) == CXLPOOL_OK);
  }
};

std::vector<int32_t> tokens(size_t n, int32_t first) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + int32_t(i);
  return t;
}

uint64_t fnv(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::string hex(const void* p, size_t n) {
  std::string s;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<const unsigned char*>(p)[i]);
    s += buf;
  }
  return s;
}

cxlpool_shared_info_t pool_info(cxlpool_shared_pool_t* p) {
  cxlpool_shared_info_t i{};
  REQUIRE(cxlpool_shared_pool_info(p, &i) == CXLPOOL_OK);
  return i;
}

}  // namespace

TEST_CASE("geometry: presets, sizes, layout and limits", "[kvcache]") {
  cxlpool_kv_geometry_t g{};
  uint64_t per_token = 0, per_block = 0;
  REQUIRE(cxlpool_kv_geometry_preset("opt-6.7b", 16, &g) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_geometry_sizes(&g, &per_token, &per_block) == CXLPOOL_OK);
  CHECK(per_token == 512 * 1024);  // 32 layers x 2 x 4096 x fp16
  CHECK(per_block == 16 * per_token);
  REQUIRE(cxlpool_kv_geometry_preset("llama-3-8b", 2048, &g) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_geometry_sizes(&g, &per_token, &per_block) == CXLPOOL_OK);
  CHECK(per_token == 128 * 1024);  // GQA: 8 KV heads
  REQUIRE(cxlpool_kv_geometry_preset("opt-6.7b", 2048, &g) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_geometry_sizes(&g, nullptr, &per_block) == CXLPOOL_OK);
  CHECK(per_block == uint64_t(1) << 30);  // 2048 tokens of OPT-6.7B: 1 GiB
  CHECK(cxlpool_kv_geometry_preset("gpt-7", 16, &g) == CXLPOOL_E_NOT_FOUND);
  CHECK(std::string(cxlpool_last_error_message()).find("opt-6.7b") != std::string::npos);
  // Layout: [layer][k/v][token][head][dim].
  g = small_geometry();
  uint64_t off = 0;
  REQUIRE(cxlpool_kv_block_offset(&g, 1, 1, 3, &off) == CXLPOOL_OK);
  CHECK(off == ((1 * 2 + 1) * 16 + 3) * 256);
  CHECK(cxlpool_kv_block_offset(&g, 2, 0, 0, &off) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_kv_block_offset(&g, 0, 2, 0, &off) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_kv_block_offset(&g, 0, 0, 16, &off) == CXLPOOL_E_INVALID_ARGUMENT);
  struct Bad {
    cxlpool_kv_geometry_t g;
    const char* named;
  };
  cxlpool_kv_geometry_t b = small_geometry();
  std::vector<Bad> bad;
  b.layers = 0, bad.push_back({b, "layers=0"}), b = small_geometry();
  b.kv_heads = 5000, bad.push_back({b, "kv_heads=5000"}), b = small_geometry();
  b.head_dim = 0, bad.push_back({b, "head_dim=0"}), b = small_geometry();
  b.dtype = 9, bad.push_back({b, "dtype=9"}), b = small_geometry();
  b.tokens_per_block = 0, bad.push_back({b, "tokens_per_block=0"}), b = small_geometry();
  b.reserved[1] = 1, bad.push_back({b, "reserved"}), b = small_geometry();
  b.layers = 1024, b.kv_heads = 1024, b.head_dim = 4096, bad.push_back({b, "4 GiB"});
  for (const Bad& x : bad) {
    INFO(x.named);
    CHECK(cxlpool_kv_geometry_sizes(&x.g, &per_token, &per_block) == CXLPOOL_E_INVALID_ARGUMENT);
    CHECK(std::string(cxlpool_last_error_message()).find(x.named) != std::string::npos);
  }
}

TEST_CASE("arena: blocks, prefix sharing, reference counts and sealing", "[kvcache]") {
  ShmPool pool("basic");
  Arena arena({pool.pool});
  Seq a(arena);
  CHECK(a.append(tokens(40, 1000)) == 0);  // 40 tokens: 2 whole blocks and a partial one
  CHECK(a.info().blocks == 3);
  a.fill_and_seal(1);
  // Another sequence with the same first 32 tokens shares those 2 blocks, not the partial one.
  Seq b(arena);
  std::vector<int32_t> tb = tokens(32, 1000);
  auto more = tokens(20, 5000);
  tb.insert(tb.end(), more.begin(), more.end());
  CHECK(b.append(tb) == 32);
  CHECK(b.info().blocks == 4);
  CHECK(b.info().shared_blocks == 2);
  CHECK(b.block(0) == a.block(0));
  CHECK(b.block(1) == a.block(1));
  CHECK(b.block(2) != a.block(2));
  for (size_t i = 0; i < kBlock; ++i)
    if (b.block(1)[i] != ((31 + 1) & 0xff)) FAIL("shared block byte " << i);
  // Exact: the same 16 tokens after another prefix are a different block.
  Seq c(arena);
  std::vector<int32_t> tc = tokens(16, 7);
  auto second = tokens(16, 1016);  // a's second block's tokens, after another first block
  tc.insert(tc.end(), second.begin(), second.end());
  CHECK(c.append(tc) == 0);
  CHECK(c.block(1) != a.block(1));
  // Unsealed blocks are never shared.
  Seq d(arena);
  CHECK(d.append(tokens(16, 90000)) == 0);
  Seq e(arena);
  CHECK(e.append(tokens(16, 90000)) == 0);
  CHECK(cxlpool_kv_seq_seal(d.s, 17) == CXLPOOL_E_INVALID_ARGUMENT);
  // Appends in pieces: reuse only at whole blocks while the prefix is all shared.
  Seq f(arena);
  CHECK(f.append(tokens(16, 1000)) == 16);
  CHECK(f.append(tokens(16, 1016)) == 16);
  CHECK(f.append(tokens(5, 1032)) == 0);
  CHECK(f.info().shared_blocks == 2);
  const auto st = arena.stats();
  CHECK(st.sequences == 6);
  CHECK(st.prefix_hits == 4);
  // References: a goes, b and f still hold the shared blocks, which stay cached.
  unsigned char* shared0 = a.block(0);
  a.reset();
  CHECK(b.block(0) == shared0);
  CHECK(arena.stats().idle_blocks == 0);
  b.reset();
  f.reset();
  CHECK(arena.stats().idle_blocks == 2);  // cached, held by nobody
  Seq g(arena);
  CHECK(g.append(tokens(32, 1000)) == 32);  // found again
  CHECK(g.block(0) == shared0);
  CHECK(arena.stats().idle_blocks == 0);
  // Foreign and bad arguments.
  int32_t one = 1;
  CHECK(cxlpool_kv_seq_append(nullptr, &one, 1, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_kv_seq_append(g.s, nullptr, 1, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  void* p = nullptr;
  CHECK(cxlpool_kv_seq_block(g.s, 2, &p, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_kv_arena_destroy(arena.a) == CXLPOOL_E_BUSY);  // sequences alive: nothing freed
  CHECK(g.block(1)[0] == ((31 + 1) & 0xff));
}

TEST_CASE("arena: idle blocks go from the near pool to the far one and out, held ones never", "[kvcache]") {
  ShmPool near("near"), far("far");
  Arena arena({near.pool, far.pool}, 4, 4);
  // 8 sealed single-block sequences, each let go after use: every new block goes near, the
  // near pool's oldest idle blocks moving far to make room. 8 idle cached blocks: 4 near
  // (sequences 4..7), 4 far (0..3).
  for (int i = 0; i < 8; ++i) {
    Seq s(arena);
    s.append(tokens(16, 100 * i));
    s.fill_and_seal(unsigned(i));
    uint32_t tier = 9;
    s.block(0, &tier);
    CHECK(tier == 0);
  }
  auto st = arena.stats();
  CHECK(st.blocks[0] == 4);
  CHECK(st.blocks[1] == 4);
  CHECK(st.idle_blocks == 8);
  CHECK(st.demotions == 4);
  CHECK(st.evictions == 0);
  // Four new held blocks: the near pool's idle blocks make room (the oldest first), demoted to
  // far, which evicts its own oldest (0..3) out.
  Seq hold(arena);
  hold.append(tokens(64, 50000));
  hold.fill_and_seal(77);
  for (int b = 0; b < 4; ++b) {
    uint32_t tier = 9;
    hold.block(uint64_t(b), &tier);
    CHECK(tier == 0);
  }
  st = arena.stats();
  CHECK(st.demotions == 8);
  CHECK(st.evictions == 4);
  // The 4 most recently used of the first 8 survive (sequences 4..7, now all far) with their
  // bytes; 0..3 went out (asked last: a miss makes room by evicting the oldest idle block).
  for (int i : {4, 5, 6, 7, 0, 1, 2, 3}) {
    Seq s(arena);
    const size_t reused = s.append(tokens(16, 100 * i));
    INFO("sequence " << i);
    if (i >= 4) {
      CHECK(reused == 16);
      uint32_t tier = 9;
      unsigned char* p = s.block(0, &tier);
      CHECK(p[100] == ((unsigned(i) * 31) & 0xff));
    } else {
      CHECK(reused == 0);
    }
  }
  // Everything held now: no more room, and the sequence is left as it was.
  Seq hold2(arena);
  hold2.append(tokens(64, 60000));
  Seq x(arena);
  const auto before = x.info();
  int32_t many[16];
  for (int i = 0; i < 16; ++i) many[i] = 70000 + i;
  CHECK(cxlpool_kv_seq_append(x.s, many, 16, nullptr) == CXLPOOL_E_CAPACITY);
  CHECK(std::string(cxlpool_last_error_message()).find("no pool of the arena has room") != std::string::npos);
  CHECK(x.info().tokens == before.tokens);
  CHECK(x.info().blocks == before.blocks);
  for (int b = 0; b < 4; ++b) CHECK(hold.block(uint64_t(b))[5] == ((77 * 31 + b) & 0xff));  // held: untouched
}

TEST_CASE("arena: a hit in the far pool moves nearer when there is room", "[kvcache]") {
  ShmPool near("pnear"), far("pfar");
  Arena arena({near.pool, far.pool}, 1, 8);
  {
    Seq a(arena), b(arena);
    a.append(tokens(16, 1));
    a.fill_and_seal(1);
    b.append(tokens(16, 2));  // far: near holds 1 block
    b.fill_and_seal(2);
    uint32_t tier = 9;
    b.block(0, &tier);
    CHECK(tier == 1);
  }  // both idle now
  // Take a's near block out of the way (evicted to far by a new held block), free it again.
  {
    Seq c(arena);
    c.append(tokens(16, 3));
  }
  CHECK(arena.stats().blocks[0] == 0);  // c's block was not sealed: freed, the near pool is empty
  Seq again(arena);
  CHECK(again.append(tokens(16, 2)) == 16);
  uint32_t tier = 9;
  unsigned char* p = again.block(0, &tier);
  CHECK(tier == 0);
  CHECK(p[7] == ((2 * 31) & 0xff));
  CHECK(arena.stats().promotions == 1);
}

TEST_CASE("handoff: a second participant reads the blocks in place, bad handles are refused", "[kvcache]") {
  ShmPool pool("handoff");
  cxlpool_shared_pool_t* consumer = pool.open_again();
  Arena arena({pool.pool});
  Seq s(arena);
  s.append(tokens(100, 1));
  s.fill_and_seal(9);
  cxlpool_kv_handle_t h{};
  REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
  CHECK(h.tokens == 100);
  CHECK(h.blocks == 7);
  const cxlpool_kv_geometry_t g = small_geometry();
  cxlpool_kv_view_t* v = nullptr;
  REQUIRE(cxlpool_kv_import(&consumer, 1, &g, &h, &v) == CXLPOOL_OK);
  cxlpool_kv_view_info_t vi{};
  REQUIRE(cxlpool_kv_view_info(v, &vi) == CXLPOOL_OK);
  CHECK(vi.tokens == 100);
  CHECK(vi.blocks == 7);
  CHECK(vi.bytes_per_block == kBlock);
  for (uint64_t b = 0; b < 7; ++b) {
    const void* data = nullptr;
    REQUIRE(cxlpool_kv_view_block(v, b, &data) == CXLPOOL_OK);
    CHECK(fnv(data, kBlock) == fnv(s.block(b), kBlock));
  }
  CHECK(pool_info(consumer).leases_held == 7);
  // The producer lets go of everything: the consumer's blocks stay as they were.
  const void* data0 = nullptr;
  cxlpool_kv_view_block(v, 0, &data0);
  const uint64_t sum0 = fnv(data0, kBlock);
  s.reset();
  {
    Seq other(arena);  // the freed blocks are not reused under the consumer's feet
    other.append(tokens(200, 900000));
    other.fill_and_seal(200);
  }
  CHECK(fnv(data0, kBlock) == sum0);
  REQUIRE(cxlpool_kv_view_release(v) == CXLPOOL_OK);
  CHECK(pool_info(consumer).leases_held == 0);
  // The export went with the sequence: STALE now.
  CHECK(cxlpool_kv_import(&consumer, 1, &g, &h, &v) == CXLPOOL_E_STALE);
  CHECK(pool_info(consumer).leases_held == 0);

  Seq t(arena);
  t.append(tokens(33, 5));
  CHECK(cxlpool_kv_seq_export(t.s, 0, &h) == CXLPOOL_E_INVALID_ARGUMENT);  // not sealed
  CHECK(std::string(cxlpool_last_error_message()).find("sealed") != std::string::npos);
  t.fill_and_seal(3);
  REQUIRE(cxlpool_kv_seq_export(t.s, 20, &h) == CXLPOOL_OK);  // a prefix: 2 blocks
  CHECK(h.blocks == 2);
  // Damaged in transit: every single-bit flip of the handle is refused, with no lease kept.
  size_t accepted = 0;
  for (size_t bit = 0; bit < sizeof h * 8; ++bit) {
    cxlpool_kv_handle_t bad = h;
    reinterpret_cast<unsigned char*>(&bad)[bit / 8] ^= uint8_t(1u << (bit % 8));
    cxlpool_kv_view_t* bv = nullptr;
    if (cxlpool_kv_import(&consumer, 1, nullptr, &bad, &bv) == CXLPOOL_OK) {
      ++accepted;
      cxlpool_kv_view_release(bv);
    }
  }
  CHECK(accepted == 0);
  CHECK(pool_info(consumer).leases_held == 0);
  // Another geometry expected; a pool not given; random handles.
  cxlpool_kv_geometry_t other = g;
  other.head_dim = 128;
  CHECK(cxlpool_kv_import(&consumer, 1, &other, &h, &v) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("geometry") != std::string::npos);
  ShmPool stranger("stranger");
  CHECK(cxlpool_kv_import(&stranger.pool, 1, nullptr, &h, &v) == CXLPOOL_E_NOT_FOUND);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    cxlpool_kv_handle_t r{};
    for (size_t k = 0; k < sizeof r; ++k) reinterpret_cast<unsigned char*>(&r)[k] = uint8_t(rng());
    if (i % 2) r.descriptor.pool_id[0] = h.descriptor.pool_id[0], r.descriptor.pool_id[1] = h.descriptor.pool_id[1];
    CHECK(cxlpool_kv_import(&consumer, 1, nullptr, &r, &v) != CXLPOOL_OK);
  }
  CHECK(pool_info(consumer).leases_held == 0);
  // The block table scribbled on by someone with the pool mapped: refused, nothing leased.
  void* table = nullptr;
  size_t table_size = 0;
  REQUIRE(cxlpool_shared_import(consumer, &h.descriptor, &table, &table_size) == CXLPOOL_OK);
  CHECK(table_size >= 80 + 2 * 32);  // a header of 80 bytes and 2 block handles
  for (size_t at : {size_t(0), size_t(20), size_t(64), size_t(80 + 2 * 32 - 1)}) {
    auto* bytes = static_cast<unsigned char*>(table);
    bytes[at] ^= 0x40;
    CHECK(cxlpool_kv_import(&consumer, 1, nullptr, &h, &v) == CXLPOOL_E_CORRUPT);
    bytes[at] ^= 0x40;
  }
  REQUIRE(cxlpool_shared_release(consumer, table) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_import(&consumer, 1, nullptr, &h, &v) == CXLPOOL_OK);  // intact again
  cxlpool_kv_view_release(v);
  CHECK(pool_info(consumer).leases_held == 0);
  CHECK(cxlpool_kv_view_release(nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_pool_close(consumer);
}

TEST_CASE("handoff across processes under CPU hogs: 1,000 sequences of random sizes, checksums equal, none evicted",
          "[kvcache]") {
  // Every CPU saturated by busy processes at our own priority, for the whole handoff: the
  // producer and the consumer are starved far past their 100 ms lease, and must not be evicted.
  cxlpool_test::CpuHogs hogs(8);
  ShmPool pool("peer", 128u << 20);
  Arena arena({pool.pool});
  int to_peer[2], from_peer[2];
  REQUIRE(pipe(to_peer) == 0);
  REQUIRE(pipe(from_peer) == 0);
  const std::string peer = std::string(CXLPOOL_TEST_BINARY_DIR) + "/kv_peer";
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to_peer[0], 0);
    dup2(from_peer[1], 1);
    close(to_peer[1]);
    close(from_peer[0]);
    execl(peer.c_str(), peer.c_str(), pool.device.c_str(), "serve", (char*)nullptr);
    _exit(127);
  }
  close(to_peer[0]);
  close(from_peer[1]);
  FILE* out = fdopen(to_peer[1], "w");
  FILE* in = fdopen(from_peer[0], "r");
  std::mt19937 rng(11);
  std::vector<int32_t> common = tokens(64, 424242);  // a shared prefix for half of them
  int ok = 0, bad = 0;
  std::string first_bad;
  for (int i = 0; i < 1000; ++i) {
    Seq s(arena);
    const size_t n = 1 + rng() % 400;
    std::vector<int32_t> t;
    if (i % 2) t.assign(common.begin(), common.begin() + ptrdiff_t(std::min<size_t>(n, common.size())));
    while (t.size() < n) t.push_back(int32_t(rng()));
    const size_t reused = s.append(t);
    s.fill_and_seal(unsigned(i), reused / 16);  // what was found cached is not written again
    cxlpool_kv_handle_t h{};
    REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
    uint64_t sum = 0xcbf29ce484222325ull;
    for (uint64_t b = 0; b < h.blocks; ++b) sum = fnv(s.block(b), kBlock, sum);
    std::fprintf(out, "H %s %016llx\n", hex(&h, sizeof h).c_str(), (unsigned long long)sum);
    std::fflush(out);
    char line[512] = {};
    REQUIRE(std::fgets(line, sizeof line, in) != nullptr);
    if (std::strncmp(line, "ok", 2) == 0) {
      ++ok;
    } else {
      ++bad;
      if (first_bad.empty()) first_bad = line;
    }
  }
  std::fprintf(out, "Q\n");
  std::fclose(out);
  std::fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("first failure: " << first_bad);
  CHECK(ok == 1000);
  CHECK(bad == 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const auto st = arena.stats();
  WARN("1,000 handoffs to another process, " << hogs.count() << " CPU hogs: " << ok << " checksums equal; prefix hits "
                                             << st.prefix_hits << ", misses " << st.prefix_misses << ", exports "
                                             << st.exports);
  cxlpool_shared_info_t info{};
  REQUIRE(cxlpool_shared_pool_info(pool.pool, &info) == CXLPOOL_OK);
  CHECK(info.recovered_slots == 0);  // nobody was declared dead
  CHECK(st.prefix_hits > 0);
}

TEST_CASE("handoff: a consumer killed while it holds a view, the producer reclaims everything", "[kvcache]") {
  ShmPool pool("kill");
  const uint64_t before = pool_info(pool.pool).bytes_in_use;
  cxlpool_kv_handle_t h{};
  {
    Arena arena({pool.pool});
    Seq s(arena);
    s.append(tokens(200, 3));
    s.fill_and_seal(4);
    REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
    int from_peer[2];
    REQUIRE(pipe(from_peer) == 0);
    const std::string peer = std::string(CXLPOOL_TEST_BINARY_DIR) + "/kv_peer";
    const std::string handle_hex = hex(&h, sizeof h);
    pid_t pid = fork();
    if (pid == 0) {
      dup2(from_peer[1], 1);
      close(from_peer[0]);
      execl(peer.c_str(), peer.c_str(), pool.device.c_str(), "hold", handle_hex.c_str(), (char*)nullptr);
      _exit(127);
    }
    close(from_peer[1]);
    char line[256] = {};
    FILE* in = fdopen(from_peer[0], "r");
    REQUIRE(std::fgets(line, sizeof line, in) != nullptr);
    std::fclose(in);
    REQUIRE(std::string(line) == "held\n");
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    s.reset();  // the producer lets go while the dead consumer's leases are still there
  }             // the arena frees what it held
  // The consumer's process is gone: the producer's watch recovers its leases at its next pass
  // and the blocks they kept alive are freed.
  uint64_t now = 0;
  for (int i = 0; i < 3000; ++i) {  // 30 s: a hang guard, not a speed this machine must have
    now = pool_info(pool.pool).bytes_in_use;
    if (now <= before) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(now <= before);
  cxlpool_shared_check_report_t r{};
  CHECK(cxlpool_shared_pool_check(pool.device.c_str(), nullptr, 0, &r) == CXLPOOL_OK);
  CHECK(r.leaked_blocks == 0);
  CHECK(r.dangling_leases == 0);
}

TEST_CASE("handles: destroyed ones are refused, exports live side by side, arguments checked", "[kvcache]") {
  ShmPool pool("handles");
  cxlpool_shared_pool_t* consumer = pool.open_again();
  // Params: a double destroy and a foreign pointer are refused, not followed.
  cxlpool_kv_params_t* p = nullptr;
  REQUIRE(cxlpool_kv_params_create(&p) == CXLPOOL_OK);
  cxlpool_kv_params_destroy(p);
  cxlpool_kv_params_destroy(p);  // no double free
  CHECK(cxlpool_kv_params_set_max_blocks(p, 0, 1) == CXLPOOL_E_INVALID_ARGUMENT);
  Arena arena({pool.pool});
  Seq live(arena);
  CHECK(cxlpool_kv_params_set_max_blocks(reinterpret_cast<cxlpool_kv_params_t*>(live.s), 0, 1) ==
        CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(live.info().tokens == 0);  // untouched
  // A destroyed sequence's handle stays refused even as new sequences come and go.
  cxlpool_kv_seq_t* stale = nullptr;
  REQUIRE(cxlpool_kv_seq_create(arena.a, &stale) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_seq_destroy(stale) == CXLPOOL_OK);
  for (int i = 0; i < 50; ++i) {
    Seq other(arena);
    other.append(tokens(3, i));
    CHECK(cxlpool_kv_seq_destroy(stale) == CXLPOOL_E_INVALID_ARGUMENT);
    CHECK(other.info().tokens == 3);
  }
  // n that would wrap the token count.
  Seq w(arena);
  w.append(tokens(6, 1));
  int32_t one = 1;
  CHECK(cxlpool_kv_seq_append(w.s, &one, SIZE_MAX - 1, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(w.info().tokens == 6);
  // Two exports of one sequence (a prefix, then all of it) both import; the same count again
  // is the same handle.
  Seq s(arena);
  s.append(tokens(48, 300));
  s.fill_and_seal(5);
  cxlpool_kv_handle_t prefix{}, all{}, again{};
  REQUIRE(cxlpool_kv_seq_export(s.s, 16, &prefix) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_seq_export(s.s, 0, &all) == CXLPOOL_OK);
  REQUIRE(cxlpool_kv_seq_export(s.s, 16, &again) == CXLPOOL_OK);
  CHECK(std::memcmp(&prefix, &again, sizeof prefix) == 0);
  for (const cxlpool_kv_handle_t* h : {&prefix, &all}) {
    cxlpool_kv_view_t* v = nullptr;
    REQUIRE(cxlpool_kv_import(&consumer, 1, nullptr, h, &v) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_view_release(v) == CXLPOOL_OK);
    CHECK(cxlpool_kv_view_release(v) == CXLPOOL_E_INVALID_ARGUMENT);  // released once
  }
  // The expected geometry is validated, and a mismatch names both.
  cxlpool_kv_geometry_t bad = small_geometry();
  bad.reserved[0] = 7;
  cxlpool_kv_view_t* v = nullptr;
  CHECK(cxlpool_kv_import(&consumer, 1, &bad, &all, &v) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("reserved") != std::string::npos);
  cxlpool_kv_geometry_t other = small_geometry();
  other.dtype = CXLPOOL_KV_BF16;
  CHECK(cxlpool_kv_import(&consumer, 1, &other, &all, &v) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("dtype 1") != std::string::npos);
  cxlpool_shared_pool_close(consumer);
}

TEST_CASE("pools that fail or close under an arena or a view: statuses, never their memory", "[kvcache]") {
  SECTION("the consumer's pool closed while a view lives") {
    ShmPool pool("closeview");
    cxlpool_shared_pool_t* consumer = pool.open_again();
    Arena arena({pool.pool});
    Seq s(arena);
    s.append(tokens(32, 1));
    s.fill_and_seal(1);
    cxlpool_kv_handle_t h{};
    REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
    cxlpool_kv_view_t* v = nullptr;
    REQUIRE(cxlpool_kv_import(&consumer, 1, nullptr, &h, &v) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(consumer) == CXLPOOL_OK);
    const void* data = nullptr;
    CHECK(cxlpool_kv_view_block(v, 0, &data) == CXLPOOL_E_INVALID_ARGUMENT);
    CHECK(std::string(cxlpool_last_error_message()).find("closed") != std::string::npos);
    CHECK(cxlpool_kv_view_release(v) == CXLPOOL_OK);  // its leases went with the close
  }
  SECTION("the arena's pool closed") {
    ShmPool pool("closearena");
    cxlpool_shared_pool_t* own = pool.open_again();
    cxlpool_kv_geometry_t g = small_geometry();
    cxlpool_kv_arena_t* a = nullptr;
    REQUIRE(cxlpool_kv_arena_create(&g, &own, 1, nullptr, &a) == CXLPOOL_OK);
    cxlpool_kv_seq_t* s = nullptr;
    REQUIRE(cxlpool_kv_seq_create(a, &s) == CXLPOOL_OK);
    std::vector<int32_t> t = tokens(32, 1);
    REQUIRE(cxlpool_kv_seq_append(s, t.data(), t.size(), nullptr) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(own) == CXLPOOL_OK);
    void* data = nullptr;
    CHECK(cxlpool_kv_seq_block(s, 0, &data, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
    CHECK(cxlpool_kv_seq_append(s, t.data(), t.size(), nullptr) == CXLPOOL_E_CAPACITY);
    CHECK(cxlpool_kv_seq_destroy(s) == CXLPOOL_OK);
    CHECK(cxlpool_kv_arena_destroy(a) == CXLPOOL_OK);
  }
  SECTION("a failed device: no pointer into it") {
    ShmPool pool("failed");
    cxlpool_shared_pool_t* consumer = pool.open_again();
    Arena arena({pool.pool});
    Seq s(arena);
    s.append(tokens(32, 1));
    s.fill_and_seal(1);
    cxlpool_kv_handle_t h{};
    REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
    cxlpool_kv_view_t* v = nullptr;
    REQUIRE(cxlpool_kv_import(&consumer, 1, nullptr, &h, &v) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_inject_failure(consumer, "test") == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_inject_failure(pool.pool, "test") == CXLPOOL_OK);
    const void* cdata = nullptr;
    CHECK(cxlpool_kv_view_block(v, 0, &cdata) == CXLPOOL_E_DEVICE_FAILED);
    void* pdata = nullptr;
    CHECK(cxlpool_kv_seq_block(s.s, 0, &pdata, nullptr) == CXLPOOL_E_DEVICE_FAILED);
    Seq hit(arena);
    int32_t same[32];
    for (int i = 0; i < 32; ++i) same[i] = 1 + i;
    CHECK(cxlpool_kv_seq_append(hit.s, same, 32, nullptr) == CXLPOOL_E_DEVICE_FAILED);  // a cache hit
    CHECK(hit.info().tokens == 0);
    cxlpool_kv_view_release(v);
    cxlpool_shared_pool_close(consumer);
  }
}

TEST_CASE("a consumer stopped past the pool's stopped timeout is evicted, and its view then says so", "[kvcache]") {
  ShmPool pool("evict", 64u << 20, 200);  // a consumer of this host stopped for 200 ms is dead
  Arena arena({pool.pool});
  Seq s(arena);
  s.append(tokens(64, 9));
  s.fill_and_seal(2);
  cxlpool_kv_handle_t h{};
  REQUIRE(cxlpool_kv_seq_export(s.s, 0, &h) == CXLPOOL_OK);
  int to_peer[2], from_peer[2];
  REQUIRE(pipe(to_peer) == 0);
  REQUIRE(pipe(from_peer) == 0);
  const std::string peer = std::string(CXLPOOL_TEST_BINARY_DIR) + "/kv_peer";
  const std::string handle_hex = hex(&h, sizeof h);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(to_peer[0], 0);
    dup2(from_peer[1], 1);
    close(to_peer[1]);
    close(from_peer[0]);
    execl(peer.c_str(), peer.c_str(), pool.device.c_str(), "late", handle_hex.c_str(), (char*)nullptr);
    _exit(127);
  }
  close(to_peer[0]);
  close(from_peer[1]);
  FILE* in = fdopen(from_peer[0], "r");
  char line[512] = {};
  REQUIRE(std::fgets(line, sizeof line, in) != nullptr);
  REQUIRE(std::string(line) == "held\n");
  kill(pid, SIGSTOP);
  cxlpool_shared_info_t info{};
  for (int i = 0; i < 3000 && info.recovered_slots == 0; ++i) {  // recovered by the producer (30 s hang guard)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(cxlpool_shared_pool_info(pool.pool, &info) == CXLPOOL_OK);
  }
  CHECK(info.recovered_slots == 1);
  kill(pid, SIGCONT);
  REQUIRE(write(to_peer[1], "go\n", 3) == 3);
  REQUIRE(std::fgets(line, sizeof line, in) != nullptr);
  std::fclose(in);
  close(to_peer[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("the consumer said: " << line);
  CHECK(std::atoi(line) == CXLPOOL_E_EVICTED);
}

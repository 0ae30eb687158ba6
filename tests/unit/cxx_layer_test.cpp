// SPDX-License-Identifier: MIT
// The header-only C++ layer: RAII pools, std::pmr resources per policy/device/tier, the STL
// allocator, error_code and throwing variants; the KV cache classes.
#include <unistd.h>

#include <cstring>
#include <list>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.hpp"
#include "test_support.hpp"

namespace {
cxlpool::Topology topology() {
  cxlpool::Config c;
  c.devices("cxlA:backing=shm,size=256M,latency=300ns").flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC);
  return cxlpool::Topology::discover(&c);
}
std::string where(const void* p) { return cxlpool::ptr_info(p)->device_name; }
}  // namespace

TEST_CASE("pmr containers in far memory", "[unit]") {
  auto topo = topology();
  auto pool = cxlpool::Pool::create(topo, {"node0,cxlA", "bind:near", "cxx"});
  std::pmr::vector<float> far_vec(&pool.resource(cxlpool::Tier::far));
  far_vec.resize(100000, 1.5f);
  CHECK(where(far_vec.data()) == "cxlA");
  std::pmr::vector<int> near_vec(&pool.resource(cxlpool::Tier::near));
  near_vec.assign(1000, 7);
  CHECK(where(near_vec.data()) == "node0");
  std::pmr::map<int, std::pmr::string> m(&pool.resource("cxlA"));
  for (int i = 0; i < 100; ++i) m.emplace(i, std::pmr::string(200, 'x'));
  CHECK(where(&*m.begin()) == "cxlA");
  CHECK(where(m.at(5).data()) == "cxlA");  // nested strings use the same resource
  std::pmr::vector<int> by_policy(&pool.resource());
  by_policy.push_back(1);
  CHECK(where(by_policy.data()) == "node0");
  CHECK(&pool.resource(1) == &pool.resource("cxlA"));  // resources are owned and reused
  CHECK(pool.resource(0).is_equal(pool.resource(0)));
  CHECK_FALSE(pool.resource(0).is_equal(pool.resource(1)));
  // Over-aligned pmr allocations honour the alignment and the device.
  void* p = pool.resource(1).allocate(1000, 4096);
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  CHECK(where(p) == "cxlA");
  pool.resource(1).deallocate(p, 1000, 4096);
}

TEST_CASE("STL allocator, stats, trim, errors", "[unit]") {
  auto topo = topology();
  auto pool = cxlpool::Pool::create(topo, {"node0,cxlA", "threshold:size=64K,tier=far"});
  std::vector<double, cxlpool::Allocator<double>> v{cxlpool::Allocator<double>(pool)};
  v.resize(100);
  CHECK(where(v.data()) == "node0");
  v.resize(100000);  // 800 KB: over the threshold
  CHECK(where(v.data()) == "cxlA");
  std::list<int, cxlpool::Allocator<int>> l{cxlpool::Allocator<int>(pool, pool.find_device("cxlA"))};
  l.push_back(1);
  CHECK(where(&l.front()) == "cxlA");
  CHECK(cxlpool::Allocator<int>(pool) == cxlpool::Allocator<long>(pool));
  CHECK_FALSE(cxlpool::Allocator<int>(pool) == cxlpool::Allocator<int>(pool, 1));
  CHECK_THROWS_AS(cxlpool::Allocator<double>(pool).allocate(SIZE_MAX / 4), std::bad_array_new_length);
  CHECK_THROWS_AS(pool.allocate(SIZE_MAX / 2), std::bad_alloc);
  CHECK(pool.allocate_nothrow(SIZE_MAX / 2) == nullptr);
  CHECK(pool.stats().allocations >= 3);
  CHECK(pool.stats_json().find("\"policy\": \"threshold:size=65536,device=cxlA\"") != std::string::npos);
  CHECK(pool.policy() == "threshold:size=65536,device=cxlA");
  CHECK(pool.device_count() == 2);
  CHECK(pool.device_name(1) == "cxlA");
  CHECK_THROWS_AS(pool.resource(5), cxlpool::Error);

  std::error_code ec;
  auto bad = cxlpool::Pool::create(ec, topo, {"", "bind:nowhere"});
  CHECK_FALSE(bad.has_value());
  CHECK(ec == cxlpool::make_error_code(CXLPOOL_E_CONFIG));
  CHECK(ec.category().name() == std::string("cxlpool"));
  try {
    cxlpool::Pool::create(topo, {"", "ratio:node0=1"});
    FAIL("accepted");
  } catch (const cxlpool::Error& e) {
    CHECK(e.status() == CXLPOOL_E_CONFIG);
    CHECK(std::string(e.what()).find("at least two devices") != std::string::npos);
  }
  v = {};  // containers go before their pool
  l = decltype(l)(l.get_allocator());
  auto moved = std::move(pool);
  CHECK(moved.device_count() == 2);
  uint64_t before = moved.stats().resident_bytes;
  uint64_t released = moved.trim();
  CHECK(moved.stats().resident_bytes == before - released);
}

TEST_CASE("elastic capacity from C++", "[unit]") {
  auto topo = topology();
  auto pool = cxlpool::Pool::create(topo, {"cxlA", "bind:cxlA"});
  void* p = pool.allocate(1000);
  CHECK(cxlpool::device::capacity("cxlA").capacity_bytes == 256u << 20);
  cxlpool_capacity_report_t r = cxlpool::device::resize("cxlA", 512u << 20);
  CHECK(r.capacity_after == 512u << 20);
  r = cxlpool::device::withdraw_extent("cxlA", 256u << 20, 128u << 20);
  CHECK(r.capacity_after == 384u << 20);
  const auto extents = cxlpool::device::extents("cxlA");
  REQUIRE(extents.size() == 2);
  CHECK(extents[1] == std::pair<uint64_t, uint64_t>(384u << 20, 512u << 20));
  try {
    cxlpool::device::resize("nosuch", 64u << 20);
    FAIL("accepted");
  } catch (const cxlpool::Error& e) {
    CHECK(e.status() == CXLPOOL_E_NOT_FOUND);
  }
  cxlpool::Pool::deallocate(p);
}

TEST_CASE("the default pool from C++", "[unit]") {
  auto def = cxlpool::Pool::default_pool();
  void* p = def.allocate(100);
  CHECK(cxlpool::ptr_info(p).has_value());
  CHECK(cxlpool::ptr_info(p)->pool == def.get());
  cxlpool::Pool::deallocate(p);
  int local = 0;
  CHECK_FALSE(cxlpool::ptr_info(&local).has_value());
}

TEST_CASE("the KV cache from C++: arena, sequence, export, view", "[unit]") {
  const std::string name = "cxlpool-cxx-kv-" + std::to_string(getpid());
  const std::string device = "shm:" + name;
  cxlpool_shared_params_t* sp = nullptr;
  REQUIRE(cxlpool_shared_params_create(&sp) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(sp, 64u << 20) == CXLPOOL_OK);
  cxlpool_shared_pool_t* producer = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), sp, 0, &producer) == CXLPOOL_OK);
  cxlpool_shared_params_destroy(sp);
  cxlpool_shared_pool_t* consumer = nullptr;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &consumer) == CXLPOOL_OK);
  {
    cxlpool::KvGeometry g = cxlpool::kv_preset("llama-3-8b", 4);
    CHECK(g.bytes_per_token() == 128 * 1024);
    CHECK(g.offset(1, 0, 0) == 2 * 4 * 8 * 128 * 2);
    CHECK_THROWS_AS(cxlpool::kv_preset("nope", 4), cxlpool::Error);
    cxlpool::KvArena arena(g, {producer});
    cxlpool::KvSequence s = arena.sequence();
    CHECK(s.append(std::vector<int32_t>{1, 2, 3, 4, 5, 6}) == 0);
    std::memset(s.block(0), 0x3c, g.bytes_per_block());
    std::memset(s.block(1), 0x3d, g.bytes_per_block());
    s.seal(6);
    const cxlpool_kv_handle_t h = s.export_handle();
    {
      cxlpool::KvView v({consumer}, h, &g);
      CHECK(v.info().tokens == 6);
      CHECK(static_cast<const unsigned char*>(v.block(1))[100] == 0x3d);
      CHECK_THROWS_AS(v.block(2), cxlpool::Error);
    }
    CHECK(arena.stats().exports == 1);
    s.reset();
    arena.destroy();
  }
  cxlpool_shared_pool_close(consumer);
  cxlpool_shared_pool_close(producer);
  unlink(("/dev/shm/" + name).c_str());
}

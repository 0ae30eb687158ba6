// SPDX-License-Identifier: MIT
// The header-only C++ layer: RAII pools, std::pmr resources per policy/device/tier, the STL
// allocator, error_code and throwing variants.
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

TEST_CASE("the default pool from C++", "[unit]") {
  auto def = cxlpool::Pool::default_pool();
  void* p = def.allocate(100);
  CHECK(cxlpool::ptr_info(p).has_value());
  CHECK(cxlpool::ptr_info(p)->pool == def.get());
  cxlpool::Pool::deallocate(p);
  int local = 0;
  CHECK_FALSE(cxlpool::ptr_info(&local).has_value());
}

// SPDX-License-Identifier: MIT
// The C++ layer of libcxlpool_ucx (cxlpool/kvcache_remote.hpp): a KvServer and a KvRemote in
// one process over loopback tcp, the imported KvView's bytes, the path, the server's counters,
// and errors as cxlpool::Error with the C status.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/kvcache_remote.hpp"
#include "test_support.hpp"

namespace {
cxlpool_shared_pool_t* make_pool(const std::string& device) {
  cxlpool_shared_params_t* sp = nullptr;
  REQUIRE(cxlpool_shared_params_create(&sp) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(sp, 64u << 20) == CXLPOOL_OK);
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_shared_pool_unlink(device.c_str());
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), sp, 0, &pool) == CXLPOOL_OK);
  cxlpool_shared_params_destroy(sp);
  return pool;
}
}  // namespace

TEST_CASE("the KV handoff between hosts from C++: KvServer, KvRemote", "[unit]") {
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  const std::string tag = std::to_string(getpid());
  cxlpool_shared_pool_t* producer = make_pool("shm:cxlpool-cxx-kvr-p-" + tag);
  cxlpool_shared_pool_t* consumer = make_pool("shm:cxlpool-cxx-kvr-c-" + tag);
  {
    cxlpool::KvGeometry g = cxlpool::kv_preset("llama-3-8b", 4);
    cxlpool::KvArena arena(g, {producer});
    cxlpool::KvSequence s = arena.sequence();
    s.append(std::vector<int32_t>{1, 2, 3, 4, 5, 6});
    std::memset(s.block(0), 0x3c, g.bytes_per_block());
    std::memset(s.block(1), 0x3d, g.bytes_per_block());
    s.seal(6);
    const cxlpool_kv_handle_t h = s.export_handle();

    cxlpool::KvServer server({producer}, "127.0.0.1:0");
    CHECK(server.address().rfind("127.0.0.1:", 0) == 0);
    cxlpool::KvRemote remote(server.address(), 5000);
    CHECK(remote.path().rfind("network: ", 0) == 0);
    {
      cxlpool::KvView v = remote.import({consumer}, h, &g);
      CHECK(v.info().tokens == 6);
      CHECK(static_cast<const unsigned char*>(v.block(0))[7] == 0x3c);
      CHECK(static_cast<const unsigned char*>(v.block(1))[g.bytes_per_block() - 1] == 0x3d);
      CHECK_THROWS_AS(v.block(2), cxlpool::Error);
    }
    CHECK(server.stats().fetches == 1);
    cxlpool_kv_handle_t forged = h;
    forged.check ^= 1;
    try {
      remote.import({consumer}, forged, &g);
      FAIL("a forged handle was imported");
    } catch (const cxlpool::Error& e) {
      CHECK(e.status() == CXLPOOL_E_INVALID_ARGUMENT);
      CHECK(std::string(e.what()).find("refused by") != std::string::npos);
    }
    try {
      cxlpool::KvRemote bad("127.0.0.1", 100);
      FAIL("an address without a port was accepted");
    } catch (const cxlpool::Error& e) {
      CHECK(e.status() == CXLPOOL_E_INVALID_ARGUMENT);
      CHECK(std::string(e.what()).find("no port") != std::string::npos);
    }
    server.stop();
    server.stop();  // twice: nothing left to stop
    CHECK_THROWS_AS(server.address(), cxlpool::Error);
  }
  cxlpool_shared_pool_close(consumer);
  cxlpool_shared_pool_close(producer);
  cxlpool_shared_pool_unlink(("shm:cxlpool-cxx-kvr-p-" + tag).c_str());
  cxlpool_shared_pool_unlink(("shm:cxlpool-cxx-kvr-c-" + tag).c_str());
}

// SPDX-License-Identifier: MIT
// The importer against a hostile exporter (kv::View over the internals): block tables whose
// checksums and handle checks are right but whose contents lie — blocks outside the pool,
// inside other blocks, smaller than a block, freed; sizes that disagree; invalid geometry; a
// block count far beyond the table. Each is refused with its status, nothing is allocated for
// a claimed size, and no lease is left behind.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "kvcache/geometry.hpp"
#include "kvcache/handoff.hpp"
#include "shared/layout.hpp"
#include "shared/shared_pool.hpp"
#include "test_support.hpp"

namespace kv = cxlpool::detail::kv;
namespace S = cxlpool::detail::shared;
using cxlpool::detail::Failure;

namespace {

struct Pool {
  std::string name;
  std::unique_ptr<S::SharedPool> p;
  Pool() {
    name = "cxlpool-kvtable-" + std::to_string(getpid()) + "-" +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
    S::SharedParams params;
    params.size = 32u << 20;
    params.extent_size = 1u << 20;
    p = S::SharedPool::create("shm:" + name, params, 0);
  }
  ~Pool() {
    p.reset();
    unlink(("/dev/shm/" + name).c_str());
  }
};

kv::Geometry geometry() {
  cxlpool_kv_geometry_t g{};
  g.layers = 1;
  g.kv_heads = 1;
  g.head_dim = 64;
  g.dtype = CXLPOOL_KV_FP16;
  g.tokens_per_block = 16;  // 4 KiB blocks
  return kv::make_geometry(g, "test");
}

// What a hostile exporter can make: a table with header h and these handles, its check right
// for what is written, and a handle (its check right too) that claims `claimed_blocks`.
cxlpool_kv_handle_t forge(S::SharedPool& pool, kv::TableHeader h, const std::vector<cxlpool_shared_handle_t>& handles,
                          uint64_t claimed_blocks) {
  h.check = kv::table_check(h, handles.data(), handles.size());
  void* table = pool.alloc(sizeof h + handles.size() * sizeof(cxlpool_shared_handle_t));
  std::memcpy(table, &h, sizeof h);
  std::memcpy(static_cast<char*>(table) + sizeof h, handles.data(), handles.size() * sizeof(cxlpool_shared_handle_t));
  cxlpool_kv_handle_t out{};
  out.descriptor = pool.export_block(table);
  out.tokens = h.tokens;
  out.blocks = uint32_t(claimed_blocks);
  out.check = kv::handle_check(out);
  return out;
}

// A shared-pool handle re-signed after a change (its check is not a secret either).
cxlpool_shared_handle_t resign(cxlpool_shared_handle_t h) {
  h.check = S::crc32c(&h, offsetof(cxlpool_shared_handle_t, check), 0x48414e44u);
  return h;
}

cxlpool_status_t import_status(S::SharedPool& pool, const cxlpool_kv_handle_t& h, std::string* message) {
  try {
    std::vector<S::SharedPool*> pools{&pool};
    kv::View v(pools, nullptr, h);
    return CXLPOOL_OK;
  } catch (const Failure& f) {
    *message = f.what();
    return f.status();
  }
}

}  // namespace

TEST_CASE("a lying block table is refused and leaves no lease", "[kvcache]") {
  Pool pool;
  const kv::Geometry g = geometry();
  std::vector<void*> blocks;
  std::vector<cxlpool_shared_handle_t> handles;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(pool.p->alloc(g.block_bytes));
    handles.push_back(pool.p->export_block(blocks.back()));
  }
  kv::TableHeader h = kv::make_table_header(g, 40, 3, handles.data());
  std::string msg;
  // The honest table imports.
  REQUIRE(import_status(*pool.p, forge(*pool.p, h, handles, 3), &msg) == CXLPOOL_OK);
  struct Case {
    const char* what;
    kv::TableHeader header;
    std::vector<cxlpool_shared_handle_t> handles;
    uint64_t claimed;
    std::vector<cxlpool_status_t> statuses;
  };
  std::vector<Case> cases;
  auto with = [&](auto change) {
    Case c{"", h, handles, 3, {}};
    change(c);
    cases.push_back(c);
  };
  with([&](Case& c) {
    c.what = "a block beyond the pool";
    c.handles[1].offset = uint64_t(1) << 40;
    c.handles[1] = resign(c.handles[1]);
    c.statuses = {CXLPOOL_E_INVALID_ARGUMENT, CXLPOOL_E_NOT_FOUND};
  });
  with([&](Case& c) {
    c.what = "a block inside another block";
    c.handles[1].offset += 128;
    c.handles[1] = resign(c.handles[1]);
    c.statuses = {CXLPOOL_E_INVALID_ARGUMENT, CXLPOOL_E_NOT_FOUND, CXLPOOL_E_STALE};
  });
  with([&](Case& c) {
    c.what = "a block of another generation";
    c.handles[0].generation += 1;
    c.handles[0] = resign(c.handles[0]);
    c.statuses = {CXLPOOL_E_STALE, CXLPOOL_E_INVALID_ARGUMENT};
  });
  with([&](Case& c) {
    c.what = "a block of another pool";
    c.handles[0].pool_id[1] ^= 1;
    c.handles[0] = resign(c.handles[0]);
    c.statuses = {CXLPOOL_E_NOT_FOUND};
  });
  with([&](Case& c) {
    c.what = "a block smaller than a block";
    void* tiny = pool.p->alloc(128);
    c.handles[2] = pool.p->export_block(tiny);
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  with([&](Case& c) {
    c.what = "a freed block";
    void* gone = pool.p->alloc(g.block_bytes);
    c.handles[1] = pool.p->export_block(gone);
    pool.p->free(gone);
    c.statuses = {CXLPOOL_E_STALE, CXLPOOL_E_NOT_FOUND, CXLPOOL_E_INVALID_ARGUMENT};
  });
  with([&](Case& c) {
    c.what = "more tokens than its blocks hold";
    c.header.tokens = 3 * 16 + 1;
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  with([&](Case& c) {
    c.what = "a whole empty block";
    c.header.tokens = 2 * 16;
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  with([&](Case& c) {
    c.what = "an invalid geometry";
    c.header.geometry.layers = 0;
    c.statuses = {CXLPOOL_E_INVALID_ARGUMENT};
  });
  with([&](Case& c) {
    c.what = "another block size";
    c.header.block_bytes = g.block_bytes / 2;
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  with([&](Case& c) {
    c.what = "a billion blocks claimed";
    c.header.blocks = 1000000000;
    c.claimed = 1000000000;
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  with([&](Case& c) {
    c.what = "a block count the handle does not have";
    c.claimed = 2;
    c.statuses = {CXLPOOL_E_CORRUPT};
  });
  for (const Case& c : cases) {
    INFO(c.what);
    const cxlpool_status_t st = import_status(*pool.p, forge(*pool.p, c.header, c.handles, c.claimed), &msg);
    INFO("status " << int(st) << ": " << msg);
    bool expected = false;
    for (cxlpool_status_t s : c.statuses) expected |= st == s;
    CHECK(expected);
    CHECK(pool.p->info().leases_held == 0);
    WARN(c.what << " -> " << msg);
  }
}

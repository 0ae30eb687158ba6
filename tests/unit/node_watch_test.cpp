// SPDX-License-Identifier: MIT
// Memory hot-remove and hot-add under a numa device, on a copy of a fixture sysfs tree whose
// node meminfo the test rewrites: the device shrinks to what the node has (moving what it
// holds to the pool's other device first, losing nothing), new memory goes elsewhere, a
// capacity someone set is kept, and the device grows back when the memory returns. Passes run
// through cxlpool_device_watch_nodes, so nothing depends on the watcher thread's timing.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "elastic_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace cxlpool_test::elastic;

namespace {

constexpr uint64_t kGiB = uint64_t(1) << 30;

// The one-node fixture copied where the test may change it.
struct NodeTree {
  cxlpool_test::ScratchDir dir;
  NodeTree() {
    fs::copy(std::string(CXLPOOL_FIXTURE_DIR) + "/one-node", dir.path(),
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
  std::string sys() const { return dir.path() + "/sys"; }
  std::string node_dir() const { return sys() + "/devices/system/node/node0"; }
  void set_online(const char* nodes) const {
    std::ofstream f(sys() + "/devices/system/node/online", std::ios::trunc);
    f << nodes << "\n";
    REQUIRE(f.good());
  }
  void set_memory(uint64_t bytes) const {
    std::ofstream f(node_dir() + "/meminfo", std::ios::trunc);
    f << "Node 0 MemTotal:       " << bytes / 1024 << " kB\n"
      << "Node 0 MemFree:        " << bytes / 2048 << " kB\n";
    REQUIRE(f.good());
  }
};

struct TreeTopo {
  cxlpool_topology_t* topo = nullptr;
  TreeTopo(const NodeTree& tree, const std::string& devices) {
    cxlpool_config_t* c = nullptr;
    REQUIRE(cxlpool_config_create(&c) == CXLPOOL_OK);
    cxlpool_config_set_devices(c, devices.c_str());
    cxlpool_config_set_sysfs_root(c, tree.sys().c_str());
    cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
    const cxlpool_status_t st = cxlpool_topology_discover(c, &topo);
    cxlpool_config_destroy(c);
    INFO(cxlpool_last_error_message());
    REQUIRE(st == CXLPOOL_OK);
  }
  ~TreeTopo() { cxlpool_topology_destroy(topo); }
  cxlpool_pool_t* pool(const char* devices, const char* policy) {
    cxlpool_pool_params_t* p = nullptr;
    cxlpool_pool_params_create(&p);
    cxlpool_pool_params_set_devices(p, devices);
    cxlpool_pool_params_set_policy(p, policy);
    cxlpool_pool_t* out = nullptr;
    const cxlpool_status_t st = cxlpool_pool_create(topo, p, &out);
    cxlpool_pool_params_destroy(p);
    INFO(cxlpool_last_error_message());
    REQUIRE(st == CXLPOOL_OK);
    return out;
  }
};

uint64_t resident(cxlpool_pool_t* pool, int dev) {
  cxlpool_stats_t s{};
  REQUIRE(cxlpool_pool_get_stats(pool, dev, &s) == CXLPOOL_OK);
  return s.resident_bytes;
}

void watch() { REQUIRE(cxlpool_device_watch_nodes(nullptr) == CXLPOOL_OK); }

}  // namespace

TEST_CASE("a numa device follows its node's memory: removal shrinks it, moving what it holds, and return grows it",
          "[unit]") {
  NodeTree tree;
  tree.set_memory(16 * kGiB);
  TreeTopo t(tree, "numa0:backing=numa:0,size=64M;shm0:backing=shm,size=256M");
  cxlpool_pool_t* pool = t.pool("numa0,shm0", "preferred:numa0,shm0");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  // The node's memory has not changed: nothing does.
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 64 * kMiB);
  CHECK(capacity_of("numa0").shrinks == 0);

  // Most of the node's memory is offlined: the device keeps what the node has, and what it
  // held beyond that moved to the pool's other device first. Nothing is lost.
  tree.set_memory(16 * kMiB);
  watch();
  cxlpool_device_capacity_t c = capacity_of("numa0");
  CHECK(c.capacity_bytes == 16 * kMiB);
  CHECK(c.lost_bytes == 0);
  if (copies_fenced()) {
    CHECK(c.committed_bytes <= 16 * kMiB);
    CHECK(c.evacuated_units >= 1);
    CHECK(resident(pool, 0) <= 16 * kMiB);
    CHECK(resident(pool, 1) >= 24 * kMiB);
  } else {
    // A copy to the shm device needs a write fence this user cannot have: the units stay, and
    // the device's committed bytes wait above its capacity for frees.
    WARN("no userfaultfd for this user: units stay on the numa device");
    CHECK(c.committed_bytes > c.capacity_bytes);
  }
  CHECK(all_intact(blocks));
  // New memory goes where there is room.
  const uint64_t far_before = resident(pool, 1);
  std::vector<Block> more;
  for (unsigned i = 0; i < 4; ++i) {
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, 4 * kMiB)), 4 * kMiB, 100 + i};
    REQUIRE(b.p != nullptr);
    fill(b);
    more.push_back(b);
  }
  if (copies_fenced())
    CHECK(capacity_of("numa0").committed_bytes <= 16 * kMiB);
  else
    CHECK(resident(pool, 1) >= far_before + 16 * kMiB);

  // A capacity set meanwhile is the device's own: never past the node's memory now, bounded by
  // the node's memory as it changes, and what the device returns to when the memory comes
  // back. Units that moved off come home while it has room.
  CHECK(cxlpool_device_resize("numa0", 24 * kMiB, nullptr) == CXLPOOL_E_CAPACITY);
  CHECK(std::string(cxlpool_last_error_message()).find("more than node 0 has (16.0 MiB") != std::string::npos);
  REQUIRE(cxlpool_device_resize("numa0", 14 * kMiB, nullptr) == CXLPOOL_OK);
  tree.set_memory(12 * kMiB);
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 12 * kMiB);
  tree.set_memory(16 * kGiB);
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 14 * kMiB);
  REQUIRE(cxlpool_device_resize("numa0", 64 * kMiB, nullptr) == CXLPOOL_OK);
  watch();
  c = capacity_of("numa0");
  CHECK(c.capacity_bytes == 64 * kMiB);
  CHECK(c.lost_bytes == 0);
  if (copies_fenced()) CHECK(resident(pool, 0) > 16 * kMiB);
  CHECK(all_intact(blocks));
  CHECK(all_intact(more));

  // The root of the tree unreadable: unknown, nothing changes.
  fs::rename(tree.sys(), tree.sys() + ".away");
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 64 * kMiB);
  fs::rename(tree.sys() + ".away", tree.sys());
  // The node's directory gone while the kernel still lists the node online: unknown too.
  fs::rename(tree.node_dir(), tree.node_dir() + ".gone");
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 64 * kMiB);
  // The node disappears altogether (no longer online): no capacity; new memory goes to the
  // other device.
  tree.set_online("");
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 0);
  const uint64_t far_now = resident(pool, 1);
  void* p = cxlpool_malloc(pool, 8 * kMiB);
  REQUIRE(p);
  CHECK(resident(pool, 1) >= far_now + 8 * kMiB);
  cxlpool_free(p);
  CHECK(all_intact(blocks));

  // A meminfo that cannot be read is unknown: nothing changes. (Written before the node comes
  // back: the watcher's own thread may run a pass at any moment, and must never see the node's
  // old meminfo here.)
  {
    std::ofstream f(tree.node_dir() + ".gone/meminfo", std::ios::trunc);
    f << "Node 0 MemTotal: lots kB\n";
  }
  fs::rename(tree.node_dir() + ".gone", tree.node_dir());
  tree.set_online("0");
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 0);
  for (const char* text :
       {"Node 0 MemTotal:  20 MB\n", "Node 0 NotMemTotal:  16777216 kB\n", "Node 1 MemTotal:  16777216 kB\n"}) {
    INFO(text);
    std::ofstream f(tree.node_dir() + "/meminfo", std::ios::trunc);
    f << text;
    f.close();
    watch();
    CHECK(capacity_of("numa0").capacity_bytes == 0);
  }
  tree.set_memory(16 * kGiB);
  watch();
  CHECK(capacity_of("numa0").capacity_bytes == 64 * kMiB);
  for (const Block& b : blocks) cxlpool_free(b.p);
  for (const Block& b : more) cxlpool_free(b.p);
}

TEST_CASE("a pool with only the numa device loses nothing when its node's memory goes: new memory waits", "[unit]") {
  NodeTree tree;
  tree.set_memory(16 * kGiB);
  TreeTopo t(tree, "solo:backing=numa:0,size=64M");
  cxlpool_pool_t* pool = t.pool("solo", "bind:solo");
  PoolGuard guard{pool};
  std::vector<Block> blocks = allocate_until(pool, 0, 40 * kMiB);
  tree.set_memory(16 * kMiB);
  watch();
  const cxlpool_device_capacity_t c = capacity_of("solo");
  CHECK(c.capacity_bytes == 16 * kMiB);
  CHECK(c.lost_bytes == 0);
  CHECK(c.committed_bytes > c.capacity_bytes);  // waits for frees
  CHECK(all_intact(blocks));
  errno = 0;
  CHECK(cxlpool_malloc(pool, 8 * kMiB) == nullptr);
  CHECK(errno == ENOMEM);
  for (const Block& b : blocks) cxlpool_free(b.p);
  REQUIRE(cxlpool_pool_trim(pool, nullptr) == CXLPOOL_OK);
  void* p = cxlpool_malloc(pool, 8 * kMiB);
  CHECK(p != nullptr);
  cxlpool_free(p);
}

TEST_CASE("a discovered node target is its node's memory: it follows growth too, until resized", "[unit]") {
  NodeTree tree;
  tree.set_memory(64 * kMiB);
  TreeTopo t(tree, "");
  cxlpool_pool_t* pool = t.pool("node0", "bind:node0");
  PoolGuard guard{pool};
  CHECK(capacity_of("node0").capacity_bytes == 64 * kMiB);
  tree.set_memory(96 * kMiB);  // memory added to the node (kmem, a DCD extent onlined)
  watch();
  CHECK(capacity_of("node0").capacity_bytes == 96 * kMiB);
  tree.set_memory(32 * kMiB);
  watch();
  CHECK(capacity_of("node0").capacity_bytes == 32 * kMiB);
  // A capacity set by the program is the device's own from then on: the node only bounds it.
  REQUIRE(cxlpool_device_resize("node0", 16 * kMiB, nullptr) == CXLPOOL_OK);
  tree.set_memory(128 * kMiB);
  watch();
  CHECK(capacity_of("node0").capacity_bytes == 16 * kMiB);
}

TEST_CASE("the watcher thread follows the node without being asked", "[unit]") {
  NodeTree tree;
  tree.set_memory(16 * kGiB);
  TreeTopo t(tree, "numa1:backing=numa:0,size=64M");
  cxlpool_pool_t* pool = t.pool("numa1", "bind:numa1");
  PoolGuard guard{pool};
  tree.set_memory(32 * kMiB);
  // Its period is a second; the bound is for a machine busy with other work.
  for (int i = 0; i < 1200 && capacity_of("numa1").capacity_bytes != 32 * kMiB; ++i) usleep(50 * 1000);
  CHECK(capacity_of("numa1").capacity_bytes == 32 * kMiB);
  tree.set_memory(16 * kGiB);
  for (int i = 0; i < 1200 && capacity_of("numa1").capacity_bytes != 64 * kMiB; ++i) usleep(50 * 1000);
  CHECK(capacity_of("numa1").capacity_bytes == 64 * kMiB);
}

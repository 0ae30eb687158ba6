// SPDX-License-Identifier: MIT
// Memory hot-remove and hot-add of a real NUMA node in the guest (plan "hotremove": node1 is a
// device-DAX range onlined as movable system RAM by kmem). A pool prefers node1 and falls back
// to node0. 1. The kernel takes node1's memory away (every memory block offlined) while the
// pool holds 48 MiB there: the kernel migrates the pages, cxlpool's watcher thread follows
// (node1's device to no capacity, its units moved to node0 in the ledgers), the bytes stay,
// new memory goes to node0; onlined again, the device grows back and the units return to
// node1. 2. cxlpool starts the removal itself (a resize of node1's device) before the kernel
// offlines: none of the pool's pages is left on node1 for the kernel to move.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.h"
#include "vm_numa.hpp"

namespace {

int passed = 0, failed = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok" : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

constexpr size_t kMiB = size_t(1) << 20;

std::vector<std::string> node_blocks(int node) {
  std::vector<std::string> out;
  const std::string dir = "/sys/devices/system/node/node" + std::to_string(node);
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strncmp(e->d_name, "memory", 6) == 0 && e->d_name[6] >= '0' && e->d_name[6] <= '9')
        out.push_back(std::string("/sys/devices/system/memory/") + e->d_name + "/state");
    closedir(d);
  }
  return out;
}

// Every block of node to `state` ("offline", "online_movable"); the blocks that took it.
size_t set_blocks(const std::vector<std::string>& blocks, const std::string& state) {
  const std::string want = state == "offline" ? "offline" : "online";
  size_t done = 0;
  for (const std::string& b : blocks) {
    for (int attempt = 0; attempt < 5 && vmtest::read_knob(b).rfind(want, 0) != 0; ++attempt) {
      if (vmtest::write_knob(b, state)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // EBUSY: pages still moving
    }
    done += vmtest::read_knob(b).rfind(want, 0) == 0;
  }
  return done;
}

// MemTotal of a node in bytes (0 when unreadable).
uint64_t node_total(int node) {
  std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("MemTotal:");
    if (at != std::string::npos) return std::stoull(line.substr(at + 9)) * 1024;
  }
  return 0;
}

cxlpool_device_capacity_t capacity_of(const char* dev) {
  cxlpool_device_capacity_t c{};
  cxlpool_device_get_capacity(dev, &c);
  return c;
}
uint64_t resident(cxlpool_pool_t* pool, int dev) {
  cxlpool_stats_t s{};
  cxlpool_pool_get_stats(pool, dev, &s);
  return s.resident_bytes;
}

struct Block {
  unsigned char* p;
  size_t n;
  unsigned seed;
};
void fill(const Block& b) {
  for (size_t i = 0; i < b.n; i += 512) b.p[i] = static_cast<unsigned char>(b.seed + i / 512);
}
bool intact(const std::vector<Block>& blocks) {
  for (const Block& b : blocks)
    for (size_t i = 0; i < b.n; i += 512)
      if (b.p[i] != static_cast<unsigned char>(b.seed + i / 512)) return false;
  return true;
}
vmtest::Count where(const std::vector<Block>& blocks, int node) {
  vmtest::Count total;
  for (const Block& b : blocks) {
    vmtest::Count c = vmtest::count_on(b.p, b.n / vmtest::kPage, node);
    total.on += c.on;
    total.elsewhere += c.elsewhere;
    total.absent += c.absent;
  }
  return total;
}

// Waits (guest time; TCG is slow) for the watcher thread to bring node1's capacity to want.
double wait_capacity(uint64_t want) {
  const auto t0 = std::chrono::steady_clock::now();
  while (capacity_of("node1").capacity_bytes != want &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The capacity changes before the units move: a pass of our own waits for the thread's.
  cxlpool_device_watch_nodes(nullptr);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  // The CXL guest passes a smaller size: its node1 is emulated MMIO, ~100x slower than node0.
  const size_t held = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 48) * kMiB;
  const std::string held_text = std::to_string(held >> 20) + " MiB";
  const std::vector<std::string> blocks1 = node_blocks(1);
  check(!blocks1.empty(), "node1 has " + std::to_string(blocks1.size()) + " memory blocks");
  if (blocks1.empty()) return 1;
  cxlpool_config_t* cfg = nullptr;
  cxlpool_config_create(&cfg);
  cxlpool_config_set_flags(cfg, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_topology_t* topo = nullptr;
  if (cxlpool_topology_discover(cfg, &topo) != CXLPOOL_OK) {
    check(false, std::string("discovery: ") + cxlpool_last_error_message());
    return 1;
  }
  cxlpool_config_destroy(cfg);
  cxlpool_pool_params_t* params = nullptr;
  cxlpool_pool_params_create(&params);
  cxlpool_pool_params_set_devices(params, "node1,node0");
  cxlpool_pool_params_set_policy(params, "preferred:node1,node0");
  cxlpool_pool_t* pool = nullptr;
  if (cxlpool_pool_create(topo, params, &pool) != CXLPOOL_OK) {
    check(false, std::string("pool: ") + cxlpool_last_error_message());
    return 1;
  }
  cxlpool_pool_params_destroy(params);
  int n1 = -1, n0 = -1;
  cxlpool_pool_find_device(pool, "node1", &n1);
  cxlpool_pool_find_device(pool, "node0", &n0);
  const uint64_t declared = capacity_of("node1").capacity_bytes;
  std::printf("node1: %zu blocks, device capacity %llu MiB\n", blocks1.size(), (unsigned long long)(declared >> 20));

  // ---- 1. the kernel removes node1's memory under the pool --------------------------------
  std::vector<Block> blocks;
  for (unsigned i = 0; resident(pool, n1) < held; ++i) {
    const size_t n = (i % 4 + 1) * kMiB;
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, n)), n, i};
    if (!b.p) break;
    fill(b);
    blocks.push_back(b);
  }
  vmtest::Count before = where(blocks, 1);
  check(before.on > 0 && before.elsewhere == 0,
        "the pool's " + held_text + " are on node1 (" + vmtest::describe(before) + ")");
  auto t0 = std::chrono::steady_clock::now();
  const size_t off = set_blocks(blocks1, "offline");
  const double offline_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check(off == blocks1.size(), "every block of node1 offline (" + std::to_string(off) + " of " +
                                   std::to_string(blocks1.size()) + ", " + std::to_string(offline_s) + " s)");
  const double followed = wait_capacity(0);
  cxlpool_device_capacity_t c = capacity_of("node1");
  check(c.capacity_bytes == 0, "the watcher thread followed: node1's device has no capacity (" +
                                   std::to_string(followed) + " s after the offline)");
  check(c.lost_bytes == 0, "nothing lost");
  check(resident(pool, n1) == 0 && resident(pool, n0) >= held,
        "the ledgers moved the units to node0 (node1 " + std::to_string(resident(pool, n1) >> 20) + " MiB, node0 " +
            std::to_string(resident(pool, n0) >> 20) + " MiB)");
  vmtest::Count after = where(blocks, 1);
  check(after.on == 0, "no page on node1 (" + vmtest::describe(after) + ")");
  check(intact(blocks), "every byte intact");
  std::vector<Block> more;
  for (unsigned i = 0; i < 8; ++i) {
    Block b{static_cast<unsigned char*>(cxlpool_malloc(pool, 2 * kMiB)), 2 * kMiB, 1000 + i};
    if (!b.p) break;
    fill(b);
    more.push_back(b);
  }
  check(more.size() == 8 && where(more, 0).on == 8 * 2 * kMiB / vmtest::kPage, "new memory is on node0");

  const size_t on = set_blocks(blocks1, "online_movable");
  check(on == blocks1.size(), "node1 online again (" + std::to_string(on) + " blocks)");
  // node1 is a discovered node target: its device is the node's memory.
  const uint64_t back = node_total(1) / vmtest::kPage * vmtest::kPage;
  const double grew = wait_capacity(back);
  c = capacity_of("node1");
  check(c.capacity_bytes == back && back > 0, "node1's device grew back to " + std::to_string(back >> 20) +
                                                  " MiB (declared " + std::to_string(declared >> 20) + " MiB; " +
                                                  std::to_string(grew) + " s)");
  vmtest::Count home = where(blocks, 1);
  check(home.on == before.on, "the units came home to node1 (" + vmtest::describe(home) + ")");
  check(intact(blocks) && intact(more), "every byte intact");

  // ---- 2. cxlpool starts the removal: nothing of the pool is left for the kernel to move -----
  cxlpool_capacity_report_t r{};
  const uint64_t all = capacity_of("node1").capacity_bytes;
  const cxlpool_status_t s = cxlpool_device_release_extent("node1", 0, all, 10000, 0, &r);
  check(s == CXLPOOL_OK, std::string("node1's device released whole first: ") +
                             (s == CXLPOOL_OK ? std::to_string(r.evacuated_bytes >> 20) + " MiB moved off"
                                              : cxlpool_last_error_message()));
  vmtest::Count left = where(blocks, 1);
  check(left.on == 0, "none of the pool's pages on node1 before the offline (" + vmtest::describe(left) + ")");
  const size_t off2 = set_blocks(blocks1, "offline");
  check(off2 == blocks1.size(), "every block of node1 offline again");
  check(intact(blocks), "every byte intact");
  set_blocks(blocks1, "online_movable");
  for (const Block& b : blocks) cxlpool_free(b.p);
  for (const Block& b : more) cxlpool_free(b.p);
  cxlpool_pool_destroy(pool);
  cxlpool_topology_destroy(topo);
  std::printf("vm_hotremove: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

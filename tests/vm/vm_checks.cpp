// SPDX-License-Identifier: MIT
// Placement checks run inside the multi-node test guest: every NUMA node target, and a
// numa:N device declared on every CPU-less node, gets memory committed through a cxlpool
// backing and verified page by page with move_pages status queries; capacity is enforced.
#include <sys/mman.h>

#include <cstdio>
#include <string>

#include "cxlpool/cxlpool.hpp"

namespace {
int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

// Commits 8 MiB on the target and checks every page is on the expected node.
void placement(const cxlpool::Topology& topo, const cxlpool::Target& t, int expected_node) {
  constexpr size_t kBytes = size_t(8) << 20;
  auto backing = cxlpool::Backing::open(topo, t);
  auto r = backing.reserve(kBytes);
  madvise(r.data(), r.size(), MADV_NOHUGEPAGE);
  r.commit(0, r.size(), CXLPOOL_COMMIT_POPULATE);
  auto nodes = cxlpool::query_nodes(r.data(), r.size() / 4096);
  size_t on = 0;
  for (int n : nodes) on += n == expected_node;
  check(on == nodes.size(), std::string(t.name()) + ": " + std::to_string(on) + "/" + std::to_string(nodes.size()) +
                                " pages on node " + std::to_string(expected_node) + " (move_pages status query)");
}
}  // namespace

int main() {
  try {
    cxlpool::Config plain;
    plain.flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
    auto topo = cxlpool::Topology::discover(&plain);
    std::string declared;
    for (auto& t : topo.targets()) {
      if (t.kind() != CXLPOOL_TARGET_NUMA_NODE) continue;
      placement(topo, t, t.numa_node());
      if (t.cpuless())
        declared += (declared.empty() ? "" : ";") + std::string("far") + std::to_string(t.numa_node()) +
                    ":backing=numa:" + std::to_string(t.numa_node()) + ",size=32M";
    }
    check(!declared.empty(), "the guest has at least one CPU-less node");
    cxlpool::Config with_devices;
    with_devices.devices(declared).flags(CXLPOOL_CONFIG_IGNORE_ENV);
    auto topo2 = cxlpool::Topology::discover(&with_devices);
    for (auto& t : topo2.targets()) {
      if (t.kind() != CXLPOOL_TARGET_EMULATED) continue;
      placement(topo2, t, t.numa_node());
      auto backing = cxlpool::Backing::open(topo2, t);
      auto r = backing.reserve(size_t(64) << 20);
      r.commit(0, size_t(32) << 20);
      cxlpool_status_t st = cxlpool_backing_commit(backing.get(), static_cast<char*>(r.data()) + (32 << 20), 4096, 0);
      check(st == CXLPOOL_E_CAPACITY, std::string(t.name()) + ": commit past size=32M fails with CAPACITY");
    }
    auto k = topo.kernel_state();
    std::printf("weighted_interleave=%d\n", int(k.weighted_interleave.value));
  } catch (const cxlpool::Error& e) {
    check(false, std::string("cxlpool error: ") + e.what());
  }
  std::printf("vm_checks: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

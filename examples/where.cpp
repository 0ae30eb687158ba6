// SPDX-License-Identifier: MIT
// Example: where did my allocations land? Runs one allocation pattern under the policy given
// on the command line and prints, per device, how many blocks and bytes it received, checking
// NUMA devices page by page with the kernel (move_pages status query).
// Usage: where 'interleave:node0=3,cxl0=1'   (docs/policy.md)
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.hpp"

int main(int argc, char** argv) {
  std::string policy = argc > 1 ? argv[1] : "ratio:near=1,far=1";
  try {
    auto topo = cxlpool::Topology::discover();
    auto pool = cxlpool::Pool::create(topo, {"", policy, "where"});
    std::printf("policy: %s\n", std::string(pool.policy()).c_str());
    struct Tally {
      size_t blocks = 0, bytes = 0, pages_checked = 0, pages_on_node = 0;
    };
    std::map<std::string, Tally> by_device;
    std::vector<void*> blocks;
    for (int i = 0; i < 4000; ++i) {
      size_t size = i % 100 == 0 ? (3 << 20) : 4096;
      void* p = pool.allocate(size);
      static_cast<char*>(p)[0] = 1;
      auto info = cxlpool::ptr_info(p);
      Tally& t = by_device[info->device_name];
      ++t.blocks;
      t.bytes += size;
      auto target = topo.target(info->target_index);
      if (target.backing() == CXLPOOL_BACKING_NUMA && reinterpret_cast<uintptr_t>(p) % 4096 == 0) {
        ++t.pages_checked;
        t.pages_on_node += cxlpool::query_nodes(p, 1)[0] == target.numa_node();
      }
      blocks.push_back(p);
    }
    for (auto& [dev, t] : by_device) {
      std::printf("%-8s %5zu blocks %9.1f MiB", dev.c_str(), t.blocks, t.bytes / 1048576.0);
      if (t.pages_checked)
        std::printf("   kernel: %zu/%zu checked pages on the device's node", t.pages_on_node, t.pages_checked);
      std::printf("\n");
    }
    for (void* p : blocks) cxlpool::Pool::deallocate(p);
    return 0;
  } catch (const cxlpool::Error& e) {
    std::fprintf(stderr, "where: %s\n", e.what());
    return 1;
  }
}

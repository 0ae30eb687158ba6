// SPDX-License-Identifier: MIT
// Example: standard containers in far memory through std::pmr. A vector of embeddings lives on
// the pool's slowest tier, an index on the fastest, and cxlpool says where each landed.
#include <cstdio>
#include <memory_resource>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.hpp"

int main() {
  try {
    auto topo = cxlpool::Topology::discover();  // CXLPOOL_DEVICES, or the default emulated device
    auto pool = cxlpool::Pool::create(topo);    // every target, policy bind:near
    std::printf("pool devices:");
    for (int i = 0; i < pool.device_count(); ++i)
      std::printf(" %s(tier %d)", std::string(pool.device_name(i)).c_str(), pool.device_tier(i));
    std::printf("\n");

    std::pmr::vector<float> embeddings(&pool.resource(cxlpool::Tier::far));
    embeddings.resize(4 << 20, 0.5f);  // 16 MiB of cold data
    std::pmr::vector<int> index(&pool.resource(cxlpool::Tier::near));
    index.resize(1 << 16, 1);
    std::pmr::vector<std::pmr::string> names(&pool.resource(cxlpool::Tier::far));
    names.emplace_back("kv-block-0001, long enough not to fit a short string buffer");

    for (auto [what, p] : {std::pair<const char*, const void*>{"embeddings", embeddings.data()},
                           {"index", index.data()},
                           {"names[0]", names[0].data()}}) {
      auto info = cxlpool::ptr_info(p);
      std::printf("%-11s -> %s (tier %d, block %zu bytes)\n", what, info->device_name, info->tier, info->block_size);
    }
    std::printf("%s", pool.stats_json().c_str());
    return 0;
  } catch (const cxlpool::Error& e) {
    std::fprintf(stderr, "pmr_far: %s\n", e.what());
    return 1;
  }
}

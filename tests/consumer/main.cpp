// SPDX-License-Identifier: MIT
// Consumer of the installed C++ layer: discover and list target names and tiers.
#include <cxlpool/cxlpool.hpp>
#include <iostream>

int main() {
  auto topo = cxlpool::Topology::discover();
  for (auto& t : topo.targets()) std::cout << "consumer (C++): " << t.name() << " tier " << t.tier() << "\n";
  return topo.size() > 0 ? 0 : 1;
}

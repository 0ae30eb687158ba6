// SPDX-License-Identifier: MIT
// Definitions of the opaque C handle types: each wraps the internal C++ object it names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "topology/model.hpp"

struct cxlpool_config {
  cxlpool::detail::DiscoverOptions options;
};

struct cxlpool_topology {
  struct Component {
    cxlpool_component_kind_t kind;
    std::string name, mode, detail;
    uint64_t size;
    int numa_node;
  };
  cxlpool::detail::Topology model;
  std::vector<Component> components;  // flattened inventory for the C getters
};

// A raw backing: a borrowed Device and the ledger client its reservations are counted under.
struct cxlpool_backing {
  std::shared_ptr<cxlpool::detail::Device> device;
  int client = 0;
};

// SPDX-License-Identifier: MIT
// A topology discovered through the C API from a device list (the token $DIR stands for a
// scratch directory made for it), and pools over it: the fixture of the allocator and device
// tests.
#pragma once

#include <string>

#include "cxlpool/cxlpool.h"
#include "test_support.hpp"

namespace cxlpool_test {

class CapiTopology {
 public:
  explicit CapiTopology(const std::string& devices,
                        uint32_t flags = CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC) {
    cxlpool_config_t* c = nullptr;
    REQUIRE(cxlpool_config_create(&c) == CXLPOOL_OK);
    std::string text = devices;
    for (size_t at; (at = text.find("$DIR")) != std::string::npos;) text.replace(at, 4, dir.path());
    cxlpool_config_set_devices(c, text.c_str());
    cxlpool_config_set_flags(c, flags);
    cxlpool_status_t st = cxlpool_topology_discover(c, &topo);
    cxlpool_config_destroy(c);
    INFO(cxlpool_last_error_message());
    REQUIRE(st == CXLPOOL_OK);
  }
  ~CapiTopology() { cxlpool_topology_destroy(topo); }
  CapiTopology(const CapiTopology&) = delete;
  CapiTopology& operator=(const CapiTopology&) = delete;

  // A pool over devices (comma-separated target names) with policy; REQUIREs success.
  cxlpool_pool_t* pool(const std::string& devices, const std::string& policy,
                       cxlpool_sharing_t sharing = CXLPOOL_SHARING_PRIVATE) {
    cxlpool_pool_params_t* p = nullptr;
    cxlpool_pool_params_create(&p);
    cxlpool_pool_params_set_devices(p, devices.c_str());
    cxlpool_pool_params_set_policy(p, policy.c_str());
    cxlpool_pool_params_set_sharing(p, sharing);
    cxlpool_pool_t* out = nullptr;
    cxlpool_status_t st = cxlpool_pool_create(topo, p, &out);
    cxlpool_pool_params_destroy(p);
    INFO(cxlpool_last_error_message());
    REQUIRE(st == CXLPOOL_OK);
    return out;
  }

  ScratchDir dir;
  cxlpool_topology_t* topo = nullptr;
};

}  // namespace cxlpool_test

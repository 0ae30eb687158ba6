// SPDX-License-Identifier: MIT
// The monitor kinds behind monitor.hpp, one file each (monitor_<kind>.cpp), and what
// detect_monitors()/make_monitor() (monitor_registry.cpp) call on them.
#pragma once

#include <memory>
#include <string>

#include "tiering/monitor.hpp"

namespace cxlpool::detail::tiering {

MonitorAvailability detect_pagemap_scan();
// make_pagemap_scan_monitor (monitor_pagemap_scan.hpp) takes options.

MonitorAvailability detect_sample();
// make_sample (monitor_sample.hpp) takes options.

// The kernel's own monitors (monitor_kernel.cpp): detected, never instantiated here.
MonitorAvailability detect_damon();
MonitorAvailability detect_perf();
MonitorAvailability detect_numa_balancing();

// "EPERM", "ENOENT", ... (the symbolic name, for reasons a person acts on).
std::string errno_name(int e);

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// detect_monitors() and make_monitor() (monitor.hpp): every kind in a fixed order with its
// availability, and instances of the kinds cxlpool implements (pagemap_scan, sample).
#include <cerrno>

#include "tiering/monitor_internal.hpp"
#include "tiering/monitor_pagemap_scan.hpp"
#include "tiering/monitor_sample.hpp"

namespace cxlpool::detail::tiering {
namespace {

constexpr const char* kHintReason = "explicit cxlpool_hint_access/cxlpool_pin calls";

MonitorAvailability detect_hint() { return MonitorAvailability{true, kHintReason}; }

struct Kind {
  const char* name;
  MonitorAvailability (*detect)();
};
constexpr Kind kKinds[] = {
    {"hint", detect_hint},     {"pagemap_scan", detect_pagemap_scan},
    {"sample", detect_sample}, {"damon", detect_damon},
    {"perf", detect_perf},     {"numa_balancing", detect_numa_balancing},
};

}  // namespace

std::vector<MonitorInfo> detect_monitors() {
  std::vector<MonitorInfo> out;
  for (const Kind& k : kKinds) out.push_back(MonitorInfo{k.name, k.detect()});
  return out;
}

std::unique_ptr<Monitor> make_monitor(std::string_view name, std::string* why_not) {
  std::string why;
  std::unique_ptr<Monitor> m;
  if (name == "hint") {
    why = "hint is not a monitor to instantiate: the engine owns hints (cxlpool_hint_access/cxlpool_pin)";
  } else if (name == "pagemap_scan") {
    m = make_pagemap_scan_monitor(PagemapScanOptions{}, &why);
  } else if (name == "sample") {
    m = make_sample_monitor(SampleOptions{}, &why);
  } else if (name == "damon" || name == "perf" || name == "numa_balancing") {
    MonitorAvailability a = name == "damon" ? detect_damon() : name == "perf" ? detect_perf() : detect_numa_balancing();
    why = a.available ? std::string(name) + " gives no per-range heat to cxlpool: " + a.reason : a.reason;
  } else {
    why = "unknown monitor \"" + std::string(name) + "\" (hint, pagemap_scan, sample, damon, perf, numa_balancing)";
  }
  if (!m && why_not) *why_not = why;
  return m;
}

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// The "sample" monitor's knobs (monitor_sample.cpp): how many pages it may arm per interval.
// Every armed page that the program touches costs it one SIGSEGV round trip (fault, handler,
// mprotect, return: measured in docs/tiering.md); the cap keeps that under max_overhead of one
// core's time between two collects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tiering/monitor.hpp"

namespace cxlpool::detail::tiering {

struct SampleOptions {
  double max_overhead = 0.05;     // of the time between two collects, if every armed page is touched
  uint32_t fault_cost_ns = 5000;  // what one first touch costs the program (measured: 2-4 us)
  size_t min_pages = 16;          // armed per collect even after a very short interval
  size_t max_pages = 2048;        // armed at once (each may split a VMA in three: max_map_count)
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// Pages to arm for an interval of interval_ns: the overhead cap, clamped to [min, max].
size_t sample_budget(const SampleOptions& o, uint64_t interval_ns) noexcept;

std::unique_ptr<Monitor> make_sample_monitor(const SampleOptions& options, std::string* why_not);

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// The "sample" monitor's knobs (monitor_sample.cpp): how many pages it may arm per period.
// Every armed page costs the program a protection change (a TLB-flush IPI) and, when touched,
// one SIGSEGV round trip (fault, handler, mprotect, return: measured in docs/tiering.md); the
// cap keeps that under the period's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tiering/monitor.hpp"

namespace cxlpool::detail::tiering {

struct SampleOptions {
  uint32_t fault_cost_ns = 8000;  // what one armed page costs the program if touched (measured: 3.2 us
                                  // for the touch, ~5 us for the IPI of the protection change)
  size_t min_pages = 16;          // armed per collect even after a very short interval
  size_t max_pages = 2048;        // armed at once (each may split a VMA in three: max_map_count)
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// Pages to arm for a period whose budget is budget_ns, clamped to [min, max].
size_t sample_budget(const SampleOptions& o, uint64_t budget_ns) noexcept;

std::unique_ptr<Monitor> make_sample_monitor(const SampleOptions& options, std::string* why_not);
// In a fork child (the atfork handler): pages the parent's monitor armed are made accessible
// again, the trap table emptied, and a new monitor may be made.
void sample_after_fork_child() noexcept;

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// The "pagemap_scan" monitor's cost model (monitor_pagemap_scan.cpp): what arming costs the
// program, and how a period's budget becomes exact arming of every watched range or a
// sample of chunks spread evenly over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tiering/monitor.hpp"

namespace cxlpool::detail::tiering {

struct PagemapScanOptions {
  // The program's first write to an armed page takes an async write-protect fault that the
  // kernel resolves (measured here: 0.68 us alone, 0.9-1.3 us inside a random-update loop).
  uint32_t fault_cost_ns = 1700;
  // Each UFFDIO_WRITEPROTECT that changes page table entries flushes the TLB of every CPU the
  // program runs on: an IPI, and the TLB refills after it. A random-update loop on the other
  // vCPU lost ~12 us per call in isolation and ~1.7x that inside bench/tiering (two runs),
  // so both costs here are set to what bench/tiering measures (docs/tiering.md: "what arming
  // costs"). Bare metal pays less; the defaults are this VM's.
  uint32_t protect_cost_ns = 21000;
  // Pages per sampled chunk: one protection call per chunk, so calls and faults cost about the
  // same when every page of a chunk is written.
  uint32_t chunk_pages = 16;
  size_t max_chunks = 4096;  // per period (the monitor's table)
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// How a period is armed: every watched range whole (exact), or `chunks` chunks of
// `chunk_pages` pages at an even stride over the ranges taken end to end.
struct PagemapScanPlan {
  bool exact = false;
  size_t chunks = 0;
  size_t chunk_pages = 0;
};
// The plan for `ranges` watched ranges of `pages` pages in all under `budget_ns`: exact when
// protecting every range and a fault on every page fits, else as many chunks as fit (each
// one protection call and chunk_pages faults), at most max_chunks and never more pages than
// there are.
PagemapScanPlan pagemap_scan_plan(const PagemapScanOptions& o, size_t ranges, size_t pages,
                                  uint64_t budget_ns) noexcept;

std::unique_ptr<Monitor> make_pagemap_scan_monitor(const PagemapScanOptions& options, std::string* why_not);

}  // namespace cxlpool::detail::tiering

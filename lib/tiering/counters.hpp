// SPDX-License-Identifier: MIT
// The tiering engine's counters, process-wide, named like the kernel's /proc/vmstat counters
// where the meaning matches (pgpromote_success, pgdemote_*, pgmigrate_fail). Written by the
// engine's thread and by callers of cxlpool_pin and cxlpool_hint_access at once (atomic adds: no
// update is lost), read by anyone (the stats page, JSON).
#pragma once

#include <atomic>
#include <cstdint>

#include "common/metric.hpp"

namespace cxlpool::detail::tiering {

inline constexpr int kMaxTiers = 8;

struct Counters {
  struct Value {
    std::atomic<uint64_t> v{0};
    void add(uint64_t n) noexcept { v.fetch_add(n, std::memory_order_relaxed); }
    void set(uint64_t n) noexcept { v.store(n, std::memory_order_relaxed); }
    uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
  };
  Value pgpromote_success;  // pages moved to a faster tier
  Value pgdemote_success;   // pages moved to a slower tier (the kernel splits kswapd/direct; we have one)
  Value pgmigrate_fail;     // pages of moves that failed (target full, busy, refused)
  Value promote_bytes, demote_bytes;
  Value moves, move_failures;  // unit moves attempted and failed
  Value move_ns;               // time spent moving (copy + remap, or the kernel's migration)
  Value scans, scan_ns;        // monitor collections and their time
  Value monitor_faults;        // faults the application took because of monitors
  Value hints, pins;           // cxlpool_hint_access / cxlpool_pin calls
  Value budget_deferred;       // moves put off because the interval's budget was spent
  Value units, tracked_bytes;  // ranges tracked, their bytes (gauges)
  Value running;               // 1 while the engine runs (gauge)
  Value heat_window_ns;        // the window heat is measured over (gauge)
  Value budget_bytes_per_interval;
  Value kernel_own;            // 1: mode own, 0: respect (gauge)
  Value numa_balancing;        // kernel.numa_balancing as read at start (gauge)
  Value write_fence_mode;      // os::write_fence::Mode at start: 1 kernel, 2 user-mode only, 3 none (gauge)
  Value moves_skipped_fence;   // moves not attempted: they copy, and no write fence holds system calls
  Value hot_bytes[kMaxTiers];  // bytes of hot units resident per tier (gauges)
  Value resident_bytes[kMaxTiers];
};

// The process's counters (zero until the engine starts).
Counters& counters() noexcept;

// Every scalar counter with its description: the one list the engine's JSON and the stats
// page (lib/stats) render. Per-tier arrays are kTierFields.
struct CounterField {
  MetricDesc desc;
  Counters::Value Counters::*member;
};
using K = MetricKind;
inline constexpr CounterField kCounterFields[] = {
    {{"pgpromote_success", K::kCounter, "pages", "pages moved to a faster tier"}, &Counters::pgpromote_success},
    {{"pgdemote_success", K::kCounter, "pages", "pages moved to a slower tier"}, &Counters::pgdemote_success},
    {{"pgmigrate_fail", K::kCounter, "pages", "pages of moves that failed"}, &Counters::pgmigrate_fail},
    {{"promote_bytes", K::kCounter, "bytes", "bytes moved to a faster tier"}, &Counters::promote_bytes},
    {{"demote_bytes", K::kCounter, "bytes", "bytes moved to a slower tier"}, &Counters::demote_bytes},
    {{"moves", K::kCounter, "events", "unit moves attempted"}, &Counters::moves},
    {{"move_failures", K::kCounter, "events", "unit moves that failed"}, &Counters::move_failures},
    {{"move_ns", K::kCounter, "nanoseconds", "time spent moving units"}, &Counters::move_ns},
    {{"scans", K::kCounter, "events", "monitor collections"}, &Counters::scans},
    {{"scan_ns", K::kCounter, "nanoseconds", "time spent collecting monitors"}, &Counters::scan_ns},
    {{"monitor_faults", K::kCounter, "events", "faults the program took because of monitors"},
     &Counters::monitor_faults},
    {{"hints", K::kCounter, "events", "cxlpool_hint_access calls"}, &Counters::hints},
    {{"pins", K::kCounter, "events", "cxlpool_pin calls"}, &Counters::pins},
    {{"budget_deferred", K::kCounter, "events", "moves put off because the byte budget was spent"},
     &Counters::budget_deferred},
    {{"units", K::kGauge, "count", "movable units tracked"}, &Counters::units},
    {{"tracked_bytes", K::kGauge, "bytes", "bytes of the tracked units"}, &Counters::tracked_bytes},
    {{"tiering_running", K::kGauge, "flag", "1 while the tiering engine runs"}, &Counters::running},
    {{"heat_window_ns", K::kGauge, "nanoseconds", "window heat is measured over"}, &Counters::heat_window_ns},
    {{"budget_bytes_per_interval", K::kGauge, "bytes", "bytes the engine may move per interval"},
     &Counters::budget_bytes_per_interval},
    {{"kernel_mode_own", K::kGauge, "flag", "1: kernel=own, 0: kernel=respect"}, &Counters::kernel_own},
    {{"numa_balancing", K::kGauge, "count", "kernel.numa_balancing as read when the engine started"},
     &Counters::numa_balancing},
    {{"write_fence_mode", K::kGauge, "code", "write fences: 1 kernel, 2 user-mode only, 3 none (2-3: no copy)"},
     &Counters::write_fence_mode},
    {{"moves_skipped_fence", K::kCounter, "events", "moves not tried: they copy, and no write fence is had"},
     &Counters::moves_skipped_fence},
};
struct TierField {
  MetricDesc desc;
  Counters::Value (Counters::*member)[kMaxTiers];
};
inline constexpr TierField kTierFields[] = {
    {{"hot_bytes", K::kGauge, "bytes", "bytes of hot units resident in the tier"}, &Counters::hot_bytes},
    {{"tier_resident_bytes", K::kGauge, "bytes", "bytes of tracked units resident in the tier"},
     &Counters::resident_bytes},
};

}  // namespace cxlpool::detail::tiering

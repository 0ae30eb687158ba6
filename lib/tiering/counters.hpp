// SPDX-License-Identifier: MIT
// The tiering engine's counters, process-wide, named like the kernel's /proc/vmstat counters
// where the meaning matches (pgpromote_success, pgdemote_*, pgmigrate_fail). Written by the
// engine's thread (single writer, relaxed stores), read by anyone (the stats page, JSON).
#pragma once

#include <atomic>
#include <cstdint>

namespace cxlpool::detail::tiering {

inline constexpr int kMaxTiers = 8;

struct Counters {
  struct Value {
    std::atomic<uint64_t> v{0};
    void add(uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
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
  Value hot_bytes[kMaxTiers];  // bytes of hot units resident per tier (gauges)
  Value resident_bytes[kMaxTiers];
};

// The process's counters (zero until the engine starts).
Counters& counters() noexcept;

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// Hotness monitors behind one interface. A monitor watches ranges the tiering engine tracks
// (pool regions and huge spans: whole reservations, page aligned). Once per interval on the
// engine's thread it is armed (a period starts, within a cost budget: the whole ranges, or a
// bounded sample of them) and then collected (the period ends: which pages it observed and
// which of those were touched go to a HeatSink). Each kind is detected at start and says
// whether it is available and why (or why not). Kinds: "hint" (explicit cxlpool_hint_access/cxlpool_pin calls, built
// into the engine), "pagemap_scan" (PAGEMAP_SCAN + UFFD_FEATURE_WP_ASYNC: exact written
// pages), "sample" (a bounded sample of ranges made PROT_NONE: first touches, reads too),
// "damon" (the kernel's DAMON, vaddr operations), "perf" (PEBS/IBS memory sampling),
// "numa_balancing" (the kernel's own NUMA hint faults).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::detail::tiering {

enum class AccessKind : uint8_t { kWrite = 1, kRead = 2, kAny = 3 };

// Receives what a monitor saw in a period: the runs of pages it observed (its whole armed
// ranges, or its sample of them) and, among those, the runs touched, each page counted as
// weight accesses. A range's touched share is estimated as touched / observed pages; a range
// not observed in a period says nothing about it. Called on the engine's thread only.
class HeatSink {
 public:
  virtual void touched(uintptr_t addr, size_t len, AccessKind kind, uint32_t weight) noexcept = 0;
  virtual void observed(uintptr_t addr, size_t len) noexcept {
    (void)addr;
    (void)len;
  }

 protected:
  ~HeatSink() = default;
};

struct MonitorAvailability {
  bool available = false;
  // Available: what it uses ("PAGEMAP_SCAN + UFFD_FEATURE_WP_ASYNC, kernel 6.18").
  // Unavailable: why, precisely enough to act on ("kernel.perf_event_paranoid=2 and no
  // CAP_PERFMON", "no PMU: perf_event_open(PERF_COUNT_HW_CPU_CYCLES) = ENOENT").
  std::string reason;
};

// How a monitor that changes page protections ("sample") keeps out of the way of the range's
// owner, which commits and decommits pages of a watched range with mprotect under its own
// lock, and releases ranges: run_locked(ctx, addr, len, fn, arg) runs fn(arg) with the owner's
// lock of the watched range at addr held if the range is still the owner's, and returns false
// without running fn when it is not (the monitor must then forget the range without touching
// its memory). Used by arm() and collect() on the engine's thread; watch() and unwatch() are
// called with that lock held already (they never take it). fn must not call back into the
// lock's owner; run_locked must not call back into the monitor. Without one (the default),
// fn runs unlocked: for owners that change nothing meanwhile (tests).
struct RangeLock {
  bool (*run_locked)(void* ctx, uintptr_t addr, size_t len, void (*fn)(void* arg) noexcept,
                     void* arg) noexcept = nullptr;
  void* ctx = nullptr;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  virtual const char* name() const noexcept = 0;
  virtual AccessKind sees() const noexcept = 0;
  // Starts watching [addr, addr+len) (page aligned); it is observed from the next arm() on.
  // Called again for a range whose mapping was replaced (a move swaps in a new mapping). 0 or
  // an errno.
  virtual int watch(uintptr_t addr, size_t len) noexcept = 0;
  // Stops watching (before the range is released or moved); leaves the memory as it was.
  virtual void unwatch(uintptr_t addr, size_t len) noexcept = 0;
  // Starts a period: arms the watched ranges, or a sample of them, so that what the program
  // touches from now on is seen. The program may lose at most budget_ns of CPU time to this
  // period's faults and protection changes (each kind's cost model is in its file); with
  // enough budget a kind that can be exact is. Engine thread only.
  virtual void arm(uint64_t budget_ns) noexcept = 0;
  // Ends the period: reports what it observed since arm() and what of it was touched (nothing
  // when it was not armed). Engine thread only.
  virtual void collect(HeatSink& sink) noexcept = 0;
  // Faults the application took because of this monitor, and time spent in collect (ns).
  virtual uint64_t faults() const noexcept { return 0; }
  virtual uint64_t scan_ns() const noexcept { return 0; }
  // The owner's lock (RangeLock above), set before the first watch(). Monitors that never
  // change a protection ignore it (the default).
  virtual void set_range_lock(const RangeLock& lock) noexcept { (void)lock; }
};

struct MonitorInfo {
  std::string name;
  MonitorAvailability availability;
};

// Every monitor kind with its availability on this machine and process, in a fixed order.
std::vector<MonitorInfo> detect_monitors();
// An instance of the named kind (not "hint": the engine owns hints), or nullptr with the
// reason in *why_not.
std::unique_ptr<Monitor> make_monitor(std::string_view name, std::string* why_not);

}  // namespace cxlpool::detail::tiering

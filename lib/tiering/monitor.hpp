// SPDX-License-Identifier: MIT
// Hotness monitors behind one interface. A monitor watches ranges the tiering engine tracks
// (pool regions and huge spans: whole reservations, page aligned) and, once per interval on
// the engine's thread, reports which pages were touched since the previous interval to a
// HeatSink, then re-arms. Each kind is detected at start and says whether it is available
// and why (or why not). Kinds: "hint" (explicit cxlpool_hint_access/cxlpool_pin calls, built
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

// Receives what a monitor saw: runs of touched pages (page aligned), each page counted as
// weight accesses. Called on the engine's thread only.
class HeatSink {
 public:
  virtual void touched(uintptr_t addr, size_t len, AccessKind kind, uint32_t weight) noexcept = 0;

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
// lock: lock(ctx, addr, len) is called before the monitor changes a protection in
// [addr, addr+len) (a watched range) and unlock after; the monitor never holds two. Both run
// on the thread calling the monitor (collect, watch, unwatch) and must not call back into it.
struct RangeLock {
  void (*lock)(void* ctx, uintptr_t addr, size_t len) noexcept = nullptr;
  void (*unlock)(void* ctx, uintptr_t addr, size_t len) noexcept = nullptr;
  void* ctx = nullptr;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  virtual const char* name() const noexcept = 0;
  virtual AccessKind sees() const noexcept = 0;
  // Starts watching [addr, addr+len) (page aligned). Called again for a range whose mapping
  // was replaced (a move swaps in a new mapping): re-arms it. 0 or an errno.
  virtual int watch(uintptr_t addr, size_t len) noexcept = 0;
  // Stops watching (before the range is released or moved); leaves the memory as it was.
  virtual void unwatch(uintptr_t addr, size_t len) noexcept = 0;
  // Reports accesses since the previous collect and re-arms. Engine thread only.
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

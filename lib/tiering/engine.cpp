// SPDX-License-Identifier: MIT
// The tiering engine (engine.hpp): the thread, the unit table with heat, hints and pins, the
// hot/cold policy and its moves, counters and the JSON view.
#include "tiering/engine.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "alloc/pool.hpp"
#include "common/error.hpp"
#include "common/json.hpp"
#include "config/options.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/thread.hpp"
#include "os/write_fence.hpp"
#include "tiering/counters.hpp"
#include "tiering/monitor.hpp"
#include "tiering/monitor_sample.hpp"

namespace cxlpool::detail::tiering {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMaxQueuedHints = 65536;
constexpr uint64_t kUnitBurst = 4ull << 20;
constexpr uint64_t kDefaultBudget = 200'000'000;  // when no device declares a bandwidth
// The engine thread's stack: 16 KiB used at most (measured in its mapping's resident pages
// under aggressive tiering with moves); far below the default 8 MiB, which counts against an
// RLIMIT_AS.
constexpr size_t kEngineStack = size_t(256) << 10;

struct Hint {
  uintptr_t addr;
  size_t len;
  uint32_t weight;
};

struct Pin {
  uint64_t serial;
  int tier;
};

// Pins outlive engine restarts; hints are dropped when no engine runs. The mutexes are
// constant-initialised; the containers are made on first use, because the interposer may
// start the engine before this library's dynamic initialisers have run.
std::mutex g_pins_mu;
std::mutex g_hints_mu;
uint64_t g_hints_dropped = 0;
std::map<uintptr_t, Pin>& pins_table() {
  static auto* table = new std::map<uintptr_t, Pin>();  // never destroyed: used until exit
  return *table;
}
std::vector<Hint>& hint_queue() {
  static auto* queue = new std::vector<Hint>();
  return *queue;
}

int tier_of(const alloc::Pool* pool, int di) { return alloc::pool_device_tier(pool, di); }

// kernel.numa_balancing (0 when it cannot be read).
int kernel_numa_balancing() {
  try {
    return std::stoi(os::read_text_file("/proc/sys/kernel/numa_balancing"));
  } catch (...) {
    return 0;
  }
}

class Engine;
// The engine the allocator's release hook tells (Engine::unit_released); its lock is taken
// with a unit's home lock held.
std::mutex g_hook_mu;
Engine* g_hook_engine = nullptr;

class Engine final : public HeatSink {
 public:
  explicit Engine(const Config& c) : cfg_(c) {
    window_ns_ = cfg_.interval_ns;
    counters().heat_window_ns.set(window_ns_);
    for (const std::string& name : cfg_.monitors) {
      if (name == "hint") continue;
      std::string why;
      std::unique_ptr<Monitor> m = make_monitor(name, &why);
      if (!m) fail(CXLPOOL_E_CONFIG, "tiering: monitor '" + name + "' is not available here: " + why);
      // Protection changes in a unit run under its home lock (RangeLock in monitor.hpp).
      m->set_range_lock(RangeLock{run_locked, this});
      monitors_.push_back(std::move(m));
    }
    numa_balancing_ = kernel_numa_balancing();
    kernel_tiers_ = (numa_balancing_ & 2) != 0;
    if (cfg_.kernel == KernelMode::kOwn)
      kernel_reason_ =
          "own: cxlpool tiers every unit; ranges it moves to a NUMA node are bound there (MPOL_BIND), "
          "so the kernel's NUMA balancing does not move them back";
    else if (kernel_tiers_)
      kernel_reason_ = "respect: kernel.numa_balancing=" + std::to_string(numa_balancing_) +
                       " (memory tiering on): moves between two NUMA nodes are left to the kernel; cxlpool moves "
                       "units only when one end is an fd-backed device. cxlpool's NUMA devices bind their pages to "
                       "their node, which the kernel's balancing also leaves alone: use kernel=own to have cxlpool "
                       "tier NUMA-to-NUMA units";
    else
      kernel_reason_ = "respect: kernel.numa_balancing=" + std::to_string(numa_balancing_) +
                       " (the kernel does not tier memory): cxlpool tiers every unit";
    counters().numa_balancing.set(uint64_t(numa_balancing_));
    counters().kernel_own.set(cfg_.kernel == KernelMode::kOwn ? 1 : 0);
    probe_fence();
    for (const std::string& name : cfg_.monitors)
      if (name == "sample")
        os::prim::write_stderr(
            "cxlpool: tiering: monitor 'sample' makes sampled pages PROT_NONE: until the program touches one, a "
            "system call that reads or writes it (read, recv, write, execve arguments) fails with EFAULT, and a "
            "thread that blocks SIGSEGV and touches it dies; keep I/O buffers out of tiered pools, or use "
            "pagemap_scan\n");
    hook_engine(this);  // before any unit is watched
    thread_.start([this] { run(); }, kEngineStack, "tiering: the engine thread", "cxlpool/tier");
  }
  ~Engine() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    hook_engine(nullptr);  // the thread unwatched every unit still there; releases unwatched the rest
  }

  // The allocator's release hook (alloc::set_unit_release_hook): a unit is about to be
  // released, its home lock held. Monitors stop watching it now, while it is still ours.
  static void unit_released(uintptr_t base, size_t size) noexcept {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    if (g_hook_engine)
      for (auto& m : g_hook_engine->monitors_) m->unwatch(base, size);
  }
  static void hook_engine(Engine* e) noexcept {
    {
      std::lock_guard<std::mutex> lock(g_hook_mu);
      g_hook_engine = e;
    }
    alloc::set_unit_release_hook(e ? unit_released : nullptr);
  }
  static void after_fork_child() noexcept {
    sample_after_fork_child();      // the child's first touch of a page the parent armed is its own
    new (&g_hook_mu) std::mutex();  // no thread holds it at fork (its holders hold a home lock)
    g_hook_engine = nullptr;
    alloc::set_unit_release_hook(nullptr);
  }
  const Config& config() const { return cfg_; }

  void touched(uintptr_t addr, size_t len, AccessKind, uint32_t weight) noexcept override {
    for_units(addr, len, [&](State& s, size_t pages) { s.touched += double(pages) * double(weight); });
  }
  void observed(uintptr_t addr, size_t len) noexcept override {
    for_units(addr, len, [&](State& s, size_t pages) { s.observed += double(pages); });
  }

  void json(JsonWriter& j) {
    std::lock_guard<std::mutex> lock(view_mu_);
    j.key("interval_moved_bytes_max").value(max_interval_bytes_);
    j.key("heat_window_ns").value(window_view_);
    j.key("budget_bytes_per_interval").value(budget_per_interval_);
    j.key("budget_source").value(budget_source_);
    j.key("kernel").begin_object();
    j.key("numa_balancing")
        .value(uint64_t(numa_balancing_))
        .key("mode")
        .value(cfg_.kernel == KernelMode::kOwn ? "own" : "respect");
    j.key("why").value(kernel_reason_).end_object();
    j.key("write_fence").begin_object();
    j.key("mode").value(os::write_fence::mode_name(fence_.mode));
    j.key("via").value(fence_.mode != os::write_fence::Mode::kKernel ? ""
                       : fence_.via_device                           ? "/dev/userfaultfd"
                                                                     : "userfaultfd(2)");
    j.key("why").value(fence_reason_);
    j.key("moves_skipped").value(counters().moves_skipped_fence.get()).end_object();
    j.key("last_move_error").value(last_error_);
  }

 private:
  // A unit as the allocator last listed it, with what the engine knows about it. In a period,
  // monitors observe some of its pages (observed) and see some of those touched (touched);
  // hints add pages of their own (hinted).
  struct State : alloc::Unit {
    double heat = 0, touched = 0, observed = 0, hinted = 0;
    // How much the estimate scatters: an exponentially weighted variance of the shares it was
    // made from, and the weight of the last one (sampled estimates are noisy: see noise()).
    double spread = 0, weight = 1;
    uint64_t moved_at = 0, judged_at = 0;
    // A unit whose moves are refused (the program's protections or attributes, its own
    // userfaultfd: NOT_SUPPORTED) is left alone until then, twice as long after each refusal.
    uint64_t refused_until = 0;
    unsigned refusals = 0;
    int pin = -1;
  };

  // Calls fn(unit, pages of [addr, addr+len) in it) for every unit the run overlaps (the
  // units are sorted by base).
  template <class Fn>
  void for_units(uintptr_t addr, size_t len, Fn&& fn) noexcept {
    auto it = std::upper_bound(units_.begin(), units_.end(), addr,
                               [](uintptr_t a, const State& s) { return a < s.ref.base; });
    if (it != units_.begin()) --it;
    const uintptr_t end = addr + len;
    for (; it != units_.end() && it->ref.base < end; ++it) {
      uintptr_t lo = std::max(addr, it->ref.base), hi = std::min(end, it->ref.base + it->size);
      if (lo < hi) fn(*it, size_t((hi - lo + kPage - 1) / kPage));
    }
  }

  void run() {
    os::prim::block_async_signals(nullptr);  // the program's handlers run on its own threads
    alloc::enter_internal_scope();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      // A period is the last `window_ns_` of each interval: monitors are armed at its start
      // and collected at the interval's end. Monitors that see each page once per period
      // (pagemap_scan) saturate when most units are touched all over within it; the window
      // then shrinks (see age()).
      const uint64_t window = window_ns_;
      if (window < cfg_.interval_ns) {
        cv_.wait_for(lock, std::chrono::nanoseconds(cfg_.interval_ns - window), [this] { return stop_; });
        if (stop_) break;
      }
      lock.unlock();
      arm_monitors();
      lock.lock();
      cv_.wait_for(lock, std::chrono::nanoseconds(window), [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      step();
      lock.lock();
    }
    lock.unlock();
    for (auto& m : monitors_) {
      m->collect(discard_);
      for (const State& s : units_) alloc::with_unit(s.ref, unwatch_unit, m.get());
    }
    alloc::leave_internal_scope();
  }

  // The program may lose `overhead` of each interval to the monitors, shared among them.
  void arm_monitors() {
    if (monitors_.empty()) return;
    const uint64_t budget = uint64_t(double(cfg_.interval_ns) * cfg_.overhead / double(monitors_.size()));
    const uint64_t t0 = os::monotonic_ns();
    for (auto& m : monitors_) m->arm(budget);
    counters().scan_ns.add(os::monotonic_ns() - t0);
  }

  struct DiscardSink final : HeatSink {
    void touched(uintptr_t, size_t, AccessKind, uint32_t) noexcept override {}
  } discard_;

  static void unwatch_unit(void* ctx, const alloc::Unit& u) { static_cast<Monitor*>(ctx)->unwatch(u.ref.base, u.size); }

  // RangeLock::run_locked for the monitors (engine thread: arm and collect): fn(arg) under the
  // home lock of the unit at addr, if that unit is still the one the engine knows.
  static bool run_locked(void* ctx, uintptr_t addr, size_t len, void (*fn)(void*) noexcept, void* arg) noexcept {
    auto* self = static_cast<Engine*>(ctx);
    auto it = std::lower_bound(self->units_.begin(), self->units_.end(), addr,
                               [](const State& s, uintptr_t a) { return s.ref.base < a; });
    if (it == self->units_.end() || it->ref.base != addr || it->size != len) return false;
    struct Call {
      void (*fn)(void*) noexcept;
      void* arg;
    } call{fn, arg};
    return alloc::with_unit(
        it->ref, [](void* c, const alloc::Unit&) { static_cast<Call*>(c)->fn(static_cast<Call*>(c)->arg); }, &call);
  }

  static void collect_unit(void* ctx, const alloc::Unit& u) {
    static_cast<std::vector<alloc::Unit>*>(ctx)->push_back(u);
  }
  static void watch_unit(void* ctx, const alloc::Unit& u) {
    for (auto& m : static_cast<Engine*>(ctx)->monitors_) m->watch(u.ref.base, u.size);
  }

 public:
  // For moves made outside the engine (cxlpool_pin) while it runs: the same disarm and re-arm.
  static void monitor_hook(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t st) {
    move_hook(ctx, u, after, st);
  }

 private:
  static void move_hook(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t) {
    for (auto& m : static_cast<Engine*>(ctx)->monitors_) {
      if (after)
        m->watch(u.ref.base, u.size);  // the mapping was replaced (or left as it was): arm again
      else
        m->unwatch(u.ref.base, u.size);
    }
  }

  // The unit table follows the allocator: new units are watched, gone ones dropped.
  void sync_units() {
    std::vector<alloc::Unit> now;
    now.reserve(units_.size() + 16);
    alloc::for_each_unit(collect_unit, &now);
    std::sort(now.begin(), now.end(),
              [](const alloc::Unit& a, const alloc::Unit& b) { return a.ref.base < b.ref.base; });
    std::vector<State> next;
    next.reserve(now.size());
    size_t old = 0;
    std::map<uintptr_t, Pin> pins;
    {
      std::lock_guard<std::mutex> plock(g_pins_mu);
      // Pins of units that are gone go with them.
      for (auto it = pins_table().begin(); it != pins_table().end();) {
        auto found = std::lower_bound(now.begin(), now.end(), it->first,
                                      [](const alloc::Unit& u, uintptr_t a) { return u.ref.base < a; });
        if (found == now.end() || found->ref.base != it->first || found->ref.serial != it->second.serial)
          it = pins_table().erase(it);
        else
          ++it;
      }
      pins = pins_table();
    }
    for (const alloc::Unit& u : now) {
      while (old < units_.size() && units_[old].ref.base < u.ref.base) ++old;
      State s;
      bool known = old < units_.size() && units_[old].ref.base == u.ref.base && units_[old].ref.serial == u.ref.serial;
      if (known) s = units_[old];
      static_cast<alloc::Unit&>(s) = u;
      auto pin = pins.find(u.ref.base);
      s.pin = pin != pins.end() ? pin->second.tier : -1;
      next.push_back(s);
      if (!known) alloc::with_unit(u.ref, watch_unit, this);
    }
    // Units that are gone were unwatched as they were released (unit_released, under their
    // home lock, while still ours); a new unit at the same address was watched above.
    units_.swap(next);
  }

  void age() {
    Counters& c = counters();
    uint64_t hot[kMaxTiers] = {}, resident[kMaxTiers] = {}, tracked = 0;
    size_t active = 0, saturated = 0;
    double top = 0;
    const bool sampled = !monitors_.empty();
    const uint64_t now = os::monotonic_ns();
    for (State& s : units_) {
      const double pages = double(std::max<size_t>(1, s.size / kPage));
      // The monitors' estimate (touched share of the pages they observed) plus the hints. A
      // unit no monitor observed in this period keeps its heat, unless hints speak for it;
      // with hints alone every unit is judged every period.
      const bool judged = !sampled || s.observed > 0 || s.hinted > 0;
      const double seen = s.observed > 0 ? std::min(1.0, s.touched / s.observed) : 0.0;
      const double share = std::min(1.0, seen + s.hinted / pages);
      if (s.observed > 0) {
        active += seen > 0;
        saturated += seen >= 0.9;
        top = std::max(top, seen);
      }
      if (judged) {
        // Ageing by the time since the unit was last judged (a sampled unit may go unobserved
        // for several periods): heat halves per halflife without accesses either way.
        const uint64_t dt = s.judged_at ? now - s.judged_at : cfg_.interval_ns;
        const double alpha = 1.0 - std::exp2(-double(dt) / double(cfg_.halflife_ns));
        const double d = share - s.heat;
        s.heat += alpha * d;
        s.spread = (1 - alpha) * (s.spread + alpha * d * d);
        s.weight = alpha;
        s.judged_at = now;
      }
      s.touched = s.observed = s.hinted = 0;
      int t = std::clamp(tier_of(s.pool, s.resident), 0, kMaxTiers - 1);
      resident[t] += s.committed;
      if (s.heat >= cfg_.hot) hot[t] += s.committed;
      tracked += s.size;
    }
    for (int t = 0; t < kMaxTiers; ++t) {
      c.hot_bytes[t].set(hot[t]);
      c.resident_bytes[t].set(resident[t]);
    }
    c.units.set(units_.size());
    c.tracked_bytes.set(tracked);
    // The window: halved while most active units saturate (their heat says nothing), doubled
    // back while nothing does (hot units would be under-measured). A dead band between.
    if (active >= 4 && saturated * 2 > active && window_ns_ > cfg_.interval_ns / 64)
      window_ns_ /= 2;
    else if (active && top < 0.5 && window_ns_ < cfg_.interval_ns)
      window_ns_ = std::min(cfg_.interval_ns, window_ns_ * 2);
    std::lock_guard<std::mutex> lock(view_mu_);
    window_view_ = window_ns_;
    counters().heat_window_ns.set(window_ns_);
  }

  // ---- policy: hot units up, cold units down ---------------------------------------------
  struct Fast {
    int di = -1;
    int tier = 0;
  };
  // The pool's fastest device with the most room.
  static Fast fastest(alloc::Pool* pool) {
    Fast f;
    uint64_t best_room = 0;
    for (int di = 0; di < alloc::pool_device_count(pool); ++di) {
      const Device& d = alloc::pool_device_of(pool, di);
      uint64_t cap = d.ledger().capacity, used = d.committed();
      uint64_t room = cap > used ? cap - used : 0;
      int t = tier_of(pool, di);
      if (f.di < 0 || t < f.tier || (t == f.tier && room > best_room)) {
        f = {di, t};
        best_room = room;
      }
    }
    return f;
  }
  // Where a demoted unit goes: its home when that is slower, else the next slower device
  // with room.
  int demotion_target(const State& s, int fast_tier) const {
    if (tier_of(s.pool, s.home) > fast_tier) return s.home;
    int best = -1;
    for (int di = 0; di < alloc::pool_device_count(s.pool); ++di) {
      int t = tier_of(s.pool, di);
      if (t <= fast_tier) continue;
      const Device& d = alloc::pool_device_of(s.pool, di);
      if (d.committed() + s.committed > d.ledger().capacity) continue;
      if (best < 0 || t < tier_of(s.pool, best)) best = di;
    }
    return best;
  }
  uint64_t high_mark(const Device& d) const { return d.ledger().capacity / 100 * cfg_.high_percent; }
  uint64_t low_mark(const Device& d) const { return d.ledger().capacity / 100 * cfg_.low_percent; }

  bool kernel_owns(const State& s, int to) const {
    if (cfg_.kernel == KernelMode::kOwn || !kernel_tiers_) return false;
    return alloc::pool_device_of(s.pool, s.resident).caps().kind == CXLPOOL_BACKING_NUMA &&
           alloc::pool_device_of(s.pool, to).caps().kind == CXLPOOL_BACKING_NUMA;
  }

  // The standard error of a unit's heat: of an exponentially weighted mean whose terms weigh
  // `weight` each, from their weighted variance.
  static double noise(const State& s) { return std::sqrt(s.spread * s.weight / (2 - s.weight)); }

  bool settled(const State& s, uint64_t now) const {
    return (s.moved_at && now - s.moved_at < cfg_.min_residence_ns) || now < s.refused_until;
  }

  // Which fence the process can have, and why not (write_fence.hpp): once at start, again
  // while it is unknown (a passing shortage of descriptors or memory).
  void probe_fence() {
    const os::write_fence::Probe p = os::write_fence::probe();
    std::string why;
    try {
      why = os::write_fence::explain(p);
    } catch (...) {
    }
    std::lock_guard<std::mutex> lock(view_mu_);
    fence_ = p;
    fence_reason_ = std::move(why);
    counters().write_fence_mode.set(uint64_t(p.mode));
  }

  // Whether moving s to `to` copies its bytes (one end is fd-backed) and so needs a write
  // fence; NUMA to NUMA the kernel migrates the pages in place.
  static bool copies(const State& s, int to) {
    return !(alloc::pool_device_of(s.pool, s.resident).caps().kernel_migratable &&
             alloc::pool_device_of(s.pool, to).caps().kernel_migratable);
  }
  // Whether a copying move of s to `to` can be fenced: a kernel-mode fence, and memory it
  // covers at both ends (the target's too: a unit moved where no fence covers it could never
  // come back).
  bool fenceable(const State& s, int to) {
    if (fence_.mode != os::write_fence::Mode::kKernel) return false;
    auto covered = [&](const Device& d) {
      auto it = fenceable_.find(&d);
      if (it == fenceable_.end()) {
        bool yes = false;
        try {
          yes = d.copy_fenceable();
        } catch (...) {
        }
        it = fenceable_.emplace(&d, yes).first;
      }
      return it->second;
    };
    return covered(alloc::pool_device_of(s.pool, s.resident)) && covered(alloc::pool_device_of(s.pool, to));
  }

  // Backs a unit off after a refused move: 1 s (or min_residence), doubling, at most a minute.
  void back_off(State& s, uint64_t now) const {
    const uint64_t base = std::max<uint64_t>(cfg_.min_residence_ns, 1'000'000'000);
    s.refused_until = now + std::min<uint64_t>(base << std::min(s.refusals, 6u), 60'000'000'000);
    ++s.refusals;
  }

  // Moves s to device `to`: OK, or why not (BUSY: the budget is spent; NOT_SUPPORTED: the
  // kernel's, or a copy without a write fence; the move's own status).
  cxlpool_status_t move(State& s, int to, uint64_t now) {
    Counters& c = counters();
    if (s.committed > tokens_) {
      c.budget_deferred.add(1);
      return CXLPOOL_E_BUSY;
    }
    if (kernel_owns(s, to)) return CXLPOOL_E_NOT_SUPPORTED;
    if (copies(s, to) && !fenceable(s, to)) {
      // Not attempted: the copy would need a fence that holds the program's system calls.
      c.moves_skipped_fence.add(1);
      back_off(s, now);
      return CXLPOOL_E_NOT_SUPPORTED;
    }
    const bool promote = tier_of(s.pool, to) < tier_of(s.pool, s.resident);
    alloc::UnitMove result;
    std::string why;
    uint64_t t0 = os::monotonic_ns();
    cxlpool_status_t st = alloc::move_unit(s.ref, to, &result, &why, move_hook, this);
    c.move_ns.add(os::monotonic_ns() - t0);
    c.moves.add(1);
    if (st != CXLPOOL_OK) {
      c.move_failures.add(1);
      if (st == CXLPOOL_E_NOT_SUPPORTED) {
        back_off(s, now);  // refused before any page was copied: no migration failed
      } else {
        c.pgmigrate_fail.add(s.committed / kPage);
      }
      s.moved_at = now;  // not retried before min_residence (the promote loop retries once after making room)
      std::lock_guard<std::mutex> lock(view_mu_);
      last_error_ = why;
      return st;
    }
    s.moved_at = now;
    s.refusals = 0;
    spent_ += result.bytes;
    tokens_ -= std::min(tokens_, result.bytes);
    s.resident = to;
    (promote ? c.pgpromote_success : c.pgdemote_success).add(result.bytes / kPage);
    (promote ? c.promote_bytes : c.demote_bytes).add(result.bytes);
    return CXLPOOL_OK;
  }

  void plan_and_move() {
    const uint64_t now = os::monotonic_ns();
    spent_ = 0;
    fenceable_.clear();  // devices come and go with pools
    // Pinned units that are not on their tier (a pin made while their device was full).
    for (State& s : units_) {
      if (s.pin < 0 || tier_of(s.pool, s.resident) == s.pin || settled(s, now)) continue;
      for (int di = 0; di < alloc::pool_device_count(s.pool); ++di)
        if (tier_of(s.pool, di) == s.pin) {
          (void)move(s, di, now);
          break;
        }
    }
    // Per fast device: the units that may use it, hottest first, and its coldest residents.
    std::map<const Device*, std::pair<std::vector<State*>, std::vector<State*>>> by_fast;
    for (State& s : units_) {
      if (s.pin >= 0 || settled(s, now)) continue;
      Fast f = fastest(s.pool);
      if (f.di < 0) continue;
      const Device* fd = &alloc::pool_device_of(s.pool, f.di);
      auto& [up, down] = by_fast[fd];
      if (tier_of(s.pool, s.resident) == f.tier)
        down.push_back(&s);
      else if (s.heat >= cfg_.hot && s.committed)
        up.push_back(&s);
    }
    for (auto& [fd, lists] : by_fast) {
      std::vector<State*>& up = lists.first;
      std::vector<State*>& down = lists.second;
      std::sort(up.begin(), up.end(), [](const State* a, const State* b) { return a->heat > b->heat; });
      std::sort(down.begin(), down.end(), [](const State* a, const State* b) { return a->heat < b->heat; });
      size_t victim = 0;
      // Demotes the coldest resident below `below` (and, making room for candidate c, one whose
      // heat is clearly below c's: by more than 4 times their estimates' combined noise,
      // since the hottest candidate and the coldest resident are the extremes of many).
      auto demote_one = [&](double below, const State* c) {
        while (victim < down.size()) {
          State& v = *down[victim++];
          if (v.heat >= below || !v.committed) continue;
          if (c) {
            const double nc = noise(*c), nv = noise(v);
            if (c->heat - v.heat <= 4 * std::sqrt(nc * nc + nv * nv)) continue;
          }
          int to = demotion_target(v, tier_of(v.pool, v.resident));
          if (to >= 0 && move(v, to, now) == CXLPOOL_OK) return true;
          if (tokens_ == 0) return false;
        }
        return false;
      };
      // Above the high watermark: cold residents go down until below the low one.
      if (cfg_.demote)
        while (fd->committed() > high_mark(*fd) && tokens_ > 0) {
          const uint64_t before = fd->committed();
          if (!demote_one(cfg_.cold, nullptr) || fd->committed() >= before) break;
          if (fd->committed() <= low_mark(*fd)) break;
        }
      if (!cfg_.promote) continue;
      for (State* c : up) {
        if (tokens_ == 0) {
          counters().budget_deferred.add(1);
          break;
        }
        // Room for it, making room by demoting a resident this many times colder if needed.
        // A resident is displaced only if it is `hysteresis` times colder and colder by at
        // least the hot threshold itself: sampled heat is noisy, and units of one uniform
        // workload must not swap places on noise.
        const double displace_below = std::min(c->heat / cfg_.hysteresis, c->heat - cfg_.hot);
        while (fd->committed() + c->committed > high_mark(*fd)) {
          if (!cfg_.demote || !demote_one(displace_below, c)) break;
        }
        if (fd->committed() + c->committed > high_mark(*fd)) continue;
        Fast f = fastest(c->pool);
        if (f.di < 0 || &alloc::pool_device_of(c->pool, f.di) != fd) continue;
        // A device can be full before its watermark says so (its offsets are fragmented):
        // make room the same way, once.
        if (move(*c, f.di, now) == CXLPOOL_E_CAPACITY && cfg_.demote && demote_one(displace_below, c)) {
          c->moved_at = 0;
          (void)move(*c, f.di, now);
        }
      }
    }
    std::lock_guard<std::mutex> lock(view_mu_);
    max_interval_bytes_ = std::max(max_interval_bytes_, spent_);
  }

  void set_budget() {
    uint64_t per_s = cfg_.budget_bytes_per_s;
    if (per_s) {
      budget_source_ = "configured";
    } else {
      // A tenth of the slowest declared bandwidth among the movable pools' devices.
      uint64_t slowest = 0;
      for (const State& s : units_)
        for (int di = 0; di < alloc::pool_device_count(s.pool); ++di) {
          uint64_t bw = alloc::pool_device_read_bandwidth(s.pool, di);
          if (bw && (!slowest || bw < slowest)) slowest = bw;
        }
      if (slowest) {
        per_s = slowest * 1'000'000 / 10;
        budget_source_ = "a tenth of the slowest device's declared bandwidth (" + std::to_string(slowest) + " MB/s)";
      } else {
        per_s = kDefaultBudget;
        budget_source_ = "200 MB/s: no device declares a bandwidth";
      }
    }
    std::lock_guard<std::mutex> lock(view_mu_);
    budget_per_interval_ = uint64_t(double(per_s) * double(cfg_.interval_ns) / 1e9);
    counters().budget_bytes_per_interval.set(budget_per_interval_);
    // A token bucket: unspent budget carries over up to one interval's worth, or one 4 MiB
    // unit when an interval's budget is smaller than that (so units still move, at the rate).
    // Or as much as the largest unit, which then waits for budget to build up over several
    // intervals (the average rate holds; an interval with such a move moves more).
    uint64_t largest = kUnitBurst;
    for (const State& s : units_) largest = std::max(largest, s.committed);
    tokens_ = std::min(std::max(budget_per_interval_, largest), tokens_ + budget_per_interval_);
  }

  void step() {
    alloc::PoolsAlive alive;  // units_ holds Pool pointers: no pool goes away while they are used
    Counters& c = counters();
    uint64_t t0 = os::monotonic_ns();
    sync_units();
    for (auto& m : monitors_) m->collect(*this);
    std::vector<Hint> hints;
    {
      std::lock_guard<std::mutex> lock(g_hints_mu);
      hints.swap(hint_queue());
    }
    for (const Hint& h : hints)
      for_units(h.addr, h.len, [&](State& st, size_t pages) { st.hinted += double(pages) * double(h.weight); });
    uint64_t faults = 0;
    for (auto& m : monitors_) faults += m->faults();
    c.monitor_faults.set(faults);
    c.scans.add(1);
    c.scan_ns.add(os::monotonic_ns() - t0);
    age();
    set_budget();
    if (fence_.mode == os::write_fence::Mode::kUnknown) probe_fence();
    if (cfg_.migrate) plan_and_move();
  }

  Config cfg_;
  std::vector<std::unique_ptr<Monitor>> monitors_;
  std::vector<State> units_;  // engine thread only
  uint64_t window_ns_ = 0;    // engine thread only
  uint64_t spent_ = 0, tokens_ = 0;
  int numa_balancing_ = 0;
  bool kernel_tiers_ = false;
  std::string kernel_reason_;
  os::write_fence::Probe fence_;  // written under view_mu_ (read by the engine thread without it)
  std::string fence_reason_;
  std::map<const Device*, bool> fenceable_;  // engine thread only, per step: Device::copy_fenceable()
  std::mutex view_mu_;                       // what json() reads
  uint64_t budget_per_interval_ = 0, max_interval_bytes_ = 0, window_view_ = 0;
  std::string budget_source_, last_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  os::Thread thread_;
};

std::mutex g_engine_mu;
Engine* g_engine = nullptr;
bool g_env_done = false;

}  // namespace

namespace {
// A withdrawal's moves (alloc/elastic.cpp) while the engine runs: its monitors stop watching
// the unit while it moves, as for pin(); the engine stays until the move is done.
bool outside_move_begin(alloc::UnitHook* hook, void** ctx) noexcept {
  g_engine_mu.lock();
  if (!g_engine) {
    g_engine_mu.unlock();
    return false;
  }
  *hook = Engine::monitor_hook;
  *ctx = g_engine;
  return true;
}
void outside_move_end() noexcept { g_engine_mu.unlock(); }
}  // namespace

void start(const Config& c) {
  alloc::set_outside_moves(outside_move_begin, outside_move_end);
  std::lock_guard<std::mutex> lock(g_engine_mu);
  if (g_engine) {
    if (describe(g_engine->config()) == describe(c)) return;
    fail(CXLPOOL_E_BUSY, "tiering: the engine runs already with '" + describe(g_engine->config()) +
                             "'; stop it before starting it with '" + describe(c) + "'");
  }
  if (!c.enabled) return;
  alloc::set_region_segments(1);
  g_engine = new Engine(c);
  counters().running.set(1);
}

void start_from_environment(bool under_interposer) {
  {
    std::lock_guard<std::mutex> lock(g_engine_mu);
    if (g_env_done) return;
    g_env_done = true;
  }
  const char* text = option_value(Option::kTiering);
  if (!text) return;
  Config c = parse_config(text, "CXLPOOL_TIERING");
  if (under_interposer)
    for (const std::string& m : c.monitors)
      if (m == "sample")
        fail(CXLPOOL_E_CONFIG,
             "CXLPOOL_TIERING: monitor 'sample' is refused under the interposer: an unmodified program's system "
             "calls on heap memory (execve arguments, reads into buffers) would fail with EFAULT on sampled pages, and "
             "its threads that block SIGSEGV would die; use pagemap_scan");
  if (c.enabled) start(c);
}

void stop() noexcept {
  Engine* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_engine_mu);
    e = g_engine;
    g_engine = nullptr;
  }
  delete e;
  counters().running.set(0);
  std::lock_guard<std::mutex> lock(g_hints_mu);
  hint_queue().clear();
}

bool running() noexcept {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  return g_engine != nullptr;
}

cxlpool_status_t hint_access(const void* p, size_t len, uint32_t weight, std::string* why) noexcept {
  auto say = [&](cxlpool_status_t s, const char* text) {
    if (why) {
      try {
        *why = text;
      } catch (...) {
      }
    }
    return s;
  };
  if (!p || !len) return say(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_hint_access: p is NULL or len is 0");
  if (!weight || weight > 1'000'000)
    return say(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_hint_access: weight must be 1 to 1000000");
  alloc::PtrInfo info;
  if (!alloc::ptr_info(p, &info) && !alloc::owns(p))
    return say(CXLPOOL_E_NOT_FOUND, "cxlpool_hint_access: not memory of a cxlpool pool");
  if (!running()) return say(CXLPOOL_E_NOT_SUPPORTED, "cxlpool_hint_access: the tiering engine is not running");
  alloc::Unit u;
  if (!alloc::unit_of(p, &u))
    return say(CXLPOOL_E_NOT_SUPPORTED,
               "cxlpool_hint_access: this memory does not move (its pool has one device, or is shared)");
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(g_hints_mu);
  c.hints.v.fetch_add(1, std::memory_order_relaxed);
  if (hint_queue().size() >= kMaxQueuedHints) {
    ++g_hints_dropped;
    return CXLPOOL_OK;  // advisory; counted
  }
  try {
    hint_queue().push_back({reinterpret_cast<uintptr_t>(p), len, weight});
  } catch (...) {
    return say(CXLPOOL_E_NO_MEMORY, "cxlpool_hint_access: out of memory");
  }
  return CXLPOOL_OK;
}

void pin(const void* p, size_t len, int tier) {
  if (!p || !len) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: p is NULL or len is 0");
  if (tier < -1 || tier >= kMaxTiers)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: tier " + std::to_string(tier) + " (0 = fastest .. " +
                                         std::to_string(kMaxTiers - 1) + ", or -1 to unpin)");
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a + len < a) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: range wraps around");
  counters().pins.add(1);  // calls with valid arguments, refused ones too
  // A running engine's monitors stop watching a unit while it moves (as for the engine's own
  // moves): the engine stays while this pin runs.
  std::lock_guard<std::mutex> engine_lock(g_engine_mu);
  alloc::PoolsAlive alive;  // the units' Pool pointers stay valid until the moves are done
  // Every unit overlapping the range, first checked, then moved.
  std::vector<alloc::Unit> units;
  for (uintptr_t at = a; at < a + len;) {
    alloc::Unit u;
    if (!alloc::unit_of(reinterpret_cast<const void*>(at), &u)) {
      if (!alloc::owns(reinterpret_cast<const void*>(at)))
        fail(CXLPOOL_E_NOT_FOUND,
             "cxlpool_pin: " + std::to_string(at - a) + " bytes into the range is not memory of a cxlpool pool");
      fail(CXLPOOL_E_NOT_SUPPORTED, "cxlpool_pin: this memory does not move (its pool has one device, or is shared)");
    }
    units.push_back(u);
    constexpr uintptr_t kSeg = uintptr_t(4) << 20;  // a huge span's address space is whole segments
    uintptr_t next = u.ref.base + (u.huge ? (u.size + kSeg - 1) / kSeg * kSeg : u.size);
    if (next <= at) break;
    at = next;
  }
  for (const alloc::Unit& u : units) {
    if (tier < 0) continue;
    int to = -1;
    for (int di = 0; di < alloc::pool_device_count(u.pool); ++di)
      if (tier_of(u.pool, di) == tier) {
        const Device& d = alloc::pool_device_of(u.pool, di);
        if (to < 0 || d.committed() + u.committed <= d.ledger().capacity) to = di;
        if (d.committed() + u.committed <= d.ledger().capacity) break;
      }
    if (to < 0)
      fail(CXLPOOL_E_NOT_SUPPORTED,
           "cxlpool_pin: pool '" + alloc::pool_name(u.pool) + "' has no device of tier " + std::to_string(tier));
  }
  for (const alloc::Unit& u : units) {
    if (tier >= 0 && tier_of(u.pool, u.resident) != tier) {
      int to = -1;
      for (int di = 0; di < alloc::pool_device_count(u.pool) && to < 0; ++di)
        if (tier_of(u.pool, di) == tier) {
          const Device& d = alloc::pool_device_of(u.pool, di);
          if (d.committed() + u.committed <= d.ledger().capacity) to = di;
        }
      if (to < 0)
        fail(CXLPOOL_E_CAPACITY, "cxlpool_pin: no device of tier " + std::to_string(tier) + " in pool '" +
                                     alloc::pool_name(u.pool) + "' has room for " + std::to_string(u.committed) +
                                     " more bytes");
      alloc::UnitMove result;
      std::string why;
      cxlpool_status_t st =
          alloc::move_unit(u.ref, to, &result, &why, g_engine ? Engine::monitor_hook : nullptr, g_engine);
      Counters& c = counters();
      c.moves.add(1);
      if (st != CXLPOOL_OK) {
        c.move_failures.add(1);
        if (st != CXLPOOL_E_NOT_SUPPORTED) c.pgmigrate_fail.add(u.committed / kPage);
        fail(st, "cxlpool_pin: " + why);
      }
      const bool promote = tier_of(u.pool, to) < tier_of(u.pool, u.resident);
      (promote ? c.pgpromote_success : c.pgdemote_success).add(result.bytes / kPage);
      (promote ? c.promote_bytes : c.demote_bytes).add(result.bytes);
    }
    std::lock_guard<std::mutex> lock(g_pins_mu);
    if (tier < 0)
      pins_table().erase(u.ref.base);
    else
      pins_table()[u.ref.base] = {u.ref.serial, tier};
  }
}

std::string stats_json() {
  JsonWriter j;
  j.begin_object();
  std::lock_guard<std::mutex> lock(g_engine_mu);
  j.key("running").value(g_engine != nullptr);
  j.key("config").value(g_engine ? describe(g_engine->config()) : std::string("off"));
  j.key("monitors").begin_array();
  for (const MonitorInfo& m : detect_monitors()) {
    bool active = false;
    if (g_engine)
      for (const std::string& n : g_engine->config().monitors) active |= n == m.name;
    j.begin_object().key("name").value(m.name).key("available").value(m.availability.available);
    j.key("active").value(active).key("reason").value(m.availability.reason).end_object();
  }
  j.end_array();
  if (g_engine) g_engine->json(j);
  const Counters& c = counters();
  j.key("counters").begin_object();
  for (const CounterField& f : kCounterFields) j.key(f.desc.name).value((c.*f.member).get());
  j.end_object();
  j.key("tiers").begin_array();
  for (int t = 0; t < kMaxTiers; ++t) {
    if (!c.resident_bytes[t].get() && !c.hot_bytes[t].get()) continue;
    j.begin_object().key("tier").value(uint64_t(t)).key("resident_bytes").value(c.resident_bytes[t].get());
    j.key("hot_bytes").value(c.hot_bytes[t].get()).end_object();
  }
  j.end_array().end_object();
  return j.str() + "\n";
}

void fork_prepare() noexcept {
  g_engine_mu.lock();
  g_pins_mu.lock();
  g_hints_mu.lock();
}

void fork_parent() noexcept {
  g_hints_mu.unlock();
  g_pins_mu.unlock();
  g_engine_mu.unlock();
}

void after_fork_child() noexcept {
  // The thread is not in the child; its Engine (and the lock, which the parent's atfork
  // prepare did not take) are left as they were: a fresh lock, no engine.
  new (&g_engine_mu) std::mutex();
  new (&g_hints_mu) std::mutex();
  new (&g_pins_mu) std::mutex();
  Engine::after_fork_child();
  g_engine = nullptr;  // leaked on purpose: its destructor would join a thread that is not here
  counters().running.set(0);
  hint_queue().clear();
}

}  // namespace cxlpool::detail::tiering

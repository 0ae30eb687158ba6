// SPDX-License-Identifier: MIT
// The tiering engine (engine.hpp): the thread, the unit table with heat, hints and pins, the
// byte budget, each step's snapshot for the planner (planner.hpp) and its moves handed to the
// mover (mover.hpp), pin(), counters and the JSON view.
#include "tiering/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "alloc/pool.hpp"
#include "common/env_once.hpp"
#include "common/error.hpp"
#include "common/json.hpp"
#include "config/options.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/thread.hpp"
#include "os/write_fence.hpp"
#include "tiering/capacity.hpp"
#include "tiering/counters.hpp"
#include "tiering/monitor.hpp"
#include "tiering/monitor_sample.hpp"
#include "tiering/mover.hpp"
#include "tiering/planner.hpp"

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
  uint64_t call = 0;  // the cxlpool_pin call that wrote it (g_pin_calls)
};
std::atomic<uint64_t> g_pin_calls{0};

// Pins outlive engine restarts; hints are dropped when no engine runs. The mutexes are
// constant-initialised; the containers are made on first use, because the interposer may
// start the engine before this library's dynamic initialisers have run. No move runs under
// g_pins_mu: pin() writes a pin before it moves the unit, and the engine reads it in its move's
// hook (pin_allows), atomically with the unit's becoming moving under its home lock. So a pin
// written before that point declines the engine's move, and a pin written after it finds the
// unit moving (BUSY), waits for the engine's move to end and then moves the unit itself: a unit
// just pinned is never left where an engine step that saw it before the pin put it.
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

// Whether u's pin lets it move to tier to_tier. Asked under the unit's home lock, so it must
// not wait for g_pins_mu: pin() takes home locks under it, and fork() holds it while it waits
// for moves to end. Not getting it says no; the caller asks again later.
bool pin_allows(const alloc::Unit& u, int to_tier) noexcept {
  std::unique_lock<std::mutex> lock(g_pins_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const auto pin = pins_table().find(u.ref.base);
  return pin == pins_table().end() || pin->second.serial != u.ref.serial || pin->second.tier == to_tier;
}
// The same for device `to` of u's pool: a withdrawal's move back (alloc::PinCheck).
bool pin_lets_move(const alloc::Unit& u, int to) noexcept { return pin_allows(u, tier_of(u.pool, to)); }

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
  static bool monitor_hook(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t st) {
    return move_hook(ctx, u, after, st);
  }

 private:
  // The engine's own moves: declined where a pin forbids them (read as the unit becomes moving).
  struct StepHook {
    Engine* engine;
    int to_tier;
  };
  static bool step_hook(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t st) {
    auto* h = static_cast<StepHook*>(ctx);
    if (!after && !pin_allows(u, h->to_tier)) return false;
    return move_hook(h->engine, u, after, st);
  }
  static bool move_hook(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t) {
    for (auto& m : static_cast<Engine*>(ctx)->monitors_) {
      if (after)
        m->watch(u.ref.base, u.size);  // the mapping was replaced (or left as it was): arm again
      else
        m->unwatch(u.ref.base, u.size);
    }
    return true;
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

  // The standard error of a unit's heat: of an exponentially weighted mean whose terms weigh
  // `weight` each, from their weighted variance.
  static double noise(const State& s) { return std::sqrt(s.spread * s.weight / (2 - s.weight)); }

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

  // ---- policy (planner.hpp) and moves (mover.hpp) -----------------------------------------
  // The planner's moves, carried out by the mover on the engine's units.
  class StepMover final : public planner::Executor {
   public:
    StepMover(Engine& e, os::write_fence::Mode fence_mode) : e_(e), fence_(fence_mode) {}
    planner::Outcome execute(const planner::Move& m) override {
      State& s = e_.units_[m.unit];
      StepHook hook{&e_, tier_of(s.pool, m.to)};  // a pin made since this step began declines it
      MoveResult r = move_unit_to(s, m.to, MoveOptions{&fence_, true, step_hook, &hook});
      if (r.status == CXLPOOL_OK) {
        s.resident = m.to;
      } else if (r.attempted) {
        std::lock_guard<std::mutex> lock(e_.view_mu_);
        e_.last_error_ = std::move(r.why);
      }
      return planner::Outcome{r.status, r.attempted, r.bytes};
    }

   private:
    Engine& e_;
    FenceCheck fence_;
  };

  // The planner's view of the units: their pools, and every device of those pools with its
  // room now, listed by address (the order fast devices are visited in).
  planner::Input planner_input(uint64_t now) const {
    planner::Input in;
    in.policy.hot = cfg_.hot;
    in.policy.cold = cfg_.cold;
    in.policy.hysteresis = cfg_.hysteresis;
    in.policy.promote = cfg_.promote;
    in.policy.demote = cfg_.demote;
    in.policy.min_residence_ns = cfg_.min_residence_ns;
    in.policy.kernel_moves_numa = cfg_.kernel != KernelMode::kOwn && kernel_tiers_;
    in.tokens = tokens_;
    in.now = now;
    std::vector<const alloc::Pool*> pool_list;
    std::map<const alloc::Pool*, int> pool_index;
    std::map<const Device*, int> devices;
    for (const State& s : units_)
      if (pool_index.emplace(s.pool, int(pool_list.size())).second) pool_list.push_back(s.pool);
    for (const alloc::Pool* pool : pool_list)
      for (int di = 0; di < alloc::pool_device_count(pool); ++di) devices.emplace(&alloc::pool_device_of(pool, di), 0);
    for (auto& [d, index] : devices) {
      index = int(in.devices.size());
      in.devices.push_back({room_of(*d, cfg_.high_percent, cfg_.low_percent), d->caps().kind == CXLPOOL_BACKING_NUMA});
    }
    for (const alloc::Pool* pool : pool_list) {
      planner::Pool p;
      for (int di = 0; di < alloc::pool_device_count(pool); ++di)
        p.devices.push_back({devices[&alloc::pool_device_of(pool, di)], tier_of(pool, di)});
      in.pools.push_back(std::move(p));
    }
    in.units.reserve(units_.size());
    for (const State& s : units_) {
      planner::Unit u;
      u.pool = pool_index[s.pool];
      u.home = s.home;
      u.resident = s.resident;
      u.committed = s.committed;
      u.pin = s.pin;
      u.heat = s.heat;
      u.noise = noise(s);
      u.moved_at = s.moved_at;
      u.refused_until = s.refused_until;
      u.refusals = s.refusals;
      in.units.push_back(u);
    }
    return in;
  }

  void plan_and_move() {
    planner::Input in = planner_input(os::monotonic_ns());
    StepMover mover(*this, fence_.mode);
    const planner::Summary sum = planner::run(in, mover);
    for (size_t i = 0; i < units_.size(); ++i) {
      units_[i].moved_at = in.units[i].moved_at;
      units_[i].refused_until = in.units[i].refused_until;
      units_[i].refusals = in.units[i].refusals;
    }
    tokens_ = in.tokens;
    counters().budget_deferred.add(sum.budget_deferred);
    std::lock_guard<std::mutex> lock(view_mu_);
    max_interval_bytes_ = std::max(max_interval_bytes_, sum.spent);
  }

  void set_budget() {
    uint64_t per_s = cfg_.budget_bytes_per_s;
    std::string source;  // budget_source_ is json()'s to read under view_mu_
    if (per_s) {
      source = "configured";
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
        source = "a tenth of the slowest device's declared bandwidth (" + std::to_string(slowest) + " MB/s)";
      } else {
        per_s = kDefaultBudget;
        source = "200 MB/s: no device declares a bandwidth";
      }
    }
    std::lock_guard<std::mutex> lock(view_mu_);
    budget_source_ = std::move(source);
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
  uint64_t tokens_ = 0;       // engine thread only: the budget's bucket
  int numa_balancing_ = 0;
  bool kernel_tiers_ = false;
  std::string kernel_reason_;
  os::write_fence::Probe fence_;  // written under view_mu_ (read by the engine thread without it)
  std::string fence_reason_;
  std::mutex view_mu_;  // what json() reads
  uint64_t budget_per_interval_ = 0, max_interval_bytes_ = 0, window_view_ = 0;
  std::string budget_source_, last_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  os::Thread thread_;
};

std::mutex g_engine_mu;
Engine* g_engine = nullptr;
// Moves made outside the engine's thread (pin(), a withdrawal's) that use the running engine's
// monitor hook: the engine is not deleted while any runs. Counted under g_engine_mu, which is
// never held across a move (a long pin would stall the engine, hints and fork()).
int g_engine_users = 0;
EnvOnce g_env;

// The running engine (or none), kept alive for as long as this lives.
class EngineUse {
 public:
  EngineUse() {
    std::lock_guard<std::mutex> lock(g_engine_mu);
    e_ = g_engine;
    if (e_) ++g_engine_users;
  }
  ~EngineUse() {
    if (!e_) return;
    std::lock_guard<std::mutex> lock(g_engine_mu);
    --g_engine_users;
  }
  EngineUse(const EngineUse&) = delete;
  EngineUse& operator=(const EngineUse&) = delete;
  alloc::UnitHook hook() const { return e_ ? Engine::monitor_hook : nullptr; }
  void* ctx() const { return e_; }

 private:
  Engine* e_ = nullptr;
};

}  // namespace

namespace {
// A withdrawal's moves (alloc/elastic.cpp) while the engine runs: its monitors stop watching
// the unit while it moves, as for pin(); the engine stays until the move is done.
bool outside_move_begin(alloc::UnitHook* hook, void** ctx) noexcept {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  if (!g_engine) return false;
  ++g_engine_users;
  *hook = Engine::monitor_hook;
  *ctx = g_engine;
  return true;
}
void outside_move_end() noexcept {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  --g_engine_users;
}
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
  g_env.run([under_interposer] {
    const char* text = option_value(Option::kTiering);
    if (!text) return;
    Config c = parse_config(text, "CXLPOOL_TIERING");
    if (under_interposer)
      for (const std::string& m : c.monitors)
        if (m == "sample")
          fail(CXLPOOL_E_CONFIG,
               "CXLPOOL_TIERING: monitor 'sample' is refused under the interposer: an unmodified program's system "
               "calls on heap memory (execve arguments, reads into buffers) would fail with EFAULT on sampled pages, "
               "and its threads that block SIGSEGV would die; use pagemap_scan");
    if (c.enabled) start(c);
  });
}

void stop() noexcept {
  Engine* e = nullptr;
  {
    std::unique_lock<std::mutex> lock(g_engine_mu);
    e = g_engine;
    g_engine = nullptr;
    // A move outside the engine's thread may still call its hook: each ends (it never waits
    // for this lock while it moves). Rare (a stop), so a poll rather than a condition variable
    // (the interposer may run this before dynamic initialisation).
    while (e && g_engine_users > 0) {
      lock.unlock();
      os::prim::sleep_ms(1);
      lock.lock();
    }
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
  c.hints.add(1);
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

namespace {

// pin()'s own moves: made only while this call's pin is still the unit's, read under its home
// lock as it becomes moving (as the engine's, pin_allows): a second pin of the same
// memory written since declines it (replaced), so the last pin written is the last to move.
struct PinHook {
  void* engine;   // the running engine's monitors stop watching the unit while it moves
  uint64_t call;  // the pin the unit must still have: this pin() call's (0: none at all)
  bool replaced;
  static bool before_move(void* ctx, const alloc::Unit& u, bool after, cxlpool_status_t st) {
    auto* h = static_cast<PinHook*>(ctx);
    if (!after) {
      std::unique_lock<std::mutex> lock(g_pins_mu, std::try_to_lock);
      if (!lock.owns_lock()) return false;  // tried again
      const auto pin = pins_table().find(u.ref.base);
      if (h->call == 0 ? pin != pins_table().end() : pin == pins_table().end() || pin->second.call != h->call) {
        h->replaced = true;
        return false;
      }
    }
    return !h->engine || Engine::monitor_hook(h->engine, u, after, st);
  }
};

// A pool as the planner sees it, for pin()'s choice of device: its devices' tiers and room now.
struct PoolView {
  planner::Pool pool;
  std::vector<planner::Device> devices;
};
PoolView pool_view(const alloc::Pool* pool) {
  PoolView v;
  for (int di = 0; di < alloc::pool_device_count(pool); ++di) {
    const Device& d = alloc::pool_device_of(pool, di);
    v.devices.push_back({room_of(d), d.caps().kind == CXLPOOL_BACKING_NUMA});
    v.pool.devices.push_back({di, tier_of(pool, di)});
  }
  return v;
}

}  // namespace

void pin(const void* p, size_t len, int tier) {
  if (!p || !len) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: p is NULL or len is 0");
  if (tier < -1 || tier >= kMaxTiers)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: tier " + std::to_string(tier) + " (0 = fastest .. " +
                                         std::to_string(kMaxTiers - 1) + ", or -1 to unpin)");
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a + len < a) fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_pin: range wraps around");
  counters().pins.add(1);               // calls with valid arguments, refused ones too
  alloc::set_pin_check(pin_lets_move);  // from the first pin on, a withdrawal's returns respect pins
  // A running engine's monitors stop watching a unit while it moves (as for the engine's own
  // moves): the engine stays while this pin runs. No global lock is held across a move.
  const EngineUse engine;
  const uint64_t call = g_pin_calls.fetch_add(1, std::memory_order_relaxed) + 1;
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
  for (const alloc::Unit& u : units)
    if (tier >= 0 && planner::first_of_tier(pool_view(u.pool).pool, tier) < 0)
      fail(CXLPOOL_E_NOT_SUPPORTED,
           "cxlpool_pin: pool '" + alloc::pool_name(u.pool) + "' has no device of tier " + std::to_string(tier));
  auto no_room = [&](const alloc::Unit& u) {
    return "cxlpool_pin: no device of tier " + std::to_string(tier) + " in pool '" + alloc::pool_name(u.pool) +
           "' has room for " + std::to_string(u.committed) + " more bytes";
  };
  // Room for the whole range first: a range that cannot all go is refused before anything moves.
  // A unit moving now is judged after that move (below): it may be going to this tier already.
  {
    std::map<const alloc::Pool*, PoolView> views;
    for (const alloc::Unit& u : units) {
      if (tier < 0 || u.moving || tier_of(u.pool, u.resident) == tier) continue;
      auto it = views.find(u.pool);
      if (it == views.end()) it = views.emplace(u.pool, pool_view(u.pool)).first;
      const int to = planner::first_of_tier_with_room(it->second.pool, it->second.devices, tier, u.committed);
      if (to < 0) fail(CXLPOOL_E_CAPACITY, no_room(u));
      it->second.devices[size_t(to)].room.committed += u.committed;
    }
  }
  // What was done to each unit so far, so that a later refusal undoes it: the pin it had, and
  // the device it left.
  struct Done {
    uintptr_t base;
    std::optional<Pin> before;
    int from;  // -1: not moved
  };
  std::vector<Done> done;
  // Only where this call's pin is still the unit's: a pin of the same memory made by another
  // thread since then stands.
  auto restore_pin = [&](const Done& d) {
    const auto now = pins_table().find(d.base);
    const bool mine = tier < 0 ? now == pins_table().end() : now != pins_table().end() && now->second.call == call;
    if (!mine) return false;
    if (d.before)
      pins_table()[d.base] = *d.before;
    else
      pins_table().erase(d.base);
    return true;
  };
  auto undo_and_fail = [&](cxlpool_status_t status, std::string why) {
    size_t not_back = 0;
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      bool mine = false;
      {
        std::lock_guard<std::mutex> lock(g_pins_mu);
        mine = restore_pin(*it);  // first: the engine may move it again by the pin it had
      }
      // Moved back only while the pin it had is still its own: a pin another call made since
      // stands, with the unit where that call put it.
      for (unsigned wait_ms = 1; mine && it->from >= 0; wait_ms = std::min(wait_ms * 2, 8u)) {
        alloc::Unit now;
        if (!alloc::unit_of(reinterpret_cast<const void*>(it->base), &now)) break;
        if (now.moving) {
          os::prim::sleep_ms(wait_ms);
          continue;
        }
        if (now.resident == it->from) break;
        PinHook hook{engine.ctx(), it->before ? it->before->call : 0, false};
        const MoveResult r = move_unit_to(now, it->from, MoveOptions{nullptr, false, PinHook::before_move, &hook});
        if (r.status == CXLPOOL_OK || hook.replaced) break;
        const bool again =
            (r.status == CXLPOOL_E_BUSY && r.unit_moving) || (r.status == CXLPOOL_E_NOT_SUPPORTED && !r.attempted);
        if (!again) {
          ++not_back;
          break;
        }
        os::prim::sleep_ms(wait_ms);  // a move of it runs, or the pin table was busy: try again
      }
    }
    if (done.size() > 1)
      why += not_back ? " (" + std::to_string(not_back) + " units of the range that had moved could not go back)"
                      : " (the units of the range that had moved went back)";
    fail(status, why);
  };
  for (const alloc::Unit& listed : units) {
    {
      // The pin is written before the move (see g_pins_mu); the unit is read again under the
      // lock, as the engine may have moved it since it was listed.
      std::lock_guard<std::mutex> lock(g_pins_mu);
      alloc::Unit u;
      if (!alloc::unit_of(reinterpret_cast<const void*>(listed.ref.base), &u) || u.ref.serial != listed.ref.serial)
        goto freed;
      std::map<uintptr_t, Pin>& table = pins_table();
      const auto had = table.find(u.ref.base);
      done.push_back({u.ref.base, had != table.end() ? std::optional<Pin>(had->second) : std::nullopt, -1});
      if (tier < 0)
        table.erase(u.ref.base);
      else
        table[u.ref.base] = {u.ref.serial, tier, call};
    }
    // Moved until it is on the tier. BUSY for a move of it already running (the engine's, a
    // withdrawal's, another pin's) is waited out: that move ends, and the unit is then moved
    // from wherever it put it.
    for (unsigned wait_ms = 1; tier >= 0; wait_ms = std::min(wait_ms * 2, 8u)) {
      alloc::Unit u;
      if (!alloc::unit_of(reinterpret_cast<const void*>(listed.ref.base), &u) || u.ref.serial != listed.ref.serial)
        goto freed;
      if (u.moving) {  // where it is now says nothing: wait for that move to end
        os::prim::sleep_ms(wait_ms);
        continue;
      }
      if (tier_of(u.pool, u.resident) == tier) break;
      const PoolView view = pool_view(u.pool);  // room now: earlier units of the range moved
      const int to = planner::first_of_tier_with_room(view.pool, view.devices, tier, u.committed);
      MoveResult r;
      PinHook hook{engine.ctx(), call, false};
      if (to >= 0) r = move_unit_to(u, to, MoveOptions{nullptr, false, PinHook::before_move, &hook});
      if (to >= 0 && r.status == CXLPOOL_OK) {
        if (done.back().from < 0) done.back().from = u.resident;
        break;
      }
      if (hook.replaced) {
        const std::string why = "cxlpool_pin: another cxlpool_pin of the same memory replaced this one during the call";
        done.pop_back();  // its pin is the other call's now
        undo_and_fail(CXLPOOL_E_BUSY, why);
      }
      if (to >= 0 &&
          ((r.status == CXLPOOL_E_BUSY && r.unit_moving) || (r.status == CXLPOOL_E_NOT_SUPPORTED && !r.attempted))) {
        os::prim::sleep_ms(wait_ms);  // a move of it runs, or the pin table was busy: try again
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(g_pins_mu);
        restore_pin(done.back());
      }
      if (done.back().from < 0) done.pop_back();
      undo_and_fail(to < 0 ? CXLPOOL_E_CAPACITY : r.status, to < 0 ? no_room(u) : "cxlpool_pin: " + r.why);
    }
  }
  return;
freed:
  undo_and_fail(CXLPOOL_E_NOT_FOUND, "cxlpool_pin: memory of the range was freed during the call");
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

void after_fork_child(bool prepared) noexcept {
  // The thread is not in the child: no engine there. Its Engine object is left as it was.
  if (prepared) {
    g_hints_mu.unlock();
    g_pins_mu.unlock();
    g_engine_mu.unlock();
  } else {
    new (&g_engine_mu) std::mutex();
    new (&g_hints_mu) std::mutex();
    new (&g_pins_mu) std::mutex();
  }
  Engine::after_fork_child();
  g_engine = nullptr;  // leaked on purpose: its destructor would join a thread that is not here
  g_engine_users = 0;  // the parent's movers are not in the child
  counters().running.set(0);
  hint_queue().clear();
}

}  // namespace cxlpool::detail::tiering

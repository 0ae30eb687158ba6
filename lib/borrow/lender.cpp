// SPDX-License-Identifier: MIT
// The lender of a borrowed device (lender.hpp): runs of a shared pool's extents taken as
// large blocks of this process's participant on the device's quota, so that the pool's own
// rules hold for them unchanged: the quota's grant bounds them, a refused run records demand
// for a composer, and when the process dies its recovery frees them (blocks never exported
// have no other holder). A run is zeroed before the device uses it: it may hold another
// process's bytes. The follower thread gives runs back: when the quota is over a lowered
// grant (withdrawing them from the device first, which moves what they hold to the pools'
// other devices), when the device stopped using them for kIdleReturnMs, and when the device
// was closed.
#include "borrow/lender.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "alloc/pool.hpp"
#include "borrow/borrow.hpp"
#include "common/error.hpp"
#include "device/registry.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/thread.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::borrow {

namespace {

constexpr uint64_t kMinRun = uint64_t(4) << 20;  // one allocator segment
constexpr size_t kFollowerStack = size_t(256) << 10;

struct Run {
  uint64_t lo = 0, hi = 0;   // offsets in the pool's object (= the device's offset space)
  void* block = nullptr;     // the large block in the participant's mapping
  uint64_t empty_since = 0;  // monotonic ns the run was first seen holding no reservation; 0: in use
};

struct Lender {
  std::string device;         // the device's name
  std::string what;           // for messages: "device 'far' (pool shm:jobs, quota a)"
  uint64_t generation = 0;    // os::fork_generation() of the process that borrowed (a fork child's copy is not it)
  std::weak_ptr<void> token;  // held by the device's storage: expired once nothing maps the runs
  uint64_t max_bytes = 0;     // declared max_size; 0: the grant decides
  uint64_t floor_bytes = 0;   // declared size (whole extents): borrowed at open, and again after a reclaim
  std::unique_ptr<shared::SharedPool> pool;
  uint64_t extent_size = 0;
  std::mutex mu;  // runs and counters
  std::vector<Run> runs;
  uint64_t borrowed = 0, returned = 0, reclaimed = 0, busy = 0;
  uint64_t last_committed = 0, rose_at = 0;  // the follower's: when the device's committed bytes last rose
  uint64_t floor_retry_at = 0;               // the follower's: no borrowing back to the floor before (a refusal)
  uint64_t recovered_at = 0;                 // (mu) when a refusal last had dead participants recovered
  std::string location;                      // the pool's
  // (mu) The pool failed or evicted this participant: every run was taken away (lost), and
  // nothing is borrowed again; failure says why, for refusals.
  bool gone = false;
  std::string failure;
  uint64_t lost_runs = 0, lost_bytes = 0;
};

// Bumped (and futex-woken) when a pool fails or evicts a participant of this process: the
// follower wakes at once instead of at its next period.
uint32_t g_wake = 0;

std::mutex g_mu;                                  // g_lenders, g_follower_generation
std::vector<std::shared_ptr<Lender>>* g_lenders;  // never destroyed: the follower may run at exit
uint64_t g_follower_generation = UINT64_MAX;
os::Thread* g_follower = nullptr;  // this process's follower (a fork child starts its own)

std::vector<std::shared_ptr<Lender>> lenders() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_lenders) return {};
  return *g_lenders;
}

std::shared_ptr<Lender> lender_of(const std::string& device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_lenders) return nullptr;
  std::shared_ptr<Lender> found;  // the newest: an older one of that name is a closed device's
  for (auto& l : *g_lenders)
    if (l->device == device && l->generation == os::fork_generation() && !l->token.expired()) found = l;
  return found;
}

uint64_t round_up(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

uint64_t held_bytes(Lender& l) {
  uint64_t b = 0;
  for (auto& r : l.runs) b += r.hi - r.lo;
  return b;
}

// A run of bytes (whole extents) from the pool, zeroed; false when the quota or the pool has
// no room (the pool noted the demand) and *why says so. Caller holds l.mu (or has l to itself).
bool take_run(Lender& l, uint64_t bytes, Run* out, std::string* why) {
  void* p = nullptr;
  try {
    p = l.pool->alloc(bytes);
  } catch (const Failure& f) {
    if (why) *why = f.what();
    return false;
  }
  uint64_t off = 0;
  if (!l.pool->user_offset(p, &off)) {  // cannot happen: the block is the pool's
    l.pool->free(p);
    if (why) *why = "the pool's block is outside its mapping";
    return false;
  }
  std::memset(p, 0, bytes);
  out->lo = off;
  out->hi = off + bytes;
  out->block = p;
  ++l.borrowed;
  return true;
}

void give_run(Lender& l, const Run& r) {
  try {
    l.pool->free(r.block);
  } catch (const Failure&) {
    // Evicted or failed pool: the extents are the recoverer's now, nothing of ours to free.
  }
  ++l.returned;
}

// ---- The follower ------------------------------------------------------------------------

// Withdraws the online parts of [lo, hi) from the device (moving what they hold); true when
// none of it is online any more.
bool withdraw(Device& dev, uint64_t lo, uint64_t hi) {
  for (const Device::Extent& e : dev.online_extents()) {
    const uint64_t a = std::max(lo, e.lo), b = std::min(hi, e.hi);
    if (a >= b) continue;
    alloc::CapacityReport report;
    std::string message;
    if (alloc::device_withdraw_extent(dev.name(), a, b - a, &report, &message) != CXLPOOL_OK) return false;
  }
  return true;
}

// The device's room: what it keeps free before it borrows ahead of need (a spill policy's
// watermark never sends an allocation to a full device, so nothing would ask on its own).
uint64_t target_room(const Device& dev) { return std::max(kMinRun, dev.capacity() / 8); }

// The pool failed (its file removed, replaced or truncated; declared failed) or evicted this
// participant (its runs recovered by others, maybe lent again): every run is taken from the
// device as a forced release that reads, writes and frees nothing of it (lost, reported), so
// the program's next touch of what it held finds zeroed memory of its own instead of a fault
// or another's data, and its policy places new blocks on its other devices (a pool of another
// failure domain). DCD's forced release, with the pool in the fabric manager's place.
void lose_runs(Lender& l, Device& dev) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    first = !l.gone;
    l.gone = true;  // nothing is borrowed any more from here on
  }
  if (first) {
    const bool evicted = l.pool->evicted() && !l.pool->failed();
    std::string state = evicted ? "evicted this process" : "failed", reason, domain;
    try {
      const cxlpool_shared_health_t h = l.pool->health();  // never touches the pool's memory
      reason.assign(h.reason, strnlen(h.reason, sizeof h.reason));
      domain.assign(h.failure_domain, strnlen(h.failure_domain, sizeof h.failure_domain));
    } catch (const Failure& f) {
      reason = f.what();
    }
    std::string failure = "shared pool " + l.location + " (failure domain " + (domain.empty() ? "?" : domain) + ") " +
                          state + (reason.empty() ? "" : ": " + reason);
    std::lock_guard<std::mutex> lock(l.mu);
    l.failure = std::move(failure);
  }
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    failure = l.failure;
  }
  // Every online range is a run (the device's capacity is what it borrowed): lost by whole
  // ranges, one report line each, not one per run. A range that cannot go now (another
  // withdrawal of the device in progress, no host memory) is tried again at the next pass.
  uint64_t lost = 0;
  for (const Device::Extent& e : dev.online_extents()) {
    alloc::CapacityReport report;
    std::string message;
    (void)alloc::device_lose_extent(dev.name(), e.lo, e.hi - e.lo, failure, &report, nullptr, &message);
    lost += report.lost_bytes;
  }
  const bool all_gone = dev.online_extents().empty();
  std::lock_guard<std::mutex> lock(l.mu);
  l.lost_bytes += lost;
  if (!all_gone) return;
  l.lost_runs += l.runs.size();
  l.runs.clear();  // not freed: the pool is gone, or they are the recoverer's now
}

// One pass over a lender: runs go back while the quota is over a lowered grant (the emptiest
// first, moving what they hold; at most what the quota exceeds it by, in whole runs); a run
// is borrowed ahead of need while the device fills and has less than target_room free; and
// (check_idle) runs that stayed empty for kIdleReturnMs go back while the room stays above
// twice the target (so an idle device keeps one, and borrowing and returning never alternate).
void follow(Lender& l, const std::shared_ptr<Device>& dev, bool check_idle) {
  bool gone = false, holding = false;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    gone = l.gone;
    holding = !l.runs.empty();
  }
  if (gone || l.pool->lost_now()) {
    if (!gone || holding) lose_runs(l, *dev);
    return;
  }
  const uint64_t now = os::monotonic_ns();
  {
    // Runs the device no longer has online (withdrawn by hand, or a resize downward) serve
    // nothing: they go back at once, or the quota would stay full of them.
    std::lock_guard<std::mutex> lock(l.mu);
    for (auto it = l.runs.begin(); it != l.runs.end();) {
      if (dev->online_in(it->lo, it->hi) || !dev->range_unreserved(it->lo, it->hi)) {
        ++it;
        continue;
      }
      give_run(l, *it);
      it = l.runs.erase(it);
    }
  }
  const uint64_t committed = dev->committed();
  if (committed > l.last_committed) l.rose_at = now;
  l.last_committed = committed;
  uint64_t excess = 0;
  if (l.pool->over_grant()) {
    try {
      excess = l.pool->quota_excess() * l.extent_size;
    } catch (const Failure&) {
      excess = 0;
    }
  }
  const uint64_t target = target_room(*dev);
  const uint64_t room = dev->capacity() - std::min(dev->capacity(), committed);
  if (excess == 0 && room < target && now - l.rose_at < uint64_t{kIdleReturnMs} * 1000000u) {
    dev->grow_on_request(kMinRun);  // at least a run; a refusal records the quota's demand for a composer
    return;
  }
  // Below its declared size (a reclaim took runs back): borrowed again once the grant allows,
  // or a device emptied under a spill policy would never be offered anything to grow on. A
  // refusal (the quota still at its grant) waits kIdleReturnMs before the next try.
  if (excess == 0 && dev->capacity() < l.floor_bytes && now >= l.floor_retry_at) {
    if (!dev->grow_on_request(l.floor_bytes - dev->capacity()))
      l.floor_retry_at = now + uint64_t{kIdleReturnMs} * 1000000u;
    return;
  }
  if (excess == 0 && !check_idle) return;
  std::vector<Run> candidates;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    for (Run& r : l.runs) {
      if (dev->range_unreserved(r.lo, r.hi)) {
        if (r.empty_since == 0) r.empty_since = now;
      } else {
        r.empty_since = 0;
      }
    }
    candidates = l.runs;
  }
  // Empty runs first (nothing moves), the longest empty first; then the rest.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Run& a, const Run& b) {
    if ((a.empty_since == 0) != (b.empty_since == 0)) return a.empty_since != 0;
    return a.empty_since < b.empty_since;
  });
  std::vector<const Run*> give;
  uint64_t planned = 0;
  for (const Run& r : candidates)
    if (planned < excess) {
      give.push_back(&r);
      planned += r.hi - r.lo;
    }
  const size_t for_grant = give.size();
  if (check_idle) {
    uint64_t left = room, held = dev->capacity();  // never below the declared size (borrowed back at once)
    for (const Run& r : candidates) {
      const uint64_t len = r.hi - r.lo;
      if (r.empty_since == 0 || now - r.empty_since < uint64_t{kIdleReturnMs} * 1000000u) continue;
      if (std::find(give.begin(), give.end(), &r) != give.end() || left < len || left - len < 2 * target) continue;
      if (held < len || held - len < l.floor_bytes) continue;
      give.push_back(&r);
      left -= len;
      held -= len;
    }
  }
  for (size_t i = 0; i < give.size(); ++i) {
    const Run r = *give[i];
    // Other participants of the quota give back too: what it still exceeds its grant by is
    // read again before each run moves, so together they take no more than the reclaim asked.
    if (i < for_grant && i > 0) {
      bool still = false;
      try {
        still = l.pool->over_grant() && l.pool->quota_excess() > 0;
      } catch (const Failure&) {
      }
      if (!still) continue;
    }
    const bool ok = withdraw(*dev, r.lo, r.hi);
    std::lock_guard<std::mutex> lock(l.mu);
    if (!ok) {
      if (i < for_grant) ++l.busy;
      continue;
    }
    auto it = std::find_if(l.runs.begin(), l.runs.end(), [&](const Run& x) { return x.lo == r.lo; });
    // A run goes back only once none of it is online and nothing holds it: the pool hands it
    // to the next borrower, who zeroes it.
    if (it == l.runs.end() || dev->online_in(r.lo, r.hi) || !dev->range_unreserved(r.lo, r.hi)) continue;
    l.runs.erase(it);
    give_run(l, r);
    if (i < for_grant) ++l.reclaimed;
  }
}

void follower_main() {
  os::prim::block_async_signals(nullptr);
  // Its own allocations go to the interposer's internal heap: one from the program's pools
  // could need this very thread to borrow (and wait on what it holds).
  alloc::enter_internal_scope();
  uint64_t pass = 0;
  for (;;) {
    const uint32_t seen = __atomic_load_n(&g_wake, __ATOMIC_ACQUIRE);
    os::prim::futex_wait(&g_wake, seen, int(kFollowPeriodMs));
    ++pass;
    const bool check_idle = pass % 10 == 0;
    for (const std::shared_ptr<Lender>& l : lenders()) {
      if (l->generation != os::fork_generation()) continue;  // a fork child: the parent's runs are not ours
      std::shared_ptr<void> token = l->token.lock();
      if (!token) {
        // The device's storage is gone, and with it every mapping of the runs.
        {
          std::lock_guard<std::mutex> lock(l->mu);
          for (const Run& r : l->runs) give_run(*l, r);
          l->runs.clear();
        }
        std::lock_guard<std::mutex> lock(g_mu);
        g_lenders->erase(std::remove(g_lenders->begin(), g_lenders->end(), l), g_lenders->end());
        continue;
      }
      size_t matches = 0;
      std::shared_ptr<Device> dev = registry::find(l->device, &matches);
      if (!dev || matches != 1 || dev->provider_state() != token.get()) continue;  // being opened, or not told apart
      follow(*l, dev, check_idle);
    }
  }
}

void start_follower() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_follower_generation == os::fork_generation()) return;
  g_follower = new os::Thread();  // never joined: it runs until the process ends
  g_follower->start(follower_main, kFollowerStack, "borrowed capacity", "cxlpool/borrow");
  g_follower_generation = os::fork_generation();
}

}  // namespace

void wake_follower() noexcept {
  __atomic_fetch_add(&g_wake, 1, __ATOMIC_RELEASE);
  os::prim::futex_wake(&g_wake);
}

Source split_source(const std::string& path) {
  const size_t colon = path.find(':'), at = path.find('@');
  if (at != std::string::npos && (colon == std::string::npos || at < colon))
    return {path.substr(0, at), path.substr(at + 1)};
  return {"", path};
}

namespace {

void open_runs(const BackingSpec& spec, const Source& src, const std::string& quota, const std::shared_ptr<Lender>& l,
               StorageOpen* out) {
  l->extent_size = l->pool->view().extent_size();
  const uint64_t want = round_up(std::max(spec.capacity, kMinRun), l->extent_size);
  l->floor_bytes = want;
  if (l->max_bytes && want > l->max_bytes)
    fail(CXLPOOL_E_CONFIG, l->what + ": size " + std::to_string(want) + " (whole extents) exceeds max_size " +
                               std::to_string(l->max_bytes));
  Run first;
  std::string why;
  bool got = false;
  {
    // No lock: the lender is this thread's alone until it is published below (and l->mu is
    // never taken under the registry's lock, which a device's construction holds).
    // Extents of participants that died since anyone looked come back first (a program that
    // ran before this one left its runs to the next recovery).
    got = take_run(*l, want, &first, &why);
    if (!got) {
      l->recovered_at = os::monotonic_ns();
      try {
        l->pool->recover_dead_now();
      } catch (const Failure&) {
      }
      got = take_run(*l, want, &first, &why);
    }
    // Refused: the device opens empty and waits for its grant. The follower asks for size=
    // again every second, so the quota's demand stays written for a composer (a refusal that
    // failed the open would leave with the program, and a composer that reclaimed an idle
    // quota would never see it wanted back); its allocations meanwhile fail over to the
    // policy's other devices, or fail naming the refusal.
    if (got) l->runs.push_back(first);
  }
  if (!got) out->refusal = "borrowing size=" + std::to_string(want) + " bytes from " + l->what + " was refused: " + why;
  // The device maps the pool's object at the runs' offsets through a descriptor of its own
  // (on failure the run goes back with the lender: open_lender).
  const shared::PoolLocation loc = shared::locate_pool(src.location);
  SharedObject obj = loc.ops->open(loc.spec, true, l->what);
  out->fd = obj.release();
  out->description = "extents of shared pool " + src.location + " (quota " + quota + ")";
  out->space = l->pool->view().size();
  if (got) out->online.push_back({first.lo, first.hi});
  auto token = std::make_shared<int>(0);
  out->state = token;
  l->token = token;
}

}  // namespace

void open_lender(const BackingSpec& spec, StorageOpen* out) {
  const Source src = split_source(spec.path);
  const std::string quota = src.quota.empty() ? "default" : src.quota;
  auto l = std::make_shared<Lender>();
  l->device = spec.device_name;
  l->what = "device '" + spec.device_name + "' (borrowing from " + src.location + ", quota " + quota + ")";
  l->location = src.location;
  l->generation = os::fork_generation();
  l->max_bytes = spec.max_space;
  shared::SharedParams params;
  params.quota = quota;
  try {
    l->pool = shared::SharedPool::open(src.location, &params);
  } catch (const Failure& f) {
    fail(f.status(), l->what + ": " + f.what());
  }
  try {
    open_runs(spec, src, quota, l, out);
  } catch (...) {
    // The pool's threads are joined when it closes, and one of them may be allocating: under
    // the interposer that waits for its initialisation, which this thread may be running. The
    // follower closes it instead (an expired lender: its runs go back, the pool closes there).
    try {
      std::lock_guard<std::mutex> lock(g_mu);
      if (!g_lenders) g_lenders = new std::vector<std::shared_ptr<Lender>>();
      g_lenders->push_back(l);
    } catch (...) {
      new std::shared_ptr<Lender>(l);  // out of host memory: kept open, never closed here
    }
    try {
      start_follower();
    } catch (...) {
      new std::shared_ptr<Lender>(l);
    }
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_lenders) g_lenders = new std::vector<std::shared_ptr<Lender>>();
    g_lenders->push_back(l);
  }
  start_follower();
}

bool grow(const BackingSpec& spec, uint64_t bytes, Provider::AddRange add, void* ctx, char* why, size_t why_len) {
  std::shared_ptr<Lender> l = lender_of(spec.device_name);
  if (!l) {
    std::snprintf(why, why_len, "the device's lender is gone (a fork child's copy, or a device being closed)");
    return false;
  }
  std::unique_lock<std::mutex> lock(l->mu);
  if (l->gone) {
    std::snprintf(why, why_len, "it cannot grow: %s", l->failure.c_str());
    return false;
  }
  try {
    l->runs.reserve(l->runs.size() + 1);  // recording a run that is online cannot fail
  } catch (...) {
    std::snprintf(why, why_len, "out of host memory");
    return false;
  }
  const uint64_t held = held_bytes(*l);
  const uint64_t need = round_up(std::max(bytes, kMinRun), l->extent_size);
  // Larger runs as the device grows (fewer borrowings for a program that keeps growing),
  // what is needed when the larger one is refused.
  const uint64_t larger = round_up(std::max(need, held / 4), l->extent_size);
  std::string refused = "max_size=" + std::to_string(l->max_bytes) + " is borrowed already";
  // Runs of programs that ended (a normal exit leaves them to a recovery, like a crash: the
  // program may touch them to its last instruction) come back first, at most once a second.
  const uint64_t now = os::monotonic_ns();
  bool recovered = now - l->recovered_at < uint64_t{kIdleReturnMs} * 1000000u;
  for (uint64_t run : {larger, need, need}) {
    if (l->max_bytes && held + run > l->max_bytes) continue;
    Run r;
    if (!take_run(*l, run, &r, &refused)) {
      if (run == need && !recovered) {  // the last try comes after a recovery, or not at all
        recovered = true;
        l->recovered_at = now;
        try {
          l->pool->recover_dead_now();
          continue;
        } catch (const Failure&) {
        }
      }
      if (run == need) break;
      continue;
    }
    // Online before l->mu is released: the follower gives back a run with none of it online
    // (withdrawn), and a run recorded but not yet added would look like one.
    if (!add(ctx, r.lo, r.hi)) {
      give_run(*l, r);
      std::snprintf(why, why_len, "the device could not add the borrowed run (out of host memory)");
      return false;
    }
    l->runs.push_back(r);
    return true;
  }
  lock.unlock();  // the registry's lock is never taken under l->mu
  std::snprintf(why, why_len, "borrowing %llu bytes more from %s was refused: %s",
                static_cast<unsigned long long>(need), l->what.c_str(), refused.c_str());
  if (std::shared_ptr<Device> dev = registry::find(spec.device_name))
    dev->ledger().elastic.borrow_refusals.fetch_add(1, std::memory_order_relaxed);
  return false;
}

std::vector<Standing> standings() {
  std::vector<Standing> out;
  for (const std::shared_ptr<Lender>& l : lenders()) {
    std::lock_guard<std::mutex> lock(l->mu);
    Standing s;
    s.device = l->device;
    s.runs = l->runs.size();
    s.bytes = held_bytes(*l);
    s.borrowed = l->borrowed;
    s.returned = l->returned;
    s.reclaimed = l->reclaimed;
    s.busy = l->busy;
    s.lost_runs = l->lost_runs;
    s.lost_bytes = l->lost_bytes;
    s.failure = l->failure;
    out.push_back(s);
  }
  return out;
}

}  // namespace cxlpool::detail::borrow

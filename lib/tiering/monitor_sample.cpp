// SPDX-License-Identifier: MIT
// The "sample" monitor: reads and writes, by sampling. arm() starts a period with a bounded
// sample: random pages of the watched ranges that are present and read-write right now, made
// PROT_NONE through os::sample_trap, whose table the process's one SIGSEGV handler
// (os/sample_trap.cpp) consults. collect() ends it: the armed pages are reported as observed,
// those the program touched as touched, and the others are made accessible again. A touch
// costs the program one fault; the pages armed per period are capped by the period's budget
// (SampleOptions::fault_cost_ns each).
//
// Rules kept: a page that was not present and read-write when armed is never armed (PROT_NONE
// and uncommitted pages of a reservation are left alone); a page is only ever made accessible
// again by us if it is still present (a page its owner decommitted meanwhile, madvise
// DONTNEED + mprotect NONE, is no longer present and stays as the owner left it); every such
// change in a range runs inside the owner's lock (set_range_lock). Hazards left to the caller
// (docs/tiering.md): a system call that reads or writes an armed page fails with EFAULT, so
// "sample" is opt-in, refused under the interposer and announced on stderr when the engine
// starts with it; a range must be unwatched before it is moved.
#include "tiering/monitor_sample.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "common/random.hpp"
#include "device/device.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/sample_trap.hpp"
#include "os/uffd.hpp"
#include "os/vm_query.hpp"
#include "tiering/monitor_internal.hpp"

namespace cxlpool::detail::tiering {

size_t sample_budget(const SampleOptions& o, uint64_t budget_ns) noexcept {
  const double pages = double(budget_ns) / double(o.fault_cost_ns ? o.fault_cost_ns : 1);
  size_t n = pages > double(o.max_pages) ? o.max_pages : size_t(pages);
  n = std::max(n, o.min_pages);
  return std::min({n, o.max_pages, os::sample_trap::kMaxPages});
}

namespace {

namespace trap = os::sample_trap;
namespace uffd = os::uffd;
namespace vmq = os::vm_query;

constexpr size_t kRuns = 4096;
// The trap table is process-wide: one sample monitor at a time.
std::atomic<bool> g_exists{false};

class SampleMonitor final : public Monitor {
 public:
  SampleMonitor(const SampleOptions& o, int pagemap)
      : opts_(o),
        pagemap_(os::prim::move_fd_high(pagemap)),
        rng_(o.seed),
        present_(kRuns),
        cand_(kRuns),
        touched_(trap::kMaxPages),
        untouched_(trap::kMaxPages),
        picks_(trap::kMaxPages) {
    // The descriptor goes high and is identity-checked before every use: a program that closes
    // descriptors it did not open, and gets the number back for a file of its own, never
    // receives our ioctls, nor our close.
    if (os::prim::file_id(pagemap_, &pagemap_id_) != 0) pagemap_lost_ = true;
    rw_.reserve(kRuns);
  }
  ~SampleMonitor() override {
    // Ranges still watched are forgotten, their memory untouched: an owner unwatches what it
    // still has first (the engine does), and what it no longer has is not ours to change.
    std::lock_guard<std::mutex> guard(mu_);
    for (auto& [addr, len] : ranges_) end_period(addr, len, nullptr, false);
    trap::released();
    trap::clear();
    if (pagemap_ours()) os::prim::close_fd(pagemap_);
    g_exists.store(false, std::memory_order_release);
  }

  const char* name() const noexcept override { return "sample"; }
  AccessKind sees() const noexcept override { return AccessKind::kAny; }

  int watch(uintptr_t addr, size_t len) noexcept override {
    const size_t ps = os::page_size();
    if (len == 0 || (addr & (ps - 1)) || (len & (ps - 1))) return EINVAL;
    std::lock_guard<std::mutex> guard(mu_);
    auto it = ranges_.lower_bound(addr);
    if (it != ranges_.end() && it->first < addr + len && it->first != addr) return EEXIST;
    if (it != ranges_.begin() && std::prev(it)->first + std::prev(it)->second > addr) return EEXIST;
    if (it != ranges_.end() && it->first == addr) {
      // Watched again: its mapping was replaced. Its armed pages went with the old mapping
      // (the new one is not PROT_NONE by our hand): forget them. The owner's lock is held.
      end_period(addr, it->second, nullptr, false);
      trap::released();
      it->second = len;
      return 0;
    }
    try {
      ranges_.emplace(addr, len);
    } catch (...) {
      return ENOMEM;
    }
    return 0;
  }

  void unwatch(uintptr_t addr, size_t len) noexcept override {
    std::lock_guard<std::mutex> guard(mu_);  // the owner's lock is held by the caller
    auto it = ranges_.find(addr);
    if (it == ranges_.end()) return;
    // Its own snapshot (unwatch runs on any thread; the engine's snapshot is the engine's).
    snapshot_protections(addr, addr + std::max(len, it->second), &unwatch_prots_, &unwatch_nprots_);
    end_period(addr, std::max(len, it->second), nullptr, true, unwatch_prots_, unwatch_nprots_);
    trap::released();
    ranges_.erase(it);
  }

  void collect(HeatSink& sink) noexcept override {
    const uint64_t t0 = os::monotonic_ns();
    snapshot_all();
    each_range_locked([&](uintptr_t a, size_t n) { end_period(a, n, &sink, true); });
    finish_period();
    scan_ns_ += os::monotonic_ns() - t0;
  }

  void arm(uint64_t budget_ns) noexcept override {
    const uint64_t t0 = os::monotonic_ns();
    snapshot_all();
    // A period not collected yet ends unreported.
    each_range_locked([&](uintptr_t a, size_t n) { end_period(a, n, nullptr, true); });
    finish_period();
    if (!pagemap_ours()) return;  // present pages cannot be told: nothing is armed
    // Each armed page may split its mapping in three: what is left of the process's VMA
    // budget bounds the sample too.
    const VmaUse v = vma_use();
    const uint64_t vma_room = v.budget > v.vmas ? (v.budget - v.vmas) / 2 : 0;
    const size_t budget = size_t(std::min<uint64_t>(sample_budget(opts_, budget_ns), vma_room));
    size_t total = 0;
    for (auto& [addr, len] : snapshot_) total += len;
    each_range_locked([&](uintptr_t a, size_t n) {
      if (!total) return;
      size_t share = size_t((unsigned __int128)budget * n / total);
      if (share == 0 && budget) share = 1;
      arm_range(a, n, share);
    });
    scan_ns_ += os::monotonic_ns() - t0;
  }

  uint64_t faults() const noexcept override { return trap::touches() - touches_at_start_; }
  uint64_t scan_ns() const noexcept override { return scan_ns_; }
  void set_range_lock(const RangeLock& l) noexcept override {
    std::lock_guard<std::mutex> guard(mu_);
    lock_ = l;
  }

 private:
  // Runs body(addr, len) for every watched range with its owner's lock held, then the
  // monitor's (in that order: the owner calls unwatch() with its lock held, from its release
  // path). A range unwatched meanwhile is skipped; one whose owner says it is gone is
  // forgotten without touching its memory.
  template <class Body>
  void each_range_locked(Body&& body) noexcept {
    {
      std::lock_guard<std::mutex> guard(mu_);
      try {
        snapshot_.assign(ranges_.begin(), ranges_.end());
      } catch (...) {
        snapshot_.clear();
        return;
      }
    }
    struct Call {
      SampleMonitor* self;
      uintptr_t addr;
      size_t len;
      Body* body;
    };
    void (*run)(void*) noexcept = [](void* p) noexcept {
      auto* c = static_cast<Call*>(p);
      std::lock_guard<std::mutex> guard(c->self->mu_);
      auto it = c->self->ranges_.find(c->addr);
      if (it == c->self->ranges_.end() || it->second != c->len) return;  // unwatched meanwhile
      (*c->body)(c->addr, c->len);
    };
    for (const auto& [addr, len] : snapshot_) {
      Call call{this, addr, len, &body};
      const bool ran = lock_.run_locked ? lock_.run_locked(lock_.ctx, addr, len, run, &call) : (run(&call), true);
      if (ran) continue;
      std::lock_guard<std::mutex> guard(mu_);
      auto it = ranges_.find(addr);
      if (it == ranges_.end()) continue;
      end_period(addr, it->second, nullptr, false);
      ranges_.erase(it);
    }
  }

  void finish_period() noexcept {
    std::lock_guard<std::mutex> guard(mu_);
    trap::released();
    trap::clear();
  }

  uint64_t next() noexcept { return rng_.next(); }

  bool pagemap_ours() noexcept {
    if (pagemap_lost_) return false;
    os::prim::FileId now;
    if (os::prim::file_id(pagemap_, &now) != 0 || !(now == pagemap_id_)) pagemap_lost_ = true;
    return !pagemap_lost_;
  }

  // The protections of [b, e) now, into *out (ascending runs, *count of them; none when they
  // cannot be read: then nothing is restored nor armed).
  static void snapshot_protections(uintptr_t b, uintptr_t e, std::vector<vmq::ProtRun>* out, size_t* count) noexcept {
    size_t n = 0;
    for (;;) {
      if (out->empty()) {
        try {
          out->resize(kRuns);
        } catch (...) {
          break;
        }
      }
      int err = vmq::protection_runs(b, e, out->data(), out->size(), &n);
      if (err == ENOSPC && out->size() < (size_t(1) << 20)) {
        try {
          out->resize(out->size() * 4);
          continue;
        } catch (...) {
        }
      }
      if (err) n = 0;
      break;
    }
    *count = n;
  }
  // ... over the span of every watched range (one read of /proc/self/maps per period).
  void snapshot_all() noexcept {
    uintptr_t b = 0, e = 0;
    {
      std::lock_guard<std::mutex> guard(mu_);
      if (ranges_.empty()) {
        nprots_ = 0;
        return;
      }
      b = ranges_.begin()->first;
      e = std::prev(ranges_.end())->first + std::prev(ranges_.end())->second;
    }
    snapshot_protections(b, e, &prots_, &nprots_);
  }
  // The protection of page p in a snapshot (vm_query bits), or -2 when unknown.
  static int prot_of(const std::vector<vmq::ProtRun>& prots, size_t n, uintptr_t p) noexcept {
    auto it = std::upper_bound(prots.begin(), prots.begin() + ptrdiff_t(n), p,
                               [](uintptr_t a, const vmq::ProtRun& r) { return a < r.begin; });
    if (it == prots.begin()) return -2;
    --it;
    return p < it->end ? it->prot : -2;
  }

  // Present (or swapped: still committed) runs of [a, a+n), into present_; false if the walk
  // failed (then nothing is treated as present).
  size_t present_runs(uintptr_t a, size_t n) noexcept {
    if (!pagemap_ours()) return 0;
    uffd::ScanRequest req;
    req.start = a;
    req.end = a + n;
    req.category_anyof = uffd::kPagePresent | uffd::kPageSwapped;
    req.return_mask = uffd::kPagePresent;
    size_t total = 0;
    while (req.start < req.end && total < present_.size()) {
      size_t got = 0;
      uintptr_t walk_end = req.end;
      if (uffd::pagemap_scan(pagemap_, req, present_.data() + total, present_.size() - total, &got, &walk_end))
        return 0;
      total += got;
      if (total < present_.size() || walk_end <= req.start) break;
      req.start = walk_end;
    }
    return total;
  }

  // Ends the period of one range (its owner's lock and mu_ held): armed pages to sink as
  // observed, touched ones as touched; untouched ones made accessible again (restore) when
  // they are still PROT_NONE as we left them (the snapshot: a page the program re-protected
  // keeps its protection; one the owner decommitted was forgotten by the device layer), or
  // forgotten (the mapping they were armed in was replaced or is gone).
  void end_period(uintptr_t a, size_t n, HeatSink* sink, bool restore) noexcept {
    end_period(a, n, sink, restore, prots_, nprots_);
  }
  void end_period(uintptr_t a, size_t n, HeatSink* sink, bool restore, const std::vector<vmq::ProtRun>& prots,
                  size_t nprots) noexcept {
    size_t nt = 0, nu = 0;
    trap::stop(a, a + n, touched_.data(), touched_.size(), &nt, untouched_.data(), untouched_.size(), &nu);
    if (restore)
      for (size_t i = 0; i < nu; ++i)
        if (prot_of(prots, nprots, untouched_[i]) == 0) trap::restore(untouched_[i]);
    if (sink) {
      const size_t ps = os::page_size();
      for (size_t i = 0; i < nt; ++i) {
        sink->touched(touched_[i], ps, AccessKind::kAny, 1);
        sink->observed(touched_[i], ps);
      }
      for (size_t i = 0; i < nu; ++i) sink->observed(untouched_[i], ps);
    }
  }

  // Arms up to want random pages of [a, a+n) that are read-write (in the snapshot) and
  // present now (its owner's lock and mu_ held).
  void arm_range(uintptr_t a, size_t n, size_t want) noexcept {
    if (!want) return;
    const size_t ps = os::page_size();
    // The range's read-write runs, from the snapshot.
    rw_.clear();
    for (size_t k = 0; k < nprots_; ++k) {
      const vmq::ProtRun& r = prots_[k];
      if (r.end <= a || r.begin >= a + n || r.prot != (vmq::kRead | vmq::kWrite)) continue;
      try {
        rw_.push_back(vmq::Run{std::max<uintptr_t>(r.begin, a), std::min<uintptr_t>(r.end, a + n)});
      } catch (...) {
        break;
      }
    }
    const size_t nrw = rw_.size();
    const size_t np = nrw ? present_runs(a, n) : 0;
    // Candidates: present runs clipped to read-write runs (both ascending).
    size_t nc = 0, i = 0, j = 0, pages = 0;
    while (i < nrw && j < np && nc < cand_.size()) {
      const uintptr_t b = std::max<uintptr_t>(rw_[i].begin, present_[j].start);
      const uintptr_t en = std::min<uintptr_t>(rw_[i].end, present_[j].end);
      if (b < en) {
        cand_[nc++] = vmq::Run{b, en};
        pages += (en - b) / ps;
      }
      if (rw_[i].end < present_[j].end)
        ++i;
      else
        ++j;
    }
    if (pages) {
      // k distinct page indexes in [0, pages), ascending: selection sampling (every page
      // visited) when k is a large part of pages, otherwise random draws sorted (duplicates,
      // about k*k/2/pages of them, are dropped).
      size_t k = std::min({want, pages, picks_.size()});
      if (k * 4 >= pages) {
        size_t chosen = 0;
        for (size_t idx = 0; idx < pages && chosen < k; ++idx)
          if (next() % (pages - idx) < k - chosen) picks_[chosen++] = idx;
        k = chosen;
      } else {
        for (size_t x = 0; x < k; ++x) picks_[x] = next() % pages;
        std::sort(picks_.begin(), picks_.begin() + ptrdiff_t(k));
      }
      size_t run = 0, before = 0, last = SIZE_MAX;
      for (size_t x = 0; x < k; ++x) {
        const size_t idx = picks_[x];
        if (idx == last) continue;
        last = idx;
        while ((cand_[run].end - cand_[run].begin) / ps + before <= idx) {
          before += (cand_[run].end - cand_[run].begin) / ps;
          ++run;
        }
        if (trap::arm(cand_[run].begin + (idx - before) * ps) == EBUSY) break;
      }
    }
  }

  SampleOptions opts_;
  int pagemap_;
  os::prim::FileId pagemap_id_{};
  bool pagemap_lost_ = false;
  Xorshift64Star rng_;
  std::vector<vmq::Run> rw_;
  std::vector<uffd::PageRun> present_;
  std::vector<vmq::Run> cand_;
  std::vector<uintptr_t> touched_, untouched_;
  std::vector<size_t> picks_;
  std::vector<vmq::ProtRun> prots_;  // the engine thread's snapshot (arm, collect)
  size_t nprots_ = 0;
  std::vector<vmq::ProtRun> unwatch_prots_;  // unwatch's (any thread, under mu_)
  size_t unwatch_nprots_ = 0;
  std::mutex mu_;
  std::map<uintptr_t, size_t> ranges_;
  std::vector<std::pair<uintptr_t, size_t>> snapshot_;  // ranges_ as each_range_locked() found them
  RangeLock lock_;
  uint64_t scan_ns_ = 0;
  uint64_t touches_at_start_ = trap::touches();
};

}  // namespace

void sample_after_fork_child() noexcept {
  // The parent's monitor is not the child's (its engine is not here): the child may make one.
  trap::disarm_in_fork_child();
  g_exists.store(false, std::memory_order_relaxed);
}

MonitorAvailability detect_sample() {
  MonitorAvailability a;
  int pagemap = -1;
  if (int e = uffd::open_pagemap(&pagemap)) {
    a.reason = "open(/proc/self/pagemap) = " + errno_name(e) + " (needed to find present pages)";
    return a;
  }
  os::prim::close_fd(pagemap);
  a.available = true;
  a.reason =
      "mprotect(PROT_NONE) on a bounded random sample of present read-write pages, first touches counted by the "
      "shared SIGSEGV handler (reads and writes); opt-in: a system call writing an armed page gets EFAULT";
  return a;
}

std::unique_ptr<Monitor> make_sample_monitor(const SampleOptions& options, std::string* why_not) {
  bool expected = false;
  if (!g_exists.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
    if (why_not) *why_not = "a sample monitor already exists in this process (the trap table is process-wide)";
    return nullptr;
  }
  int pagemap = -1;
  if (int e = uffd::open_pagemap(&pagemap)) {
    g_exists.store(false, std::memory_order_release);
    if (why_not) *why_not = "open(/proc/self/pagemap) = " + errno_name(e);
    return nullptr;
  }
  try {
    return std::make_unique<SampleMonitor>(options, pagemap);
  } catch (...) {
    g_exists.store(false, std::memory_order_release);
    os::prim::close_fd(pagemap);
    if (why_not) *why_not = "out of memory";
    return nullptr;
  }
}

}  // namespace cxlpool::detail::tiering

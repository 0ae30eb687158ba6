// SPDX-License-Identifier: MIT
// The "pagemap_scan" monitor: write heat from userfaultfd async write-protection. Watched
// ranges are registered with a userfaultfd in async write-protect mode. arm() write-protects
// either every watched range (exact) or, when that would cost the program more than the
// period's budget, a sample: chunks of a few pages at an even stride (random offset) over the
// ranges end to end. The first write to a protected page takes a fault the kernel resolves by
// itself (it clears the page's uffd-wp bit), so nothing ever waits on us and system calls may
// write watched pages. collect() asks PAGEMAP_SCAN which armed pages were written since
// (PAGE_IS_WRITTEN), without changing any protection: scans flush no TLB.
//
// The cost model (monitor_pagemap_scan.hpp) counts what the program pays: a fault per armed
// page it writes, and a TLB-flush IPI per protection call that changes page table entries.
// Armed pages that are not written stay protected after their period (a later write costs
// one fault; undoing them would cost an IPI each); only the current period's pages are read.
//
// Cases handled: a full output buffer (continue from walk_end); a range whose mapping was
// replaced behind the monitor's back (PM_SCAN_CHECK_WPASYNC stops at the unregistered VMA
// with EPERM: the range reports nothing and is never registered again by the monitor, whose
// memory it may no longer be, until its owner calls watch() again); an unmapped range (the
// others go on); PROT_NONE parts (protected like the rest: nothing is written there);
// anonymous, memfd private and shared memory. THPs in a watched range are split by the kernel
// at the first write after a protection (docs/tiering.md has the measured effect).
#include "tiering/monitor_pagemap_scan.hpp"

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "common/random.hpp"
#include "os/fs_root.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/uffd.hpp"
#include "tiering/monitor_internal.hpp"

namespace cxlpool::detail::tiering {

PagemapScanPlan pagemap_scan_plan(const PagemapScanOptions& o, size_t ranges, size_t pages,
                                  uint64_t budget_ns) noexcept {
  PagemapScanPlan plan;
  if (!ranges || !pages) return plan;
  const double exact = double(ranges) * o.protect_cost_ns + double(pages) * o.fault_cost_ns;
  if (exact <= double(budget_ns)) {
    plan.exact = true;
    return plan;
  }
  const size_t c = std::max<uint32_t>(1, o.chunk_pages);
  const double per_chunk = double(o.protect_cost_ns) + double(c) * o.fault_cost_ns;
  const double fit = per_chunk > 0 ? double(budget_ns) / per_chunk : double(o.max_chunks);
  size_t chunks = fit >= double(o.max_chunks) ? o.max_chunks : size_t(fit);
  chunks = std::min(chunks, std::max<size_t>(1, pages / c));
  if (!chunks) return plan;
  plan.chunks = chunks;
  plan.chunk_pages = c;
  return plan;
}

namespace {

namespace uffd = os::uffd;

constexpr size_t kRunsPerCall = 1024;

std::string kernel_release() {
  auto r = os::FsRoot("/proc").read("sys/kernel/osrelease");
  return r ? *r : std::string("unknown");
}

std::string sysctl(const char* rel) {
  auto r = os::FsRoot("/proc").read(std::string("sys/") + rel);
  return r ? *r : std::string("?");
}

class PagemapScanMonitor final : public Monitor {
 public:
  PagemapScanMonitor(const PagemapScanOptions& o, const uffd::WpAsync& u, int pagemap)
      : opts_(o), uffd_(u), pagemap_(pagemap), rng_(o.seed), runs_(kRunsPerCall) {
    chunks_.reserve(std::max<size_t>(1, o.max_chunks));
    // Our descriptors go high, and their identities are checked before every use: a program
    // that closes descriptors it did not open, and gets the numbers back for its own files,
    // must never receive our ioctls. Once one is not ours any more the monitor stops.
    uffd_.fd = os::prim::move_fd_high(uffd_.fd);
    pagemap_ = os::prim::move_fd_high(pagemap_);
    if (os::prim::file_id(uffd_.fd, &uffd_id_) || os::prim::file_id(pagemap_, &pagemap_id_)) lost_fds_ = true;
  }
  ~PagemapScanMonitor() override {
    if (!fds_ours()) return;  // not ours to use, and not ours to close
    for (auto& [addr, r] : ranges_) uffd::unregister(uffd_.fd, addr, r.len);
    os::prim::close_fd(uffd_.fd);
    os::prim::close_fd(pagemap_);
  }

  const char* name() const noexcept override { return "pagemap_scan"; }
  AccessKind sees() const noexcept override { return AccessKind::kWrite; }

  int watch(uintptr_t addr, size_t len) noexcept override {
    const size_t ps = page();
    if (len == 0 || (addr & (ps - 1)) || (len & (ps - 1))) return EINVAL;
    std::lock_guard<std::mutex> lock(mu_);
    if (!fds_ours()) return EBADF;
    if (int e = uffd::register_wp(uffd_.fd, addr, len)) return e;
    forget_period(addr, len);  // a new mapping: what was armed went with the old one
    try {
      ranges_[addr] = Range{len, false, false};
    } catch (...) {
      uffd::unregister(uffd_.fd, addr, len);
      return ENOMEM;
    }
    return 0;
  }

  void unwatch(uintptr_t addr, size_t len) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.find(addr);
    if (it != ranges_.end()) ranges_.erase(it);
    forget_period(addr, len);
    if (!fds_ours()) return;
    // Unregistering also clears the uffd-wp bits and markers: the memory is as it was.
    uffd::unregister(uffd_.fd, addr, len);
  }

  void arm(uint64_t budget_ns) noexcept override {
    const uint64_t t0 = os::monotonic_ns();
    std::lock_guard<std::mutex> lock(mu_);
    chunks_.clear();
    if (!fds_ours()) return;
    size_t nranges = 0, pages = 0;
    for (auto& [addr, r] : ranges_) {
      r.armed = false;
      if (r.dead) continue;
      ++nranges;
      pages += r.len / page();
    }
    const PagemapScanPlan plan = pagemap_scan_plan(opts_, nranges, pages, budget_ns);
    if (plan.exact) {
      for (auto& [addr, r] : ranges_)
        if (!r.dead) r.armed = uffd::write_protect(uffd_.fd, addr, r.len, true) == 0;
    } else if (plan.chunks) {
      // Chunk k starts at page offset + k * stride of the ranges taken end to end.
      const size_t stride = pages / plan.chunks;
      size_t pos = size_t(next() % stride), before = 0;
      for (auto& [addr, r] : ranges_) {
        if (r.dead) continue;
        const size_t n = r.len / page();
        for (; pos < before + n && chunks_.size() < plan.chunks; pos += stride) {
          const size_t first = pos - before;
          const size_t len = std::min(plan.chunk_pages, n - first) * page();
          const uintptr_t at = addr + first * page();
          if (uffd::write_protect(uffd_.fd, at, len, true) == 0) chunks_.push_back(Chunk{at, len});
        }
        before += n;
      }
    }
    scan_ns_ += os::monotonic_ns() - t0;
  }

  void collect(HeatSink& sink) noexcept override {
    const uint64_t t0 = os::monotonic_ns();
    std::lock_guard<std::mutex> lock(mu_);
    if (!fds_ours()) {
      chunks_.clear();
      return;
    }
    for (auto& [addr, r] : ranges_) {
      if (!r.armed || r.dead) continue;
      r.armed = false;
      scan(addr, addr + r.len, r, sink);
    }
    // Chunks ascend with their ranges; one scan per chunk (a few pages each).
    auto range = ranges_.begin();
    for (const Chunk& c : chunks_) {
      while (range != ranges_.end() && range->first + range->second.len <= c.addr) ++range;
      if (range == ranges_.end()) break;
      if (range->second.dead || c.addr < range->first) continue;
      scan(c.addr, c.addr + c.len, range->second, sink);
    }
    chunks_.clear();
    scan_ns_ += os::monotonic_ns() - t0;
  }

  uint64_t faults() const noexcept override { return faults_; }
  uint64_t scan_ns() const noexcept override { return scan_ns_; }

 private:
  struct Range {
    size_t len = 0;
    bool dead = false;   // its mapping was replaced behind us: skipped until watch()
    bool armed = false;  // protected whole in this period
  };
  struct Chunk {
    uintptr_t addr;
    size_t len;
  };

  static size_t page() noexcept {
    static const size_t ps = os::page_size();
    return ps;
  }

  uint64_t next() noexcept { return rng_.next(); }

  // The period's chunks inside [addr, addr+len) are not ours to read any more.
  void forget_period(uintptr_t addr, size_t len) noexcept {
    chunks_.erase(std::remove_if(chunks_.begin(), chunks_.end(),
                                 [&](const Chunk& c) { return c.addr >= addr && c.addr < addr + len; }),
                  chunks_.end());
  }

  // Reports the written pages of [lo, hi) (armed this period), each walked part as observed.
  void scan(uintptr_t lo, uintptr_t hi, Range& r, HeatSink& sink) noexcept {
    uffd::ScanRequest req;
    req.start = lo;
    req.end = hi;
    req.check_wp_async = true;
    req.category_mask = uffd::kPageWritten;
    req.return_mask = uffd::kPageWritten;
    while (req.start < req.end) {
      size_t n = 0;
      uintptr_t walk_end = req.end;
      int e = uffd::pagemap_scan(pagemap_, req, runs_.data(), runs_.size(), &n, &walk_end);
      if (e == EPERM) {
        // Part of the range is no longer registered: its mapping was replaced (a move, a
        // release, a MAP_FIXED). It is never registered again from here: the memory there may
        // not be ours any more. Nothing more of this period is reported for it, and it is left
        // alone until its owner calls watch() again.
        r.dead = true;
        ++lost_;
        return;
      }
      if (e) {
        ++errors_;
        return;
      }
      const bool covered = n < runs_.size() || walk_end <= req.start;
      const uintptr_t walked = covered ? req.end : walk_end;
      for (size_t i = 0; i < n; ++i) {
        const uffd::PageRun& run = runs_[i];
        sink.touched(uintptr_t(run.start), size_t(run.end - run.start), AccessKind::kWrite, 1);
        faults_ += (run.end - run.start) / page();
      }
      sink.observed(req.start, walked - req.start);
      if (covered) break;
      req.start = walk_end;
    }
  }

  bool fds_ours() noexcept {
    if (lost_fds_) return false;
    os::prim::FileId a, b;
    if (os::prim::file_id(uffd_.fd, &a) || !(a == uffd_id_) || os::prim::file_id(pagemap_, &b) || !(b == pagemap_id_))
      lost_fds_ = true;
    return !lost_fds_;
  }

  PagemapScanOptions opts_;
  uffd::WpAsync uffd_;
  int pagemap_;
  Xorshift64Star rng_;
  os::prim::FileId uffd_id_, pagemap_id_;
  bool lost_fds_ = false;
  std::vector<uffd::PageRun> runs_;
  std::mutex mu_;  // ranges_, chunks_ (watch and unwatch may come from another thread than arm/collect)
  std::map<uintptr_t, Range> ranges_;
  std::vector<Chunk> chunks_;  // this period's sample, ascending
  uint64_t faults_ = 0, scan_ns_ = 0, lost_ = 0, errors_ = 0;
};

// Opens what the monitor needs and proves PAGEMAP_SCAN works on a page of our own.
int open_checked(uffd::WpAsync* u, int* pagemap, std::string* why) {
  if (int e = uffd::open_wp_async(u)) {
    if (e == ENOSYS) {
      *why = "no userfaultfd: userfaultfd(2) = ENOSYS (kernel built without CONFIG_USERFAULTFD)";
    } else if (e == EPERM) {
      *why = "userfaultfd(UFFD_USER_MODE_ONLY) = EPERM (vm.unprivileged_userfaultfd=" +
             sysctl("vm/unprivileged_userfaultfd") + ", no CAP_SYS_PTRACE; a seccomp filter may forbid it)";
    } else if (e == EINVAL) {
      *why = "UFFDIO_API refused UFFD_FEATURE_WP_ASYNC (EINVAL): kernel " + kernel_release() +
             " predates async write-protect (6.7)";
    } else {
      *why = "userfaultfd + UFFDIO_API(WP_ASYNC) = " + errno_name(e);
    }
    return e;
  }
  if (int e = uffd::open_pagemap(pagemap)) {
    os::prim::close_fd(u->fd);
    *why = "open(/proc/self/pagemap) = " + errno_name(e);
    return e;
  }
  // One page registered, protected and scanned: ENOTTY here means no PAGEMAP_SCAN (before 6.7).
  const size_t ps = os::page_size();
  void* probe = nullptr;
  int e = os::prim::reserve(ps, ps, &probe);
  if (e == 0) {
    const auto a = reinterpret_cast<uintptr_t>(probe);
    e = os::prim::protect(probe, ps, true);
    if (!e) e = uffd::register_wp(u->fd, a, ps);
    if (!e) e = uffd::write_protect(u->fd, a, ps, true);
    uffd::PageRun run[1];
    size_t n = 0;
    uintptr_t walk_end = 0;
    uffd::ScanRequest req;
    req.start = a;
    req.end = a + ps;
    req.write_protect = true;
    req.check_wp_async = true;
    req.category_mask = uffd::kPageWritten;
    if (!e) e = uffd::pagemap_scan(*pagemap, req, run, 1, &n, &walk_end);
    uffd::unregister(u->fd, a, ps);
    os::prim::unmap(probe, ps);
    if (e) {
      *why = e == ENOTTY ? "ioctl(PAGEMAP_SCAN) = ENOTTY: kernel " + kernel_release() + " predates PAGEMAP_SCAN (6.7)"
                         : "PAGEMAP_SCAN on a watched page = " + errno_name(e);
    }
  } else {
    *why = "mmap of a probe page = " + errno_name(e);
  }
  if (e) {
    os::prim::close_fd(u->fd);
    os::prim::close_fd(*pagemap);
  }
  return e;
}

}  // namespace

MonitorAvailability detect_pagemap_scan() {
  MonitorAvailability a;
  uffd::WpAsync u;
  int pagemap = -1;
  if (open_checked(&u, &pagemap, &a.reason)) return a;
  os::prim::close_fd(u.fd);
  os::prim::close_fd(pagemap);
  a.available = true;
  a.reason = "PAGEMAP_SCAN + UFFD_FEATURE_WP_ASYNC, kernel " + kernel_release() + ": exact written pages";
  if (u.user_mode_only)
    a.reason += "; userfaultfd in UFFD_USER_MODE_ONLY (without it: " + errno_name(u.first_errno) +
                ", vm.unprivileged_userfaultfd=" + sysctl("vm/unprivileged_userfaultfd") +
                " and no CAP_SYS_PTRACE); system calls still write watched pages (the kernel resolves async faults)";
  return a;
}

std::unique_ptr<Monitor> make_pagemap_scan_monitor(const PagemapScanOptions& options, std::string* why_not) {
  uffd::WpAsync u;
  int pagemap = -1;
  std::string why;
  if (open_checked(&u, &pagemap, &why)) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  try {
    return std::make_unique<PagemapScanMonitor>(options, u, pagemap);
  } catch (...) {
    os::prim::close_fd(u.fd);
    os::prim::close_fd(pagemap);
    if (why_not) *why_not = "out of memory";
    return nullptr;
  }
}

}  // namespace cxlpool::detail::tiering

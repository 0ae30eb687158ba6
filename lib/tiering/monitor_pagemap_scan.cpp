// SPDX-License-Identifier: MIT
// The "pagemap_scan" monitor: exact write heat. Watched ranges are registered with a
// userfaultfd in async write-protect mode and write-protected; the first write to a page
// after that takes a fault the kernel resolves by itself (it clears the page's uffd-wp bit,
// about 0.7 us here), so nothing ever waits on us and system calls may write watched pages.
// collect() asks PAGEMAP_SCAN for the pages written since (PAGE_IS_WRITTEN) and write-protects
// them again in the same walk (PM_SCAN_WP_MATCHING): one ioctl per range and output buffer.
//
// Cases handled: a full output buffer (continue from walk_end); a range whose mapping was
// replaced behind the monitor's back (PM_SCAN_CHECK_WPASYNC stops at the unregistered VMA
// with EPERM: the range is registered again, and its new pages are reported written once);
// a range that cannot be registered any more (unmapped: skipped, the others go on); PROT_NONE
// parts (registered and protected like the rest: nothing is written there); anonymous, memfd
// private and shared memory. THPs in a watched range are split by the kernel at the first
// write after a protection (docs/tiering.md has the measured effect).
#include <cerrno>
#include <map>
#include <mutex>
#include <vector>

#include "os/fs_root.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/uffd.hpp"
#include "tiering/monitor_internal.hpp"

namespace cxlpool::detail::tiering {
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
  PagemapScanMonitor(const uffd::WpAsync& u, int pagemap) : uffd_(u), pagemap_(pagemap), runs_(kRunsPerCall) {
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
    // Protected from now on: the first collect reports only what was written after watch().
    if (int e = uffd::write_protect(uffd_.fd, addr, len, true)) {
      uffd::unregister(uffd_.fd, addr, len);
      return e;
    }
    try {
      ranges_[addr] = Range{len, false};
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
    if (!fds_ours()) return;
    // Unregistering also clears the uffd-wp bits and markers: the memory is as it was.
    uffd::unregister(uffd_.fd, addr, len);
  }

  void collect(HeatSink& sink) noexcept override {
    const uint64_t t0 = os::monotonic_ns();
    std::lock_guard<std::mutex> lock(mu_);
    if (!fds_ours()) return;
    for (auto& [addr, r] : ranges_) {
      if (r.dead) continue;
      scan(addr, r, sink);
    }
    scan_ns_ += os::monotonic_ns() - t0;
  }

  uint64_t faults() const noexcept override { return faults_; }
  uint64_t scan_ns() const noexcept override { return scan_ns_; }

 private:
  struct Range {
    size_t len = 0;
    bool dead = false;  // could not be registered again: skipped until watch()
  };

  static size_t page() noexcept {
    static const size_t ps = os::page_size();
    return ps;
  }

  void report(size_t n, HeatSink& sink) noexcept {
    for (size_t i = 0; i < n; ++i) {
      const uffd::PageRun& run = runs_[i];
      sink.touched(uintptr_t(run.start), size_t(run.end - run.start), AccessKind::kWrite, 1);
      faults_ += (run.end - run.start) / page();
    }
  }

  void scan(uintptr_t addr, Range& r, HeatSink& sink) noexcept {
    uffd::ScanRequest req;
    req.start = addr;
    req.end = addr + r.len;
    req.write_protect = true;
    req.check_wp_async = true;
    req.category_mask = uffd::kPageWritten;
    req.return_mask = uffd::kPageWritten;
    bool reregistered = false;
    while (req.start < req.end) {
      size_t n = 0;
      uintptr_t walk_end = req.end;
      int e = uffd::pagemap_scan(pagemap_, req, runs_.data(), runs_.size(), &n, &walk_end);
      report(n, sink);  // on an error too: those pages were protected again
      if (e == EPERM && !reregistered) {
        // Part of the range is no longer registered: its mapping was replaced (a move, a
        // release, a MAP_FIXED). It is never registered again from here: the memory there may
        // not be ours any more. Report what the registered parts say, then leave the range
        // alone until its owner calls watch() again.
        reregistered = true;
        ++lost_;
        req.start = addr;
        req.check_wp_async = false;
        r.dead = true;
        continue;
      }
      if (e) {
        ++errors_;
        return;
      }
      if (n < runs_.size() || walk_end <= req.start) return;  // the walk covered the range
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

  uffd::WpAsync uffd_;
  int pagemap_;
  os::prim::FileId uffd_id_, pagemap_id_;
  bool lost_fds_ = false;
  std::vector<uffd::PageRun> runs_;
  std::mutex mu_;  // ranges_ (watch and unwatch may come from another thread than collect)
  std::map<uintptr_t, Range> ranges_;
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

std::unique_ptr<Monitor> make_pagemap_scan(std::string* why_not) {
  uffd::WpAsync u;
  int pagemap = -1;
  std::string why;
  if (open_checked(&u, &pagemap, &why)) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  return std::make_unique<PagemapScanMonitor>(u, pagemap);
}

}  // namespace cxlpool::detail::tiering

// SPDX-License-Identifier: MIT
// userfaultfd (async and sync write-protect) and PAGEMAP_SCAN (uffd.hpp). Debian 12's kernel headers
// (6.1) predate PAGEMAP_SCAN and WP_ASYNC, so their ABI is spelled out here; the running
// kernel decides at run time (UFFDIO_API refuses unknown features with EINVAL).
#include "os/uffd.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif

namespace cxlpool::os::uffd {
namespace {

struct PmScanArg {  // struct pm_scan_arg (linux/fs.h, 6.7+)
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
      category_anyof_mask, return_mask;
};
constexpr unsigned long kPagemapScan = _IOWR('f', 16, PmScanArg);
constexpr uint64_t kScanWpMatching = 1u << 0;
constexpr uint64_t kScanCheckWpAsync = 1u << 1;
static_assert(sizeof(PageRun) == 24, "struct page_region");

constexpr const char* kDevice = "/dev/userfaultfd";

// A new userfaultfd: by the system call, or (device) by USERFAULTFD_IOC_NEW on the device
// node, whose access is its file mode rather than vm.unprivileged_userfaultfd.
int open_one(int flags, uint64_t want, const char* device, WpAsync* out) noexcept {
  const uint64_t must = want & (UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED);
  long fd = -1;
  if (device) {
    const int dev = open(device, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (dev < 0) return errno;
    fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK | flags);
    const int e = errno;
    close(dev);
    if (fd < 0) return e == ENOTTY ? ENODEV : e;  // not a userfaultfd device
  } else {
    fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | flags);
    if (fd < 0) return errno;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = want;
  if (ioctl(int(fd), UFFDIO_API, &api) != 0) {
    int e = errno;
    close(int(fd));
    return e;
  }
  if ((api.features & must) != must) {
    close(int(fd));
    return EINVAL;
  }
  out->fd = int(fd);
  out->features = api.features;
  return 0;
}

// Kernel mode by the system call, then by the device after EPERM, then user mode only.
int open_either_mode(uint64_t want, WpAsync* out) noexcept {
  *out = WpAsync{};
  int e = open_one(0, want, nullptr, out);
  if (e != EPERM) return e;
  out->first_errno = e;
  const int d = open_one(0, want, kDevice, out);
  if (d == 0) {
    out->via_device = true;
    return 0;
  }
  out->device_errno = d;
  e = open_one(UFFD_USER_MODE_ONLY, want, nullptr, out);
  if (e == 0) out->user_mode_only = true;
  return e;
}

}  // namespace

int open_wp_async(WpAsync* out) noexcept {
  return open_either_mode(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM, out);
}

int open_wp_sync(WpAsync* out) noexcept {
  return open_either_mode(UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM, out);
}

int open_wp_sync_device(const char* path, WpAsync* out) noexcept {
  *out = WpAsync{};
  const int e = open_one(0, UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM, path, out);
  if (e == 0) out->via_device = true;
  return e;
}

int wake(int fd, uintptr_t addr, size_t len) noexcept {
  uffdio_range r{};
  r.start = addr;
  r.len = len;
  return ioctl(fd, UFFDIO_WAKE, &r) == 0 ? 0 : errno;
}

int register_wp(int fd, uintptr_t addr, size_t len) noexcept {
  uffdio_register r{};
  r.range.start = addr;
  r.range.len = len;
  r.mode = UFFDIO_REGISTER_MODE_WP;
  return ioctl(fd, UFFDIO_REGISTER, &r) == 0 ? 0 : errno;
}

int unregister(int fd, uintptr_t addr, size_t len) noexcept {
  uffdio_range r{};
  r.start = addr;
  r.len = len;
  return ioctl(fd, UFFDIO_UNREGISTER, &r) == 0 ? 0 : errno;
}

int write_protect(int fd, uintptr_t addr, size_t len, bool protect) noexcept {
  uffdio_writeprotect wp{};
  wp.range.start = addr;
  wp.range.len = len;
  wp.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
  return ioctl(fd, UFFDIO_WRITEPROTECT, &wp) == 0 ? 0 : errno;
}

int open_pagemap(int* fd) noexcept {
  int f = open("/proc/thread-self/pagemap", O_RDONLY | O_CLOEXEC);
  if (f < 0) return errno;
  *fd = f;
  return 0;
}

int pagemap_scan(int pagemap_fd, const ScanRequest& req, PageRun* out, size_t cap, size_t* n,
                 uintptr_t* walk_end) noexcept {
  *n = 0;
  *walk_end = req.end;
  if (cap == 0) return EINVAL;
  // On an error the kernel has still copied the runs it found before stopping, but returns
  // no count: mark the buffer so they can be counted.
  for (size_t i = 0; i < cap; ++i) out[i].end = 0;
  PmScanArg a{};
  a.size = sizeof a;
  a.flags = (req.write_protect ? kScanWpMatching : 0) | (req.check_wp_async ? kScanCheckWpAsync : 0);
  a.start = req.start;
  a.end = req.end;
  a.vec = reinterpret_cast<uintptr_t>(out);
  a.vec_len = cap;
  a.category_inverted = req.category_inverted;
  a.category_mask = req.category_mask;
  a.category_anyof_mask = req.category_anyof;
  a.return_mask = req.return_mask;
  long r = ioctl(pagemap_fd, kPagemapScan, &a);
  if (r < 0) {
    int e = errno;
    size_t k = 0;
    while (k < cap && out[k].end != 0) ++k;
    *n = k;
    return e;
  }
  *n = size_t(r);
  *walk_end = a.walk_end ? uintptr_t(a.walk_end) : req.end;
  return 0;
}

}  // namespace cxlpool::os::uffd

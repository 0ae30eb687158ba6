// SPDX-License-Identifier: MIT
// userfaultfd write-protection in asynchronous mode and the PAGEMAP_SCAN ioctl on
// /proc/self/pagemap: what the pagemap_scan hotness monitor needs to learn exactly which pages
// were written since it last looked. noexcept, no allocation, errno returned (like prim.hpp).
// With UFFD_FEATURE_WP_ASYNC the kernel resolves a write-protect fault itself (it clears the
// page's uffd-wp bit and lets the write go on): no thread ever waits for us, and system calls
// that write such a page (read(2) into it) succeed, whether or not the descriptor is in
// UFFD_USER_MODE_ONLY.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::uffd {

// PAGE_IS_* categories of PAGEMAP_SCAN (linux/fs.h, 6.7+; defined here for older headers).
inline constexpr uint64_t kPageWpAllowed = 1u << 0;  // in a VMA registered for async WP
inline constexpr uint64_t kPageWritten = 1u << 1;    // written since it was last write-protected
inline constexpr uint64_t kPageFile = 1u << 2;
inline constexpr uint64_t kPagePresent = 1u << 3;
inline constexpr uint64_t kPageSwapped = 1u << 4;
inline constexpr uint64_t kPagePfnZero = 1u << 5;
inline constexpr uint64_t kPageHuge = 1u << 6;  // mapped by a THP (or hugetlb) entry

// A descriptor ready for write-protection, and how it was had. A descriptor whose faults may
// come from kernel mode (a system call's copy_to_user, get_user_pages for O_DIRECT or io_uring)
// is opened by userfaultfd(2) without UFFD_USER_MODE_ONLY (root, CAP_SYS_PTRACE or
// vm.unprivileged_userfaultfd=1) or, failing that, through /dev/userfaultfd
// (USERFAULTFD_IOC_NEW, 6.1+: whoever may open the device read-write); the last resort is
// UFFD_USER_MODE_ONLY, whose kernel-mode faults on a synchronously protected page fail with
// EFAULT instead of waiting.
struct WpAsync {
  int fd = -1;
  bool user_mode_only = false;  // opened with UFFD_USER_MODE_ONLY (after both attempts below failed)
  bool via_device = false;      // opened through /dev/userfaultfd
  int first_errno = 0;          // why userfaultfd(2) without UFFD_USER_MODE_ONLY failed, when it did
  int device_errno = 0;         // why /dev/userfaultfd failed, when it was tried and did
  uint64_t features = 0;        // what UFFDIO_API granted
};
// userfaultfd(O_CLOEXEC|O_NONBLOCK) + UFFDIO_API asking for WP_ASYNC | WP_UNPOPULATED |
// WP_HUGETLBFS_SHMEM (shmem/memfd MAP_SHARED). Kernel mode first (the system call, then
// /dev/userfaultfd after EPERM), UFFD_USER_MODE_ONLY last. ENOSYS: no userfaultfd; EINVAL from
// UFFDIO_API: the kernel lacks WP_ASYNC (before 6.7). The descriptor is closed on failure.
int open_wp_async(WpAsync* out) noexcept;
// The same for synchronous write-protection (WP_UNPOPULATED | WP_HUGETLBFS_SHMEM, no async): a
// thread that writes a protected page waits in the kernel until the page is un-protected or
// the range is woken (UFFDIO_WAKE); no signal is involved. Without UFFD_USER_MODE_ONLY a
// system call that writes such a page waits too; with it (the unprivileged fallback), it gets
// EFAULT. EINVAL: the kernel lacks WP_UNPOPULATED (before 6.4).
int open_wp_sync(WpAsync* out) noexcept;
// The same through a given device path instead of the system call (tests: a node made in a
// private mount namespace); "/dev/userfaultfd" is what open_wp_* use.
int open_wp_sync_device(const char* path, WpAsync* out) noexcept;
// UFFDIO_WAKE: threads waiting on [addr, addr+len) retry their access.
int wake(int fd, uintptr_t addr, size_t len) noexcept;
// UFFDIO_REGISTER with UFFDIO_REGISTER_MODE_WP: again on a registered range is a no-op for its
// registered parts. EINVAL: not page aligned or outside any mapping; EBUSY: another
// userfaultfd has it.
int register_wp(int fd, uintptr_t addr, size_t len) noexcept;
int unregister(int fd, uintptr_t addr, size_t len) noexcept;
// UFFDIO_WRITEPROTECT (protect) or un-protect [addr, addr+len).
int write_protect(int fd, uintptr_t addr, size_t len, bool protect) noexcept;

// ---- PAGEMAP_SCAN ---------------------------------------------------------------------------
int open_pagemap(int* fd) noexcept;  // /proc/self/pagemap, read-only, close-on-exec

struct PageRun {
  uint64_t start, end, categories;  // layout of struct page_region
};
struct ScanRequest {
  uintptr_t start = 0, end = 0;
  bool write_protect = false;   // PM_SCAN_WP_MATCHING: write-protect what is reported
  bool check_wp_async = false;  // PM_SCAN_CHECK_WPASYNC: EPERM at a VMA not registered
  uint64_t category_mask = 0;   // every one of these must match
  uint64_t category_anyof = 0;  // at least one of these must match (0: no such test)
  uint64_t category_inverted = 0;
  uint64_t return_mask = 0;  // categories reported in PageRun::categories
};
// One ioctl(PAGEMAP_SCAN). Fills out[0..*n) and sets *walk_end to where the walk stopped (end
// when it covered everything; less when out filled up: call again from there). On an error
// (EPERM for check_wp_async), *n still counts the runs the kernel wrote before it stopped
// (they are real, and write-protected when asked) and *walk_end is unknown (set to end).
int pagemap_scan(int pagemap_fd, const ScanRequest& req, PageRun* out, size_t cap, size_t* n,
                 uintptr_t* walk_end) noexcept;

}  // namespace cxlpool::os::uffd

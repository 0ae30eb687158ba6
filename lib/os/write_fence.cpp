// SPDX-License-Identifier: MIT
// Write fences (write_fence.hpp): the process's one synchronous userfaultfd, opened in kernel
// mode or not at all, the probe that says which fence the process can have and why, and the
// fences themselves.
#include "os/write_fence.hpp"

#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

#include "os/prim.hpp"
#include "os/uffd.hpp"

namespace cxlpool::os::write_fence {
namespace {

std::mutex g_uffd_mu;
int g_uffd = -1;           // the fences' descriptor (moved high), or -1
pid_t g_uffd_pid = 0;      // the process it was opened in (a fork child's copy names the parent)
prim::FileId g_uffd_id{};  // its identity
Probe g_probe;             // what opening it found (mode kUnknown: not tried, or a passing shortage)
std::atomic<uint64_t> g_uffd_count{0};

bool ours(int fd, uint64_t dev, uint64_t ino) noexcept {
  prim::FileId id{};
  return fd >= 0 && prim::file_id(fd, &id) == 0 && id.dev == dev && id.ino == ino;
}

bool passing(int e) noexcept { return e == EMFILE || e == ENFILE || e == ENOMEM || e == EAGAIN || e == EINTR; }

// The fences' descriptor (g_uffd_mu held), or -errno: -EPERM when only a user-mode one can be
// had (never used: see write_fence.hpp).
int fence_uffd() noexcept {
  const pid_t me = prim::process_id();
  if (g_uffd_pid != me) {
    // A fork child: an inherited descriptor names the parent's address space. Close our copy
    // (if the number is still ours) and start over.
    if (g_uffd >= 0 && ours(g_uffd, g_uffd_id.dev, g_uffd_id.ino)) prim::close_fd(g_uffd);
    g_uffd = -1;
    g_probe = Probe{};
    g_uffd_pid = me;
  }
  if (g_uffd >= 0 && !ours(g_uffd, g_uffd_id.dev, g_uffd_id.ino)) g_uffd = -1;  // the program closed it: not ours
  if (g_uffd >= 0) return g_uffd;
  if (g_probe.mode == Mode::kUserModeOnly) return -EPERM;
  if (g_probe.mode == Mode::kNone) return -g_probe.error;
  uffd::WpAsync u;
  Probe p;
  const int e = uffd::open_wp_sync(&u);
  p.syscall_errno = u.first_errno;
  p.device_errno = u.device_errno;
  if (e) {
    p.error = e;
    // What cannot change in this process is remembered (no userfaultfd, refused, a kernel
    // without the features); running out of descriptors or memory is tried again next time.
    p.mode = passing(e) ? Mode::kUnknown : Mode::kNone;
    g_probe = p;
    return -e;
  }
  if (u.user_mode_only) {
    prim::close_fd(u.fd);
    p.mode = Mode::kUserModeOnly;
    g_probe = p;
    return -EPERM;
  }
  const int fd = prim::move_fd_high(u.fd);
  if (prim::file_id(fd, &g_uffd_id) != 0) {
    prim::close_fd(fd);
    return -EBADF;
  }
  g_uffd = fd;
  p.mode = Mode::kKernel;
  p.via_device = u.via_device;
  g_probe = p;
  return g_uffd;
}

std::string errno_text(int e) {
  const char* name = strerrorname_np(e);
  return std::string(name ? name : "errno " + std::to_string(e)) + " (" + std::strerror(e) + ")";
}

}  // namespace

Probe probe() noexcept {
  std::lock_guard<std::mutex> lock(g_uffd_mu);
  fence_uffd();
  return g_probe;
}

const char* mode_name(Mode m) noexcept {
  switch (m) {
    case Mode::kKernel:
      return "kernel";
    case Mode::kUserModeOnly:
      return "user-mode-only";
    case Mode::kNone:
      return "none";
    case Mode::kUnknown:
      break;
  }
  return "unknown";
}

std::string explain(const Probe& p, int unprivileged, const std::string& release) {
  const std::string off =
      "moves that copy (a unit with a memfd, shm, file or devdax end) are off, NUMA-to-NUMA migration still runs";
  const std::string kernel = release.empty() ? "this kernel" : "kernel " + release;
  switch (p.mode) {
    case Mode::kKernel:
      return "";
    case Mode::kUserModeOnly: {
      std::string why = "userfaultfd is user-mode only here (userfaultfd(2) = " + errno_text(p.syscall_errno);
      if (unprivileged >= 0) why += ", vm.unprivileged_userfaultfd=" + std::to_string(unprivileged);
      why += ", no CAP_SYS_PTRACE; /dev/userfaultfd: " +
             (p.device_errno == ENOENT ? std::string("absent (kernel before 6.1, or no device node)")
                                       : errno_text(p.device_errno)) +
             "): a fence would turn the program's system calls that write a moving range (read, recv, O_DIRECT) into "
             "EFAULT";
      return "write fences: user-mode-only: " + off + "; " + why +
             "; to enable them: sysctl vm.unprivileged_userfaultfd=1, or give this user read-write access to "
             "/dev/userfaultfd, or run with CAP_SYS_PTRACE";
    }
    case Mode::kNone: {
      std::string why;
      if (p.error == ENOSYS)
        why = "no userfaultfd (userfaultfd(2) = ENOSYS: a kernel without CONFIG_USERFAULTFD, or a seccomp filter)";
      else if (p.error == EINVAL)
        why = kernel + " cannot write-protect unpopulated pages synchronously (UFFD_FEATURE_WP_UNPOPULATED, 6.4+)";
      else if (p.error == EPERM)
        why = "userfaultfd is refused even in user mode (userfaultfd(2) = EPERM: a seccomp filter or security module)";
      else
        why = "userfaultfd could not be set up: " + errno_text(p.error);
      return "write fences: none: " + off + "; " + why + "; to enable them: a 6.4+ kernel with userfaultfd allowed";
    }
    case Mode::kUnknown:
      break;
  }
  return "write fences: not known yet" +
         (p.error ? ": " + errno_text(p.error) + " (tried again at the next move)" : std::string());
}

std::string explain(const Probe& p) {
  int unprivileged = -1;
  const int fd = open("/proc/sys/vm/unprivileged_userfaultfd", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char c = 0;
    if (read(fd, &c, 1) == 1 && c >= '0' && c <= '9') unprivileged = c - '0';
    close(fd);
  }
  utsname u{};
  return explain(p, unprivileged, uname(&u) == 0 ? u.release : "");
}

int raise_uffd(void* addr, size_t len, UffdFence* out) noexcept {
  std::lock_guard<std::mutex> lock(g_uffd_mu);
  const int fd = fence_uffd();
  if (fd < 0) return -fd;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (int e = uffd::register_wp(fd, a, len)) return e;  // EBUSY: another userfaultfd has it
  if (int e = uffd::write_protect(fd, a, len, true)) {
    uffd::unregister(fd, a, len);
    return e;
  }
  out->addr = a;
  out->len = len;
  out->fd = fd;
  out->dev = g_uffd_id.dev;
  out->ino = g_uffd_id.ino;
  g_uffd_count.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void lift_uffd_replaced(const UffdFence& f) noexcept {
  // If the program closed our descriptor meanwhile, the kernel woke every waiter then.
  if (ours(f.fd, f.dev, f.ino)) uffd::wake(f.fd, f.addr, f.len);
}

void lift_uffd_in_place(const UffdFence& f) noexcept {
  if (!ours(f.fd, f.dev, f.ino)) return;
  uffd::write_protect(f.fd, f.addr, f.len, false);  // wakes the waiting writers
  uffd::unregister(f.fd, f.addr, f.len);
}

bool uffd_fence_intact(const UffdFence& f) noexcept { return ours(f.fd, f.dev, f.ino); }

void forget_fences_in_fork_child() noexcept {
  // Single-threaded here (the atfork child handler): no lock is needed, and g_uffd_mu may be
  // a copy held by a thread of the parent.
  new (&g_uffd_mu) std::mutex();
  if (g_uffd >= 0 && ours(g_uffd, g_uffd_id.dev, g_uffd_id.ino)) prim::close_fd(g_uffd);
  g_uffd = -1;
  g_probe = Probe{};
  g_uffd_pid = prim::process_id();
}

uint64_t uffd_fences() noexcept { return g_uffd_count.load(std::memory_order_relaxed); }

}  // namespace cxlpool::os::write_fence

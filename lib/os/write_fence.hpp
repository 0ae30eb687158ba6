// SPDX-License-Identifier: MIT
// Write fences: keep every writer of a range (the program's threads, and the kernel writing for
// them) away while its bytes are copied somewhere else, without losing a write and without
// failing a system call. The range is registered with a process-wide synchronous userfaultfd
// and write-protected; a thread that writes it waits in the kernel until the fence is lifted,
// then writes whatever is mapped there by then. No signal is involved, so threads that block
// SIGSEGV and programs with their own handlers are held like any other, and a system call that
// writes the range (copy_to_user, get_user_pages for O_DIRECT or io_uring) waits the same way.
//
// That last promise needs a descriptor whose kernel-mode faults are handled: one opened by
// userfaultfd(2) without UFFD_USER_MODE_ONLY (root, CAP_SYS_PTRACE, or
// vm.unprivileged_userfaultfd=1) or through /dev/userfaultfd (whoever may open it read-write,
// 6.1+). With a UFFD_USER_MODE_ONLY descriptor such system calls fail with EFAULT, and so they
// would under a read-only-page fence: neither is ever used. A process without a kernel-mode
// descriptor has no fence (probe() says why), and moves that need one do not happen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cxlpool::os::write_fence {

// Which fence the process can have. kKernel: fences hold system calls too. kUserModeOnly:
// userfaultfd only with UFFD_USER_MODE_ONLY: no fence. kNone: no userfaultfd that can
// write-protect synchronously (no userfaultfd, or a kernel before 6.4): no fence.
enum class Mode : uint8_t { kUnknown = 0, kKernel = 1, kUserModeOnly = 2, kNone = 3 };

struct Probe {
  Mode mode = Mode::kUnknown;
  bool via_device = false;  // kKernel through /dev/userfaultfd
  int syscall_errno = 0;    // userfaultfd(2) without UFFD_USER_MODE_ONLY, when it failed
  int device_errno = 0;     // /dev/userfaultfd, when it was tried and failed
  int error = 0;            // kNone: why no descriptor could be had at all
};

// Opens the fences' descriptor if this process has none yet (it is kept for the fences) and
// says which mode that gives. What cannot change in the process is remembered; a passing
// shortage (EMFILE, ENFILE, ENOMEM, EAGAIN, EINTR) is Mode::kUnknown with error set, and tried
// again by the next call.
Probe probe() noexcept;
const char* mode_name(Mode m) noexcept;  // "kernel", "user-mode-only", "none", "unknown"
// What is off, why, and which knob turns it on, in one line; "" for kKernel. unprivileged is
// vm.unprivileged_userfaultfd (-1: unknown), release the kernel's release (may be empty).
std::string explain(const Probe& p, int unprivileged, const std::string& release);
// The same for this process and machine (reads the sysctl and uname).
std::string explain(const Probe& p);

// A userfaultfd fence. raise_uffd: 0; EBUSY: registered with another userfaultfd (the
// program's): nothing changed; EPERM: this process has no kernel-mode descriptor (probe());
// EINVAL: the memory kind does not take synchronous write-protection (a file on a disk
// filesystem, device DAX): nothing changed; any other errno: no fence now.
struct UffdFence {
  uintptr_t addr = 0;
  size_t len = 0;
  int fd = -1;
  uint64_t dev = 0, ino = 0;  // the descriptor's identity (checked before each use)
};
int raise_uffd(void* addr, size_t len, UffdFence* out) noexcept;
// Lifts a fence whose mapping was replaced (the registration went with the old one): the
// waiting writers retry, on the new mapping.
void lift_uffd_replaced(const UffdFence& f) noexcept;
// Lifts a fence whose mapping is still there (a failed move): un-protects, which wakes the
// writers, and unregisters.
void lift_uffd_in_place(const UffdFence& f) noexcept;
// Whether the fence still holds: its descriptor is still ours (a program that closed it has
// released the registration, and writers went on). Checked right before the mapping is
// swapped: a close after that check and before the swap is the one window left.
bool uffd_fence_intact(const UffdFence& f) noexcept;
// In a fork child (atfork): the parent's fence descriptor is closed (if the number is still
// ours) so that the child never keeps the parent's fences up by holding it.
void forget_fences_in_fork_child() noexcept;

// Fences raised since the process started.
uint64_t uffd_fences() noexcept;

}  // namespace cxlpool::os::write_fence

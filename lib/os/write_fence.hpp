// SPDX-License-Identifier: MIT
// Write fences: keep the program's threads from writing a range while its bytes are copied
// somewhere else, without losing a write. Two kinds:
//
// - userfaultfd (raise_uffd, preferred): the range is registered with a process-wide
//   synchronous userfaultfd and write-protected; a thread that writes it waits in the kernel
//   until the fence is lifted and then writes whatever is mapped there by then. No signal is
//   involved, so threads that block SIGSEGV and programs with their own handlers are held like
//   any other; a system call writing the range waits too, except when the descriptor is
//   UFFD_USER_MODE_ONLY (unprivileged), where it gets EFAULT. A range the program registered
//   with a userfaultfd of its own is refused (EBUSY), never taken over.
// - mprotect (raise, where userfaultfd cannot be had or does not cover the memory): the range
//   is made read-only; a thread that writes it takes SIGSEGV, and our handler, seeing the
//   address inside a fenced range, waits (futex) until the fence is lifted, then returns so
//   that the write runs again. A system call writing the range gets EFAULT; a thread that
//   blocks SIGSEGV dies. Faults outside every fence go to the handler the program had
//   installed before ours (or the default action: the program dies as it would have).
//
// The same handler serves the sampling traps of the "sample" hotness monitor (below): pages
// made PROT_NONE on purpose whose first touch is counted and undone. One handler, two tables:
// a process has one SIGSEGV disposition, and both must chain to the program's. Ours is put in
// front of the program's; a program that replaces it later with a handler of its own is not
// fought (putting ours back in front of a handler that chains to ours would make the two call
// each other forever): from then on raise() and sample_trap::arm() refuse (EBUSY), and the
// program's handler, which comes first, should chain to the one it replaced. Ours goes back in
// front only of SIG_DFL/SIG_IGN or of the handler it was in front of before (a disposition
// saved and restored, as test frameworks do); a handler that gives our signal back to us ends
// in the default action, never in a loop.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::write_fence {

inline constexpr int kMaxFences = 64;  // fences up at once, process-wide

// Records [addr, addr+len) as fenced (the caller then makes it read-only) and returns its
// slot in *slot. 0, EBUSY when kMaxFences are up or the program replaced our SIGSEGV handler,
// or the errno of sigaction().
int raise(const void* addr, size_t len, int* slot) noexcept;
// Lifts a fence (the caller has made the range writable again, or replaced its mapping):
// waiting writers retry their writes.
void lift(int slot) noexcept;

// A userfaultfd fence. raise_uffd: 0; EBUSY: registered with another userfaultfd (the
// program's): nothing changed; any other errno: no userfaultfd fence here (none to be had, or
// the memory kind does not take write-protection): use raise().
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
// Whether the fences' userfaultfd is UFFD_USER_MODE_ONLY (system calls writing a fenced range
// get EFAULT); false before the first uffd fence.
bool uffd_user_mode_only() noexcept;

// Counters since the process started: writes that waited on an mprotect fence, the handler's
// hand-offs to the program's own SIGSEGV handling, and userfaultfd fences raised.
uint64_t writes_waited() noexcept;
uint64_t faults_passed_on() noexcept;
uint64_t uffd_fences() noexcept;

}  // namespace cxlpool::os::write_fence

// ---- Sampling traps -------------------------------------------------------------------------
// A table of single pages made PROT_NONE by the sample monitor. A thread that touches one takes
// SIGSEGV; the handler marks the page touched and makes it read-write again (its protection
// before: only read-write pages are ever armed), and the access runs again. Faults on pages
// outside the table and every fence go on to the program's handler, as above.
//
// One thread at a time arms and disarms (the tiering engine's); the handler runs on any thread.
// A period: clear() empties the table; arm() appends pages in ascending address order (the
// handler binary-searches the table while it grows); stop() ends a range's period: its armed
// pages become "disarming" (the handler no longer touches their protection; a thread faulting
// on one waits until released() says the caller has decided) and are listed for the caller,
// who restores those still its own (restore()) under the owner's lock, then calls released().
namespace cxlpool::os::sample_trap {

inline constexpr size_t kMaxPages = 4096;  // armed pages at once, process-wide

// Appends page (page aligned, above every page already in the table, read-write now, not in
// an up fence) and makes it PROT_NONE. 0; EBUSY: the table is full, or the program replaced
// our SIGSEGV handler; EEXIST: inside an up fence (never armed); ERANGE: not above the last
// page; or mprotect's errno (not armed).
int arm(uintptr_t page) noexcept;
// Ends the period of [begin, end): touched pages go to touched[] (at most cap_t), pages still
// armed become disarming and go to untouched[] (at most cap_u).
void stop(uintptr_t begin, uintptr_t end, uintptr_t* touched, size_t cap_t, size_t* n_touched, uintptr_t* untouched,
          size_t cap_u, size_t* n_untouched) noexcept;
// Makes a disarming page read-write again, unless a write fence is up on it (EEXIST).
int restore(uintptr_t page) noexcept;
// The owner took [begin, end) back (decommitted it, PROT_NONE on purpose): its armed pages
// are forgotten, never made accessible again by the monitor. Called under the owner's lock.
void forget(uintptr_t begin, uintptr_t end) noexcept;
// In a fork child (single-threaded, from the atfork handler): every page still armed is made
// read-write again (the child inherited the parent's PROT_NONE) and the table is emptied.
void disarm_in_fork_child() noexcept;
// Threads waiting on disarming pages retry their access (restored pages succeed; the others
// fault again and go to the program's handler).
void released() noexcept;
// Empties the table (every page must be stopped); waits for handlers still reading it.
void clear() noexcept;
size_t armed() noexcept;  // entries still armed
// Counters since the process started: first touches caught, and the handler's time for them.
uint64_t touches() noexcept;
uint64_t handler_ns() noexcept;

}  // namespace cxlpool::os::sample_trap

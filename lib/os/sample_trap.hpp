// SPDX-License-Identifier: MIT
// Sampling traps for the "sample" hotness monitor: single pages made PROT_NONE on purpose
// whose first touch is counted and undone by the process's one SIGSEGV handler, which passes
// every other fault on to the program's handler (or the default action).
//
// Ours is put in front of the program's handler; a program that replaces it later with a
// handler of its own is not fought (putting ours back in front of a handler that chains to
// ours would make the two call each other forever): from then on arm() refuses (EBUSY), and
// the program's handler, which comes first, should chain to the one it replaced. Ours goes back
// in front only of SIG_DFL/SIG_IGN or of the handler it was in front of before (a disposition
// saved and restored, as test frameworks do); a handler that gives our signal back to us ends
// in the default action, never in a loop.
#pragma once

#include <cstddef>
#include <cstdint>

// A table of single pages made PROT_NONE by the sample monitor. A thread that touches one takes
// SIGSEGV; the handler marks the page touched and makes it read-write again (its protection
// before: only read-write pages are ever armed), and the access runs again. Faults on pages
// outside the table go on to the program's handler, as above. A system call that reads or
// writes an armed page fails with EFAULT (no signal is raised for it): the monitor's hazard.
//
// One thread at a time arms and disarms (the tiering engine's); the handler runs on any thread.
// A period: clear() empties the table; arm() appends pages in ascending address order (the
// handler binary-searches the table while it grows); stop() ends a range's period: its armed
// pages become "disarming" (the handler no longer touches their protection; a thread faulting
// on one waits until released() says the caller has decided) and are listed for the caller,
// who restores those still its own (restore()) under the owner's lock, then calls released().
namespace cxlpool::os::sample_trap {

inline constexpr size_t kMaxPages = 4096;  // armed pages at once, process-wide

// Puts our SIGSEGV handler in front of the program's (arm() does it first): 0, EBUSY when the
// program replaced ours since (see above), or the errno of sigaction().
int install_handler() noexcept;
// Appends page (page aligned, above every page already in the table, read-write now) and
// makes it PROT_NONE. 0; EBUSY: the table is full, or the program replaced our SIGSEGV
// handler; ERANGE: not above the last page; or mprotect's errno (not armed).
int arm(uintptr_t page) noexcept;
// Ends the period of [begin, end): touched pages go to touched[] (at most cap_t), pages still
// armed become disarming and go to untouched[] (at most cap_u).
void stop(uintptr_t begin, uintptr_t end, uintptr_t* touched, size_t cap_t, size_t* n_touched, uintptr_t* untouched,
          size_t cap_u, size_t* n_untouched) noexcept;
// Makes a disarming page read-write again (ENOENT: not a disarming page of the table).
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
// Faults the handler passed on to the program's handling.
uint64_t faults_passed_on() noexcept;

}  // namespace cxlpool::os::sample_trap

// SPDX-License-Identifier: MIT
// Write fences: keep the program's threads from writing a range while its bytes are copied
// somewhere else, without losing a write. The range is made read-only; a thread that writes
// it takes SIGSEGV, and our handler, seeing the address inside a fenced range, waits (futex)
// until the fence is lifted, then returns so that the write is executed again, on whatever
// is mapped there by then. Faults outside every fence go to the handler the program had
// installed before ours (or the default action: the program dies as it would have).
//
// The same handler serves the sampling traps of the "sample" hotness monitor (below): pages
// made PROT_NONE on purpose whose first touch is counted and undone. One handler, two tables:
// a process has one SIGSEGV disposition, and both must chain to the program's.
//
// Limits: a system call that writes a fenced range (read(2) into it, say) fails with EFAULT
// instead of faulting, so the window is kept short (one copy); a program that replaces our
// SIGSEGV handler after we installed it is detected at the next fence, which installs ours
// again in front of the program's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::write_fence {

inline constexpr int kMaxFences = 64;  // fences up at once, process-wide

// Records [addr, addr+len) as fenced (the caller then makes it read-only) and returns its
// slot in *slot. 0, EBUSY when kMaxFences are up, or the errno of sigaction().
int raise(const void* addr, size_t len, int* slot) noexcept;
// Lifts a fence (the caller has made the range writable again, or replaced its mapping):
// waiting writers retry their writes.
void lift(int slot) noexcept;

// Counters since the process started: writes that waited on a fence, and the handler's
// hand-offs to the program's own SIGSEGV handling.
uint64_t writes_waited() noexcept;
uint64_t faults_passed_on() noexcept;

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
// an up fence) and makes it PROT_NONE. 0; EBUSY: the table is full; EEXIST: inside an up
// fence (never armed); ERANGE: not above the last page; or mprotect's errno (not armed).
int arm(uintptr_t page) noexcept;
// Ends the period of [begin, end): touched pages go to touched[] (at most cap_t), pages still
// armed become disarming and go to untouched[] (at most cap_u).
void stop(uintptr_t begin, uintptr_t end, uintptr_t* touched, size_t cap_t, size_t* n_touched, uintptr_t* untouched,
          size_t cap_u, size_t* n_untouched) noexcept;
// Makes a disarming page read-write again, unless a write fence is up on it (EEXIST).
int restore(uintptr_t page) noexcept;
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

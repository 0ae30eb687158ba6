// SPDX-License-Identifier: MIT
// Write fences: keep the program's threads from writing a range while its bytes are copied
// somewhere else, without losing a write. The range is made read-only; a thread that writes
// it takes SIGSEGV, and our handler, seeing the address inside a fenced range, waits (futex)
// until the fence is lifted, then returns so that the write is executed again, on whatever
// is mapped there by then. Faults outside every fence go to the handler the program had
// installed before ours (or the default action: the program dies as it would have).
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

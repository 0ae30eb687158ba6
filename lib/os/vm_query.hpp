// SPDX-License-Identifier: MIT
// Questions the hotness monitors and movable residency ask the kernel about this process and
// machine: which parts of a range are mapped read-write, or with which protections
// (/proc/self/maps), whether a performance counter can be
// opened, and whether the process holds a capability. noexcept, errno returned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::vm_query {

struct Run {
  uintptr_t begin = 0, end = 0;
};
// The parts of [begin, end) mapped readable and writable (and not shared with a write-only
// or execute-only twist: exactly "rw" in /proc/self/maps), in ascending order, merged. *n
// counts them (at most cap; ENOSPC when more exist). Reads /proc/self/maps in 16 KiB chunks:
// cost grows with the process's VMA count, not with the range.
int read_write_runs(uintptr_t begin, uintptr_t end, Run* out, size_t cap, size_t* n) noexcept;

// Protections of [begin, end) as runs covering all of it, ascending, merged: kRead/kWrite/
// kExec bits as in /proc/self/maps, kUnmapped where nothing is mapped. ENOSPC when more than
// cap runs exist (*n = cap: the first ones).
inline constexpr int kRead = 1, kWrite = 2, kExec = 4, kUnmapped = -1;
struct ProtRun {
  uintptr_t begin = 0, end = 0;
  int prot = 0;
};
int protection_runs(uintptr_t begin, uintptr_t end, ProtRun* out, size_t cap, size_t* n) noexcept;

// Attributes the program may have set on the mappings overlapping [begin, end), from the
// VmFlags of /proc/self/smaps (read up to the range only): OR of these.
inline constexpr unsigned kVmLocked = 1, kVmDontDump = 2, kVmWipeOnFork = 4, kVmDontCopy = 8, kVmNoHugePage = 16,
                          kVmHugePage = 32;
int vma_flags(uintptr_t begin, uintptr_t end, unsigned* out) noexcept;

// perf_event_open of a user-space hardware event (PERF_TYPE_HARDWARE, CPU cycles) for this
// thread, closed at once: 0 when it opens, else its errno (ENOENT: no PMU exposed to this
// kernel, e.g. a VM without a virtual PMU; EACCES/EPERM: kernel.perf_event_paranoid).
int probe_hw_cycles() noexcept;

// Whether the calling thread has capability cap (linux/capability.h numbering) effective.
bool has_capability(int cap) noexcept;

}  // namespace cxlpool::os::vm_query

// SPDX-License-Identifier: MIT
// Memory the kernel holds for I/O that a process can see: the buffers registered with the
// io_uring instances it holds descriptors of (/proc/self/fdinfo/<ring fd>, "UserBufs:"), and
// the destinations of read system calls its threads are inside right now
// (/proc/self/task/<tid>/syscall): a synchronous O_DIRECT read keeps its pages pinned for the
// device's DMA until it returns. The kernel writes such pages directly, so a move that copies
// a range and maps the copy in its place must not take one. noexcept, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::io_pins {

enum class Verdict : uint8_t {
  kClear,    // no ring of the process has a registered buffer in the range
  kOverlap,  // one has (ring_fd, begin, end say which)
  kUnknown,  // a ring's buffers could not be listed now (see below): assume the worst
};
struct Result {
  Verdict verdict = Verdict::kUnknown;
  int ring_fd = -1;              // the ring that overlaps, or whose buffers are unknown
  int tid = -1;                  // reads_in_flight: the thread inside the read
  uintptr_t begin = 0, end = 0;  // kOverlap: the registered buffer, or the read's destination
  int error = 0;                 // kUnknown from /proc: its errno
};

// Every io_uring descriptor of the process (/proc/self/fd links "anon_inode:[io_uring]") and
// its registered buffers against [begin, end). The kernel lists a ring's buffers only when it
// can take the ring's lock without waiting (6.16+ prints nothing of the ring then; earlier
// kernels print the count without the list): a registration, or a submission, running at that
// moment makes the answer kUnknown, as does an unreadable /proc; attempts > 1 looks again
// (after a sched_yield) while the answer is kUnknown.
Result registered_buffers(uintptr_t begin, uintptr_t end, int attempts = 1) noexcept;

// Threads of the process other than the caller that are inside read(2), pread64(2), readv(2),
// preadv(2) or preadv2(2) from a file or device (not a pipe, socket or anonymous inode, whose
// reads copy and never pin) with a destination overlapping [begin, end). A thread the kernel
// shows as running (on a CPU or runnable, in user or kernel mode) has no system call to show;
// it matters only while a descriptor of the process is open with O_DIRECT (reads through
// other descriptors copy, and the fence holds them). Then it is looked at again for up to
// 1 ms until it is seen asleep (and judged by its call) or has completed a read system call
// since (syscr); one that is neither makes the answer kUnknown with error EAGAIN and tid
// naming it: it may be between pinning a read's pages and sleeping. Not seen: a read that
// polls for its completion (RWF_HIPRI) and never sleeps; a FUSE direct_io read caught
// running; an O_DIRECT read whose descriptor another thread closed while it ran. kUnknown
// otherwise: /proc could not be read, a readv's vector could not, or more than 256 threads
// were running at once.
Result reads_in_flight(uintptr_t begin, uintptr_t end) noexcept;
// The parser of one /proc/<pid>/task/<tid>/syscall line (tests): false for "running" or a
// task outside any system call; else *nr and args[0..5].
bool parse_syscall_line(const char* text, size_t len, long* nr, uint64_t args[6]) noexcept;

// The fdinfo parser, for one ring's text (exposed for tests). *hit_begin/*hit_end: the first
// overlapping buffer.
Verdict parse_fdinfo(const char* text, size_t len, uintptr_t begin, uintptr_t end, uintptr_t* hit_begin,
                     uintptr_t* hit_end) noexcept;

}  // namespace cxlpool::os::io_pins

// SPDX-License-Identifier: MIT
// The OS seam's core: every primitive the allocator, the device layer and fork handling need
// on their hot and failure paths. noexcept, no allocation, no formatting: each returns 0 or an
// errno value (cf. mimalloc's prim.h). The throwing, message-building wrappers for cold paths
// are in os.hpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace cxlpool::os::prim {

// ---- Address space -------------------------------------------------------------------------
// Reserves size bytes of inaccessible address space (PROT_NONE, MAP_NORESERVE) aligned to
// alignment (a power of two). ENOMEM when the address space (or RLIMIT_AS) is exhausted.
int reserve(size_t size, size_t alignment, void** out) noexcept;
int unmap(void* addr, size_t size) noexcept;
// Replaces [addr, addr+size) by a PROT_NONE mapping (read_write: readable and writable at once,
// with no moment of no access for a thread touching it): anonymous (private, or shared memory
// that a forked child keeps sharing), or of fd at offset (MAP_PRIVATE: written pages are
// process-private copies; MAP_SHARED: writes go to the file).
int map_anonymous_fixed(void* addr, size_t size, bool shared, bool read_write = false) noexcept;
int map_fd_fixed(void* addr, size_t size, int fd, uint64_t offset, bool shared) noexcept;
int protect(void* addr, size_t size, bool read_write) noexcept;
int protect_read_only(void* addr, size_t size) noexcept;
// Copies len bytes from src to dst of this process as the kernel reads memory for another
// process (process_vm_readv): a source page that is not readable (now) is EFAULT, not a fault.
int copy_checked(void* dst, const void* src, size_t len) noexcept;
// madvise(MADV_HUGEPAGE) when huge, else MADV_NOHUGEPAGE.
int advise_thp(void* addr, size_t size, bool huge) noexcept;
// mprotect with read (1), write (2) and execute (4) bits, as os::vm_query reports them.
int protect_prot(void* addr, size_t size, int prot) noexcept;
int advise_dontneed(void* addr, size_t size) noexcept;  // drops this mapping's pages
int advise_remove(void* addr, size_t size) noexcept;    // also frees the file pages (MADV_REMOVE)
// Faults the range in for writing (MADV_POPULATE_WRITE); EFAULT where a write would SIGBUS
// (a full tmpfs or hugetlbfs), ENOMEM without memory, EINVAL on kernels before 5.14.
int populate_write(void* addr, size_t size) noexcept;
// mbind(MPOL_BIND) of the range to one node; EINVAL for a node the kernel does not know.
int bind_node(void* addr, size_t size, int node) noexcept;
// Binds the range to node and moves its present pages there (mbind MPOL_MF_MOVE), then asks
// move_pages where each page is: *elsewhere = present pages still on another node after the
// retries (busy pages are retried; absent pages are not counted: later faults follow the
// new policy). ENOMEM: the node has no room for them (found by asking move_pages to move the
// pages left behind: mbind does not report it); the range may then be partly moved and is
// bound to node (the caller undoes that). EFAULT: a hole in the range (nothing changed).
// EINVAL: no such node.
int move_to_node(void* addr, size_t size, int node, size_t* elsewhere) noexcept;
// Gives the range the default memory policy again (mbind MPOL_DEFAULT).
int clear_policy(void* addr, size_t size) noexcept;
// Moves the mapping at from to to (mremap MREMAP_FIXED), replacing what was mapped at to.
int move_mapping(void* from, size_t size, void* to) noexcept;
// Frees [offset, offset+size) of a file (fallocate PUNCH_HOLE, size kept).
int punch_hole(int fd, uint64_t offset, size_t size) noexcept;
// Sets a file's length (ftruncate). 0 or an errno.
int truncate_fd(int fd, uint64_t size) noexcept;
// Writes zeros over [offset, offset+size) of a file (pwrite): blocks it already has stay
// allocated, so its shared mappings keep their room. 0 or an errno.
int zero_range(int fd, uint64_t offset, size_t size) noexcept;
// Allocates [offset, offset+size) of a file (fallocate, size kept): the filesystem's room for
// it is taken now, so that writes through a shared mapping cannot fault for lack of it later.
// ENOSPC or EDQUOT when there is not enough (ext4 keeps what it allocated before it ran out:
// punch_hole gives it back; tmpfs undoes it itself), EOPNOTSUPP where the filesystem cannot
// preallocate. Ranges already allocated cost a walk, nothing more.
int allocate_range(int fd, uint64_t offset, size_t size) noexcept;

// A NUMA memory policy as mbind(2) takes it: mode (with its MPOL_F_* flags) and node mask.
inline constexpr int kPolicyMaxNodes = 4096;  // the kernel's MAX_NUMNODES on the largest configurations
struct MemPolicy {
  int mode = 0;  // MPOL_DEFAULT: nothing to apply
  unsigned long nodes[kPolicyMaxNodes / 64] = {};
};
// The policy the kernel applies to pages faulted through a mapping of fd (a tmpfs mounted with
// mpol=, a shared policy set on the file), read through a one-page probe mapping; MPOL_DEFAULT
// when there is none. 0 or an errno.
int file_policy(int fd, MemPolicy* out) noexcept;
// mbind of [addr, addr+size) to policy (nothing for MPOL_DEFAULT).
int apply_policy(void* addr, size_t size, const MemPolicy& policy) noexcept;

// ---- Descriptors ---------------------------------------------------------------------------
struct FileId {
  uint64_t dev = 0, ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};
// Identity of what fd refers to now; EBADF when fd is closed.
int file_id(int fd, FileId* out) noexcept;
// Moves fd to a descriptor number near the top of RLIMIT_NOFILE (close-on-exec), where a
// program's own descriptors rarely go; returns the new number (fd is closed) or fd itself
// when no higher slot is free.
int move_fd_high(int fd) noexcept;
void close_fd(int fd) noexcept;
// Writes len bytes from buf at file offset off (loops over short writes).
int pwrite_all(int fd, const void* buf, size_t len, uint64_t off) noexcept;
// Copies [off, off+len) of in_fd to the same offsets of out_fd inside the kernel
// (copy_file_range); EXDEV/EINVAL/EOPNOTSUPP where the two files cannot (device-DAX).
int copy_range(int in_fd, int out_fd, uint64_t off, size_t len) noexcept;

// One page of anonymous memory shared with forked children (nullptr without memory): how a
// fork child tells its parent it is done, with no descriptor to run out of.
void* map_shared_page() noexcept;
void unmap_page(void* page) noexcept;
// futex on a word in shared memory: wait while *word == expected (at most timeout_ms);
// wake every waiter.
void futex_wait(const uint32_t* word, uint32_t expected, int timeout_ms) noexcept;
void futex_wake(uint32_t* word) noexcept;
// Sleeps ms milliseconds (signals do not cut it short).
void sleep_ms(unsigned ms) noexcept;
// Whether child pid has exited (or does not exist), without reaping it.
bool child_gone(int pid) noexcept;
// Blocks every signal on the calling thread; the old mask goes to *saved (sigset_t storage).
void block_signals(void* saved) noexcept;
void restore_signals(const void* saved) noexcept;
// Blocks every signal but the synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
// SIGSYS) on the calling thread (the old mask to *saved when given): cxlpool's own threads
// never run the program's handlers, and a thread holding a write fence never runs one that
// might write the fenced memory and wait on itself.
void block_async_signals(void* saved) noexcept;
// Undoes block_async_signals(saved) alone: unblocks the asynchronous signals that saved did not
// hold blocked, and leaves every other signal's state as it is now (a signal blocked before, or
// one glibc keeps for itself, stays blocked; one unblocked meanwhile stays unblocked).
void unblock_async_signals_since(const void* saved) noexcept;
inline constexpr size_t kSignalMaskBytes = 128;
// Copies [addr, addr+len) of the current mapping into fresh private anonymous memory that
// replaces it at the same address (mremap), keeping the data and read/write access.
int replace_with_private_copy(void* addr, size_t len) noexcept;

// ---- Threads -------------------------------------------------------------------------------
// Starts fn(arg) on a new thread with a stack of stack_bytes: cxlpool's own threads need
// little, and the default (8 MiB each) counts against an RLIMIT_AS. Where the C library needs
// more (the program's static TLS lives on every stack) the size doubles, up to 8 MiB.
// detached: nobody joins it. *id for join_thread. 0 or an errno value.
int start_thread(void* (*fn)(void*), void* arg, size_t stack_bytes, bool detached, unsigned long* id) noexcept;
int join_thread(unsigned long id) noexcept;
// True when one more thread of ours cannot take a thread the program itself will need:
// RLIMIT_NPROC counts every thread of the real user on the machine, and a thread the program
// then fails to start (EAGAIN) would be our doing. So: the limit is unlimited, or the tasks of
// the whole machine (/proc/loadavg) plus 64 stay below it, or else the user's own threads
// (a scan of /proc, its verdict kept 10 s) plus 64 do. Unknown counts as no room.
// Allocates nothing.
bool thread_headroom() noexcept;
// The addresses [*lo, *hi) of the dynamic loader's code and data in this process (AT_BASE and
// its ELF program headers). ENOENT when there is none: a static program, or the loader run
// as the program itself.
int loader_range(uintptr_t* lo, uintptr_t* hi) noexcept;

// ---- Processes ----------------------------------------------------------------------------
int process_id() noexcept;
// Bytes of address space still available under RLIMIT_AS (SIZE_MAX when unlimited).
size_t address_space_headroom() noexcept;
// RLIMIT_AS itself (SIZE_MAX when unlimited).
size_t address_space_limit() noexcept;
// CPUs online when first asked (at least 1).
unsigned online_cpus() noexcept;
// Writes a line to stderr with write(2): usable where nothing may allocate.
void write_stderr(const char* text) noexcept;
[[noreturn]] void exit_now(int status) noexcept;  // _exit: no atexit handlers, no flushing

}  // namespace cxlpool::os::prim

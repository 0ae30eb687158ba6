// SPDX-License-Identifier: MIT
// The OS seam's cold half: throwing wrappers that name the failing call and its arguments
// (detail::Failure), for setup and configuration paths. The noexcept primitives of hot and
// failure paths are in prim.hpp, hwloc in hwloc.hpp, file-tree reads in fs_root.hpp; nothing
// else in cxlpool talks to the kernel. Kernel capabilities are probed once.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace cxlpool::os {

size_t page_size();
// Monotonic time in ns at the kernel tick's resolution (CLOCK_MONOTONIC_COARSE): cheap.
uint64_t coarse_now_ns() noexcept;
uint64_t total_ram_bytes();
// vm.max_map_count: how many mappings (VMAs) the kernel allows a process; 65530 (the kernel's
// default) when it cannot be read.
uint64_t max_map_count() noexcept;
// The mappings (VMAs) the process holds now: the lines of /proc/self/maps, read with plain
// system calls into a stack buffer (nothing allocated). 0 when it cannot be read.
uint64_t process_mappings() noexcept;

// Capabilities of the running kernel, probed once on first use.
struct KernelCaps {
  bool madv_populate_write = false;       // MADV_POPULATE_WRITE (5.14+)
  bool mpol_weighted_interleave = false;  // MPOL_WEIGHTED_INTERLEAVE accepted by mbind (6.9+)
  bool memfd = false;
  int max_numa_node = 0;  // highest possible node id the kernel accepts in masks
};
const KernelCaps& kernel_caps();

// ---- Address space (throwing wrappers over prim.hpp for cold paths) ----
void unmap(void* addr, size_t size) noexcept;

// Private anonymous read-write memory for allocator metadata (local DRAM, default policy).
// noreserve: address space only until touched.
void* map_metadata(size_t size, bool noreserve = false);
// The same, nullptr instead of an exception (allocation slow paths).
void* try_map_metadata(size_t size, bool noreserve = false) noexcept;
// A read-only MAP_SHARED mapping of [0, size) of fd, or nullptr.
const void* try_map_readonly(int fd, size_t size) noexcept;
// Asks for transparent huge pages on a metadata range (fewer TLB misses); best effort.
void advise_hugepages(void* addr, size_t size) noexcept;

// ---- NUMA ----
// move_pages status query: out[i] = node of page i, or negative errno (-ENOENT: not present).
void query_page_nodes(const void* addr, size_t pages, int* out);

// ---- Files and shared memory ----
int memfd_create(const std::string& name);
// A shared, sealed page for publishing: a memfd named name of bytes bytes (close-on-exec),
// mapped read-write here, then sealed against growing, shrinking and any new writable
// mapping (F_SEAL_FUTURE_WRITE: a reader can map it, never write it). The descriptor is moved
// near the top of RLIMIT_NOFILE. Throws Failure(OS) naming the call.
void* create_sealed_page(const std::string& name, size_t bytes, int* fd_out);
// The calling process's name (comm), at most 15 characters.
std::string program_name();
// An unnamed regular file (O_TMPFILE, mode 0600) in dir, for a device's private storage: it
// never appears in the directory and disappears with its last descriptor or mapping. On
// filesystems without O_TMPFILE: a uniquely named file created with O_EXCL and unlinked at
// once. Refuses pseudo filesystems (proc, sys, ...). what names the device in messages.
int open_tmpfile(const std::string& dir, const std::string& what);
// Opens a character device read-write (devdax); refuses anything else.
int open_char_device(const std::string& path);
// flock(LOCK_EX|LOCK_NB); CXLPOOL_E_BUSY when another open file description holds it.
void lock_exclusive(int fd, const std::string& what);
// flock(LOCK_EX or LOCK_SH, LOCK_NB), also converting a lock fd holds: 0 or an errno
// (EWOULDBLOCK: another open file description holds a conflicting lock).
int try_lock(int fd, bool exclusive) noexcept;
void close_fd(int fd) noexcept;
void truncate_fd(int fd, uint64_t size);
// Whether writes must go through a shared mapping to land in fd's own memory: a file in DAX
// mode (statx STATX_ATTR_DAX) or on hugetlbfs.
bool fd_needs_shared_mapping(int fd) noexcept;
// Whether fd is a file on hugetlbfs.
bool fd_on_hugetlbfs(int fd) noexcept;
// Page granule of the filesystem holding fd (hugetlbfs: huge page size), at least page_size().
size_t fd_page_size(int fd);
// Free bytes of the filesystem holding path, or 0 when it cannot be determined.
uint64_t fs_free_bytes(const std::string& path);
// Name of a pseudo filesystem (proc, sysfs, ...) that cannot hold memory, or "" for a
// filesystem that can (or when path cannot be examined).
std::string pseudo_filesystem(const std::string& path);
// What is at path: "" when nothing, else "regular file", "directory", "FIFO", ...
std::string path_kind(const std::string& path);
// Owner uid and permission bits of path (lstat); false when it cannot be examined.
bool path_owner(const std::string& path, unsigned& uid, unsigned& mode);
// " (its owner is uid N, its mode 0MMM; this process runs as uid M)" for what fd names (an
// O_PATH descriptor is enough), or "" when it cannot be examined: why an open was refused.
std::string ownership_text(int fd);
// Whole contents of a regular file (at most 16 MiB); throws naming the path on failure.
std::string read_text_file(const std::string& path);
// The same for a file the user named (a configuration): opened through os::open_user_input,
// so another user's symbolic link on the way or file is refused, naming why.
std::string read_user_file(const std::string& path);
// The rest of fd's contents (at most 16 MiB), then closes fd; path names it in messages.
std::string read_whole_fd(int fd, const std::string& path);
bool is_char_device(const std::string& path);
// The kernel subsystem of a character device ("dax", "mem", ...) from /sys/dev/char, or "".
std::string char_device_subsystem(const std::string& path);
// path with every symlink resolved (realpath), or path itself when that fails.
std::string real_path_or(const std::string& path);
// path's directory resolved (realpath) plus its last component: the same file however the
// directory is reached, the name itself never followed.
std::string real_dir_path(const std::string& path);
std::string parent_dir(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace cxlpool::os

namespace cxlpool::os {

// ---- Shared pool files and process identity (os/pool_files.cpp) ----
// Where a new pool file is being made: the directory that will hold it, held open from the
// check that nothing has the name until the link, and the temporary name used where the
// filesystem lacks O_TMPFILE (removed by link_new_file, or when the site is destroyed).
struct NewFileSite {
  int dir = -1;
  std::string name, temp;
  NewFileSite() = default;
  NewFileSite(const NewFileSite&) = delete;
  NewFileSite& operator=(const NewFileSite&) = delete;
  ~NewFileSite();
};
// A new file of the given mode in path's directory, not yet visible under any name
// (O_TMPFILE), or an exclusively created ".cxlpool-creating-*" file. The directory is reached
// through os::resolve_path (another user's link on the way is refused); CXLPOOL_E_EXISTS when
// path already names something. what names the pool in messages.
int create_unnamed_file(const std::string& path, unsigned mode, const std::string& what, NewFileSite* site);
// Gives a file from create_unnamed_file the name path, atomically; CXLPOOL_E_EXISTS (nothing
// touched) when something already has that name.
void link_new_file(int fd, NewFileSite* site, const std::string& path, const std::string& what);
// Opens an existing regular file (or, char_device, a character device) read-write without
// following a final symlink (nor another user's symlink above it: os::resolve_path); refuses other kinds with
// CXLPOOL_E_CONFIG, having looked at them through O_PATH only (a FIFO is never opened, its writers never woken).
int open_existing(const std::string& path, bool char_device, const std::string& what);
// The same, read-only (a look that writes nothing: no IN_CLOSE_WRITE for watchers either).
int open_existing_readonly(const std::string& path, bool char_device, const std::string& what);
// pread of exactly len bytes at off; false with errno (EIO: the file ends before) otherwise.
bool read_exact(int fd, void* buf, size_t len, uint64_t off) noexcept;
uint64_t fd_size(int fd);
// Identity of what fd is (device, inode, size), and of what path names now (false when
// nothing: removed, or unreadable). Tells a pool file that vanished or was replaced.
struct PathIdentity {
  uint64_t dev = 0, ino = 0, size = 0;
};
PathIdentity fd_identity(int fd);
bool path_identity(const std::string& path, PathIdentity* out) noexcept;
// Reserves the file's blocks now (posix_fallocate), so a full filesystem is an error here and
// not a SIGBUS later; a filesystem that cannot preallocate is accepted as is.
void allocate_file(int fd, uint64_t size, const std::string& what);
// Allocates whatever [0, size) of an existing pool file lacks (a sparse copy of it), so that
// writes through its mapping cannot SIGBUS on a full filesystem; CXLPOOL_E_CAPACITY when there
// is no room for the holes. Costs one fstat when the file is whole.
void fill_holes(int fd, uint64_t size, const std::string& what);
// MAP_SHARED read-write mapping of [offset, offset+size) of fd.
void* map_shared_fd(int fd, size_t size, uint64_t offset, const std::string& what);
// Removes path's name, walked as open_existing does, only while it names the file expected
// (CXLPOOL_E_CONFIG, nothing removed, when it was replaced after being checked).
void unlink_path(const std::string& path, const PathIdentity& expected, const std::string& what);
void random_bytes(void* out, size_t len);
// The environment variable's value, or nullptr (unset, or a setuid/setgid process). Does not
// allocate.
const char* env_value(const char* name) noexcept;
uint64_t realtime_ns() noexcept;
// How many times this process image has been forked into a child: 0 in the original process,
// one more in every child (count_fork_in_child, from lib/lifecycle's fork child handler).
// Cheaper than getpid() on every call to notice "I am a forked child".
uint64_t fork_generation() noexcept;
// In a fork child, before anything else runs there: fork_generation() moves on.
void count_fork_in_child() noexcept;
uint64_t monotonic_ns() noexcept;
// Identity of this boot (hash of /proc/sys/kernel/random/boot_id; 0 when unreadable) and of
// the calling process's pid namespace (inode of /proc/self/ns/pid; 0 when unreadable).
uint64_t boot_id_hash() noexcept;
uint64_t pid_namespace_id() noexcept;
// Start time of pid in clock ticks since boot (/proc/PID/stat field 22); 0 when there is no
// such process (kill(pid, 0) says ESRCH); kStartUnknown when it cannot be told now (no
// descriptor left, /proc hiding other users' processes, a zombie leader whose threads may
// still run): nothing may be concluded then. With the boot id and pid namespace it
// tells a live process from a reused pid.
inline constexpr uint64_t kStartUnknown = UINT64_MAX;
uint64_t process_start_ticks(int pid) noexcept;
// The calling thread's id (gettid).
int thread_id() noexcept;
// What /proc says about thread tid of process pid (this pid namespace): kGone (no such thread:
// tgkill says ESRCH, or it exited, or its start time is not start_ticks: a reused id; a
// start_ticks of 0 is not compared), kRunning (any state but stopped: running, sleeping, in
// the kernel), kStopped (T: SIGSTOP or job control; t: stopped by a debugger), kExists (/proc
// cannot tell now: out of descriptors, hidepid; but tgkill finds the thread), kUnknown (nothing
// can be concluded: a zombie leader asked about as tid == pid, whose other threads may run).
enum class TaskLife : uint8_t { kGone, kRunning, kStopped, kExists, kUnknown };
TaskLife task_life(int pid, int tid, uint64_t start_ticks) noexcept;
// Start time of thread tid of pid in clock ticks since boot; 0 when it cannot be read.
uint64_t task_start_ticks(int pid, int tid) noexcept;
// The calling thread's start time, read through /proc/thread-self (right whichever pid
// namespace the /proc mounted here belongs to); 0 when it cannot be read.
uint64_t self_task_start_ticks() noexcept;
// Whether the /proc mounted here belongs to our pid namespace (its numbers are ours): false
// in a container that did not mount its own.
bool proc_is_ours() noexcept;
// Where a process of another pid namespace of this host (a container) is in this /proc:
// thread ns_tid of process ns_pid, numbered so in pid namespace pidns (the inode of its
// ns/pid). A process whose ns/pid cannot be inspected (not dumpable, another user's) is taken
// for it when its thread ns_tid started at start_ticks (0: not known). kFound with their ids
// here. kGone when the process or thread is not in that namespace and the namespace is below
// ours: seen now, or seen before and held open since (so its number was not reused; a
// namespace below ours stays so and disappears only when its last process has ended).
// kUnreachable when nothing can be told: the namespace is not below ours, /proc hides or
// refuses entries, or this /proc is not of our namespace. A found thread is remembered and
// re-checked cheaply (and kept when nothing can be read, out of descriptors); an unreachable
// one is not searched for again for 2 s.
enum class NsFind : uint8_t { kFound, kGone, kUnreachable };
NsFind find_in_pid_namespace(uint64_t pidns, int ns_pid, int ns_tid, uint64_t start_ticks, int* pid, int* tid) noexcept;

}  // namespace cxlpool::os

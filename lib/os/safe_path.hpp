// SPDX-License-Identifier: MIT
// Paths a user names (CXLPOOL_STATS, CXLPOOL_CONFIG, shared pool files), walked one component
// at a time from descriptors: a symbolic link anywhere on the way is followed only when it
// belongs to this user or to root, so another user's link cannot send cxlpool to a file it did
// not mean. No allocation: the interposer uses it at exit.
#pragma once

#include <sys/types.h>

#include <climits>

namespace cxlpool::os {

// Why a path was refused or could not be used, naming the component ("'link' is a symbolic
// link owned by uid 65534 ...").
struct PathWhy {
  char text[320] = "";
};

// What a path names, held by descriptors: nothing can be swapped under a caller that works
// from them. Closes what it holds.
struct ResolvedPath {
  int dir = -1;               // O_PATH descriptor of the directory holding the last component
  int leaf = -1;              // O_PATH descriptor of the last component (never a symlink); -1: absent
  char name[NAME_MAX + 1]{};  // the last component's name in dir
  bool last_is_link = false;  // kNoFollowLast refused: the last component is a symbolic link
  ResolvedPath() = default;
  ResolvedPath(const ResolvedPath&) = delete;
  ResolvedPath& operator=(const ResolvedPath&) = delete;
  ~ResolvedPath();
};

// Walks path with O_PATH | O_NOFOLLOW, component by component. A symbolic link is followed
// (its text spliced into the rest of the walk) only when its owner is the effective uid or
// root; /proc's links (/proc/self, /proc/self/fd/N, which name kernel objects rather than
// paths) are followed by the kernel. The kernel's fs.protected_symlinks is not relied on: it
// covers only the last component, only in sticky world-writable directories, and may be off.
// kNoFollowLast: a link as the last component is refused (ELOOP) whoever owns it.
// Returns 0, or an errno value with *why filled in (EPERM for another user's link).
enum ResolveFlags : unsigned { kFollowTrusted = 0, kNoFollowLast = 1 };
int resolve_path(const char* path, ResolvedPath* out, PathWhy* why, unsigned flags = kFollowTrusted) noexcept;

// Opens what r.leaf names with flags (O_CLOEXEC | O_NOCTTY added): through /proc/self/fd (the
// same inode, whatever its name means by now), or by name with the identity compared when
// /proc is not mounted. -1 with errno (ESTALE: replaced meanwhile).
int reopen_resolved(const ResolvedPath& r, int flags) noexcept;

// Opens path for output the user asked for (a statistics table, a benchmark's JSON): through
// resolve_path; an existing regular file only when the effective uid owns it and it has one
// name (a hard link to another file is refused); a FIFO or character device only when this
// user or root owns it; never a directory, block device or socket. A missing file is created
// (O_EXCL, mode 0644 less the umask). O_NONBLOCK: a FIFO nobody reads is an error, not a hang.
// kAppend: O_APPEND, nothing truncated; kTruncate: a regular file is emptied (ftruncate of the
// checked descriptor, after every check). Returns the descriptor, or -1 with errno and *why.
enum class OutputMode { kAppend, kTruncate };
int open_user_output(const char* path, OutputMode mode, PathWhy* why) noexcept;

// Opens path for reading input the user named (a configuration file): through resolve_path;
// only a regular file owned by the effective uid or root (another user's file could have been
// put there in place of the one meant). Returns the descriptor, or -1 with errno and *why.
int open_user_input(const char* path, PathWhy* why) noexcept;

}  // namespace cxlpool::os

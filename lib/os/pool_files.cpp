// SPDX-License-Identifier: MIT
// The OS seam for shared pools: files created unnamed and linked when complete, opening what
// exists without following symlinks, shared mappings; the identity of processes is in
// process_life.cpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/safe_path.hpp"

namespace cxlpool::os {

using detail::fail;
using detail::fail_os;

NewFileSite::~NewFileSite() {
  if (dir >= 0 && !temp.empty()) ::unlinkat(dir, temp.c_str(), 0);
  if (dir >= 0) ::close(dir);
}

int create_unnamed_file(const std::string& path, unsigned mode, const std::string& what, NewFileSite* site) {
  const std::string dir = parent_dir(path);
  std::string pseudo = pseudo_filesystem(dir);
  if (!pseudo.empty())
    fail(CXLPOOL_E_CONFIG, what + ": " + dir + " is on a " + pseudo + " pseudo filesystem, which cannot hold memory");
  {
    ResolvedPath r;
    PathWhy why;
    const int e = resolve_path(path.c_str(), &r, &why, kNoFollowLast);
    if (r.last_is_link || (!e && r.leaf >= 0))
      fail(CXLPOOL_E_EXISTS, what + ": \"" + path + "\" already exists; it was left untouched (open it, or remove it)");
    if (e == EPERM) fail(CXLPOOL_E_PERMISSION, what + ": \"" + path + "\": " + why.text);
    if (e) fail_os(what + ": \"" + path + "\": " + why.text, e);
    site->dir = r.dir;  // the directory stays the one checked until the file is linked there
    r.dir = -1;
    site->name = r.name;
  }
  int fd = ::openat(site->dir, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
  auto refused = [&](int e) {
    if (e == EACCES || e == EPERM)
      fail(CXLPOOL_E_PERMISSION,
           what + ": no permission to create a file in the directory '" + dir + "'" + ownership_text(site->dir));
  };
  if (fd < 0) {
    int err = errno;
    refused(err);
    if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) fail_os(what + ": open(\"" + dir + "\", O_TMPFILE)", err);
    for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
      char name[96];
      snprintf(name, sizeof name, ".cxlpool-creating-%d-%lx-%d", prim::process_id(),
               static_cast<unsigned long>(monotonic_ns()), attempt);
      fd = ::openat(site->dir, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
      if (fd >= 0) site->temp = name;
      if (fd < 0) refused(errno);
      if (fd < 0 && errno != EEXIST) fail_os(what + ": open(\"" + dir + "/" + name + "\", O_CREAT|O_EXCL)", errno);
    }
    if (fd < 0) fail(CXLPOOL_E_OS, what + ": cannot create a file in " + dir);
  }
  if (fchmod(fd, mode) != 0) {  // exactly the mode asked for, whatever the umask
    int err = errno;
    ::close(fd);
    fail_os(what + ": fchmod", err);
  }
  return fd;
}

void link_new_file(int fd, NewFileSite* site, const std::string& path, const std::string& what) {
  int rc;
  if (!site->temp.empty()) {
    rc = ::linkat(site->dir, site->temp.c_str(), site->dir, site->name.c_str(), 0);
    int err = errno;
    ::unlinkat(site->dir, site->temp.c_str(), 0);
    site->temp.clear();
    errno = err;
  } else {
    rc = ::linkat(fd, "", site->dir, site->name.c_str(), AT_EMPTY_PATH);
    if (rc != 0 && (errno == ENOENT || errno == EPERM)) {  // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH
      char proc[64];
      snprintf(proc, sizeof proc, "/proc/thread-self/fd/%d", fd);
      rc = ::linkat(AT_FDCWD, proc, site->dir, site->name.c_str(), AT_SYMLINK_FOLLOW);
    }
  }
  if (rc == 0) return;
  if (errno == EEXIST)
    fail(CXLPOOL_E_EXISTS, what + ": \"" + path + "\" already exists; it was left untouched (open it, or remove it)");
  fail_os(what + ": link to \"" + path + "\"", errno);
}

namespace {
// Opens path with flags after looking at what it is through an O_PATH descriptor (which opens
// nothing): a FIFO, socket or device of the wrong kind is refused before any real open, so no
// writer blocked on a FIFO is woken and nothing of it changes. The path is walked by
// os::resolve_path: a link as the last component is refused, another user's link above it too.
int open_checked(const std::string& path, bool char_device, int flags, const std::string& what) {
  ResolvedPath r;
  PathWhy why;
  if (const int e = resolve_path(path.c_str(), &r, &why, kNoFollowLast)) {
    if (r.last_is_link) fail(CXLPOOL_E_CONFIG, what + ": \"" + path + "\" is a symbolic link; give the real path");
    if (e == EPERM) fail(CXLPOOL_E_PERMISSION, what + ": \"" + path + "\": " + why.text);
    fail_os(what + ": \"" + path + "\": " + why.text, e);
  }
  if (r.leaf < 0) fail_os(what + ": \"" + path + "\"", ENOENT);
  struct stat st {};
  if (fstat(r.leaf, &st) != 0) fail_os(what + ": fstat", errno);
  const bool ok = char_device ? S_ISCHR(st.st_mode) : S_ISREG(st.st_mode);
  if (!ok)
    fail(CXLPOOL_E_CONFIG,
         what + ": \"" + path + "\" is not a " + (char_device ? "character device" : "regular file") + "; not a pool");
  const int fd = reopen_resolved(r, flags | O_NONBLOCK);
  if (fd < 0 && errno == ESTALE) fail(CXLPOOL_E_CONFIG, what + ": \"" + path + "\" was replaced while being opened");
  if (fd < 0 && (errno == EACCES || errno == EPERM))
    fail(CXLPOOL_E_PERMISSION, what + ": \"" + path + "\": no permission to open it for " +
                                   ((flags & O_ACCMODE) == O_RDWR ? "reading and writing" : "reading") +
                                   ownership_text(r.leaf));
  if (fd < 0) fail_os(what + ": open(\"" + path + "\")", errno);
  return fd;
}
}  // namespace

int open_existing(const std::string& path, bool char_device, const std::string& what) {
  return open_checked(path, char_device, O_RDWR, what);
}

int open_existing_readonly(const std::string& path, bool char_device, const std::string& what) {
  return open_checked(path, char_device, O_RDONLY, what);
}

bool read_exact(int fd, void* buf, size_t len, uint64_t off) noexcept {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::pread(fd, p, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // end of file: it is shorter than it says
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
    off += static_cast<uint64_t>(n);
  }
  return true;
}

uint64_t fd_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail_os("fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

PathIdentity fd_identity(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail_os("fstat", errno);
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size)};
}

bool path_identity(const std::string& path, PathIdentity* out) noexcept {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *out = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size)};
  return true;
}

void allocate_file(int fd, uint64_t size, const std::string& what) {
  int err = posix_fallocate(fd, 0, off_t(size));
  if (err == 0 || err == EOPNOTSUPP || err == EINVAL) return;
  if (err == ENOSPC || err == EDQUOT)
    fail(CXLPOOL_E_CAPACITY, what + ": the filesystem has no room for " + std::to_string(size) + " bytes");
  fail_os(what + ": posix_fallocate", err);
}

void fill_holes(int fd, uint64_t size, const std::string& what) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || uint64_t(st.st_blocks) * 512 >= size) return;  // allocated whole, as created
  // fallocate, never posix_fallocate: glibc's fallback writes a byte per block, which would
  // race with the pool's live participants.
  const int err = prim::allocate_range(fd, 0, size);
  if (err == 0 || err == EOPNOTSUPP || err == ENOSYS) return;
  if (err == ENOSPC || err == EDQUOT)
    fail(CXLPOOL_E_CAPACITY, what +
                                 ": the pool's file has holes (a sparse copy?) and its filesystem has no room "
                                 "to fill them; writing there would kill the program with SIGBUS. Free room "
                                 "there, or copy the file without holes");
  fail_os(what + ": fallocate", err);
}

void* map_shared_fd(int fd, size_t size, uint64_t offset, const std::string& what) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM)  // the address space (RLIMIT_AS, map count), not the pool, is full
      throw detail::Failure(CXLPOOL_E_NO_MEMORY,
                            what + ": mmap(" + std::to_string(size) + " bytes, MAP_SHARED): no address space left (" +
                                std::strerror(err) + "; RLIMIT_AS or vm.max_map_count)",
                            err);
    fail_os(what + ": mmap(" + std::to_string(size) + " bytes, MAP_SHARED)", err);
  }
  return p;
}

void unlink_path(const std::string& path, const PathIdentity& expected, const std::string& what) {
  ResolvedPath r;
  PathWhy why;
  if (const int e = resolve_path(path.c_str(), &r, &why, kNoFollowLast)) {
    if (r.last_is_link) fail(CXLPOOL_E_CONFIG, what + ": \"" + path + "\" is a symbolic link; give the real path");
    if (e == EPERM) fail(CXLPOOL_E_PERMISSION, what + ": \"" + path + "\": " + why.text);
    fail_os(what + ": unlink(\"" + path + "\")", e);
  }
  if (r.leaf < 0 || r.dir < 0) fail_os(what + ": unlink(\"" + path + "\")", r.leaf < 0 ? ENOENT : EISDIR);
  // The name is removed only while it names the file that was checked, in the directory held.
  struct stat st {};
  if (::fstatat(r.dir, r.name, &st, AT_SYMLINK_NOFOLLOW) != 0) fail_os(what + ": unlink(\"" + path + "\")", errno);
  if (static_cast<uint64_t>(st.st_dev) != expected.dev || static_cast<uint64_t>(st.st_ino) != expected.ino)
    fail(CXLPOOL_E_CONFIG, what + ": \"" + path + "\" was replaced while being removed; it was left untouched");
  if (::unlinkat(r.dir, r.name, 0) != 0) fail_os(what + ": unlink(\"" + path + "\")", errno);
}

const char* env_value(const char* name) noexcept { return secure_getenv(name); }

void random_bytes(void* out, size_t len) {
  auto* p = static_cast<unsigned char*>(out);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_os("getrandom", errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

namespace {
std::atomic<uint64_t> g_fork_generation{0};
}  // namespace

uint64_t fork_generation() noexcept { return g_fork_generation.load(std::memory_order_relaxed); }
void count_fork_in_child() noexcept { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

uint64_t realtime_ns() noexcept {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

uint64_t monotonic_ns() noexcept {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

}  // namespace cxlpool::os

// SPDX-License-Identifier: MIT
// Paths a user names, walked from descriptors so that nothing another user controls (a link
// in /tmp, a link to a directory above the file, a file swapped in between a check and the
// open) can redirect cxlpool. Plain system calls and fixed buffers only: the interposer calls
// it at exit, where allocating is not welcome.
#include "os/safe_path.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace cxlpool::os {

ResolvedPath::~ResolvedPath() {
  if (leaf >= 0) ::close(leaf);
  if (dir >= 0) ::close(dir);
}

namespace {

constexpr int kMaxLinks = 40;  // the kernel's own limit (MAXSYMLINKS)

[[gnu::format(printf, 3, 4)]] int refuse(PathWhy* why, int err, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(why->text, sizeof why->text, fmt, ap);
  va_end(ap);
  return err;
}

const char* kind_of(mode_t mode) noexcept {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "regular file";
    case S_IFDIR:
      return "directory";
    case S_IFIFO:
      return "FIFO";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    case S_IFSOCK:
      return "socket";
    default:
      return "special file";
  }
}

void close_quietly(int fd) noexcept {
  const int err = errno;
  ::close(fd);
  errno = err;
}

}  // namespace

int reopen_resolved(const ResolvedPath& r, int flags) noexcept {
  struct stat st {};
  if (::fstat(r.leaf, &st) != 0) return -1;
  char via[48];
  std::snprintf(via, sizeof via, "/proc/thread-self/fd/%d", r.leaf);
  int fd = ::open(via, flags | O_CLOEXEC | O_NOCTTY);
  if (fd < 0 && errno == ENOENT && r.dir >= 0) fd = ::openat(r.dir, r.name, flags | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -1;
  struct stat now {};
  if (::fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    close_quietly(fd);
    errno = ESTALE;
    return -1;
  }
  return fd;
}

int resolve_path(const char* path, ResolvedPath* out, PathWhy* why, unsigned flags) noexcept {
  if (!path || !*path) return refuse(why, ENOENT, "the path is empty");
  const size_t len = std::strlen(path);
  if (len >= PATH_MAX) return refuse(why, ENAMETOOLONG, "the path is longer than %d bytes", PATH_MAX - 1);
  // The walk's remaining text; a followed link's target is spliced in front of what came
  // after it, alternating between the two buffers.
  char buf[2][PATH_MAX];
  int which = 0;
  std::memcpy(buf[0], path, len + 1);
  const char* rest = buf[0];
  int cur = ::open(rest[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0)
    return refuse(why, errno, "cannot open %s: %s", rest[0] == '/' ? "/" : "the working directory",
                  std::strerror(errno));
  const uid_t me = ::geteuid();
  int links = 0;
  // The name of the directory `cur` is, for a refusal to search it.
  char here[NAME_MAX + 1];
  std::strcpy(here, rest[0] == '/' ? "/" : ".");
  for (;;) {
    while (*rest == '/') ++rest;
    if (!*rest) {  // "/" or a name ending in "/": a directory
      out->leaf = cur;
      std::strcpy(out->name, ".");
      return 0;
    }
    const char* end = std::strchr(rest, '/');
    if (!end) end = rest + std::strlen(rest);
    const auto n = static_cast<size_t>(end - rest);
    if (n > NAME_MAX) {
      ::close(cur);
      return refuse(why, ENAMETOOLONG, "a component is longer than %d bytes", NAME_MAX);
    }
    char comp[NAME_MAX + 1];
    std::memcpy(comp, rest, n);
    comp[n] = 0;
    rest = end;
    const char* after = rest;
    while (*after == '/') ++after;
    const bool last = *after == 0;
    const bool dots = std::strcmp(comp, ".") == 0 || std::strcmp(comp, "..") == 0;
    const int fd = ::openat(cur, comp, dots ? O_PATH | O_DIRECTORY | O_CLOEXEC : O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT && last) {  // the file to create
        out->dir = cur;
        std::memcpy(out->name, comp, n + 1);
        return 0;
      }
      ::close(cur);
      // Looking a name up needs search permission on the directory that holds it.
      if (err == EACCES)
        return refuse(why, err, "no search permission on the directory '%s' that holds '%s': %s", here, comp,
                      std::strerror(err));
      return refuse(why, err, "'%s': %s", comp, std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      ::close(cur);
      return refuse(why, err, "'%s': fstat: %s", comp, std::strerror(err));
    }
    if (S_ISLNK(st.st_mode)) {
      if (last && (flags & kNoFollowLast)) {
        out->last_is_link = true;
        ::close(fd);
        ::close(cur);
        return refuse(why, ELOOP, "'%s' is a symbolic link", comp);
      }
      if (st.st_uid != me && st.st_uid != 0) {
        ::close(fd);
        ::close(cur);
        return refuse(why, EPERM,
                      "'%s' is a symbolic link owned by uid %u; cxlpool follows only links owned by this user "
                      "(uid %u) or root",
                      comp, unsigned(st.st_uid), unsigned(me));
      }
      if (++links > kMaxLinks) {
        ::close(fd);
        ::close(cur);
        return refuse(why, ELOOP, "more than %d symbolic links", kMaxLinks);
      }
      struct statfs fs {};
      if (::fstatfs(fd, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC) {
        // /proc/self, /proc/self/fd/N: they name kernel objects, not paths; the kernel follows.
        ::close(fd);
        const int target = ::openat(cur, comp, O_PATH | O_CLOEXEC);
        if (target < 0) {
          const int err = errno;
          ::close(cur);
          return refuse(why, err, "'%s': %s", comp, std::strerror(err));
        }
        if (last) {
          out->dir = cur;
          out->leaf = target;
          std::memcpy(out->name, comp, n + 1);
          return 0;
        }
        ::close(cur);
        cur = target;
        std::memcpy(here, comp, n + 1);
        continue;
      }
      char target[PATH_MAX];
      const ssize_t tn = ::readlinkat(fd, "", target, sizeof target);
      const int err = errno;
      ::close(fd);
      const size_t rest_len = std::strlen(rest);
      if (tn <= 0 || size_t(tn) + rest_len >= PATH_MAX) {
        ::close(cur);
        if (tn < 0) return refuse(why, err, "'%s': readlink: %s", comp, std::strerror(err));
        return refuse(why, tn == 0 ? ENOENT : ENAMETOOLONG, "'%s': its target is %s", comp,
                      tn == 0 ? "empty" : "too long");
      }
      char* next = buf[1 - which];
      std::memcpy(next, target, size_t(tn));
      std::memcpy(next + tn, rest, rest_len + 1);  // rest is empty or starts with '/'
      which = 1 - which;
      rest = next;
      if (target[0] == '/') {
        ::close(cur);
        std::strcpy(here, "/");
        cur = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (cur < 0) return refuse(why, errno, "cannot open /: %s", std::strerror(errno));
      }
      continue;
    }
    if (last) {
      out->dir = cur;
      out->leaf = fd;
      std::memcpy(out->name, comp, n + 1);
      return 0;
    }
    ::close(cur);
    cur = fd;
    std::memcpy(here, comp, n + 1);
    if (!S_ISDIR(st.st_mode)) {
      ::close(cur);
      return refuse(why, ENOTDIR, "'%s' is a %s, not a directory", comp, kind_of(st.st_mode));
    }
  }
}

int open_user_output(const char* path, OutputMode mode, PathWhy* why) noexcept {
  const int flags = O_WRONLY | O_NONBLOCK | (mode == OutputMode::kAppend ? O_APPEND : 0);
  const uid_t me = ::geteuid();
  for (int attempt = 0; attempt < 8; ++attempt) {
    ResolvedPath r;
    if (int e = resolve_path(path, &r, why)) {
      errno = e;
      return -1;
    }
    if (r.leaf < 0) {
      const int fd = ::openat(r.dir, r.name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
      if (fd >= 0) return fd;
      if (errno == EEXIST) continue;  // created meanwhile: look at what it is
      errno = refuse(why, errno, "cannot create it: %s", std::strerror(errno));
      return -1;
    }
    struct stat st {};
    if (::fstat(r.leaf, &st) != 0) {
      errno = refuse(why, errno, "fstat: %s", std::strerror(errno));
      return -1;
    }
    int e = 0;
    if (S_ISREG(st.st_mode)) {
      if (st.st_uid != me)
        e = refuse(why, EPERM,
                   "it is a regular file owned by uid %u, not by this user (uid %u); cxlpool never writes "
                   "another user's file",
                   unsigned(st.st_uid), unsigned(me));
      else if (st.st_nlink != 1)
        e = refuse(why, EPERM, "it is a regular file with %lu names (hard links); cxlpool writes only a file with one",
                   static_cast<unsigned long>(st.st_nlink));
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
      if (st.st_uid != me && st.st_uid != 0)
        e = refuse(why, EPERM, "it is a %s owned by uid %u, neither this user (uid %u) nor root", kind_of(st.st_mode),
                   unsigned(st.st_uid), unsigned(me));
    } else {
      e = refuse(why, S_ISDIR(st.st_mode) ? EISDIR : EPERM, "it is a %s, not a file to write", kind_of(st.st_mode));
    }
    if (e) {
      errno = e;
      return -1;
    }
    const int fd = reopen_resolved(r, flags);
    if (fd < 0) {
      const int err = errno;
      if (err == ENXIO && S_ISFIFO(st.st_mode))
        refuse(why, err, "it is a FIFO that nobody reads");
      else
        refuse(why, err, "cannot open it: %s", std::strerror(err));
      errno = err;
      return -1;
    }
    if (mode == OutputMode::kTruncate && S_ISREG(st.st_mode) && ::ftruncate(fd, 0) != 0) {
      const int err = errno;
      ::close(fd);
      errno = refuse(why, err, "ftruncate: %s", std::strerror(err));
      return -1;
    }
    return fd;
  }
  errno = refuse(why, EAGAIN, "it was created and removed again while being opened");
  return -1;
}

int open_user_input(const char* path, PathWhy* why) noexcept {
  ResolvedPath r;
  if (int e = resolve_path(path, &r, why)) {
    errno = e;
    return -1;
  }
  if (r.leaf < 0) {
    errno = refuse(why, ENOENT, "%s", std::strerror(ENOENT));
    return -1;
  }
  struct stat st {};
  if (::fstat(r.leaf, &st) != 0) {
    errno = refuse(why, errno, "fstat: %s", std::strerror(errno));
    return -1;
  }
  const uid_t me = ::geteuid();
  int e = 0;
  if (!S_ISREG(st.st_mode))
    e = refuse(why, S_ISDIR(st.st_mode) ? EISDIR : EINVAL, "it is a %s, not a regular file", kind_of(st.st_mode));
  else if (st.st_uid != me && st.st_uid != 0)
    e = refuse(why, EPERM,
               "it is owned by uid %u, neither this user (uid %u) nor root (another user may have put it there; "
               "use a copy of your own)",
               unsigned(st.st_uid), unsigned(me));
  if (e) {
    errno = e;
    return -1;
  }
  const int fd = reopen_resolved(r, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    refuse(why, err, "cannot open it: %s", std::strerror(err));
    errno = err;
  }
  return fd;
}

}  // namespace cxlpool::os

// SPDX-License-Identifier: MIT
// Claim locks beside named devices (claim_lock.hpp): a flock(2) on dir/name, checked to be
// this user's regular file before and after it is opened, and to still be the file at that
// name once locked (a holder that removed it meanwhile leaves the lock on a nameless file).
#include "os/claim_lock.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "os/prim.hpp"
#include "os/safe_path.hpp"

namespace cxlpool::os {

namespace {

// What is wrong with st as a claim file of this user; nullptr when nothing.
const char* not_ours(const struct stat& st) noexcept {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "owned by another user";
  if (st.st_nlink != 1) return "a file with more than one name";
  return nullptr;
}

// The pid holding a flock on (dev, ino), from /proc/locks (pids as this namespace sees them):
// -1 when not found or unreadable.
long flock_holder(dev_t dev, ino_t ino) noexcept {
  FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return -1;
  long found = -1;
  char line[256];
  while (found < 0 && std::fgets(line, sizeof line, f)) {
    char kind[16] = "";
    long pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long long inode = 0;
    // "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; waiters carry "->" and are skipped.
    if (std::strstr(line, "->")) continue;
    if (std::sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%llu", kind, &pid, &maj, &min, &inode) == 5 &&
        std::strcmp(kind, "FLOCK") == 0 && maj == major(dev) && min == minor(dev) && inode == ino)
      found = pid;
  }
  std::fclose(f);
  return found;
}

// Removes this user's lock files in dfd whose names start with prefix and that nobody holds
// (their holders were killed): each is locked first, and removed only while still the file at
// its name. At most 64 per call.
void sweep_stale(int dfd, const std::string& prefix, const std::string& keep) noexcept {
  const int rd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rd < 0) return;
  DIR* d = fdopendir(rd);
  if (!d) {
    ::close(rd);
    return;
  }
  int removed = 0;
  while (dirent* e = readdir(d)) {
    if (removed >= 64) break;
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0 || keep == e->d_name) continue;
    struct stat st {};
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || not_ours(st)) continue;
    const int fd = openat(dfd, e->d_name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) continue;
    struct stat mine {
    }, now{};
    if (fstat(fd, &mine) == 0 && !not_ours(mine) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        fstatat(dfd, e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == mine.st_dev &&
        now.st_ino == mine.st_ino && unlinkat(dfd, e->d_name, 0) == 0)
      ++removed;
    ::close(fd);
  }
  closedir(d);
}

bool same_file(int fd, uint64_t dev, uint64_t ino) noexcept {
  struct stat st {};
  return fd >= 0 && fstat(fd, &st) == 0 && uint64_t(st.st_dev) == dev && uint64_t(st.st_ino) == ino;
}

// The claims held now, for remove_claim_lock_files (a process opens a handful of devices).
constexpr int kMaxHeld = 64;
std::mutex g_held_mu;
ClaimLock* g_held[kMaxHeld] = {};

void note_held(ClaimLock* lock, bool held) noexcept {
  std::lock_guard<std::mutex> guard(g_held_mu);
  for (ClaimLock*& slot : g_held)
    if (held ? slot == nullptr : slot == lock) {
      slot = held ? lock : nullptr;
      return;
    }
}

// Removes the lock's file if it still is the one this process locked (fd and directory still
// ours, the name still that file).
void unlink_if_ours(const ClaimLock& lock) noexcept {
  if (lock.owner_pid != prim::process_id() || !same_file(lock.fd, lock.fd_dev, lock.fd_ino) ||
      !same_file(lock.dir, lock.dir_dev, lock.dir_ino))
    return;
  struct stat now {};
  if (fstatat(lock.dir, lock.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && uint64_t(now.st_dev) == lock.fd_dev &&
      uint64_t(now.st_ino) == lock.fd_ino)
    unlinkat(lock.dir, lock.name.c_str(), 0);
}

}  // namespace

int take_claim_lock(const std::string& dir, const std::string& name, const std::string& prefix, ClaimLock* out,
                    long* holder_pid, std::string* why) noexcept {
  try {
    *holder_pid = -1;
    ResolvedPath r;
    PathWhy pw;
    if (int e = resolve_path(dir.c_str(), &r, &pw)) {
      *why = pw.text;
      return e;
    }
    if (r.leaf < 0) {
      *why = dir + " does not exist";
      return ENOENT;
    }
    const int dfd = r.leaf;
    sweep_stale(dfd, prefix, name);
    for (int attempt = 0; attempt < 8; ++attempt) {
      // Looked at without opening it: a FIFO or device there is never opened.
      struct stat st {};
      if (fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (const char* bad = not_ours(st)) {
          *why = dir + "/" + name + " is " + bad;
          return EPERM;
        }
      } else if (errno != ENOENT) {
        const int e = errno;
        *why = dir + "/" + name + ": " + std::strerror(e);
        return e;
      }
      int fd = openat(dfd, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0600);
      if (fd < 0) {
        const int e = errno;
        *why = dir + "/" + name + ": " + std::strerror(e);
        return e == ELOOP ? EPERM : e;
      }
      struct stat mine {};
      const char* bad = fstat(fd, &mine) != 0 ? "not readable" : not_ours(mine);
      if (bad) {
        ::close(fd);
        *why = dir + "/" + name + " is " + bad;
        return EPERM;
      }
      if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        ::close(fd);
        if (e == EWOULDBLOCK) *holder_pid = flock_holder(mine.st_dev, mine.st_ino);
        *why = dir + "/" + name + ": flock: " + std::strerror(e);
        return e;
      }
      // Still the file at that name: a holder may have removed it between our open and lock.
      struct stat now {};
      if (fstatat(dfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_dev != mine.st_dev ||
          now.st_ino != mine.st_ino) {
        ::close(fd);
        continue;
      }
      fchmod(fd, 0600);  // whatever the umask made of it
      out->fd = prim::move_fd_high(fd);
      out->dir = prim::move_fd_high(r.leaf);
      r.leaf = -1;  // kept: the file is removed from the directory it was checked in
      struct stat dst {};
      fstat(out->dir, &dst);
      out->fd_dev = mine.st_dev;
      out->fd_ino = mine.st_ino;
      out->dir_dev = dst.st_dev;
      out->dir_ino = dst.st_ino;
      out->name = name;
      out->owner_pid = prim::process_id();
      note_held(out, true);
      return 0;
    }
    *why = dir + "/" + name + " was replaced every time it was locked";
    return EAGAIN;
  } catch (...) {
    *why = "out of memory";
    return ENOMEM;
  }
}

void release_claim_lock(ClaimLock* lock) noexcept {
  note_held(lock, false);
  // Numbers the program closed (and may have reused) are left alone: its lock went with the
  // close, and the file is a killed holder's for the next claimant to remove.
  const bool fd_ours = same_file(lock->fd, lock->fd_dev, lock->fd_ino);
  const bool dir_ours = same_file(lock->dir, lock->dir_dev, lock->dir_ino);
  unlink_if_ours(*lock);
  if (fd_ours) ::close(lock->fd);
  if (dir_ours) ::close(lock->dir);
  lock->fd = lock->dir = -1;
}

void remove_claim_lock_files() noexcept {
  // A fork child may have been made while another thread held the table's lock: never wait at
  // exit; the files are then the next claimant's to remove.
  std::unique_lock<std::mutex> guard(g_held_mu, std::try_to_lock);
  if (!guard.owns_lock()) return;
  for (ClaimLock* lock : g_held)
    if (lock) unlink_if_ours(*lock);
}

ClaimLock::~ClaimLock() { release_claim_lock(this); }

}  // namespace cxlpool::os

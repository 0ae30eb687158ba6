// SPDX-License-Identifier: MIT
// Claim locks beside named devices (claim_lock.hpp). A name is looked at through an O_PATH
// descriptor and opened only through that descriptor (/proc/self/fd), so what is opened is
// the file that was checked; once locked it must still be the file at its name (a holder or a
// sweeper may have removed it meanwhile: then again). The holder writes who it is into the
// file, which is how a later claimant tells a dead holder's file (removed) from a live one.
#include "os/claim_lock.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/safe_path.hpp"

namespace cxlpool::os {

namespace {

constexpr const char* kPrefix = ".cxlpool-claim";  // both name forms start so

// What is wrong with st as a claim file of this user; nullptr when nothing.
const char* not_ours(const struct stat& st) noexcept {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "owned by another user";
  if (st.st_nlink > 1) return "a file with more than one name";
  return nullptr;
}

bool same_file(int fd, uint64_t dev, uint64_t ino) noexcept {
  struct stat st {};
  return fd >= 0 && fstat(fd, &st) == 0 && uint64_t(st.st_dev) == dev && uint64_t(st.st_ino) == ino;
}

// The file at dfd/name when it is this user's regular file with one name, opened read-write
// through an O_PATH look at it: -1 with errno (ENOENT: gone; EPERM: not ours, *bad says why).
int open_ours(int dfd, const char* name, const char** bad) noexcept {
  const int pfd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (pfd < 0) return -1;
  struct stat st {};
  *bad = fstat(pfd, &st) != 0 ? "unreadable" : not_ours(st);
  if (*bad) {
    ::close(pfd);
    errno = EPERM;
    return -1;
  }
  char via[64];
  std::snprintf(via, sizeof via, "/proc/self/fd/%d", pfd);
  int fd = ::open(via, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  const int err = errno;
  ::close(pfd);
  if (fd >= 0 && !same_file(fd, uint64_t(st.st_dev), uint64_t(st.st_ino))) {
    ::close(fd);
    fd = -1;
    errno = ESTALE;
    return -1;
  }
  errno = err;
  return fd;
}

// Still the file at dfd/name, with one name.
bool still_named(int dfd, const char* name, int fd) noexcept {
  struct stat mine {
  }, now{};
  return fstat(fd, &mine) == 0 && mine.st_nlink == 1 && fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
         now.st_dev == mine.st_dev && now.st_ino == mine.st_ino;
}

// Who wrote the file: "pid start_ticks pidns boot\n".
struct Writer {
  bool known = false;
  long pid = 0;
  uint64_t start = 0, pidns = 0, boot = 0;
};
Writer writer_of(int fd) noexcept {
  char buf[128] = "";
  Writer w;
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return w;
  buf[n] = 0;
  w.known =
      std::sscanf(buf, "%ld %" SCNu64 " %" SCNu64 " %" SCNu64, &w.pid, &w.start, &w.pidns, &w.boot) == 4 && w.pid > 0;
  return w;
}

// The writer is known to be dead: this boot and pid namespace, and its pid is gone or another
// process now. Anything else (another namespace, /proc hiding it) is taken as alive.
bool dead(const Writer& w) noexcept {
  if (!w.known) return false;
  if (w.boot != boot_id_hash()) return w.boot != 0;  // a file of an earlier boot
  if (w.pidns != pid_namespace_id()) return false;
  const uint64_t now = process_start_ticks(int(w.pid));
  return now != kStartUnknown && now != w.start;
}

void write_self(int fd) noexcept {
  char buf[128];
  const int n = std::snprintf(buf, sizeof buf, "%d %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", prim::process_id(),
                              process_start_ticks(prim::process_id()), pid_namespace_id(), boot_id_hash());
  if (ftruncate(fd, 0) == 0 && n > 0) (void)!pwrite(fd, buf, size_t(n), 0);
}

// The pid holding a flock on (dev, ino), from /proc/locks (pids as this namespace sees them;
// 0 for one it does not see): -1 when not found or unreadable.
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

// Removes lock files in dfd whose writers are known to be dead (killed holders), each locked
// first and removed only while still the file at its name. At most 256 per call.
void sweep_dead(int dfd, const std::string& keep) noexcept {
  const int rd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rd < 0) return;
  DIR* d = fdopendir(rd);
  if (!d) {
    ::close(rd);
    return;
  }
  int removed = 0;
  while (dirent* e = readdir(d)) {
    if (removed >= 256) break;
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0 || keep == e->d_name) continue;
    const char* bad = nullptr;
    const int fd = open_ours(dfd, e->d_name, &bad);
    if (fd < 0) continue;
    // Read before and after the lock: a taker writes only while it holds the lock.
    if (dead(writer_of(fd)) && flock(fd, LOCK_EX | LOCK_NB) == 0 && dead(writer_of(fd)) &&
        still_named(dfd, e->d_name, fd) && unlinkat(dfd, e->d_name, 0) == 0)
      ++removed;
    ::close(fd);
  }
  closedir(d);
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

bool dir_ours(const ClaimLock& lock) noexcept {
  const int flags = lock.dir >= 0 ? fcntl(lock.dir, F_GETFL) : -1;
  return flags >= 0 && (flags & O_PATH) && same_file(lock.dir, lock.dir_dev, lock.dir_ino);
}

// Removes the lock's file if it still is the one this process locked (descriptors still
// ours, the name still that file).
void unlink_if_ours(const ClaimLock& lock) noexcept {
  if (lock.owner_pid != prim::process_id() || !same_file(lock.fd, lock.fd_dev, lock.fd_ino) || !dir_ours(lock)) return;
  struct stat now {};
  if (fstatat(lock.dir, lock.name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && uint64_t(now.st_dev) == lock.fd_dev &&
      uint64_t(now.st_ino) == lock.fd_ino)
    unlinkat(lock.dir, lock.name.c_str(), 0);
}

}  // namespace

std::string claim_lock_name(const std::string& base) {
  if (base.size() <= 200) return std::string(kPrefix) + "." + base;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : base) h = (h ^ c) * 1099511628211ull;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-h.%016" PRIx64, kPrefix, h);
  return buf;
}

int take_claim_lock(const std::string& dir, const std::string& name, ClaimLock* out, ClaimHolder* holder,
                    std::string* why) noexcept {
  try {
    *holder = ClaimHolder{};
    ResolvedPath r;
    PathWhy pw;
    if (int e = resolve_path(dir.c_str(), &r, &pw)) {
      *why = pw.text;
      holder->dir_unusable = true;
      return e;
    }
    if (r.leaf < 0) {
      *why = dir + " does not exist";
      holder->dir_unusable = true;
      return ENOENT;
    }
    const int dfd = r.leaf;
    const std::string where = dir + "/" + name;
    sweep_dead(dfd, name);
    // Each round ends in a claim, a refusal, or a file that went away meanwhile (again). A dead
    // holder's file locked by a sweeper is gone a moment later: rounds wait 1 ms for that.
    for (int round = 0; round < 2000; ++round) {
      // Made exclusively when the name is free: then nothing else is ever opened.
      int fd = openat(dfd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
      if (fd < 0 && errno == EEXIST) {
        const char* bad = nullptr;
        fd = open_ours(dfd, name.c_str(), &bad);
        if (fd < 0 && (errno == ENOENT || errno == ESTALE)) continue;
        if (fd < 0 && errno == EPERM) {
          *why = where + " is " + bad;
          return EPERM;
        }
      }
      if (fd < 0) {
        const int e = errno;
        *why = where + ": " + std::strerror(e);
        return e;
      }
      if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (e != EWOULDBLOCK) {
          ::close(fd);
          *why = where + ": flock: " + std::strerror(e);
          return e;
        }
        const Writer w = writer_of(fd);
        struct stat st {};
        fstat(fd, &st);
        ::close(fd);
        if (dead(w) && round + 1 < 2000) {  // a sweeper (or a taker about to write) has a dead holder's file
          prim::sleep_ms(1);
          continue;
        }
        if (w.known && w.pidns == pid_namespace_id()) {
          holder->pid = w.pid;
        } else {
          holder->pid = flock_holder(st.st_dev, st.st_ino);
          holder->other_pidns = w.known && w.pidns != pid_namespace_id();
          if (holder->other_pidns) holder->pid = w.pid;
        }
        *why = where + " is locked";
        return EWOULDBLOCK;
      }
      if (!still_named(dfd, name.c_str(), fd)) {  // removed (or linked twice) before our lock
        ::close(fd);
        continue;
      }
      // A file of this user that holds something else than a claim (a holder writes its line
      // while it holds the lock, so only a holder killed before writing leaves it empty) is not
      // ours to overwrite or to remove.
      struct stat now {};
      if (fstat(fd, &now) == 0 && now.st_size > 0 && !writer_of(fd).known) {
        ::close(fd);
        *why = where + " exists and is not a cxlpool claim lock (it holds other data); it was left untouched";
        return EEXIST;
      }
      fchmod(fd, 0600);  // whatever the umask made of it
      write_self(fd);
      struct stat mine {};
      fstat(fd, &mine);
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
    *why = where + " was replaced or removed every time it was locked";
    return EAGAIN;
  } catch (...) {
    *why = "out of memory";
    return ENOMEM;
  }
}

void release_claim_lock(ClaimLock* lock) noexcept {
  note_held(lock, false);
  // Numbers the program closed (and may have reused) are left alone: its lock went with the
  // close, and the file is a dead holder's for a later claimant to remove.
  const bool fd_ours = same_file(lock->fd, lock->fd_dev, lock->fd_ino);
  const bool dir_mine = dir_ours(*lock);
  unlink_if_ours(*lock);
  if (fd_ours) ::close(lock->fd);
  if (dir_mine) ::close(lock->dir);
  lock->fd = lock->dir = -1;
}

void remove_claim_lock_files() noexcept {
  // A fork child may have been made while another thread held the table's lock: never wait at
  // exit; the files are then a later claimant's to remove.
  std::unique_lock<std::mutex> guard(g_held_mu, std::try_to_lock);
  if (!guard.owns_lock()) return;
  for (ClaimLock* lock : g_held)
    if (lock) unlink_if_ours(*lock);
}

ClaimLock::~ClaimLock() { release_claim_lock(this); }

}  // namespace cxlpool::os

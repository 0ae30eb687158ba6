// SPDX-License-Identifier: MIT
// The identity and life of processes, for judging shared-pool participants: the boot id and
// pid namespace that say where a process number means something, start times that tell a live
// process from a reused id, the state of a thread (running, stopped, gone), and the search
// that finds a process of a descendant pid namespace (a container on this host) among ours.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "os/os.hpp"
#include "os/prim.hpp"

namespace cxlpool::os {

namespace {
// Reads at most len-1 bytes of a small /proc file with plain syscalls (no allocation).
ssize_t read_small(const char* path, char* buf, size_t len) noexcept {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = ::read(fd, buf, len - 1);
  const int err = errno;
  ::close(fd);
  errno = err;
  if (n >= 0) buf[n] = 0;
  return n;
}
}  // namespace

uint64_t boot_id_hash() noexcept {
  char buf[64];
  if (read_small("/proc/sys/kernel/random/boot_id", buf, sizeof buf) <= 0) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = buf; *c && *c != '\n'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h;
}

uint64_t pid_namespace_id() noexcept {
  struct stat st {};
  if (::stat("/proc/thread-self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

uint64_t process_start_ticks(int pid) noexcept {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  ssize_t n = read_small(path, buf, sizeof buf);
  // Only the kernel's "no such process" means gone: /proc may hide other users' processes
  // (hidepid=2 gives ENOENT for them), and EMFILE or EACCES say nothing either.
  const auto gone = [pid] { return ::kill(pid, 0) != 0 && errno == ESRCH; };
  if (n <= 0) return gone() ? 0 : kStartUnknown;
  const char* p = strrchr(buf, ')');  // the command name may contain spaces and parentheses
  if (!p || p[1] != ' ') return kStartUnknown;
  // A zombie thread-group leader may still have live threads (the main thread called
  // pthread_exit): the heartbeat decides. A reaped process is ESRCH above.
  if (p[2] == 'Z' || p[2] == 'X') return gone() ? 0 : kStartUnknown;
  int field = 2;  // p points at the end of field 2
  for (++p; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return field == 22 ? strtoull(p, nullptr, 10) : 0;
}

int thread_id() noexcept { return static_cast<int>(::syscall(SYS_gettid)); }

namespace {
// State letter and start time (field 22) of /proc/PID/task/TID/stat; false when unreadable.
bool read_task_stat(int pid, int tid, char* state, uint64_t* start) noexcept {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
  if (read_small(path, buf, sizeof buf) <= 0) return false;
  const char* p = strrchr(buf, ')');  // the command name may contain spaces and parentheses
  if (!p || p[1] != ' ' || p[2] == 0) return false;
  *state = p[2];
  int field = 2;  // p points at the end of field 2
  for (++p; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  if (field != 22) return false;
  *start = strtoull(p, nullptr, 10);
  return true;
}
}  // namespace

TaskLife task_life(int pid, int tid, uint64_t start_ticks) noexcept {
  if (pid <= 0 || tid <= 0) return TaskLife::kUnknown;
  char state = 0;
  uint64_t start = 0;
  if (!read_task_stat(pid, tid, &state, &start)) {
    // Only the kernel's "no such thread" means gone: /proc may hide other users' processes
    // (hidepid) or the observer may be out of descriptors. tgkill needs no descriptor and
    // answers ESRCH for a thread that is not there whatever the permissions.
    if (::syscall(SYS_tgkill, pid, tid, 0) != 0 && errno == ESRCH) return TaskLife::kGone;
    return TaskLife::kExists;
  }
  if (start_ticks != 0 && start != start_ticks) return TaskLife::kGone;  // the id was reused
  switch (state) {
    case 'Z':
    case 'X':
      // A thread other than the leader is reaped as it exits; a zombie leader may still have
      // running threads (it called pthread_exit): asked about the leader, nothing follows.
      if (tid == pid) return ::kill(pid, 0) != 0 && errno == ESRCH ? TaskLife::kGone : TaskLife::kUnknown;
      return TaskLife::kGone;
    case 'T':
    case 't':
      return TaskLife::kStopped;
    default:
      return TaskLife::kRunning;
  }
}

uint64_t task_start_ticks(int pid, int tid) noexcept {
  char state = 0;
  uint64_t start = 0;
  return read_task_stat(pid, tid, &state, &start) ? start : 0;
}

uint64_t self_task_start_ticks() noexcept {
  // /proc/thread-self names the caller in the namespace of the /proc mounted here, whatever
  // pid namespace the caller is in: its own number may mean another process there.
  char buf[1024];
  if (read_small("/proc/thread-self/stat", buf, sizeof buf) <= 0) return 0;
  const char* p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return 0;
  int field = 2;
  for (++p; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return field == 22 ? strtoull(p, nullptr, 10) : 0;
}

namespace {
// The last number of the NSpid line of a /proc status file (the id in the innermost pid
// namespace of the task) and how many namespaces deep it is seen from this /proc; false when
// the file cannot be read (the task is gone, or /proc hides it).
bool read_nspid(const char* path, int* depth, int* last) noexcept {
  char buf[4096];
  if (read_small(path, buf, sizeof buf) <= 0) return false;
  const char* line = strstr(buf, "\nNSpid:");
  if (!line) {  // a kernel older than 4.1
    errno = ENOSYS;
    return false;
  }
  const char* p = line + 7;
  *depth = 0;
  while (*p && *p != '\n') {
    char* end = nullptr;
    const long v = strtol(p, &end, 10);
    if (end == p) break;
    *last = static_cast<int>(v);
    ++*depth;
    p = end;
  }
  if (*depth == 0) errno = ENOSYS;
  return *depth > 0;
}

// The inode of /proc/<pid>/ns/pid: 0 when it cannot be read (gone, or not ours to inspect:
// the link needs ptrace-read access to the process).
uint64_t ns_inode_of(int pid) noexcept {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/pid", pid);
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// Whether /proc hides other users' processes from the listing (hidepid=1/2/invisible/
// noaccess): then a process that is not listed may still exist.
bool proc_hides_pids() noexcept {
  FILE* f = fopen("/proc/thread-self/mounts", "re");
  if (!f) return true;
  char line[1024];
  bool hides = false;
  while (fgets(line, sizeof line, f)) {
    char dev[256], dir[256], type[64], opts[512];
    if (sscanf(line, "%255s %255s %63s %511s", dev, dir, type, opts) != 4) continue;
    if (strcmp(dir, "/proc") != 0 || strcmp(type, "proc") != 0) continue;
    const char* h = strstr(opts, "hidepid=");
    hides =
        h && !(h[8] == '0' && (h[9] == ',' || h[9] == 0)) && strncmp(h + 8, "off", 3) != 0;  // the last mount counts
  }
  fclose(f);
  return hides;
}

// Thread ns_tid (as numbered in its own namespace) of the process listed here as pid.
NsFind find_thread(int pid, int ns_tid, int* tid) noexcept {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* dir = opendir(path);
  if (!dir) return NsFind::kUnreachable;
  NsFind found = NsFind::kGone;  // the task list of a process we can see is complete
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long t = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0) continue;
    char status[96];
    snprintf(status, sizeof status, "/proc/%d/task/%ld/status", pid, t);
    int depth = 0, last = 0;
    if (!read_nspid(status, &depth, &last)) {
      if (errno != ENOENT && errno != ESRCH) found = NsFind::kUnreachable;  // not read: perhaps it
      continue;
    }
    if (last == ns_tid) {
      *tid = static_cast<int>(t);
      found = NsFind::kFound;
      break;
    }
  }
  closedir(dir);
  return found;
}

struct NsCacheEntry {
  uint64_t pidns = 0;
  int ns_pid = 0, ns_tid = 0, pid = 0, tid = 0;
  uint64_t start = 0;  // the thread's start time, when it was found by it (its ns/pid unreadable)
  NsFind result = NsFind::kUnreachable;
  uint64_t until_ns = 0;  // for kUnreachable: a search is not repeated before then
};
constexpr int kNsCacheSize = 8;
constexpr uint64_t kUnreachableRetryNs = 2000000000ull;
NsCacheEntry g_ns_cache[kNsCacheSize];
unsigned g_ns_next = 0;
// Namespaces seen below ours, each held open: a namespace's inode number is reused once it is
// freed, and holding it keeps the number its own, so "not seen any more" means "ended".
struct HeldNs {
  uint64_t ino = 0;
  int fd = -1;
};
HeldNs g_ns_below[kNsCacheSize];
unsigned g_ns_below_next = 0;
// A flag, not a mutex: a fork while another thread holds it must not leave a child stuck; a
// caller that finds it taken searches without the cache.
std::atomic<bool> g_ns_busy{false};

// 1: the cached thread is still there; 0: it is not (gone, or its number means another thread
// now); -1: nothing can be read now (out of descriptors).
int still_there(const NsCacheEntry& c) noexcept {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%d/status", c.pid, c.tid);
  int depth = 0, last = 0;
  if (!read_nspid(path, &depth, &last)) return errno == ENOENT || errno == ESRCH ? 0 : -1;
  if (depth < 2 || last != c.ns_tid) return 0;
  if (c.start != 0) return task_start_ticks(c.pid, c.tid) == c.start ? 1 : 0;
  return ns_inode_of(c.pid) == c.pidns ? 1 : 0;
}

void hold_namespace(uint64_t ino, int pid) noexcept {
  for (const HeldNs& h : g_ns_below)
    if (h.ino == ino) return;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/pid", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ino) {
    ::close(fd);
    return;
  }
  HeldNs& slot = g_ns_below[g_ns_below_next++ % kNsCacheSize];
  if (slot.fd >= 0) ::close(slot.fd);
  slot = HeldNs{ino, fd};
}

// ns_pid/ns_tid among the processes whose namespace cannot be inspected (not dumpable, or
// another user's): the thread whose start time is start_ticks, the participant's own record.
NsFind find_by_start(const int* pids, int n, int ns_tid, uint64_t start_ticks, int* pid, int* tid) noexcept {
  if (start_ticks == 0) return NsFind::kUnreachable;
  for (int i = 0; i < n; ++i) {
    int t = 0;
    if (find_thread(pids[i], ns_tid, &t) == NsFind::kFound && task_start_ticks(pids[i], t) == start_ticks) {
      *pid = pids[i];
      *tid = t;
      return NsFind::kFound;
    }
  }
  return NsFind::kUnreachable;
}

// known_below: the namespace was seen below ours before and is held open, so if it cannot be
// seen now, every process of it has ended. *seen_pid: a process of it seen now (0: none).
// *lasting: an answer that holds until the namespace changes (worth remembering), not one
// that a process caught as it exits made uncertain.
NsFind search(uint64_t pidns, int ns_pid, int ns_tid, uint64_t start_ticks, bool known_below, int* seen_pid,
              bool* lasting, int* pid, int* tid, uint64_t* found_start) noexcept {
  *lasting = false;
  *seen_pid = 0;
  if (!proc_is_ours()) return NsFind::kUnreachable;  // its numbers go to kill and tgkill
  DIR* dir = opendir("/proc");
  if (!dir) return NsFind::kUnreachable;
  bool unsure = false, passing = false;
  int candidate = 0, uninspectable[4], n_uninspectable = 0;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long p = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || p <= 0) continue;
    char status[64];
    snprintf(status, sizeof status, "/proc/%ld/status", p);
    int depth = 0, last = 0;
    if (!read_nspid(status, &depth, &last)) {
      unsure |= errno != ENOENT && errno != ESRCH;  // gone meanwhile is fine; hidden is not
      continue;
    }
    if (depth < 2) continue;  // a process of our own namespace
    const uint64_t ino = ns_inode_of(static_cast<int>(p));
    const int ns_err = errno;
    if (ino == pidns && *seen_pid == 0) *seen_pid = static_cast<int>(p);
    if (last != ns_pid) continue;
    if (ino == 0) {  // perhaps it, but its namespace cannot be read: not ours to inspect, or exiting
      unsure = true;
      passing |= ns_err != EACCES && ns_err != EPERM;
      if (n_uninspectable < 4) uninspectable[n_uninspectable++] = static_cast<int>(p);
    } else if (ino == pidns) {
      candidate = static_cast<int>(p);
      break;
    }
  }
  closedir(dir);
  *lasting = !passing;
  if (candidate != 0) {
    const NsFind t = find_thread(candidate, ns_tid, tid);
    if (t == NsFind::kFound) *pid = candidate;
    return t;
  }
  if (find_by_start(uninspectable, n_uninspectable, ns_tid, start_ticks, pid, tid) == NsFind::kFound) {
    *found_start = start_ticks;
    return NsFind::kFound;
  }
  return (*seen_pid != 0 || known_below) && !unsure && !proc_hides_pids() ? NsFind::kGone : NsFind::kUnreachable;
}
}  // namespace

bool proc_is_ours() noexcept {
  char self[32];
  const ssize_t n = ::readlink("/proc/self", self, sizeof self - 1);
  if (n <= 0) return false;
  self[n] = 0;
  return strtol(self, nullptr, 10) == prim::process_id();
}

NsFind find_in_pid_namespace(uint64_t pidns, int ns_pid, int ns_tid, uint64_t start_ticks, int* pid,
                             int* tid) noexcept {
  if (pidns == 0 || ns_pid <= 0 || ns_tid <= 0) return NsFind::kUnreachable;
  const uint64_t now = monotonic_ns();
  const bool cached = !g_ns_busy.exchange(true, std::memory_order_acquire);
  bool known_below = false;
  if (cached) {
    for (const HeldNs& h : g_ns_below) known_below |= h.ino == pidns && h.fd >= 0;
    for (NsCacheEntry& c : g_ns_cache) {
      if (c.pidns != pidns || c.ns_pid != ns_pid || c.ns_tid != ns_tid) continue;
      // Out of descriptors, the thread found before is still the one to ask about: the caller
      // falls back to tgkill with its ids, as for a process of our own namespace.
      const int there = c.result == NsFind::kFound ? still_there(c) : 0;
      if (there != 0) {
        *pid = c.pid;
        *tid = c.tid;
        g_ns_busy.store(false, std::memory_order_release);
        return NsFind::kFound;
      }
      if (c.result == NsFind::kUnreachable && now < c.until_ns) {
        g_ns_busy.store(false, std::memory_order_release);
        return NsFind::kUnreachable;
      }
      c = NsCacheEntry{};  // stale: search again
    }
  }
  int p = 0, t = 0, seen_pid = 0;
  bool lasting = false;
  uint64_t found_start = 0;
  const NsFind r = search(pidns, ns_pid, ns_tid, start_ticks, known_below, &seen_pid, &lasting, &p, &t, &found_start);
  if (r == NsFind::kFound) {
    *pid = p;
    *tid = t;
  }
  if (cached) {
    if (seen_pid != 0) hold_namespace(pidns, seen_pid);
    if (r == NsFind::kFound || (r == NsFind::kUnreachable && lasting))
      g_ns_cache[g_ns_next++ % kNsCacheSize] =
          NsCacheEntry{pidns, ns_pid, ns_tid, p, t, found_start, r, now + kUnreachableRetryNs};
    g_ns_busy.store(false, std::memory_order_release);
  }
  return r;
}

}  // namespace cxlpool::os

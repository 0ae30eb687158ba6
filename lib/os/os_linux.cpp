// SPDX-License-Identifier: MIT
// Linux implementation of the cold half of the OS seam (os.hpp): memfd, O_TMPFILE, devdax,
// file checks, metadata mappings, move_pages queries. Hot paths use prim_linux.cpp.
#include <fcntl.h>
#include <numaif.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/safe_path.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MPOL_WEIGHTED_INTERLEAVE
#define MPOL_WEIGHTED_INTERLEAVE 6
#endif

namespace cxlpool::os {
using detail::fail;
using detail::fail_os;

namespace {
std::string hex(const void* p) {
  char buf[32];
  snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
std::string range(const void* p, size_t n) { return hex(p) + ", " + std::to_string(n); }
}  // namespace

size_t page_size() {
  static const size_t ps = size_t(sysconf(_SC_PAGESIZE));
  return ps;
}

uint64_t coarse_now_ns() noexcept {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

uint64_t total_ram_bytes() {
  struct sysinfo si {};
  if (sysinfo(&si) != 0) return 0;
  return uint64_t(si.totalram) * si.mem_unit;
}

const KernelCaps& kernel_caps() {
  static const KernelCaps caps = [] {
    KernelCaps c;
    size_t ps = page_size();
    void* scratch = mmap(nullptr, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch != MAP_FAILED) {
      c.madv_populate_write = madvise(scratch, ps, MADV_POPULATE_WRITE) == 0;
      unsigned long mask = 1;  // node 0 always exists
      c.mpol_weighted_interleave = syscall(SYS_mbind, scratch, ps, MPOL_WEIGHTED_INTERLEAVE, &mask, 64UL, 0U) == 0;
      munmap(scratch, ps);
    }
    int fd = int(syscall(SYS_memfd_create, "cxlpool-probe", MFD_CLOEXEC));
    c.memfd = fd >= 0;
    if (fd >= 0) close(fd);
    // The kernel accepts node masks up to MAX_NUMNODES; find the possible-node maximum.
    c.max_numa_node = 0;
    int pfd = open("/sys/devices/system/node/possible", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (pfd >= 0) {
      char buf[256] = "";
      ssize_t n = read(pfd, buf, sizeof buf - 1);
      close(pfd);
      if (n > 0) {
        buf[n] = 0;
        const char* last = strrchr(buf, '-');
        const char* comma = strrchr(buf, ',');
        if (comma && (!last || comma > last)) last = comma;
        c.max_numa_node = atoi(last ? last + 1 : buf);
      }
    }
    return c;
  }();
  return caps;
}

void unmap(void* addr, size_t size) noexcept { munmap(addr, size); }

const void* try_map_readonly(int fd, size_t size) noexcept {
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void* try_map_metadata(size_t size, bool noreserve) noexcept {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void* map_metadata(size_t size, bool noreserve) {
  void* p = try_map_metadata(size, noreserve);
  if (!p) fail_os("mmap(metadata, " + std::to_string(size) + " bytes)", errno);
  return p;
}

void advise_hugepages(void* addr, size_t size) noexcept { madvise(addr, size, MADV_HUGEPAGE); }

void query_page_nodes(const void* addr, size_t pages, int* out) {
  std::vector<void*> ptrs(pages);
  auto base = reinterpret_cast<uintptr_t>(addr);
  for (size_t i = 0; i < pages; ++i) ptrs[i] = reinterpret_cast<void*>(base + i * page_size());
  if (move_pages(0, pages, ptrs.data(), nullptr, out, 0) != 0)
    fail_os("move_pages(status query, " + range(addr, pages) + " pages)", errno);
}

int memfd_create(const std::string& name) {
  int fd = int(syscall(SYS_memfd_create, name.c_str(), MFD_CLOEXEC));
  if (fd < 0) fail_os("memfd_create(\"" + name + "\")", errno);
  return fd;
}

uint64_t max_map_count() noexcept {
  // Plain system calls, no stdio: the stats publisher asks under its write lock, which fork
  // handlers take after the interposer's init lock; a malloc here during the interposer's
  // initialisation would wait for that lock and deadlock a forking thread.
  uint64_t n = 65530;
  const int fd = ::open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[32];
    const ssize_t k = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (k > 0) {
      buf[k] = 0;
      const unsigned long long v = std::strtoull(buf, nullptr, 10);
      if (v > 0) n = v;
    }
  }
  return n;
}

uint64_t process_mappings() noexcept {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t lines = 0;
  char buf[4096];
  for (ssize_t k; (k = ::read(fd, buf, sizeof buf)) != 0;) {
    if (k < 0) {
      if (errno == EINTR) continue;
      lines = 0;
      break;
    }
    for (ssize_t i = 0; i < k; ++i) lines += buf[i] == '\n';
  }
  ::close(fd);
  return lines;
}

void* create_sealed_page(const std::string& name, size_t bytes, int* fd_out) {
  int fd = int(syscall(SYS_memfd_create, name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) fail_os("memfd_create(\"" + name + "\")", errno);
  if (ftruncate(fd, off_t(bytes)) != 0) {
    int e = errno;
    close(fd);
    fail_os("ftruncate(memfd \"" + name + "\", " + std::to_string(bytes) + ")", e);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    fail_os("mmap(memfd \"" + name + "\", " + std::to_string(bytes) + ")", e);
  }
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    int e = errno;
    munmap(p, bytes);
    close(fd);
    fail_os("fcntl(memfd \"" + name + "\", F_ADD_SEALS)", e);
  }
  *fd_out = prim::move_fd_high(fd);
  return p;
}

std::string program_name() {
  char name[17] = {};
  if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0) return "";
  return name;
}

std::string pseudo_filesystem(const std::string& path) {
  struct statfs sfs {};
  if (statfs(path.c_str(), &sfs) != 0) return "";
  switch (static_cast<unsigned long>(sfs.f_type)) {
    case 0x9fa0:
      return "proc";
    case 0x62656572:
      return "sysfs";
    case 0x1cd1:
      return "devpts";
    case 0x27e0eb:
      return "cgroup";
    case 0x63677270:
      return "cgroup2";
    case 0x64626720:
      return "debugfs";
    case 0x74726163:
      return "tracefs";
    case 0x73636673:
      return "securityfs";
    case 0xcafe4a11:
      return "bpf";
    case 0x6165676c:
      return "pstore";
    case 0x62656570:
      return "configfs";
    case 0x65735543:
      return "fusectl";
    case 0xf97cff8c:
      return "selinuxfs";
    case 0x42494e4d:
      return "binfmt_misc";
    case 0x19800202:
      return "mqueue";
    case 0x50495045:
      return "pipefs";
    case 0x534f434b:
      return "sockfs";
    default:
      return "";
  }
}

std::string ownership_text(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return "";
  char who[160];
  snprintf(who, sizeof who, " (its owner is uid %u, its mode %04o; this process runs as uid %u)", unsigned(st.st_uid),
           unsigned(st.st_mode & 07777), unsigned(geteuid()));
  return who;
}

int open_tmpfile(const std::string& dir, const std::string& what) {
  std::string pseudo = pseudo_filesystem(dir);
  if (!pseudo.empty())
    fail(CXLPOOL_E_CONFIG, what + ": " + dir + " is on a " + pseudo + " pseudo filesystem, which cannot hold memory");
  // The directory as the user named it, without another user's links (os/safe_path.hpp).
  ResolvedPath r;
  PathWhy why;
  if (int e = resolve_path(dir.c_str(), &r, &why)) {
    if (e == EPERM) fail(CXLPOOL_E_PERMISSION, what + ": " + dir + ": " + why.text);
    fail_os(what + ": " + dir + ": " + why.text, e);
  }
  if (r.leaf < 0) fail_os(what + ": " + dir, ENOENT);
  int fd = openat(r.leaf, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  int err = errno;
  auto refused = [&](int e) {
    if (e == EACCES || e == EPERM)
      fail(CXLPOOL_E_PERMISSION,
           what + ": no permission to create a file in the directory '" + dir + "'" + ownership_text(r.leaf));
  };
  refused(err);
  if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL) fail_os(what + ": open(\"" + dir + "\", O_TMPFILE)", err);
  // No O_TMPFILE on this filesystem: a unique name, created exclusively and unlinked at once.
  for (int attempt = 0; attempt < 16; ++attempt) {
    struct timespec ts {};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char name[96];
    snprintf(name, sizeof name, ".cxlpool-%d-%lx-%d", prim::process_id(), static_cast<unsigned long>(ts.tv_nsec),
             attempt);
    fd = openat(r.leaf, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::unlinkat(r.leaf, name, 0);
      return fd;
    }
    err = errno;
    refused(err);
    if (err != EEXIST) fail_os(what + ": open(\"" + dir + "/" + name + "\", O_CREAT|O_EXCL)", err);
  }
  fail(CXLPOOL_E_OS, what + ": cannot create a private file in " + dir);
}

int open_char_device(const std::string& path) {
  ResolvedPath r;
  PathWhy why;
  if (int e = resolve_path(path.c_str(), &r, &why)) {
    if (e == EPERM) fail(CXLPOOL_E_PERMISSION, "\"" + path + "\": " + why.text);
    fail_os("open(\"" + path + "\", O_RDWR): " + why.text, e);
  }
  struct stat st {};
  if (r.leaf < 0 || fstat(r.leaf, &st) != 0 || !S_ISCHR(st.st_mode))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "\"" + path + "\" is not a character device");
  int fd = reopen_resolved(r, O_RDWR);
  if (fd < 0) fail_os("open(\"" + path + "\", O_RDWR)", errno);
  return fd;
}

void lock_exclusive(int fd, const std::string& what) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  int err = errno;
  if (err == EWOULDBLOCK)
    fail(CXLPOOL_E_BUSY, what + " is locked by another process (flock); a device belongs to one process");
  fail_os(what + ": flock(LOCK_EX)", err);
}

int try_lock(int fd, bool exclusive) noexcept {
  return flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0 ? 0 : errno;
}

void close_fd(int fd) noexcept {
  if (fd >= 0) close(fd);
}

void truncate_fd(int fd, uint64_t size) {
  if (ftruncate(fd, off_t(size)) != 0)
    fail_os("ftruncate(fd " + std::to_string(fd) + ", " + std::to_string(size) + ")", errno);
}

bool fd_needs_shared_mapping(int fd) noexcept {
  struct statfs sfs {};
  constexpr long kHugetlbfsMagic = 0x958458f6;
  if (fstatfs(fd, &sfs) == 0 && sfs.f_type == kHugetlbfsMagic) return true;
#ifdef STATX_ATTR_DAX
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx) == 0 && (sx.stx_attributes_mask & STATX_ATTR_DAX))
    return (sx.stx_attributes & STATX_ATTR_DAX) != 0;
#endif
  return false;
}

bool fd_on_hugetlbfs(int fd) noexcept {
  struct statfs sfs {};
  constexpr long kHugetlbfsMagic = 0x958458f6;
  return fstatfs(fd, &sfs) == 0 && sfs.f_type == kHugetlbfsMagic;
}

size_t fd_page_size(int fd) {
  struct statfs sfs {};
  if (fstatfs(fd, &sfs) != 0) return page_size();
  constexpr long kHugetlbfsMagic = 0x958458f6;
  if (sfs.f_type == kHugetlbfsMagic && size_t(sfs.f_bsize) > page_size()) return size_t(sfs.f_bsize);
  return page_size();
}

uint64_t fs_free_bytes(const std::string& path) {
  struct statvfs sv {};
  if (statvfs(path.c_str(), &sv) != 0) return 0;
  return uint64_t(sv.f_bavail) * sv.f_frsize;
}

std::string path_kind(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return "";
  switch (st.st_mode & S_IFMT) {
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
    case S_IFLNK:
      return "symbolic link";
    default:
      return "special file";
  }
}

bool path_owner(const std::string& path, unsigned& uid, unsigned& mode) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return false;
  uid = unsigned(st.st_uid);
  mode = unsigned(st.st_mode & 07777);
  return true;
}

std::string read_text_file(const std::string& path) {
  // O_NONBLOCK: open() of a FIFO would wait for a writer forever; O_NOCTTY: a tty must not
  // become our controlling terminal. Only a regular file is then read.
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) fail_os("open(\"" + path + "\")", errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    fail_os("fstat(\"" + path + "\")", err);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a special file";
    fail(CXLPOOL_E_INVALID_ARGUMENT, "'" + path + "' is " + kind + ", not a regular file");
  }
  return read_whole_fd(fd, path);
}

std::string read_user_file(const std::string& path) {
  PathWhy why;
  const int fd = open_user_input(path.c_str(), &why);
  if (fd < 0) {
    const int err = errno;
    const cxlpool_status_t status = err == EPERM || err == EACCES    ? CXLPOOL_E_PERMISSION
                                    : err == ENOENT                  ? CXLPOOL_E_NOT_FOUND
                                    : err == EINVAL || err == EISDIR ? CXLPOOL_E_INVALID_ARGUMENT
                                                                     : CXLPOOL_E_OS;
    const std::string text = why.text;  // "it is a FIFO, ..." reads "'path' is a FIFO, ..."
    throw detail::Failure(status, "'" + path + (text.rfind("it is ", 0) == 0 ? "' " + text.substr(3) : "': " + text),
                          err);
  }
  return read_whole_fd(fd, path);
}

std::string read_whole_fd(int fd, const std::string& path) {
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      fail_os("read(\"" + path + "\")", err);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (out.size() > (16u << 20)) {
      close(fd);
      fail(CXLPOOL_E_INVALID_ARGUMENT, "'" + path + "' is larger than 16 MiB");
    }
  }
  close(fd);
  return out;
}

bool is_char_device(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

std::string char_device_subsystem(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISCHR(st.st_mode)) return "";
  char link[128];
  snprintf(link, sizeof link, "/sys/dev/char/%u:%u/subsystem", major(st.st_rdev), minor(st.st_rdev));
  char target[512];
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return "";
  target[n] = 0;
  const char* slash = strrchr(target, '/');
  return slash ? slash + 1 : target;
}

std::string real_path_or(const std::string& path) {
  std::string out = path;
  if (char* real = realpath(path.c_str(), nullptr)) {
    out = real;
    free(real);
  }
  return out;
}

std::string real_dir_path(const std::string& path) {
  return real_path_or(parent_dir(path)) + "/" + path.substr(path.find_last_of('/') + 1);
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace cxlpool::os

// SPDX-License-Identifier: MIT
// Linux implementation of the OS seam (os.hpp): mmap/mbind/move_pages/memfd/shm/fallocate.
#include <fcntl.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "os/os.hpp"

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
    if (FILE* f = fopen("/sys/devices/system/node/possible", "re")) {
      char buf[256] = "";
      if (fgets(buf, sizeof buf, f)) {
        const char* last = strrchr(buf, '-');
        const char* comma = strrchr(buf, ',');
        if (comma && (!last || comma > last)) last = comma;
        c.max_numa_node = atoi(last ? last + 1 : buf);
      }
      fclose(f);
    }
    return c;
  }();
  return caps;
}

void* reserve_address_space(size_t size, size_t alignment) {
  size_t ps = page_size();
  if (alignment < ps) alignment = ps;
  size_t span = size + alignment - ps;
  if (span < size) fail(CXLPOOL_E_INVALID_ARGUMENT, "reserve: size " + std::to_string(size) + " overflows");
  void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail_os("mmap(PROT_NONE, " + std::to_string(span) + " bytes)", errno);
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  uintptr_t aligned = (base + alignment - 1) & ~(uintptr_t(alignment) - 1);
  if (aligned > base) munmap(p, aligned - base);
  size_t tail = (base + span) - (aligned + size);
  if (tail) munmap(reinterpret_cast<void*>(aligned + size), tail);
  return reinterpret_cast<void*>(aligned);
}

void unmap(void* addr, size_t size) noexcept { munmap(addr, size); }

void* map_metadata(size_t size, bool noreserve) {
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) fail_os("mmap(metadata, " + std::to_string(size) + " bytes)", errno);
  return p;
}

void map_fd_fixed(void* addr, size_t size, int fd, uint64_t offset) {
  void* p = mmap(addr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, off_t(offset));
  if (p == MAP_FAILED)
    fail_os("mmap(MAP_SHARED|MAP_FIXED, fd " + std::to_string(fd) + ", offset " + std::to_string(offset) + ", " +
                std::to_string(size) + " bytes)",
            errno);
}

void advise_hugepages(void* addr, size_t size) noexcept { madvise(addr, size, MADV_HUGEPAGE); }

void protect_rw(void* addr, size_t size) {
  if (mprotect(addr, size, PROT_READ | PROT_WRITE) != 0) fail_os("mprotect(RW, " + range(addr, size) + ")", errno);
}

void protect_none(void* addr, size_t size) {
  if (mprotect(addr, size, PROT_NONE) != 0) fail_os("mprotect(NONE, " + range(addr, size) + ")", errno);
}

void discard(void* addr, size_t size) {
  if (madvise(addr, size, MADV_DONTNEED) != 0) fail_os("madvise(DONTNEED, " + range(addr, size) + ")", errno);
}

void populate_write(void* addr, size_t size) {
  if (kernel_caps().madv_populate_write) {
    if (madvise(addr, size, MADV_POPULATE_WRITE) == 0) return;
    int err = errno;
    if (err == ENOMEM || err == EFAULT || err == EHWPOISON)
      fail_os("madvise(POPULATE_WRITE, " + range(addr, size) + ")", err);
  }
  // Older kernels: write one byte per page (the pages are freshly committed, so zero).
  volatile char* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < size; off += page_size()) p[off] = p[off];
}

void bind_to_node(void* addr, size_t size, int node) {
  size_t bits = size_t(std::max(kernel_caps().max_numa_node, node)) + 1;
  std::vector<unsigned long> mask((bits + 63) / 64 + 1, 0);
  mask[size_t(node) / 64] |= 1UL << (unsigned(node) % 64);
  if (mbind(addr, size, MPOL_BIND, mask.data(), mask.size() * 64, 0) != 0)
    fail_os("mbind(MPOL_BIND, node " + std::to_string(node) + ", " + range(addr, size) + ")", errno);
}

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

int shm_open_owned(const std::string& name, bool& created) {
  std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    created = true;
    return fd;
  }
  if (errno != EEXIST) fail_os("shm_open(\"" + path + "\", O_CREAT|O_EXCL)", errno);
  fd = shm_open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) fail_os("shm_open(\"" + path + "\")", errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    fail_os("fstat(shm \"" + path + "\")", err);
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    snprintf(mode, sizeof mode, "%03o", unsigned(st.st_mode & 0777));
    fail(CXLPOOL_E_PERMISSION, "shm object \"" + path + "\" exists but is owned by uid " + std::to_string(st.st_uid) +
                                   " with mode " + mode +
                                   "; refusing to adopt it (need owner = this user, mode 0600). "
                                   "Remove it or pick another name.");
  }
  created = false;
  return fd;
}

void shm_unlink(const std::string& name) noexcept { ::shm_unlink(("/" + name).c_str()); }
void unlink_file(const std::string& path) noexcept { ::unlink(path.c_str()); }

int open_file(const std::string& path, bool create, bool& created) {
  created = false;
  if (create) {
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      created = true;
      return fd;
    }
    if (errno != EEXIST) fail_os("open(\"" + path + "\", O_CREAT|O_EXCL)", errno);
  }
  int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail_os("open(\"" + path + "\", O_RDWR)", errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail(CXLPOOL_E_INVALID_ARGUMENT, "\"" + path + "\" is not a regular file");
  }
  return fd;
}

int open_char_device(const std::string& path) {
  if (!is_char_device(path)) fail(CXLPOOL_E_INVALID_ARGUMENT, "\"" + path + "\" is not a character device");
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail_os("open(\"" + path + "\", O_RDWR)", errno);
  return fd;
}

void close_fd(int fd) noexcept {
  if (fd >= 0) close(fd);
}

uint64_t fd_size(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) fail_os("fstat(fd " + std::to_string(fd) + ")", errno);
  return uint64_t(st.st_size);
}

void truncate_fd(int fd, uint64_t size) {
  if (ftruncate(fd, off_t(size)) != 0)
    fail_os("ftruncate(fd " + std::to_string(fd) + ", " + std::to_string(size) + ")", errno);
}

bool allocate_range(int fd, uint64_t offset, uint64_t len) {
  if (fallocate(fd, 0, off_t(offset), off_t(len)) == 0) return true;
  int err = errno;
  if (err == EOPNOTSUPP || err == ENODEV) return false;
  fail_os("fallocate(fd " + std::to_string(fd) + ", offset " + std::to_string(offset) + ", " + std::to_string(len) +
              " bytes)",
          err);
}

bool punch_hole(int fd, uint64_t offset, uint64_t len) {
  if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(len)) == 0) return true;
  int err = errno;
  if (err == EOPNOTSUPP || err == ENODEV) return false;
  fail_os("fallocate(PUNCH_HOLE, fd " + std::to_string(fd) + ", offset " + std::to_string(offset) + ")", err);
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

// SPDX-License-Identifier: MIT
// FsRoot: bounded, non-blocking reads of sysfs/procfs files below a root directory. Only
// regular files are read; FIFOs, devices, directories and oversized files are refused, never
// waited on, because a fake or hostile tree may contain any of them.
#include "os/fs_root.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string_view>

namespace cxlpool::os {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

void set_refused(std::string* refused, std::string why) {
  if (refused) *refused = std::move(why);
}

}  // namespace

std::optional<std::string> FsRoot::read(const std::string& rel, std::string* refused) const {
  if (refused) refused->clear();
  if (!valid()) return std::nullopt;
  const std::string p = path(rel);
  // stat() first so a device in a fake tree is never opened at all (opening some devices has
  // effects, e.g. a watchdog); fstat() after open() below is the check that counts, since the
  // path may change in between.
  struct stat st {};
  if (stat(p.c_str(), &st) != 0) {
    if (errno == ELOOP) set_refused(refused, "is a symlink loop");
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    set_refused(refused, std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
    return std::nullopt;
  }
  // O_NONBLOCK: open() of a FIFO would otherwise wait for a writer forever; O_NOCTTY: a tty
  // must not become our controlling terminal.
  int fd = open(p.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) set_refused(refused, "is a symlink loop");
    return std::nullopt;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    set_refused(refused, std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (out.size() > kMaxReadBytes) {
      // A truncated read is not the file's content; sysfs files are small, so never read on.
      close(fd);
      set_refused(refused, "is larger than 1 MiB");
      return std::nullopt;
    }
  }
  close(fd);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t')) out.pop_back();
  return out;
}

std::vector<std::string> FsRoot::list(const std::string& rel) const {
  std::vector<std::string> out;
  if (!valid()) return out;
  DIR* d = opendir(path(rel).c_str());
  if (!d) return out;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(std::move(name));
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> FsRoot::link_basename(const std::string& rel) const {
  auto target = link_path(rel);
  if (!target) return std::nullopt;
  auto slash = target->find_last_of('/');
  return slash == std::string::npos ? *target : target->substr(slash + 1);
}

std::optional<std::string> FsRoot::link_path(const std::string& rel) const {
  if (!valid()) return std::nullopt;
  char buf[PATH_MAX];
  ssize_t n = readlink(path(rel).c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  std::string_view target(buf, size_t(n));
  while (target.substr(0, 3) == "../") target.remove_prefix(3);
  return std::string(target);
}

bool FsRoot::exists(const std::string& rel) const {
  struct stat st {};
  return valid() && lstat(path(rel).c_str(), &st) == 0;
}

}  // namespace cxlpool::os

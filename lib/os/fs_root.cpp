// SPDX-License-Identifier: MIT
// FsRoot: small, allocation-tolerant reads of sysfs/procfs files below a root directory.
#include "os/fs_root.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace cxlpool::os {

std::optional<std::string> FsRoot::read(const std::string& rel) const {
  if (!valid()) return std::nullopt;
  int fd = open(path(rel).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (out.size() > (1u << 20)) break;  // sysfs files are small; never read unbounded
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
  if (!valid()) return std::nullopt;
  char buf[PATH_MAX];
  ssize_t n = readlink(path(rel).c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  std::string target(buf, size_t(n));
  auto slash = target.find_last_of('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

bool FsRoot::exists(const std::string& rel) const {
  struct stat st {};
  return valid() && lstat(path(rel).c_str(), &st) == 0;
}

}  // namespace cxlpool::os

// SPDX-License-Identifier: MIT
// Read-only access to a pseudo-filesystem tree (sysfs, procfs) under an injectable root, so
// topology discovery runs unchanged against /sys or a fake tree in tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cxlpool::os {

class FsRoot {
 public:
  FsRoot() = default;
  explicit FsRoot(std::string root) : root_(std::move(root)) {}
  bool valid() const { return !root_.empty(); }
  const std::string& root() const { return root_; }
  std::string path(const std::string& rel) const { return root_ + "/" + rel; }

  // Contents with trailing whitespace removed; nullopt when absent or unreadable.
  std::optional<std::string> read(const std::string& rel) const;
  // Entry names (no "." / ".."), sorted; empty when absent.
  std::vector<std::string> list(const std::string& rel) const;
  // Last path component of a symlink's target (e.g. a device's driver); nullopt if no link.
  std::optional<std::string> link_basename(const std::string& rel) const;
  bool exists(const std::string& rel) const;

 private:
  std::string root_;
};

}  // namespace cxlpool::os

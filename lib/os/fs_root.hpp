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
  // Largest file read: sysfs attributes hold at most a page, so anything bigger is not one.
  static constexpr size_t kMaxReadBytes = size_t(1) << 20;

  FsRoot() = default;
  explicit FsRoot(std::string root) : root_(std::move(root)) {}
  bool valid() const { return !root_.empty(); }
  const std::string& root() const { return root_; }
  std::string path(const std::string& rel) const { return root_ + "/" + rel; }

  // Contents with trailing whitespace removed; nullopt when absent or unreadable. Only regular
  // files of at most kMaxReadBytes are read (sysfs attributes and procfs files are regular
  // files), and opening never blocks, so a FIFO, device or socket planted in a tree cannot
  // hang or trigger anything. When the file exists but is refused (not a regular file,
  // symlink loop, too large) and refused is given, *refused says why, e.g. "is a FIFO, not a
  // regular file"; it stays empty for absent or unreadable files.
  std::optional<std::string> read(const std::string& rel, std::string* refused = nullptr) const;
  // Entry names (no "." / ".."), sorted; empty when absent.
  std::vector<std::string> list(const std::string& rel) const;
  // Last path component of a symlink's target (e.g. a device's driver); nullopt if no link.
  std::optional<std::string> link_basename(const std::string& rel) const;
  // A symlink's target with its leading "../" components removed: sysfs class and bus links
  // point into devices/ ("devices/platform/ACPI0017:00/root0"); nullopt if no link.
  std::optional<std::string> link_path(const std::string& rel) const;
  bool exists(const std::string& rel) const;

 private:
  std::string root_;
};

}  // namespace cxlpool::os

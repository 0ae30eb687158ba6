// SPDX-License-Identifier: MIT
// How much room there is for a device's memory, for discovery's warnings: a filesystem's free
// bytes (statvfs), the free huge pages behind a hugetlbfs mount, and what the process's memory
// cgroup still allows. Cold path: reads procfs, sysfs and cgroupfs; never throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cxlpool::os {

// Bytes a new file in dir can still get: statvfs's f_bavail for most filesystems; on hugetlbfs
// the free huge pages of its page size not already reserved, within the mount's size= limit.
// false when dir cannot be examined.
struct FsRoom {
  uint64_t bytes = 0;
  size_t huge_page = 0;  // hugetlbfs: its page size, else 0
};
bool filesystem_room(const std::string& dir, FsRoom* out) noexcept;

// The memory cgroup (v2 memory.max/memory.current, else v1 memory.limit_in_bytes and
// memory.usage_in_bytes) of the calling process or of an ancestor with the least room left
// under its limit. false when no memory limit applies (or none can be read). The process's
// cgroup file and the cgroup mount are parameters for tests (fake trees).
struct CgroupRoom {
  uint64_t limit = 0;  // bytes
  uint64_t usage = 0;  // bytes charged now (page cache included)
  std::string path;    // the limit's file, for messages
};
bool memory_cgroup_room(CgroupRoom* out, const std::string& proc_cgroup = "/proc/self/cgroup",
                        const std::string& cgroupfs = "/sys/fs/cgroup") noexcept;

}  // namespace cxlpool::os

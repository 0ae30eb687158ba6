// SPDX-License-Identifier: MIT
// What topology hands to the device layer to open one target: its kind, where its bytes live
// and how a private mapping of it behaves across fork(). Plain data, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlpool/backing.h"

namespace cxlpool::detail {

// How a forked child gets its copy of a private pool's memory on this device.
//   kCopyOnWrite  the device is mapped MAP_PRIVATE: written pages are the process's own
//                 (anonymous) memory and fork() is the kernel's copy-on-write, exactly as for
//                 glibc's heap. Right for memory whose placement the process decides anyway
//                 (memfd, shm on the default tmpfs, numa nodes via mbind).
//   kCopy         the device is mapped MAP_SHARED so written bytes live in the device itself
//                 (device-DAX, files on DAX filesystems or hugetlbfs, tmpfs mounts with mpol=);
//                 at fork the child copies the committed ranges into fresh storage of its own
//                 before it returns from fork(), and the parent waits for that copy.
enum class ForkMode : uint8_t { kDefault, kCopyOnWrite, kCopy };

// The smallest device cxlpool accepts: one allocator segment.
inline constexpr uint64_t kMinDeviceBytes = uint64_t(4) << 20;

struct BackingSpec {
  std::string device_name;  // for messages
  cxlpool_backing_kind_t kind = CXLPOOL_BACKING_MEMFD;
  int numa_node = -1;
  std::string path;        // shm name, file path or devdax path
  uint64_t capacity = 0;   // bytes
  uint64_t max_space = 0;  // how far elastic capacity may grow the offset space; 0 = unbounded
  size_t page_size = 0;    // 0 = derive (system page, hugetlbfs block, devdax align)
  ForkMode fork_mode = ForkMode::kDefault;
};

// The fork mode a spec resolves to: devdax is always kCopy (device-DAX cannot be mapped
// privately); a declared fork= wins; a file defaults to kCopy where its bytes must stay in the
// device (dax_or_hugetlb: a DAX filesystem or hugetlbfs), else kCopyOnWrite, like numa,
// memfd and shm.
ForkMode effective_fork_mode(const BackingSpec& spec, bool dax_or_hugetlb = false);

// Static capabilities of a backing kind (before anything is opened).
cxlpool_backing_caps_t describe_backing(const BackingSpec& spec);

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The one OS seam: every system call, libnuma and hwloc call cxlpool makes is declared here
// (hwloc in os/hwloc.hpp, file-tree reads in os/fs_root.hpp). Failures throw
// detail::Failure naming the call and its arguments. Kernel capabilities are probed once.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace cxlpool::os {

size_t page_size();
// Monotonic time in ns at the kernel tick's resolution (CLOCK_MONOTONIC_COARSE): cheap.
uint64_t coarse_now_ns() noexcept;
uint64_t total_ram_bytes();

// Capabilities of the running kernel, probed once on first use.
struct KernelCaps {
  bool madv_populate_write = false;       // MADV_POPULATE_WRITE (5.14+)
  bool mpol_weighted_interleave = false;  // MPOL_WEIGHTED_INTERLEAVE accepted by mbind (6.9+)
  bool memfd = false;
  int max_numa_node = 0;  // highest possible node id the kernel accepts in masks
};
const KernelCaps& kernel_caps();

// ---- Address space ----
// Reserves size bytes of inaccessible address space aligned to alignment (power of two).
void* reserve_address_space(size_t size, size_t alignment);
void unmap(void* addr, size_t size) noexcept;
// Maps fd [offset, offset+size) over existing reserved space at addr (MAP_FIXED|MAP_SHARED),
// inaccessible until protect_rw.
void map_fd_fixed(void* addr, size_t size, int fd, uint64_t offset);
void protect_rw(void* addr, size_t size);
void protect_none(void* addr, size_t size);
// Drops the physical pages of an anonymous or shared range from this mapping (MADV_DONTNEED).
void discard(void* addr, size_t size);
// Faults [addr, addr+size) in for writing (MADV_POPULATE_WRITE, or touching each page).
void populate_write(void* addr, size_t size);

// Private anonymous read-write memory for allocator metadata (local DRAM, default policy).
// noreserve: address space only until touched (the page map).
void* map_metadata(size_t size, bool noreserve = false);
// Asks for transparent huge pages on a metadata range (fewer TLB misses); best effort.
void advise_hugepages(void* addr, size_t size) noexcept;

// ---- NUMA ----
// mbind(MPOL_BIND) of [addr, addr+size) to one node (no page is moved).
void bind_to_node(void* addr, size_t size, int node);
// move_pages status query: out[i] = node of page i, or negative errno (-ENOENT: not present).
void query_page_nodes(const void* addr, size_t pages, int* out);

// ---- Files and shared memory ----
int memfd_create(const std::string& name);
// Creates (O_EXCL, mode 0600) or opens /dev/shm/name. created tells which. Refuses objects
// owned by another user or accessible to group/others.
int shm_open_owned(const std::string& name, bool& created);
void shm_unlink(const std::string& name) noexcept;
void unlink_file(const std::string& path) noexcept;
// Opens path read-write, creating it (O_EXCL, 0600) when create and absent.
int open_file(const std::string& path, bool create, bool& created);
// Opens a character device read-write (devdax); refuses anything else.
int open_char_device(const std::string& path);
void close_fd(int fd) noexcept;
uint64_t fd_size(int fd);
void truncate_fd(int fd, uint64_t size);
// Allocates file blocks for [offset, offset+len) so a full filesystem fails here, not with
// SIGBUS on first touch. Returns false when the filesystem has no fallocate (EOPNOTSUPP).
bool allocate_range(int fd, uint64_t offset, uint64_t len);
// Frees file blocks (FALLOC_FL_PUNCH_HOLE). Returns false when unsupported.
bool punch_hole(int fd, uint64_t offset, uint64_t len);
// Page granule of the filesystem holding fd (hugetlbfs: huge page size), at least page_size().
size_t fd_page_size(int fd);
// Free bytes of the filesystem holding path, or 0 when it cannot be determined.
uint64_t fs_free_bytes(const std::string& path);
// Whole contents of a regular file (at most 16 MiB); throws naming the path on failure.
std::string read_text_file(const std::string& path);
bool is_char_device(const std::string& path);
std::string parent_dir(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace cxlpool::os

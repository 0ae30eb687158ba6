// SPDX-License-Identifier: MIT
// Pools and the tiered allocator. A pool owns one backing per device it uses and carves
// their address space into 4 MiB segments of 64 KiB slices; pages of one size class live in
// runs of slices; requests above 1 MiB get whole segments. Threads allocate from their own
// heap without locks; frees from other threads go through per-page atomic bitmaps. All
// allocator metadata (segment and page descriptors, free bitmaps) lives in anonymous DRAM
// mappings, never in the device memory itself. Design notes: docs/allocator.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "topology/model.hpp"

namespace cxlpool::detail::alloc {

class Pool;
inline constexpr int kMaxDevices = 8;
inline constexpr int kMaxPools = 64;

struct PoolOptions {
  std::vector<size_t> targets;  // topology target indices; empty = every target, in tier order
  std::string policy;           // placement policy text (docs/policy.md); empty = bind:near
  std::string name;
};

struct DeviceStats {
  uint64_t allocated_bytes = 0;  // bytes in live blocks (block sizes)
  uint64_t active_bytes = 0;     // bytes of slices carved into pages or huge spans
  uint64_t resident_bytes = 0;   // bytes committed on the device by this pool
  uint64_t peak_resident_bytes = 0;
  uint64_t allocations = 0;  // successful allocations placed on this device
  uint64_t frees = 0;
  uint64_t fallbacks = 0;  // allocations placed here because the policy's first choice was full
  uint64_t failures = 0;   // allocations whose policy devices were all full (NULL + ENOMEM)
  uint64_t capacity_bytes = 0;
};

struct PtrInfo {
  Pool* pool = nullptr;
  int device = -1;    // index in the pool
  size_t target = 0;  // topology target index
  int tier = 0;
  size_t block_size = 0;  // size of the block holding the pointer
  size_t usable = 0;      // bytes from the pointer to the end of its block
  bool huge = false;
};

Pool* pool_create(const Topology& topo, const PoolOptions& options);  // throws Failure
void pool_destroy(Pool* pool) noexcept;
// A pool over every target of topo with the policy of CXLPOOL_POLICY (default bind:near): the
// process default pool and the interposer's. A bad policy is CXLPOOL_E_CONFIG naming the
// variable and the token.
Pool* pool_create_from_environment(const Topology& topo, const std::string& name);

// The malloc contract: NULL with errno = ENOMEM on failure; hint: CXLPOOL_HINT_* bits;
// device >= 0 overrides the policy for this call.
void* pool_malloc(Pool* pool, size_t size, uint32_t hint = 0, int device = -1) noexcept;
void* pool_aligned(Pool* pool, size_t alignment, size_t size, uint32_t hint = 0, int device = -1) noexcept;
void* pool_realloc(Pool* pool, void* p, size_t size) noexcept;
// Frees any pointer of any pool. Returns false (and does nothing) for foreign pointers.
bool free_any(void* p) noexcept;
// Usable bytes from p to the end of its block; 0 for foreign pointers.
size_t usable_size(const void* p) noexcept;
bool owns(const void* p) noexcept;
bool ptr_info(const void* p, PtrInfo* out) noexcept;
// Returns empty pages and cached spans to the devices; bytes decommitted.
uint64_t pool_trim(Pool* pool) noexcept;

// pthread_atfork handlers (installed by the interposer): prepare takes every allocator lock
// in a fixed order; parent and child release them.
void fork_prepare() noexcept;
void fork_parent() noexcept;
void fork_child() noexcept;

int pool_device_count(const Pool* pool) noexcept;
const std::string& pool_device_name(const Pool* pool, int device) noexcept;
size_t pool_device_target(const Pool* pool, int device) noexcept;
int pool_device_tier(const Pool* pool, int device) noexcept;
int pool_find_device(const Pool* pool, const std::string& name) noexcept;
const std::string& pool_policy_text(const Pool* pool) noexcept;
const std::string& pool_name(const Pool* pool) noexcept;
DeviceStats pool_device_stats(const Pool* pool, int device) noexcept;
std::string pool_stats_json(const Pool* pool);

}  // namespace cxlpool::detail::alloc

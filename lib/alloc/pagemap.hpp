// SPDX-License-Identifier: MIT
// The process's page map: address >> 22 (one 4 MiB segment) -> the header of the arena that
// owns it. Two levels (8192 leaves of 4096 entries, each leaf 32 KiB, made on first use) so
// the whole 47-bit address space costs 64 KiB until used — a program under a small
// RLIMIT_AS pays nothing for it. Every arena kind (the private heap's small segments and huge
// spans today; shared-pool and KV-block arenas later) starts its descriptors with a
// SegmentHeader whose kind selects a small ops table, so free(), usable_size() and ptr_info()
// work for any cxlpool pointer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "alloc/pool.hpp"

namespace cxlpool::detail::alloc {

// kReleased marks address space an arena gave back: a late (double) free of a pointer
// there is recognised instead of being passed to glibc as foreign.
enum class ArenaKind : uint8_t { kHeapSmall, kHeapHuge, kReleased, kCount };

struct SegmentHeader {
  ArenaKind kind = ArenaKind::kHeapSmall;
  uint8_t device = 0;            // index of the device in the pool (its home: which lists it is on)
  uint8_t resident = 0;          // index of the device holding its bytes now (tiering moves them);
                                 // written under the home's PoolDevice::mu, read with resident_of()
  uint32_t pool_index = 0;       // copies of the pool's, so free() finds the thread's heap
  uint32_t pool_generation = 0;  // with one load less
  Pool* pool = nullptr;
};

// What every arena kind answers for its own pointers.
struct ArenaOps {
  // Frees p; an interior or already-free pointer is ignored and counted.
  void (*free)(SegmentHeader* hdr, void* p) noexcept;
  // Bytes from p to the end of its block when p starts a live block; 0 otherwise.
  size_t (*usable_size)(SegmentHeader* hdr, const void* p) noexcept;
  // Describes the block holding p (p may point inside it); false when no live block does.
  bool (*info)(SegmentHeader* hdr, const void* p, PtrInfo* out) noexcept;
};
extern const ArenaOps* const g_arena_ops[size_t(ArenaKind::kCount)];

inline constexpr unsigned kAddressBits = 47;
inline constexpr unsigned kMapShift = 22;
inline constexpr unsigned kLeafBits = 12;
inline constexpr unsigned kRootBits = kAddressBits - kMapShift - kLeafBits;

using PagemapLeaf = std::atomic<SegmentHeader*>[size_t(1) << kLeafBits];
extern std::atomic<PagemapLeaf*> g_pagemap_root[size_t(1) << kRootBits];

inline SegmentHeader* pagemap_lookup(const void* p) noexcept {
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a >> kAddressBits) return nullptr;
  PagemapLeaf* leaf = g_pagemap_root[a >> (kMapShift + kLeafBits)].load(std::memory_order_acquire);
  if (!leaf) return nullptr;
  return (*leaf)[(a >> kMapShift) & ((size_t(1) << kLeafBits) - 1)].load(std::memory_order_acquire);
}

// Points [base, base + segments * 4 MiB) at h. Creating a leaf can fail (no memory for
// 32 KiB of metadata): false, and nothing changed.
bool pagemap_set(uintptr_t base, size_t segments, SegmentHeader* h) noexcept;
// Marks a range an arena gave back (kReleased).
void pagemap_release(uintptr_t base, size_t segments) noexcept;
extern SegmentHeader g_released_header;

}  // namespace cxlpool::detail::alloc

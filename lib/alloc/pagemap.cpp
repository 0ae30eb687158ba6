// SPDX-License-Identifier: MIT
// Page map leaves (see pagemap.hpp): made on demand, published with a compare-and-swap,
// never freed (a leaf costs 32 KiB per 16 GiB of address space ever used).
#include "alloc/pagemap.hpp"

#include "os/os.hpp"

namespace cxlpool::detail::alloc {

std::atomic<PagemapLeaf*> g_pagemap_root[size_t(1) << kRootBits];
SegmentHeader g_released_header{ArenaKind::kReleased, 0, 0, 0, 0, nullptr};

namespace {
PagemapLeaf* leaf_for(uintptr_t a) noexcept {
  std::atomic<PagemapLeaf*>& slot = g_pagemap_root[a >> (kMapShift + kLeafBits)];
  PagemapLeaf* leaf = slot.load(std::memory_order_acquire);
  if (leaf) return leaf;
  void* mem = os::try_map_metadata(sizeof(PagemapLeaf));
  if (!mem) return nullptr;
  auto* fresh = static_cast<PagemapLeaf*>(mem);  // zero-filled: every entry null
  if (slot.compare_exchange_strong(leaf, fresh, std::memory_order_acq_rel)) return fresh;
  os::unmap(mem, sizeof(PagemapLeaf));
  return leaf;
}
}  // namespace

bool pagemap_set(uintptr_t base, size_t segments, SegmentHeader* h) noexcept {
  constexpr size_t kMask = (size_t(1) << kLeafBits) - 1;
  if (h)  // make every leaf first, so a failure leaves nothing half set
    for (size_t i = 0; i < segments; ++i)
      if (!leaf_for(base + (i << kMapShift))) return false;
  for (size_t i = 0; i < segments; ++i) {
    uintptr_t a = base + (i << kMapShift);
    PagemapLeaf* leaf = g_pagemap_root[a >> (kMapShift + kLeafBits)].load(std::memory_order_acquire);
    if (leaf) (*leaf)[(a >> kMapShift) & kMask].store(h, std::memory_order_release);
  }
  return true;
}

void pagemap_release(uintptr_t base, size_t segments) noexcept { pagemap_set(base, segments, &g_released_header); }

}  // namespace cxlpool::detail::alloc

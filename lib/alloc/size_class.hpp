// SPDX-License-Identifier: MIT
// Size classes: 16-byte steps up to 1 KiB (64 classes), then four classes per power of two up
// to 1 MiB (40 classes). Larger requests are "huge" and get whole segments. Each class has a
// page of 1..64 slices (64 KiB) holding at least 8 blocks where the segment allows it.
//   class  size        class  size          class  size
//   0      16          63     1024          100    655360 (640 KiB)
//   1      32          64     1280          103    1048576 (1 MiB)
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::detail::alloc {

inline constexpr unsigned kSegmentShift = 22;  // 4 MiB segments
inline constexpr size_t kSegmentSize = size_t(1) << kSegmentShift;
inline constexpr unsigned kSliceShift = 16;  // 64 KiB slices
inline constexpr size_t kSliceSize = size_t(1) << kSliceShift;
inline constexpr unsigned kSlicesPerSegment = unsigned(kSegmentSize / kSliceSize);
inline constexpr unsigned kNumClasses = 104;
inline constexpr size_t kMaxClassSize = size_t(1) << 20;
inline constexpr unsigned kMaxBlocksPerPage = unsigned(kSliceSize / 16);  // 4096
inline constexpr unsigned kBitmapWords = kMaxBlocksPerPage / 64;          // 64
inline constexpr unsigned kInlineWords = 4;       // pages of at most 256 blocks keep their bitmaps in the descriptor
inline constexpr unsigned kReciprocalShift = 42;  // exact floor(off/size) for off < 4 MiB, size <= 1 MiB

inline unsigned size_to_class(size_t n) {
  if (n <= 1024) return n ? unsigned((n - 1) >> 4) : 0;
  size_t w = n - 1;
  unsigned b = 63u - unsigned(__builtin_clzll(w));
  return 64 + (b - 10) * 4 + unsigned((w >> (b - 2)) & 3);
}

constexpr size_t class_to_size(unsigned c) {
  return c < 64 ? size_t(c + 1) * 16 : size_t(5 + (c - 64) % 4) << (8 + (c - 64) / 4);
}

constexpr unsigned class_slices(unsigned c) {
  size_t want = (class_to_size(c) * 8 + kSliceSize - 1) / kSliceSize;
  return want < 1 ? 1 : want > kSlicesPerSegment ? kSlicesPerSegment : unsigned(want);
}

constexpr unsigned class_capacity(unsigned c) { return unsigned(class_slices(c) * kSliceSize / class_to_size(c)); }

// Classes above 8 KiB have pages of more than one slice: a thread takes a page of its own of
// such a class only after many allocations of it (types.hpp, warm_limit; docs/allocator.md).
inline constexpr size_t kThreadMaxSize = size_t(8) << 10;

// The fewest slices that hold a block with at most 1/8 of the page left over, so a class with
// one live block does not hold most of a segment's address space (its uncommitted slices still
// count against the limit). Classes of pages of one slice keep it.
constexpr unsigned class_slices_fewest(unsigned c) {
  const size_t size = class_to_size(c);
  unsigned k = unsigned((size + kSliceSize - 1) / kSliceSize);
  while (k < class_slices(c) && (k * kSliceSize % size) * 8 > k * kSliceSize) ++k;
  return k;
}

// Pages under an RLIMIT_AS (and on small devices): above 8 KiB, the fewest slices, up to 8,
// that leave at most 1/32 of the page over (a class of 5 x 2^j bytes fills 5 slices exactly,
// where one left 6.25% of every page unused); else the fewest as above.
constexpr unsigned class_slices_tight(unsigned c) {
  const size_t size = class_to_size(c);
  if (size > kThreadMaxSize)
    for (unsigned k = unsigned((size + kSliceSize - 1) / kSliceSize); k <= 8; ++k)
      if ((k * kSliceSize % size) * 32 <= k * kSliceSize) return k;
  return class_slices_fewest(c);
}
inline constexpr unsigned kFirstCentralClass = 76;

constexpr uint64_t class_reciprocal(unsigned c) {
  return ((uint64_t(1) << kReciprocalShift) + class_to_size(c) - 1) / class_to_size(c);
}

static_assert(class_to_size(0) == 16 && class_to_size(63) == 1024 && class_to_size(64) == 1280);
static_assert(class_to_size(kNumClasses - 1) == kMaxClassSize);
static_assert(class_to_size(kFirstCentralClass - 1) == kThreadMaxSize && class_slices(kFirstCentralClass) > 1 &&
              class_slices(kFirstCentralClass - 1) == 1);
static_assert(class_capacity(0) == kMaxBlocksPerPage);
// The free bitmap stays where the class says (inline in the page descriptor or not: fast.hpp,
// kInlineBitmap; page.cpp decides by the page's own block count) whatever the page's slices.
constexpr bool same_bitmap_place(unsigned c, unsigned slices) {
  const size_t blocks = slices * kSliceSize / class_to_size(c);
  return slices <= kSlicesPerSegment && blocks >= 1 &&
         ((blocks + 63) / 64 <= kInlineWords) == ((class_capacity(c) + 63) / 64 <= kInlineWords);
}
static_assert([] {
  for (unsigned c = 0; c < kNumClasses; ++c)
    if (!same_bitmap_place(c, class_slices_tight(c)) || !same_bitmap_place(c, class_slices_fewest(c)) ||
        class_slices_fewest(c) > class_slices(c))
      return false;
  return true;
}());

}  // namespace cxlpool::detail::alloc

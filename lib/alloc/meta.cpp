// SPDX-License-Identifier: MIT
// Metadata memory: segment descriptors come from chunks advised for transparent huge pages
// (the descriptors of a large heap then share few TLB entries), after a first chunk of four in
// small pages (a small heap touches a few pages of each); freed descriptors are reused,
// as are huge span descriptors (from small chunks), which are never unmapped.
// Chunks after the first start at 2 MiB and double up to 32 MiB; under an RLIMIT_AS they start at one
// descriptor, are at most 1/64 of what the limit leaves and are not over-reserved for
// huge-page alignment, so descriptors hold little address space the program could use.
#include <algorithm>
#include <mutex>

#include "alloc/internal.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::alloc {
namespace {

class SegmentArena {
 public:
  Segment* take() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_) {
      void* p = free_;
      free_ = *static_cast<void**>(p);
      return static_cast<Segment*>(p);
    }
    if (left_ < kSlot) {
      constexpr size_t kHuge = size_t(2) << 20;
      size_t chunk = next_chunk_;
      if (address_space_limited()) {
        const size_t headroom = os::prim::address_space_headroom();
        chunk = std::max(kSlot, std::min(limited_chunk_, headroom / 64) / kSlot * kSlot);
        void* raw = os::try_map_metadata(chunk);
        if (!raw) return nullptr;
        next_ = static_cast<char*>(raw);
        if (limited_chunk_ < kMaxChunk) limited_chunk_ *= 2;
      } else if (!started_) {
        // The first descriptors in small pages: a huge page is resident whole from its first
        // touch, where a small heap's descriptors use a few 4 KiB pages each (a process with one
        // segment paid 2 MiB of RSS for it).
        chunk = kFirstChunk;
        void* raw = os::try_map_metadata(chunk);
        if (!raw) return nullptr;
        os::prim::advise_thp(raw, chunk, false);
        next_ = static_cast<char*>(raw);
        started_ = true;
      } else {
        void* raw = os::try_map_metadata(chunk + kHuge);
        if (!raw) return nullptr;
        uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1);
        os::advise_hugepages(reinterpret_cast<void*>(aligned), chunk);
        next_ = reinterpret_cast<char*>(aligned);
        if (next_chunk_ < kMaxChunk) next_chunk_ *= 2;
      }
      left_ = chunk;
    }
    void* p = next_;
    next_ += kSlot;
    left_ -= kSlot;
    return static_cast<Segment*>(p);
  }
  void give(Segment* s) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    *reinterpret_cast<void**>(s) = free_;
    free_ = s;
  }
  void lock() noexcept { mu_.lock(); }
  void unlock() noexcept { mu_.unlock(); }
  void reset() noexcept { new (&mu_) std::mutex(); }

 private:
  static constexpr size_t kSlot = (sizeof(Segment) + 4095) & ~size_t(4095);
  static constexpr size_t kMaxChunk = size_t(32) << 20;  // 16 huge pages
  // Small pages for the first 4 descriptors (heaps up to 16 MiB); huge pages after them, where
  // a heap's descriptors are many and spread (without them a shuffled free of 1M blocks over
  // 60 segments ran 25% slower, on TLB misses).
  static constexpr size_t kFirstChunk = 4 * kSlot;
  bool started_ = false;
  std::mutex mu_;
  void* free_ = nullptr;
  char* next_ = nullptr;
  size_t left_ = 0;
  size_t next_chunk_ = size_t(2) << 20;
  size_t limited_chunk_ = kSlot;  // under an RLIMIT_AS: one descriptor (112 KiB), then doubling
};
SegmentArena g_segment_arena;

// Huge span descriptors: type-stable (freed ones are reused, never unmapped), so free() may
// read the span a page map entry names even while another thread releases it (a pointer in
// the rest of a span's last segment is not the span's: huge_reserves()).
class SpanArena {
 public:
  HugeSpan* take() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_) {
      HugeSpan* s = free_;
      free_ = s->next;
      return s;
    }
    if (left_ == 0) {
      void* raw = os::try_map_metadata(kChunk);
      if (!raw) return nullptr;
      next_ = static_cast<HugeSpan*>(raw);
      left_ = kChunk / sizeof(HugeSpan);
    }
    --left_;
    return next_++;
  }
  void give(HugeSpan* s) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    s->next = free_;
    free_ = s;
  }
  void lock() noexcept { mu_.lock(); }
  void unlock() noexcept { mu_.unlock(); }
  void reset() noexcept { new (&mu_) std::mutex(); }

 private:
  static constexpr size_t kChunk = size_t(64) << 10;
  std::mutex mu_;
  HugeSpan* free_ = nullptr;
  HugeSpan* next_ = nullptr;
  size_t left_ = 0;
};
SpanArena g_span_arena;

}  // namespace

Segment* segment_new() noexcept {
  Segment* s = g_segment_arena.take();
  return s ? new (s) Segment() : nullptr;
}

void segment_delete(Segment* s) noexcept {
  s->~Segment();
  g_segment_arena.give(s);
}

HugeSpan* span_new() noexcept {
  HugeSpan* s = g_span_arena.take();
  return s ? new (s) HugeSpan() : nullptr;
}

void span_delete(HugeSpan* s) noexcept {
  s->kind = ArenaKind::kReleased;  // a reader racing the release sees no span here
  g_span_arena.give(s);
}

void meta_lock_for_fork() noexcept {
  g_segment_arena.lock();
  g_span_arena.lock();
}
void meta_unlock_after_fork() noexcept {
  g_span_arena.unlock();
  g_segment_arena.unlock();
}
void meta_reset_lock_in_child() noexcept {
  g_segment_arena.reset();
  g_span_arena.reset();
}

}  // namespace cxlpool::detail::alloc

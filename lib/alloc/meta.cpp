// SPDX-License-Identifier: MIT
// Metadata memory: segment descriptors come from chunks advised for transparent huge pages
// (the descriptors of a large heap then share few TLB entries); freed descriptors are reused.
// Chunks start small and double, so a process under a small RLIMIT_AS pays little up front.
#include <mutex>

#include "alloc/internal.hpp"

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
      void* raw = os::try_map_metadata(chunk + kHuge);
      if (!raw) return nullptr;
      uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1);
      os::advise_hugepages(reinterpret_cast<void*>(aligned), chunk);
      next_ = reinterpret_cast<char*>(aligned);
      left_ = chunk;
      if (next_chunk_ < kMaxChunk) next_chunk_ *= 2;
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
  std::mutex mu_;
  void* free_ = nullptr;
  char* next_ = nullptr;
  size_t left_ = 0;
  size_t next_chunk_ = size_t(2) << 20;
};
SegmentArena g_segment_arena;

}  // namespace

Segment* segment_new() noexcept {
  Segment* s = g_segment_arena.take();
  return s ? new (s) Segment() : nullptr;
}

void segment_delete(Segment* s) noexcept {
  s->~Segment();
  g_segment_arena.give(s);
}

void meta_lock_for_fork() noexcept { g_segment_arena.lock(); }
void meta_unlock_after_fork() noexcept { g_segment_arena.unlock(); }
void meta_reset_lock_in_child() noexcept { g_segment_arena.reset(); }

}  // namespace cxlpool::detail::alloc

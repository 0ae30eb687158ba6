// SPDX-License-Identifier: MIT
// Test-only emulation of one host's incoherent cache over a shared range, so that a missing
// publish, a missing acquire or false sharing fails deterministically on coherent memory
// (shm files, QEMU guests). Several views over one range stand for several hosts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::detail::shared {

struct NoncoherentOptions {
  // Lines evicted at random (anywhere in the view) at each publish/acquire call, before the
  // call's own work: dirty ones are written back, clean ones refreshed. 0: no eviction.
  size_t evict_per_call = 0;
};

// Every line copy, whatever caused it (publish, acquire or eviction).
struct NoncoherentCounters {
  uint64_t lines_written_back = 0;
  uint64_t lines_refreshed = 0;
  uint64_t lines_evicted = 0;  // evictions (each also counted as a write-back or a refresh)
  // Write-backs of a dirty line whose shared copy had changed since this view last loaded or
  // wrote it: another host wrote the same line (false sharing, or two writers). The whole
  // line is still written, clobbering their bytes, as hardware would.
  uint64_t conflicting_writebacks = 0;
};

// The participant reads and writes view()[0, size()) instead of the shared range. A line is
// dirty when it differs from the snapshot (what it held when last loaded or written back);
// rewriting a line with the bytes it already held does not dirty it. Lines are loaded at
// construction, by acquire and by eviction, never on a miss: until then they stay stale.
// Single-threaded: one thread uses a view at a time. Copies to and from the shared range are
// plain memcpy; views in different threads over one range race like the hardware would.
class NoncoherentView {
 public:
  // shared_bytes: 64-byte aligned; len: a positive multiple of 64. The range must outlive the
  // view. Throws Failure: CXLPOOL_E_INVALID_ARGUMENT naming the bad value, or an mmap error.
  NoncoherentView(std::byte* shared_bytes, size_t len, uint64_t seed, NoncoherentOptions options = {});
  ~NoncoherentView();
  NoncoherentView(const NoncoherentView&) = delete;
  NoncoherentView& operator=(const NoncoherentView&) = delete;

  std::byte* view() noexcept { return shadow_; }
  const std::byte* view() const noexcept { return shadow_; }
  std::byte* shared_base() const noexcept { return shared_; }
  size_t size() const noexcept { return len_; }

  // Writes the dirty lines touching [off, off + n) back to the shared range (whole lines).
  void publish(size_t off, size_t n);
  // Writes back the dirty lines touching [off, off + n), then reloads every line touching it.
  void acquire(size_t off, size_t n);
  // Both throw CXLPOOL_E_INVALID_ARGUMENT when [off, off + n) leaves the view. n == 0 copies
  // nothing of its own, but the call still evicts (eviction stands for time passing).

  // Whether [p, p + n) lies inside view(); the offset of p in view() (throws if outside).
  bool contains(const void* p, size_t n) const noexcept;
  size_t view_offset_of(const void* p) const;

  size_t dirty_lines() const noexcept;
  const NoncoherentCounters& counters() const noexcept { return counters_; }
  // FNV-1a over the indices of the lines evicted so far: equal for equal seeds and calls.
  uint64_t eviction_digest() const noexcept { return eviction_digest_; }

 private:
  void check_range(const char* what, size_t off, size_t n) const;
  bool line_dirty(size_t line) const noexcept;
  void write_back(size_t line) noexcept;
  void refresh(size_t line) noexcept;
  void evict() noexcept;
  uint64_t next_random() noexcept;

  std::byte* shared_;
  size_t len_;
  std::byte* shadow_ = nullptr;
  std::byte* snapshot_ = nullptr;
  uint64_t rng_;
  NoncoherentOptions options_;
  NoncoherentCounters counters_;
  uint64_t eviction_digest_ = 14695981039346656037ull;
};

}  // namespace cxlpool::detail::shared

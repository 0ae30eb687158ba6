// SPDX-License-Identifier: MIT
// NoncoherentView: a private shadow and a clean snapshot per host (anonymous memory); dirty
// lines are found by comparing the two, and written back or reloaded whole, like cache lines.
#include "shared/noncoherent_view.hpp"

#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "os/os.hpp"
#include "shared/coherence.hpp"

namespace cxlpool::detail::shared {
namespace {

using detail::fail;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

NoncoherentView::NoncoherentView(std::byte* shared_bytes, size_t len, uint64_t seed, NoncoherentOptions options)
    : shared_(shared_bytes), len_(len), rng_(seed), options_(options) {
  if (shared_bytes == nullptr) fail(CXLPOOL_E_INVALID_ARGUMENT, "NoncoherentView: the shared range is null");
  if (reinterpret_cast<uintptr_t>(shared_bytes) % kLineSize != 0)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         "NoncoherentView: shared range " + hex(shared_bytes) + " is not aligned to a 64-byte cache line");
  if (len == 0 || len % kLineSize != 0)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         "NoncoherentView: length " + std::to_string(len) + " is not a positive multiple of 64 bytes");
  shadow_ = static_cast<std::byte*>(os::map_metadata(len));
  try {
    snapshot_ = static_cast<std::byte*>(os::map_metadata(len));
  } catch (...) {
    os::unmap(shadow_, len);
    throw;
  }
  std::memcpy(shadow_, shared_, len);
  std::memcpy(snapshot_, shared_, len);
}

NoncoherentView::~NoncoherentView() {
  os::unmap(shadow_, len_);
  os::unmap(snapshot_, len_);
}

void NoncoherentView::check_range(const char* what, size_t off, size_t n) const {
  if (off > len_ || n > len_ - off)
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string("NoncoherentView::") + what + ": range [" + std::to_string(off) +
                                         ", +" + std::to_string(n) + ") leaves the view of " + std::to_string(len_) +
                                         " bytes");
}

bool NoncoherentView::line_dirty(size_t line) const noexcept {
  return std::memcmp(shadow_ + line * kLineSize, snapshot_ + line * kLineSize, kLineSize) != 0;
}

void NoncoherentView::write_back(size_t line) noexcept {
  std::byte* out = shared_ + line * kLineSize;
  std::byte* snap = snapshot_ + line * kLineSize;
  if (std::memcmp(out, snap, kLineSize) != 0) ++counters_.conflicting_writebacks;
  std::memcpy(out, shadow_ + line * kLineSize, kLineSize);
  std::memcpy(snap, shadow_ + line * kLineSize, kLineSize);
  ++counters_.lines_written_back;
}

void NoncoherentView::refresh(size_t line) noexcept {
  const std::byte* in = shared_ + line * kLineSize;
  std::memcpy(shadow_ + line * kLineSize, in, kLineSize);
  std::memcpy(snapshot_ + line * kLineSize, in, kLineSize);
  ++counters_.lines_refreshed;
}

// splitmix64: any seed (0 included) gives a full-period, well-mixed sequence.
uint64_t NoncoherentView::next_random() noexcept {
  uint64_t z = (rng_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void NoncoherentView::evict() noexcept {
  const size_t lines = len_ / kLineSize;
  for (size_t i = 0; i < options_.evict_per_call; ++i) {
    size_t line = next_random() % lines;
    if (line_dirty(line))
      write_back(line);
    else
      refresh(line);
    ++counters_.lines_evicted;
    eviction_digest_ = (eviction_digest_ ^ line) * 1099511628211ull;
  }
}

void NoncoherentView::publish(size_t off, size_t n) {
  check_range("publish", off, n);
  evict();
  if (n == 0) return;
  for (size_t line = off / kLineSize, last = (off + n - 1) / kLineSize; line <= last; ++line)
    if (line_dirty(line)) write_back(line);
}

void NoncoherentView::acquire(size_t off, size_t n) {
  check_range("acquire", off, n);
  evict();
  if (n == 0) return;
  for (size_t line = off / kLineSize, last = (off + n - 1) / kLineSize; line <= last; ++line) {
    if (line_dirty(line)) write_back(line);
    refresh(line);
  }
}

bool NoncoherentView::contains(const void* p, size_t n) const noexcept {
  auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(shadow_);
  return a >= base && a - base <= len_ && n <= len_ - (a - base);
}

size_t NoncoherentView::view_offset_of(const void* p) const {
  if (!contains(p, 1))
    fail(CXLPOOL_E_INVALID_ARGUMENT, "NoncoherentView::view_offset_of: " + hex(p) + " is outside the view at " +
                                         hex(shadow_) + " (" + std::to_string(len_) + " bytes)");
  return static_cast<size_t>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(shadow_));
}

size_t NoncoherentView::dirty_lines() const noexcept {
  size_t dirty = 0;
  for (size_t line = 0; line < len_ / kLineSize; ++line) dirty += line_dirty(line) ? 1 : 0;
  return dirty;
}

}  // namespace cxlpool::detail::shared

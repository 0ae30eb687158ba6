// SPDX-License-Identifier: MIT
// Cache-line primitives for far memory shared by hosts without cross-host coherence (CXL 2.0
// multi-headed devices): write lines back after writing (publish side) and flush them before
// reading (acquire side). The instruction is chosen at run time by cpuid; docs/shared.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::detail::shared {

inline constexpr size_t kLineSize = 64;

// Number of kLineSize lines touching [addr, addr + n): 0 when n == 0.
constexpr size_t lines_spanned(uintptr_t addr, size_t n) noexcept {
  if (n == 0) return 0;
  uintptr_t first = addr / kLineSize, last = (addr + n - 1) / kLineSize;
  return static_cast<size_t>(last - first + 1);
}

// A line operation. kNone: no cache-line instruction (non-x86 builds; only fences are issued).
enum class LineOp : uint8_t { kNone, kClflush, kClflushopt, kClwb };

// What cpuid reports, probed once on first use (thread-safe, no allocation).
struct FlushSupport {
  bool clflush = false;
  bool clflushopt = false;
  bool clwb = false;
};
const FlushSupport& flush_support() noexcept;

// The instruction writeback_lines uses: clwb, else clflushopt, else clflush.
LineOp writeback_op() noexcept;
// The instruction invalidate_lines uses: clflushopt, else clflush.
LineOp invalidate_op() noexcept;
// "clwb", "clflushopt", "clflush" or "none", for diagnostics.
const char* line_op_name(LineOp op) noexcept;

// Publish: writes back every line touching [p, p + n) (the line may stay cached), then
// sfence, so the bytes reach the device before any later store. n == 0: nothing at all.
void writeback_lines(const void* p, size_t n) noexcept;
// Acquire: flushes every line touching [p, p + n) out of this host's caches, then mfence, so
// later loads read the device. x86 cannot drop a line without writing it back: a dirty line
// here is also written back (a reader must not dirty lines it does not own). n == 0: nothing.
void invalidate_lines(const void* p, size_t n) noexcept;
// The bare loop: op on every line touching [p, p + n), no fence. op must be one flush_support()
// reports (an unsupported one raises SIGILL); kNone does nothing. For tests and benchmarks.
void apply_line_op(LineOp op, const void* p, size_t n) noexcept;
// Orders every earlier load, store and line flush before every later one (mfence).
void full_fence() noexcept;

}  // namespace cxlpool::detail::shared

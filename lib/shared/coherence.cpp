// SPDX-License-Identifier: MIT
// Line write-back and flush over inline asm (mnemonics gas accepts without -mclwb or
// -mclflushopt: the choice is made at run time from cpuid). Non-x86 builds issue fences only.
#include "shared/coherence.hpp"

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CXLPOOL_SHARED_X86 1
#else
#define CXLPOOL_SHARED_X86 0
#endif

namespace cxlpool::detail::shared {
namespace {

#if CXLPOOL_SHARED_X86
FlushSupport probe() noexcept {
  FlushSupport s;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) s.clflush = (d >> 19) & 1u;  // CPUID.1:EDX.CLFSH
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    s.clflushopt = (b >> 23) & 1u;  // CPUID.(7,0):EBX.CLFLUSHOPT
    s.clwb = (b >> 24) & 1u;        // CPUID.(7,0):EBX.CLWB
  }
  return s;
}

// The "memory" clobber keeps the compiler from moving stores to the line across the flush.
inline void line_clwb(uintptr_t a) noexcept { asm volatile("clwb (%0)" ::"r"(a) : "memory"); }
inline void line_clflushopt(uintptr_t a) noexcept { asm volatile("clflushopt (%0)" ::"r"(a) : "memory"); }
inline void line_clflush(uintptr_t a) noexcept { asm volatile("clflush (%0)" ::"r"(a) : "memory"); }
inline void store_fence() noexcept { asm volatile("sfence" ::: "memory"); }
inline void memory_fence() noexcept { asm volatile("mfence" ::: "memory"); }
#else
FlushSupport probe() noexcept { return {}; }
inline void line_clwb(uintptr_t) noexcept {}
inline void line_clflushopt(uintptr_t) noexcept {}
inline void line_clflush(uintptr_t) noexcept {}
inline void store_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void memory_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

template <void (*Op)(uintptr_t) noexcept>
void each_line(const void* p, size_t n) noexcept {
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = start + n;
  for (uintptr_t a = start & ~uintptr_t{kLineSize - 1}; a < end; a += kLineSize) Op(a);
}

}  // namespace

const FlushSupport& flush_support() noexcept {
  static const FlushSupport support = probe();
  return support;
}

LineOp writeback_op() noexcept {
  const FlushSupport& s = flush_support();
  return s.clwb ? LineOp::kClwb : s.clflushopt ? LineOp::kClflushopt : s.clflush ? LineOp::kClflush : LineOp::kNone;
}

LineOp invalidate_op() noexcept {
  const FlushSupport& s = flush_support();
  return s.clflushopt ? LineOp::kClflushopt : s.clflush ? LineOp::kClflush : LineOp::kNone;
}

const char* line_op_name(LineOp op) noexcept {
  switch (op) {
    case LineOp::kClwb:
      return "clwb";
    case LineOp::kClflushopt:
      return "clflushopt";
    case LineOp::kClflush:
      return "clflush";
    case LineOp::kNone:
      break;
  }
  return "none";
}

void apply_line_op(LineOp op, const void* p, size_t n) noexcept {
  switch (op) {
    case LineOp::kClwb:
      each_line<line_clwb>(p, n);
      break;
    case LineOp::kClflushopt:
      each_line<line_clflushopt>(p, n);
      break;
    case LineOp::kClflush:
      each_line<line_clflush>(p, n);
      break;
    case LineOp::kNone:
      break;
  }
}

void writeback_lines(const void* p, size_t n) noexcept {
  if (n == 0) return;
  apply_line_op(writeback_op(), p, n);
  store_fence();
}

void invalidate_lines(const void* p, size_t n) noexcept {
  if (n == 0) return;
  apply_line_op(invalidate_op(), p, n);
  memory_fence();
}

void full_fence() noexcept { memory_fence(); }

}  // namespace cxlpool::detail::shared

// SPDX-License-Identifier: MIT
// The kernels (kernels_impl.hpp) compiled with -mavx2 -mfma -mf16c (lib/engine/CMakeLists.txt):
// used only when the CPU has all three. Elsewhere than x86-64 there are none.
#include <cstring>

#include "cxlpool/kvcache.h"
#include "engine/half.hpp"
#include "engine/kernels.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

namespace cxlpool::engine {
namespace avx2 {
#define KERNELS_NAME "avx2+fma+f16c"
#include "engine/kernels_impl.hpp"
#undef KERNELS_NAME
}  // namespace avx2

const Kernels* avx2_kernels() {
  __builtin_cpu_init();
  // F16C from cpuid leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports names it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return &avx2::kTable;
  return nullptr;
}

}  // namespace cxlpool::engine
#else
namespace cxlpool::engine {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace cxlpool::engine
#endif

// SPDX-License-Identifier: MIT
// The kernels (kernels_impl.hpp) compiled with -mavx2 -mfma -mf16c (lib/engine/CMakeLists.txt):
// used only when the CPU has all three.
#include <immintrin.h>

#include <cstring>

#include "cxlpool/kvcache.h"
#include "engine/half.hpp"
#include "engine/kernels.hpp"

namespace cxlpool::engine {
namespace avx2 {
#define KERNELS_NAME "avx2+fma+f16c"
#include "engine/kernels_impl.hpp"
#undef KERNELS_NAME
}  // namespace avx2

const Kernels* avx2_kernels() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return &avx2::kTable;
  return nullptr;
}

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// The kernels (kernels_impl.hpp) for any x86-64 (SSE2), and the choice between them and the
// AVX2 ones by the CPU's features.
#include <cstring>

#include "cxlpool/kvcache.h"
#include "engine/half.hpp"
#include "engine/kernels.hpp"

namespace cxlpool::engine {
namespace generic {
#define KERNELS_NAME "generic"
#include "engine/kernels_impl.hpp"
#undef KERNELS_NAME
}  // namespace generic

const Kernels& generic_kernels() { return generic::kTable; }

const Kernels& kernels() {
  static const Kernels* chosen = avx2_kernels() ? avx2_kernels() : &generic_kernels();
  return *chosen;
}

}  // namespace cxlpool::engine

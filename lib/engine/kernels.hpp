// SPDX-License-Identifier: MIT
// The engine's inner loops, compiled twice (kernels_generic.cpp for any x86-64,
// kernels_avx2.cpp with AVX2, FMA and F16C) and picked once at startup by the CPU's features.
// Each output element is computed by the same sequence of operations whatever the tile it
// falls in, the batch size or the thread count: a token's logits are the same bits whether it
// was computed in a prefill batch or alone in a decode step (the prefill and decode servers
// must agree with one process exactly).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::engine {

// One (head, tile of queries) of causal attention over rows of keys and values in KV blocks.
struct AttendTask {
  const float* q = nullptr;  // query rows (already scaled), q_stride floats apart, this head's slice first
  size_t q_stride = 0;
  size_t nq = 0;
  const uint64_t* qpos = nullptr;                 // each query's position; queries attend to 0..qpos
  const unsigned char* const* anchors = nullptr;  // per position: its token's slot in its block
  uint64_t k_offset = 0, v_offset = 0;            // + these bytes: this head's key, value (head_dim elements)
  uint32_t kv_dtype = 0;                          // cxlpool_kv_dtype_t: FP32, FP16 or BF16
  size_t head_dim = 0;
  float* out = nullptr;  // nq rows, out_stride floats apart, this head's slice first
  size_t out_stride = 0;
  float* scratch = nullptr;  // nq * (max qpos + 1) + head_dim floats
};

struct Kernels {
  const char* name;
  // y[r][c] = b[c] + sum_k x[r][k] w[c][k], for rows 0..n-1 and columns c0..c1-1 (w: [out][in]).
  void (*linear_cols)(const float* x, size_t n, size_t in, const float* w, const float* b, size_t c0, size_t c1,
                      size_t out, float* y);
  void (*attend)(const AttendTask& t);
  // Rows of KV elements to and from fp32 (store rounds to nearest even).
  void (*load_row)(const unsigned char* src, uint32_t dtype, size_t n, float* dst);
  void (*store_row)(const float* src, uint32_t dtype, size_t n, unsigned char* dst);
};

// The best kernels for this CPU (AVX2+FMA+F16C or generic), chosen once.
const Kernels& kernels();
// Both, for tests.
const Kernels& generic_kernels();
const Kernels* avx2_kernels();  // nullptr when this CPU lacks the features

}  // namespace cxlpool::engine

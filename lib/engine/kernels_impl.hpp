// SPDX-License-Identifier: MIT
// The bodies of the kernels (kernels.hpp), included by kernels_generic.cpp and
// kernels_avx2.cpp into a namespace of their own, each compiled for its instruction set. GCC's
// vector extension (8 floats) keeps one source for both: SSE2 pairs or one AVX2 register.
// Every dot product accumulates k = 8j + l in lane l, then adds the lanes in a fixed order,
// then the tail: the same for every tile shape.
// Included inside a namespace: the including file brings <cstring>, <immintrin.h> (AVX2 only),
// cxlpool/kvcache.h and engine/half.hpp first.
typedef float V8 __attribute__((vector_size(32)));

static inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static inline float hsum(V8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// A tile of R rows by C columns; every element as dot(x_r, w_c) of kernels_impl's rule.
template <int R, int C>
static inline void tile(const float* x, size_t in, const float* w, const float* b, size_t r0, size_t c0, size_t out,
                        float* y) {
  V8 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = V8{};
  const size_t k8 = in / 8 * 8;
  for (size_t k = 0; k < k8; k += 8) {
    V8 xv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xv[r] = load8(x + (r0 + size_t(r)) * in + k);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const V8 wv = load8(w + (c0 + size_t(c)) * in + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][c] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const float* xr = x + (r0 + size_t(r)) * in;
      const float* wc = w + (c0 + size_t(c)) * in;
      float s = hsum(acc[r][c]);
      for (size_t k = k8; k < in; ++k) s += xr[k] * wc[k];
      y[(r0 + size_t(r)) * out + c0 + size_t(c)] = s + (b ? b[c0 + size_t(c)] : 0.0f);
    }
}

template <int R>
static inline void tile_cols(const float* x, size_t in, const float* w, const float* b, size_t r0, size_t c0, size_t c1,
                             size_t out, float* y) {
  size_t c = c0;
  for (; c + 4 <= c1; c += 4) tile<R, 4>(x, in, w, b, r0, c, out, y);
  for (; c < c1; ++c) tile<R, 1>(x, in, w, b, r0, c, out, y);
}

static void linear_cols(const float* x, size_t n, size_t in, const float* w, const float* b, size_t c0, size_t c1,
                        size_t out, float* y) {
  // Columns in blocks of 64 (a block of w stays in L2 while every row passes over it).
  for (size_t cb = c0; cb < c1; cb += 64) {
    const size_t ce = cb + 64 < c1 ? cb + 64 : c1;
    size_t r = 0;
    for (; r + 3 <= n; r += 3) tile_cols<3>(x, in, w, b, r, cb, ce, out, y);
    for (; r < n; ++r) tile_cols<1>(x, in, w, b, r, cb, ce, out, y);
  }
}

static void load_row(const unsigned char* src, uint32_t dtype, size_t n, float* dst) {
  if (dtype == CXLPOOL_KV_FP32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  size_t i = 0;
  if (dtype == CXLPOOL_KV_FP16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
#endif
    for (; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = cxlpool::engine::fp16_to_float(h);
    }
    return;
  }
  for (; i < n; ++i) {  // bf16: a shift, vectorised by the compiler
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = cxlpool::engine::bf16_to_float(h);
  }
}

static void store_row(const float* src, uint32_t dtype, size_t n, unsigned char* dst) {
  if (dtype == CXLPOOL_KV_FP32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  size_t i = 0;
  if (dtype == CXLPOOL_KV_FP16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; ++i) {
      const uint16_t h = cxlpool::engine::float_to_fp16(src[i]);
      std::memcpy(dst + 2 * i, &h, 2);
    }
    return;
  }
  for (; i < n; ++i) {
    const uint16_t h = cxlpool::engine::float_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

static inline float dot(const float* a, const float* b, size_t n) {
  V8 acc = V8{};
  const size_t n8 = n / 8 * 8;
  for (size_t k = 0; k < n8; k += 8) acc += load8(a + k) * load8(b + k);
  float s = hsum(acc);
  for (size_t k = n8; k < n; ++k) s += a[k] * b[k];
  return s;
}

// Causal attention for a tile of queries of one head, reading keys and values in place: each
// position's row is converted once for the whole tile. Per query: scores in position order,
// the maximum, exp and their sum in position order, the values weighted in position order,
// then divided by the sum: the same operations whichever tile the query is in.
static void attend(const cxlpool::engine::AttendTask& t) {
  const size_t hd = t.head_dim;
  uint64_t last = 0;
  for (size_t i = 0; i < t.nq; ++i) last = t.qpos[i] > last ? t.qpos[i] : last;
  const size_t span = size_t(last) + 1;
  float* scores = t.scratch;  // [nq][span]
  float* row = t.scratch + t.nq * span;
  for (size_t p = 0; p < span; ++p) {
    load_row(t.anchors[p] + t.k_offset, t.kv_dtype, hd, row);
    for (size_t i = 0; i < t.nq; ++i)
      if (p <= t.qpos[i]) scores[i * span + p] = dot(t.q + i * t.q_stride, row, hd);
  }
  for (size_t i = 0; i < t.nq; ++i) {
    float* s = scores + i * span;
    const size_t n = size_t(t.qpos[i]) + 1;
    float m = s[0];
    for (size_t p = 1; p < n; ++p) m = s[p] > m ? s[p] : m;
    for (size_t p = 0; p < n; ++p) s[p] = __builtin_expf(s[p] - m);
    float* o = t.out + i * t.out_stride;
    for (size_t d = 0; d < hd; ++d) o[d] = 0;
  }
  for (size_t p = 0; p < span; ++p) {
    load_row(t.anchors[p] + t.v_offset, t.kv_dtype, hd, row);
    for (size_t i = 0; i < t.nq; ++i) {
      if (p > t.qpos[i]) continue;
      const float e = scores[i * span + p];
      float* o = t.out + i * t.out_stride;
      for (size_t d = 0; d < hd; ++d) o[d] += e * row[d];
    }
  }
  for (size_t i = 0; i < t.nq; ++i) {
    const float* s = scores + i * span;
    const size_t n = size_t(t.qpos[i]) + 1;
    float sum = 0;
    for (size_t p = 0; p < n; ++p) sum += s[p];
    const float inv = 1.0f / sum;
    float* o = t.out + i * t.out_stride;
    for (size_t d = 0; d < hd; ++d) o[d] *= inv;
  }
}

static const cxlpool::engine::Kernels kTable = {KERNELS_NAME, linear_cols, attend, load_row, store_row};

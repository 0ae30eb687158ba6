// SPDX-License-Identifier: MIT
// Attention over KV blocks (attention.hpp): one task per (head, tile of 16 queries); the tile
// shares each key and value row it converts (kernels.hpp, attend).
#include "engine/attention.hpp"

#include <vector>

#include "engine/error.hpp"
#include "engine/kernels.hpp"

namespace cxlpool::engine {

void attention(ThreadPool& pool, const KvStore& kv, uint32_t layer, const float* q, size_t n, uint64_t first,
               float* out) {
  const cxlpool_kv_geometry_t& g = kv.geometry();
  const size_t heads = g.kv_heads, hd = g.head_dim, d = heads * hd;
  const uint64_t span = first + n;
  if (span > kv.tokens())
    fail("attention: positions up to " + std::to_string(span) + " asked of a store of " + std::to_string(kv.tokens()));
  std::vector<const unsigned char*> anchors;
  kv.anchors(span, &anchors);
  const size_t esize = g.dtype == CXLPOOL_KV_FP32 ? 4 : 2;
  constexpr size_t kTile = 16;
  const size_t tiles = (n + kTile - 1) / kTile;
  const Kernels& k = kernels();
  pool.run(heads * tiles, [&](size_t task) {
    const size_t h = task / tiles, i0 = (task % tiles) * kTile;
    const size_t nq = std::min(kTile, n - i0);
    std::vector<uint64_t> qpos(nq);
    for (size_t i = 0; i < nq; ++i) qpos[i] = first + i0 + i;
    std::vector<float> scratch(nq * size_t(qpos[nq - 1] + 1) + hd);
    AttendTask t;
    t.q = q + i0 * d + h * hd;
    t.q_stride = d;
    t.nq = nq;
    t.qpos = qpos.data();
    t.anchors = anchors.data();
    t.k_offset = kv.layer_offset(layer, 0) + h * hd * esize;
    t.v_offset = kv.layer_offset(layer, 1) + h * hd * esize;
    t.kv_dtype = g.dtype;
    t.head_dim = hd;
    t.out = out + i0 * d + h * hd;
    t.out_stride = d;
    t.scratch = scratch.data();
    k.attend(t);
  });
}

}  // namespace cxlpool::engine

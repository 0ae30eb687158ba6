// SPDX-License-Identifier: MIT
// Causal multi-head attention whose keys and values are read in place from cxlpool KV blocks
// (KvStore): the queries of positions first..first+n-1 attend to positions 0..their own, every
// key and value row read where the prefill (or an earlier decode step) wrote it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/kv_store.hpp"
#include "engine/thread_pool.hpp"

namespace cxlpool::engine {

// q: n rows of heads x head_dim floats (already scaled by 1/sqrt(head_dim)); out: the same
// shape. The store must hold positions 0..first+n-1 of `layer`.
void attention(ThreadPool& pool, const KvStore& kv, uint32_t layer, const float* q, size_t n, uint64_t first,
               float* out);

}  // namespace cxlpool::engine

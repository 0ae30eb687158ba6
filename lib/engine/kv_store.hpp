// SPDX-License-Identifier: MIT
// Where a forward pass reads and writes keys and values: cxlpool KV blocks, in place, in the
// layout cxlpool_kv_block_offset gives. A KvStore is a run of segments in position order: an
// imported (or landed) view's blocks, read-only, then at most one sequence of an arena whose
// blocks this process writes. The decode server's KV is [the prefill server's exported blocks]
// + [its own sequence for the tokens it generates]; one process doing everything has one
// sequence. Nothing is copied out of the blocks: attention converts each row as it reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cxlpool/kvcache.h"

namespace cxlpool::engine {

class KvStore {
 public:
  // The geometry's dtype must be FP32, FP16 or BF16 (the engine computes in fp32).
  explicit KvStore(const cxlpool_kv_geometry_t& geometry);

  const cxlpool_kv_geometry_t& geometry() const { return g_; }
  uint64_t row_bytes() const { return row_bytes_; }  // one token's heads of one layer, K or V
  // Tokens whose keys and values are in the store (positions 0..tokens-1).
  uint64_t tokens() const;

  // A read-only segment: the view's tokens continue the store (before any sequence).
  void add_view(const cxlpool_kv_view_t* view);
  // The writable end: seq's tokens continue the store from its current end (seq may be empty,
  // or hold tokens already: the caller's own prefix). The sequence stays the caller's.
  void add_sequence(cxlpool_kv_seq_t* seq);
  // Appends tokens to the sequence (cxlpool_kv_seq_append: whole blocks found in the prefix
  // cache are shared); returns how many leading ones already have their keys and values.
  size_t append(const int32_t* tokens, size_t n);
  cxlpool_kv_seq_t* sequence() const { return seq_; }

  // The row of `layer` (kv: 0 keys, 1 values) for position pos, in the block.
  const unsigned char* row(uint32_t layer, uint32_t kv, uint64_t pos) const;
  // The same, to be written; only positions of the sequence that it did not share.
  unsigned char* writable_row(uint32_t layer, uint32_t kv, uint64_t pos) const;
  // Per position 0..n-1, the address of its token's slot in its block (add layer_offset()).
  void anchors(uint64_t n, std::vector<const unsigned char*>* out) const;
  uint64_t layer_offset(uint32_t layer, uint32_t kv) const { return offsets_[size_t(layer) * 2 + kv]; }

 private:
  struct Segment {
    uint64_t first = 0, tokens = 0;
    std::vector<unsigned char*> blocks;
    bool writable = false;
  };
  void refresh_sequence();
  const Segment& segment_of(uint64_t pos) const;

  cxlpool_kv_geometry_t g_;
  uint64_t row_bytes_ = 0, block_bytes_ = 0;
  std::vector<uint64_t> offsets_;  // cxlpool_kv_block_offset(layer, kv, token 0)
  std::vector<Segment> segments_;
  cxlpool_kv_seq_t* seq_ = nullptr;
};

// Throws engine::Error with cxlpool's last error when st is not CXLPOOL_OK.
void check_cxlpool(cxlpool_status_t st, const char* what);

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// KV blocks as the engine sees them (kv_store.hpp). The layout is asked of libcxlpool
// (cxlpool_kv_block_offset) and checked once: a token's rows are row_bytes apart inside a
// layer's keys or values, which is what lets attention step through a block by pointer.
#include "engine/kv_store.hpp"

#include "engine/error.hpp"

namespace cxlpool::engine {

void check_cxlpool(cxlpool_status_t st, const char* what) {
  if (st != CXLPOOL_OK) fail(std::string(what) + ": " + cxlpool_last_error_message());
}

KvStore::KvStore(const cxlpool_kv_geometry_t& geometry) : g_(geometry) {
  if (g_.dtype != CXLPOOL_KV_FP32 && g_.dtype != CXLPOOL_KV_FP16 && g_.dtype != CXLPOOL_KV_BF16)
    fail("KV store: dtype " + std::to_string(g_.dtype) + " is not computed by the engine (FP32, FP16 or BF16)");
  uint64_t per_token = 0;
  check_cxlpool(cxlpool_kv_geometry_sizes(&g_, &per_token, &block_bytes_), "KV store: geometry");
  row_bytes_ = per_token / (2 * uint64_t(g_.layers));
  for (uint32_t l = 0; l < g_.layers; ++l)
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint64_t base = 0;
      check_cxlpool(cxlpool_kv_block_offset(&g_, l, kv, 0, &base), "KV store: block offset");
      if (g_.tokens_per_block > 1) {
        uint64_t last = 0;
        check_cxlpool(cxlpool_kv_block_offset(&g_, l, kv, g_.tokens_per_block - 1, &last), "KV store: block offset");
        if (last != base + (g_.tokens_per_block - 1) * row_bytes_ || last + row_bytes_ > block_bytes_)
          fail("KV store: cxlpool_kv_block_offset's layout is not [layer][kv][token][head][head_dim]");
      }
      offsets_.push_back(base);
    }
}

uint64_t KvStore::tokens() const { return segments_.empty() ? 0 : segments_.back().first + segments_.back().tokens; }

void KvStore::add_view(const cxlpool_kv_view_t* view) {
  if (seq_) fail("KV store: a view cannot follow the sequence");
  cxlpool_kv_view_info_t info{};
  check_cxlpool(cxlpool_kv_view_info(view, &info), "KV store: view info");
  const cxlpool_kv_geometry_t& v = info.geometry;
  if (v.layers != g_.layers || v.kv_heads != g_.kv_heads || v.head_dim != g_.head_dim || v.dtype != g_.dtype ||
      v.tokens_per_block != g_.tokens_per_block)
    fail("KV store: the view's geometry differs from the model's");
  Segment s;
  s.first = tokens();
  s.tokens = info.tokens;
  for (uint64_t b = 0; b < info.blocks; ++b) {
    const void* data = nullptr;
    check_cxlpool(cxlpool_kv_view_block(view, b, &data), "KV store: view block");
    // Read only: the blocks are the exporter's (writable_row refuses this segment).
    s.blocks.push_back(static_cast<unsigned char*>(const_cast<void*>(data)));
  }
  segments_.push_back(std::move(s));
}

void KvStore::add_sequence(cxlpool_kv_seq_t* seq) {
  if (seq_) fail("KV store: one sequence at most");
  seq_ = seq;
  Segment s;
  s.first = tokens();
  s.writable = true;
  segments_.push_back(std::move(s));
  refresh_sequence();
}

void KvStore::refresh_sequence() {
  // Block pointers are valid until the next append (cxlpool_kv_seq_block): asked again.
  Segment& s = segments_.back();
  cxlpool_kv_seq_info_t info{};
  check_cxlpool(cxlpool_kv_seq_info(seq_, &info), "KV store: sequence info");
  s.tokens = info.tokens;
  s.blocks.clear();
  for (uint64_t b = 0; b < info.blocks; ++b) {
    void* data = nullptr;
    check_cxlpool(cxlpool_kv_seq_block(seq_, b, &data, nullptr), "KV store: sequence block");
    s.blocks.push_back(static_cast<unsigned char*>(data));
  }
}

size_t KvStore::append(const int32_t* tokens, size_t n) {
  if (!seq_) fail("KV store: no sequence to append to");
  size_t reused = 0;
  check_cxlpool(cxlpool_kv_seq_append(seq_, tokens, n, &reused), "KV store: append");
  refresh_sequence();
  return reused;
}

const KvStore::Segment& KvStore::segment_of(uint64_t pos) const {
  for (const Segment& s : segments_)
    if (pos >= s.first && pos < s.first + s.tokens) return s;
  fail("KV store: position " + std::to_string(pos) + " beyond its " + std::to_string(tokens()) + " tokens");
}

const unsigned char* KvStore::row(uint32_t layer, uint32_t kv, uint64_t pos) const {
  const Segment& s = segment_of(pos);
  const uint64_t i = pos - s.first;
  return s.blocks[size_t(i / g_.tokens_per_block)] + layer_offset(layer, kv) + (i % g_.tokens_per_block) * row_bytes_;
}

unsigned char* KvStore::writable_row(uint32_t layer, uint32_t kv, uint64_t pos) const {
  const Segment& s = segment_of(pos);
  if (!s.writable) fail("KV store: position " + std::to_string(pos) + " is in a read-only view");
  const uint64_t i = pos - s.first;
  return s.blocks[size_t(i / g_.tokens_per_block)] + layer_offset(layer, kv) + (i % g_.tokens_per_block) * row_bytes_;
}

void KvStore::anchors(uint64_t n, std::vector<const unsigned char*>* out) const {
  if (n > tokens()) fail("KV store: " + std::to_string(n) + " positions asked of " + std::to_string(tokens()));
  out->resize(size_t(n));
  for (const Segment& s : segments_)
    for (uint64_t i = 0; i < s.tokens && s.first + i < n; ++i)
      (*out)[size_t(s.first + i)] = s.blocks[size_t(i / g_.tokens_per_block)] + (i % g_.tokens_per_block) * row_bytes_;
}

}  // namespace cxlpool::engine

// SPDX-License-Identifier: MIT
// The KV remote protocol (libcxlpool_ucx) on the wire: UCX active messages between a consumer
// and a producer's server. FETCH (consumer -> server: a kv handle), REPLY (server -> consumer:
// a status and message, or the sequence's geometry, the registered regions with their packed
// rkeys and every block's remote address), DONE (consumer -> server: drop the leases). Both
// sides run the same build; every length and count is still checked before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/kvcache.h"

namespace cxlpool::ucx {

inline constexpr uint64_t kWireMagic = 0x314d52564b4c5843ull;  // "CXLKVRM1"
inline constexpr uint32_t kWireVersion = 1;
inline constexpr unsigned kAmFetch = 0x6b31, kAmReply = 0x6b32, kAmDone = 0x6b33;
inline constexpr uint32_t kMaxRegions = 16;
inline constexpr uint32_t kMaxRkeyBytes = 4096;
inline constexpr uint64_t kMaxBlocks = 1u << 20;
inline constexpr uint32_t kMaxMessage = 1024;

struct FetchRequest {
  uint64_t magic;
  uint32_t version;
  uint32_t has_expected;
  uint64_t request_id;
  cxlpool_kv_handle_t handle;
  cxlpool_kv_geometry_t expected;
};

struct DoneMessage {
  uint64_t magic;
  uint64_t request_id;
};

struct ReplyHeader {
  uint64_t magic;
  uint32_t version;
  int32_t status;  // cxlpool_status_t; not OK: message_bytes of message follow, nothing else
  uint64_t request_id;
  cxlpool_kv_geometry_t geometry;
  uint64_t tokens;
  uint64_t blocks;
  uint64_t block_bytes;
  uint32_t regions;
  uint32_t message_bytes;
};
// Then, for status OK: `regions` RegionEntry, each followed by its rkey (rkey_bytes, padded to
// 8), then `blocks` BlockEntry.
struct RegionEntry {
  uint64_t base;
  uint64_t size;
  uint32_t rkey_bytes;
  uint32_t reserved;
};
struct BlockEntry {
  uint64_t address;
  uint32_t region;
  uint32_t reserved;
};

inline size_t pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// A reply as the consumer reads it: validated, rkeys still packed.
struct Reply {
  ReplyHeader header{};
  std::string message;
  struct Region {
    uint64_t base, size;
    std::vector<unsigned char> rkey;
  };
  std::vector<Region> regions;
  std::vector<BlockEntry> blocks;
};

// Parses and validates a REPLY of n bytes; false with *why naming the first thing wrong.
inline bool parse_reply(const void* data, size_t n, Reply* out, std::string* why) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t at = 0;
  auto take = [&](void* dst, size_t len) {
    if (n - at < len) return false;
    std::memcpy(dst, p + at, len);
    at += len;
    return true;
  };
  ReplyHeader& h = out->header;
  if (!take(&h, sizeof h)) return *why = "shorter than its header (" + std::to_string(n) + " bytes)", false;
  if (h.magic != kWireMagic || h.version != kWireVersion) return *why = "not a cxlpool KV reply (magic/version)", false;
  if (h.status != CXLPOOL_OK) {
    if (h.message_bytes > kMaxMessage || n - at < h.message_bytes) return *why = "its error message overruns it", false;
    out->message.assign(reinterpret_cast<const char*>(p + at), h.message_bytes);
    return true;
  }
  if (h.regions == 0 || h.regions > kMaxRegions) return *why = std::to_string(h.regions) + " regions", false;
  if (h.blocks == 0 || h.blocks > kMaxBlocks) return *why = std::to_string(h.blocks) + " blocks", false;
  out->regions.resize(h.regions);
  for (auto& r : out->regions) {
    RegionEntry e;
    if (!take(&e, sizeof e)) return *why = "a region entry overruns it", false;
    if (e.rkey_bytes == 0 || e.rkey_bytes > kMaxRkeyBytes || n - at < pad8(e.rkey_bytes))
      return *why = "a region's rkey (" + std::to_string(e.rkey_bytes) + " bytes) overruns it", false;
    if (e.size == 0 || e.base + e.size < e.base) return *why = "a region wraps or is empty", false;
    r.base = e.base;
    r.size = e.size;
    r.rkey.assign(p + at, p + at + e.rkey_bytes);
    at += pad8(e.rkey_bytes);
  }
  if ((n - at) / sizeof(BlockEntry) != h.blocks || (n - at) % sizeof(BlockEntry) != 0)
    return *why = "its block list does not hold " + std::to_string(h.blocks) + " blocks", false;
  out->blocks.resize(size_t(h.blocks));
  std::memcpy(out->blocks.data(), p + at, size_t(h.blocks) * sizeof(BlockEntry));
  for (size_t i = 0; i < out->blocks.size(); ++i) {
    const BlockEntry& b = out->blocks[i];
    if (b.region >= h.regions) return *why = "block " + std::to_string(i) + " names no region", false;
    const Reply::Region& r = out->regions[b.region];
    if (b.address < r.base || h.block_bytes > r.size || b.address - r.base > r.size - h.block_bytes)
      return *why = "block " + std::to_string(i) + " lies outside its registered region", false;
  }
  return true;
}

}  // namespace cxlpool::ucx

// SPDX-License-Identifier: MIT
// Encoders and decoders of the shared pool's self-checking words (see layout.hpp), CRC32C,
// and the small-block geometry.
#include "shared/layout.hpp"

#include <array>
#include <cstring>

#include "common/random.hpp"

namespace cxlpool::detail::shared {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = make_crc_table();

constexpr auto mix = mix64;

}  // namespace

uint32_t crc32c(const void* data, size_t len, uint32_t seed) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~seed;
  for (size_t i = 0; i < len; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t word_check(uint64_t payload, uint64_t where, uint64_t salt) noexcept {
  const uint64_t h = mix(payload ^ mix(where + 0x9e3779b97f4a7c15ull) ^ salt);
  return static_cast<uint32_t>(h ^ (h >> 32));
}

uint64_t encode_extent(const ExtentWord& w, uint64_t index, uint64_t salt) noexcept {
  if (w.kind == kExtentFree) return 0;
  const uint64_t payload = (uint64_t{(w.owner_slot + 1) & 0xff} << 40) | (uint64_t{w.owner_inc & 0xffff} << 24) |
                           (uint64_t{static_cast<uint8_t>(w.kind) & 7u} << 21) | (uint64_t{w.cls & 63u} << 15) |
                           (uint64_t{w.quota & 15u} << 11) | (w.span & kMaxSpan);
  return (payload << 16) | (word_check(payload, index, salt ^ 0xe1) & 0xffff);
}

bool decode_extent(uint64_t raw, uint64_t index, uint64_t salt, ExtentWord* out) noexcept {
  if (raw == 0) {
    *out = ExtentWord{};
    return true;
  }
  const uint64_t payload = raw >> 16;
  if ((word_check(payload, index, salt ^ 0xe1) & 0xffff) != (raw & 0xffff)) return false;
  const uint32_t slot_plus_one = static_cast<uint32_t>(payload >> 40) & 0xff;
  const auto kind = static_cast<uint32_t>(payload >> 21) & 7u;
  if (slot_plus_one == 0 || kind == kExtentFree || kind > kExtentLargeTail) return false;
  out->owner_slot = slot_plus_one - 1;
  out->owner_inc = static_cast<uint32_t>(payload >> 24) & 0xffff;
  out->kind = static_cast<ExtentKind>(kind);
  out->cls = static_cast<uint32_t>(payload >> 15) & 63u;
  out->quota = static_cast<uint32_t>(payload >> 11) & 15u;
  out->span = static_cast<uint32_t>(payload) & kMaxSpan;
  return true;
}

uint64_t encode_block(BlockWord w, uint64_t offset, uint64_t salt) noexcept {
  if (w.generation == 0 && w.state == kBlockFree) return 0;
  const uint64_t payload = (uint64_t{w.generation} << 2) | (w.state & 3u);
  return (uint64_t{w.generation} << 32) | (uint64_t{static_cast<uint8_t>(w.state) & 3u} << 30) |
         (word_check(payload, offset, salt ^ 0xb1) & 0x3fffffffu);
}

bool decode_block(uint64_t raw, uint64_t offset, uint64_t salt, BlockWord* out) noexcept {
  if (raw == 0) {
    *out = BlockWord{};
    return true;
  }
  const auto generation = static_cast<uint32_t>(raw >> 32);
  const auto state = static_cast<uint8_t>((raw >> 30) & 3u);
  const uint64_t payload = (uint64_t{generation} << 2) | state;
  if ((word_check(payload, offset, salt ^ 0xb1) & 0x3fffffffu) != (raw & 0x3fffffffu)) return false;
  out->generation = generation;
  out->state = static_cast<BlockState>(state);
  return true;
}

namespace {
// Identity and eviction words share one shape: incarnation (32) | check (24) | tag (8).
uint64_t encode_tagged(uint32_t incarnation, uint8_t tag, uint64_t where, uint64_t salt) noexcept {
  const uint64_t payload = (uint64_t{incarnation} << 8) | tag;
  return (uint64_t{incarnation} << 32) | ((word_check(payload, where, salt) & 0xffffffu) << 8) | tag;
}
// 0 decodes as incarnation 0, tag 0 (never written).
bool decode_tagged(uint64_t raw, uint8_t max_tag, uint64_t where, uint64_t salt, uint32_t* inc, uint8_t* tag) noexcept {
  if (raw == 0) {
    *inc = 0;
    *tag = 0;
    return true;
  }
  const auto incarnation = static_cast<uint32_t>(raw >> 32);
  const auto t = static_cast<uint8_t>(raw & 0xff);
  if (t > max_tag) return false;
  const uint64_t payload = (uint64_t{incarnation} << 8) | t;
  if ((word_check(payload, where, salt) & 0xffffffu) != ((raw >> 8) & 0xffffffu)) return false;
  *inc = incarnation;
  *tag = t;
  return true;
}
}  // namespace

uint64_t encode_slot_identity(uint32_t incarnation, SlotState state, uint64_t slot, uint64_t salt) noexcept {
  return encode_tagged(incarnation, state, slot, salt ^ 0x51);
}

bool decode_slot_identity(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* inc, SlotState* state) noexcept {
  uint8_t tag = 0;
  if (!decode_tagged(raw, kSlotLeft, slot, salt ^ 0x51, inc, &tag)) return false;
  *state = static_cast<SlotState>(tag);
  return true;
}

uint64_t encode_eviction(uint32_t incarnation, EvictPhase phase, uint64_t slot, uint64_t salt) noexcept {
  return encode_tagged(incarnation, phase, slot, salt ^ 0xe7);
}

bool decode_eviction(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* inc, EvictPhase* phase) noexcept {
  uint8_t tag = 0;
  if (!decode_tagged(raw, kEvictDone, slot, salt ^ 0xe7, inc, &tag)) return false;
  *phase = static_cast<EvictPhase>(tag);
  return true;
}

uint64_t encode_claim(ClaimKind kind, uint32_t first, uint32_t count, uint64_t slot, uint64_t salt) noexcept {
  if (kind == kClaimNone) return 0;
  const uint64_t payload =
      (uint64_t{static_cast<uint8_t>(kind) & 3u} << 48) | (uint64_t{first & 0xffffffu} << 24) | (count & 0xffffffu);
  return (payload << 14) | (word_check(payload, slot, salt ^ 0xc1) & 0x3fffu);
}

bool decode_claim(uint64_t raw, uint64_t slot, uint64_t salt, ClaimKind* kind, uint32_t* first,
                  uint32_t* count) noexcept {
  if (raw == 0) {
    *kind = kClaimNone;
    *first = *count = 0;
    return true;
  }
  const uint64_t payload = raw >> 14;
  if ((word_check(payload, slot, salt ^ 0xc1) & 0x3fffu) != (raw & 0x3fffu)) return false;
  *kind = static_cast<ClaimKind>((payload >> 48) & 3u);
  *first = static_cast<uint32_t>(payload >> 24) & 0xffffffu;
  *count = static_cast<uint32_t>(payload) & 0xffffffu;
  return *kind != kClaimNone;
}

uint64_t encode_quota_claim(uint32_t quota_plus_one, uint64_t slot, uint64_t salt) noexcept {
  if (quota_plus_one == 0) return 0;
  return (uint64_t{quota_plus_one} << 32) | word_check(quota_plus_one, slot, salt ^ 0x9a);
}

bool decode_quota_claim(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* quota_plus_one) noexcept {
  *quota_plus_one = static_cast<uint32_t>(raw >> 32);
  if (raw == 0) return true;
  return static_cast<uint32_t>(raw) == word_check(*quota_plus_one, slot, salt ^ 0x9a);
}

uint64_t encode_grant(uint64_t extents, uint32_t quota, uint64_t salt) noexcept {
  const uint64_t payload = extents & ((uint64_t{1} << 40) - 1);
  // The check's low bit is forced to 1, so a written word is never 0 (0 means "never granted").
  return (payload << 24) | ((word_check(payload, quota, salt ^ 0x6a) & 0xfffffeu) | 1u);
}

bool decode_grant(uint64_t raw, uint32_t quota, uint64_t salt, uint64_t* extents, bool* set) noexcept {
  *extents = 0;
  *set = raw != 0;
  if (raw == 0) return true;
  const uint64_t payload = raw >> 24;
  if (((word_check(payload, quota, salt ^ 0x6a) & 0xfffffeu) | 1u) != (raw & 0xffffffu)) return false;
  *extents = payload;
  return true;
}

// Each word's check covers both payloads: a pair torn by a crash between its two stores (one
// word old, one new) fails, and is seen as damaged rather than read as a policy nobody set.
void encode_policy(const QuotaPolicy& p, uint32_t quota, uint64_t salt, uint64_t out[2]) noexcept {
  const uint64_t mask40 = (uint64_t{1} << 40) - 1;
  const uint64_t w0 = p.min_extents & mask40, w1 = (p.max_extents & mask40) | (uint64_t{p.priority & 0xffu} << 40);
  out[0] = (w0 << 24) | ((word_check(w0 ^ (w1 << 1), quota, salt ^ 0x70) & 0xfffffeu) | 1u);
  out[1] = (w1 << 16) | ((word_check(w1 ^ (w0 << 1), quota, salt ^ 0x71) & 0xfffeu) | 1u);
}

bool decode_policy(const uint64_t raw[2], uint32_t quota, uint64_t salt, QuotaPolicy* out) noexcept {
  *out = QuotaPolicy{};
  if (raw[0] == 0 && raw[1] == 0) return true;
  const uint64_t w0 = raw[0] >> 24, w1 = raw[1] >> 16;
  if (((word_check(w0 ^ (w1 << 1), quota, salt ^ 0x70) & 0xfffffeu) | 1u) != (raw[0] & 0xffffffu)) return false;
  if (((word_check(w1 ^ (w0 << 1), quota, salt ^ 0x71) & 0xfffeu) | 1u) != (raw[1] & 0xffffu)) return false;
  out->min_extents = w0;
  out->max_extents = w1 & ((uint64_t{1} << 40) - 1);
  out->priority = static_cast<uint32_t>(w1 >> 40) & 0xffu;
  return true;
}

// The key's hash is not secret-keeping (the word sits in memory every participant maps):
// it only tells a right key from a wrong one, and 40 bits make a mistaken match negligible.
uint64_t encode_key(const unsigned char key[kKeyBytes], uint32_t quota, uint64_t salt) noexcept {
  uint64_t a = 0, b = 0;
  std::memcpy(&a, key, 8);
  std::memcpy(&b, key + 8, 8);
  const uint64_t hash = (word_check(a, quota, salt ^ 0x4b) | uint64_t{word_check(b, quota, salt ^ 0x4c)} << 32) &
                        ((uint64_t{1} << 40) - 1);
  return (hash << 24) | ((word_check(hash, quota, salt ^ 0x4d) & 0xfffffeu) | 1u);
}

bool key_word_valid(uint64_t raw, uint32_t quota, uint64_t salt, bool* set) noexcept {
  *set = raw != 0;
  if (raw == 0) return true;
  return ((word_check(raw >> 24, quota, salt ^ 0x4d) & 0xfffffeu) | 1u) == (raw & 0xffffffu);
}

bool parse_quota_key(std::string_view text, unsigned char out[kKeyBytes]) noexcept {
  if (text.size() != 2 * kKeyBytes) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < kKeyBytes; ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

std::string format_quota_key(const unsigned char key[kKeyBytes]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < kKeyBytes; ++i) {
    s += kHex[key[i] >> 4];
    s += kHex[key[i] & 15];
  }
  return s;
}

uint64_t lease_gen_check(uint64_t offset, uint32_t generation, uint64_t slot, uint64_t salt) noexcept {
  return (uint64_t{generation} << 32) | word_check(offset ^ (uint64_t{generation} << 40), slot, salt ^ 0x1e);
}

SmallGeometry small_geometry(uint64_t extent_size, uint64_t class_size) noexcept {
  SmallGeometry g;
  uint64_t n = extent_size / (class_size + 8);
  while (n > 0) {
    const uint64_t meta = (n * 8 + kMinBlock - 1) / kMinBlock * kMinBlock;
    if (meta + n * class_size <= extent_size) {
      g.blocks = n;
      g.meta_bytes = meta;
      break;
    }
    --n;
  }
  return g;
}

}  // namespace cxlpool::detail::shared

// SPDX-License-Identifier: MIT
// A small, fast, non-cryptographic generator (xorshift64*) for sampling decisions (which
// pages a monitor arms), and splitmix64's finaliser, the bit mixer of the checks and hashes
// that need one. Header-only, no allocation, no locking (one generator per user).
#pragma once

#include <cstdint>

namespace cxlpool::detail {

// splitmix64's finaliser: every input bit affects every output bit.
constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

class Xorshift64Star {
 public:
  explicit Xorshift64Star(uint64_t seed) noexcept : s_(seed ? seed : 1) {}
  uint64_t next() noexcept {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 0x2545f4914f6cdd1dull;
  }

 private:
  uint64_t s_;
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// A small, fast, non-cryptographic generator (xorshift64*) for sampling decisions: which
// pages a monitor arms. Header-only, no allocation, no locking (one per user).
#pragma once

#include <cstdint>

namespace cxlpool::detail {

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

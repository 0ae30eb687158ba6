// SPDX-License-Identifier: MIT
// UTF-8 validation for text that anyone may have written (file names, pool names, sysfs): the
// length of the valid sequence at a position, or 0. Header-only: the JSON writer and
// cxlpool-info's escaping share it.
#pragma once

#include <cstddef>
#include <string_view>

namespace cxlpool::detail {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when s[i] does not start
// one: overlong forms, surrogates and code points past U+10FFFF are not valid.
inline size_t utf8_sequence(std::string_view s, size_t i) noexcept {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  const unsigned char d = b(i + 1);
  if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F))
    return 0;
  return n;
}

}  // namespace cxlpool::detail

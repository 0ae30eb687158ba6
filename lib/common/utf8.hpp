// SPDX-License-Identifier: MIT
// UTF-8 validation for text that anyone may have written (file names, pool names, sysfs): the
// length of the valid sequence at a position, or 0; and printable(), the terminal-safe form of
// such text, and json_escaped(), the body of a JSON string. Header-only: the JSON writer,
// cxlpool-info, cxlpool-pool and cxlpool-stat share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
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

// Code points that move the cursor, split a line or reorder text: C1 controls, line and
// paragraph separators, bidirectional marks, embeddings, overrides and isolates (the valid
// sequence of n bytes at s[i]).
inline bool unsafe_code_point(std::string_view s, size_t i, size_t n, uint32_t* cp) noexcept {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  if (n == 2)
    *cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  else if (n == 3)
    *cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  else
    return false;
  const uint32_t c = *cp;
  return (c >= 0x80 && c <= 0x9F) || c == 0x061C || c == 0x200E || c == 0x200F || (c >= 0x2028 && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

// Text that anyone may have written, made safe for a terminal: it cannot move the cursor,
// clear the screen, split a line or reorder what follows. Control bytes, backslashes and bytes
// that are not UTF-8 become \xNN / \\, the unsafe code points \u{XXXX}.
inline std::string printable(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size();) {
    const size_t n = utf8_sequence(in, i);
    const auto c = static_cast<unsigned char>(in[i]);
    uint32_t cp = 0;
    if (n > 1 && unsafe_code_point(in, i, n, &cp)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u{%04X}", unsigned(cp));
      out += buf;
      i += n;
      continue;
    }
    if (n == 0 || c < 0x20 || c == 0x7F || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, c == '\\' ? "\\\\" : "\\x%02X", c);
      out += buf;
      ++i;
    } else {
      out.append(in.substr(i, n));
      i += n;
    }
  }
  return out;
}

// The body of a JSON string for text that anyone may have written (valid UTF-8 JSON whatever it
// holds): a byte that is not part of a valid UTF-8 sequence becomes the four characters \xNN
// (the JSON text "\\xNN") and a backslash two, so the two cannot be confused; '"' and control
// bytes are JSON escapes.
inline std::string json_escaped(std::string_view in) {
  std::string out;
  for (size_t i = 0; i < in.size();) {
    const size_t n = utf8_sequence(in, i);
    const auto c = static_cast<unsigned char>(in[i]);
    char buf[8];
    if (n == 0) {
      std::snprintf(buf, sizeof buf, "\\\\x%02X", c);
      out += buf;
      ++i;
    } else if (c == '\\') {
      out += "\\\\\\\\";
      ++i;
    } else if (c == '"') {
      out += "\\\"";
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else {
      out.append(in.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// What the shared-pool tools (cxlpool-pool, cxlpool-compose) parse and print alike: numbers
// with binary suffixes, and names anyone may have written, made safe for a terminal or JSON.
// Header-only, over the public C API and common/utf8.hpp.
#pragma once

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common/utf8.hpp"

namespace cxlpool::tools {

using UsageError = void (*)(const std::string&);  // prints and exits: never returns

// A non-negative integer in `base`; with `suffixes`, one of K, M, G, T (binary multiples, in
// either case, also spelled KiB..TiB or KB..TB). Out of range is "too large", anything else "not a
// number".
inline uint64_t parse_number(UsageError usage_error, const std::string& flag, const std::string& text, bool suffixes,
                             int base = 10) {
  auto not_a_number = [&] {
    usage_error(flag + ": \"" + text + "\" is not a non-negative number" +
                (suffixes ? " (BYTES, with K, M, G or T for binary multiples)" : ""));
    std::abort();
  };
  if (text.empty() || text[0] == '-' || text[0] == '+' || isspace(static_cast<unsigned char>(text[0]))) not_a_number();
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = strtoull(text.c_str(), &end, base);
  if (end == text.c_str()) not_a_number();
  const bool overflow = errno == ERANGE;
  unsigned shift = 0;
  if (suffixes && *end) {
    const char* units = "KMGT";
    const char* u = strchr(units, toupper(static_cast<unsigned char>(*end)));
    if (!*end || !u) not_a_number();
    shift = unsigned(10 * (u - units + 1));
    ++end;
    if (!strcmp(end, "iB"))
      end += 2;
    else if (!strcmp(end, "B"))
      end += 1;
  }
  if (*end) not_a_number();
  if (overflow || (shift && v > (UINT64_MAX >> shift))) {
    usage_error(flag + ": \"" + text + "\" is too large (at most 2^64 - 1" + (suffixes ? " bytes)" : ")"));
    std::abort();
  }
  return uint64_t(v) << shift;
}

// Names and paths that anyone may have written (in the pool, or on the command line): safe
// for a terminal, or the body of a JSON string (common/utf8.hpp, as cxlpool-info shows them).
inline std::string shown(std::string_view s) { return cxlpool::detail::printable(s); }
inline std::string json_text(std::string_view s) { return cxlpool::detail::json_escaped(s); }
// A message of several lines: each line made safe.
inline std::string shown_lines(std::string_view s) {
  std::string out;
  for (size_t at = 0;;) {
    const size_t nl = s.find('\n', at);
    out += shown(s.substr(at, nl == std::string_view::npos ? nl : nl - at));
    if (nl == std::string_view::npos) return out;
    out += '\n';
    at = nl + 1;
  }
}
template <size_t N>
std::string_view field(const char (&a)[N]) {
  return std::string_view(a, strnlen(a, N));
}

}  // namespace cxlpool::tools

// SPDX-License-Identifier: MIT
// Strict value parsers shared by every configuration grammar (see parse.hpp).
#include "common/parse.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cxlpool::detail {

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, uint64_t{10}, &v)) return std::nullopt;
    if (__builtin_add_overflow(v, uint64_t(c - '0'), &v)) return std::nullopt;
  }
  return v;
}

namespace {
// Splits "123.45unit" into a non-negative decimal number and its unit. The number must start
// with a digit and has at most one '.', followed by at least one digit.
bool split_number_unit(std::string_view s, double& number, std::string_view& unit, bool& had_fraction) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0) return false;
  had_fraction = false;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i + 1) return false;
    i = j;
    had_fraction = true;
  }
  std::string num(s.substr(0, i));
  if (num.size() > 24) return false;
  number = std::strtod(num.c_str(), nullptr);
  unit = s.substr(i);
  return std::isfinite(number);
}

bool ieq(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}
}  // namespace

std::optional<uint64_t> parse_size(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  auto digits = parse_u64(s.substr(0, i));
  if (!digits) return std::nullopt;
  std::string_view unit = s.substr(i);
  unsigned shift;
  if (unit.empty() || ieq(unit, "B"))
    shift = 0;
  else {
    char c = char(std::toupper(unit[0]));
    std::string_view rest = unit.substr(1);
    if (!(rest.empty() || ieq(rest, "B") || ieq(rest, "iB"))) return std::nullopt;
    switch (c) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        return std::nullopt;
    }
  }
  uint64_t v = *digits;
  if (shift && v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

std::optional<uint64_t> parse_latency_ns(std::string_view s) {
  double n;
  std::string_view unit;
  bool frac;
  if (!split_number_unit(s, n, unit, frac)) return std::nullopt;
  double ns;
  if (unit == "ns")
    ns = n;
  else if (unit == "us")
    ns = n * 1000.0;
  else
    return std::nullopt;
  if (ns > 1e12) return std::nullopt;
  return uint64_t(std::llround(ns));
}

std::optional<uint64_t> parse_bandwidth_mbps(std::string_view s) {
  double n;
  std::string_view unit;
  bool frac;
  if (!split_number_unit(s, n, unit, frac)) return std::nullopt;
  double mbps;
  if (unit == "MB/s")
    mbps = n;
  else if (unit == "GB/s")
    mbps = n * 1000.0;
  else if (unit == "TB/s")
    mbps = n * 1e6;
  else
    return std::nullopt;
  if (mbps > 1e12) return std::nullopt;
  return uint64_t(std::llround(mbps));
}

std::optional<unsigned> parse_percent(std::string_view s) {
  if (s.size() < 2 || s.back() != '%') return std::nullopt;
  auto v = parse_u64(s.substr(0, s.size() - 1));
  if (!v || *v > 100) return std::nullopt;
  return unsigned(*v);
}

std::optional<std::vector<int>> parse_id_list(std::string_view s) {
  std::vector<int> out;
  s = trim(s);
  if (s.empty()) return out;
  for (auto piece : split(s, ',')) {
    auto dash = piece.find('-');
    auto lo = parse_u64(piece.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parse_u64(piece.substr(dash + 1));
    if (!lo || !hi || *lo > *hi || *hi > 1u << 20) return std::nullopt;
    // Bounded in total, not only per range: "0-1000000," repeated must not run for hours.
    if (out.size() + (*hi - *lo + 1) > (1u << 20)) return std::nullopt;
    for (uint64_t v = *lo; v <= *hi; ++v) out.push_back(int(v));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void append_item(std::string& list, std::string_view item, std::string_view separator) {
  if (!list.empty()) list += separator;
  list += item;
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_bandwidth(uint64_t mbps) {
  char buf[32];
  if (mbps >= 1000)
    std::snprintf(buf, sizeof buf, "%.1f GB/s", double(mbps) / 1000.0);
  else
    std::snprintf(buf, sizeof buf, "%llu MB/s", static_cast<unsigned long long>(mbps));
  return buf;
}

}  // namespace cxlpool::detail

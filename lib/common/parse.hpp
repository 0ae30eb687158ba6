// SPDX-License-Identifier: MIT
// Strict parsers for the values of every cxlpool configuration grammar (devices, policies):
// sizes with binary suffixes, latencies, bandwidths, percentages, small integers. Each
// returns nullopt on any deviation so the caller can name the offending token.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::detail {

std::string_view trim(std::string_view s);
// Splits on sep; empty pieces are kept (callers reject them with a precise message).
std::vector<std::string_view> split(std::string_view s, char sep);

// Decimal unsigned integer, digits only, no sign, no whitespace, no overflow.
std::optional<uint64_t> parse_u64(std::string_view s);
// "4096", "64K", "4G", "1T", also "4GiB"/"4GB" spelled with i/B; binary multiples (K = 1024).
std::optional<uint64_t> parse_size(std::string_view s);
// "250ns", "0.3us", "1.5us" -> nanoseconds (rounded to nearest). Unit required.
std::optional<uint64_t> parse_latency_ns(std::string_view s);
// "30GB/s", "500MB/s", "2.5GB/s" -> MB/s (decimal: 1 GB/s = 1000 MB/s). Unit required.
std::optional<uint64_t> parse_bandwidth_mbps(std::string_view s);
// "80%" -> 80 (0..100).
std::optional<unsigned> parse_percent(std::string_view s);

// "0-3,8,10-11" -> sorted unique list (kernel cpulist/nodelist format).
std::optional<std::vector<int>> parse_id_list(std::string_view s);

// Appends item to a separator-joined list ("a,b" + "c" -> "a,b,c").
void append_item(std::string& list, std::string_view item, std::string_view separator = ",");

// Human formatting used by tools and messages: "4.0 GiB", "30 GB/s", "250 ns".
std::string format_bytes(uint64_t bytes);
std::string format_bandwidth(uint64_t mbps);

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The tiering engine's configuration and its grammar (CXLPOOL_TIERING, cxlpool_tiering_start):
// "on", "off", or comma-separated key=value items, each key at most once, e.g.
// "budget=200MB/s,interval=100ms,monitors=pagemap_scan+hint". Parsing is strict: the first bad
// item is reported by name with what was expected. docs/tiering.md has the table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::detail::tiering {

enum class PolicyKind : uint8_t { kHot };
enum class KernelMode : uint8_t { kRespect, kOwn };

struct Config {
  bool enabled = true;
  PolicyKind policy = PolicyKind::kHot;
  bool promote = true, demote = true;  // promote=hot|off, demote=cold|off
  bool migrate = true;                 // migrate=off: monitors and heat only (overhead runs)
  uint64_t interval_ns = 100'000'000;
  uint64_t budget_bytes_per_s = 0;  // 0: a tenth of the far tier's write bandwidth (or read)
  std::vector<std::string> monitors{"hint", "pagemap_scan"};
  // Of each interval: the most monitors may cost the program (faults, TLB flushes) by their cost
  // models; 4 %, so that the models' error here (bench/tiering measured up to 1.2x) stays within 5 %.
  double overhead = 0.04;
  unsigned high_percent = 95, low_percent = 85;  // watermarks on the fast tier's capacity
  double hot = 0.05;                             // a unit is hot at this heat (share of its pages touched per interval)
  double cold = 0.01;                            // and cold below this one
  uint64_t halflife_ns = 500'000'000;            // heat halves in this much time without accesses
  uint64_t min_residence_ns = 2'000'000'000;     // a moved unit stays put at least this long
  double hysteresis = 1.5;                       // a promotion displaces a fast unit only if this many times hotter
  KernelMode kernel = KernelMode::kRespect;
  std::string text;  // the text it was parsed from ("" = defaults)
};

// Parses text ("" or "on": defaults). Throws Failure(CXLPOOL_E_CONFIG) naming `origin` (e.g.
// "CXLPOOL_TIERING") and the bad item.
Config parse_config(std::string_view text, const char* origin);
// The config rendered back as text, every key (what the stats and cxlpool-info show).
std::string describe(const Config& c);

}  // namespace cxlpool::detail::tiering

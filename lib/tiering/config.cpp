// SPDX-License-Identifier: MIT
// The CXLPOOL_TIERING grammar (config.hpp).
#include "tiering/config.hpp"

#include <charconv>
#include <cmath>
#include <set>

#include "common/error.hpp"
#include "common/parse.hpp"

namespace cxlpool::detail::tiering {

namespace {

// "100ms", "2s", "500us", "1.5s" -> ns.
bool parse_duration_ns(std::string_view s, uint64_t* out) {
  struct Unit {
    const char* suffix;
    double ns;
  };
  static constexpr Unit kUnits[] = {{"ms", 1e6}, {"us", 1e3}, {"ns", 1}, {"s", 1e9}, {"min", 60e9}};
  for (const Unit& u : kUnits) {
    std::string_view suf(u.suffix);
    if (s.size() <= suf.size() || s.substr(s.size() - suf.size()) != suf) continue;
    std::string_view num = s.substr(0, s.size() - suf.size());
    double v = 0;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || p != num.data() + num.size() || !(v >= 0) || !std::isfinite(v)) return false;
    // Digits and a dot only (from_chars accepts "inf", exponents, a sign).
    for (char c : num)
      if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
    double ns = v * u.ns;
    if (ns > 1e18) return false;
    *out = uint64_t(std::llround(ns));
    return true;
  }
  return false;
}

bool parse_fraction(std::string_view s, double* out) {
  for (char c : s)
    if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

std::string format_ns(uint64_t ns) {
  if (ns % 1'000'000'000 == 0) return std::to_string(ns / 1'000'000'000) + "s";
  if (ns % 1'000'000 == 0) return std::to_string(ns / 1'000'000) + "ms";
  if (ns % 1'000 == 0) return std::to_string(ns / 1'000) + "us";
  return std::to_string(ns) + "ns";
}

std::string format_fraction(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Constant-initialised: the interposer parses CXLPOOL_TIERING before dynamic initialisers run.
constexpr std::string_view kMonitorNames[] = {"hint", "pagemap_scan", "sample", "damon", "perf", "numa_balancing"};
bool known_monitor(std::string_view m) {
  for (std::string_view k : kMonitorNames)
    if (k == m) return true;
  return false;
}

}  // namespace

Config parse_config(std::string_view text, const char* origin) {
  Config c;
  c.text = std::string(text);
  std::string_view t = trim(text);
  if (t.empty() || t == "on") return c;
  if (t == "off") {
    c.enabled = false;
    return c;
  }
  std::set<std::string> seen;
  for (std::string_view raw : split(t, ',')) {
    std::string_view item = trim(raw);
    auto bad = [&](const std::string& why) {
      fail(CXLPOOL_E_CONFIG, std::string(origin) + ": '" + std::string(item) + "': " + why);
    };
    if (item.empty()) bad("empty item (two commas in a row, or a trailing comma)");
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad("expected key=value (keys: docs/tiering.md)");
    std::string key(trim(item.substr(0, eq)));
    std::string_view value = trim(item.substr(eq + 1));
    if (!seen.insert(key).second) bad("'" + key + "' given twice");
    if (value.empty()) bad("no value for '" + key + "'");
    if (key == "policy") {
      if (value != "hot") bad("policy is hot (HeMem-style: hot units up, cold units down)");
      c.policy = PolicyKind::kHot;
    } else if (key == "promote") {
      if (value != "hot" && value != "off") bad("promote is hot or off");
      c.promote = value == "hot";
    } else if (key == "demote") {
      if (value != "cold" && value != "off") bad("demote is cold or off");
      c.demote = value == "cold";
    } else if (key == "migrate") {
      if (value != "on" && value != "off") bad("migrate is on or off");
      c.migrate = value == "on";
    } else if (key == "interval") {
      if (!parse_duration_ns(value, &c.interval_ns) || c.interval_ns < 1'000'000 || c.interval_ns > 60'000'000'000)
        bad("interval is a duration from 1ms to 60s, e.g. 100ms");
    } else if (key == "budget" && value == "auto") {
      c.budget_bytes_per_s = 0;
    } else if (key == "budget") {
      std::string_view v = value;
      if (v.size() < 3 || v.substr(v.size() - 2) != "/s")
        bad("budget is auto or bytes per second, e.g. 200MB/s or 1GiB/s");
      v = v.substr(0, v.size() - 2);
      // Decimal units (MB = 10^6) as bandwidths are written; binary with an i (MiB).
      uint64_t mult = 1;
      std::string_view num = v;
      struct U {
        const char* s;
        uint64_t m;
      };
      static constexpr U kU[] = {{"KiB", 1ull << 10},
                                 {"MiB", 1ull << 20},
                                 {"GiB", 1ull << 30},
                                 {"KB", 1000},
                                 {"MB", 1000000},
                                 {"GB", 1000000000},
                                 {"B", 1}};
      bool unit = false;
      for (const U& u : kU) {
        std::string_view suf(u.s);
        if (v.size() > suf.size() && v.substr(v.size() - suf.size()) == suf) {
          num = v.substr(0, v.size() - suf.size());
          mult = u.m;
          unit = true;
          break;
        }
      }
      double n = 0;
      if (!unit || !parse_fraction(num, &n) || n <= 0 || n * double(mult) > 1e15)
        bad("budget is bytes per second with a unit, e.g. 200MB/s, 1.5GB/s, 512MiB/s");
      if (n * double(mult) < 4096) bad("budget is at least 4KiB/s (one page per second)");
      c.budget_bytes_per_s = uint64_t(n * double(mult));
    } else if (key == "monitors") {
      c.monitors.clear();
      for (std::string_view m : split(value, '+')) {
        m = trim(m);
        if (!known_monitor(m))
          bad("unknown monitor '" + std::string(m) + "' (hint, pagemap_scan, sample, damon, perf, numa_balancing)");
        for (const std::string& have : c.monitors)
          if (have == m) bad("monitor '" + std::string(m) + "' listed twice");
        c.monitors.emplace_back(m);
      }
    } else if (key == "overhead") {
      double v = 0;
      if (value.size() < 2 || value.back() != '%' || !parse_fraction(value.substr(0, value.size() - 1), &v) ||
          v < 0.01 || v > 100)
        bad("overhead is the share of each interval monitors may cost the program, 0.01% to 100%, e.g. 5%");
      c.overhead = v / 100;
    } else if (key == "high" || key == "low") {
      auto pct = parse_percent(value);
      if (!pct || *pct == 0) bad(key + " is a percentage of the fast tier's capacity, 1% to 100%");
      (key == "high" ? c.high_percent : c.low_percent) = *pct;
    } else if (key == "hot" || key == "cold") {
      double v = 0;
      if (!parse_fraction(value, &v) || v <= 0 || v > 1)
        bad(key + " is a share of a unit's pages touched per interval, above 0 and at most 1, e.g. 0.05");
      (key == "hot" ? c.hot : c.cold) = v;
    } else if (key == "halflife" || key == "min_residence") {
      uint64_t ns = 0;
      if (!parse_duration_ns(value, &ns) || ns > 3'600'000'000'000) bad(key + " is a duration up to 1h, e.g. 500ms");
      if (key == "halflife" && ns == 0) bad("halflife must be above 0");
      (key == "halflife" ? c.halflife_ns : c.min_residence_ns) = ns;
    } else if (key == "hysteresis") {
      double v = 0;
      if (!parse_fraction(value, &v) || v < 1 || v > 1000) bad("hysteresis is a factor from 1 to 1000, e.g. 2");
      c.hysteresis = v;
    } else if (key == "kernel") {
      if (value == "respect")
        c.kernel = KernelMode::kRespect;
      else if (value == "own")
        c.kernel = KernelMode::kOwn;
      else
        bad("kernel is respect (leave NUMA-to-NUMA moves to the kernel's own tiering) or own");
    } else {
      bad("unknown key '" + key +
          "' (policy, promote, demote, migrate, interval, budget, monitors, overhead, high, low, hot, cold, "
          "halflife, min_residence, hysteresis, kernel)");
    }
  }
  if (c.low_percent > c.high_percent)
    fail(CXLPOOL_E_CONFIG, std::string(origin) + ": low=" + std::to_string(c.low_percent) +
                               "% is above high=" + std::to_string(c.high_percent) + "%");
  if (c.cold > c.hot)
    fail(CXLPOOL_E_CONFIG,
         std::string(origin) + ": cold=" + format_fraction(c.cold) + " is above hot=" + format_fraction(c.hot));
  return c;
}

std::string describe(const Config& c) {
  if (!c.enabled) return "off";
  std::string s = "policy=";
  s += "hot";
  s += std::string(",promote=") + (c.promote ? "hot" : "off") + ",demote=" + (c.demote ? "cold" : "off");
  s += std::string(",migrate=") + (c.migrate ? "on" : "off") + ",interval=" + format_ns(c.interval_ns);
  s += ",budget=" + (c.budget_bytes_per_s ? std::to_string(c.budget_bytes_per_s) + "B/s" : std::string("auto"));
  s += ",monitors=";
  for (size_t i = 0; i < c.monitors.size(); ++i) s += (i ? "+" : "") + c.monitors[i];
  s += ",overhead=" + format_fraction(c.overhead * 100) + "%";
  s += ",high=" + std::to_string(c.high_percent) + "%,low=" + std::to_string(c.low_percent) + "%";
  s += ",hot=" + format_fraction(c.hot) + ",cold=" + format_fraction(c.cold);
  s += ",halflife=" + format_ns(c.halflife_ns) + ",min_residence=" + format_ns(c.min_residence_ns);
  s += ",hysteresis=" + format_fraction(c.hysteresis);
  s += std::string(",kernel=") + (c.kernel == KernelMode::kRespect ? "respect" : "own");
  return s;
}

}  // namespace cxlpool::detail::tiering

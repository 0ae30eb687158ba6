// SPDX-License-Identifier: MIT
// Strict parser of the placement policy grammar (see policy.hpp and docs/policy.md).
#include "placement/policy.hpp"

#include <algorithm>
#include <numeric>

#include "common/error.hpp"
#include "common/parse.hpp"

namespace cxlpool::detail {
namespace {

std::string quote(std::string_view s) { return "'" + std::string(s) + "'"; }

class Parser {
 public:
  Parser(const PolicyDevices& d, std::string origin) : dev_(d), origin_(std::move(origin)) {}

  [[noreturn]] void error(const std::string& what) const { fail(CXLPOOL_E_CONFIG, origin_ + ": " + what); }

  std::string device_list() const {
    std::string s;
    for (auto& n : dev_.names) append_item(s, n, ", ");
    return s;
  }

  int resolve(std::string_view tok, const std::string& where) const {
    if (tok.empty()) error(where + ": empty device");
    if (dev_.names.empty()) error(where + ": the pool has no devices");
    if (tok == "near" || tok == "far") {
      int best = 0;
      for (int i = 1; i < int(dev_.tiers.size()); ++i)
        if (tok == "near" ? dev_.tiers[i] < dev_.tiers[best] : dev_.tiers[i] > dev_.tiers[best]) best = i;
      return best;
    }
    if (tok.substr(0, 4) == "tier" && tok.size() > 4) {
      auto n = parse_u64(tok.substr(4));
      if (!n) error(where + ": bad tier " + quote(tok) + " (expected tierN)");
      for (int i = 0; i < int(dev_.tiers.size()); ++i)
        if (dev_.tiers[i] == int(*n)) return i;
      error(where + ": no device of the pool is in " + quote(tok));
    }
    for (int i = 0; i < int(dev_.names.size()); ++i)
      if (dev_.names[i] == tok) return i;
    error(where + ": unknown device " + quote(tok) + " (pool devices: " + device_list() + "; or near, far, tierN)");
  }

  // key=value pairs; keys are checked against the allowed list, duplicates rejected.
  std::vector<std::pair<std::string_view, std::string_view>> pairs(std::string_view args, const std::string& where,
                                                                   bool any_key) const {
    std::vector<std::pair<std::string_view, std::string_view>> out;
    if (trim(args).empty()) error(where + ": missing arguments");
    for (auto kv : split(args, ',')) {
      kv = trim(kv);
      if (kv.empty()) error(where + ": empty key=value (stray ',')");
      auto eq = kv.find('=');
      if (eq == std::string_view::npos) error(where + ": " + quote(kv) + " has no '=' (expected key=value)");
      auto k = trim(kv.substr(0, eq)), v = trim(kv.substr(eq + 1));
      if (k.empty()) error(where + ": empty key in " + quote(kv));
      if (v.empty()) error(where + ": key " + quote(k) + ": empty value");
      for (auto& [pk, pv] : out)
        if (pk == k) error(where + ": key " + quote(k) + " given twice");
      (void)any_key;
      out.emplace_back(k, v);
    }
    return out;
  }

  uint32_t weight(std::string_view v, const std::string& where) const {
    auto w = parse_u64(v);
    if (!w || *w == 0 || *w > 1000) error(where + ": bad weight " + quote(v) + " (expected 1..1000)");
    return uint32_t(*w);
  }

  Rule rule(std::string_view text) const {
    text = trim(text);
    if (text.empty()) error("empty rule (stray '|')");
    auto colon = text.find(':');
    std::string_view kind = trim(text.substr(0, colon));
    std::string_view args = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
    const std::string where = "rule " + quote(kind);
    Rule r;
    auto unknown_key = [&](std::string_view k, const char* valid) {
      error(where + ": unknown key " + quote(k) + " (valid: " + valid + ")");
    };
    if (kind == "bind") {
      r.kind = RuleKind::kBind;
      r.devices = {resolve(trim(args), where)};
    } else if (kind == "preferred") {
      r.kind = RuleKind::kPreferred;
      if (trim(args).empty()) error(where + ": missing device list");
      for (auto d : split(args, ',')) {
        int i = resolve(trim(d), where);
        if (std::find(r.devices.begin(), r.devices.end(), i) != r.devices.end())
          error(where + ": device " + quote(trim(d)) + " listed twice");
        r.devices.push_back(i);
      }
      r.fallback.assign(r.devices.begin() + 1, r.devices.end());
    } else if (kind == "spill") {
      r.kind = RuleKind::kSpill;
      int near = -1, far = -1;
      for (auto [k, v] : pairs(args, where, false)) {
        if (k == "near")
          near = resolve(v, where + ": key 'near'");
        else if (k == "far")
          far = resolve(v, where + ": key 'far'");
        else if (k == "watermark") {
          auto p = parse_percent(v);
          if (!p || *p == 0) error(where + ": bad watermark " + quote(v) + " (expected 1%..100%)");
          r.watermark_pct = *p;
        } else
          unknown_key(k, "near, far, watermark");
      }
      if (near < 0 || far < 0 || r.watermark_pct == 0) error(where + ": needs near=, far= and watermark=");
      if (near == far) error(where + ": near and far are the same device");
      r.devices = {near, far};
      r.fallback = {far, near};
    } else if (kind == "threshold") {
      r.kind = RuleKind::kThreshold;
      int d = -1;
      bool have_size = false;
      for (auto [k, v] : pairs(args, where, false)) {
        if (k == "size") {
          auto s = parse_size(v);
          if (!s || *s == 0) error(where + ": bad size " + quote(v) + " (expected e.g. 1M)");
          r.min_size = *s;
          have_size = true;
        } else if (k == "tier" || k == "device") {
          if (d >= 0) error(where + ": give one of tier= or device=");
          d = resolve(v, where + ": key " + quote(k));
        } else
          unknown_key(k, "size, tier, device");
      }
      if (!have_size || d < 0) error(where + ": needs size= and tier= (or device=)");
      r.devices = {d};
    } else if (kind == "ratio" || kind == "interleave") {
      r.kind = kind == "ratio" ? RuleKind::kRatio : RuleKind::kInterleave;
      if (kind == "interleave" && trim(args) == "auto") {
        for (int i = 0; i < int(dev_.names.size()); ++i) {
          if (dev_.read_bandwidth_mbps[i] == 0)
            error(where + ": 'auto' needs the read bandwidth of every device; " + quote(dev_.names[i]) +
                  " has none (declare bandwidth= or give weights)");
          r.devices.push_back(i);
        }
        // Weights proportional to bandwidth, scaled so the smallest is at least 1.
        uint64_t lo = *std::min_element(dev_.read_bandwidth_mbps.begin(), dev_.read_bandwidth_mbps.end());
        for (int i : r.devices)
          r.weights.push_back(
              uint32_t(std::clamp<uint64_t>((dev_.read_bandwidth_mbps[i] * 10 + lo / 2) / lo, 1, 1000)));
      } else {
        for (auto [k, v] : pairs(args, where, true)) {
          int i = resolve(k, where);
          if (std::find(r.devices.begin(), r.devices.end(), i) != r.devices.end())
            error(where + ": device " + quote(k) + " listed twice");
          r.devices.push_back(i);
          r.weights.push_back(weight(v, where + ": device " + quote(k)));
        }
        if (r.devices.size() < 2) error(where + ": needs at least two devices");
      }
      std::vector<size_t> order(r.devices.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.weights[a] > r.weights[b]; });
      for (size_t o : order) r.fallback.push_back(r.devices[o]);
    } else if (kind == "hint") {
      r.kind = RuleKind::kHint;
      static const char* names[4] = {"hot", "cold", "read_mostly", "shared"};
      for (auto [k, v] : pairs(args, where, false)) {
        int bit = -1;
        for (int i = 0; i < 4; ++i)
          if (k == names[i]) bit = i;
        if (bit < 0) unknown_key(k, "hot, cold, read_mostly, shared");
        r.hint_device[bit] = resolve(v, where + ": key " + quote(k));
      }
    } else if (kind.empty()) {
      error("missing rule kind before ':'");
    } else {
      error("unknown rule " + quote(kind) + " (expected bind, preferred, spill, threshold, ratio, interleave or hint)");
    }
    if (kind != "bind" && kind != "preferred" && kind != "interleave" && colon == std::string_view::npos)
      error(where + ": missing ':' and arguments");
    return r;
  }

  std::string canonical(const Rule& r) const {
    auto n = [&](int i) { return dev_.names[size_t(i)]; };
    switch (r.kind) {
      case RuleKind::kBind:
        return "bind:" + n(r.devices[0]);
      case RuleKind::kPreferred: {
        std::string list;
        for (int d : r.devices) append_item(list, n(d));
        return "preferred:" + list;
      }
      case RuleKind::kSpill:
        return "spill:near=" + n(r.devices[0]) + ",far=" + n(r.devices[1]) +
               ",watermark=" + std::to_string(r.watermark_pct) + "%";
      case RuleKind::kThreshold:
        return "threshold:size=" + std::to_string(r.min_size) + ",device=" + n(r.devices[0]);
      case RuleKind::kRatio:
      case RuleKind::kInterleave: {
        std::string list;
        for (size_t i = 0; i < r.devices.size(); ++i)
          append_item(list, n(r.devices[i]) + "=" + std::to_string(r.weights[i]));
        return (r.kind == RuleKind::kRatio ? "ratio:" : "interleave:") + list;
      }
      case RuleKind::kHint: {
        static const char* names[4] = {"hot", "cold", "read_mostly", "shared"};
        std::string list;
        for (int i = 0; i < 4; ++i)
          if (r.hint_device[i] >= 0) append_item(list, std::string(names[i]) + "=" + n(r.hint_device[i]));
        return "hint:" + list;
      }
    }
    return "";
  }

 private:
  const PolicyDevices& dev_;
  std::string origin_;
};

}  // namespace

Policy parse_policy(std::string_view text, const PolicyDevices& devices, const std::string& origin) {
  Parser p(devices, origin);
  Policy policy;
  if (trim(text).empty()) text = "bind:near";
  for (auto piece : split(text, '|')) policy.rules.push_back(p.rule(piece));
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    if (i) policy.text += '|';
    policy.text += p.canonical(policy.rules[i]);
    RuleKind k = policy.rules[i].kind;
    bool conditional = k == RuleKind::kThreshold || k == RuleKind::kHint;
    if (!conditional && i + 1 < policy.rules.size())
      p.error("rule " + std::to_string(i + 1) + " always matches, so the rules after it can never apply");
  }
  // Conditional rules fall through to an implicit bind:near.
  RuleKind last = policy.rules.back().kind;
  if (last == RuleKind::kThreshold || last == RuleKind::kHint) {
    Rule tail;
    tail.devices = {p.resolve("near", "implicit tail")};
    policy.rules.push_back(tail);
  }
  return policy;
}

}  // namespace cxlpool::detail

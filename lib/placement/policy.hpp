// SPDX-License-Identifier: MIT
// Placement policies: one grammar (docs/policy.md) shared by pools, the interposer and
// cxlpool-run. A policy is a chain of rules separated by '|'; the first rule that matches an
// allocation picks its device, with the rule's fallback order when that device is full.
//   bind:DEV   preferred:DEV,DEV...   spill:near=DEV,far=DEV,watermark=P%
//   threshold:size=SIZE,tier=DEV      ratio:DEV=W,...   interleave:DEV=W,...|interleave:auto
//   hint:cold=DEV,hot=DEV,read_mostly=DEV,shared=DEV
// DEV is a device name of the pool, near (fastest tier), far (slowest tier) or tierN.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cxlpool::detail {

enum class RuleKind { kBind, kPreferred, kSpill, kThreshold, kRatio, kInterleave, kHint };

// Hint bits, equal to the public CXLPOOL_HINT_* values.
enum : uint32_t { kHintHot = 1, kHintCold = 2, kHintReadMostly = 4, kHintShared = 8 };

struct Rule {
  RuleKind kind = RuleKind::kBind;
  std::vector<int> devices;               // pool device indices; bind/threshold: 1; spill: near, far
  std::vector<uint32_t> weights;          // ratio/interleave, parallel to devices
  uint64_t min_size = 0;                  // threshold: allocations >= min_size match
  unsigned watermark_pct = 0;             // spill
  int hint_device[4] = {-1, -1, -1, -1};  // hint: device per hint bit (hot, cold, read_mostly, shared)
  std::vector<int> fallback;              // devices tried, in order, when the chosen one is full
};

struct Policy {
  std::vector<Rule> rules;  // never empty after parsing; the implicit tail is bind:near
  std::string text;         // canonical form (round-trips through parse_policy)
};

// What the parser needs to know about the pool's devices.
struct PolicyDevices {
  std::vector<std::string> names;
  std::vector<int> tiers;
  std::vector<uint64_t> read_bandwidth_mbps;  // 0 = unknown (interleave:auto needs all known)
};

// Throws Failure(CXLPOOL_E_CONFIG) with a message naming the bad token, prefixed by origin.
Policy parse_policy(std::string_view text, const PolicyDevices& devices, const std::string& origin = "policy");

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The placement policy grammar: good policies resolve devices and round-trip; bad ones are
// rejected naming the offending token.
#include "placement/policy.hpp"

#include "common/error.hpp"
#include "test_support.hpp"

using namespace cxlpool::detail;

namespace {
PolicyDevices devices() {
  PolicyDevices d;
  d.names = {"node0", "cxl0", "cxl1"};
  d.tiers = {0, 1, 2};
  d.read_bandwidth_mbps = {20000, 10000, 5000};
  return d;
}
std::string error_of(const std::string& text) {
  try {
    parse_policy(text, devices(), "CXLPOOL_POLICY");
  } catch (const Failure& f) {
    CHECK(f.status() == CXLPOOL_E_CONFIG);
    return f.what();
  }
  return "<accepted>";
}
}  // namespace

TEST_CASE("policies resolve devices, near/far/tierN, and round-trip", "[unit]") {
  auto d = devices();
  Policy p = parse_policy("bind:far", d);
  REQUIRE(p.rules.size() == 1);
  CHECK(p.rules[0].devices == std::vector<int>{2});
  CHECK(p.text == "bind:cxl1");
  CHECK(parse_policy("", d).text == "bind:node0");
  p = parse_policy("spill:near=node0,far=cxl0,watermark=80%", d);
  CHECK(p.rules[0].kind == RuleKind::kSpill);
  CHECK(p.rules[0].watermark_pct == 80);
  CHECK(p.rules[0].devices == std::vector<int>{0, 1});
  p = parse_policy("threshold:size=1M,tier=far", d);
  REQUIRE(p.rules.size() == 2);  // threshold + implicit bind:near
  CHECK(p.rules[0].min_size == 1u << 20);
  CHECK(p.rules[0].devices == std::vector<int>{2});
  CHECK(p.rules[1].devices == std::vector<int>{0});
  p = parse_policy("ratio:near=1,far=3", d);
  CHECK(p.rules[0].weights == std::vector<uint32_t>{1, 3});
  CHECK(p.rules[0].fallback == std::vector<int>{2, 0});
  p = parse_policy("interleave:node0=3,cxl0=1", d);
  CHECK(p.rules[0].kind == RuleKind::kInterleave);
  p = parse_policy("interleave:auto", d);
  CHECK(p.rules[0].weights == std::vector<uint32_t>{40, 20, 10});
  p = parse_policy("hint:cold=far,hot=tier0|threshold:size=64K,tier=cxl0|preferred:node0,cxl0,cxl1", d);
  REQUIRE(p.rules.size() == 3);
  CHECK(p.rules[0].hint_device[1] == 2);
  CHECK(p.rules[0].hint_device[0] == 0);
  CHECK(p.rules[2].fallback == std::vector<int>{1, 2});
  for (const char* text : {"bind:cxl0", "preferred:cxl0,node0", "spill:near=node0,far=cxl1,watermark=50%",
                           "threshold:size=4096,device=cxl0|bind:node0", "ratio:node0=1,cxl0=3",
                           "interleave:node0=3,cxl0=1", "hint:cold=cxl1|spill:near=node0,far=cxl0,watermark=90%"}) {
    INFO(text);
    Policy a = parse_policy(text, d);
    Policy b = parse_policy(a.text, d);
    CHECK(a.text == b.text);
  }
}

TEST_CASE("bad policies name the offending token", "[unit]") {
  struct Case {
    const char* input;
    const char* token;
  };
  const Case cases[] = {
      {"bogus", "unknown rule 'bogus'"},
      {"bind:nvme0", "unknown device 'nvme0'"},
      {"bind:", "empty device"},
      {"spill:near=node0,far=cxl0", "needs near=, far= and watermark="},
      {"spill:near=node0,far=cxl0,watermark=80", "bad watermark '80'"},
      {"spill:near=node0,far=cxl0,watermark=120%", "bad watermark '120%'"},
      {"spill:near=node0,far=node0,watermark=50%", "the same device"},
      {"spill:near=node0,far=cxl0,watermark=50%,speed=1", "unknown key 'speed'"},
      {"threshold:size=1Q,tier=far", "bad size '1Q'"},
      {"threshold:size=1M", "needs size= and tier="},
      {"threshold:size=1M,tier=tier9", "'tier9'"},
      {"threshold:size=1M,tier=far,device=cxl0", "give one of tier= or device="},
      {"ratio:node0=1", "at least two devices"},
      {"ratio:node0=0,cxl0=1", "bad weight '0'"},
      {"ratio:node0=x,cxl0=1", "bad weight 'x'"},
      {"interleave:node0=1,node0=2", "key 'node0' given twice"},
      {"preferred:node0,node0", "listed twice"},
      {"hint:warm=far", "unknown key 'warm'"},
      {"bind:node0|bind:cxl0", "always matches"},
      {"bind:node0||bind:cxl0", "stray '|'"},
      {"spill:near=node0,,far=cxl0,watermark=5%", "stray ','"},
      {"spill:near", "has no '='"},
      {":node0", "missing rule kind"},
      {"threshold", "missing arguments"},
      {"bind", "empty device"},
  };
  for (const Case& c : cases) {
    INFO("policy: " << c.input);
    std::string msg = error_of(c.input);
    CHECK(msg.find(c.token) != std::string::npos);
    CHECK(msg.rfind("CXLPOOL_POLICY: ", 0) == 0);
  }
  PolicyDevices no_bw = devices();
  no_bw.read_bandwidth_mbps[1] = 0;
  CHECK_THROWS_WITH(parse_policy("interleave:auto", no_bw), Catch::Contains("'cxl0' has none"));
}

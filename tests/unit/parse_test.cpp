// SPDX-License-Identifier: MIT
// Value parsers, interval set and JSON writer: the small pieces every grammar relies on.
#include "common/parse.hpp"

#include <catch2/catch.hpp>

#include "common/interval_set.hpp"
#include "common/json.hpp"

using namespace cxlpool::detail;

TEST_CASE("sizes use binary suffixes and reject anything else", "[unit]") {
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("64K") == 64u << 10);
  CHECK(parse_size("4G") == 4ull << 30);
  CHECK(parse_size("4GiB") == 4ull << 30);
  CHECK(parse_size("4gb") == 4ull << 30);
  CHECK(parse_size("1T") == 1ull << 40);
  CHECK(parse_size("0") == 0u);
  for (const char* bad : {"", "G", "4Q", "-4G", "+4G", "4 G", "4.5G", "4GG", "0x10", "4Gi", "18446744073709551616",
                          "17179869184G", " 4G"})
    CHECK_FALSE(parse_size(bad).has_value());
}

TEST_CASE("latency needs a unit, converts us to ns", "[unit]") {
  CHECK(parse_latency_ns("250ns") == 250u);
  CHECK(parse_latency_ns("0.3us") == 300u);
  CHECK(parse_latency_ns("2us") == 2000u);
  for (const char* bad : {"250", "ns", "250ms", "-5ns", "1.ns", ".5us", "250 ns", "1e3ns"})
    CHECK_FALSE(parse_latency_ns(bad).has_value());
}

TEST_CASE("bandwidth is decimal MB/s", "[unit]") {
  CHECK(parse_bandwidth_mbps("30GB/s") == 30000u);
  CHECK(parse_bandwidth_mbps("2.5GB/s") == 2500u);
  CHECK(parse_bandwidth_mbps("500MB/s") == 500u);
  for (const char* bad : {"30", "30GB", "30Gb/s", "GB/s", "30 GB/s", "-1GB/s"})
    CHECK_FALSE(parse_bandwidth_mbps(bad).has_value());
}

TEST_CASE("percent and id lists", "[unit]") {
  CHECK(parse_percent("80%") == 80u);
  CHECK_FALSE(parse_percent("101%").has_value());
  CHECK_FALSE(parse_percent("80").has_value());
  CHECK(parse_id_list("0-2,5") == std::vector<int>{0, 1, 2, 5});
  CHECK(parse_id_list("") == std::vector<int>{});
  CHECK_FALSE(parse_id_list("3-1").has_value());
  std::string many;
  for (int i = 0; i < 4; ++i) many += "0-1000000,";
  CHECK_FALSE(parse_id_list(many + "0").has_value());  // bounded in total, at once
  CHECK_FALSE(parse_id_list("a").has_value());
}

TEST_CASE("interval set counts each unit once", "[unit]") {
  BasicIntervalSet<> s;
  CHECK(s.insert(0, 10) == 10);
  CHECK(s.insert(5, 15) == 5);
  CHECK(s.insert(20, 30) == 10);
  CHECK(s.total() == 25);
  CHECK(s.ranges() == 2);
  CHECK(s.insert(15, 20) == 5);  // bridges the gap, merges
  CHECK(s.ranges() == 1);
  CHECK(s.erase(8, 12) == 4);
  CHECK(s.ranges() == 2);
  CHECK(s.covered(0, 30) == 26);
  CHECK(s.erase(100, 200) == 0);
  CHECK(s.erase(0, 30) == 26);
  CHECK(s.empty());
  CHECK(s.total() == 0);
}

TEST_CASE("json writer escapes strings and nests containers", "[unit]") {
  JsonWriter j;
  j.begin_object().key("a\"b").value("line\nbreak\x01").key("n").value(int64_t(-3)).key("arr").begin_array();
  j.value(true).null().value(1.5).end_array().key("empty").begin_object().end_object().end_object();
  const std::string& s = j.str();
  CHECK(s.find(R"("a\"b": "line\u000abreak\u0001")") != std::string::npos);
  CHECK(s.find("\"n\": -3") != std::string::npos);
  CHECK(s.find("\"empty\": {}") != std::string::npos);
  CHECK(s.find("1.5") != std::string::npos);
}

TEST_CASE("json writer output is valid UTF-8 whatever the strings hold", "[unit]") {
  JsonWriter j;
  // Valid two-, three- and four-byte sequences pass; a lone 0xFF, a truncated sequence, an
  // overlong form, a surrogate and DEL do not reach the output raw.
  j.begin_array().value("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80").value("\xff|\xe2\x82|\xc0\xaf|\xed\xa0\x80|\x7f");
  j.end_array();
  const std::string& s = j.str();
  CHECK(s.find("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"") != std::string::npos);
  CHECK(s.find(R"("\\xFF|\\xE2\\x82|\\xC0\\xAF|\\xED\\xA0\\x80|\u007f")") != std::string::npos);
  for (unsigned char c : s) CHECK((c != 0xFF && c != 0x7F && c != 0xC0));
  // A name holding the four characters \xFF is not confused with one holding the byte 0xFF.
  JsonWriter k;
  k.begin_array().value("\\xFF").value("\xff").end_array();
  CHECK(k.str().find(R"("\\\\xFF")") != std::string::npos);
  CHECK(k.str().find(R"("\\xFF")") != std::string::npos);
}

// SPDX-License-Identifier: MIT
// The device grammar (CXLPOOL_DEVICES / CXLPOOL_CONFIG): every bad input is rejected with a
// CONFIG error whose message names the offending token; good inputs round-trip.
#include "config/device_spec.hpp"

#include <fstream>

#include "common/error.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

using namespace cxlpool::detail;
using cxlpool_test::fixture;

namespace {
std::string error_of(const std::string& text) {
  try {
    parse_device_list(text, "CXLPOOL_DEVICES");
  } catch (const Failure& f) {
    CHECK(f.status() == CXLPOOL_E_CONFIG);
    return f.what();
  }
  return "<accepted>";
}
}  // namespace

TEST_CASE("bad device declarations name the offending token", "[unit]") {
  struct Case {
    const char* input;
    const char* token;
  };
  const Case cases[] = {
      {"cxl0:backing=shm,size=12Q", "'12Q'"},
      {"cxl0:size=4X", "'4X'"},
      {"cxl0:size=-1G", "'-1G'"},
      {"cxl0:size=0", "size '0'"},
      {"cxl0:size=99999999999999999999", "'99999999999999999999'"},
      {"cxl0:size=2000T", "'2000T'"},
      {"cxl0:size=17179869184G", "'17179869184G'"},
      {"cxl0:size=4.5G", "'4.5G'"},
      {"cxl0:sise=4G", "unknown key 'sise'"},
      {"cxl0:size=4G,size=8G", "key 'size': given twice"},
      {"cxl0:size=4G,max_size=2G", "max_size 2147483648 is below size"},
      {"cxl0:max_size=0", "size '0'"},
      {"cxl0:max_size=lots", "'lots'"},
      {"cxl0:latency=250ns,read_latency=300ns", "key 'read_latency': conflicts with 'latency'"},
      {"cxl0:bandwidth=1GB/s,read_bandwidth=2GB/s", "key 'read_bandwidth': conflicts with 'bandwidth'"},
      {":size=4G", "bad device name ''"},
      {"0cxl:size=4G", "'0cxl'"},
      {"cx l:size=4G", "'cx l'"},
      {"a23456789012345678901234567890123:size=1G", "'a23456789012345678901234567890123'"},
      {"node1:size=4G", "'node1' is reserved"},
      {"dax0.0:size=1G", "'dax0.0' is reserved"},
      {"far:size=1G", "'far' is reserved"},
      {"tier2:size=1G", "'tier2' is reserved"},
      {"cxl0", "entry 'cxl0' has no ':'"},
      {"cxl0:backing=nvme", "unknown backing 'nvme'"},
      {"cxl0:backing=numa:x", "'numa:x'"},
      {"cxl0:backing=numa:", "'numa:'"},
      {"cxl0:backing=numa:5000", "'numa:5000'"},
      {"cxl0:backing=numa", "'numa'"},
      {"cxl0:backing=file:relative/path", "'relative/path'"},
      {"cxl0:backing=devdax:dax0.0", "'dax0.0'"},
      {"cxl0:backing=shm:bad/name", "'bad/name'"},
      {"cxl0:backing=shm:", "bad shm name ''"},
      {"cxl0:backing=memfd:x", "'x'"},
      {"cxl0:latency=250", "'250'"},
      {"cxl0:latency=250ms", "'250ms'"},
      {"cxl0:latency=0ns", "'0ns'"},
      {"cxl0:latency=200000us", "'200000us'"},
      {"cxl0:bandwidth=30", "'30'"},
      {"cxl0:bandwidth=30Gb/s", "'30Gb/s'"},
      {"cxl0:bandwidth=0MB/s", "'0MB/s'"},
      {"cxl0:tier=16", "'16'"},
      {"cxl0:tier=-1", "'-1'"},
      {"cxl0:tier=one", "'one'"},
      {"cxl0:size=4G,,latency=250ns", "stray ','"},
      {"cxl0:size", "'size' has no '='"},
      {"cxl0:size=", "key 'size': empty value"},
      {"cxl0:=4G", "empty key in '=4G'"},
      {"cxl0:size=4G;;far:size=1G", "empty device entry #2"},
      {"cxl0:size=4G;", "empty device entry #2"},
      {"cxl0:size=4G;cxl0:size=8G", "'cxl0' is declared twice"},
  };
  static_assert(sizeof(cases) / sizeof(cases[0]) >= 30, "the test plan asks for at least 30 bad inputs");
  for (const Case& c : cases) {
    INFO("input: " << c.input);
    std::string msg = error_of(c.input);
    CHECK(msg.find(c.token) != std::string::npos);
    CHECK(msg.rfind("CXLPOOL_DEVICES", 0) == 0);  // says where the bad text came from
  }
}

TEST_CASE("device-level errors name the device", "[unit]") {
  CHECK(error_of("far1:backing=shm,size=12Q").find("device 'far1': key 'size'") != std::string::npos);
  CHECK(error_of("ok:size=1G;far1:latency=fast").find("device 'far1': key 'latency'") != std::string::npos);
}

TEST_CASE("good declarations parse and round-trip", "[unit]") {
  auto devs = parse_device_list(
      "cxl0:backing=shm,size=4G,latency=250ns,bandwidth=30GB/s; far1:backing=numa:1 ;"
      "pool0: backing=file:/dev/shm/pool0, size=64M, max_size=1G, tier=2;"
      "dax0: backing=devdax:/dev/dax0.0;named:backing=shm:my.pool-1,read_latency=0.4us,write_latency=500ns,"
      "read_bw=10GB/s,write_bw=5GB/s;bare:",
      "CXLPOOL_DEVICES");
  REQUIRE(devs.size() == 6);
  CHECK(devs[0].name == "cxl0");
  CHECK(devs[0].backing == CXLPOOL_BACKING_MEMFD);
  CHECK(devs[0].size == 4ull << 30);
  CHECK(devs[0].read_latency_ns == 250u);
  CHECK(devs[0].read_bandwidth_mbps == 30000u);
  CHECK(devs[0].write_bandwidth_mbps == 30000u);
  CHECK(devs[1].backing == CXLPOOL_BACKING_NUMA);
  CHECK(devs[1].numa_node == 1);
  CHECK(devs[2].backing == CXLPOOL_BACKING_FILE);
  CHECK(devs[2].path == "/dev/shm/pool0");
  CHECK(devs[2].tier == 2);
  CHECK(devs[2].max_size == 1ull << 30);
  CHECK(devs[3].backing == CXLPOOL_BACKING_DEVDAX);
  CHECK(devs[4].backing == CXLPOOL_BACKING_SHM);
  CHECK(devs[4].path == "my.pool-1");
  CHECK(devs[4].read_latency_ns == 400u);
  CHECK(devs[4].write_bandwidth_mbps == 5000u);
  CHECK(devs[5].name == "bare");
  CHECK(devs[5].backing == CXLPOOL_BACKING_MEMFD);

  std::string joined;
  for (auto& d : devs) joined += (joined.empty() ? "" : ";") + format_device(d);
  auto again = parse_device_list(joined, "round-trip");
  REQUIRE(again.size() == devs.size());
  for (size_t i = 0; i < devs.size(); ++i) {
    INFO(format_device(devs[i]));
    CHECK(again[i] == devs[i]);
  }
}

TEST_CASE("config files: one device per line, comments, line numbers in errors", "[unit]") {
  auto devs = parse_device_lines("# far memory\n\ncxl0:backing=shm,size=1G  # the default\n far1:backing=numa:0\n",
                                 "/etc/cxlpool.conf");
  REQUIRE(devs.size() == 2);
  CHECK(devs[0].origin == "/etc/cxlpool.conf:3");
  CHECK(devs[1].name == "far1");
  try {
    parse_device_lines("cxl0:size=1G\n# ok\nslow:size=7Z\n", "my.conf");
    FAIL("accepted a bad line");
  } catch (const Failure& f) {
    CHECK(std::string(f.what()).find("my.conf:3: device 'slow': key 'size': bad size '7Z'") != std::string::npos);
  }
  CHECK_THROWS_WITH(parse_device_lines("a:size=1G;b:size=1G\n", "f"),
                    Catch::Contains("f:1") && Catch::Contains("one device per line"));
  CHECK_THROWS_WITH(parse_device_lines("a:size=1G\na:size=2G\n", "f"),
                    Catch::Contains("f:2") && Catch::Contains("declared twice"));
}

TEST_CASE("unreadable config files are config errors naming the path", "[unit]") {
  CHECK_THROWS_WITH(parse_device_file("/nonexistent/cxlpool.conf"), Catch::Contains("/nonexistent/cxlpool.conf"));
  CHECK_THROWS_WITH(parse_device_file("/tmp"), Catch::Contains("'/tmp'"));
  cxlpool_test::ScratchDir dir;
  std::string path = dir.path() + "/devices.conf";
  std::ofstream(path) << "cxl0:backing=shm,size=64M\n";
  auto devs = parse_device_file(path);
  REQUIRE(devs.size() == 1);
  CHECK(devs[0].origin == path + ":1");
}

TEST_CASE("declarations that need the topology are checked at discovery", "[unit]") {
  DiscoverOptions o;
  o.sysfs_root = fixture("one-node");
  o.ignore_env = true;
  auto fails_with = [&](const std::string& devices, const std::string& token) {
    o.devices = devices;
    INFO(devices);
    try {
      discover(o);
      FAIL("accepted");
    } catch (const Failure& f) {
      CHECK(f.status() == CXLPOOL_E_CONFIG);
      CHECK(std::string(f.what()).find(token) != std::string::npos);
    }
  };
  fails_with("far1:backing=numa:7", "'numa:7' does not exist");
  fails_with("far1:backing=numa:0,size=64G", "64.0 GiB exceeds the capacity of node 0");
  fails_with("p:backing=file:/nonexistent-dir/pool", "'file:/nonexistent-dir/pool'");
  fails_with("d:backing=devdax:/dev/dax9.9", "'devdax:/dev/dax9.9'");
  o.devices.reset();
  o.config_file = "/nonexistent/devices.conf";
  try {
    discover(o);
    FAIL("accepted");
  } catch (const Failure& f) {
    CHECK(f.status() == CXLPOOL_E_CONFIG);
    CHECK(std::string(f.what()).find("/nonexistent/devices.conf") != std::string::npos);
  }
}

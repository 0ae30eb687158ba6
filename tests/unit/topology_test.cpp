// SPDX-License-Identifier: MIT
// Topology discovery against fake sysfs trees (tests/fixtures/sysfs): the model, the tier
// ranking and the source of every attribute; emulated and default devices; kernel state.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

using namespace cxlpool::detail;
using cxlpool_test::fixture;
using cxlpool_test::ScopedEnv;

namespace {
Topology load(const std::string& tree, bool default_device = true, std::optional<std::string> devices = {}) {
  DiscoverOptions o;
  o.sysfs_root = fixture(tree);
  o.ignore_env = true;
  o.no_default_device = !default_device;
  o.devices = std::move(devices);
  return discover(o);
}
const Target& get(const Topology& t, const std::string& name) {
  const Target* p = t.find(name);
  REQUIRE(p != nullptr);
  return *p;
}
bool has_warning(const Topology& t, const std::string& text) {
  return std::any_of(t.warnings.begin(), t.warnings.end(), [&](auto& w) { return w.find(text) != std::string::npos; });
}
}  // namespace

TEST_CASE("one node: DRAM in tier 0 plus the default emulated far device", "[unit]") {
  Topology t = load("one-node");
  REQUIRE(t.targets.size() == 2);
  const Target& n0 = get(t, "node0");
  CHECK(n0.kind == CXLPOOL_TARGET_NUMA_NODE);
  CHECK(n0.cpu_count.value == 4);
  CHECK(n0.cpu_count.source == CXLPOOL_SOURCE_SYSFS);
  CHECK_FALSE(n0.cpuless.value);
  CHECK(n0.capacity.value == 16ull << 30);
  CHECK(n0.capacity.source == CXLPOOL_SOURCE_SYSFS);
  CHECK(n0.free.value == 12ull << 30);
  CHECK(n0.kernel_tier.value == 4);
  CHECK(n0.kernel_tier.source == CXLPOOL_SOURCE_SYSFS);
  CHECK_FALSE(n0.read_latency_ns.known());
  CHECK(n0.tier.value == 0);
  CHECK(n0.tier.source == CXLPOOL_SOURCE_COMPUTED);
  CHECK(n0.backing.kind == CXLPOOL_BACKING_NUMA);

  CHECK(t.default_device);
  const Target& cxl = get(t, "cxl0");
  CHECK(cxl.kind == CXLPOOL_TARGET_EMULATED);
  CHECK(cxl.backing.kind == CXLPOOL_BACKING_MEMFD);
  CHECK(cxl.read_latency_ns.value == kDefaultCxlLatencyNs);
  CHECK(cxl.read_latency_ns.source == CXLPOOL_SOURCE_DEFAULT);
  CHECK(cxl.read_bandwidth_mbps.source == CXLPOOL_SOURCE_DEFAULT);
  CHECK(cxl.capacity.source == CXLPOOL_SOURCE_DEFAULT);
  CHECK(cxl.capacity.value >= (64u << 20));
  CHECK(cxl.capacity.value <= (16ull << 30) / 4);
  CHECK(cxl.tier.value == 1);
  CHECK(cxl.caps.shareable);
  CHECK(t.tier_count == 2);
  CHECK(has_warning(t, "default emulated device 'cxl0'"));

  CHECK(t.kernel.numa_balancing.value == 1);
  CHECK(t.kernel.numa_balancing.source == CXLPOOL_SOURCE_PROCFS);
  CHECK(t.kernel.demotion_enabled.source == CXLPOOL_SOURCE_SYSFS);
  CHECK_FALSE(t.kernel.demotion_enabled.value);
  CHECK_FALSE(t.kernel.weighted_interleave.value);
  CHECK_FALSE(t.hwloc_used);  // never with a custom sysfs root

  Topology bare = load("one-node", false);
  CHECK(bare.targets.size() == 1);
  CHECK(bare.tier_count == 1);
  CHECK_FALSE(bare.default_device);
}

TEST_CASE("two sockets without HMAT: both local DRAM, one tier, SLIT distances", "[unit]") {
  Topology t = load("two-socket", false);
  REQUIRE(t.targets.size() == 2);
  const Target& n0 = get(t, "node0");
  const Target& n1 = get(t, "node1");
  CHECK(n0.tier.value == 0);
  CHECK(n1.tier.value == 0);
  CHECK(n0.distances.at(1) == 21);
  CHECK(n0.distance_source == CXLPOOL_SOURCE_SLIT);
  CHECK(n1.distance_basis == "slit");
  CHECK(n1.abstract_distance.value == Approx(1000));
  CHECK(has_warning(t, "ranked by SLIT distance"));
  CHECK(t.kernel.memory_tiers.at(4) == std::vector<int>{0, 1});
}

TEST_CASE("CPU-less node with HMAT: slower tier, latency and bandwidth from hmat", "[unit]") {
  Topology t = load("cpuless-hmat");
  CHECK_FALSE(t.default_device);  // a CPU-less memory node is far memory already
  REQUIRE(t.targets.size() == 2);
  const Target& n0 = get(t, "node0");
  const Target& n1 = get(t, "node1");
  CHECK(n1.cpuless.value);
  CHECK(n1.cpuless.source == CXLPOOL_SOURCE_SYSFS);
  CHECK(n1.cpulist.empty());
  CHECK(n1.read_latency_ns.value == 300);
  CHECK(n1.read_latency_ns.source == CXLPOOL_SOURCE_HMAT);
  CHECK(n1.write_latency_ns.source == CXLPOOL_SOURCE_HMAT);
  CHECK(n1.read_bandwidth_mbps.value == 5000);
  CHECK(n1.read_bandwidth_mbps.source == CXLPOOL_SOURCE_HMAT);
  CHECK(n0.read_latency_ns.value == 100);
  CHECK(n0.tier.value == 0);
  CHECK(n1.tier.value == 1);
  CHECK(n1.abstract_distance.value == Approx(12000));  // 3x latency, 1/4 bandwidth
  CHECK(n1.distance_basis == "latency+bandwidth");
  CHECK(n1.kernel_tier.value == 22);
  CHECK(t.kernel.weighted_interleave.value);
  CHECK(n0.interleave_weight.value == 3);
  CHECK(n1.interleave_weight.value == 1);
  CHECK(n1.interleave_weight.source == CXLPOOL_SOURCE_SYSFS);
  CHECK(has_warning(t, "numa_balancing=1"));
  CHECK(has_warning(t, "demotion is disabled"));
  CHECK_FALSE(has_warning(t, "SLIT"));
}

TEST_CASE("CPU-less node without HMAT: ranked slower by SLIT distance", "[unit]") {
  Topology t = load("cpuless-nohmat");
  const Target& n1 = get(t, "node1");
  CHECK_FALSE(n1.read_latency_ns.known());
  CHECK(n1.tier.value == 1);
  CHECK(n1.distance_basis == "slit");
  CHECK(n1.abstract_distance.value == Approx(3000));
  CHECK(n1.kernel_tier.value == 4);  // 6.1 kernels put everything in one tier without HMAT
  CHECK(t.kernel.numa_balancing.value == 2);
  CHECK_FALSE(has_warning(t, "numa_balancing=1"));
  CHECK(t.kernel.demotion_enabled.value);
}

TEST_CASE("three speeds give three tiers", "[unit]") {
  Topology t = load("three-tier");
  REQUIRE(t.tier_count == 3);
  CHECK(get(t, "node0").tier.value == 0);
  CHECK(get(t, "node1").tier.value == 1);
  CHECK(get(t, "node2").tier.value == 2);
  CHECK(get(t, "node1").abstract_distance.value == Approx(5000));
  CHECK(get(t, "node2").abstract_distance.value == Approx(60000));
}

TEST_CASE("CXL memdevs, regions and DAX devices", "[unit]") {
  Topology t = load("cxl-dax");
  CHECK(t.memdevs.size() == 2);
  CHECK(t.memdevs[0].ram_bytes == 4ull << 30);
  CHECK(t.memdevs[0].serial == "0x1");
  REQUIRE(t.regions.size() == 2);
  CHECK(t.regions[0].mode == "ram");
  CHECK(t.regions[0].dax_device == "dax0.0");
  CHECK(t.regions[0].targets == std::vector<std::string>{"decoder3.0"});
  REQUIRE(t.dax_devices.size() == 2);
  CHECK(t.dax_devices[0].driver == "kmem");
  const Target& n1 = get(t, "node1");
  CHECK(n1.cxl_backed.value);
  CHECK(n1.cxl_backed.source == CXLPOOL_SOURCE_SYSFS);
  CHECK(n1.cxl_region == "region0");
  CHECK_FALSE(get(t, "node0").cxl_backed.value);
  const Target& dax = get(t, "dax1.0");  // devdax mode: a target of its own
  CHECK(dax.kind == CXLPOOL_TARGET_DAX);
  CHECK(dax.capacity.value == 2ull << 30);
  CHECK(dax.backing.kind == CXLPOOL_BACKING_DEVDAX);
  CHECK(dax.backing.path == "/dev/dax1.0");
  CHECK(dax.caps.page_size == 2u << 20);
  CHECK(dax.numa_node == 2);
  CHECK(dax.cxl_backed.value);
  CHECK(t.find("dax0.0") == nullptr);  // kmem mode: its memory is node1
  CHECK_FALSE(t.default_device);
}

// The layout the kernel's own stack makes of a persistent-memory CXL region (recorded in the
// CXL guest, kernels 6.1 and 6.12): the DAX device sits under the NVDIMM bus below the CXL
// root, not under the region, and its physical address is root-only.
struct PmemRegionTree {
  std::filesystem::path root;
  explicit PmemRegionTree(bool kmem) {
    char tmpl[] = "/tmp/cxlpool-pmem-tree-XXXXXX";
    root = mkdtemp(tmpl);
    file("sys/devices/system/node/online", "0-1");
    file("sys/devices/system/node/possible", "0-1");
    file("sys/devices/system/node/has_cpu", "0");
    file("sys/devices/system/node/node0/cpulist", "0-1");
    file("sys/devices/system/node/node0/distance", "10 20");
    file("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:         921232 kB");
    file("sys/devices/system/node/node0/memory1/phys_index", "00000001");
    file("sys/devices/system/memory/block_size_bytes", "8000000");
    if (kmem) {
      file("sys/devices/system/node/has_memory", "0-1");
      file("sys/devices/system/node/node1/cpulist", "");
      file("sys/devices/system/node/node1/distance", "20 10");
      file("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:         393216 kB");
      for (int b : {123, 124, 125}) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "%08x", b);
        file("sys/devices/system/node/node1/memory" + std::to_string(b) + "/phys_index", hex);
      }
    }
    const std::string platform = "sys/devices/platform/ACPI0017:00/root0";
    std::filesystem::create_directories(root / platform);
    link("sys/bus/cxl/devices/root0", "../../../devices/platform/ACPI0017:00/root0");
    file("sys/bus/cxl/devices/mem0/pmem/size", "0x20000000");
    file("sys/bus/cxl/devices/mem0/ram/size", "0x0");
    file("sys/bus/cxl/devices/mem0/serial", "0x0");
    file("sys/bus/cxl/devices/mem0/numa_node", "-1");
    file("sys/bus/cxl/devices/region0/mode", "pmem");
    file("sys/bus/cxl/devices/region0/size", "0x20000000");
    file("sys/bus/cxl/devices/region0/resource", "0x3d0000000");
    file("sys/bus/cxl/devices/region0/interleave_ways", "1");
    file("sys/bus/cxl/devices/region0/target0", "decoder2.0");
    const std::string dax = platform + "/nvdimm-bridge0/ndbus0/region0/dax0.0/dax0.0";
    file(dax + "/size", "526385152");
    file(dax + "/align", "2097152");
    file(dax + "/target_node", "1");
    link(dax + "/driver", kmem ? "../../../bus/dax/drivers/kmem" : "../../../bus/dax/drivers/device_dax");
    link("sys/bus/dax/devices/dax0.0",
         "../../../devices/platform/ACPI0017:00/root0/nvdimm-bridge0/ndbus0/region0/dax0.0/dax0.0");
  }
  ~PmemRegionTree() { std::filesystem::remove_all(root); }
  void file(const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text << "\n";
  }
  void link(const std::string& rel, const std::string& target) {
    std::filesystem::create_directories((root / rel).parent_path());
    std::filesystem::create_symlink(target, root / rel);
  }
  Topology load() {
    DiscoverOptions o;
    o.sysfs_root = (root / "sys").string();
    o.ignore_env = true;
    return discover(o);
  }
};

TEST_CASE("a persistent-memory CXL region: its DAX device and its node are CXL memory", "[unit]") {
  SECTION("devdax, as a user (no physical address): CXL memory by its place below the CXL root") {
    PmemRegionTree tree(false);
    Topology t = tree.load();
    const Target& dax = get(t, "dax0.0");
    CHECK(dax.cxl_backed.value);
    CHECK(dax.cxl_backed.source == CXLPOOL_SOURCE_SYSFS);
    CHECK(dax.cxl_region.empty());  // which region: root only
    CHECK(t.find("cxl0") == nullptr);
  }
  SECTION("devdax, as root: matched to its region by address") {
    PmemRegionTree tree(false);
    tree.file("sys/devices/platform/ACPI0017:00/root0/nvdimm-bridge0/ndbus0/region0/dax0.0/dax0.0/resource",
              "0x3d8000000");
    Topology t = tree.load();
    CHECK(get(t, "dax0.0").cxl_region == "region0");
    REQUIRE(t.regions.size() == 1);
    CHECK(t.regions[0].dax_device == "dax0.0");
    CHECK(t.regions[0].resource == 0x3d0000000ull);
  }
  SECTION("system RAM (kmem): the node's memory blocks lie in the region, the DRAM node's do not") {
    PmemRegionTree tree(true);
    Topology t = tree.load();
    const Target& n1 = get(t, "node1");
    CHECK(n1.cxl_backed.value);
    CHECK(n1.cxl_region == "region0");
    const Target& n0 = get(t, "node0");
    CHECK(n0.cxl_backed.known());
    CHECK_FALSE(n0.cxl_backed.value);
    CHECK(t.find("dax0.0") == nullptr);
  }
  SECTION("no claim without evidence: a kmem node with no memory blocks listed, a root link to a directory above") {
    PmemRegionTree tree(true);
    for (int b : {123, 124, 125})
      std::filesystem::remove_all(tree.root / ("sys/devices/system/node/node1/memory" + std::to_string(b)));
    std::filesystem::remove_all(tree.root / "sys/devices/system/node/node0/memory1");
    Topology t = tree.load();
    CHECK(get(t, "node1").cxl_backed.value);  // onlined from a DAX device below the CXL root
    CHECK(get(t, "node1").cxl_region.empty());
    CHECK_FALSE(get(t, "node0").cxl_backed.known());  // no block read: nothing said
    std::filesystem::remove(tree.root / "sys/bus/cxl/devices/root0");
    tree.link("sys/bus/cxl/devices/root0", "../../../devices");
    Topology wide = tree.load();
    CHECK_FALSE(get(wide, "node1").cxl_backed.known());  // "devices" is no root port
  }
  SECTION("a region with no DAX device, a memdev with no region: warnings say the next step") {
    PmemRegionTree tree(false);
    std::filesystem::remove(tree.root / "sys/bus/dax/devices/dax0.0");
    Topology t = tree.load();
    auto has = [&](const std::string& text) {
      return std::any_of(t.warnings.begin(), t.warnings.end(),
                         [&](const std::string& w) { return w.find(text) != std::string::npos; });
    };
    CHECK(
        has("CXL region region0 (pmem, 512.0 MiB) has no DAX device or NUMA node: make one with "
            "'ndctl create-namespace -m devdax'"));
    CHECK(t.find("cxl0") != nullptr);  // nothing usable: the emulated default stands in
    CHECK(has("no usable CXL memory found"));
    std::filesystem::remove_all(tree.root / "sys/bus/cxl/devices/region0");
    Topology bare = tree.load();
    CHECK(std::any_of(bare.warnings.begin(), bare.warnings.end(), [](const std::string& w) {
      return w.find("CXL memory device(s) mem0 (512.0 MiB persistent) have no region") != std::string::npos;
    }));
  }
}

TEST_CASE("declared devices: numa:N inherits the node, declared figures are config", "[unit]") {
  Topology t =
      load("cpuless-hmat", true, "slow1:backing=numa:1,tier=3;cxl9:backing=shm,size=1G,latency=400ns,bandwidth=10GB/s");
  CHECK_FALSE(t.default_device);
  const Target& far = get(t, "slow1");
  CHECK(far.kind == CXLPOOL_TARGET_EMULATED);
  CHECK(far.numa_node == 1);
  CHECK(far.read_latency_ns.value == 300);
  CHECK(far.read_latency_ns.source == CXLPOOL_SOURCE_HMAT);
  CHECK(far.capacity.value == 4ull << 30);
  CHECK(far.capacity.source == CXLPOOL_SOURCE_SYSFS);
  CHECK(far.tier.value == 3);
  CHECK(far.tier.source == CXLPOOL_SOURCE_CONFIG);
  CHECK(far.cpuless.value);
  CHECK(far.origin == "devices");
  const Target& cxl9 = get(t, "cxl9");
  CHECK(cxl9.read_latency_ns.value == 400);
  CHECK(cxl9.read_latency_ns.source == CXLPOOL_SOURCE_CONFIG);
  CHECK(cxl9.write_bandwidth_mbps.value == 10000);
  CHECK(cxl9.capacity.value == 1ull << 30);
  CHECK(cxl9.capacity.source == CXLPOOL_SOURCE_CONFIG);
  // 4x latency, 2x less bandwidth than node0 -> 8000, which is 1.5x below node1's 12000.
  CHECK(cxl9.abstract_distance.value == Approx(8000));
  CHECK(get(t, "node0").tier.value == 0);
  CHECK(cxl9.tier.value == 1);
  CHECK(get(t, "node1").tier.value == 2);
  CHECK(t.tier_count == 4);  // the pinned tier 3
}

TEST_CASE("environment: CXLPOOL_DEVICES is read unless ignored or overridden", "[unit]") {
  ScopedEnv env("CXLPOOL_DEVICES", "envdev:backing=shm,size=64M");
  ScopedEnv cfg("CXLPOOL_CONFIG", nullptr);
  DiscoverOptions o;
  o.sysfs_root = fixture("one-node");
  CHECK(discover(o).find("envdev") != nullptr);
  CHECK_FALSE(discover(o).default_device);
  o.devices = "mine:backing=shm,size=64M";
  Topology t = discover(o);
  CHECK(t.find("mine") != nullptr);
  CHECK(t.find("envdev") == nullptr);
  o.devices.reset();
  o.ignore_env = true;
  CHECK(discover(o).find("envdev") == nullptr);
  ScopedEnv bad("CXLPOOL_DEVICES", "cxl0:backing=shm,size=12Q");
  o.ignore_env = false;
  CHECK_THROWS_WITH(discover(o), Catch::Contains("12Q"));
}

TEST_CASE("procfs: custom roots, and unknown rather than guessed", "[unit]") {
  DiscoverOptions o;
  o.sysfs_root = fixture("one-node");
  o.ignore_env = true;
  o.procfs_root = "/nonexistent-procfs";
  Topology t = discover(o);
  CHECK_FALSE(t.kernel.numa_balancing.known());
  o.sysfs_root = "/nonexistent-sysfs";
  CHECK_THROWS_WITH(discover(o), Catch::Contains("/nonexistent-sysfs"));
}

TEST_CASE("the live machine: at least one node and a ranked default", "[unit]") {
  DiscoverOptions o;
  o.ignore_env = true;
  Topology t = discover(o);
  REQUIRE_FALSE(t.targets.empty());
  CHECK(t.targets[0].kind == CXLPOOL_TARGET_NUMA_NODE);
  for (auto& target : t.targets) CHECK(target.tier.known());
  std::string json = topology_to_json(t);
  CHECK(json.find("\"targets\"") != std::string::npos);
}

// SPDX-License-Identifier: MIT
// Backing providers (lib/backing/provider.hpp): every built-in backend through the one
// interface (grammar round trip, named object, claim identity, capabilities, storage), and a
// backend added by this test alone — registered, then used by the device grammar, discovery, a
// private pool and a shared pool without any other file knowing of it. Shared pools take their
// location from the same grammar and refuse kinds that have no name.
#include "backing/provider.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "backing/storage.hpp"
#include "capi_topology.hpp"
#include "config/device_spec.hpp"
#include "cxlpool/cxlpool.h"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "test_support.hpp"

using namespace cxlpool::detail;

namespace {

BackingSpec parsed(const std::string& text) {
  BackingSpec s;
  const std::string why = parse_location(text, &s);
  INFO(text << ": " << why);
  REQUIRE(why.empty());
  return s;
}

std::string unique(const std::string& stem) {
  static int n = 0;
  return stem + "-" + std::to_string(getpid()) + "-" + std::to_string(++n);
}

// ---- a backend of the test's own: memfd memory, counted; shared pools in /dev/shm ----
std::atomic<int> g_fake_opens{0};

std::string fake_parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  if (!has_arg || arg.empty() || arg.find('/') != std::string_view::npos) return "fake needs fake:TAG";
  out->path = std::string(arg);
  return "";
}
std::string fake_format(const BackingSpec& s) { return "fakemem:" + s.path; }
std::string fake_named(const BackingSpec& s) { return "/dev/shm/cxlpool-fake-" + s.path; }
std::string fake_claim(const BackingSpec&) { return ""; }
void fake_open(const BackingSpec& spec, bool, StorageOpen* out) {
  ++g_fake_opens;
  out->fd = cxlpool::os::memfd_create("fake:" + spec.device_name);
  out->description = "the test's fake memory";
  out->sized_by_cxlpool = true;
}

// Its own declaration check: discovery asks the provider, not a list of kinds.
std::string fake_check(const BackingSpec& s, bool sized) {
  if (s.path == "refused") return "the fake refuses the tag 'refused'";
  return sized ? "" : "fakemem needs size=";
}

const Provider kFake = {"fakemem",  64,         "fakemem:TAG", false,           false,      fake_parse, fake_format,
                        fake_named, fake_claim, fake_open,     &kSharedFileOps, fake_check, nullptr};

void register_fake() {
  static const bool once = register_provider(&kFake);
  REQUIRE(once);
  REQUIRE(provider_named("fakemem") == &kFake);
}

}  // namespace

TEST_CASE("provider: every built-in backend parses and formats through the one grammar", "[provider]") {
  struct Case {
    const char* text;
    int kind;
    const char* canonical;
    const char* named;
  } cases[] = {
      {"numa:0", CXLPOOL_BACKING_NUMA, "numa:0", ""},
      {"shm", CXLPOOL_BACKING_MEMFD, "shm", ""},
      {"memfd", CXLPOOL_BACKING_MEMFD, "shm", ""},
      {"shm:pool.a-1", CXLPOOL_BACKING_SHM, "shm:pool.a-1", "/dev/shm/pool.a-1"},
      {"file:/tmp/x/p", CXLPOOL_BACKING_FILE, "file:/tmp/x/p", "/tmp/x/p"},
      {"devdax:/dev/dax0.0", CXLPOOL_BACKING_DEVDAX, "devdax:/dev/dax0.0", "/dev/dax0.0"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    const BackingSpec s = parsed(c.text);
    CHECK(s.kind == c.kind);
    CHECK(format_location(s) == c.canonical);
    const BackingSpec again = parsed(format_location(s));
    CHECK((again.kind == s.kind && again.path == s.path && again.numa_node == s.numa_node));
    const Provider* p = provider_for(s.kind);
    REQUIRE(p != nullptr);
    CHECK(p->named_path(s) == c.named);
    CHECK(p->claim_identity(s).empty() == std::string(c.named).empty());
    CHECK((p->shared != nullptr) == !std::string(c.named).empty());
  }
  const char* bad[] = {
      "numa",   "numa:x",       "numa:5000",           "memfd:x", "shm:",    "shm:a/b",       "shm:..", "file:rel",
      "file:/", "file:/tmp/p/", "devdax:/dev/dax0.0/", "file",    "devdax:", "devdax:dax0.0", "nvme",   ""};
  for (const char* text : bad) {
    BackingSpec s;
    INFO(text);
    CHECK_FALSE(parse_location(text, &s).empty());
  }
  BackingSpec s;
  CHECK_THAT(parse_location("nvme:0", &s), Catch::Contains("unknown backing 'nvme:0'") && Catch::Contains("numa:N"));
}

TEST_CASE("provider: capabilities and fork mode follow the provider's traits", "[provider]") {
  BackingSpec numa = parsed("numa:0"), dax = parsed("devdax:/dev/dax0.0"), file = parsed("file:/tmp/f");
  numa.capacity = dax.capacity = file.capacity = 8 << 20;
  CHECK(describe_backing(numa).kernel_migratable);
  CHECK_FALSE(describe_backing(numa).shareable);
  CHECK(describe_backing(numa).numa_node == 0);
  CHECK_FALSE(describe_backing(dax).decommit_frees_memory);
  CHECK(describe_backing(file).shareable);
  CHECK(effective_fork_mode(dax) == ForkMode::kCopy);
  dax.fork_mode = ForkMode::kCopyOnWrite;  // a device node is never mapped privately, whatever is asked
  CHECK(effective_fork_mode(dax) == ForkMode::kCopy);
  CHECK(effective_fork_mode(file) == ForkMode::kCopyOnWrite);
  CHECK(effective_fork_mode(file, true) == ForkMode::kCopy);
}

TEST_CASE("provider: each backend's storage opens through its provider and holds bytes", "[provider]") {
  cxlpool_test::ScratchDir dir;
  const std::string texts[] = {"numa:0", "shm", "shm:" + unique("cxlpool-test-prov"), "file:" + dir.path() + "/dev"};
  for (const auto& text : texts) {
    INFO(text);
    BackingSpec s = parsed(text);
    s.device_name = "p0";
    s.capacity = 8 << 20;
    auto storage = Storage::create(s);
    REQUIRE(storage);
    CHECK(storage->anonymous() == (s.kind == CXLPOOL_BACKING_NUMA));
    void* addr = nullptr;
    REQUIRE(cxlpool::os::prim::reserve(1 << 20, 4096, &addr) == 0);
    REQUIRE(storage->map(addr, 1 << 20, 0, true) == 0);
    REQUIRE(cxlpool::os::prim::protect(addr, 1 << 20, true) == 0);
    std::memset(addr, 0x5a, 1 << 20);
    CHECK(static_cast<unsigned char*>(addr)[12345] == 0x5a);
    cxlpool::os::prim::unmap(addr, 1 << 20);
    // The name itself is never created by a private device's storage.
    const std::string named = provider_for(s.kind)->named_path(s);
    if (!named.empty()) CHECK(cxlpool::os::path_kind(named).empty());
  }
}

TEST_CASE("provider: a backend added by a test alone serves private and shared pools", "[provider]") {
  register_fake();
  CHECK_FALSE(register_provider(&kFake));  // its word and kind are taken now
  CHECK_THAT(provider_syntaxes(), Catch::Contains("fakemem:TAG"));

  // The device grammar knows it.
  auto list = parse_device_list("f0:backing=fakemem:abc,size=16M", "test");
  REQUIRE(list.size() == 1);
  CHECK(list[0].backing == 64);
  CHECK(format_device(list[0]) == "f0:backing=fakemem:abc,size=16777216");
  CHECK_THROWS_WITH(parse_device_list("f0:backing=fakemem", "test"), Catch::Contains("fake needs fake:TAG"));

  // Discovery asks it whether a declaration can serve.
  for (const auto& [devices, why] : {std::pair<std::string, std::string>{"f0:backing=fakemem:refused,size=16M",
                                                                         "the fake refuses the tag 'refused'"},
                                     {"f0:backing=fakemem:abc", "fakemem needs size="}}) {
    cxlpool_config_t* c = nullptr;
    REQUIRE(cxlpool_config_create(&c) == CXLPOOL_OK);
    cxlpool_config_set_devices(c, devices.c_str());
    cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
    cxlpool_topology_t* t = nullptr;
    CHECK(cxlpool_topology_discover(c, &t) == CXLPOOL_E_CONFIG);
    CHECK_THAT(cxlpool_last_error_message(), Catch::Contains("key 'backing': " + why));
    CHECK(t == nullptr);
    cxlpool_config_destroy(c);
  }

  // Discovery, the registry and a private pool use it.
  const int before = g_fake_opens.load();
  {
    cxlpool_test::CapiTopology topo("f0:backing=fakemem:abc,size=16M", CXLPOOL_CONFIG_IGNORE_ENV |
                                                                           CXLPOOL_CONFIG_NO_HWLOC |
                                                                           CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
    cxlpool_pool_t* pool = topo.pool("f0", "bind:f0");
    auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool, 3 << 20));
    REQUIRE(p != nullptr);
    std::memset(p, 7, 3 << 20);
    cxlpool_stats_t st{};
    REQUIRE(cxlpool_pool_get_stats(pool, 0, &st) == CXLPOOL_OK);
    CHECK(st.resident_bytes >= (3u << 20));
    cxlpool_free(p);
    cxlpool_pool_destroy(pool);
  }
  CHECK(g_fake_opens.load() > before);

  // A shared pool lives in the provider's named object.
  const std::string tag = unique("t");
  const std::string device = "fakemem:" + tag;
  cxlpool_shared_params_t* params = nullptr;
  REQUIRE(cxlpool_shared_params_create(&params) == CXLPOOL_OK);
  cxlpool_shared_params_set_size(params, 8 << 20);
  cxlpool_shared_pool_t* sp = nullptr;
  const cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params, 0, &sp);
  cxlpool_shared_params_destroy(params);
  INFO(cxlpool_last_error_message());
  REQUIRE(st == CXLPOOL_OK);
  CHECK(cxlpool::os::path_kind("/dev/shm/cxlpool-fake-" + tag) == "regular file");
  void* b = nullptr;
  REQUIRE(cxlpool_shared_alloc(sp, 1000, &b) == CXLPOOL_OK);
  std::memset(b, 1, 1000);
  cxlpool_shared_free(sp, b);
  cxlpool_shared_pool_close(sp);
  REQUIRE(cxlpool_shared_pool_unlink(device.c_str()) == CXLPOOL_OK);
  CHECK(cxlpool::os::path_kind("/dev/shm/cxlpool-fake-" + tag).empty());
}

TEST_CASE("provider: a shared pool needs a named device and says which kinds are", "[provider]") {
  for (const char* device : {"numa:0", "shm", "memfd"}) {
    INFO(device);
    cxlpool_shared_pool_t* sp = nullptr;
    CHECK(cxlpool_shared_pool_open(device, nullptr, &sp) == CXLPOOL_E_CONFIG);
    CHECK_THAT(std::string(cxlpool_last_error_message()),
               Catch::Contains("named device") && Catch::Contains("shm:NAME") && Catch::Contains("devdax:PATH"));
  }
  cxlpool_shared_pool_t* sp = nullptr;
  CHECK(cxlpool_shared_pool_open("bogus:x", nullptr, &sp) == CXLPOOL_E_CONFIG);
  CHECK_THAT(std::string(cxlpool_last_error_message()), Catch::Contains("unknown backing 'bogus:x'"));
  // A devdax location that is no device-DAX node is refused before anything is opened.
  CHECK(cxlpool_shared_pool_open("devdax:/dev/null", nullptr, &sp) == CXLPOOL_E_CONFIG);
  CHECK_THAT(std::string(cxlpool_last_error_message()), Catch::Contains("not a device-DAX character device"));
}

TEST_CASE("provider: a shared pool's name that is a directory is refused as such, and left alone", "[provider]") {
  cxlpool_test::ScratchDir dir;
  const std::string sub = dir.path() + "/d";
  REQUIRE(mkdir(sub.c_str(), 0700) == 0);
  cxlpool_shared_params_t* params = nullptr;
  REQUIRE(cxlpool_shared_params_create(&params) == CXLPOOL_OK);
  cxlpool_shared_params_set_size(params, 8 << 20);
  cxlpool_shared_pool_t* sp = nullptr;
  const std::string device = "file:" + sub;
  CHECK(cxlpool_shared_pool_create(device.c_str(), params, 0, &sp) == CXLPOOL_E_CONFIG);
  CHECK_THAT(std::string(cxlpool_last_error_message()), Catch::Contains("is a directory"));
  CHECK(cxlpool_shared_pool_create((device + "/").c_str(), params, 0, &sp) == CXLPOOL_E_CONFIG);
  CHECK_THAT(std::string(cxlpool_last_error_message()), Catch::Contains("ends in '/'"));
  cxlpool_shared_params_destroy(params);
  CHECK(cxlpool::os::path_kind(sub) == "directory");
}

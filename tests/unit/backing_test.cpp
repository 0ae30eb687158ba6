// SPDX-License-Identifier: MIT
// Backings through the public C++ layer: allocate, touch, verify, release on every kind;
// capacity limits; a named shm device seen by a second process; numa placement verified
// with move_pages status queries; bad arguments.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "cxlpool/cxlpool.hpp"
#include "test_support.hpp"

using cxlpool_test::ScratchDir;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

std::string unique(const std::string& base) { return base + "-" + std::to_string(getpid()); }

cxlpool::Topology topology_with(const std::string& devices) {
  cxlpool::Config c;
  c.devices(devices).flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE | CXLPOOL_CONFIG_NO_HWLOC);
  return cxlpool::Topology::discover(&c);
}

cxlpool_status_t status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cxlpool::Error& e) {
    return e.status();
  }
  return CXLPOOL_OK;
}

void fill(void* p, size_t n) {
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) c[i] = static_cast<unsigned char>((i * 7 + 3) & 0xff);
}
bool check_fill(const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (c[i] != static_cast<unsigned char>((i * 7 + 3) & 0xff)) return false;
  return true;
}
bool all_zero(const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (c[i]) return false;
  return true;
}

}  // namespace

TEST_CASE("every backing kind: reserve, commit, touch, verify, decommit, release", "[unit][numa]") {
  ScratchDir dir;
  const std::string shm = unique("cxlpool-test-rw");
  auto topo =
      topology_with("mf:backing=shm,size=64M;sh:backing=shm:" + shm + ",size=64M;fl:backing=file:" + dir.path() +
                    "/pool,size=64M;dz:backing=devdax:/dev/zero,size=64M;n0:backing=numa:0,size=64M");
  for (const char* name : {"mf", "sh", "fl", "dz", "n0", "node0"}) {
    INFO("device " << name);
    auto target = topo.find(name);
    REQUIRE(target);
    auto backing = cxlpool::Backing::open(topo, *target);
    auto caps = backing.caps();
    CHECK(caps.page_size == 4096u);
    CHECK(bool(caps.shareable) == (caps.kind != CXLPOOL_BACKING_NUMA));
    {
      auto r = backing.reserve(8 * kMiB);
      REQUIRE(r);
      CHECK(backing.usage().committed_bytes == 0);
      r.commit();
      CHECK(backing.usage().committed_bytes == 8 * kMiB);
      fill(r.data(), r.size());
      CHECK(check_fill(r.data(), r.size()));
      r.commit(0, 4 * kMiB);  // committing committed pages is not counted twice
      CHECK(backing.usage().committed_bytes == 8 * kMiB);
      r.decommit(4 * kMiB, 4 * kMiB);
      CHECK(backing.usage().committed_bytes == 4 * kMiB);
      r.commit(4 * kMiB, 4 * kMiB);
      if (caps.decommit_frees_memory) CHECK(all_zero(static_cast<char*>(r.data()) + 4 * kMiB, 4 * kMiB));
      CHECK(check_fill(r.data(), 4 * kMiB));
      CHECK(backing.usage().peak_committed_bytes == 8 * kMiB);
      CHECK(backing.usage().reservations == 1);
    }
    auto u = backing.usage();
    CHECK(u.committed_bytes == 0);
    CHECK(u.reserved_bytes == 0);
    CHECK(u.reservations == 0);
  }
  CHECK_FALSE(std::filesystem::exists("/dev/shm/" + shm));  // created by us, unlinked on close
}

TEST_CASE("capacity: over-asking fails clearly and changes nothing", "[unit][numa]") {
  auto topo = topology_with("small:backing=shm,size=16M;n0:backing=numa:0,size=16M");
  SECTION("fd backing: reservations are bounded by the device") {
    auto b = cxlpool::Backing::open(topo, *topo.find("small"));
    CHECK(b.caps().capacity_bytes == 16 * kMiB);
    try {
      b.reserve(32 * kMiB);
      FAIL("over-reservation accepted");
    } catch (const cxlpool::Error& e) {
      CHECK(e.status() == CXLPOOL_E_CAPACITY);
      CHECK(std::string(e.what()).find("device 'small'") != std::string::npos);
    }
    auto r1 = b.reserve(12 * kMiB);
    CHECK(status_of([&] { b.reserve(8 * kMiB); }) == CXLPOOL_E_CAPACITY);
    auto r2 = b.reserve(4 * kMiB);
    r1.commit();
    r2.commit();
    CHECK(b.usage().committed_bytes == 16 * kMiB);
    r1.reset();
    auto r3 = b.reserve(8 * kMiB);  // freed device range is reused
    r3.commit();
    CHECK(b.usage().committed_bytes == 12 * kMiB);
  }
  SECTION("numa backing: commits are bounded by the declared size") {
    auto b = cxlpool::Backing::open(topo, *topo.find("n0"));
    auto r = b.reserve(64 * kMiB);  // address space only
    r.commit(0, 12 * kMiB);
    try {
      r.commit(12 * kMiB, 8 * kMiB);
      FAIL("over-commit accepted");
    } catch (const cxlpool::Error& e) {
      CHECK(e.status() == CXLPOOL_E_CAPACITY);
      CHECK(std::string(e.what()).find("exceed its capacity") != std::string::npos);
    }
    CHECK(b.usage().committed_bytes == 12 * kMiB);
    r.decommit(0, 8 * kMiB);
    r.commit(12 * kMiB, 8 * kMiB);
    CHECK(b.usage().committed_bytes == 12 * kMiB);
  }
}

TEST_CASE("a named shm device shows the same contents to a second process", "[unit]") {
  const std::string name = unique("cxlpool-test-peer");
  const std::string spec = "pool:backing=shm:" + name + ",size=8M";
  auto topo = topology_with(spec);
  auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
  auto r = b.reserve(1 * kMiB);
  CHECK(r.device_offset() == 0);
  r.commit();
  fill(r.data(), r.size());

  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setenv("CXLPOOL_DEVICES", spec.c_str(), 1);
    std::string peer = std::string(CXLPOOL_TEST_BINARY_DIR) + "/shm_peer";
    std::string bytes = std::to_string(kMiB);
    execl(peer.c_str(), peer.c_str(), "pool", bytes.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(static_cast<unsigned char*>(r.data())[0] == 0x5a);  // the peer's write is visible here
}

TEST_CASE("numa backing on node 0: pages verified with move_pages status queries", "[unit][numa]") {
  auto topo = topology_with("n0:backing=numa:0,size=64M");
  auto b = cxlpool::Backing::open(topo, *topo.find("n0"));
  CHECK(b.caps().kernel_migratable);
  CHECK(b.caps().numa_node == 0);
  auto r = b.reserve(4 * kMiB);
  madvise(r.data(), r.size(), MADV_NOHUGEPAGE);  // exact page counts
  r.commit(0, r.size(), CXLPOOL_COMMIT_POPULATE);
  auto nodes = cxlpool::query_nodes(r.data(), r.size() / 4096);
  size_t on_node0 = size_t(std::count(nodes.begin(), nodes.end(), 0));
  CHECK(on_node0 == nodes.size());
  r.decommit();
  nodes = cxlpool::query_nodes(r.data(), 4);
  CHECK(nodes[0] == -ENOENT);  // decommitted pages are gone
}

TEST_CASE("bad arguments are rejected with the right status", "[unit]") {
  auto topo = topology_with("mf:backing=shm,size=16M;n0:backing=numa:0,size=16M");
  auto b = cxlpool::Backing::open(topo, *topo.find("mf"));
  cxlpool_backing_t* raw = b.get();
  void* p = nullptr;
  CHECK(cxlpool_backing_reserve(raw, 0, 0, &p) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_backing_reserve(raw, 4096, 3, &p) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_backing_reserve(raw, 4096, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(p == nullptr);  // outputs are written only on success
  REQUIRE(cxlpool_backing_reserve(raw, 4 * kMiB, kMiB, &p) == CXLPOOL_OK);
  CHECK(reinterpret_cast<uintptr_t>(p) % kMiB == 0);
  CHECK(cxlpool_backing_commit(raw, static_cast<char*>(p) + 1, 4096, 0) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_backing_commit(raw, p, 4096, 0x80) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_backing_commit(raw, static_cast<char*>(p) + 4 * kMiB, 4096, 0) == CXLPOOL_E_NOT_FOUND);
  CHECK(cxlpool_backing_commit(raw, p, 8 * kMiB, 0) == CXLPOOL_E_NOT_FOUND);  // runs past the reservation
  CHECK(cxlpool_backing_release(raw, static_cast<char*>(p) + 4096) == CXLPOOL_E_NOT_FOUND);
  CHECK(cxlpool_backing_map(raw, 100, 4096, &p) == CXLPOOL_E_INVALID_ARGUMENT);
  void* q = nullptr;
  CHECK(cxlpool_backing_map(raw, 12 * kMiB, 8 * kMiB, &q) == CXLPOOL_E_CAPACITY);
  CHECK(cxlpool_backing_close(raw) == CXLPOOL_E_BUSY);  // live reservation: nothing closed
  cxlpool_error_info_t err{};
  cxlpool_last_error(&err);
  CHECK(err.status == CXLPOOL_E_BUSY);
  CHECK(std::string(err.message).find("device 'mf'") != std::string::npos);
  CHECK(cxlpool_backing_release(raw, p) == CXLPOOL_OK);

  auto numa = cxlpool::Backing::open(topo, *topo.find("n0"));
  CHECK(cxlpool_backing_map(numa.get(), 0, 4096, &q) == CXLPOOL_E_NOT_SUPPORTED);
  int fd = -1;
  CHECK(cxlpool_backing_fd(numa.get(), &fd) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(cxlpool_backing_fd(b.get(), &fd) == CXLPOOL_OK);
  CHECK(fd >= 0);
}

TEST_CASE("shm objects owned by others or open to others are not adopted", "[unit]") {
  const std::string name = unique("cxlpool-test-squat");
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
  REQUIRE(fd >= 0);
  fchmod(fd, 0644);
  close(fd);
  auto topo = topology_with("sq:backing=shm:" + name + ",size=4M");
  CHECK(status_of([&] { cxlpool::Backing::open(topo, *topo.find("sq")); }) == CXLPOOL_E_PERMISSION);
  CHECK(std::string(cxlpool_last_error_message()).find("refusing to adopt") != std::string::npos);
  shm_unlink(("/" + name).c_str());
}

TEST_CASE("file backings: existing files, empty files, nothing half-created", "[unit]") {
  ScratchDir dir;
  const std::string path = dir.path() + "/existing";
  int fd = open(path.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(ftruncate(fd, 8 * kMiB) == 0);
  close(fd);
  auto topo = topology_with("ex:backing=file:" + path + ";empty:backing=file:" + dir.path() + "/new");
  auto b = cxlpool::Backing::open(topo, *topo.find("ex"));
  CHECK(b.caps().capacity_bytes == 8 * kMiB);  // taken from the file
  try {
    cxlpool::Backing::open(topo, *topo.find("empty"));
    FAIL("opened an empty file without size");
  } catch (const cxlpool::Error& e) {
    CHECK(e.status() == CXLPOOL_E_CONFIG);
    CHECK(std::string(e.what()).find("no size=") != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/new"));  // the failed open removed what it created
}

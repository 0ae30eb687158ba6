// SPDX-License-Identifier: MIT
// Backings and devices through the public C++ layer: allocate, touch, verify, release on every
// kind; capacity limits shared by everything on one device; named devices that belong to one
// process and never touch an existing file; sharing by descriptor; descriptors the program
// closes; numa placement verified with move_pages status queries; bad arguments.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <vector>

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
std::string read_file(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}
// Runs device_peer with args and CXLPOOL_DEVICES=devices; its exit status.
int run_peer(const std::string& devices, std::vector<std::string> args, int keep_fd = -1) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CXLPOOL_DEVICES", devices.c_str(), 1);
    // The peer tests the library; under the interposer (the preload tests run this suite so)
    // it would also claim the named device for its own heap.
    unsetenv("LD_PRELOAD");
    if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
    std::string peer = std::string(CXLPOOL_TEST_BINARY_DIR) + "/device_peer";
    std::vector<char*> argv{peer.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(peer.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}
cxlpool_status_t discover_status(const std::string& devices, std::string* message) {
  try {
    topology_with(devices);
  } catch (const cxlpool::Error& e) {
    *message = e.what();
    return e.status();
  }
  return CXLPOOL_OK;
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
  auto topo = topology_with("mf:backing=shm,size=64M;sh:backing=shm:" + shm +
                            ",size=64M;fl:backing=file:" + dir.path() + "/pool,size=64M;n0:backing=numa:0,size=64M");
  for (const char* name : {"mf", "sh", "fl", "n0", "node0"}) {
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
      // A private named device never appears under its name, not even while it is in use.
      // Beside it only the claim's lock file, this user's, which every network namespace sees.
      CHECK_FALSE(std::filesystem::exists("/dev/shm/" + shm));
      std::vector<std::string> beside;
      for (const auto& e : std::filesystem::directory_iterator(dir.path()))
        beside.push_back(e.path().filename().string());
      if (std::string(name) == "fl")
        CHECK(beside == std::vector<std::string>{".cxlpool-claim.pool"});
      else
        CHECK(beside.empty());
    }
    auto u = backing.usage();
    CHECK(u.committed_bytes == 0);
    CHECK(u.reserved_bytes == 0);
    CHECK(u.reservations == 0);
  }
  CHECK_FALSE(std::filesystem::exists("/dev/shm/" + shm));
  CHECK_FALSE(std::filesystem::exists("/dev/shm/.cxlpool-claim." + shm));
  // Closed, the devices leave nothing behind: the lock file went with the claim.
  CHECK(std::filesystem::is_empty(dir.path()));
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
  SECTION("fd backing: free offsets too fragmented for huge pages still serve a range") {
    // 1 MiB reservations fill the device; freeing 1-5 MiB leaves 4 MiB of free offsets with no
    // 2 MiB-aligned 4 MiB run in them. A range of a multiple of 2 MiB at a 4 MiB-aligned address
    // (as the allocator's regions are) prefers 2 MiB-aligned offsets, and takes the page-aligned
    // ones here.
    auto b = cxlpool::Backing::open(topo, *topo.find("small"));
    std::vector<cxlpool::Reservation> ones;
    for (int i = 0; i < 16; ++i) ones.push_back(b.reserve(kMiB));
    for (int i = 1; i < 5; ++i) {
      REQUIRE(ones[size_t(i)].device_offset() == uint64_t(i) * kMiB);
      ones[size_t(i)].reset();
    }
    auto four = b.reserve(4 * kMiB, 4 * kMiB);
    CHECK(four.device_offset() == kMiB);
    CHECK(reinterpret_cast<uintptr_t>(four.data()) % (4 * kMiB) == 0);
    four.commit();
    fill(four.data(), four.size());
    CHECK(check_fill(four.data(), four.size()));
    CHECK(status_of([&] { b.reserve(kMiB); }) == CXLPOOL_E_CAPACITY);
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
      CHECK(std::string(e.what()).find("exceed the capacity") != std::string::npos);
    }
    CHECK(b.usage().committed_bytes == 12 * kMiB);
    r.decommit(0, 8 * kMiB);
    r.commit(12 * kMiB, 8 * kMiB);
    CHECK(b.usage().committed_bytes == 12 * kMiB);
  }
}

TEST_CASE("one device per process: two backings on one named device share its ranges and capacity", "[unit]") {
  ScratchDir dir;
  const std::string shm = unique("cxlpool-test-two");
  auto topo = topology_with("sh:backing=shm:" + shm + ",size=16M;fl:backing=file:" + dir.path() + "/f,size=16M");
  for (const char* name : {"sh", "fl"}) {
    INFO("device " << name);
    auto a = cxlpool::Backing::open(topo, *topo.find(name));
    auto b = cxlpool::Backing::open(topo, *topo.find(name));
    auto ra = a.reserve(8 * kMiB), rb = b.reserve(8 * kMiB);
    CHECK(ra.device_offset() != rb.device_offset());  // disjoint device ranges
    ra.commit();
    rb.commit();
    std::memset(ra.data(), 0xaa, ra.size());
    std::memset(rb.data(), 0xbb, rb.size());
    auto* ca = static_cast<unsigned char*>(ra.data());
    auto* cb = static_cast<unsigned char*>(rb.data());
    CHECK(std::all_of(ca, ca + ra.size(), [](unsigned char c) { return c == 0xaa; }));
    CHECK(std::all_of(cb, cb + rb.size(), [](unsigned char c) { return c == 0xbb; }));
    CHECK(a.usage().committed_bytes == 16 * kMiB);  // one ledger: both backings' commits
    CHECK(status_of([&] { a.reserve(4 * kMiB); }) == CXLPOOL_E_CAPACITY);
  }
}

TEST_CASE("a named device in use is refused to a second process, naming the holder's pid", "[unit]") {
  ScratchDir dir;
  const std::string shm = unique("cxlpool-test-busy");
  for (std::string spec :
       {"pool:backing=shm:" + shm + ",size=8M", "pool:backing=file:" + dir.path() + "/heap,size=8M"}) {
    INFO(spec);
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    CHECK(run_peer(spec, {"busy", "pool", std::to_string(getpid())}) == 0);
  }
  // Released with its last user: the next process gets it.
  auto topo = topology_with("pool:backing=shm:" + shm + ",size=8M");
  { auto b = cxlpool::Backing::open(topo, *topo.find("pool")); }
  auto again = cxlpool::Backing::open(topo, *topo.find("pool"));
  CHECK(again.caps().capacity_bytes == 8 * kMiB);
}

// The abstract names and socket types of this process's cxlpool claim sockets: its sockets'
// inodes (/proc/self/fd) looked up in /proc/net/unix (no knowledge of how a name is made).
std::vector<std::pair<std::string, int>> own_claim_sockets() {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::pair<std::string, int>> found;
  std::ifstream table("/proc/net/unix");
  std::string line;
  std::getline(table, line);  // Num RefCount Protocol Flags Type St Inode Path
  while (std::getline(table, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    if (in >> num >> refs >> proto >> flags >> type >> st >> inode >> path && inodes.count(inode) &&
        path.rfind("@cxlpool/claim/", 0) == 0)
      found.emplace_back(path.substr(1), std::stoi(type, nullptr, 16));
  }
  return found;
}

// An abstract socket name carries no permissions: another local user can bind a device's claim
// name before its user opens it. That must not keep the device from its user (a denial of any
// device to anyone); it is opened, unclaimed, and the process says so on stderr.
TEST_CASE("a claim name bound by another user does not keep a named device from its user", "[unit]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root to act as another user (setuid)");
  const std::string shm = unique("cxlpool-test-squat");
  const std::string spec = "pool:backing=shm:" + shm + ",size=8M";
  auto topo = topology_with(spec);
  std::vector<std::pair<std::string, int>> claims;
  {
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    claims = own_claim_sockets();
  }
  REQUIRE(!claims.empty());
  for (bool listening : {true, false}) {
    INFO("the squatter's socket " << (listening ? "listens" : "is only bound"));
    int ready[2], done[2];
    REQUIRE(pipe(ready) == 0);
    REQUIRE(pipe(done) == 0);
    const pid_t squatter = fork();
    if (squatter == 0) {
      close(ready[0]);
      close(done[1]);
      if (setgid(4242) != 0 || setuid(4242) != 0) _exit(2);
      for (const auto& [name, type] : claims) {  // every name the device's claim used
        const int fd = socket(AF_UNIX, type, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path + 1, name.data(), name.size());
        const auto len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
        if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(3);
        if (listening && type == SOCK_STREAM && listen(fd, 1) != 0) _exit(4);
      }
      char c = 0;
      if (write(ready[1], "r", 1) != 1 || read(done[0], &c, 1) < 0) _exit(5);
      _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    char c = 0;
    REQUIRE(read(ready[0], &c, 1) == 1);
    ScratchDir dir;
    const std::string err_path = dir.path() + "/stderr";
    const int saved = dup(2), err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(err_fd >= 0);
    dup2(err_fd, 2);
    cxlpool_status_t st = CXLPOOL_OK;
    try {
      auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
      auto r = b.reserve(1 * kMiB);
      r.commit();
      fill(r.data(), r.size());
    } catch (const cxlpool::Error& e) {
      st = e.status();
    }
    dup2(saved, 2);
    close(saved);
    close(err_fd);
    CHECK(st == CXLPOOL_OK);
    std::ifstream said(err_path);
    const std::string text((std::istreambuf_iterator<char>(said)), std::istreambuf_iterator<char>());
    CHECK(text.find("shm:" + shm) != std::string::npos);
    CHECK(text.find("is bound by uid 4242") != std::string::npos);
    CHECK(text.find("opened unclaimed") != std::string::npos);
    close(ready[0]);
    close(done[1]);
    int status = 0;
    REQUIRE(waitpid(squatter, &status, 0) == squatter);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // The squatter gone, the claim is the user's again: a second process is refused.
  auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
  CHECK(run_peer(spec, {"busy", "pool", std::to_string(getpid())}) == 0);
}

int exit_status_of(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Whose the claim is comes from the kernel's socket table, not from a connection to it: a
// process of the holder's user in another pid namespace (where the holder has no pid) and one
// that finds the holder's queue full (anyone can fill it: nobody accepts) are still refused.
TEST_CASE("a named device's claim holds from another pid namespace and with its holder's queue full", "[unit]") {
  const std::string shm = unique("cxlpool-test-flood");
  const std::string spec = "pool:backing=shm:" + shm + ",size=8M";
  auto topo = topology_with(spec);
  auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
  const auto claims = own_claim_sockets();
  REQUIRE(!claims.empty());
  if (geteuid() == 0) {
    const pid_t child = fork();
    if (child == 0) {
      if (unshare(CLONE_NEWPID) != 0) _exit(20);
      const pid_t inner = fork();                                            // pid 1 of the new namespace
      if (inner == 0) _exit(run_peer(spec, {"busy", "pool", "namespace"}));  // "...in another pid namespace"
      _exit(exit_status_of(inner));
    }
    CHECK(exit_status_of(child) == 0);
  } else {
    WARN("the case from another pid namespace needs root (unshare CLONE_NEWPID)");
  }
  const pid_t flooder = fork();
  if (flooder == 0) {
    if (geteuid() == 0 && (setgid(4242) != 0 || setuid(4242) != 0)) _exit(2);
    for (int n = 0; n < 1000000; ++n) {
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path + 1, claims[0].first.data(), claims[0].first.size());
      const auto len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + claims[0].first.size());
      const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
      const int err = errno;
      close(fd);
      if (rc != 0) _exit(err == EAGAIN && n > 0 ? 0 : 3);  // full
    }
    _exit(4);
  }
  REQUIRE(exit_status_of(flooder) == 0);
  // Nobody answers a connection now: the pid comes from the socket's inode in /proc.
  CHECK(run_peer(spec, {"busy", "pool", std::to_string(getpid())}) == 0);
}

// Abstract socket names exist per network namespace: a container with its own sees none of the
// host's. The lock file beside the device is seen wherever the device is.
TEST_CASE("a named device's claim holds from another network namespace", "[unit]") {
  ScratchDir dir;
  const std::string shm = unique("cxlpool-test-netns");
  for (std::string spec :
       {"pool:backing=shm:" + shm + ",size=8M", "pool:backing=file:" + dir.path() + "/heap,size=8M"}) {
    INFO(spec);
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    const uid_t uid = geteuid();
    const gid_t gid = getegid();
    const pid_t child = fork();
    if (child == 0) {
      if (uid == 0) {
        if (unshare(CLONE_NEWNET) != 0) _exit(77);
      } else {
        // An unprivileged user makes a network namespace inside a user namespace of its own,
        // where it is root (as `unshare -rn` and rootless containers do): another uid there.
        if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) _exit(77);
        auto write = [](const char* path, const std::string& text) {
          std::ofstream f(path);
          f << text;
          return bool(f.flush());
        };
        if (!write("/proc/self/setgroups", "deny") || !write("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
            !write("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
          _exit(78);
      }
      _exit(run_peer(spec, {"busy", "pool", std::to_string(getppid())}));
    }
    const int status = exit_status_of(child);
    if (status == 77 || status == 78) {
      WARN("no network namespace could be made here (unshare: CLONE_NEWNET" << (uid ? " in a user namespace" : "")
                                                                            << "); the case is not run");
      continue;
    }
    CHECK(status == 0);
  }
}

// Claimants of different names in one directory never stand in each other's way (each one
// also clears the directory of files dead holders left), and nothing is left behind.
TEST_CASE("claims of many names in one directory at once: no false refusal, nothing left", "[unit]") {
  ScratchDir dir;
  std::vector<pid_t> kids;
  for (int k = 0; k < 8; ++k) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string spec = "pool:backing=file:" + dir.path() + "/dev" + std::to_string(k) + ",size=8M";
      for (int i = 0; i < 60; ++i) {
        try {
          auto topo = topology_with(spec);
          auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
          if (k % 2 == 0 && i == 30) kill(getpid(), SIGKILL);  // a holder killed: its file stays
        } catch (const cxlpool::Error& e) {
          std::fprintf(stderr, "claimant %d, round %d: %s\n", k, i, e.what());
          _exit(1);
        }
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  int refused = 0, killed = 0;
  for (pid_t pid : kids) {
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    refused += WIFEXITED(status) && WEXITSTATUS(status) != 0;
    killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  CHECK(refused == 0);
  CHECK(killed == 4);
  // The killed holders' files go with the next claim in the directory.
  {
    auto topo = topology_with("pool:backing=file:" + dir.path() + "/last,size=8M");
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
  }
  CHECK(std::filesystem::is_empty(dir.path()));
}

// The lock file is made after the device's storage: on a filesystem with one inode left, the
// device gets it and goes without the lock file (said on stderr).
TEST_CASE("the claim's lock file never takes the inode the device needs", "[unit]") {
  if (geteuid() != 0) CXLPOOL_SKIP("mounting a small tmpfs needs root");
  ScratchDir dir;
  const pid_t child = fork();
  if (child == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(77);
    // Its root directory takes one inode: one is left.
    if (mount("cxlpool-test", dir.path().c_str(), "tmpfs", 0, "nr_inodes=2,size=64m") != 0) _exit(77);
    // Opening the device makes its one storage file (a fresh process does it: nothing of
    // cxlpool runs in this fork child).
    _exit(run_peer("pool:backing=file:" + dir.path() + "/heap,size=8M", {"open", "pool"}));
  }
  const int status = exit_status_of(child);
  if (status == 77) CXLPOOL_SKIP("no private mount namespace or tmpfs here");
  CHECK(status == 0);
}

// The lock file's name is known in advance: whatever another user (or a link) put there is
// never opened or changed, and does not keep the device from its user.
TEST_CASE("a claim lock file that is not this user's own file is left alone", "[unit]") {
  ScratchDir dir;
  const std::string lock = dir.path() + "/.cxlpool-claim.heap";
  const std::string target = dir.path() + "/target";
  { std::ofstream(target) << "keep"; }
  REQUIRE(symlink(target.c_str(), lock.c_str()) == 0);
  const std::string spec = "pool:backing=file:" + dir.path() + "/heap,size=8M";
  {
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    auto r = b.reserve(1 * kMiB);
    r.commit();
  }
  std::ifstream in(target);
  std::string text;
  in >> text;
  CHECK(text == "keep");
  CHECK(std::filesystem::is_symlink(lock));
  if (geteuid() == 0) {
    REQUIRE(unlink(lock.c_str()) == 0);
    { std::ofstream(lock) << "theirs"; }
    REQUIRE(chown(lock.c_str(), 4242, 4242) == 0);
    {
      auto topo = topology_with(spec);
      auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    }
    struct stat st {};
    REQUIRE(stat(lock.c_str(), &st) == 0);
    CHECK(st.st_uid == 4242u);
    CHECK(st.st_size == 6);
  }
}

// The user's own file under the lock file's name that holds anything but a claim line (the
// user's data, not a killed holder's leftover: those are empty or name a dead process) is not
// overwritten nor removed; the device opens with its socket claim alone. An empty one (a
// holder killed before it wrote) is taken and removed as before.
TEST_CASE("a claim lock file of this user that holds other data is not overwritten or removed", "[unit]") {
  ScratchDir dir;
  const std::string lock = dir.path() + "/.cxlpool-claim.heap";
  const std::string spec = "pool:backing=file:" + dir.path() + "/heap,size=8M";
  { std::ofstream(lock) << "my notes\n"; }
  {
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    auto r = b.reserve(1 * kMiB);
    r.commit();
  }
  std::ifstream in(lock);
  std::string text;
  std::getline(in, text);
  CHECK(text == "my notes");
  REQUIRE(truncate(lock.c_str(), 0) == 0);
  {
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
  }
  CHECK_FALSE(std::filesystem::exists(lock));
}

TEST_CASE("a backing's memory is shared with another process through its descriptor", "[unit]") {
  auto topo = topology_with("mf:backing=shm,size=8M");
  auto b = cxlpool::Backing::open(topo, *topo.find("mf"));
  auto r = b.reserve(1 * kMiB);
  r.commit();
  fill(r.data(), r.size());
  int fd = -1;
  REQUIRE(cxlpool_backing_fd(b.get(), &fd) == CXLPOOL_OK);
  CHECK(run_peer("", {"fd", std::to_string(fd), std::to_string(r.device_offset()), std::to_string(kMiB)}, fd) == 0);
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

TEST_CASE("existing objects are never used or changed, whoever owns them", "[unit]") {
  ScratchDir dir;
  const std::string text = "a user's data, not cxlpool's\n";
  const std::string path = dir.path() + "/v.txt";
  { std::ofstream(path) << text; }
  const std::string name = unique("cxlpool-test-squat");
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);  // even one of ours
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, text.data(), text.size()) == ssize_t(text.size()));
  close(fd);
  std::string message;
  CHECK(discover_status("v:backing=file:" + path + ",size=64M", &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("was not created by cxlpool") != std::string::npos);
  CHECK(discover_status("v:backing=shm:" + name + ",size=64M", &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find("/dev/shm/" + name) != std::string::npos);
  CHECK(read_file(path) == text);
  CHECK(read_file("/dev/shm/" + name) == text);
  shm_unlink(("/" + name).c_str());

  if (geteuid() != 0) CXLPOOL_SKIP("another user's file needs root to create");
  const uid_t nobody = 65534;  // by number: the test guest has no passwd database
  const std::string theirs = dir.path() + "/theirs";
  { std::ofstream(theirs) << text; }
  REQUIRE(chown(theirs.c_str(), nobody, nobody) == 0);
  REQUIRE(chmod(theirs.c_str(), 0666) == 0);
  CHECK(discover_status("t:backing=file:" + theirs + ",size=64M", &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find(theirs) != std::string::npos);
  struct stat st {};
  REQUIRE(stat(theirs.c_str(), &st) == 0);
  CHECK(read_file(theirs) == text);
  CHECK(st.st_uid == nobody);
  CHECK((st.st_mode & 0777) == 0666);
}

TEST_CASE("devices that cannot hold memory are rejected at discovery, naming the reason", "[unit]") {
  std::string message;
  CHECK(discover_status("tiny:backing=shm,size=2M", &message) == CXLPOOL_E_CONFIG);
  INFO(message);
  CHECK(message.find("cannot hold one") != std::string::npos);
  CHECK(discover_status("null:backing=devdax:/dev/null,size=64M", &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find("not device-DAX") != std::string::npos);
  CHECK(discover_status("mem:backing=file:/proc/self/mem,size=64M", &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find("proc pseudo filesystem") != std::string::npos);
  CHECK(discover_status("nosize:backing=shm:" + unique("cxlpool-test-nosize"), &message) == CXLPOOL_E_CONFIG);
  CHECK(message.find("needs size=") != std::string::npos);
}

TEST_CASE("a descriptor the program closes or reuses never receives device memory", "[unit]") {
  ScratchDir dir;
  for (std::string spec :
       {std::string("mf:backing=shm,size=32M"), "mf:backing=file:" + dir.path() + "/heap,size=32M"}) {
    INFO(spec);
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("mf"));
    auto r1 = b.reserve(4 * kMiB);
    r1.commit();
    fill(r1.data(), r1.size());
    int fd = -1;
    REQUIRE(cxlpool_backing_fd(b.get(), &fd) == CXLPOOL_OK);
    // The program closes "its" descriptors and opens a file of its own on the same number.
    const std::string mine = dir.path() + "/mine";
    close(fd);
    int own = open(mine.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    REQUIRE(own >= 0);
    if (own != fd) {
      REQUIRE(dup2(own, fd) == fd);
      close(own);
    }
    REQUIRE(write(fd, "mine", 4) == 4);
    auto r2 = b.reserve(4 * kMiB);  // new storage, never the program's file
    r2.commit();
    std::memset(r2.data(), 0x77, r2.size());
    r2.decommit();
    CHECK(check_fill(r1.data(), r1.size()));  // earlier memory keeps its mapping
    close(fd);
    CHECK(read_file(mine) == "mine");
  }
}

TEST_CASE("closing a device never closes a descriptor the program put on its number", "[unit]") {
  ScratchDir dir;
  const std::string mine = dir.path() + "/log";
  int fd = -1;
  {
    auto topo = topology_with("mf:backing=shm,size=16M");
    auto b = cxlpool::Backing::open(topo, *topo.find("mf"));
    auto r = b.reserve(1 * kMiB);
    r.commit();
    REQUIRE(cxlpool_backing_fd(b.get(), &fd) == CXLPOOL_OK);
    int own = open(mine.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    REQUIRE(own >= 0);
    REQUIRE(dup2(own, fd) == fd);  // the program's log now sits on the device's number
    close(own);
  }                                // the device closes here
  CHECK(fcntl(fd, F_GETFD) >= 0);  // still open: it was not cxlpool's any more
  CHECK(write(fd, "kept", 4) == 4);
  close(fd);
  CHECK(read_file(mine) == "kept");
}

TEST_CASE("a forked child does not keep its parent's claim on a named device", "[unit]") {
  const std::string shm = unique("cxlpool-test-orphan");
  const std::string spec = "pool:backing=shm:" + shm + ",size=8M";
  int gate[2];
  REQUIRE(pipe(gate) == 0);
  pid_t child = -1;
  {
    auto topo = topology_with(spec);
    auto b = cxlpool::Backing::open(topo, *topo.find("pool"));
    child = fork();
    if (child == 0) {  // outlives the parent's use of the device
      char c;
      close(gate[1]);
      (void)!read(gate[0], &c, 1);
      _exit(0);
    }
    close(gate[0]);
  }                                              // the parent closes the device; its child still runs
  CHECK(run_peer(spec, {"open", "pool"}) == 0);  // another process may take it now
  close(gate[1]);
  int status = 0;
  waitpid(child, &status, 0);
}

TEST_CASE("raw backing memory is shared with a forked child", "[unit]") {
  auto topo = topology_with("mf:backing=shm,size=8M");
  auto b = cxlpool::Backing::open(topo, *topo.find("mf"));
  auto r = b.reserve(1 * kMiB);
  r.commit();
  std::memset(r.data(), 1, r.size());
  pid_t pid = fork();
  if (pid == 0) {
    static_cast<unsigned char*>(r.data())[100] = 42;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(static_cast<unsigned char*>(r.data())[100] == 42);
}

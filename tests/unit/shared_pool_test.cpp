// SPDX-License-Identifier: MIT
// Shared pools through the C ABI: names that exist or belong to others, blocks and classes,
// handles (stale, forged, foreign), leases across processes, recovery of killed and stopped
// participants, racing creators, fork children, a scribbling peer. Processes are forked
// children that open the pool themselves, as real participants would.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cpu_hogs.hpp"
#include "cxlpool/shared.h"
#include "cxlpool/topology.h"  // cxlpool_string_free
#include "shared/layout.hpp"   // the on-device layout, for the scribbling peer
#include "shared_support.hpp"
#include "test_support.hpp"

namespace {

// A pool on /dev/shm removed at scope exit.
struct ShmPool {
  std::string name, device;
  cxlpool_shared_pool_t* pool = nullptr;
  explicit ShmPool(const char* tag, uint64_t size = 64u << 20, uint32_t stopped = 0) {
    name = unique_name(tag);
    device = "shm:" + name;
    Params params(size, 5, 100, stopped);
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &pool) == CXLPOOL_OK);
  }
  ~ShmPool() {
    if (pool) cxlpool_shared_pool_close(pool);
    unlink(("/dev/shm/" + name).c_str());
  }
  cxlpool_shared_pool_t* open_again() const {
    cxlpool_shared_pool_t* other = nullptr;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &other) == CXLPOOL_OK);
    return other;
  }
};

cxlpool_shared_info_t info_of(cxlpool_shared_pool_t* p) {
  cxlpool_shared_info_t i{};
  REQUIRE(cxlpool_shared_pool_info(p, &i) == CXLPOOL_OK);
  return i;
}

cxlpool_shared_check_report_t check(const std::string& device, int repair, cxlpool_status_t* status = nullptr) {
  cxlpool_shared_check_report_t r{};
  cxlpool_status_t st = cxlpool_shared_pool_check(device.c_str(), nullptr, repair, &r);
  if (status) *status = st;
  return r;
}

void fill(void* p, size_t n, uint8_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 31);
}
bool holds(const void* p, size_t n, uint8_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != static_cast<uint8_t>(seed + i * 31)) return false;
  return true;
}

// Waits until pred() or timeout_ms; returns pred().
template <class P>
bool eventually(P pred, int timeout_ms = 30000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!pred() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return pred();
}

// CRC-32C (Castagnoli), as the superblock's checksum: a forger can recompute it.
uint32_t crc32c_of(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~0u;
  for (size_t i = 0; i < len; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// Kills and reaps a child at scope exit unless pid is set to 0: a failed REQUIRE leaves no
// child behind.
struct Reaper {
  pid_t pid;
  ~Reaper() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// Runs a child seized and stopped by ptrace from system call to system call until it enters
// the open of its own /proc/<pid>/stat: a joiner reads its start time there after it claimed
// its slot and before it writes its facts, with nothing but memory stores in between.
void run_to_start_time_read(pid_t child) {
  const std::string target = "/proc/" + std::to_string(child) + "/stat";
  for (bool held = false; !held;) {
    int status = 0;
    REQUIRE(ptrace(PTRACE_SYSCALL, child, nullptr, nullptr) == 0);
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFSTOPPED(status));
    if (WSTOPSIG(status) != (SIGTRAP | 0x80)) continue;
    __ptrace_syscall_info info{};
    REQUIRE(ptrace(PTRACE_GET_SYSCALL_INFO, child, reinterpret_cast<void*>(sizeof info), &info) > 0);
    if (info.op != PTRACE_SYSCALL_INFO_ENTRY || info.entry.nr != SYS_openat) continue;
    char path[64] = {};
    iovec local{path, sizeof path - 1}, remote{reinterpret_cast<void*>(info.entry.args[1]), sizeof path - 1};
    if (process_vm_readv(child, &local, 1, &remote, 1, 0) <= 0) continue;
    held = target == path;
  }
}

// Runs body() (which must _exit) as pid 1 of a new pid namespace, as a container's first
// process; returns the child of ours that waits for it and exits with its status. *init: its
// number in our namespace. Needs root.
template <class Body>
pid_t fork_in_new_pid_namespace(Body body, pid_t* init = nullptr) {
  int num[2];
  REQUIRE(pipe(num) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(num[0]);
    if (unshare(CLONE_NEWPID) != 0) _exit(20);
    const pid_t inner = fork();
    if (inner == 0) body();
    if (write(num[1], &inner, sizeof inner) != sizeof inner) _exit(21);
    _exit(wait_exit(inner));
  }
  close(num[1]);
  pid_t inner = 0;
  REQUIRE(read(num[0], &inner, sizeof inner) == sizeof inner);
  close(num[0]);
  if (init) *init = inner;
  return child;
}

}  // namespace

TEST_CASE("names that exist, belong to others or are not pools are refused and left untouched", "[shared]") {
  ShmPool a("names");
  Params params;
  cxlpool_shared_pool_t* p = nullptr;
  CHECK(cxlpool_shared_pool_create(a.device.c_str(), params.p, 0, &p) == CXLPOOL_E_EXISTS);
  CHECK(p == nullptr);

  // A foreign file: create refuses, open refuses, unlink refuses; bytes identical afterwards.
  std::string foreign = "/dev/shm/" + unique_name("foreign");
  int fd = open(foreign.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
  REQUIRE(fd >= 0);
  std::vector<char> content(1u << 20, 'x');
  REQUIRE(write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()));
  close(fd);
  const std::string fdev = "file:" + foreign;
  CHECK(cxlpool_shared_pool_create(fdev.c_str(), params.p, 0, &p) == CXLPOOL_E_EXISTS);
  CHECK(cxlpool_shared_pool_open(fdev.c_str(), nullptr, &p) == CXLPOOL_E_CORRUPT);
  CHECK(std::string(cxlpool_last_error_message()).find("no cxlpool shared-pool header") != std::string::npos);
  CHECK(cxlpool_shared_pool_unlink(fdev.c_str()) == CXLPOOL_E_CORRUPT);
  std::vector<char> after(content.size());
  fd = open(foreign.c_str(), O_RDONLY);
  REQUIRE(read(fd, after.data(), after.size()) == static_cast<ssize_t>(after.size()));
  close(fd);
  CHECK(after == content);
  // A symlink to our pool is not followed.
  std::string link = "/dev/shm/" + unique_name("link");
  REQUIRE(symlink(("/dev/shm/" + a.name).c_str(), link.c_str()) == 0);
  CHECK(cxlpool_shared_pool_open(("file:" + link).c_str(), nullptr, &p) == CXLPOOL_E_CONFIG);
  unlink(link.c_str());
  unlink(foreign.c_str());

  // Bad device strings and parameters name the bad token.
  CHECK(cxlpool_shared_pool_open("shm:a/b", nullptr, &p) == CXLPOOL_E_CONFIG);
  CHECK(cxlpool_shared_pool_open("nvme:x", nullptr, &p) == CXLPOOL_E_CONFIG);
  CHECK(cxlpool_shared_pool_open("file:relative", nullptr, &p) == CXLPOOL_E_CONFIG);
  CHECK(cxlpool_shared_params_set_extent_size(params.p, 3u << 20) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("3145728") != std::string::npos);
  CHECK(cxlpool_shared_params_set_lease_timing(params.p, 10, 20) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_set_participants(params.p, 16, 16) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_set_mode(params.p, 0400) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_params_t* tiny = nullptr;
  REQUIRE(cxlpool_shared_params_create(&tiny) == CXLPOOL_OK);
  CHECK(cxlpool_shared_pool_create(("shm:" + unique_name("nosize")).c_str(), tiny, 0, &p) == CXLPOOL_E_CONFIG);
  cxlpool_shared_params_destroy(tiny);
  // The mode asked for is the mode the file gets, whatever the umask.
  struct stat st {};
  REQUIRE(stat(("/dev/shm/" + a.name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("blocks of every class and whole extents, capacity runs out cleanly and comes back", "[shared]") {
  ShmPool a("blocks", 32u << 20);
  std::vector<std::pair<void*, size_t>> blocks;
  std::mt19937 rng(7);
  for (size_t size : {size_t{1}, size_t{128}, size_t{129}, size_t{4000}, size_t{65536}, size_t{200000},
                      size_t{1u << 20}, size_t{3u << 20}}) {
    void* p = nullptr;
    REQUIRE(cxlpool_shared_alloc(a.pool, size, &p) == CXLPOOL_OK);
    CHECK(reinterpret_cast<uintptr_t>(p) % 128 == 0);
    fill(p, size, static_cast<uint8_t>(size));
    blocks.emplace_back(p, size);
  }
  for (auto& [p, size] : blocks) CHECK(holds(p, size, static_cast<uint8_t>(size)));
  // Distinct, non-overlapping.
  std::set<uintptr_t> starts;
  for (auto& [p, size] : blocks) starts.insert(reinterpret_cast<uintptr_t>(p));
  CHECK(starts.size() == blocks.size());
  void* p = nullptr;
  CHECK(cxlpool_shared_alloc(a.pool, 0, &p) == CXLPOOL_E_INVALID_ARGUMENT);
  // Exhaust with 64 KiB blocks, then free everything: the pool is whole again.
  std::vector<void*> many;
  cxlpool_status_t st;
  while ((st = cxlpool_shared_alloc(a.pool, 65536, &p)) == CXLPOOL_OK) many.push_back(p);
  CHECK(st == CXLPOOL_E_CAPACITY);
  CHECK(many.size() > 100);
  for (void* q : many) REQUIRE(cxlpool_shared_free(a.pool, q) == CXLPOOL_OK);
  for (auto& [q, size] : blocks) REQUIRE(cxlpool_shared_free(a.pool, q) == CXLPOOL_OK);
  CHECK(cxlpool_shared_free(a.pool, blocks[0].first) == CXLPOOL_E_INVALID_ARGUMENT);  // double free
  char stack_byte = 0;
  CHECK(cxlpool_shared_free(a.pool, &stack_byte) == CXLPOOL_E_INVALID_ARGUMENT);
  REQUIRE(cxlpool_shared_alloc(a.pool, 128, &p) == CXLPOOL_OK);
  CHECK(cxlpool_shared_free(a.pool, static_cast<char*>(p) + 64) == CXLPOOL_E_INVALID_ARGUMENT);  // not a start
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  auto i = info_of(a.pool);
  CHECK(i.bytes_in_use == 0);
  CHECK(i.extents_free + i.extents_mine == i.extents_total);
  REQUIRE(cxlpool_shared_alloc(a.pool, (i.extents_free) * i.extent_size, &p) == CXLPOOL_OK);  // one big block fits
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
}

TEST_CASE(
    "the block cache: freed blocks come back without a pool write, but never twice, never exported, "
    "never in the way of capacity",
    "[shared]") {
  ShmPool a("cache", 32u << 20);
  void* p = nullptr;
  REQUIRE(cxlpool_shared_alloc(a.pool, 256, &p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  auto i = info_of(a.pool);
  CHECK(i.bytes_in_use == 0);
  CHECK(i.bytes_cached > 0);  // the refill and the freed block
  // A cached block is freed again: refused, and it is not handed out twice afterwards.
  CHECK(cxlpool_shared_free(a.pool, p) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_handle_t h{};
  CHECK(cxlpool_shared_export(a.pool, p, &h) == CXLPOOL_E_INVALID_ARGUMENT);  // not allocated
  std::set<void*> out;
  std::vector<void*> held;
  for (int k = 0; k < 300; ++k) {  // through the cache, its refills and the pool
    void* q = nullptr;
    REQUIRE(cxlpool_shared_alloc(a.pool, 256, &q) == CXLPOOL_OK);
    CHECK(out.insert(q).second);
    held.push_back(q);
  }
  for (void* q : held) REQUIRE(cxlpool_shared_free(a.pool, q) == CXLPOOL_OK);
  // An exported block freed by its owner is not cached: when its address comes back, its old
  // handle is stale.
  REQUIRE(cxlpool_shared_alloc(a.pool, 256, &p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_export(a.pool, p, &h) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  cxlpool_shared_pool_t* b = a.open_again();
  void* again = nullptr;
  held.clear();
  for (int k = 0; k < 20000 && again != p; ++k) {
    REQUIRE(cxlpool_shared_alloc(a.pool, 256, &again) == CXLPOOL_OK);
    held.push_back(again);
  }
  CHECK(again == p);
  void* q = nullptr;
  CHECK(cxlpool_shared_import(b, &h, &q, nullptr) == CXLPOOL_E_STALE);
  for (void* r : held) REQUIRE(cxlpool_shared_free(a.pool, r) == CXLPOOL_OK);
  // Every small class cached and an empty extent kept for each: a block of the whole pool
  // still fits, because a capacity failure trims first.
  for (size_t size : {size_t{16}, size_t{200}, size_t{1000}, size_t{3000}, size_t{12000}, size_t{30000}}) {
    held.clear();
    for (int k = 0; k < 100; ++k) {
      REQUIRE(cxlpool_shared_alloc(a.pool, size, &q) == CXLPOOL_OK);
      held.push_back(q);
    }
    for (void* r : held) REQUIRE(cxlpool_shared_free(a.pool, r) == CXLPOOL_OK);
  }
  i = info_of(a.pool);
  CHECK(i.extents_mine > 1);
  INFO("extents: " << i.extents_total << " total, " << i.extents_free << " free, " << i.extents_mine << " mine");
  REQUIRE(cxlpool_shared_alloc(a.pool, i.extents_total * i.extent_size, &q) == CXLPOOL_OK);
  CHECK(info_of(a.pool).bytes_cached == 0);
  REQUIRE(cxlpool_shared_free(a.pool, q) == CXLPOOL_OK);
  cxlpool_shared_pool_close(b);
  REQUIRE(cxlpool_shared_pool_close(a.pool) == CXLPOOL_OK);
  a.pool = nullptr;
  cxlpool_status_t st = CXLPOOL_OK;
  auto r = check(a.device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.blocks_in_use == 0);  // the cache went back at close
}

TEST_CASE("the block cache never holds capacity another participant needs", "[shared]") {
  for (bool with_quota : {false, true}) {
    INFO((with_quota ? "quota" : "pool"));
    const std::string name = unique_name("pinned"), device = "shm:" + name;
    Params params(64u << 20, 10, 3000);  // thousands of calls: slow under sanitizers
    if (with_quota) REQUIRE(cxlpool_shared_params_add_quota(params.p, "q", 10u << 20) == CXLPOOL_OK);
    cxlpool_shared_pool_t* a = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
    Params joiner(64u << 20, 10, 3000);
    if (with_quota) REQUIRE(cxlpool_shared_params_set_quota(joiner.p, "q") == CXLPOOL_OK);
    cxlpool_shared_pool_t* pa = nullptr;
    cxlpool_shared_pool_t* pb = nullptr;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), joiner.p, &pa) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), joiner.p, &pb) == CXLPOOL_OK);
    // A fills everything it may with 128 B blocks, then frees one block of every extent
    // first (each would stay cached if the cache took any block), then the rest.
    std::vector<void*> blocks;
    void* p = nullptr;
    while (cxlpool_shared_alloc(pa, 128, &p) == CXLPOOL_OK) blocks.push_back(p);
    REQUIRE(blocks.size() > 1000);
    const uint64_t extent = info_of(pa).extent_size;
    std::vector<bool> freed(blocks.size(), false);
    std::set<uint64_t> seen;
    for (size_t k = 0; k < blocks.size(); ++k)
      if (seen.insert(reinterpret_cast<uintptr_t>(blocks[k]) / extent).second) {
        REQUIRE(cxlpool_shared_free(pa, blocks[k]) == CXLPOOL_OK);
        freed[k] = true;
      }
    CHECK(seen.size() > 4);
    for (size_t k = 0; k < blocks.size(); ++k)
      if (!freed[k]) REQUIRE(cxlpool_shared_free(pa, blocks[k]) == CXLPOOL_OK);
    auto ia = info_of(pa);
    CHECK(ia.bytes_in_use == 0);
    CHECK(ia.extents_mine <= 1);  // the one extent kept for the class, with the cache's blocks
    // B gets everything else: the whole quota, or the whole pool, but one extent.
    const uint64_t room = with_quota ? ia.quota_extents_max : ia.extents_total;
    REQUIRE(cxlpool_shared_alloc(pb, (room - ia.extents_mine) * extent, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_free(pb, p) == CXLPOOL_OK);
    cxlpool_shared_pool_close(pa);
    cxlpool_shared_pool_close(pb);
    cxlpool_shared_pool_close(a);
    cxlpool_shared_pool_unlink(device.c_str());
  }
}

TEST_CASE("statistics as JSON: this participant, the pool's slots, quotas and health", "[shared]") {
  ShmPool a("stats");
  cxlpool_shared_pool_t* b = a.open_again();
  void* p = nullptr;
  REQUIRE(cxlpool_shared_alloc(a.pool, 4000, &p) == CXLPOOL_OK);
  cxlpool_shared_handle_t h{};
  REQUIRE(cxlpool_shared_export(a.pool, p, &h) == CXLPOOL_OK);
  void* q = nullptr;
  REQUIRE(cxlpool_shared_import(b, &h, &q, nullptr) == CXLPOOL_OK);
  auto stats = [](cxlpool_shared_pool_t* pool) {
    char* json = nullptr;
    REQUIRE(cxlpool_shared_pool_stats_json(pool, &json) == CXLPOOL_OK);
    std::string s(json);
    cxlpool_string_free(json);
    return s;
  };
  const std::string sa = stats(a.pool), sb = stats(b);
  INFO(sa);
  CHECK(sa.find("\"state\": \"healthy\"") != std::string::npos);
  CHECK(sa.find("\"bytes_in_use\": " + std::to_string(info_of(a.pool).bytes_in_use) + ",") != std::string::npos);
  CHECK(info_of(a.pool).bytes_in_use >= 4000);
  CHECK(sb.find("\"leases_held\": 1") != std::string::npos);
  CHECK(sa.find("\"name\": \"default\"") != std::string::npos);
  size_t slots = 0;
  for (size_t at = 0; (at = sa.find("\"host_index\"", at)) != std::string::npos; ++at) ++slots;
  CHECK(slots == 2);
  CHECK(sa.find("\"leases\": 1") != std::string::npos);  // b's lease, seen in the pool
  CHECK(sa.find("\"alive\": false") == std::string::npos);
  REQUIRE(cxlpool_shared_release(b, q) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  // After a device failure: the participant's own figures and health, nothing read from it.
  REQUIRE(cxlpool_shared_pool_inject_failure(b, "test") == CXLPOOL_OK);
  const std::string failed = stats(b);
  CHECK(failed.find("\"state\": \"failed\"") != std::string::npos);
  CHECK(failed.find("\"participants\"") == std::string::npos);
  char* json = nullptr;
  CHECK(cxlpool_shared_pool_stats_json(a.pool, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_pool_stats_json(nullptr, &json) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_pool_close(b);
}

TEST_CASE("idle participants give back the extents they kept for speed within about a second", "[shared]") {
  ShmPool a("idle", 32u << 20);
  cxlpool_shared_pool_t* b = a.open_again();
  cxlpool_shared_pool_t* c = a.open_again();
  // a and b touch every small class once: each keeps an extent per class (cache or spare).
  for (cxlpool_shared_pool_t* p : {a.pool, b})
    for (size_t size = 16; size <= 32768; size = size * 3 / 2 + 16) {
      void* q = nullptr;
      REQUIRE(cxlpool_shared_alloc(p, size, &q) == CXLPOOL_OK);
      REQUIRE(cxlpool_shared_free(p, q) == CXLPOOL_OK);
    }
  const auto total = info_of(c).extents_total;
  CHECK(info_of(a.pool).extents_mine + info_of(b).extents_mine > total / 2);  // what they keep
  // Once idle for a second, they hold nothing: c gets the whole pool.
  CHECK(eventually([&] { return info_of(a.pool).extents_mine == 0 && info_of(b).extents_mine == 0; }, 30000));
  void* all = nullptr;
  REQUIRE(cxlpool_shared_alloc(c, total * info_of(c).extent_size, &all) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(c, all) == CXLPOOL_OK);
  cxlpool_shared_pool_close(b);
  cxlpool_shared_pool_close(c);
}

TEST_CASE("threads of one participant share its heap and cache: no block given to two, contents intact", "[shared]") {
  ShmPool a("threads", 64u << 20);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 100);
      std::vector<std::pair<void*, size_t>> live;
      for (int k = 0; k < 20000; ++k) {
        if (live.size() < 200 && (live.empty() || rng() % 2 == 0)) {
          const size_t size = 16 + rng() % 5000;
          void* p = nullptr;
          if (cxlpool_shared_alloc(a.pool, size, &p) != CXLPOOL_OK) {
            ++failures;
            continue;
          }
          fill(p, size, static_cast<uint8_t>(t * 50 + size));
          live.emplace_back(p, size);
        } else {
          const size_t at = rng() % live.size();
          auto [p, size] = live[at];
          if (!holds(p, size, static_cast<uint8_t>(t * 50 + size))) ++failures;
          if (cxlpool_shared_free(a.pool, p) != CXLPOOL_OK) ++failures;
          live[at] = live.back();
          live.pop_back();
        }
      }
      for (auto [p, size] : live)
        if (!holds(p, size, static_cast<uint8_t>(t * 50 + size)) || cxlpool_shared_free(a.pool, p) != CXLPOOL_OK)
          ++failures;
    });
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  CHECK(info_of(a.pool).bytes_in_use == 0);
  auto r = check(a.device, 0);
  CHECK(r.leaked_blocks == 0);
  CHECK(r.corrupt_words == 0);
}

TEST_CASE("handles: export, import under a lease, owner frees, stale and forged handles refused", "[shared]") {
  ShmPool a("handles");
  cxlpool_shared_pool_t* b = a.open_again();
  CHECK(info_of(b).slot != info_of(a.pool).slot);
  void* p = nullptr;
  REQUIRE(cxlpool_shared_alloc(a.pool, 1000, &p) == CXLPOOL_OK);
  fill(p, 1000, 9);
  cxlpool_shared_handle_t h{};
  REQUIRE(cxlpool_shared_export(a.pool, p, &h) == CXLPOOL_OK);
  void* q = nullptr;
  size_t size = 0;
  REQUIRE(cxlpool_shared_import(b, &h, &q, &size) == CXLPOOL_OK);
  CHECK(size >= 1000);
  CHECK(holds(q, 1000, 9));
  CHECK(cxlpool_shared_free(b, q) == CXLPOOL_E_INVALID_ARGUMENT);  // not b's to free
  // The owner frees; the lease keeps the block alive and unchanged.
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  void* other = nullptr;
  for (int k = 0; k < 100; ++k) {
    REQUIRE(cxlpool_shared_alloc(a.pool, 1000, &other) == CXLPOOL_OK);
    CHECK(other != p);
    fill(other, 1000, 77);
  }
  CHECK(holds(q, 1000, 9));
  void* q2 = nullptr;
  CHECK(cxlpool_shared_import(b, &h, &q2, nullptr) == CXLPOOL_OK);  // same lease, counted twice
  REQUIRE(cxlpool_shared_release(b, q2) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_release(b, q) == CXLPOOL_OK);
  CHECK(cxlpool_shared_release(b, q) == CXLPOOL_E_INVALID_ARGUMENT);
  // Released by everyone: the owner's watch frees it; the handle is stale from then on.
  CHECK(eventually([&] {
    void* r = nullptr;
    return cxlpool_shared_import(b, &h, &r, nullptr) == CXLPOOL_E_STALE;
  }));
  CHECK(cxlpool_shared_pool_check(a.device.c_str(), nullptr, 0, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);

  // Forgery: random and mutated handles are never accepted.
  REQUIRE(cxlpool_shared_alloc(a.pool, 4096, &p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_export(a.pool, p, &h) == CXLPOOL_OK);
  std::mt19937_64 rng(42);
  int accepted = 0;
  for (int k = 0; k < 100000; ++k) {
    cxlpool_shared_handle_t f = h;
    switch (k % 4) {
      case 0:  // random bytes
        for (auto* w = reinterpret_cast<uint64_t*>(&f); w < reinterpret_cast<uint64_t*>(&f + 1); ++w) *w = rng();
        break;
      case 1:  // one bit flipped
        reinterpret_cast<uint8_t*>(&f)[rng() % sizeof f] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 2: {  // a different offset or generation with a recomputed-looking check (forger copies check)
        f.offset = h.offset + 128 * (1 + rng() % 4096);
        break;
      }
      default:
        f.generation = h.generation + 1 + static_cast<uint32_t>(rng() % 1000);
        break;
    }
    void* r = nullptr;
    if (cxlpool_shared_import(b, &f, &r, nullptr) == CXLPOOL_OK) {
      ++accepted;
      cxlpool_shared_release(b, r);
    }
  }
  CHECK(accepted == 0);
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(b) == CXLPOOL_OK);
}

// Tests that fork children joining a pool fork while this process has no participant (its
// heartbeat thread gone), then join again: the sanitizers' runtimes do not survive a child that
// starts threads after a fork from a threaded parent (TSan: "dup thread"; ASan: allocator lock).
// Forking from a participant is tested by the fork test and the torture's supervisor design.
TEST_CASE("a participant killed with SIGKILL is recovered: its blocks freed, the ones others hold kept", "[shared]") {
  ShmPool a("kill");
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  REQUIRE(cxlpool_shared_pool_close(a.pool) == CXLPOOL_OK);
  a.pool = nullptr;
  pid_t child = fork();
  if (child == 0) {
    close(pipefd[0]);
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(a.device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    for (int k = 0; k < 1000; ++k)
      if (cxlpool_shared_alloc(c, 100 + k * 37, &p) != CXLPOOL_OK) _exit(3);  // left allocated: a leak to recover
    if (cxlpool_shared_alloc(c, 5000, &p) != CXLPOOL_OK) _exit(4);
    fill(p, 5000, 5);
    cxlpool_shared_handle_t h{};
    if (cxlpool_shared_export(c, p, &h) != CXLPOOL_OK) _exit(5);
    if (write(pipefd[1], &h, sizeof h) != static_cast<ssize_t>(sizeof h)) _exit(6);
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  a.pool = a.open_again();
  cxlpool_shared_handle_t h{};
  REQUIRE(read(pipefd[0], &h, sizeof h) == static_cast<ssize_t>(sizeof h));
  close(pipefd[0]);
  void* q = nullptr;
  REQUIRE(cxlpool_shared_import(a.pool, &h, &q, nullptr) == CXLPOOL_OK);
  CHECK(info_of(a.pool).participants == 2);
  kill(child, SIGKILL);
  CHECK(wait_exit(child) == 128 + SIGKILL);
  CHECK(eventually([&] { return info_of(a.pool).recovered_slots == 1; }));
  auto i = info_of(a.pool);
  CHECK(i.participants == 1);
  CHECK(i.extents_mine == 1);  // the extent of the block we hold, adopted; the rest given back
  CHECK(holds(q, 5000, 5));
  cxlpool_status_t st;
  auto r = check(a.device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.leaked_blocks == 0);
  CHECK(r.dead_participants == 0);
  CHECK(r.blocks_in_use == 1);
  REQUIRE(cxlpool_shared_release(a.pool, q) == CXLPOOL_OK);
  CHECK(eventually([&] { return check(a.device, 0).blocks_in_use == 0; }));
}

TEST_CASE("the checker finds dead participants and leaks, repair recovers them", "[shared]") {
  ShmPool a("check");
  cxlpool_shared_pool_close(a.pool);  // nobody alive: the checker's own view only
  a.pool = nullptr;
  int report[2];
  REQUIRE(pipe(report) == 0);
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(a.device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    for (int k = 0; k < 50; ++k)
      if (cxlpool_shared_alloc(c, 300, &p) != CXLPOOL_OK) _exit(3);
    cxlpool_shared_info_t i{};
    if (cxlpool_shared_pool_info(c, &i) != CXLPOOL_OK) _exit(4);
    const uint64_t blocks = 50 + i.bytes_cached / (i.bytes_in_use / 50);  // its block cache's too
    if (write(report[1], &blocks, sizeof blocks) != sizeof blocks) _exit(5);
    kill(getpid(), SIGKILL);
  }
  close(report[1]);
  uint64_t allocated = 0;
  REQUIRE(read(report[0], &allocated, sizeof allocated) == sizeof allocated);
  close(report[0]);
  CHECK(allocated > 50);
  CHECK(wait_exit(child) == 128 + SIGKILL);
  cxlpool_status_t st;
  auto r = check(a.device, 0, &st);
  CHECK(st == CXLPOOL_E_CORRUPT);
  CHECK(r.dead_participants == 1);
  CHECK(r.leaked_blocks == allocated);
  r = check(a.device, 1, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.recovered == 1);
  CHECK(r.leaked_blocks == 0);
  CHECK(r.blocks_in_use == 0);
  CHECK(r.extents_free == r.extents_total);
}

namespace {

// A child participant that allocates a block, says so, waits for a byte (after SIGSTOP ...
// SIGCONT), then frees the block and allocates another: exit 0 when both calls returned expect.
pid_t stop_child(const std::string& device, cxlpool_status_t expect, int ready_fd, int go_fd) {
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK) _exit(3);
    fill(p, 256, 9);
    char byte = 1;
    if (write(ready_fd, &byte, 1) != 1) _exit(4);
    if (read(go_fd, &byte, 1) != 1) _exit(5);
    const bool intact = expect != CXLPOOL_OK || holds(p, 256, 9);
    cxlpool_status_t s1 = cxlpool_shared_free(c, p);
    void* q = nullptr;
    cxlpool_status_t s2 = cxlpool_shared_alloc(c, 256, &q);
    if (s1 != expect || s2 != expect || !intact) _exit(10);
    if (cxlpool_shared_pool_close(c) != CXLPOOL_OK) _exit(11);
    _exit(0);
  }
  return child;
}

std::string stats_of(cxlpool_shared_pool_t* p) {
  char* json = nullptr;
  REQUIRE(cxlpool_shared_pool_stats_json(p, &json) == CXLPOOL_OK);
  std::string s = json;
  cxlpool_string_free(json);
  return s;
}

// An observer of a pool from a pid namespace of its own with its own /proc: a sibling of every
// namespace a test makes, so it sees nothing of the other participants' processes and only
// their heartbeats vouch for them, as for another host. Needs root (CLONE_NEWPID, mounting
// proc in a private mount namespace).
class NsObserver {
 public:
  explicit NsObserver(const std::string& device) {
    int cmd[2], out[2];
    REQUIRE(pipe(cmd) == 0);
    REQUIRE(pipe(out) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(cmd[1]);
      close(out[0]);
      if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) _exit(20);
      const pid_t inner = fork();  // pid 1 of the new namespace
      if (inner == 0) serve(device, cmd[0], out[1]);
      _exit(wait_exit(inner));
    }
    close(cmd[0]);
    close(out[1]);
    cmd_ = cmd[1];
    out_ = out[0];
    char status = 1;
    ok_ = read(out_, &status, 1) == 1 && status == 0;
  }
  ~NsObserver() {
    if (write(cmd_, "q", 1) != 1) kill(pid_, SIGKILL);
    close(cmd_);
    close(out_);
    wait_exit(pid_);
  }
  NsObserver(const NsObserver&) = delete;
  NsObserver& operator=(const NsObserver&) = delete;
  bool ok() const { return ok_; }
  uint64_t recovered_slots() {
    uint64_t n = UINT64_MAX;
    if (write(cmd_, "r", 1) != 1 || read(out_, &n, sizeof n) != sizeof n) return UINT64_MAX;
    return n;
  }
  // Starts a participant of the pool as the first process of a pid namespace below the
  // observer's (a container inside the observer's container); returns that namespace's inode.
  uint64_t start_nested() {
    uint64_t ino = 0;
    if (write(cmd_, "n", 1) != 1 || read(out_, &ino, sizeof ino) != sizeof ino) return 0;
    return ino;
  }
  // SIGSTOP ('t') or SIGKILL and reap ('k') the nested participant; true when done.
  bool signal_nested(char op) {
    char done = 0;
    return write(cmd_, &op, 1) == 1 && read(out_, &done, 1) == 1 && done == 1;
  }
  std::string stats() {
    uint32_t len = 0;
    if (write(cmd_, "s", 1) != 1 || read(out_, &len, sizeof len) != sizeof len) return {};
    std::string json(len, '\0');
    size_t got = 0;
    while (got < len) {
      const ssize_t n = read(out_, json.data() + got, len - got);
      if (n <= 0) return {};
      got += size_t(n);
    }
    return json;
  }

 private:
  [[noreturn]] static void serve(const std::string& device, int cmd, int out) {
    // The nested participants come from a launcher forked now, while this process is one
    // thread: a fork from the observer once it has the pool open (and its threads) could give
    // the child a lock of the sanitizer's allocator held by a thread the child does not have.
    int lcmd[2], lout[2];
    if (pipe(lcmd) != 0 || pipe(lout) != 0) _exit(6);
    const pid_t launcher = fork();
    if (launcher < 0) _exit(6);
    if (launcher == 0) {
      close(lcmd[1]);
      close(lout[0]);
      close(cmd);
      close(out);
      launch(device, lcmd[0], lout[1]);
    }
    close(lcmd[0]);
    close(lout[1]);
    char status = 1;
    cxlpool_shared_pool_t* pool = nullptr;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0 &&
        cxlpool_shared_pool_open(device.c_str(), nullptr, &pool) == CXLPOOL_OK)
      status = 0;
    if (write(out, &status, 1) != 1 || status != 0) _exit(2);
    char c = 0;
    while (read(cmd, &c, 1) == 1 && c != 'q') {
      if (c == 'n') {
        uint64_t ino = 0;
        if (write(lcmd[1], &c, 1) != 1 || read(lout[0], &ino, sizeof ino) != sizeof ino) ino = 0;
        if (write(out, &ino, sizeof ino) != sizeof ino) _exit(3);
      } else if (c == 't' || c == 'k') {
        char done = 0;
        if (write(lcmd[1], &c, 1) != 1 || read(lout[0], &done, 1) != 1) done = 0;
        if (write(out, &done, 1) != 1) _exit(3);
      } else if (c == 'r') {
        cxlpool_shared_info_t i{};
        const uint64_t n = cxlpool_shared_pool_info(pool, &i) == CXLPOOL_OK ? i.recovered_slots : UINT64_MAX;
        if (write(out, &n, sizeof n) != sizeof n) _exit(3);
      } else if (c == 's') {
        char* json = nullptr;
        const std::string s = cxlpool_shared_pool_stats_json(pool, &json) == CXLPOOL_OK ? json : "";
        cxlpool_string_free(json);
        const auto len = static_cast<uint32_t>(s.size());
        if (write(out, &len, sizeof len) != sizeof len || write(out, s.data(), len) != ssize_t(len)) _exit(4);
      }
    }
    close(lcmd[1]);  // the launcher ends
    wait_exit(launcher);
    _exit(cxlpool_shared_pool_close(pool) == CXLPOOL_OK ? 0 : 5);
  }
  // In the observer's namespace: 'n' starts a participant as the first process of a namespace
  // below it and answers that namespace's inode (0: failed); 't' stops it, 'k' kills and reaps
  // it, answering 1 when done.
  [[noreturn]] static void launch(const std::string& device, int cmd, int out) {
    char c = 0;
    pid_t nested_outer = -1, nested = -1;  // the nested namespace's waiter and its first process
    while (read(cmd, &c, 1) == 1) {
      if (c == 'n') {
        uint64_t ino = 0;
        int pids[2], inos[2];  // two pipes: the two writers race
        if (pipe(pids) != 0 || pipe(inos) != 0) _exit(6);
        nested_outer = fork();
        if (nested_outer == 0) {
          close(pids[0]);
          close(inos[0]);
          if (unshare(CLONE_NEWPID) != 0) _exit(20);
          const pid_t inner = fork();
          if (inner == 0) {
            close(pids[1]);
            cxlpool_shared_pool_t* mine = nullptr;
            void* b = nullptr;
            struct stat st {};
            if (cxlpool_shared_pool_open(device.c_str(), nullptr, &mine) != CXLPOOL_OK ||
                cxlpool_shared_alloc(mine, 256, &b) != CXLPOOL_OK || stat("/proc/self/ns/pid", &st) != 0)
              _exit(2);
            const uint64_t mine_ino = st.st_ino;
            if (write(inos[1], &mine_ino, sizeof mine_ino) != sizeof mine_ino) _exit(3);
            for (;;) pause();
          }
          close(inos[1]);
          if (write(pids[1], &inner, sizeof inner) != sizeof inner) _exit(21);
          _exit(wait_exit(inner));
        }
        close(pids[1]);
        close(inos[1]);
        if (nested_outer < 0 || read(pids[0], &nested, sizeof nested) != sizeof nested ||
            read(inos[0], &ino, sizeof ino) != sizeof ino)
          ino = 0;
        close(pids[0]);
        close(inos[0]);
        if (write(out, &ino, sizeof ino) != sizeof ino) _exit(3);
      } else if (c == 't' || c == 'k') {
        char done = nested > 0 && kill(nested, c == 't' ? SIGSTOP : SIGKILL) == 0;
        if (c == 'k' && done) done = wait_exit(nested_outer) == 128 + SIGKILL;
        if (write(out, &done, 1) != 1) _exit(3);
      }
    }
    if (nested > 0) kill(nested, SIGKILL);
    _exit(0);
  }
  pid_t pid_ = -1;
  int cmd_ = -1, out_ = -1;
  bool ok_ = false;
};

}  // namespace

TEST_CASE("a stopped participant is evicted after the pool's stopped timeout and gets an error, not reclaimed memory",
          "[shared]") {
  ShmPool a("stop", 64u << 20, 300);  // stopped for 300 ms: dead
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  REQUIRE(cxlpool_shared_pool_close(a.pool) == CXLPOOL_OK);
  a.pool = nullptr;
  pid_t child = stop_child(a.device, CXLPOOL_E_EVICTED, ready[1], go[0]);
  a.pool = a.open_again();
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  kill(child, SIGSTOP);
  CHECK(eventually([&] { return info_of(a.pool).recovered_slots == 1; }, 30000));
  kill(child, SIGCONT);
  REQUIRE(write(go[1], &byte, 1) == 1);
  CHECK(wait_exit(child) == 0);
  CHECK(check(a.device, 0).leaked_blocks == 0);
}

TEST_CASE("CXLPOOL_SHARED_STOPPED_NEVER: a stopped participant of this host is alive for as long as its process",
          "[shared]") {
  ShmPool a("stopnever", 64u << 20, CXLPOOL_SHARED_STOPPED_NEVER);
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  REQUIRE(cxlpool_shared_pool_close(a.pool) == CXLPOOL_OK);
  a.pool = nullptr;
  pid_t child = stop_child(a.device, CXLPOOL_OK, ready[1], go[0]);
  a.pool = a.open_again();
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  kill(child, SIGSTOP);
  // The watch sees it stopped, then 20 leases go by: still alive, nothing reclaimed.
  CHECK(eventually([&] { return stats_of(a.pool).find("\"process\": \"stopped\"") != std::string::npos; }, 30000));
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  CHECK(info_of(a.pool).recovered_slots == 0);
  CHECK(info_of(a.pool).participants == 2);
  cxlpool_shared_survey_t survey{};
  REQUIRE(cxlpool_shared_pool_survey(a.device.c_str(), &survey, nullptr, 0) == CXLPOOL_OK);
  CHECK(survey.stopped_timeout_ms == CXLPOOL_SHARED_STOPPED_NEVER);
  kill(child, SIGCONT);
  REQUIRE(write(go[1], &byte, 1) == 1);
  CHECK(wait_exit(child) == 0);  // its block intact, freed, and a new one allocated
  CHECK(check(a.device, 0).leaked_blocks == 0);
}

TEST_CASE("defaults: a 5 s lease and a 10 minute stopped timeout, bad stopped timeouts refused", "[shared]") {
  const std::string name = unique_name("defaults"), device = "shm:" + name;
  cxlpool_shared_params_t* p = nullptr;
  REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(p, 32u << 20) == CXLPOOL_OK);
  CHECK(cxlpool_shared_params_set_stopped_timeout(p, 86400001) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_set_stopped_timeout(p, 20) == CXLPOOL_OK);  // < 3 heartbeats: refused at create
  cxlpool_shared_pool_t* pool = nullptr;
  CHECK(cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_E_CONFIG);
  CHECK(std::string(cxlpool_last_error_message()).find("stopped timeout") != std::string::npos);
  REQUIRE(cxlpool_shared_params_set_stopped_timeout(p, 0) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_OK);
  cxlpool_shared_params_destroy(p);
  cxlpool_shared_survey_t survey{};
  REQUIRE(cxlpool_shared_pool_survey(device.c_str(), &survey, nullptr, 0) == CXLPOOL_OK);
  CHECK(survey.lease_timeout_ms == 5000);
  CHECK(survey.stopped_timeout_ms == 600000);
  const std::string json = stats_of(pool);
  CHECK(json.find("\"lease_timeout_ms\": 5000") != std::string::npos);
  CHECK(json.find("\"stopped_timeout_ms\": 600000") != std::string::npos);
  CHECK(json.find("\"max_gap_ms\":") != std::string::npos);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device.c_str());
}

TEST_CASE("silence alone never kills a live participant of this host, with a lease far below the machine's stalls",
          "[shared]") {
  const std::string name = unique_name("silent"), device = "shm:" + name;
  Params params(64u << 20, 5, 15);  // a 15 ms lease: the hogs below stall the heartbeat longer
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int stop[2], result[2];
  REQUIRE(pipe(stop) == 0);
  REQUIRE(pipe(result) == 0);
  fcntl(stop[0], F_SETFL, O_NONBLOCK);
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    uint64_t out[3] = {0, 0, 0};  // rounds, failures, the worst gap between its own beats (us)
    char byte = 0;
    std::vector<void*> held;
    while (read(stop[0], &byte, 1) != 1) {
      void* p = nullptr;
      const cxlpool_status_t st = cxlpool_shared_alloc(c, 128 + (out[0] % 64) * 200, &p);
      if (st == CXLPOOL_OK) {
        held.push_back(p);
        if (held.size() > 256) {
          out[1] += cxlpool_shared_free(c, held.front()) != CXLPOOL_OK;
          held.erase(held.begin());
        }
      } else {
        ++out[1];
      }
      ++out[0];
    }
    char* json = nullptr;
    if (cxlpool_shared_pool_stats_json(c, &json) == CXLPOOL_OK) {
      const char* at = std::strstr(json, "\"max_gap_ms\":");
      if (at) out[2] = static_cast<uint64_t>(std::atof(at + 13) * 1000);
      cxlpool_string_free(json);
    }
    if (write(result[1], out, sizeof out) != sizeof out) _exit(3);
    _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 4);
  }
  uint64_t recovered = 0;
  {
    cxlpool_test::CpuHogs hogs;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    recovered = info_of(a).recovered_slots;
    REQUIRE(write(stop[1], "x", 1) == 1);
  }
  uint64_t out[3] = {0, 0, 0};
  REQUIRE(read(result[0], out, sizeof out) == sizeof out);
  CHECK(wait_exit(child) == 0);
  CHECK(recovered == 0);
  CHECK(out[0] > 0);
  CHECK(out[1] == 0);
  WARN("a participant under CPU hogs with a 15 ms lease: " << out[0] << " calls, 0 evictions expected, its worst gap "
                                                           << out[2] / 1000.0 << " ms");
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

TEST_CASE("kill -9 on this host is seen at once, reaped or still a zombie, whatever the lease", "[shared]") {
  const std::string name = unique_name("kill9"), device = "shm:" + name;
  // A 60 s lease that never fires here: only the process can have told.
  Params params(64u << 20, 10, 60000, CXLPOOL_SHARED_STOPPED_NEVER);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    for (int k = 0; k < 100; ++k)
      if (cxlpool_shared_alloc(c, 300, &p) != CXLPOOL_OK) _exit(3);
    if (write(ready[1], "r", 1) != 1) _exit(4);
    for (;;) pause();
  }
  cxlpool_test::CpuHogs hogs;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  kill(child, SIGKILL);  // not reaped yet: its pid lives on as a zombie
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(eventually([&] { return info_of(a).recovered_slots == 1; }, 20000));  // a hang guard, a third of the lease
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(wait_exit(child) == 128 + SIGKILL);
  WARN("kill -9 under CPU hogs, not reaped: recovered after " << ms << " ms (lease 60 s)");
  cxlpool_status_t st = CXLPOOL_OK;
  auto r = check(device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.leaked_blocks == 0);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// The heartbeat does not wait for the application: a thread of the participant is held inside
// a pool call, holding its heap lock, for 40 leases (its first touch of a page of the pool
// waits on a userfaultfd the test holds); its heartbeat keeps moving and nobody evicts it.
TEST_CASE("a participant whose thread holds the pool's heap lock for 40 leases keeps beating and is not evicted",
          "[shared]") {
  const std::string name = unique_name("heldlock"), device = "shm:" + name;
  Params params(32u << 20, 5, 50);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int to_parent[2], to_child[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_child) == 0);
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    cxlpool_shared_info_t info{};
    cxlpool_shared_pool_info(c, &info);
    // Every page of the data area (never touched by this process) faults to our handler on
    // first touch, in a minor-fault userfaultfd: the kernel holds the thread until we say.
    int fd = open(("/dev/shm/" + name).c_str(), O_RDONLY);
    cxlpool::detail::shared::Superblock sb{};
    if (fd < 0 || pread(fd, &sb, sizeof sb, 0) != ssize_t(sizeof sb)) _exit(3);
    close(fd);
    char byte = 'u';  // 'u': no userfaultfd here (the parent skips visibly)
    int uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_MINOR_SHMEM;
    // The pool's mapping: find it from a block's address is not possible before allocating, so
    // from /proc/self/maps by the pool's file name.
    uintptr_t lo = 0;
    if (FILE* maps = fopen("/proc/self/maps", "r")) {
      char line[512];
      while (fgets(line, sizeof line, maps))
        if (std::strstr(line, name.c_str())) {
          lo = std::strtoull(line, nullptr, 16);
          break;
        }
      fclose(maps);
    }
    uffdio_register reg{};
    reg.range.start = lo + sb.data_offset;
    reg.range.len = sb.extent_count * sb.extent_size;
    reg.mode = UFFDIO_REGISTER_MODE_MINOR;
    if (uffd >= 0 && lo != 0 && ioctl(uffd, UFFDIO_API, &api) == 0 && ioctl(uffd, UFFDIO_REGISTER, &reg) == 0)
      byte = 'r';
    if (write(to_parent[1], &byte, 1) != 1 || byte != 'r') _exit(0);
    std::atomic<bool> done{false};
    std::thread handler([&] {
      bool first = true;
      while (!done.load()) {
        pollfd pfd{uffd, POLLIN, 0};
        if (poll(&pfd, 1, 20) != 1) continue;
        uffd_msg msg{};
        if (read(uffd, &msg, sizeof msg) != ssize_t(sizeof msg) || msg.event != UFFD_EVENT_PAGEFAULT) continue;
        if (first) {  // the allocating thread waits inside cxlpool_shared_alloc, holding the heap lock
          char b = 'b';
          if (write(to_parent[1], &b, 1) != 1 || read(to_child[0], &b, 1) != 1) _exit(6);
          first = false;
        }
        uffdio_continue go{};
        go.range.start = msg.arg.pagefault.address & ~uint64_t(4095);
        go.range.len = 4096;
        ioctl(uffd, UFFDIO_CONTINUE, &go);  // maps the page and wakes the thread
      }
    });
    void* p = nullptr;
    const cxlpool_status_t s1 = cxlpool_shared_alloc(c, 256, &p);  // formats an extent: touches the data area
    done = true;
    handler.join();
    ioctl(uffd, UFFDIO_UNREGISTER, &reg.range);
    void* q = nullptr;
    const cxlpool_status_t s2 = cxlpool_shared_alloc(c, 4096, &q);
    const cxlpool_status_t s3 = cxlpool_shared_free(c, p);
    _exit(s1 == CXLPOOL_OK && s2 == CXLPOOL_OK && s3 == CXLPOOL_OK && cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0
                                                                                                                 : 10);
  }
  char byte = 0;
  REQUIRE(read(to_parent[0], &byte, 1) == 1);
  if (byte != 'r') {
    CHECK(wait_exit(child) == 0);
    cxlpool_shared_pool_unlink(device.c_str());
    CXLPOOL_SKIP("no minor-fault userfaultfd on shmem here (Linux 5.13+)");
  }
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  REQUIRE(read(to_parent[0], &byte, 1) == 1);
  REQUIRE(byte == 'b');
  // The child's heartbeat word, read from the device (slot 0: it joined first).
  int fd = open(("/dev/shm/" + name).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  cxlpool::detail::shared::Superblock sb{};
  REQUIRE(pread(fd, &sb, sizeof sb, 0) == ssize_t(sizeof sb));
  auto heartbeat = [&] {
    uint64_t v = 0;
    REQUIRE(pread(fd, &v, sizeof v, off_t(sb.slots_offset + offsetof(cxlpool::detail::shared::SlotLine0, heartbeat))) ==
            ssize_t(sizeof v));
    return v;
  };
  // The lock stays held: the heartbeat goes on (5 beats past the first look; its low 32 bits
  // count), and after 40 leases nobody has evicted it.
  const uint64_t before = heartbeat();
  CHECK(eventually([&] { return uint32_t(heartbeat() - before) >= 5; }, 20000));
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  CHECK(info_of(a).recovered_slots == 0);
  REQUIRE(write(to_child[1], "g", 1) == 1);
  CHECK(wait_exit(child) == 0);  // the held call completed, and its next calls too: not evicted
  CHECK(info_of(a).recovered_slots == 0);
  close(fd);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// A participant that nothing of its process can be seen from the observer (in a sibling pid
// namespace), only its heartbeat vouches for it (as for another host). With the default lease,
// on a machine whose CPUs are saturated and while its own threads keep the pool's locks busy,
// it is not evicted.
TEST_CASE("a participant only its heartbeat vouches for survives CPU hogs with the default lease", "[shared]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root for a pid namespace (unshare CLONE_NEWPID)");
  const std::string name = unique_name("pidns"), device = "shm:" + name;
  cxlpool_shared_params_t* p = nullptr;
  REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_size(p, 64u << 20) == CXLPOOL_OK);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), p, 0, &a) == CXLPOOL_OK);  // default timing
  cxlpool_shared_params_destroy(p);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int stop[2], ready[2];
  REQUIRE(pipe(stop) == 0);
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork_in_new_pid_namespace([&] {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    std::atomic<bool> done{false};
    std::atomic<uint64_t> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t)
      threads.emplace_back([&, t] {
        std::vector<void*> mine;
        for (uint64_t k = 0; !done.load(); ++k) {
          void* q = nullptr;
          if (cxlpool_shared_alloc(c, 128 + ((k * 7 + t) % 40) * 300, &q) != CXLPOOL_OK) {
            ++failures;
            continue;
          }
          mine.push_back(q);
          if (mine.size() > 64) {
            cxlpool_shared_handle_t h{};
            failures += cxlpool_shared_export(c, mine.front(), &h) != CXLPOOL_OK;
            failures += cxlpool_shared_free(c, mine.front()) != CXLPOOL_OK;
            mine.erase(mine.begin());
          }
          cxlpool_shared_info_t info{};
          failures += cxlpool_shared_pool_info(c, &info) != CXLPOOL_OK;
        }
        for (void* q : mine) failures += cxlpool_shared_free(c, q) != CXLPOOL_OK;
      });
    if (write(ready[1], "r", 1) != 1) _exit(3);
    char byte = 0;
    if (read(stop[0], &byte, 1) != 1) _exit(4);
    done = true;
    for (auto& t : threads) t.join();
    _exit(failures.load() == 0 && cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 10);
  });
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  uint64_t recovered = 0;
  std::string json;
  {
    cxlpool_test::CpuHogs hogs(16);
    NsObserver observer(device);
    REQUIRE(observer.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10000));
    recovered = observer.recovered_slots();
    json = observer.stats();
    REQUIRE(write(stop[1], "s", 1) == 1);
  }
  CHECK(wait_exit(child) == 0);  // no call of its six threads failed: never evicted
  CHECK(recovered == 0);
  CHECK(json.find("\"process\": \"unverifiable\"") != std::string::npos);
  cxlpool_shared_pool_unlink(device.c_str());
}

TEST_CASE("an observer out of descriptors judges a stalled peer by its heartbeat, not as dead", "[shared]") {
  const std::string name = unique_name("emfile"), device = "shm:" + name;
  Params params(64u << 20, 10, 3000);  // a 3 s lease: a 150 ms stall is not death
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);  // the child joins with no participant here
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  pid_t child = fork();
  if (child == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK) _exit(3);
    char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(4);
    if (read(go[0], &byte, 1) != 1) _exit(5);
    if (cxlpool_shared_free(c, p) != CXLPOOL_OK) _exit(6);  // not evicted
    _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 7);
  }
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  a = nullptr;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  // No descriptor left in the observer while the peer is stopped: /proc cannot be read.
  std::vector<int> fds;
  for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) fds.push_back(fd);
  kill(child, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  kill(child, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int fd : fds) close(fd);
  CHECK(fds.size() > 10);
  CHECK(info_of(a).recovered_slots == 0);
  REQUIRE(write(go[1], &byte, 1) == 1);
  CHECK(wait_exit(child) == 0);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

TEST_CASE("a forged superblock with an endless lease is refused, not waited on", "[shared]") {
  ShmPool a("forged", 32u << 20);
  REQUIRE(cxlpool_shared_pool_close(a.pool) == CXLPOOL_OK);
  a.pool = nullptr;
  const std::string path = "/dev/shm/" + a.name;
  int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  cxlpool::detail::shared::Superblock sb{};
  REQUIRE(pread(fd, &sb, sizeof sb, 0) == ssize_t(sizeof sb));
  sb.lease_timeout_ms = 0xfffffff0u;  // ~49 days: a look at the pool would sample that long
  sb.checksum = crc32c_of(&sb, offsetof(cxlpool::detail::shared::Superblock, checksum));
  REQUIRE(pwrite(fd, &sb, sizeof sb, 0) == ssize_t(sizeof sb));
  close(fd);
  cxlpool_shared_pool_t* p = nullptr;
  CHECK(cxlpool_shared_pool_open(a.device.c_str(), nullptr, &p) == CXLPOOL_E_CORRUPT);
  cxlpool_shared_survey_t survey{};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(cxlpool_shared_pool_survey(a.device.c_str(), &survey, nullptr, 0) == CXLPOOL_E_CORRUPT);
  cxlpool_status_t st = CXLPOOL_OK;
  check(a.device, 0, &st);
  CHECK(st == CXLPOOL_E_CORRUPT);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("racing creators: exactly one wins, the others get CXLPOOL_E_EXISTS", "[shared]") {
  const std::string name = unique_name("race");
  const std::string device = "shm:" + name;
  std::vector<pid_t> kids;
  for (int k = 0; k < 8; ++k) {
    pid_t pid = fork();
    if (pid == 0) {
      Params params;
      cxlpool_shared_pool_t* p = nullptr;
      cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params.p, 0, &p);
      if (st == CXLPOOL_OK) {
        cxlpool_shared_pool_close(p);
        _exit(0);
      }
      _exit(st == CXLPOOL_E_EXISTS ? 1 : 2);
    }
    kids.push_back(pid);
  }
  int winners = 0, exists = 0;
  for (pid_t pid : kids) {
    int code = wait_exit(pid);
    winners += code == 0;
    exists += code == 1;
  }
  CHECK(winners == 1);
  CHECK(exists == 7);
  cxlpool_shared_pool_t* p = nullptr;
  CHECK(cxlpool_shared_pool_open(device.c_str(), nullptr, &p) == CXLPOOL_OK);  // complete, valid
  if (p) cxlpool_shared_pool_close(p);
  CHECK(cxlpool_shared_pool_unlink(device.c_str()) == CXLPOOL_OK);
  CHECK(access(("/dev/shm/" + name).c_str(), F_OK) != 0);
}

TEST_CASE("a forked child is not a participant: its calls fail cleanly and the parent is undisturbed", "[shared]") {
  ShmPool a("fork");
  void* p = nullptr;
  REQUIRE(cxlpool_shared_alloc(a.pool, 512, &p) == CXLPOOL_OK);
  fill(p, 512, 3);
  pid_t child = fork();
  if (child == 0) {
    void* q = nullptr;
    if (cxlpool_shared_alloc(a.pool, 512, &q) != CXLPOOL_E_NOT_SUPPORTED) _exit(2);
    if (cxlpool_shared_free(a.pool, p) != CXLPOOL_E_NOT_SUPPORTED) _exit(3);
    if (!holds(p, 512, 3)) _exit(4);                                // the mapping is shared: the child sees the data
    if (cxlpool_shared_pool_close(a.pool) != CXLPOOL_OK) _exit(5);  // leaves nothing: not its slot
    _exit(0);
  }
  CHECK(wait_exit(child) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the lease timeout
  CHECK(info_of(a.pool).participants == 1);
  CHECK(holds(p, 512, 3));
  // Forks while another thread of the parent is inside the pool's calls (holding its locks):
  // no call of the child may wait on a lock copied in the held state.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    void* q = nullptr;
    while (!stop.load())
      if (cxlpool_shared_alloc(a.pool, 512, &q) == CXLPOOL_OK) cxlpool_shared_free(a.pool, q);
  });
  int bad = 0;
  for (int k = 0; k < 20; ++k) {
    pid_t c = fork();
    if (c == 0) {
      alarm(5);  // a hang becomes SIGALRM
      cxlpool_shared_health_t h{};
      void* q = nullptr;
      if (cxlpool_shared_pool_health(a.pool, &h) != CXLPOOL_E_NOT_SUPPORTED) _exit(2);
      if (cxlpool_shared_pool_inject_failure(a.pool, "child") != CXLPOOL_E_NOT_SUPPORTED) _exit(3);
      if (cxlpool_shared_alloc(a.pool, 512, &q) != CXLPOOL_E_NOT_SUPPORTED) _exit(4);
      cxlpool_shared_info_t i{};
      if (cxlpool_shared_pool_info(a.pool, &i) != CXLPOOL_E_NOT_SUPPORTED) _exit(5);
      char* json = nullptr;
      if (cxlpool_shared_pool_stats_json(a.pool, &json) != CXLPOOL_E_NOT_SUPPORTED) _exit(6);
      _exit(0);
    }
    bad += wait_exit(c) != 0;
  }
  stop = true;
  busy.join();
  CHECK(bad == 0);
  CHECK(info_of(a.pool).participants == 1);
  REQUIRE(cxlpool_shared_free(a.pool, p) == CXLPOOL_OK);
}

TEST_CASE("a scribbling peer: corrupt metadata is detected, never turned into overlapping blocks", "[shared]") {
  ShmPool a("evil", 32u << 20);
  cxlpool_shared_pool_t* b = a.open_again();
  std::vector<void*> mine;
  void* p = nullptr;
  for (int k = 0; k < 200; ++k) {
    REQUIRE(cxlpool_shared_alloc(a.pool, 2048, &p) == CXLPOOL_OK);
    fill(p, 2048, static_cast<uint8_t>(k));
    mine.push_back(p);
  }
  // The evil peer maps the file itself and writes random bytes over the extent table and over
  // the first extent's block-state words.
  int fd = open(("/dev/shm/" + a.name).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  struct stat st {};
  fstat(fd, &st);
  auto* base = static_cast<uint8_t*>(mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(base != MAP_FAILED);
  close(fd);
  std::mt19937 rng(1);
  cxlpool::detail::shared::Superblock sb{};
  std::memcpy(&sb, base, sizeof sb);
  const uint64_t extents_offset = sb.extents_offset, data_offset = sb.data_offset;
  REQUIRE(extents_offset > 0);
  for (int k = 0; k < 64; ++k) base[extents_offset + 128 * 2 + rng() % (128 * 8)] = static_cast<uint8_t>(rng());
  for (int k = 0; k < 256; ++k) base[data_offset + rng() % 1024] = static_cast<uint8_t>(rng());  // state words only
  // b allocates as much as it can; a's blocks must keep their bytes (no overlap).
  std::vector<void*> theirs;
  while (cxlpool_shared_alloc(b, 2048, &p) == CXLPOOL_OK) {
    std::memset(p, 0xEE, 2048);
    theirs.push_back(p);
  }
  CHECK(!theirs.empty());
  for (size_t k = 0; k < mine.size(); ++k) {
    INFO("block " << k << " at offset " << (static_cast<uint8_t*>(mine[k]) - static_cast<uint8_t*>(mine[0]))
                  << " first byte " << int(static_cast<uint8_t*>(mine[k])[0]));
    CHECK(holds(mine[k], 2048, static_cast<uint8_t>(k)));
  }
  // Frees of a's blocks either work or report corruption; nothing crashes.
  for (void* q : mine) {
    cxlpool_status_t s = cxlpool_shared_free(a.pool, q);
    CHECK((s == CXLPOOL_OK || s == CXLPOOL_E_CORRUPT || s == CXLPOOL_E_INVALID_ARGUMENT));
  }
  cxlpool_status_t status;
  auto r = check(a.device, 0, &status);
  CHECK(status == CXLPOOL_E_CORRUPT);
  CHECK(r.corrupt_words > 0);
  munmap(base, st.st_size);
  for (void* q : theirs) cxlpool_shared_free(b, q);
  cxlpool_shared_pool_close(b);
}

TEST_CASE("coherence none: the non-coherent view makes a missing publish or acquire fail every time", "[shared]") {
  const std::string name = unique_name("nc");
  const std::string device = "shm:" + name;
  Params params;
  REQUIRE(cxlpool_shared_params_set_coherence(params.p, CXLPOOL_COHERENCE_NONE) == CXLPOOL_OK);
  cxlpool_shared_pool_t* creator = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &creator) == CXLPOOL_OK);
  CHECK(info_of(creator).coherence == CXLPOOL_COHERENCE_NONE);
  Params writer_params, reader_params;
  REQUIRE(cxlpool_shared_params_set_noncoherent_view(writer_params.p, 1, 0) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_set_noncoherent_view(reader_params.p, 2, 0) == CXLPOOL_OK);
  cxlpool_shared_pool_t *writer = nullptr, *reader = nullptr;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), writer_params.p, &writer) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), reader_params.p, &reader) == CXLPOOL_OK);

  void* w = nullptr;
  REQUIRE(cxlpool_shared_alloc(writer, 4096, &w) == CXLPOOL_OK);
  fill(w, 4096, 1);
  cxlpool_shared_handle_t h{};
  REQUIRE(cxlpool_shared_export(writer, w, &h) == CXLPOOL_OK);
  void* r = nullptr;
  REQUIRE(cxlpool_shared_import(reader, &h, &r, nullptr) == CXLPOOL_OK);
  CHECK(r != w);  // each participant has its own view
  // The writer has not published: even an acquiring reader sees the old bytes.
  REQUIRE(cxlpool_acquire(r, 4096) == CXLPOOL_OK);
  CHECK_FALSE(holds(r, 4096, 1));
  // Published, but the reader does not acquire: stale.
  REQUIRE(cxlpool_publish(w, 4096) == CXLPOOL_OK);
  CHECK_FALSE(holds(r, 4096, 1));
  // Acquired: fresh.
  REQUIRE(cxlpool_acquire(r, 4096) == CXLPOOL_OK);
  CHECK(holds(r, 4096, 1));
  // A second round on the same block: again stale until both sides do their part.
  fill(w, 4096, 2);
  REQUIRE(cxlpool_acquire(r, 4096) == CXLPOOL_OK);
  CHECK(holds(r, 4096, 1));
  REQUIRE(cxlpool_publish(w, 4096) == CXLPOOL_OK);
  REQUIRE(cxlpool_acquire(r, 4096) == CXLPOOL_OK);
  CHECK(holds(r, 4096, 2));

  // Objects several participants write, or that hold locks, are refused on coherence none.
  void* x = nullptr;
  CHECK(cxlpool_shared_alloc_flags(writer, 64, CXLPOOL_SHARED_WRITE_SHARED, &x) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(std::string(cxlpool_last_error_message()).find("coherence none") != std::string::npos);
  CHECK(cxlpool_shared_alloc_flags(writer, 64, CXLPOOL_SHARED_LOCK_BEARING, &x) == CXLPOOL_E_NOT_SUPPORTED);
  CHECK(cxlpool_shared_alloc_flags(writer, 64, 4, &x) == CXLPOOL_E_INVALID_ARGUMENT);
  REQUIRE(cxlpool_shared_alloc_flags(writer, 64, 0, &x) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(writer, x) == CXLPOOL_OK);

  REQUIRE(cxlpool_shared_release(reader, r) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(writer, w) == CXLPOOL_OK);
  cxlpool_shared_pool_close(reader);
  cxlpool_shared_pool_close(writer);
  cxlpool_shared_pool_close(creator);
  unlink(("/dev/shm/" + name).c_str());
}

TEST_CASE("coherence: defaults and the view's preconditions", "[shared]") {
  ShmPool host_pool("coh");
  CHECK(info_of(host_pool.pool).coherence == CXLPOOL_COHERENCE_HOST);
  void* x = nullptr;
  REQUIRE(cxlpool_shared_alloc_flags(host_pool.pool, 64, CXLPOOL_SHARED_WRITE_SHARED | CXLPOOL_SHARED_LOCK_BEARING,
                                     &x) == CXLPOOL_OK);
  REQUIRE(cxlpool_publish(x, 64) == CXLPOOL_OK);  // no-ops on coherent pools
  REQUIRE(cxlpool_acquire(x, 64) == CXLPOOL_OK);
  CHECK(cxlpool_publish(nullptr, 64) == CXLPOOL_E_INVALID_ARGUMENT);
  Params view;
  REQUIRE(cxlpool_shared_params_set_noncoherent_view(view.p, 3, 1) == CXLPOOL_OK);
  cxlpool_shared_pool_t* p = nullptr;
  CHECK(cxlpool_shared_pool_open(host_pool.device.c_str(), view.p, &p) == CXLPOOL_E_CONFIG);
  // Several hosts declared, coherence not set: none.
  const std::string name = unique_name("multi");
  Params multi;
  REQUIRE(cxlpool_shared_params_set_participants(multi.p, 2, 4) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_create(("shm:" + name).c_str(), multi.p, 0, &p) == CXLPOOL_OK);
  CHECK(info_of(p).coherence == CXLPOOL_COHERENCE_NONE);
  cxlpool_shared_pool_close(p);
  unlink(("/dev/shm/" + name).c_str());
}

// The survey (cxlpool-info) reads the extent table with read(), not a mapping: its counts must
// be the checker's, extent for extent, with small, large and freed extents all over the table.
TEST_CASE("survey: extent counts, quota use and owners agree with the checker on a busy pool", "[shared]") {
  const std::string name = unique_name("survey");
  const std::string device = "shm:" + name;
  Params params;
  REQUIRE(cxlpool_shared_params_add_quota(params.p, "prefill", 16u << 20) == CXLPOOL_OK);
  cxlpool_shared_pool_t* creator = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &creator) == CXLPOOL_OK);
  Params qp;
  REQUIRE(cxlpool_shared_params_set_quota(qp.p, "prefill") == CXLPOOL_OK);
  cxlpool_shared_pool_t* prefill = nullptr;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), qp.p, &prefill) == CXLPOOL_OK);
  std::vector<std::pair<cxlpool_shared_pool_t*, void*>> blocks;
  for (size_t i = 0; i < 40; ++i) {  // small blocks of several classes, and large ones
    cxlpool_shared_pool_t* p = i % 3 == 0 ? prefill : creator;
    void* b = nullptr;
    REQUIRE(cxlpool_shared_alloc(p, i % 5 == 0 ? (3u << 20) / 2 : (64u << 10) << (i % 4), &b) == CXLPOOL_OK);
    blocks.emplace_back(p, b);
  }
  for (size_t i = 0; i < blocks.size(); i += 4)
    REQUIRE(cxlpool_shared_free(blocks[i].first, blocks[i].second) == CXLPOOL_OK);
  const cxlpool_shared_check_report_t r = check(device, 0);
  REQUIRE(r.extents_total > 0);
  std::vector<cxlpool_shared_participant_t> who(8);
  cxlpool_shared_survey_t s{};
  REQUIRE(cxlpool_shared_pool_survey(device.c_str(), &s, who.data(), who.size()) == CXLPOOL_OK);
  CHECK(s.corrupt_words == 0);
  CHECK(s.orphan_extents == 0);
  CHECK(s.extents_total == r.extents_total);
  CHECK(s.extents_free == r.extents_free);
  CHECK(s.extents_free < s.extents_total - 20);
  REQUIRE(s.participant_count == 2);
  CHECK(who[0].extents_owned + who[1].extents_owned == s.extents_total - s.extents_free);
  CHECK(who[0].extents_owned > 0);
  CHECK(who[1].extents_owned > 0);
  uint64_t quota_sum = 0;
  for (uint32_t q = 0; q < s.quota_count; ++q) quota_sum += s.quotas[q].used_extents;
  CHECK(quota_sum == s.extents_total - s.extents_free);
  bool named = false;
  for (uint32_t q = 0; q < s.quota_count; ++q)
    if (std::string(s.quotas[q].name) == "prefill") {
      named = true;
      CHECK(s.quotas[q].used_extents == info_of(prefill).quota_extents_used);
      CHECK(s.quotas[q].used_extents > 0);
    }
  CHECK(named);
  for (size_t i = 0; i < blocks.size(); ++i)
    if (i % 4) REQUIRE(cxlpool_shared_free(blocks[i].first, blocks[i].second) == CXLPOOL_OK);
  cxlpool_shared_pool_close(prefill);
  cxlpool_shared_pool_close(creator);
  unlink(("/dev/shm/" + name).c_str());
}

TEST_CASE("quotas: a workload cannot allocate past its quota and does not disturb the others", "[shared]") {
  const std::string name = unique_name("quota");
  const std::string device = "shm:" + name;
  Params params;
  REQUIRE(cxlpool_shared_params_add_quota(params.p, "prefill", 8u << 20) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_params_add_quota(params.p, "decode", (4u << 20) + 12345) == CXLPOOL_OK);  // 4 extents
  CHECK(cxlpool_shared_params_add_quota(params.p, "decode", 1u << 20) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_add_quota(params.p, "default", 1u << 20) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_add_quota(params.p, "a b", 1u << 20) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(std::string(cxlpool_last_error_message()).find("\"a b\"") != std::string::npos);
  cxlpool_shared_pool_t* creator = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &creator) == CXLPOOL_OK);
  auto ci = info_of(creator);
  CHECK(std::string(ci.quota) == "default");
  CHECK(ci.quota_extents_max == ci.extents_total - 12);

  auto open_in = [&](const char* quota) {
    Params qp;
    REQUIRE(cxlpool_shared_params_set_quota(qp.p, quota) == CXLPOOL_OK);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), qp.p, &p) == CXLPOOL_OK);
    return p;
  };
  auto fill_up = [](cxlpool_shared_pool_t* p, std::vector<void*>* out) {
    void* b = nullptr;
    cxlpool_status_t st;
    while ((st = cxlpool_shared_alloc(p, 1u << 20, &b)) == CXLPOOL_OK) out->push_back(b);
    return st;
  };
  cxlpool_shared_pool_t* prefill = open_in("prefill");
  cxlpool_shared_pool_t* decode = open_in("decode");
  std::vector<void*> a, b, d;
  CHECK(fill_up(prefill, &a) == CXLPOOL_E_CAPACITY);
  CHECK(std::string(cxlpool_last_error_message()).find("quota \"prefill\" is full") != std::string::npos);
  CHECK(a.size() == 8);
  CHECK(fill_up(decode, &b) == CXLPOOL_E_CAPACITY);
  CHECK(b.size() == 4);
  CHECK(fill_up(creator, &d) == CXLPOOL_E_CAPACITY);
  CHECK(d.size() == ci.extents_total - 12);
  CHECK(info_of(prefill).quota_extents_used == 8);
  for (void* x : a) REQUIRE(cxlpool_shared_free(prefill, x) == CXLPOOL_OK);
  CHECK(info_of(prefill).quota_extents_used == 0);
  CHECK(info_of(decode).quota_extents_used == 4);  // untouched by the others
  for (void* x : b) REQUIRE(cxlpool_shared_free(decode, x) == CXLPOOL_OK);
  for (void* x : d) REQUIRE(cxlpool_shared_free(creator, x) == CXLPOOL_OK);
  b.clear();
  d.clear();
  cxlpool_shared_pool_close(decode);
  cxlpool_shared_pool_close(prefill);
  cxlpool_shared_pool_close(creator);  // no participant here while the children fork (see above)

  // Three processes racing in one quota: together they never exceed it. Each holds what it got
  // until all three have filled up (a child that left early would give its extents back).
  int counts[2], release[2];
  REQUIRE(pipe(counts) == 0);
  REQUIRE(pipe(release) == 0);
  std::vector<pid_t> kids;
  for (int k = 0; k < 3; ++k) {
    pid_t pid = fork();
    if (pid == 0) {
      close(counts[0]);
      close(release[1]);
      Params qp;
      cxlpool_shared_params_set_quota(qp.p, "prefill");
      cxlpool_shared_pool_t* p = nullptr;
      if (cxlpool_shared_pool_open(device.c_str(), qp.p, &p) != CXLPOOL_OK) _exit(100);
      int got = 0;
      void* x = nullptr;
      while (cxlpool_shared_alloc(p, 1u << 20, &x) == CXLPOOL_OK) ++got;
      if (write(counts[1], &got, sizeof got) != sizeof got) _exit(101);
      char byte = 0;
      if (read(release[0], &byte, 1) != 0) _exit(102);  // EOF: every child has reported
      _exit(0);
    }
    kids.push_back(pid);
  }
  close(counts[1]);
  close(release[0]);
  int total = 0;
  for (int k = 0; k < 3; ++k) {
    int got = 0;
    REQUIRE(read(counts[0], &got, sizeof got) == sizeof got);
    total += got;
  }
  close(release[1]);
  close(counts[0]);
  for (pid_t pid : kids) CHECK(wait_exit(pid) == 0);
  CHECK(total == 8);

  creator = open_in("default");
  CHECK(info_of(creator).quota_extents_used == 0);
  Params unknown;
  REQUIRE(cxlpool_shared_params_set_quota(unknown.p, "nope") == CXLPOOL_OK);
  cxlpool_shared_pool_t* p = nullptr;
  CHECK(cxlpool_shared_pool_open(device.c_str(), unknown.p, &p) == CXLPOOL_E_CONFIG);
  CHECK(std::string(cxlpool_last_error_message()).find("\"nope\"") != std::string::npos);
  Params too_big(8u << 20);
  REQUIRE(cxlpool_shared_params_add_quota(too_big.p, "huge", 64u << 20) == CXLPOOL_OK);
  CHECK(cxlpool_shared_pool_create(("shm:" + unique_name("big")).c_str(), too_big.p, 0, &p) == CXLPOOL_E_CONFIG);

  cxlpool_shared_pool_close(creator);
  unlink(("/dev/shm/" + name).c_str());
}

TEST_CASE("failure domains: a failed device is reported, allocations fail over, nothing else breaks", "[shared]") {
  auto make = [](const char* tag, const char* domain, std::string* name) {
    *name = unique_name(tag);
    Params params(16u << 20);
    REQUIRE(cxlpool_shared_params_set_failure_domain(params.p, domain) == CXLPOOL_OK);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_create(("shm:" + *name).c_str(), params.p, 0, &p) == CXLPOOL_OK);
    return p;
  };
  std::string na, nb, nc;
  cxlpool_shared_pool_t* a = make("fda", "rack1.sw0", &na);
  cxlpool_shared_pool_t* b = make("fdb", "rack1.sw0", &nb);
  cxlpool_shared_pool_t* c = make("fdc", "rack2.sw0", &nc);
  Params bad;
  CHECK(cxlpool_shared_params_set_failure_domain(bad.p, "") == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_set_failure_domain(bad.p, "a/b") == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_pool_t* pools[] = {a, b, c};
  cxlpool_shared_set_t* set = nullptr;
  REQUIRE(cxlpool_shared_set_create(pools, 3, &set) == CXLPOOL_OK);
  cxlpool_shared_pool_t* twice[] = {a, a};
  cxlpool_shared_set_t* bad_set = nullptr;
  CHECK(cxlpool_shared_set_create(twice, 2, &bad_set) == CXLPOOL_E_INVALID_ARGUMENT);

  void* x = nullptr;
  cxlpool_shared_pool_t* from = nullptr;
  REQUIRE(cxlpool_shared_set_alloc(set, 5000, &x, &from) == CXLPOOL_OK);
  CHECK(from == a);
  fill(x, 5000, 4);
  cxlpool_shared_health_t h{};
  REQUIRE(cxlpool_shared_pool_health(a, &h) == CXLPOOL_OK);
  CHECK(h.state == CXLPOOL_SHARED_HEALTHY);
  CHECK(std::string(h.failure_domain) == "rack1.sw0");

  REQUIRE(cxlpool_shared_pool_inject_failure(a, "test") == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_health(a, &h) == CXLPOOL_OK);
  CHECK(h.state == CXLPOOL_SHARED_FAILED);
  CHECK(std::string(h.reason).find("injected: test") != std::string::npos);
  CHECK(h.bytes_lost >= 5000);
  CHECK(h.extents_lost == 1);
  void* y = nullptr;
  CHECK(cxlpool_shared_alloc(a, 100, &y) == CXLPOOL_E_DEVICE_FAILED);
  CHECK(std::string(cxlpool_last_error_message()).find("bytes of owned blocks on it are lost") != std::string::npos);
  CHECK(cxlpool_shared_free(a, x) == CXLPOOL_E_DEVICE_FAILED);
  // Failover skips the failed pool and its whole domain.
  REQUIRE(cxlpool_shared_set_alloc(set, 5000, &y, &from) == CXLPOOL_OK);
  CHECK(from == c);
  REQUIRE(cxlpool_shared_free(c, y) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_alloc(b, 100, &y) == CXLPOOL_OK);  // b itself is fine when asked directly
  REQUIRE(cxlpool_shared_free(b, y) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_inject_failure(c, nullptr) == CXLPOOL_OK);
  CHECK(cxlpool_shared_set_alloc(set, 5000, &y, &from) == CXLPOOL_E_DEVICE_FAILED);
  cxlpool_shared_set_destroy(set);

  // A device that vanishes (its name removed) or shrinks is seen by the watch.
  REQUIRE(unlink(("/dev/shm/" + nb).c_str()) == 0);
  CHECK(eventually([&] {
    cxlpool_shared_health_t hb{};
    return cxlpool_shared_pool_health(b, &hb) == CXLPOOL_OK && hb.state == CXLPOOL_SHARED_FAILED &&
           std::string(hb.reason).find("vanished") != std::string::npos;
  }));
  CHECK(cxlpool_shared_alloc(b, 100, &y) == CXLPOOL_E_DEVICE_FAILED);
  std::string nd;
  cxlpool_shared_pool_t* d = make("fdd", "rack3", &nd);
  cxlpool::detail::shared::Superblock sb{};
  {
    int fd = open(("/dev/shm/" + nd).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(pread(fd, &sb, sizeof sb, 0) == static_cast<ssize_t>(sizeof sb));
    REQUIRE(ftruncate(fd, static_cast<off_t>(sb.data_offset)) == 0);  // metadata stays, data is cut off
    close(fd);
  }
  CHECK(eventually([&] {
    cxlpool_shared_health_t hd{};
    return cxlpool_shared_pool_health(d, &hd) == CXLPOOL_OK && hd.state == CXLPOOL_SHARED_FAILED &&
           std::string(hd.reason).find("truncated") != std::string::npos;
  }));
  for (cxlpool_shared_pool_t* p : {a, b, c, d}) CHECK(cxlpool_shared_pool_close(p) == CXLPOOL_OK);
  for (const std::string& n : {na, nc, nd}) unlink(("/dev/shm/" + n).c_str());
}

// ---- Repair of damaged words ---------------------------------------------------------------
// A pool left by two killed participants (one allocated blocks of several sizes, large ones
// too, and exported some; the other imported a few), then one word of one kind damaged: one
// flipped bit, or a garbage word. check --repair must give back a pool that checks clean, whose
// whole capacity can be allocated again, whose blocks' bytes repair did not touch, and whose
// old handles name no block formatted after it; what it could not restore it counts.
namespace {

namespace L = cxlpool::detail::shared;

struct Made {
  uint64_t offset = 0, size = 0;
  uint8_t seed = 0;
  uint8_t exported = 0;
  cxlpool_shared_handle_t handle{};
};

struct Scene {
  std::string name, device;
  std::vector<Made> blocks;
  uint32_t owner_slot = 0, importer_slot = 0;
  int fd = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  L::Superblock sb{};
  ~Scene() {
    if (base) munmap(base, size);
    if (fd >= 0) close(fd);
    unlink(("/dev/shm/" + name).c_str());
  }
  uint64_t* word(uint64_t offset) const { return reinterpret_cast<uint64_t*>(base + offset); }
  uint64_t slot_word(uint32_t s, uint32_t line, uint32_t w) const {
    return sb.slots_offset + uint64_t{s} * L::kSlotBytes + line * L::kLine + w * 8;
  }
  uint64_t extent_of(uint64_t offset) const { return (offset - sb.data_offset) / sb.extent_size; }
  uint64_t entry(uint64_t e, uint32_t w) const { return sb.extents_offset + e * L::kExtentEntryBytes + w * 8; }
  // The state word of the small block at offset (the test's own copy of the geometry).
  uint64_t block_word(const Made& m) const {
    uint32_t cls = 0;
    while (sb.class_size[cls] < m.size) ++cls;
    const uint64_t e = extent_of(m.offset), start = sb.data_offset + e * sb.extent_size;
    uint64_t n = sb.extent_size / (sb.class_size[cls] + 8), meta = 0;
    for (; n > 0; --n) {
      meta = (n * 8 + L::kMinBlock - 1) / L::kMinBlock * L::kMinBlock;
      if (meta + n * sb.class_size[cls] <= sb.extent_size) break;
    }
    return start + 8 * ((m.offset - start - meta) / sb.class_size[cls]);
  }
  uint64_t digest(const Made& m) const {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < m.size; ++i) h = (h ^ base[m.offset + i]) * 1099511628211ull;
    return h;
  }
};

// The owner allocates and exports, the importer imports; both are killed. Nobody is alive after.
void make_scene(Scene* s, const char* tag) {
  s->name = unique_name(tag);
  s->device = "shm:" + s->name;
  {
    Params params(32u << 20);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_create(s->device.c_str(), params.p, 0, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(p) == CXLPOOL_OK);
  }
  int to_parent[2], to_importer[2], done[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_importer) == 0);
  REQUIRE(pipe(done) == 0);
  pid_t owner = fork();
  if (owner == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(s->device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    std::vector<Made> made;
    std::vector<void*> ptrs;
    const size_t sizes[] = {256, 3000, 60000, 2500000};
    const int counts[] = {40, 20, 4, 2};
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < counts[k]; ++i) {
        void* p = nullptr;
        if (cxlpool_shared_alloc(c, sizes[k], &p) != CXLPOOL_OK) _exit(3);
        Made m;
        m.size = sizes[k];
        m.seed = static_cast<uint8_t>(made.size() * 7 + 1);
        fill(p, m.size, m.seed);
        made.push_back(m);
        ptrs.push_back(p);
      }
    // Every other block exported (its handle kept); the offsets of the others from the first's.
    uint8_t* base = nullptr;
    for (size_t i = 0; i < made.size(); ++i) {
      if (i % 2 != 0 && base != nullptr) continue;
      if (cxlpool_shared_export(c, ptrs[i], &made[i].handle) != CXLPOOL_OK) _exit(4);
      made[i].exported = 1;
      if (!base) base = static_cast<uint8_t*>(ptrs[i]) - made[i].handle.offset;
    }
    for (size_t i = 0; i < made.size(); ++i)
      made[i].offset = static_cast<uint64_t>(static_cast<uint8_t*>(ptrs[i]) - base);
    cxlpool_shared_info_t info{};
    if (cxlpool_shared_pool_info(c, &info) != CXLPOOL_OK) _exit(5);
    const uint64_t n = made.size();
    if (write(to_parent[1], &info.slot, sizeof info.slot) != sizeof info.slot ||
        write(to_parent[1], &n, sizeof n) != sizeof n ||
        write(to_parent[1], made.data(), n * sizeof(Made)) != static_cast<ssize_t>(n * sizeof(Made)))
      _exit(6);
    pause();
    _exit(0);
  }
  uint64_t n = 0;
  REQUIRE(read(to_parent[0], &s->owner_slot, sizeof s->owner_slot) == sizeof s->owner_slot);
  REQUIRE(read(to_parent[0], &n, sizeof n) == sizeof n);
  s->blocks.resize(n);
  size_t got = 0;
  while (got < n * sizeof(Made)) {
    const ssize_t r = read(to_parent[0], reinterpret_cast<char*>(s->blocks.data()) + got, n * sizeof(Made) - got);
    REQUIRE(r > 0);
    got += static_cast<size_t>(r);
  }
  pid_t importer = fork();
  if (importer == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(s->device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    int imported = 0;
    for (const Made& m : s->blocks) {
      void* q = nullptr;
      if (m.exported && imported < 8 && cxlpool_shared_import(c, &m.handle, &q, nullptr) == CXLPOOL_OK) ++imported;
    }
    cxlpool_shared_info_t info{};
    if (imported != 8 || cxlpool_shared_pool_info(c, &info) != CXLPOOL_OK) _exit(3);
    if (write(done[1], &info.slot, sizeof info.slot) != sizeof info.slot) _exit(4);
    pause();
    _exit(0);
  }
  REQUIRE(read(done[0], &s->importer_slot, sizeof s->importer_slot) == sizeof s->importer_slot);
  kill(owner, SIGKILL);
  kill(importer, SIGKILL);
  CHECK(wait_exit(owner) == 128 + SIGKILL);
  CHECK(wait_exit(importer) == 128 + SIGKILL);
  for (int p : {to_parent[0], to_parent[1], to_importer[0], to_importer[1], done[0], done[1]}) close(p);
  s->fd = open(("/dev/shm/" + s->name).c_str(), O_RDWR);
  REQUIRE(s->fd >= 0);
  struct stat st {};
  REQUIRE(fstat(s->fd, &st) == 0);
  s->size = static_cast<size_t>(st.st_size);
  void* m = mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  REQUIRE(m != MAP_FAILED);
  s->base = static_cast<uint8_t*>(m);
  std::memcpy(&s->sb, s->base, sizeof s->sb);
}

}  // namespace

TEST_CASE("repair: every kind of damaged word, one flipped bit or garbage, leaves a whole and clean pool", "[shared]") {
  struct Kind {
    const char* name;
    bool checked;  // carries check bits: a flip is found and restored
    bool loses;    // garbage there loses blocks in use (counted); otherwise garbage is rebuilt or harmless
    uint64_t (*where)(const Scene&);
  };
  const Kind kinds[] = {
      {"superblock field (pool id)", true, false, [](const Scene&) { return uint64_t{24}; }},
      {"superblock field (extent count)", true, false,
       [](const Scene&) { return uint64_t{offsetof(L::Superblock, extent_count)}; }},
      {"slot identity", true, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 0, 0); }},
      {"slot heartbeat (no check bits)", false, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 0, 1); }},
      {"slot pid (no check bits)", false, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 0, 2); }},
      {"slot eviction", true, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 1, 0); }},
      {"slot claim", true, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 2, 0); }},
      {"slot quota claim", true, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 2, 1); }},
      {"slot counters (no check bits)", false, false, [](const Scene& s) { return s.slot_word(s.owner_slot, 3, 5); }},
      {"importer's identity", true, false, [](const Scene& s) { return s.slot_word(s.importer_slot, 0, 0); }},
      {"importer's lease entry", true, false,
       [](const Scene& s) {
         const uint64_t table = s.sb.leases_offset + uint64_t{s.importer_slot} * s.sb.lease_entries * 16;
         for (uint64_t i = 0; i < s.sb.lease_entries; ++i)
           if (*s.word(table + i * 16) != 0) return table + i * 16 + 8;  // its generation and check
         return table;
       }},
      {"extent word, small extent", true, true,
       [](const Scene& s) { return s.entry(s.extent_of(s.blocks[0].offset), 0); }},
      {"extent word, large head", true, false,  // rebuilt from its tails
       [](const Scene& s) { return s.entry(s.extent_of(s.blocks.back().offset), 0); }},
      {"extent word, large tail", true, false,
       [](const Scene& s) { return s.entry(s.extent_of(s.blocks.back().offset) + 1, 0); }},
      {"extent word, free extent", true, false, [](const Scene& s) { return s.entry(s.sb.extent_count - 1, 0); }},
      {"large block state", true, true, [](const Scene& s) { return s.entry(s.extent_of(s.blocks.back().offset), 1); }},
      {"extent next generation (no check bits)", false, false,
       [](const Scene& s) { return s.entry(s.extent_of(s.blocks[0].offset), 2); }},
      {"small block state, allocated", true, true, [](const Scene& s) { return s.block_word(s.blocks[1]); }},
      {"small block state, exported", true, true, [](const Scene& s) { return s.block_word(s.blocks[2]); }},
  };
  std::mt19937_64 rng(19);
  for (const Kind& kind : kinds) {
    for (const bool garbage : {false, true}) {
      DYNAMIC_SECTION(kind.name << (garbage ? ", garbage word" : ", one flipped bit")) {
        Scene s;
        make_scene(&s, "repair");
        std::vector<uint64_t> digests;
        for (const Made& m : s.blocks) digests.push_back(s.digest(m));
        uint64_t* w = s.word(kind.where(s));
        const uint64_t before = *w;
        uint64_t damaged = before ^ (uint64_t{1} << (rng() % 64));
        auto at_most_one_bit = [](uint64_t x) { return (x & (x - 1)) == 0; };
        while (garbage && at_most_one_bit(damaged ^ before)) damaged = rng();  // more than one bit away
        *w = damaged;
        INFO("word at " << kind.where(s) << ": " << std::hex << before << " -> " << damaged << std::dec);

        cxlpool_status_t st;
        auto r = check(s.device, 1, &st);
        INFO("repair: corrupt " << r.corrupt_words << ", repaired " << r.words_repaired << ", reset " << r.words_reset
                                << ", reformatted " << r.extents_reformatted << ", lost " << r.blocks_lost
                                << ", blocked " << r.repair_blocked << ", recovered " << r.recovered);
        CHECK(st == CXLPOOL_OK);
        CHECK(r.corrupt_words == 0);
        CHECK(r.repair_blocked == 0);
        CHECK(r.extents_free == r.extents_total);
        if (kind.checked && !garbage && std::string(kind.name) != "importer's lease entry" &&
            std::string(kind.name).rfind("slot claim", 0) != 0 && std::string(kind.name).rfind("slot quota", 0) != 0) {
          CHECK(r.words_repaired >= 1);  // restored exactly
          CHECK(r.extents_reformatted == 0);
          CHECK(r.blocks_lost == 0);
        }
        if (kind.loses && garbage) CHECK(r.blocks_lost >= 1);  // counted, not silently dropped
        if (garbage && std::string(kind.name).rfind("extent word, large", 0) == 0) {
          CHECK(r.words_repaired >= 1);  // rebuilt from its neighbours
          CHECK(r.extents_reformatted == 0);
        }
        // What repair had no reason to touch it did not touch: every block's bytes.
        for (size_t i = 0; i < s.blocks.size(); ++i) {
          INFO("block " << i << " at " << s.blocks[i].offset << " (" << s.blocks[i].size << " B)");
          CHECK(s.digest(s.blocks[i]) == digests[i]);
        }
        auto again = check(s.device, 0, &st);
        CHECK(st == CXLPOOL_OK);
        CHECK(again.corrupt_words == 0);
        CHECK(again.words_repaired + again.words_reset == 0);
        // The whole capacity, as one block; then blocks of the same classes, exported, which
        // no handle from before the repair may name.
        cxlpool_shared_pool_t* p = nullptr;
        REQUIRE(cxlpool_shared_pool_open(s.device.c_str(), nullptr, &p) == CXLPOOL_OK);
        auto i = info_of(p);
        CHECK(i.extents_free == i.extents_total);
        void* all = nullptr;
        CHECK(cxlpool_shared_alloc(p, i.extents_total * i.extent_size, &all) == CXLPOOL_OK);
        if (all) REQUIRE(cxlpool_shared_free(p, all) == CXLPOOL_OK);
        std::vector<void*> fresh;
        for (size_t size : {size_t{256}, size_t{3000}, size_t{60000}, size_t{2500000}})
          for (int k = 0; k < 60; ++k) {
            void* q = nullptr;
            if (cxlpool_shared_alloc(p, size, &q) != CXLPOOL_OK) break;
            cxlpool_shared_handle_t h{};
            REQUIRE(cxlpool_shared_export(p, q, &h) == CXLPOOL_OK);
            fresh.push_back(q);
          }
        cxlpool_shared_pool_t* other = nullptr;
        REQUIRE(cxlpool_shared_pool_open(s.device.c_str(), nullptr, &other) == CXLPOOL_OK);
        int accepted = 0;
        for (const Made& m : s.blocks) {
          void* q = nullptr;
          if (m.exported && cxlpool_shared_import(other, &m.handle, &q, nullptr) == CXLPOOL_OK) ++accepted;
        }
        CHECK(accepted == 0);
        REQUIRE(cxlpool_shared_pool_close(other) == CXLPOOL_OK);
        for (void* q : fresh) REQUIRE(cxlpool_shared_free(p, q) == CXLPOOL_OK);
        REQUIRE(cxlpool_shared_pool_close(p) == CXLPOOL_OK);
      }
    }
  }
}

TEST_CASE("repair leaves damaged words alone while another participant is alive", "[shared]") {
  Scene s;
  make_scene(&s, "repair-live");
  cxlpool_shared_pool_t* live = nullptr;
  REQUIRE(cxlpool_shared_pool_open(s.device.c_str(), nullptr, &live) == CXLPOOL_OK);
  // The live participant recovers the dead owner and importer in the background: the damage
  // comes after that (on a slow machine that recovery came later and rewrote the word).
  CHECK(eventually([&] { return info_of(live).participants == 1; }, 30000));
  void* mine = nullptr;
  REQUIRE(cxlpool_shared_alloc(live, 5000, &mine) == CXLPOOL_OK);
  fill(mine, 5000, 77);
  *s.word(s.entry(s.extent_of(s.blocks[0].offset), 0)) ^= uint64_t{1} << 33;  // the dead owner's extent
  cxlpool_status_t st;
  auto r = check(s.device, 1, &st);
  CHECK(st == CXLPOOL_E_CORRUPT);
  CHECK(r.repair_blocked == 1);
  CHECK(r.corrupt_words == 1);
  CHECK(r.words_repaired + r.words_reset == 0);
  CHECK(holds(mine, 5000, 77));
  CHECK(cxlpool_shared_free(live, mine) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(live) == CXLPOOL_OK);
  r = check(s.device, 1, &st);
  CHECK(st == CXLPOOL_OK);
  // Repaired now, or written whole already by the closing participant giving the recovered
  // extent back: either way the pool is whole and clean.
  CHECK(r.words_repaired <= 1);
  CHECK(r.extents_free == r.extents_total);
  r = check(s.device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.corrupt_words == 0);
}

// A participant evicted while alive whose slot was taken by a newcomer, which then died too:
// the slot's eviction word names the newcomer, not it. It must still learn that it was evicted
// (CXLPOOL_E_EVICTED on every call), never free or write what recovery took from it, and never
// take the slot back from its new holder.
TEST_CASE("evicted, slot taken and the taker killed: the old participant gets CXLPOOL_E_EVICTED", "[shared]") {
  const std::string name = unique_name("retaken"), device = "shm:" + name;
  Params params(64u << 20, 5, 100, 200);  // a stopped participant is dead after 200 ms
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);  // children fork while we are no participant
  int v_ready[2], v_go[2], v_result[2], j_go[2], j_ready[2];
  REQUIRE((pipe(v_ready) | pipe(v_go) | pipe(v_result) | pipe(j_go) | pipe(j_ready)) == 0);
  pid_t v = fork();
  if (v == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    void* p = nullptr;
    if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK) _exit(3);
    char byte = 1;
    if (write(v_ready[1], &byte, 1) != 1) _exit(4);
    if (read(v_go[0], &byte, 1) != 1) _exit(5);  // after SIGSTOP ... SIGCONT
    int st[2] = {cxlpool_shared_free(c, p), cxlpool_shared_alloc(c, 256, &p)};
    if (write(v_result[1], st, sizeof st) != sizeof st) _exit(6);
    cxlpool_shared_pool_close(c);
    _exit(0);
  }
  pid_t j = fork();
  if (j == 0) {
    char byte = 0;
    if (read(j_go[0], &byte, 1) != 1) _exit(5);
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    cxlpool_shared_info_t i{};
    if (cxlpool_shared_pool_info(c, &i) != CXLPOOL_OK) _exit(3);
    const uint32_t slot = i.slot;
    if (write(j_ready[1], &slot, sizeof slot) != sizeof slot) _exit(4);
    pause();
    _exit(0);
  }
  char byte = 0;
  REQUIRE(read(v_ready[0], &byte, 1) == 1);  // V holds slot 0
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  REQUIRE(info_of(a).slot == 1);
  kill(v, SIGSTOP);
  CHECK(eventually([&] { return info_of(a).recovered_slots == 1; }, 20000));
  REQUIRE(write(j_go[1], &byte, 1) == 1);
  uint32_t j_slot = 99;
  REQUIRE(read(j_ready[0], &j_slot, sizeof j_slot) == sizeof j_slot);
  CHECK(j_slot == 0);  // V's slot, recovered
  kill(j, SIGKILL);
  CHECK(wait_exit(j) == 128 + SIGKILL);
  CHECK(eventually([&] { return info_of(a).recovered_slots == 2; }, 20000));
  kill(v, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its watch runs first: no slot taken back
  REQUIRE(write(v_go[1], &byte, 1) == 1);
  int st[2] = {0, 0};
  REQUIRE(read(v_result[0], st, sizeof st) == sizeof st);
  CHECK(st[0] == CXLPOOL_E_EVICTED);
  CHECK(st[1] == CXLPOOL_E_EVICTED);
  CHECK(wait_exit(v) == 0);
  cxlpool_status_t cs = CXLPOOL_OK;
  auto r = check(device, 0, &cs);
  CHECK(cs == CXLPOOL_OK);
  CHECK(r.corrupt_words == 0);
  CHECK(r.live_participants == 1);  // only us: V did not take the slot back
  for (int fd :
       {v_ready[0], v_ready[1], v_go[0], v_go[1], v_result[0], v_result[1], j_go[0], j_go[1], j_ready[0], j_ready[1]})
    close(fd);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// A joiner stopped between claiming its slot and writing its facts (held by a tracer at the
// system call that reads its own start time, in between): nothing of its process can be looked
// at yet, it is silent for 15 leases, and it is not evicted.
TEST_CASE("a joiner held between claiming its slot and writing its facts is not evicted", "[shared]") {
  const std::string name = unique_name("joiner"), device = "shm:" + name;
  Params params(32u << 20, 5, 100);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int go[2], joined[2];
  REQUIRE(pipe(go) == 0);
  REQUIRE(pipe(joined) == 0);
  pid_t child = fork();
  if (child == 0) {
    close(go[1]);
    close(joined[0]);
    char byte = 0;
    if (read(go[0], &byte, 1) != 1) _exit(2);
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(3);
    if (write(joined[1], "j", 1) != 1 || read(go[0], &byte, 1) != 1) _exit(4);
    void* p = nullptr;
    if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK || cxlpool_shared_free(c, p) != CXLPOOL_OK) _exit(5);
    _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 6);
  }
  close(go[0]);
  close(joined[1]);
  Reaper reaper{child};
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  if (ptrace(PTRACE_SEIZE, child, nullptr, reinterpret_cast<void*>(PTRACE_O_TRACESYSGOOD)) != 0) {
    cxlpool_shared_pool_close(a);
    cxlpool_shared_pool_unlink(device.c_str());
    CXLPOOL_SKIP("cannot trace a child here (ptrace: " + std::string(std::strerror(errno)) + ")");
  }
  int status = 0;
  REQUIRE(ptrace(PTRACE_INTERRUPT, child, nullptr, nullptr) == 0);  // a ptrace-stop to start from
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(write(go[1], "g", 1) == 1);
  run_to_start_time_read(child);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // 15 leases
  CHECK(info_of(a).recovered_slots == 0);
  CHECK(stats_of(a).find("\"process\": \"joining\"") != std::string::npos);
  REQUIRE(ptrace(PTRACE_DETACH, child, nullptr, nullptr) == 0);
  char byte = 0;
  REQUIRE(read(joined[0], &byte, 1) == 1);
  REQUIRE(write(go[1], "q", 1) == 1);
  CHECK(wait_exit(child) == 0);  // its join completed and its calls work: never evicted
  reaper.pid = 0;
  CHECK(info_of(a).recovered_slots == 0);
  for (int fd : {go[1], joined[0]}) close(fd);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// A participant killed after it imported a block leaves that lease in its slot's table; it is
// recovered, and a joiner takes the slot. Between its compare-and-swap of the slot and the end
// of its join the joiner writes only memory (the predecessor's leases are cleared, then the
// facts written), so a kill there leaves the old leases under a live-looking slot. They must
// hold nothing: a block its owner frees then is free at once, not kept as leased (which left
// "1 blocks in use" after repair in the kill -9 soak). The joiner is held by ptrace at its first
// system call after the claim, and the predecessor's lease table is put back as it was.
TEST_CASE("a joiner's predecessor's leases hold no block while the joiner has not written its facts", "[shared]") {
  const std::string name = unique_name("stale-lease"), device = "shm:" + name;
  Params params(32u << 20, 5, 100);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  // Every participant is a child forked while this process has no thread (a sanitizer runtime's
  // allocator lock held by another thread at a fork stays held in the child): the owner of a
  // large block (never kept in a block cache), an importer of it, and the joiner, which waits.
  int to_importer[2], from_importer[2], to_owner[2], from_owner[2], go[2];
  for (int* p : {to_importer, from_importer, to_owner, from_owner, go}) REQUIRE(pipe(p) == 0);
  const pid_t owner = fork();
  if (owner == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    void* x = nullptr;
    cxlpool_shared_handle_t h{};
    char byte = 0;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    if (cxlpool_shared_alloc(c, 2500000, &x) != CXLPOOL_OK || cxlpool_shared_export(c, x, &h) != CXLPOOL_OK) _exit(3);
    if (write(to_importer[1], &h, sizeof h) != sizeof h || read(to_owner[0], &byte, 1) != 1) _exit(4);
    if (cxlpool_shared_free(c, x) != CXLPOOL_OK) _exit(5);
    const uint64_t in_use = info_of(c).bytes_in_use;  // freed, not kept for a lease nobody holds
    if (write(from_owner[1], &in_use, sizeof in_use) != sizeof in_use || read(to_owner[0], &byte, 1) != 1) _exit(6);
    _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 7);
  }
  Reaper owner_reaper{owner};
  const pid_t importer = fork();
  if (importer == 0) {
    cxlpool_shared_pool_t* c = nullptr;
    cxlpool_shared_handle_t h{};
    void* q = nullptr;
    if (read(to_importer[0], &h, sizeof h) != sizeof h) _exit(2);
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(3);
    if (cxlpool_shared_import(c, &h, &q, nullptr) != CXLPOOL_OK) _exit(4);
    const uint32_t slot = info_of(c).slot;
    if (write(from_importer[1], &slot, sizeof slot) != sizeof slot) _exit(5);
    pause();
    _exit(0);
  }
  Reaper importer_reaper{importer};
  const pid_t joiner = fork();
  if (joiner == 0) {
    uint32_t slot = 0;
    char byte = 0;
    if (read(go[0], &slot, sizeof slot) != sizeof slot) _exit(2);
    cxlpool_shared_pool_t* c = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(3);
    if (info_of(c).slot != slot) _exit(4);  // the recovered slot, the first free one of this host
    if (read(go[0], &byte, 1) != 1) _exit(5);
    _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 6);
  }
  Reaper joiner_reaper{joiner};
  uint32_t slot = 0;
  REQUIRE(read(from_importer[0], &slot, sizeof slot) == sizeof slot);
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);  // to watch; forks are done
  kill(importer, SIGKILL);
  CHECK(wait_exit(importer) == 128 + SIGKILL);
  importer_reaper.pid = 0;
  REQUIRE(eventually([&] { return info_of(a).participants == 2; }));  // recovered (by the owner or by us)

  // The importer's lease table as it was left (the raw file; the offsets from its superblock).
  const int fd = open(("/dev/shm/" + name).c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  L::Superblock sb{};
  REQUIRE(pread(fd, &sb, sizeof sb, 0) == static_cast<ssize_t>(sizeof sb));
  const uint64_t table_at = sb.leases_offset + uint64_t{slot} * sb.lease_entries * 16;
  std::vector<char> table(size_t{sb.lease_entries} * 16);
  REQUIRE(pread(fd, table.data(), table.size(), static_cast<off_t>(table_at)) == static_cast<ssize_t>(table.size()));
  CHECK(std::count(table.begin(), table.end(), 0) != static_cast<std::ptrdiff_t>(table.size()));  // the lease is there

  if (ptrace(PTRACE_SEIZE, joiner, nullptr, reinterpret_cast<void*>(PTRACE_O_TRACESYSGOOD)) != 0) {
    close(fd);
    cxlpool_shared_pool_close(a);
    cxlpool_shared_pool_unlink(device.c_str());
    CXLPOOL_SKIP("cannot trace a child here (ptrace: " + std::string(std::strerror(errno)) + ")");
  }
  int status = 0;
  REQUIRE(ptrace(PTRACE_INTERRUPT, joiner, nullptr, nullptr) == 0);
  REQUIRE(waitpid(joiner, &status, 0) == joiner);
  REQUIRE(write(go[1], &slot, sizeof slot) == sizeof slot);
  run_to_start_time_read(joiner);
  // As if it had been stopped right after its compare-and-swap: the old leases back.
  REQUIRE(pwrite(fd, table.data(), table.size(), static_cast<off_t>(table_at)) == static_cast<ssize_t>(table.size()));
  uint64_t in_use = ~uint64_t{0};
  REQUIRE(write(to_owner[1], "f", 1) == 1);
  REQUIRE(read(from_owner[0], &in_use, sizeof in_use) == sizeof in_use);
  CHECK(in_use == 0);
  const std::vector<char> cleared(table.size(), 0);  // what the joiner had written there
  REQUIRE(pwrite(fd, cleared.data(), cleared.size(), static_cast<off_t>(table_at)) ==
          static_cast<ssize_t>(cleared.size()));
  REQUIRE(ptrace(PTRACE_DETACH, joiner, nullptr, nullptr) == 0);
  REQUIRE(write(go[1], "q", 1) == 1);
  CHECK(wait_exit(joiner) == 0);
  joiner_reaper.pid = 0;
  REQUIRE(write(to_owner[1], "q", 1) == 1);
  CHECK(wait_exit(owner) == 0);
  owner_reaper.pid = 0;
  for (int* p : {to_importer, from_importer, to_owner, from_owner, go}) close(p[0]), close(p[1]);
  close(fd);
  cxlpool_status_t st;
  auto r = check(device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.blocks_in_use == 0);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// An owner gives a large block's extents back tails first and the head last. Killed in between,
// it leaves a head whose span reaches extents that are free by then, and a live participant may
// take one. Recovery must not take that extent with the block (it then freed it under its new
// owner, whose free failed with "pointer is not a block start"): it finishes the release of
// what still points back to the head. The interrupted release is made by putting the head's and
// the first tail's words back (as the owner left them) after it freed the block, with every
// other extent taken, so that the survivor's next extent is the block's last one.
TEST_CASE("recovery of an owner killed while giving back a large block leaves alone what others took since",
          "[shared]") {
  const std::string name = unique_name("half-released"), device = "shm:" + name;
  Params params(16u << 20, 5, 100);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  const uint64_t extent = info_of(a).extent_size;
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);  // no thread of ours while we fork
  int to_parent[2], to_owner[2];
  REQUIRE(pipe(to_parent) == 0);
  REQUIRE(pipe(to_owner) == 0);
  pid_t owner = fork();
  if (owner == 0) {
    close(to_parent[0]);
    close(to_owner[1]);
    cxlpool_shared_pool_t* c = nullptr;
    void* p = nullptr;
    cxlpool_shared_handle_t h{};
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
    if (cxlpool_shared_alloc(c, 2 * extent + extent / 2, &p) != CXLPOOL_OK) _exit(3);  // 3 extents
    if (cxlpool_shared_export(c, p, &h) != CXLPOOL_OK) _exit(4);
    char byte = 0;
    if (write(to_parent[1], &h.offset, sizeof h.offset) != sizeof h.offset || read(to_owner[0], &byte, 1) != 1)
      _exit(5);
    if (cxlpool_shared_free(c, p) != CXLPOOL_OK) _exit(6);
    if (write(to_parent[1], "f", 1) != 1) _exit(7);
    pause();
    _exit(0);
  }
  close(to_parent[1]);
  close(to_owner[0]);
  Reaper reaper{owner};
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  uint64_t offset = 0;
  REQUIRE(read(to_parent[0], &offset, sizeof offset) == sizeof offset);
  // Every other extent is the survivor's: one block of one extent each, until the pool is full.
  std::vector<void*> mine;
  for (void* p = nullptr; cxlpool_shared_alloc(a, extent / 2 + 1, &p) == CXLPOOL_OK;) mine.push_back(p);
  REQUIRE(!mine.empty());
  CHECK(info_of(a).extents_free == 0);
  const int fd = open(("/dev/shm/" + name).c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  L::Superblock sb{};
  REQUIRE(pread(fd, &sb, sizeof sb, 0) == static_cast<ssize_t>(sizeof sb));
  const uint64_t e = (offset - sb.data_offset) / sb.extent_size;
  auto word_at = [&](uint64_t x) { return static_cast<off_t>(sb.extents_offset + x * L::kExtentEntryBytes); };
  uint64_t head = 0, tail1 = 0;
  REQUIRE(pread(fd, &head, 8, word_at(e)) == 8);
  REQUIRE(pread(fd, &tail1, 8, word_at(e + 1)) == 8);
  REQUIRE(head != 0);
  REQUIRE(tail1 != 0);
  char byte = 0;
  REQUIRE(write(to_owner[1], "f", 1) == 1);
  REQUIRE(read(to_parent[0], &byte, 1) == 1);  // freed: its three extents are free now
  REQUIRE(pwrite(fd, &head, 8, word_at(e)) == 8);
  REQUIRE(pwrite(fd, &tail1, 8, word_at(e + 1)) == 8);
  void* last = nullptr;
  REQUIRE(cxlpool_shared_alloc(a, extent / 2 + 1, &last) == CXLPOOL_OK);  // the only free extent: e + 2
  void* base = nullptr;
  uint64_t range = 0;
  REQUIRE(cxlpool_shared_pool_data_range(a, &base, &range) == CXLPOOL_OK);
  CHECK(static_cast<uint8_t*>(last) == static_cast<uint8_t*>(base) + (offset - sb.data_offset) + 2 * extent);
  fill(last, extent / 2 + 1, 9);
  kill(owner, SIGKILL);
  CHECK(wait_exit(owner) == 128 + SIGKILL);
  reaper.pid = 0;
  REQUIRE(eventually([&] { return info_of(a).recovered_slots == 1; }));
  CHECK(holds(last, extent / 2 + 1, 9));
  CHECK(cxlpool_shared_free(a, last) == CXLPOOL_OK);
  for (void* p : mine) CHECK(cxlpool_shared_free(a, p) == CXLPOOL_OK);
  cxlpool_status_t st;
  auto r = check(device, 0, &st);
  CHECK(st == CXLPOOL_OK);
  CHECK(r.corrupt_words == 0);
  CHECK(r.blocks_in_use == 0);
  CHECK(r.extents_free == info_of(a).extents_total);
  for (int x : {to_parent[0], to_owner[1], fd}) close(x);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// The lease stretches for a participant only its heartbeat vouches for once its beats were seen
// apart: stopped three times for 300 ms (a 500 ms lease), a stop of 650 ms is survived; a stop
// that does not end is still death, within the bound.
TEST_CASE("the lease of a participant seen stalling stretches, within a bound", "[shared]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root for a pid namespace (unshare CLONE_NEWPID)");
  const std::string name = unique_name("stretch"), device = "shm:" + name;
  Params params(32u << 20, 10, 500);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  pid_t inner = 0;
  const pid_t child = fork_in_new_pid_namespace(
      [&] {
        cxlpool_shared_pool_t* c = nullptr;
        if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(2);
        void* p = nullptr;
        if (cxlpool_shared_alloc(c, 256, &p) != CXLPOOL_OK) _exit(3);
        if (write(ready[1], "r", 1) != 1) _exit(4);
        char byte = 0;
        if (read(go[0], &byte, 1) != 1) _exit(5);
        _exit(cxlpool_shared_free(c, p) == CXLPOOL_E_EVICTED ? 0 : 10);
      },
      &inner);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  NsObserver observer(device);  // sees the participant's heartbeat only
  REQUIRE(observer.ok());
  auto stop_for = [&](int ms) {
    kill(inner, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    kill(inner, SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // beats again, seen
  };
  for (int k = 0; k < 3; ++k) stop_for(300);  // each under the 500 ms lease
  const uint64_t before = observer.recovered_slots();
  if (before == 0) {
    stop_for(550);  // past the lease; 3 x 300 ms allowed now (the rest: slack for a busy machine)
    CHECK(observer.recovered_slots() == 0);
    kill(inner, SIGSTOP);  // stopped for good: dead after at most 4 leases (2 s) of silence
    CHECK(eventually([&] { return observer.recovered_slots() == 1; }, 30000));
    kill(inner, SIGCONT);
    REQUIRE(write(go[1], "g", 1) == 1);
    CHECK(wait_exit(child) == 0);  // its call after resuming: CXLPOOL_E_EVICTED
  } else {
    WARN("a 300 ms stop was taken for death (the machine stalled past the 500 ms lease): nothing to test");
    kill(inner, SIGKILL);
    wait_exit(child);
  }
  cxlpool_shared_pool_unlink(device.c_str());
}

namespace {
// The numbers of the calling process in the pid namespaces /proc shows (its NSpid line): the
// first is the one of /proc's own namespace.
std::vector<pid_t> ns_pids_of_self() {
  std::vector<pid_t> ids;
  FILE* f = fopen("/proc/self/status", "re");
  if (!f) return ids;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "NSpid:", 6) == 0)
      for (char *p = line + 6, *end = nullptr;; p = end) {
        const long v = strtol(p, &end, 10);
        if (end == p) break;
        ids.push_back(pid_t(v));
      }
  fclose(f);
  return ids;
}
}  // namespace

// A participant in a container on this host (a pid namespace below ours) is judged by its
// process, as one of our own namespace: stopped for ten times the lease, it keeps its slot and
// its next calls succeed. Killed, it is recovered from what /proc says, with a lease far longer
// than the test: first a worker while the namespace lives on, then the namespace's last process.
TEST_CASE("a participant in another pid namespace of this host is judged by its process", "[shared]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root for a pid namespace (unshare CLONE_NEWPID)");
  const std::string quick = "shm:" + unique_name("nsquick"), slow = "shm:" + unique_name("nsslow");
  for (const auto& [device, lease] : {std::pair{quick, 300u}, std::pair{slow, 600000u}}) {
    Params params(32u << 20, 10, lease);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(p) == CXLPOOL_OK);  // the child forks while we are no participant
  }
  int ready[2], go[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(go) == 0);
  pid_t init = 0;
  const pid_t child = fork_in_new_pid_namespace(
      [&] {  // pid 1 of the namespace: a participant that outlives the worker
        cxlpool_shared_pool_t* s = nullptr;
        void* held = nullptr;
        if (cxlpool_shared_pool_open(slow.c_str(), nullptr, &s) != CXLPOOL_OK ||
            cxlpool_shared_alloc(s, 4096, &held) != CXLPOOL_OK)
          _exit(2);
        const pid_t worker = fork();  // pid 2
        if (worker == 0) {
          cxlpool_shared_pool_t *q = nullptr, *w = nullptr;
          if (cxlpool_shared_pool_open(quick.c_str(), nullptr, &q) != CXLPOOL_OK ||
              cxlpool_shared_pool_open(slow.c_str(), nullptr, &w) != CXLPOOL_OK)
            _exit(2);
          void *a = nullptr, *b = nullptr;
          if (cxlpool_shared_alloc(q, 256, &a) != CXLPOOL_OK || cxlpool_shared_alloc(w, 256, &b) != CXLPOOL_OK)
            _exit(3);
          const std::vector<pid_t> ids = ns_pids_of_self();  // /proc is the parent's: [ours there, 2]
          if (ids.size() != 2 || write(ready[1], &ids[0], sizeof ids[0]) != sizeof ids[0]) _exit(4);
          char byte = 0;
          if (read(go[0], &byte, 1) != 1) _exit(5);
          void* c = nullptr;
          const bool ok = cxlpool_shared_free(q, a) == CXLPOOL_OK && cxlpool_shared_alloc(q, 256, &c) == CXLPOOL_OK &&
                          cxlpool_shared_free(q, c) == CXLPOOL_OK;
          if (write(ready[1], ok ? "d" : "x", 1) != 1) _exit(6);
          pause();  // killed here, holding b
          _exit(7);
        }
        wait_exit(worker);
        pause();  // killed here, holding its block: the namespace ends with it
        _exit(8);
      },
      &init);
  pid_t worker = 0;
  REQUIRE(read(ready[0], &worker, sizeof worker) == sizeof worker);
  cxlpool_shared_pool_t *q = nullptr, *s = nullptr;
  REQUIRE(cxlpool_shared_pool_open(quick.c_str(), nullptr, &q) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_open(slow.c_str(), nullptr, &s) == CXLPOOL_OK);
  kill(worker, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // 10 leases; the stretch allows at most 4
  const std::string json = stats_of(q);
  CHECK(json.find("\"process\": \"stopped\"") != std::string::npos);
  CHECK(info_of(q).recovered_slots == 0);
  kill(worker, SIGCONT);
  REQUIRE(write(go[1], "g", 1) == 1);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  CHECK(byte == 'd');  // its calls after the stop succeeded: never evicted
  CHECK(info_of(q).recovered_slots == 0);
  // Recovered by us or by its namespace's init, long before the 10-minute lease.
  auto settled = [&](uint32_t live) {
    const cxlpool_shared_check_report_t r = check(slow, 0);
    return r.live_participants == live && r.dead_participants == 0 && r.leaked_blocks == 0 &&
           r.undecided_participants == 0;
  };
  kill(worker, SIGKILL);
  CHECK(eventually([&] { return settled(2); }, 30000));
  kill(init, SIGKILL);  // the namespace ends: only this process is left to recover it
  CHECK(wait_exit(child) == 128 + SIGKILL);
  CHECK(eventually([&] { return settled(1); }, 30000));
  CHECK(info_of(s).recovered_slots >= 1);
  for (cxlpool_shared_pool_t* p : {q, s}) cxlpool_shared_pool_close(p);
  cxlpool_shared_pool_unlink(quick.c_str());
  cxlpool_shared_pool_unlink(slow.c_str());
}

// A pid namespace's number (its ns/pid inode) is given to the next namespace once it is
// freed: a namespace seen and ended must not make its successor's live, stopped participant
// look gone.
TEST_CASE("a pid namespace that ended is not confused with the next one given its number", "[shared]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root for a pid namespace (unshare CLONE_NEWPID)");
  const std::string device = "shm:" + unique_name("nsreuse");
  {
    Params params(32u << 20, 10, 300);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(p) == CXLPOOL_OK);
  }
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  auto participant = [&] {
    cxlpool_shared_pool_t* c = nullptr;
    void* b = nullptr;
    if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK ||
        cxlpool_shared_alloc(c, 256, &b) != CXLPOOL_OK)
      _exit(2);
    struct stat st {};
    const uint64_t ino = stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
    if (write(ready[1], &ino, sizeof ino) != sizeof ino) _exit(3);
    for (;;) pause();
  };
  pid_t first = 0;
  const pid_t child1 = fork_in_new_pid_namespace(participant, &first);
  uint64_t ino1 = 0, ino2 = 0;
  REQUIRE(read(ready[0], &ino1, sizeof ino1) == sizeof ino1);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  kill(first, SIGSTOP);  // silent: the watch looks for it in its namespace and finds it stopped
  CHECK(eventually([&] { return stats_of(a).find("\"process\": \"stopped\"") != std::string::npos; }, 30000));
  kill(first, SIGKILL);  // the namespace ends with it
  CHECK(wait_exit(child1) == 128 + SIGKILL);
  CHECK(eventually([&] { return info_of(a).recovered_slots == 1; }, 30000));
  pid_t second = 0;
  const pid_t child2 = fork_in_new_pid_namespace(participant, &second);
  REQUIRE(read(ready[0], &ino2, sizeof ino2) == sizeof ino2);
  if (ino1 == ino2) WARN("the new namespace was given the number of the one that ended: " << ino2);
  kill(second, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // 6 leases
  CHECK(info_of(a).recovered_slots == 1);                        // stopped, not gone
  CHECK(stats_of(a).find("\"process\": \"stopped\"") != std::string::npos);
  kill(second, SIGKILL);
  CHECK(wait_exit(child2) == 128 + SIGKILL);
  CHECK(eventually([&] { return info_of(a).recovered_slots == 2; }, 30000));
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_unlink(device.c_str());
}

// An observer inside a container saw a participant in a namespace below its own, then that
// namespace ended. The kernel hands a freed namespace number to the next namespace made anywhere
// on the host: here a sibling container, which the observer cannot see into. Its participant,
// briefly stopped, must be judged by its heartbeat, not found "gone" from the ended namespace.
TEST_CASE("an observer in a container does not take a sibling container for a nested one that ended", "[shared]") {
  if (geteuid() != 0) CXLPOOL_SKIP("needs root for pid namespaces and a private /proc");
  const std::string device = "shm:" + unique_name("nsreuse2");
  {
    Params params(32u << 20, 10, 10000);  // a 10 s lease: the stop below is a tenth of it
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(p) == CXLPOOL_OK);
  }
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  NsObserver observer(device);
  REQUIRE(observer.ok());
  const uint64_t nested_ino = observer.start_nested();
  REQUIRE(nested_ino != 0);
  // Stopped: the observer finds it through its own /proc, in the namespace below it.
  REQUIRE(observer.signal_nested('t'));
  CHECK(eventually([&] { return observer.stats().find("\"process\": \"stopped\"") != std::string::npos; }, 30000));
  REQUIRE(observer.signal_nested('k'));  // the nested namespace ends with it
  CHECK(eventually([&] { return observer.recovered_slots() == 1; }, 30000));

  pid_t sibling = 0;
  const pid_t child = fork_in_new_pid_namespace(
      [&] {
        cxlpool_shared_pool_t* c = nullptr;
        void* b = nullptr;
        struct stat st {};
        if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK ||
            cxlpool_shared_alloc(c, 256, &b) != CXLPOOL_OK || stat("/proc/self/ns/pid", &st) != 0)
          _exit(2);
        const uint64_t ino = st.st_ino;
        if (write(ready[1], &ino, sizeof ino) != sizeof ino) _exit(3);
        for (;;) pause();
      },
      &sibling);
  uint64_t sibling_ino = 0;
  REQUIRE(read(ready[0], &sibling_ino, sizeof sibling_ino) == sizeof sibling_ino);
  // While the observer holds the ended namespace, its number cannot be handed out again; without
  // that, the kernel reuses it here nearly every time.
  INFO("nested namespace " << nested_ino << ", sibling namespace " << sibling_ino);
  CHECK(sibling_ino != nested_ino);
  kill(sibling, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  CHECK(observer.recovered_slots() == 1);  // not the sibling's slot
  kill(sibling, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(observer.recovered_slots() == 1);
  kill(sibling, SIGKILL);
  CHECK(wait_exit(child) == 128 + SIGKILL);
  cxlpool_shared_pool_unlink(device.c_str());
}

// A participant that closes is alive until its slot is given up: observers of this host judge
// it by its heartbeat thread, which must outlive the frees of its leave. Leavers with thousands
// of blocks to free, under CPU hogs, watched with a 5 ms heartbeat: none is recovered.
TEST_CASE("a participant that closes is never recovered while it leaves", "[shared]") {
  const std::string name = unique_name("leaving"), device = "shm:" + name;
  Params params(64u << 20, 5, 100);
  cxlpool_shared_pool_t* a = nullptr;
  REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &a) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);  // the spawner forks while we are no participant
  int go[2];
  REQUIRE(pipe(go) == 0);
  constexpr int kRounds = 20;
  const pid_t spawner = fork();
  if (spawner == 0) {
    close(go[1]);
    char byte = 0;
    if (read(go[0], &byte, 1) != 1) _exit(2);
    for (int round = 0; round < kRounds; ++round) {
      const pid_t leaver = fork();
      if (leaver == 0) {
        cxlpool_shared_pool_t* c = nullptr;
        if (cxlpool_shared_pool_open(device.c_str(), nullptr, &c) != CXLPOOL_OK) _exit(3);
        for (int i = 0; i < 20000; ++i) {
          void* p = nullptr;
          if (cxlpool_shared_alloc(c, 64 + size_t(i % 8) * 64, &p) != CXLPOOL_OK) break;
        }
        _exit(cxlpool_shared_pool_close(c) == CXLPOOL_OK ? 0 : 4);
      }
      if (wait_exit(leaver) != 0) _exit(10 + round);
    }
    _exit(0);
  }
  close(go[0]);
  REQUIRE(cxlpool_shared_pool_open(device.c_str(), nullptr, &a) == CXLPOOL_OK);
  {
    cxlpool_test::CpuHogs hogs;
    REQUIRE(write(go[1], "g", 1) == 1);
    CHECK(wait_exit(spawner) == 0);
  }
  close(go[1]);
  CHECK(info_of(a).recovered_slots == 0);
  REQUIRE(cxlpool_shared_pool_close(a) == CXLPOOL_OK);
  const cxlpool_shared_check_report_t r = check(device, 0);
  CHECK(r.corrupt_words == 0);
  CHECK(r.leaked_blocks == 0);
  CHECK(r.extents_free == r.extents_total);
  cxlpool_shared_pool_unlink(device.c_str());
}

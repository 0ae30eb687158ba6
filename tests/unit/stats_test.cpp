// SPDX-License-Identifier: MIT
// The stats page through the shared library, read the way cxlpool-stat reads it (through
// /proc/self/fd, read-only, under the seqlock): it describes itself, follows the pools'
// figures and the device ledgers, cannot be written or resized by a reader; a fork child
// never writes the parent's page and 200 forks while the publisher runs never hang; a
// program that closes and reuses the page's descriptor loses nothing and receives nothing;
// bad settings name the variable and value; no page when descriptors run out says so.
#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "capi_topology.hpp"
#include "cxlpool/cxlpool.h"
#include "stats/layout.hpp"
#include "test_support.hpp"

namespace {

namespace S = cxlpool::detail::stats;
constexpr size_t kMiB = size_t(1) << 20;

struct Topo : cxlpool_test::CapiTopology {
  Topo()
      : CapiTopology("fast:backing=numa:0,size=256M,tier=0;slow:backing=memfd,size=256M,tier=1",
                     CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) {}
};

// The descriptor number of this process's stats page, or -1.
int page_fd_number() {
  DIR* d = opendir("/proc/self/fd");
  REQUIRE(d);
  int found = -1;
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n > 0 && std::strncmp(target, "/memfd:cxlpool-stats", 20) == 0) found = std::atoi(e->d_name);
  }
  closedir(d);
  return found;
}

// A read-only view of the page, opened as cxlpool-stat opens it.
struct PageView {
  const uint8_t* base = nullptr;
  size_t bytes = 0;
  PageView() {
    int number = page_fd_number();
    REQUIRE(number >= 0);
    int fd = open(("/proc/self/fd/" + std::to_string(number)).c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    bytes = size_t(lseek(fd, 0, SEEK_END));
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<const uint8_t*>(p);
  }
  ~PageView() { munmap(const_cast<uint8_t*>(base), bytes); }
  const S::Header& header() const { return *reinterpret_cast<const S::Header*>(base); }

  // One consistent copy: {"scope/name" or "device/NAME/name" or "tier/T/name": value}.
  std::map<std::string, uint64_t> values() const {
    std::vector<uint8_t> copy(bytes);
    for (int attempt = 0; attempt < 10000; ++attempt) {
      const uint64_t s1 = __atomic_load_n(&header().seq, __ATOMIC_ACQUIRE);
      if (s1 & 1) continue;
      for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t w = __atomic_load_n(reinterpret_cast<const uint64_t*>(base + i), __ATOMIC_ACQUIRE);
        std::memcpy(copy.data() + i, &w, 8);
      }
      if (__atomic_load_n(&header().seq, __ATOMIC_RELAXED) != s1) continue;
      const auto* h = reinterpret_cast<const S::Header*>(copy.data());
      const auto* m = reinterpret_cast<const S::MetricSlot*>(copy.data() + h->metrics_offset);
      const auto* d = reinterpret_cast<const S::DeviceSlot*>(copy.data() + h->devices_offset);
      const auto* v = reinterpret_cast<const uint64_t*>(copy.data() + h->values_offset);
      std::map<std::string, uint64_t> out;
      out["publishes"] = h->publishes;
      out["n_devices"] = h->n_devices;
      uint32_t i = 0;
      for (; i < h->n_process_metrics; ++i) out[std::string("process/") + m[i].name] = *v++;
      for (uint32_t dev = 0; dev < h->max_devices; ++dev)
        for (uint32_t k = 0; k < h->n_device_metrics; ++k, ++v)
          if (dev < h->n_devices) out[std::string("device/") + d[dev].name + "/" + m[i + k].name] = *v;
      i += h->n_device_metrics;
      for (uint32_t t = 0; t < h->n_tiers; ++t)
        for (uint32_t k = 0; k < h->n_tier_metrics; ++k, ++v)
          out["tier/" + std::to_string(t) + "/" + m[i + k].name] = *v;
      return out;
    }
    FAIL("the page never read consistently");
    return {};
  }
  uint64_t publishes() const { return __atomic_load_n(&header().publishes, __ATOMIC_ACQUIRE); }
  // Waits for two more publications (so the next copy reflects what happened before the call).
  void wait_publishes(uint64_t n = 2) const {
    const uint64_t target = publishes() + n;
    for (int i = 0; i < 6000 && publishes() < target; ++i)  // 60 s: a hang guard
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(publishes() >= target);
  }
};

}  // namespace

TEST_CASE("the stats page describes itself and follows the pools and the ledgers", "[stats]") {
  setenv("CXLPOOL_STAT_INTERVAL_MS", "20", 1);
  Topo t;
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:slow");
  void* p = cxlpool_malloc(pool, 3 * kMiB);
  REQUIRE(p);
  std::memset(p, 1, 3 * kMiB);
  std::vector<void*> small;
  for (int i = 0; i < 100; ++i) small.push_back(cxlpool_malloc(pool, 1000));

  PageView page;
  const S::Header& h = page.header();
  CHECK(std::memcmp(h.magic, S::kMagic, sizeof S::kMagic) == 0);
  CHECK(h.version == S::kLayoutVersion);
  CHECK(h.pid == getpid());
  CHECK(h.interval_ms == 20);
  CHECK(h.total_bytes == page.bytes);
  CHECK(h.n_metrics == h.n_process_metrics + h.n_device_metrics + h.n_tier_metrics);

  page.wait_publishes();
  auto v = page.values();
  cxlpool_stats_t slow{}, fast{};
  REQUIRE(cxlpool_pool_get_stats(pool, 1, &slow) == CXLPOOL_OK);
  REQUIRE(cxlpool_pool_get_stats(pool, 0, &fast) == CXLPOOL_OK);
  CHECK(v["n_devices"] == 2);
  CHECK(v["device/slow/allocated_bytes"] == slow.allocated_bytes);
  CHECK(v["device/slow/allocated_bytes"] >= 3 * kMiB + 100 * 1000);
  CHECK(v["device/slow/resident_bytes"] == slow.resident_bytes);
  CHECK(v["device/slow/allocations"] == slow.allocations);
  CHECK(v["device/slow/allocations"] == 101);
  CHECK(v["device/slow/capacity_bytes"] == 256 * kMiB);
  CHECK(v["device/slow/device_committed_bytes"] == slow.resident_bytes);
  CHECK(v["device/fast/allocated_bytes"] == 0);
  CHECK(v["process/tiering_running"] == 0);

  // Every key of cxlpool_pool_stats_json's device objects is a device metric of the page.
  char* json = nullptr;
  REQUIRE(cxlpool_pool_stats_json(pool, &json) == CXLPOOL_OK);
  const std::string text = json;
  cxlpool_string_free(json);
  for (const auto& [key, value] : v) {
    (void)value;
    if (key.rfind("device/slow/", 0) == 0) CHECK(text.find("\"" + key.substr(12) + "\"") != std::string::npos);
  }

  // Two pools on one device: one device row, the sum of both.
  cxlpool_pool_t* second = t.pool("slow", "bind:slow");
  void* q = cxlpool_malloc(second, 2 * kMiB);
  REQUIRE(q);
  page.wait_publishes();
  v = page.values();
  CHECK(v["n_devices"] == 2);
  CHECK(v["device/slow/allocated_bytes"] >= 5 * kMiB + 100 * 1000);

  // A pin shows in the process counters and in the tier's figures after the move.
  REQUIRE(cxlpool_pin(p, 1, 0) == CXLPOOL_OK);
  page.wait_publishes();
  v = page.values();
  CHECK(v["process/pins"] >= 1);
  CHECK(v["process/pgpromote_success"] >= 1);

  // A reader can neither write nor resize the page.
  int fd = open(("/proc/self/fd/" + std::to_string(page_fd_number())).c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    CHECK(mmap(nullptr, page.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
    CHECK(ftruncate(fd, 1 << 20) != 0);
    CHECK(ftruncate(fd, 0) != 0);
    close(fd);
  }
  // The descriptor is close-on-exec and out of the program's way.
  const int number = page_fd_number();
  CHECK((fcntl(number, F_GETFD) & FD_CLOEXEC) != 0);
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= 64) CHECK(rlim_t(number) >= rl.rlim_cur - 64);

  cxlpool_free(q);
  cxlpool_pool_destroy(second);
  for (void* s : small) cxlpool_free(s);
  cxlpool_free(p);
  cxlpool_pool_destroy(pool);
  page.wait_publishes();
  CHECK(page.values()["n_devices"] == 0);
}

TEST_CASE("a fork child never writes the parent's page", "[stats]") {
  setenv("CXLPOOL_STAT_INTERVAL_MS", "10", 1);
  Topo t;
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:slow");
  void* p = cxlpool_malloc(pool, 1 * kMiB);
  REQUIRE(p);
  PageView page;
  page.wait_publishes();
  const uint64_t before = page.values()["device/slow/allocated_bytes"];
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    if (page_fd_number() >= 0) code |= 1;  // no page (and no descriptor of the parent's)
    std::vector<void*> mine;
    for (int i = 0; i < 40; ++i) mine.push_back(cxlpool_malloc(pool, kMiB));
    for (void* m : mine)
      if (!m) code |= 2;
    char c = 'x';
    if (write(pipe_fds[1], &c, 1) != 1) code |= 4;
    usleep(200 * 1000);  // ten of the parent's intervals
    _exit(code);
  }
  char c = 0;
  REQUIRE(read(pipe_fds[0], &c, 1) == 1);
  page.wait_publishes(3);
  auto v = page.values();
  CHECK(v["device/slow/allocated_bytes"] == before);
  CHECK(page.header().pid == getpid());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

TEST_CASE("200 forks while the publisher runs and another thread allocates never hang", "[stats]") {
  setenv("CXLPOOL_STAT_INTERVAL_MS", "10", 1);
  Topo t;
  cxlpool_pool_t* pool = t.pool("fast,slow", "interleave:fast=1,slow=1");
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    std::vector<void*> held;
    while (!stop.load()) {
      held.push_back(cxlpool_malloc(pool, 5000));
      if (held.size() > 64) {
        for (void* h : held) cxlpool_free(h);
        held.clear();
      }
    }
    for (void* h : held) cxlpool_free(h);
  });
  PageView page;
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(20);  // a hang in the child becomes a failure, not a stuck suite
      void* m = cxlpool_malloc(pool, 10000);
      cxlpool_free(m);
      _exit(m ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  churn.join();
  CHECK(failed == 0);
  page.wait_publishes();  // the publisher survived every fork
  cxlpool_pool_destroy(pool);
}

TEST_CASE("a program that closes and reuses the page's descriptor loses nothing and receives nothing", "[stats]") {
  setenv("CXLPOOL_STAT_INTERVAL_MS", "10", 1);
  Topo t;
  cxlpool_pool_t* pool = t.pool("fast,slow", "bind:slow");
  PageView page;  // mapped: survives the descriptor
  const int number = page_fd_number();
  REQUIRE(number >= 0);
  REQUIRE(close(number) == 0);
  cxlpool_test::ScratchDir dir;
  const std::string path = dir.path() + "/mine";
  int mine = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  REQUIRE(mine >= 0);
  REQUIRE(dup2(mine, number) == number);
  close(mine);
  void* p = cxlpool_malloc(pool, 2 * kMiB);
  REQUIRE(p);
  page.wait_publishes(3);
  CHECK(page.values()["device/slow/allocated_bytes"] >= 2 * kMiB);
  CHECK(lseek(number, 0, SEEK_END) == 0);  // nothing written into the program's file
  close(number);
  cxlpool_free(p);
  cxlpool_pool_destroy(pool);
}

namespace {

// Runs body in a fork child (the environment is read once per process) and returns its exit
// status: 0 when every check there held, else the number of the first that failed.
int in_child(int (*body)()) {
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(body());
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

// A pool made with the current environment is refused with status `want` and a message
// holding both texts (and, with check_page, no page is left): 0, or base + k when check k
// fails. check_page needs a free descriptor (it reads /proc/self/fd).
int create_expecting(Topo& t, cxlpool_status_t want, const std::string& text1, const std::string& text2, int base,
                     bool check_page) {
  cxlpool_pool_params_t* params = nullptr;
  cxlpool_pool_params_create(&params);
  cxlpool_pool_t* pool = nullptr;
  const cxlpool_status_t st = cxlpool_pool_create(t.topo, params, &pool);
  const std::string message = cxlpool_last_error_message();
  cxlpool_pool_params_destroy(params);
  if (st != want) return base + 1;
  if (message.find(text1) == std::string::npos) return base + 2;
  if (message.find(text2) == std::string::npos) return base + 3;
  if (pool) return base + 4;
  if (check_page && page_fd_number() >= 0) return base + 5;
  return 0;
}

// Every pool the program creates is refused alike, not only its first.
int create_expecting_config(const char* var, const char* value) {
  setenv(var, value, 1);
  Topo t;
  const bool page_option = std::string(var).rfind("CXLPOOL_STAT", 0) == 0;  // no page is made then
  if (int first = create_expecting(t, CXLPOOL_E_CONFIG, var, std::string("'") + value + "'", 10, page_option))
    return first;
  return create_expecting(t, CXLPOOL_E_CONFIG, var, std::string("'") + value + "'", 20, page_option);
}

}  // namespace

TEST_CASE("CXLPOOL_STAT_PAGE, CXLPOOL_STAT_INTERVAL_MS and CXLPOOL_CONTROL are parsed strictly, for every pool",
          "[stats]") {
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_STAT_PAGE", "yes"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_STAT_PAGE", "2"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_STAT_INTERVAL_MS", "5"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_STAT_INTERVAL_MS", "1s"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_STAT_INTERVAL_MS", "60001"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_CONTROL", "2"); }) == 0);
  CHECK(in_child([] { return create_expecting_config("CXLPOOL_CONTROL", ""); }) == 0);
}

namespace {

// Installs a seccomp filter on this (child) process that fails memfd_create with `err`.
bool refuse_memfd_create(int err) {
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_memfd_create, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (uint32_t(err) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog fprog{uint16_t(sizeof program / sizeof program[0]), program};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) == 0;
}

// With CXLPOOL_STAT_PAGE=1 and no memfd to be had, a pool is refused with an OS status that
// names memfd_create.
int create_expecting_memfd_failure(Topo& t) { return create_expecting(t, CXLPOOL_E_OS, "memfd_create", "", 30, false); }

}  // namespace

TEST_CASE("CXLPOOL_STAT_PAGE=0 makes no page, and =1 fails the pool when descriptors run out", "[stats]") {
  CHECK(in_child([] {
          setenv("CXLPOOL_STAT_PAGE", "0", 1);
          Topo t;
          cxlpool_pool_t* pool = t.pool("fast,slow", "bind:slow");
          const int found = page_fd_number();
          cxlpool_pool_destroy(pool);
          return found < 0 ? 0 : 21;
        }) == 0);
#ifdef CXLPOOL_TEST_UBSAN
  // UBSan's vptr check probes memory through a pipe(2); with no descriptor left it reports
  // every virtual call as a bad vptr. The seccomp case below makes the same failure without
  // exhausting the table.
  WARN("real descriptor exhaustion not run under UBSan (its vptr check needs two free descriptors)");
#else
  CHECK(in_child([] {
          setenv("CXLPOOL_STAT_PAGE", "1", 1);
          Topo t;
          rlimit saved{};
          getrlimit(RLIMIT_NOFILE, &saved);
          int probe = open("/dev/null", O_RDONLY);
          if (probe < 0) return 31;
          close(probe);
          rlimit low = saved;
          low.rlim_cur = rlim_t(probe);  // every number from here up is out of reach
          if (setrlimit(RLIMIT_NOFILE, &low) != 0) return 32;
          const int st = create_expecting_memfd_failure(t);
          setrlimit(RLIMIT_NOFILE, &saved);
          return st;
        }) == 0);
#endif
  // memfd_create alone fails with EMFILE (a seccomp filter): every other descriptor works.
  CHECK(in_child([] {
          setenv("CXLPOOL_STAT_PAGE", "1", 1);
          Topo t;
          if (!refuse_memfd_create(EMFILE)) return 36;
          return create_expecting_memfd_failure(t);
        }) == 0);
}

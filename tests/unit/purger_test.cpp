// SPDX-License-Identifier: MIT
// The allocator's background purger and what may start it: a free made where starting a thread
// would deadlock (the dynamic loader's frees, which glibc makes under locks pthread_create
// takes; the interposer marks them) leaves the purge to the next free.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "alloc/pool.hpp"
#include "alloc/types.hpp"
#include "test_support.hpp"
#include "topology/model.hpp"

namespace {

namespace A = cxlpool::detail::alloc;

// Threads of this process named cxlpool/purge now.
int purger_threads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
    char comm[32] = {};
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t got = read(fd, comm, sizeof comm - 1);
    close(fd);
    if (got > 0 && std::strncmp(comm, "cxlpool/purge", 13) == 0) ++n;
  }
  closedir(d);
  return n;
}

// Threads of this process: a thread started shows here as soon as pthread_create returns,
// before it has run far enough to name itself.
int threads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

bool wait_until(int want, int timeout_ms = 60000) {  // a hang guard
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (purger_threads() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST_CASE("a free that may not start a thread leaves the purge to the next free", "[unit]") {
  cxlpool::detail::DiscoverOptions o;
  o.ignore_env = true;
  o.no_hwloc = true;
  o.no_default_device = true;
  o.devices = "mem:backing=memfd,size=64M";
  cxlpool::detail::Topology topo = cxlpool::detail::discover(o);
  A::PoolOptions po;
  po.name = "purger";
  A::Pool* pool = A::pool_create(topo, po);
  const uint64_t delay = A::purge_delay_ms();
  A::set_purge_delay_ms(20);
  // Blocks of a thread that has exited: its pages are abandoned, and a free into one asks
  // the purger to retire it. The thread's own exit asks too: it defers, so no purger runs yet.
  std::vector<void*> blocks;
  std::thread([&] {
    A::set_thread_start_deferred(true);
    // A thread's first allocations of a class come from a central heap: past them, its own page.
    for (int i = 0; i < A::kWarmAllocations; ++i) A::free_any(A::pool_malloc(pool, 256));
    for (int i = 0; i < 64; ++i) blocks.push_back(A::pool_malloc(pool, 256));
  }).join();
  for (void* b : blocks) REQUIRE(b != nullptr);
  const int base = threads();     // this thread, and ThreadSanitizer's own where it runs
  A::set_purge_delay_ms(600000);  // a purger started from now on stays, asleep, to be seen
  A::set_thread_start_deferred(true);
  for (size_t i = 1; i < blocks.size(); ++i) CHECK(A::free_any(blocks[i]));
  A::set_thread_start_deferred(false);
  CHECK(threads() == base);       // requested, not started
  CHECK(A::free_any(blocks[0]));  // an ordinary free starts it
  CHECK(threads() == base + 1);
  CHECK(wait_until(1));  // and it is the purger
  A::set_purge_delay_ms(delay);
  A::pool_destroy(pool);
}

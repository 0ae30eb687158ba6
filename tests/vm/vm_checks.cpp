// SPDX-License-Identifier: MIT
// Placement checks run inside the multi-node test guest: every NUMA node target, and a
// numa:N device declared on every CPU-less node, gets memory committed through a cxlpool
// backing and verified page by page with move_pages status queries; capacity is enforced.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.hpp"

namespace {
int passed = 0, failed = 0;

int kernel_node_of_page(const void* p) {
  auto page = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095);
  return cxlpool::query_nodes(reinterpret_cast<void*>(page), 1)[0];
}

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

// Commits 8 MiB on the target and checks every page is on the expected node.
void placement(const cxlpool::Topology& topo, const cxlpool::Target& t, int expected_node) {
  constexpr size_t kBytes = size_t(8) << 20;
  auto backing = cxlpool::Backing::open(topo, t);
  auto r = backing.reserve(kBytes);
  madvise(r.data(), r.size(), MADV_NOHUGEPAGE);
  r.commit(0, r.size(), CXLPOOL_COMMIT_POPULATE);
  auto nodes = cxlpool::query_nodes(r.data(), r.size() / 4096);
  size_t on = 0;
  for (int n : nodes) on += n == expected_node;
  check(on == nodes.size(), std::string(t.name()) + ": " + std::to_string(on) + "/" + std::to_string(nodes.size()) +
                                " pages on node " + std::to_string(expected_node) + " (move_pages status query)");
}
// A pool on a real device-DAX device (2 MiB pages: whole segments committed at once): blocks
// of every size on the device, and fork() semantics — device-DAX cannot be mapped privately,
// so the child copies committed memory (into a memfd) before fork returns; each process must
// see only its own writes, and blocks allocated after fork never alias.
void pool_on_devdax(const cxlpool::Topology& topo, const std::string& dax) {
  constexpr size_t kMiB = size_t(1) << 20;
  auto pool = cxlpool::Pool::create(topo, {dax, "bind:" + dax});
  std::vector<std::pair<unsigned char*, size_t>> blocks;
  for (size_t n : {size_t(48), size_t(4000), size_t(100000), 3 * kMiB})
    for (int i = 0; i < 16; ++i) {
      auto* p = static_cast<unsigned char*>(pool.allocate(n));
      std::memset(p, 0x11, n);
      blocks.push_back({p, n});
    }
  bool on_dax = true;
  for (auto& [p, n] : blocks) on_dax &= cxlpool::ptr_info(p)->device_name == dax;
  check(on_dax, dax + ": a pool's blocks of 48 B .. 3 MiB are on the device (2 MiB pages)");
  auto holds = [&](unsigned char v) {
    for (auto& [p, n] : blocks)
      if (p[0] != v || p[n / 2] != v || p[n - 1] != v) return false;
    return true;
  };
  int to_parent[2], to_child[2];
  if (pipe(to_parent) || pipe(to_child)) return;
  pid_t pid = fork();
  if (pid == 0) {
    int code = holds(0x11) ? 0 : 1;
    for (auto& [p, n] : blocks) std::memset(p, 0x22, n);
    auto* mine = static_cast<unsigned char*>(pool.allocate(2 * kMiB));
    std::memset(mine, 0x33, 2 * kMiB);
    char c = 1;
    if (write(to_parent[1], &c, 1) != 1 || read(to_child[0], &c, 1) != 1) code |= 8;
    if (!holds(0x22)) code |= 2;
    if (mine[0] != 0x33 || mine[2 * kMiB - 1] != 0x33) code |= 4;
    _exit(code);
  }
  char c;
  bool synced = read(to_parent[0], &c, 1) == 1;
  bool parent_intact = holds(0x11);
  auto* mine = static_cast<unsigned char*>(pool.allocate(2 * kMiB));
  std::memset(mine, 0x44, 2 * kMiB);
  for (auto& [p, n] : blocks) std::memset(p, 0x55, n);
  synced &= write(to_child[1], &c, 1) == 1;
  int status = 0;
  waitpid(pid, &status, 0);
  check(synced && parent_intact, dax + ": after fork the child's writes do not reach the parent");
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        dax + ": the child kept its own copy, and its new blocks, while the parent wrote (status " +
            std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  check(holds(0x55) && mine[0] == 0x44, dax + ": the parent's own blocks are intact");
  pool.deallocate(mine);
  for (auto& [p, n] : blocks) pool.deallocate(p);
}

// One device layer's devdax lock: a private device (flock LOCK_EX) and a shared pool (LOCK_SH
// per participant) never share a device, and a device holding a shared pool's superblock is
// never adopted as a private device, even with no participant. The device's header is wiped
// again at the end (this test wrote it).
void shared_vs_private_devdax(const cxlpool::Topology& topo, const cxlpool::Target& dax) {
  const std::string device = "devdax:/dev/" + std::string(dax.name());
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_params_create(&params);
  cxlpool_shared_params_set_size(params, size_t(16) << 20);
  auto status_of = [](auto&& fn) {
    try {
      fn();
    } catch (const cxlpool::Error& e) {
      std::printf("     (%s)\n", e.what());
      return e.status();
    }
    return CXLPOOL_OK;
  };
  cxlpool_shared_pool_t* sp = nullptr;
  {
    auto b = cxlpool::Backing::open(topo, dax);  // the device, privately
    cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params, CXLPOOL_SHARED_FORMAT_DEVICE, &sp);
    std::printf("     (%s)\n", cxlpool_last_error_message());
    check(st == CXLPOOL_E_BUSY, device + ": held privately, formatting it as a shared pool is BUSY");
  }
  cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params, CXLPOOL_SHARED_FORMAT_DEVICE, &sp);
  cxlpool_shared_params_destroy(params);
  check(st == CXLPOOL_OK, device + ": formatted as a shared pool once the private device is closed");
  if (st != CXLPOOL_OK) return;
  void* block = nullptr;
  check(cxlpool_shared_alloc(sp, 4096, &block) == CXLPOOL_OK, device + ": a shared block");
  if (block) std::memset(block, 0x6b, 4096);
  check(status_of([&] { cxlpool::Backing::open(topo, dax); }) == CXLPOOL_E_BUSY,
        device + ": while the shared pool is open, a private device on it is BUSY");
  cxlpool_shared_pool_close(sp);
  check(status_of([&] { cxlpool::Backing::open(topo, dax); }) == CXLPOOL_E_CONFIG,
        device + ": with no participant, the device holding a shared pool is still refused as a private device");
  sp = nullptr;
  check(cxlpool_shared_pool_open(device.c_str(), nullptr, &sp) == CXLPOOL_OK, device + ": the shared pool reopens");
  cxlpool_shared_pool_close(sp);
  // Wipe the header this test wrote: the device is an ordinary device-DAX device again.
  int fd = open(("/dev/" + std::string(dax.name())).c_str(), O_RDWR | O_CLOEXEC);
  void* head = fd < 0 ? MAP_FAILED : mmap(nullptr, size_t(2) << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (head != MAP_FAILED) {
    std::memset(head, 0, 4096);
    munmap(head, size_t(2) << 20);
  }
  if (fd >= 0) close(fd);
  check(status_of([&] { cxlpool::Backing::open(topo, dax); }) == CXLPOOL_OK,
        device + ": its header wiped, the device opens privately again");
}

// A real device-DAX device (dax_hmem over a soft-reserved range): the devdax backing with its
// 2 MiB granule, a second mapping of the same device range, contents kept across decommit,
// capacity, and a pool on it.
int devdax_checks() {
  constexpr size_t kMiB = size_t(1) << 20;
  cxlpool::Config plain;
  plain.flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  auto topo = cxlpool::Topology::discover(&plain);
  std::optional<cxlpool::Target> dax;
  for (auto& t : topo.targets())
    if (t.kind() == CXLPOOL_TARGET_DAX) dax = t;
  check(dax.has_value(), "a device-DAX target is discovered");
  if (!dax) return 1;
  auto b = cxlpool::Backing::open(topo, *dax);
  auto caps = b.caps();
  check(caps.kind == CXLPOOL_BACKING_DEVDAX && caps.page_size == 2 * kMiB && !caps.decommit_frees_memory,
        std::string(dax->name()) + ": devdax backing, 2 MiB granule, decommit keeps memory");
  auto r = b.reserve(8 * kMiB);
  r.commit();
  auto* c = static_cast<unsigned char*>(r.data());
  for (size_t i = 0; i < 8 * kMiB; ++i) c[i] = static_cast<unsigned char>(i * 31 + 7);
  bool same = true;
  for (size_t i = 0; i < 8 * kMiB; i += 4093) same &= c[i] == static_cast<unsigned char>(i * 31 + 7);
  check(same, "8 MiB written and read back through the devdax mapping");
  auto m = b.map(r.device_offset(), 8 * kMiB);
  m.commit();
  auto* c2 = static_cast<unsigned char*>(m.data());
  bool mirrored = c2[12345] == c[12345] && c2[8 * kMiB - 1] == c[8 * kMiB - 1];
  c2[777] = 0x5a;
  check(mirrored && c[777] == 0x5a, "a second mapping of the same device range sees the same bytes");
  unsigned char before = c[2 * kMiB + 5];
  r.decommit(2 * kMiB, 2 * kMiB);
  r.commit(2 * kMiB, 2 * kMiB);
  check(c[2 * kMiB + 5] == before, "devdax keeps contents across decommit/commit (caps say so)");
  cxlpool_status_t st = CXLPOOL_OK;
  try {
    b.reserve(size_t(4) << 30);
  } catch (const cxlpool::Error& e) {
    st = e.status();
  }
  check(st == CXLPOOL_E_CAPACITY, "reserving past the device's capacity fails with CAPACITY");
  m.reset();
  r.reset();
  check(b.usage().reservations == 0 && b.usage().committed_bytes == 0, "everything released");
  pool_on_devdax(topo, std::string(dax->name()));
  { cxlpool::Backing closed(std::move(b)); }  // the private device closes with its last user
  shared_vs_private_devdax(topo, *dax);
  std::printf("vm_checks: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "devdax") {
    try {
      return devdax_checks();
    } catch (const cxlpool::Error& e) {
      check(false, std::string("cxlpool error: ") + e.what());
      return 1;
    }
  }
  try {
    cxlpool::Config plain;
    plain.flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
    auto topo = cxlpool::Topology::discover(&plain);
    std::string declared;
    for (auto& t : topo.targets()) {
      if (t.kind() != CXLPOOL_TARGET_NUMA_NODE) continue;
      placement(topo, t, t.numa_node());
      if (t.cpuless())
        declared += (declared.empty() ? "" : ";") + std::string("far") + std::to_string(t.numa_node()) +
                    ":backing=numa:" + std::to_string(t.numa_node()) + ",size=32M";
    }
    check(!declared.empty(), "the guest has at least one CPU-less node");
    cxlpool::Config with_devices;
    with_devices.devices(declared).flags(CXLPOOL_CONFIG_IGNORE_ENV);
    auto topo2 = cxlpool::Topology::discover(&with_devices);
    for (auto& t : topo2.targets()) {
      if (t.kind() != CXLPOOL_TARGET_EMULATED) continue;
      placement(topo2, t, t.numa_node());
      auto backing = cxlpool::Backing::open(topo2, t);
      auto r = backing.reserve(size_t(64) << 20);
      r.commit(0, size_t(32) << 20);
      cxlpool_status_t st = cxlpool_backing_commit(backing.get(), static_cast<char*>(r.data()) + (32 << 20), 4096, 0);
      check(st == CXLPOOL_E_CAPACITY, std::string(t.name()) + ": commit past size=32M fails with CAPACITY");
    }
    // The allocator's policies on real NUMA nodes: every page checked with the kernel.
    int far_node = -1;
    for (auto& t : topo.targets())
      if (t.kind() == CXLPOOL_TARGET_NUMA_NODE && t.cpuless()) far_node = t.numa_node();
    if (far_node >= 0) {
      const std::string far = "node" + std::to_string(far_node);
      auto kernel_node_of = [](const void* p) {
        auto page = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095);
        return cxlpool::query_nodes(reinterpret_cast<void*>(page), 1)[0];
      };
      {
        auto pool = cxlpool::Pool::create(topo, {"node0," + far, "threshold:size=1M,tier=far"});
        void* small = pool.allocate(1000);
        void* big = pool.allocate(size_t(4) << 20);
        std::memset(small, 1, 1000);
        std::memset(big, 1, size_t(4) << 20);
        size_t on_far = 0, pages = (size_t(4) << 20) / 4096;
        auto nodes = cxlpool::query_nodes(big, pages);
        for (int n : nodes) on_far += n == far_node;
        check(kernel_node_of(small) == 0, "threshold policy: small block on node0 (move_pages)");
        check(on_far == pages, "threshold policy: " + std::to_string(on_far) + "/" + std::to_string(pages) +
                                   " pages of a 4 MiB block on " + far + " (move_pages)");
        cxlpool::Pool::deallocate(small);
        cxlpool::Pool::deallocate(big);
      }
      {
        auto pool = cxlpool::Pool::create(topo, {"node0," + far, "interleave:node0=3," + far + "=1"});
        std::vector<void*> blocks;
        size_t on[2] = {0, 0}, mismatched = 0;
        for (int i = 0; i < 10000; ++i) {
          void* p = pool.allocate(4096);
          static_cast<char*>(p)[0] = 1;
          int node = kernel_node_of(p);
          auto info = cxlpool::ptr_info(p);
          if ((node == 0 ? 0 : 1) != info->device) ++mismatched;
          on[node == 0 ? 0 : 1]++;
          blocks.push_back(p);
        }
        double ratio = double(on[0]) / double(on[1]);
        check(ratio > 2.94 && ratio < 3.06, "weighted interleave 3:1 over 10,000 pages: " + std::to_string(on[0]) +
                                                ":" + std::to_string(on[1]) + " by move_pages (within 2%)");
        check(mismatched == 0, "ptr_info agrees with the kernel for every page");
        for (void* p : blocks) cxlpool::Pool::deallocate(p);
      }
    }
    // Every policy on real nodes: each block's page is where ptr_info says (move_pages), and
    // each policy's characteristic split shows up.
    if (far_node >= 0) {
      const std::string far = "node" + std::to_string(far_node);
      struct Case {
        std::string policy;
        double min_far_share, max_far_share;  // share of blocks the kernel finds on the far node
      };
      const Case cases[] = {
          {"bind:near", 0.0, 0.0},
          {"bind:far", 1.0, 1.0},
          {"preferred:" + far + ",node0", 1.0, 1.0},
          {"spill:near=node0,far=" + far + ",watermark=100%", 0.0, 0.0},
          {"ratio:node0=1," + far + "=1", 0.45, 0.55},
          {"hint:cold=" + far + "|bind:near", 0.45, 0.55},  // every other block is hinted cold
      };
      for (const Case& c : cases) {
        auto pool = cxlpool::Pool::create(topo, {"node0," + far, c.policy});
        std::vector<void*> blocks;
        size_t on_far = 0, disagree = 0;
        for (int i = 0; i < 2000; ++i) {
          cxlpool_hint_t hint{i % 2 ? uint32_t(CXLPOOL_HINT_COLD) : 0u, -1};
          void* p = cxlpool_malloc_hint(pool.get(), 4096, &hint);
          if (!p) break;
          static_cast<char*>(p)[0] = 1;
          int node = kernel_node_of_page(p);
          auto info = cxlpool::ptr_info(p);
          on_far += node == far_node;
          if ((node == far_node) != (std::string(info->device_name) == far)) ++disagree;
          blocks.push_back(p);
        }
        double share = blocks.empty() ? -1 : double(on_far) / double(blocks.size());
        check(blocks.size() == 2000 && disagree == 0 && share >= c.min_far_share && share <= c.max_far_share,
              c.policy + ": " + std::to_string(on_far) + "/" + std::to_string(blocks.size()) + " blocks on " + far +
                  ", " + std::to_string(disagree) + " disagreements between ptr_info and move_pages");
        for (void* p : blocks) cxlpool::Pool::deallocate(p);
      }
    }
    auto k = topo.kernel_state();
    std::printf("weighted_interleave=%d\n", int(k.weighted_interleave.value));
  } catch (const cxlpool::Error& e) {
    check(false, std::string("cxlpool error: ") + e.what());
  }
  std::printf("vm_checks: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

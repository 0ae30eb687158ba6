// SPDX-License-Identifier: MIT
// Tiering between real NUMA nodes in the guest, through the public API: writers lose nothing
// while their memory is pinned node0 <-> node1 1,000 times (every page, ptr_info and the
// ledgers checked after each move), a pin into a full node, and the engine's heat-driven
// promotion with the kernel's NUMA balancing off, deferred to (kernel=respect) and overruled.
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.hpp"
#include "cxlpool/tiering.h"
#include "vm_numa.hpp"

using vmtest::count_on;
using vmtest::kPage;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

cxlpool::Topology topology(const std::string& devices) {
  cxlpool::Config c;
  c.devices(devices).flags(CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  return cxlpool::Topology::discover(&c);
}

cxlpool_stats_t stats_of(const cxlpool::Pool& pool, int device) {
  cxlpool_stats_t s{};
  cxlpool_pool_get_stats(pool.get(), device, &s);
  return s;
}

int tier_of(const void* p) {
  auto i = cxlpool::ptr_info(p);
  return i ? i->tier : -1;
}

void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i += 256) p[i] = static_cast<unsigned char>(seed * 7 + i / 256);
}
bool holds(const unsigned char* p, size_t n, unsigned seed, size_t skip_in_page = size_t(-1)) {
  for (size_t i = 0; i < n; i += 256)
    if (i % kPage != skip_in_page && p[i] != static_cast<unsigned char>(seed * 7 + i / 256)) return false;
  return true;
}

// The engine's JSON without whitespace outside strings.
std::string tiering_json() {
  char* s = nullptr;
  if (cxlpool_tiering_stats_json(&s) != CXLPOOL_OK) return "";
  std::string out;
  bool in_string = false;
  for (const char* c = s; *c; ++c) {
    if (*c == '"' && (c == s || c[-1] != '\\')) in_string = !in_string;
    if (in_string || (*c != ' ' && *c != '\n')) out += *c;
  }
  cxlpool_string_free(s);
  return out;
}
uint64_t counter(const std::string& json, const std::string& name) {
  size_t at = json.find("\"" + name + "\":");
  return at == std::string::npos ? ~uint64_t(0) : std::stoull(json.substr(at + name.size() + 3));
}
std::string member(const std::string& json, const std::string& name) {  // a flat object member
  size_t at = json.find("\"" + name + "\":{");
  if (at == std::string::npos) return "";
  size_t end = json.find('}', at);
  return json.substr(at, end - at + 1);
}

// ---- 1. writers while their memory is pinned node0 <-> node1 ---------------------------------
// At least min_moves (1,000 at most), then as many as fit in max_seconds of guest time.
void writers(int min_moves, double max_seconds) {
  std::printf("--- writers while their memory moves node0 <-> node1 up to 1,000 times (cxlpool_pin)\n");
  auto topo = topology("dram:backing=numa:0,size=256M,tier=0;cxl:backing=numa:1,size=256M,tier=1");
  auto pool = cxlpool::Pool::create(topo, {"dram,cxl", "bind:dram"});
  // Just above 1 MiB: a huge block, its own unit (1 MiB and below share a region).
  constexpr size_t kSize = kMiB + kMiB / 4, kPages = kSize / kPage, kThreads = 4, kSlots = kSize / kThreads / 16;
  struct Record {
    uint64_t seq, check;
  };
  auto* records = static_cast<Record*>(cxlpool_malloc(pool.get(), kSize));
  if (!records) {
    check(false, std::string("writers: a 1.25 MiB block: ") + cxlpool_last_error_message());
    return;
  }
  std::memset(records, 0, kSize);
  const uint64_t committed = stats_of(pool, 0).resident_bytes;
  check(cxlpool::ptr_info(records)->huge && tier_of(records) == 0 && committed >= kSize &&
            stats_of(pool, 1).resident_bytes == 0,
        "writers: a 1.25 MiB block (its own unit) on dram, " + std::to_string(committed) + " bytes resident");
  check(count_on(records, kPages, 0).on == kPages,
        "writers: all " + std::to_string(kPages) + " pages on node0 before the first move (control)");
  auto check_of = [](uint64_t seq, size_t t) { return (seq * 0x9e3779b97f4a7c15ull) ^ (t + 1); };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> lost{0}, torn{0}, written{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Below the mover's priority: four spinning writers on the guest's two vCPUs would
      // otherwise take the mover's CPU too (the moves take minutes on a loaded host); one vCPU
      // still runs writers through every move.
      setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), 10);
      Record* mine = records + t * kSlots;
      std::vector<uint64_t> last(kSlots, 0);
      uint64_t seq = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        ++seq;
        const size_t slot = (seq * 7919) % kSlots;
        volatile Record* r = &mine[slot];
        r->seq = seq;  // two separate stores: a move between them would tear the record
        r->check = check_of(seq, t);
        last[slot] = seq;
      }
      for (size_t s = 0; s < kSlots; ++s) {
        if (mine[s].seq != last[s]) ++lost;
        if (last[s] != 0 && mine[s].check != check_of(last[s], t)) ++torn;
      }
      written += seq;
    });
  size_t misplaced = 0, pages_checked = 0, info_wrong = 0, ledger_wrong = 0;
  uint64_t written_during = 0;
  int moves = 0;
  std::string failure;
  // 1,000 moves, or as many as fit in max_seconds of guest time once min_moves are done: TCG
  // on a loaded host runs the guest many times slower, and the claim is about every move made.
  auto t0 = std::chrono::steady_clock::now();
  auto guest_seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  for (; moves < 1000 && (moves < min_moves || guest_seconds() < max_seconds); ++moves) {
    const int tier = moves % 2 == 0 ? 1 : 0;  // device index = tier = node here
    uint64_t seq_before = records[0].seq + records[kSlots].seq + records[2 * kSlots].seq;
    cxlpool_status_t st = cxlpool_pin(records, kSize, tier);
    if (st != CXLPOOL_OK) {
      failure = cxlpool_last_error_message();
      break;
    }
    vmtest::Count c = count_on(records, kPages, tier);
    misplaced += kPages - c.on;
    pages_checked += kPages;
    auto info = cxlpool::ptr_info(records);
    info_wrong += !info || info->tier != tier || info->device != tier || info->home_device != 0;
    cxlpool_stats_t here = stats_of(pool, tier), there = stats_of(pool, 1 - tier);
    ledger_wrong += here.resident_bytes != committed || there.resident_bytes != 0 ||
                    here.device_committed_bytes != committed || there.device_committed_bytes != 0;
    written_during += records[0].seq + records[kSlots].seq + records[2 * kSlots].seq != seq_before;
  }
  const double seconds = guest_seconds();
  stop = true;
  for (auto& th : threads) th.join();
  check(failure.empty() && moves >= min_moves,
        "writers: " + std::to_string(moves) + " pins alternating tier 1 / tier 0 succeeded" +
            (failure.empty() ? std::string() : " (stopped at " + std::to_string(moves) + ": " + failure + ")"));
  check(misplaced == 0 && pages_checked == size_t(moves) * kPages,
        "writers: after every move every page on the expected node: " + std::to_string(misplaced) + " misplaced of " +
            std::to_string(pages_checked) + " checked with move_pages");
  check(info_wrong == 0, "writers: ptr_info named the resident device and tier after every move (" +
                             std::to_string(info_wrong) + " wrong)");
  check(ledger_wrong == 0, "writers: the pool's resident bytes and both device ledgers exact after every move (" +
                               std::to_string(ledger_wrong) + " wrong)");
  check(lost.load() == 0 && torn.load() == 0, "writers: 0 lost writes, 0 torn records (lost " +
                                                  std::to_string(lost.load()) + ", torn " +
                                                  std::to_string(torn.load()) + ")");
  check(written.load() > uint64_t(moves) && written_during * 10 > uint64_t(moves) * 9,
        "writers: " + std::to_string(written.load()) + " records written; writers progressed across " +
            std::to_string(written_during) + " of the moves");
  std::printf("writers: %d moves of 1.25 MiB in %.1f s of TCG time (not a speed figure)\n", moves, seconds);
  cxlpool_free(records);

  // The policy moves with the pages: blocks that commit new pages of a moved unit later land
  // on the unit's new node.
  std::vector<unsigned char*> small;
  for (int i = 0; i < 64; ++i) {
    auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool.get(), 3000));
    std::memset(p, 1, 3000);
    small.push_back(p);
  }
  cxlpool_status_t st = cxlpool_pin(small[0], 1, 1);
  size_t in_unit = 0, off_node = 0;
  std::vector<unsigned char*> more;
  for (int i = 0; i < 2000; ++i) {
    auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool.get(), 3000));
    std::memset(p, 2, 3000);
    more.push_back(p);
    if (tier_of(p) != 1) continue;
    ++in_unit;
    auto* page = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(kPage - 1));
    auto* last = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p) + 2999) & ~uintptr_t(kPage - 1));
    off_node += count_on(page, 1, 1).on != 1;
    off_node += count_on(last, 1, 1).on != 1;
  }
  check(st == CXLPOOL_OK && in_unit > 1000 && off_node == 0, "writers: after a pin to cxl, " + std::to_string(in_unit) +
                                                                 " new blocks of the moved unit committed on node1 (" +
                                                                 std::to_string(off_node) + " pages elsewhere)");
  for (auto* p : more) cxlpool_free(p);
  for (auto* p : small) cxlpool_free(p);
}

// ---- 2. a pin into a full node -------------------------------------------------------------
void full() {
  std::printf("--- a pin into a full node1\n");
  auto topo = topology("dram:backing=numa:0,size=256M,tier=0;cxl:backing=numa:1,size=512M,tier=1");
  auto pool = cxlpool::Pool::create(topo, {"dram,cxl", "bind:dram"});
  constexpr size_t kSize = 64 * kMiB, kPages = kSize / kPage;  // well above a full node's slack (vm_rebind)
  auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool.get(), kSize));
  fill(p, kSize, 4);
  const cxlpool_stats_t near0 = stats_of(pool, 0), far0 = stats_of(pool, 1);
  {
    vmtest::NodeFiller filler(1, 1536 * kMiB);
    std::printf("node1 filled with %zu MiB; MemFree %ld KiB\n", filler.on_node() >> 20, vmtest::node_free_kib(1));
    cxlpool_status_t st = cxlpool_pin(p, kSize, 1);
    check(st == CXLPOOL_E_CAPACITY, std::string("full: cxlpool_pin to tier 1 is ") + cxlpool_status_str(st));
    std::printf("  %s\n", cxlpool_last_error_message());
    cxlpool_stats_t near1 = stats_of(pool, 0), far1 = stats_of(pool, 1);
    check(tier_of(p) == 0 && near1.resident_bytes == near0.resident_bytes &&
              far1.resident_bytes == far0.resident_bytes &&
              near1.device_committed_bytes == near0.device_committed_bytes &&
              far1.device_committed_bytes == far0.device_committed_bytes,
          "full: ptr_info, the pool's resident bytes and both ledgers unchanged");
    vmtest::Count c = count_on(p, kPages, 0);
    check(c.on == kPages && holds(p, kSize, 4),
          "full: all " + std::to_string(kPages) + " pages still on node0 and intact (" + vmtest::describe(c) + ")");
    // The pool goes on: new blocks commit on near, where the unit still is.
    auto* q = static_cast<unsigned char*>(cxlpool_malloc(pool.get(), 4 * kMiB));
    std::memset(q, 3, 4 * kMiB);
    check(count_on(q, 1024, 0).on == 1024, "full: a block allocated afterwards lands on node0 (dram)");
    cxlpool_free(q);
  }
  cxlpool_status_t st = cxlpool_pin(p, kSize, 1);
  check(st == CXLPOOL_OK && count_on(p, kPages, 1).on == kPages && tier_of(p) == 1 && holds(p, kSize, 4),
        "full, control: with node1's room back the same pin moves all " + std::to_string(kPages) + " pages to node1");
  cxlpool_free(p);
}

// ---- 3. heat-driven promotion --------------------------------------------------------------
struct Mode {
  std::string name;
  int numa_balancing;
  std::string kernel;  // the engine's kernel= key
};

void heat(const Mode& mode) {
  std::printf("--- heat: %s (numa_balancing=%d, kernel=%s)\n", mode.name.c_str(), mode.numa_balancing,
              mode.kernel.c_str());
  const std::string nb_knob = "/proc/sys/kernel/numa_balancing", demotion_knob = "/sys/kernel/mm/numa/demotion_enabled";
  const std::string demotion_before = vmtest::read_knob(demotion_knob);
  bool knobs = vmtest::write_knob(nb_knob, std::to_string(mode.numa_balancing));
  if (mode.numa_balancing) vmtest::write_knob(demotion_knob, "1");  // where the kernel has memory tiers
  check(knobs && vmtest::read_knob(nb_knob) == std::to_string(mode.numa_balancing),
        "heat: kernel.numa_balancing=" + vmtest::read_knob(nb_knob) +
            ", demotion_enabled=" + vmtest::read_knob(demotion_knob));

  auto topo = topology("fast:backing=numa:0,size=64M,tier=0;slow:backing=numa:1,size=512M,tier=1");
  auto pool = cxlpool::Pool::create(topo, {"fast,slow", "bind:slow"});
  constexpr int kBlocks = 24, kHotFirst = 8, kHot = 4;
  constexpr size_t kBlock = 3 * kMiB, kBlockPages = kBlock / kPage, kTouch = 64;  // byte the writer rewrites
  std::vector<unsigned char*> block;
  for (int i = 0; i < kBlocks; ++i) {
    auto* p = static_cast<unsigned char*>(cxlpool_malloc(pool.get(), kBlock));
    fill(p, kBlock, unsigned(i));
    block.push_back(p);
  }
  // A control the kernel may tier: plain anonymous memory (default policy) put on node1 with
  // move_pages, written exactly like the hot set.
  constexpr size_t kControl = kHot * kBlock, kControlPages = kControl / kPage;
  auto* control =
      static_cast<unsigned char*>(mmap(nullptr, kControl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(control, kControl, MADV_NOHUGEPAGE);
  std::memset(control, 1, kControl);
  {
    std::vector<void*> pages(kControlPages);
    std::vector<int> nodes(kControlPages, 1), status(kControlPages);
    for (size_t i = 0; i < kControlPages; ++i) pages[i] = control + i * kPage;
    syscall(SYS_move_pages, 0, kControlPages, pages.data(), nodes.data(), status.data(), 0);
  }
  // And one bound there like cxlpool's numa devices bind their ranges (mbind MPOL_BIND).
  auto* bound =
      static_cast<unsigned char*>(mmap(nullptr, kControl, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(bound, kControl, MADV_NOHUGEPAGE);
  vmtest::mbind_node(bound, kControl, vmtest::kMpolBind, 1, 0);
  std::memset(bound, 1, kControl);
  auto fraction_on0 = [&](int first, int count) {
    size_t on = 0;
    for (int i = first; i < first + count; ++i) on += count_on(block[size_t(i)], kBlockPages, 0).on;
    return double(on) / double(size_t(count) * kBlockPages);
  };
  auto cold_on0 = [&] {
    return (fraction_on0(0, kHotFirst) * kHotFirst +
            fraction_on0(kHotFirst + kHot, kBlocks - kHotFirst - kHot) * (kBlocks - kHotFirst - kHot)) /
           (kBlocks - kHot);
  };
  auto on0 = [&](const unsigned char* p) { return double(count_on(p, kControlPages, 0).on) / double(kControlPages); };
  const double hot_start = fraction_on0(kHotFirst, kHot), cold_start = cold_on0(), control_start = on0(control);
  check(hot_start == 0 && cold_start == 0 && control_start == 0 && on0(bound) == 0 &&
            count_on(bound, kControlPages, 1).on == kControlPages,
        "heat: before the engine starts every page of the 24 blocks (72 MiB) and of both controls is on node1 "
        "(control)");

  std::string monitor = "pagemap_scan";
  std::string config = "interval=100ms,monitors=pagemap_scan,min_residence=500ms,halflife=200ms,kernel=" + mode.kernel;
  cxlpool_status_t st = cxlpool_tiering_start(config.c_str());
  if (st == CXLPOOL_E_CONFIG) {  // kernels before 6.7 have no PAGEMAP_SCAN: the program's hints drive it
    std::printf("pagemap_scan unavailable (%s): hints instead\n", cxlpool_last_error_message());
    monitor = "hint";
    config = "interval=100ms,monitors=hint,min_residence=500ms,halflife=200ms,kernel=" + mode.kernel;
    st = cxlpool_tiering_start(config.c_str());
  }
  check(st == CXLPOOL_OK, "heat: engine started with " + config + " (" + cxlpool_status_str(st) + ")");
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t pass = 0; !stop.load(std::memory_order_relaxed); ++pass) {
      for (int i = kHotFirst; i < kHotFirst + kHot; ++i)
        for (size_t off = kTouch; off < kBlock; off += kPage) block[size_t(i)][off] = static_cast<unsigned char>(pass);
      for (size_t off = kTouch; off < kControl; off += kPage)
        control[off] = bound[off] = static_cast<unsigned char>(pass);
      if (monitor == "hint" && pass % 10 == 0)
        for (int i = kHotFirst; i < kHotFirst + kHot; ++i) cxlpool_hint_access(block[size_t(i)], kBlock, 4);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  // Where cxlpool moves: until the whole hot set has been on node0 for 1 s. Where the kernel is
  // left to it (its scan delay and period are about 1 s each): until the plain-memory control
  // has been on node0 for 1 s, cxlpool's hot set having had the same time. The 120 s bound is
  // only a hang guard: a guest on a loaded host runs many times slower than on a quiet one.
  const bool cxlpool_moves = !(mode.numa_balancing & 2) || mode.kernel == "own";
  auto t0 = std::chrono::steady_clock::now();
  double hot = 0, cold = 0, ctl = 0, bnd = 0, converged = -1, elapsed = 0;
  int steady = 0;
  while (elapsed < 120.0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    hot = fraction_on0(kHotFirst, kHot);
    cold = cold_on0();
    ctl = on0(control);
    bnd = on0(bound);
    std::printf("  t=%4.2fs hot_on_node0=%.3f cold_on_node0=%.3f control_on_node0=%.3f bound_control_on_node0=%.3f\n",
                elapsed, hot, cold, ctl, bnd);
    if (hot == 1.0 && converged < 0) converged = elapsed;
    steady = (cxlpool_moves ? hot : ctl) == 1.0 ? steady + 1 : 0;
    if (steady >= 4) break;
  }
  stop = true;
  writer.join();
  std::string json = tiering_json();
  std::string kernel = member(json, "kernel");
  std::printf("engine: %s\n", kernel.c_str());
  std::printf("engine: moves=%" PRIu64 " move_failures=%" PRIu64 " pgpromote_success=%" PRIu64
              " pgdemote_success=%" PRIu64 " last_move_error=%s\n",
              counter(json, "moves"), counter(json, "move_failures"), counter(json, "pgpromote_success"),
              counter(json, "pgdemote_success"),
              json.find("\"last_move_error\":\"\"") != std::string::npos ? "none" : "set");
  cxlpool_tiering_stop();
  // Every block intact; where cxlpool says each block is matches the kernel (when cxlpool
  // moved it; under kernel=respect the kernel may move pages behind cxlpool's back).
  bool intact = true;
  int tier0 = 0, agree = 0;
  for (int i = 0; i < kBlocks; ++i) {
    bool hot_block = i >= kHotFirst && i < kHotFirst + kHot;
    intact &= holds(block[size_t(i)], kBlock, unsigned(i), hot_block ? kTouch : size_t(-1));
    int t = tier_of(block[size_t(i)]);
    tier0 += t == 0;
    agree += count_on(block[size_t(i)], kBlockPages, t).on == kBlockPages;
  }
  check(intact, "heat: all 24 blocks intact (the hot set's rewritten bytes aside)");
  if (cxlpool_moves)
    check(agree == kBlocks,
          "heat: every block's pages are on its ptr_info tier's node (" + std::to_string(agree) + "/24)");
  std::printf(
      "heat-result mode=%s monitor=%s numa_balancing=%d kernel_mode=%s hot_start=%.3f hot_end=%.3f "
      "cold_end=%.3f control_start=%.3f control_end=%.3f bound_control_end=%.3f converged_s=%.2f seconds=%.2f "
      "engine_moves=%" PRIu64 " promoted_pages=%" PRIu64 " ptr_info_tier0=%d agree=%d\n",
      mode.name.c_str(), monitor.c_str(), mode.numa_balancing, mode.kernel.c_str(), hot_start, hot, cold, control_start,
      ctl, bnd, converged, elapsed, counter(json, "moves"), counter(json, "pgpromote_success"), tier0, agree);
  munmap(control, kControl);
  munmap(bound, kControl);
  for (auto* p : block) cxlpool_free(p);
  vmtest::write_knob(nb_knob, "0");
  if (!demotion_before.empty()) vmtest::write_knob(demotion_knob, demotion_before == "true" ? "1" : "0");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const std::string what = argc > 1 ? argv[1] : "";
  try {
    if (what == "writers") {
      // The CXL guest passes fewer: its node1 is emulated MMIO, ~100x slower than node0.
      writers(argc > 2 ? std::atoi(argv[2]) : 100, argc > 3 ? std::atof(argv[3]) : 120);
    } else if (what == "full") {
      full();
    } else if (what == "heat" && argc > 2) {
      const std::string m = argv[2];
      if (m == "nb0")
        heat({m, 0, "respect"});
      else if (m == "respect2")
        heat({m, 2, "respect"});
      else if (m == "own2")
        heat({m, 2, "own"});
      else
        check(false, "unknown heat mode " + m + " (nb0, respect2, own2)");
    } else {
      std::fprintf(stderr, "usage: vm_tiering writers [MIN_MOVES MAX_SECONDS] | full | heat nb0|respect2|own2\n");
      return 2;
    }
  } catch (const cxlpool::Error& e) {
    check(false, std::string("cxlpool error: ") + e.what());
  }
  std::printf("vm_tiering: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

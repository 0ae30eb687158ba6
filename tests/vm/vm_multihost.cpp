// SPDX-License-Identifier: MIT
// One participant of the two-host test bed (tests/vm/run_multihost_test.py): maps the shared
// far-memory device (/dev/dax0.0 in a guest, the /dev/shm file in the host process) and runs a
// scenario as participant ID; the runner's `init` and `inspect` commands set up and read back
// the same trivial layout. A new scenario is one more function in kCommands.
//
//   vm_multihost init --path=F --nonce=X [--participants=3 --iterations=N --rounds=K ...]
//   vm_multihost SCENARIO ID --path=F --nonce=X     (smoke, kill, pool-kill, pool-compose)
//   vm_multihost inspect --path=F                    (key=value lines)
//   vm_multihost pool-create --pool=file:F ...       (pool-kill, pool-compose: the cxlpool shared pool)
//   vm_multihost pool-check --pool=file:F            (cxlpool_shared_pool_check, key=value)
// --layout-offset=N (a multiple of 2 MiB) moves this program's layout off offset 0: pool-kill
// puts the cxlpool pool at the start of the device and its own layout after it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cxlpool/compose.h"
#include "cxlpool/shared.h"

namespace {

// ---- Layout: fixed offsets in the first 2 MiB (device-DAX maps whole 2 MiB pages) ---------
// Every word another participant writes sits on its own 128-byte line (one writer per line),
// except the shared counters, which exist to be contended.
constexpr size_t kMapBytes = size_t(2) << 20;
constexpr size_t kLine = 128;
constexpr int kMaxParticipants = 4;
constexpr int kMaxPairs = kMaxParticipants * (kMaxParticipants - 1) / 2;
constexpr uint64_t kMagic = 0x31304d48504c5843;   // "CXLPMH01"
constexpr size_t kAreaOffset = size_t(64) << 10;  // participant i's data area: 64 KiB each
constexpr size_t kAreaBytes = size_t(64) << 10;

enum State : uint64_t { kIdle = 0, kReady = 1, kRunning = 2, kDone = 3 };
constexpr const char* kStateNames[] = {"idle", "ready", "running", "done"};  // as `inspect` prints them

struct alignas(kLine) Header {  // written once by `init`, before any participant starts
  uint64_t magic, nonce, participants, iterations, rounds, period_ms, misses, wait_s;
};
struct alignas(kLine) Slot {  // written only by its participant
  uint64_t state, heartbeat, dead_mask, own, first_seen, last_seen, area_written;
};
struct alignas(kLine) Line {
  uint64_t v;
};
struct alignas(kLine) Pair {  // ping-pong between participants a < b: a writes odd, b even
  uint64_t flag, payload;
};
struct Layout {
  Header h;
  Slot slot[kMaxParticipants];
  Line counter;  // lock xadd by everyone
  Line control;  // plain increments by everyone: shows that the runs overlapped
  Pair pair[kMaxPairs];
};
static_assert(sizeof(Layout) <= kAreaOffset && kAreaOffset + kMaxParticipants * kAreaBytes <= kMapBytes);
static_assert(sizeof(Slot) == kLine && sizeof(Pair) == kLine);

uint64_t load(const uint64_t& w) { return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(w)).load(); }
void store(uint64_t& w, uint64_t v) { std::atomic_ref<uint64_t>(w).store(v); }
// A plain (not lock-prefixed) read-modify-write: a mov load, add, mov store.
void plain_increment(uint64_t& w) {
  std::atomic_ref<uint64_t> r(w);
  r.store(r.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}
void sleep_ns(uint64_t ns) {
  timespec ts{time_t(ns / 1000000000u), long(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
// Spins briefly, then sleeps between checks: participants share 2 host cores with the guests'
// vCPU threads, so a long spin would starve the very peer it waits for.
template <class Pred>
bool wait_until(Pred pred, uint64_t timeout_ns) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    __builtin_ia32_pause();
  }
  const uint64_t deadline = now_ns() + timeout_ns;
  while (!pred()) {
    if (now_ns() > deadline) return false;
    sleep_ns(20000);
  }
  return true;
}

uint64_t area_word(uint64_t nonce, int id, size_t i) {  // splitmix64 of (nonce, id, i)
  uint64_t z = nonce ^ (uint64_t(id) << 56) ^ (i * 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

struct Args {
  std::string command;
  int id = -1;
  std::map<std::string, std::string, std::less<>> opt;  // --key=value
  uint64_t num(std::string_view key, uint64_t fallback) const {
    auto it = opt.find(key);
    return it == opt.end() ? fallback : std::strtoull(it->second.c_str(), nullptr, 0);
  }
  std::string str(std::string_view key, const std::string& fallback = "") const {
    auto it = opt.find(key);
    return it == opt.end() ? fallback : it->second;
  }
};

struct Ctx {
  Layout* l = nullptr;
  unsigned char* base = nullptr;
  int id = -1;
  int participants = 0;
  uint64_t wait_ns = 0;
  int passed = 0, failed = 0;
  Slot& me() const { return l->slot[id]; }
  uint64_t* area(int who) const { return reinterpret_cast<uint64_t*>(base + kAreaOffset + size_t(who) * kAreaBytes); }
};

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::fflush(stdout);
}
void check(Ctx& c, bool ok, const std::string& what) {
  say("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? c.passed : c.failed)++;
}

unsigned char* map_device(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    say("FAIL open %s: %s\n", path.c_str(), std::strerror(errno));
    return nullptr;
  }
  void* p = mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off_t(offset));
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    say("FAIL mmap %s (2 MiB at offset %" PRIu64 ", MAP_SHARED): %s\n", path.c_str(), offset, std::strerror(e));
    return nullptr;
  }
  return static_cast<unsigned char*>(p);
}

void write_area(const Ctx& c) {
  uint64_t* a = c.area(c.id);
  const uint64_t nonce = load(c.l->h.nonce);
  for (size_t i = 0; i < kAreaBytes / 8; ++i) a[i] = area_word(nonce, c.id, i);
  store(c.me().area_written, 1);
}
bool area_intact(const Ctx& c, int who) {
  const uint64_t* a = c.area(who);
  const uint64_t nonce = load(c.l->h.nonce);
  for (size_t i = 0; i < kAreaBytes / 8; ++i)
    if (a[i] != area_word(nonce, who, i)) return false;
  return true;
}

// Publishes this participant's state and waits until every participant has reached it.
bool barrier(Ctx& c, State s) {
  store(c.me().state, s);
  bool all = wait_until(
      [&] {
        for (int p = 0; p < c.participants; ++p)
          if (load(c.l->slot[p].state) < s) return false;
        return true;
      },
      c.wait_ns);
  if (!all) {
    std::string missing;
    for (int p = 0; p < c.participants; ++p)
      if (load(c.l->slot[p].state) < s) missing += " " + std::to_string(p);
    check(c, false, "participants" + missing + " did not reach state " + std::to_string(s) + " in time");
  }
  return all;
}

int pair_index(int a, int b, int participants) {  // pairs (a < b) in lexicographic order
  int k = 0;
  for (int i = 0; i < participants; ++i)
    for (int j = i + 1; j < participants; ++j, ++k)
      if (i == a && j == b) return k;
  return -1;
}

// ---- smoke: atomics exact across hosts, plain stores visible both ways -------------------
int scenario_smoke(Ctx& c, const Args&) {
  const uint64_t n = load(c.l->h.iterations), rounds = load(c.l->h.rounds);
  if (!barrier(c, kReady)) return 1;
  say("CXLPOOL-MH RUNNING id=%d\n", c.id);
  std::atomic_ref<uint64_t> counter(c.l->counter.v);
  uint64_t first = 0, last = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t seen = counter.fetch_add(1, std::memory_order_relaxed);  // lock xadd
    plain_increment(c.me().own);
    plain_increment(c.l->control.v);
    if (i == 0) first = seen;
    last = seen;
  }
  store(c.me().first_seen, first);
  store(c.me().last_seen, last);

  // Ping-pong with every other participant, pairs in one global order (deadlock-free): the
  // payload written before each flag must be visible after it, in both directions.
  for (int a = 0; a < c.participants; ++a)
    for (int b = a + 1; b < c.participants; ++b) {
      if (c.id != a && c.id != b) continue;
      Pair& pr = c.l->pair[pair_index(a, b, c.participants)];
      const bool starter = c.id == a;
      uint64_t bad = 0, r = 0;
      for (; r < rounds; ++r) {
        const uint64_t mine = 2 * r + (starter ? 1 : 2), theirs = starter ? mine + 1 : mine - 1;
        if (!starter && !wait_until([&] { return load(pr.flag) == theirs; }, c.wait_ns)) break;
        if (!starter) bad += load(pr.payload) != area_word(theirs, a, r);
        store(pr.payload, area_word(mine, c.id, r));
        store(pr.flag, mine);
        if (starter && !wait_until([&] { return load(pr.flag) == theirs; }, c.wait_ns)) break;
        if (starter) bad += load(pr.payload) != area_word(theirs, b, r);
      }
      check(c, r == rounds && bad == 0,
            "ping-pong " + std::to_string(a) + "<->" + std::to_string(b) + ": " + std::to_string(r) + "/" +
                std::to_string(rounds) + " round trips, " + std::to_string(bad) + " stale payloads");
    }

  if (!barrier(c, kDone)) return 1;
  const uint64_t total = counter.load(), expected = n * uint64_t(c.participants);
  check(c, total == expected,
        "lock xadd counter " + std::to_string(total) + " = " + std::to_string(c.participants) + " x " +
            std::to_string(n) + " (exact)");
  check(c, load(c.me().own) == n, "plain increments on my own line: " + std::to_string(load(c.me().own)));
  say("control (plain increments on one shared line): %" PRIu64 " of %" PRIu64 "\n", load(c.l->control.v), expected);
  return c.failed ? 1 : 0;
}

// ---- kill: heartbeat leases; the runner SIGKILLs one guest's QEMU ------------------------
// Every participant beats every period in its own slot and watches the others: a peer whose
// beat has not changed for `misses` periods, and which had not finished cleanly, is dead. The
// survivors keep beating for a while after the expected death, then finish together.
int scenario_kill(Ctx& c, const Args& args) {
  const uint64_t period = load(c.l->h.period_ms) * 1000000u, misses = load(c.l->h.misses);
  const uint64_t expect_dead = uint64_t(1) << args.num("victim", 0);
  const uint64_t linger = args.num("linger-ms", 500) * 1000000u, deadline = now_ns() + c.wait_ns;
  const bool victim = expect_dead >> c.id & 1;
  write_area(c);
  if (!barrier(c, kReady)) return 1;
  store(c.me().state, kRunning);

  uint64_t last[kMaxParticipants] = {}, changed_at[kMaxParticipants] = {}, seen = 0, dead = 0;
  uint64_t beat = 0, all_dead_at = 0;
  bool announced = false;
  const uint64_t others = ((uint64_t(1) << c.participants) - 1) & ~(uint64_t(1) << c.id);
  for (;;) {
    store(c.me().heartbeat, ++beat);
    const uint64_t t = now_ns();
    uint64_t finished = 0;
    for (int p = 0; p < c.participants; ++p) {
      if (p == c.id || (dead >> p & 1)) continue;
      Slot& s = c.l->slot[p];
      if (load(s.state) == kDone) {
        finished |= uint64_t(1) << p;
        continue;
      }
      if (load(s.state) < kRunning) continue;
      const uint64_t hb = load(s.heartbeat);
      if (!(seen >> p & 1) || hb != last[p]) {
        seen |= uint64_t(1) << p;
        last[p] = hb;
        changed_at[p] = t;
      } else if (t - changed_at[p] >= misses * period) {
        dead |= uint64_t(1) << p;
        store(c.me().dead_mask, dead);
        say("CXLPOOL-MH DEAD id=%d peer=%d mono_ns=%" PRIu64 " beats_seen=%" PRIu64 "\n", c.id, p, t, hb);
        check(c, expect_dead >> p & 1,
              "peer " + std::to_string(p) + (expect_dead >> p & 1 ? " declared dead" : " declared dead: NOT expected"));
      }
    }
    if (!announced && (seen | dead) == others) {
      announced = true;  // every peer is beating: the runner may kill now
      say("CXLPOOL-MH RUNNING id=%d\n", c.id);
    }
    if (!victim && !all_dead_at && (dead & expect_dead) == (expect_dead & others)) all_dead_at = t;
    if (all_dead_at && t - all_dead_at >= linger && load(c.me().state) != kDone) store(c.me().state, kDone);
    if (load(c.me().state) == kDone && (finished | dead) == others) break;
    if (t > deadline) {
      check(c, false,
            victim ? "still alive at the deadline: the runner never killed this participant"
                   : "expected deaths not all detected before the deadline");
      return 1;
    }
    const uint64_t spent = now_ns() - t;
    if (spent < period) sleep_ns(period - spent);
  }
  check(c, dead == (expect_dead & others), "exactly the expected peers were declared dead");
  for (int p = 0; p < c.participants; ++p)
    if (load(c.l->slot[p].area_written))
      check(c, area_intact(c, p), "data area of participant " + std::to_string(p) + " intact");
  say("heartbeats written: %" PRIu64 "\n", beat);
  return c.failed ? 1 : 0;
}

// ---- pool-kill: three hosts in one cxlpool shared pool; the runner SIGKILLs guest 0 ------
// `pool-create` (run by the runner before the guests boot) makes the pool on the shared file:
// hosts = 3 with one slot each, coherence NONE, the lease timing given; it fills the device
// up to the layout offset, and this program's layout follows it. Participant ID joins as host
// index ID (guests: devdax:/dev/dax0.0, the host process: file:PATH). Handles travel through
// each participant's box after the layout, written only by its owner.
constexpr size_t kBoxOffset = kAreaOffset + kMaxParticipants * kAreaBytes;
constexpr size_t kBoxBytes = 4096;
constexpr int kMaxExports = 8;
enum Role : uint64_t { kShared = 1, kProbeAlive = 2, kProbeDead = 3 };
struct alignas(64) Export {  // two per 128-byte line, both its box owner's
  cxlpool_shared_handle_t handle;
  uint64_t bytes;  // asked for, and filled
  uint64_t sum;    // checksum of the content
  uint64_t role;
  uint64_t seed;
};
struct alignas(kLine) PoolBox {             // written only by its participant
  uint64_t phase;                           // PoolPhase reached
  uint64_t exports;                         // entries of e[] published
  uint64_t recovered;                       // cxlpool_shared_info_t.recovered_slots
  uint64_t participants;                    // participants alive once the death was handled
  uint64_t loops, loops_after;              // churn iterations: all; after the death was seen
  uint64_t failed;                          // checks failed
  uint64_t victim_checked, victim_intact;   // the victim's blocks held here, after recovery
  uint64_t q_bytes, q_delta_alive, q_done;  // probe Q: freed while the victim leased it
  uint64_t p_bytes, p_delta;                // probe P: freed after the recovery
  uint64_t stale_expected, stale_seen;      // imports that must be refused; refused as stale
  uint64_t stale_invalid;                   // ... refused as invalid instead (must stay 0)
  uint64_t detect_ns, recover_ns, seen_ns;  // this participant's CLOCK_MONOTONIC
  alignas(kLine) Export e[kMaxExports];
};
static_assert(sizeof(PoolBox) <= kBoxBytes && kBoxOffset + kMaxParticipants * kBoxBytes <= kMapBytes);
static_assert(sizeof(Export) == 64);
enum PoolPhase : uint64_t { kPhOpen = 1, kPhExported, kPhImported, kPhRunning, kPhChecked, kPhReleased, kPhDone };
constexpr const char* kPhaseNames[] = {"none",    "open",    "exported", "imported",
                                       "running", "checked", "released", "done"};

PoolBox& box(const Ctx& c, int who) {
  return *reinterpret_cast<PoolBox*>(c.base + kBoxOffset + size_t(who) * kBoxBytes);
}

bool pool_ok(Ctx& c, cxlpool_status_t st, const std::string& what) {
  if (st == CXLPOOL_OK) return true;
  check(c, false, what + ": " + cxlpool_status_str(st) + " (" + cxlpool_last_error_message() + ")");
  return false;
}

cxlpool_shared_info_t pool_info(cxlpool_shared_pool_t* pool) {
  cxlpool_shared_info_t i{};
  if (cxlpool_shared_pool_info(pool, &i) != CXLPOOL_OK) i.participants = ~0u;  // shows as a failure
  return i;
}

// Block content: every `stride`-th word from (seed, i); the checksum folds the words written.
// The pool is non-coherent: publish after writing, acquire before reading.
uint64_t fill_block(void* p, size_t bytes, uint64_t seed, size_t stride) {
  auto* w = static_cast<uint64_t*>(p);
  uint64_t sum = seed;
  for (size_t i = 0; i < bytes / 8; i += stride) {
    w[i] = area_word(seed, 7, i);
    sum = (sum ^ w[i]) * 0x100000001b3u;
  }
  cxlpool_publish(p, bytes);
  return sum;
}
uint64_t block_sum(const void* p, size_t bytes, uint64_t seed, size_t stride) {
  cxlpool_acquire(p, bytes);
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t sum = seed;
  for (size_t i = 0; i < bytes / 8; i += stride) sum = (sum ^ w[i]) * 0x100000001b3u;
  return sum;
}

// Publishes this participant's phase and waits until every participant in mask reached it.
bool box_barrier(Ctx& c, uint64_t mask, PoolPhase phase) {
  store(box(c, c.id).phase, phase);
  const bool all = wait_until(
      [&] {
        for (int p = 0; p < c.participants; ++p)
          if ((mask >> p & 1) && load(box(c, p).phase) < phase) return false;
        return true;
      },
      c.wait_ns);
  if (!all) {
    std::string missing;
    for (int p = 0; p < c.participants; ++p)
      if ((mask >> p & 1) && load(box(c, p).phase) < phase) missing += " " + std::to_string(p);
    check(c, false, std::string("participants") + missing + " did not reach phase " + kPhaseNames[phase] + " in time");
  }
  return all;
}

// One churn iteration: blocks of four classes (every fourth time also a large block of two
// extents) allocated, filled, verified and freed; nothing is held between iterations.
bool churn_once(Ctx& c, cxlpool_shared_pool_t* pool, uint64_t iter) {
  static constexpr uint64_t kSizes[] = {96, 1000, 4000, 30000, (uint64_t(5) << 20) / 2};
  constexpr int kCount = sizeof kSizes / sizeof kSizes[0];
  void* p[kCount] = {};
  uint64_t sums[kCount] = {};
  const int n = iter % 4 == 0 ? kCount : kCount - 1;
  const uint64_t nonce = load(c.l->h.nonce) ^ (iter * 0x9e3779b97f4a7c15u);
  bool ok = true;
  for (int k = 0; k < n && ok; ++k) {
    // The two-extent block needs two free extents side by side: while a killed participant's
    // blocks wait for recovery (its lease to run out) there may be none. CAPACITY is retried
    // until recovery must have come (the scenario's wait bound); after that it is a failure.
    cxlpool_status_t st = cxlpool_shared_alloc(pool, kSizes[k], &p[k]);
    for (const uint64_t until = now_ns() + c.wait_ns; st == CXLPOOL_E_CAPACITY && k == kCount - 1 && now_ns() < until;
         st = cxlpool_shared_alloc(pool, kSizes[k], &p[k]))
      usleep(10000);
    ok = pool_ok(c, st, "churn " + std::to_string(iter) + ": alloc " + std::to_string(kSizes[k]));
    if (ok) sums[k] = fill_block(p[k], kSizes[k], area_word(nonce, c.id, k), kSizes[k] > 65536 ? 512 : 1);
  }
  for (int k = 0; k < n; ++k) {
    if (!p[k]) continue;
    if (block_sum(p[k], kSizes[k], area_word(nonce, c.id, k), kSizes[k] > 65536 ? 512 : 1) != sums[k]) {
      check(c, false, "churn " + std::to_string(iter) + ": a block of " + std::to_string(kSizes[k]) + " changed");
      ok = false;
    }
    ok = pool_ok(c, cxlpool_shared_free(pool, p[k]), "churn: free") && ok;
  }
  return ok;
}

struct Held {  // a lease taken here on another participant's block
  int owner = -1;
  Export e{};
  void* p = nullptr;
  size_t size = 0;  // usable size the import reported (the owner's class or extents)
};

// The pool-kill scenario proper, with the pool open; returns false on a failed step (the
// checks say which).
bool pool_kill_run(Ctx& c, const Args& args, cxlpool_shared_pool_t* pool) {
  const int victim = int(args.num("victim", 0));
  const uint64_t all = (uint64_t(1) << c.participants) - 1, survivors = all & ~(uint64_t(1) << victim);
  const bool is_victim = c.id == victim;
  const uint64_t nonce = load(c.l->h.nonce), deadline = now_ns() + c.wait_ns;
  const uint64_t bound = args.num("recover-bound-ms", 300000) * 1000000u;
  const uint64_t linger = args.num("linger-ms", 500) * 1000000u;
  PoolBox& me = box(c, c.id);
  auto bytes_in_use = [&] { return pool_info(pool).bytes_in_use; };

  cxlpool_shared_info_t info = pool_info(pool);
  say("pool: slot %u, coherence %u, %" PRIu64 " extents of %" PRIu64 " KiB, %u participants active\n", info.slot,
      info.coherence, info.extents_total, info.extent_size >> 10, info.participants);
  check(c, info.coherence == CXLPOOL_COHERENCE_NONE, "the pool is non-coherent (CXLPOOL_COHERENCE_NONE)");
  if (!box_barrier(c, all, kPhOpen)) return false;

  // Every participant exports four blocks (small classes and a large block of two extents);
  // the survivors also export two probes that only the victim imports.
  struct Spec {
    uint64_t bytes;
    Role role;
  };
  std::vector<Spec> specs = {{200, kShared}, {5000, kShared}, {60000, kShared}, {uint64_t(3) << 20, kShared}};
  if (!is_victim) specs.insert(specs.end(), {{640, kProbeAlive}, {640, kProbeDead}});
  std::vector<void*> mine(specs.size());
  void *probe_alive = nullptr, *probe_dead = nullptr;
  for (size_t i = 0; i < specs.size(); ++i) {
    const uint64_t before = bytes_in_use();
    if (!pool_ok(c, cxlpool_shared_alloc(pool, specs[i].bytes, &mine[i]), "alloc " + std::to_string(specs[i].bytes)))
      return false;
    const uint64_t accounted = bytes_in_use() - before;
    Export e{};
    e.bytes = specs[i].bytes;
    e.role = specs[i].role;
    e.seed = area_word(nonce, c.id, 1000 + i);
    e.sum = fill_block(mine[i], e.bytes, e.seed, 1);
    if (!pool_ok(c, cxlpool_shared_export(pool, mine[i], &e.handle), "export")) return false;
    std::memcpy(&me.e[i], &e, sizeof e);
    if (e.role == kProbeAlive) {
      store(me.q_bytes, accounted);
      probe_alive = mine[i];
    }
    if (e.role == kProbeDead) {
      store(me.p_bytes, accounted);
      probe_dead = mine[i];
    }
  }
  store(me.exports, specs.size());
  if (!box_barrier(c, all, kPhExported)) return false;

  // Import: every other participant's shared blocks; the victim also the survivors' probes.
  std::vector<Held> held;
  uint64_t intact = 0;
  for (int p = 0; p < c.participants; ++p) {
    if (p == c.id) continue;
    for (uint64_t i = 0; i < load(box(c, p).exports) && i < kMaxExports; ++i) {
      Held h;
      h.owner = p;
      std::memcpy(&h.e, &box(c, p).e[i], sizeof h.e);
      if (h.e.role != kShared && !is_victim) continue;
      if (!pool_ok(c, cxlpool_shared_import(pool, &h.e.handle, &h.p, &h.size),
                   "import block " + std::to_string(i) + " of participant " + std::to_string(p)))
        return false;
      intact += block_sum(h.p, h.e.bytes, h.e.seed, 1) == h.e.sum;
      held.push_back(h);
    }
  }
  check(c, intact == held.size() && !held.empty(),
        "imported " + std::to_string(held.size()) + " blocks of the others, " + std::to_string(intact) +
            " with the checksum their owner published");
  if (!box_barrier(c, all, kPhImported)) return false;

  // While the victim lives its leases count: freeing Q, which only the victim holds, leaves it
  // in use (released, not free), so this participant's bytes in use do not drop.
  uint64_t b0 = 0;
  if (!is_victim) {
    const uint64_t before = bytes_in_use();
    if (!pool_ok(c, cxlpool_shared_free(pool, probe_alive), "free probe Q")) return false;
    b0 = bytes_in_use();
    store(me.q_delta_alive, before - b0);
    check(c, before == b0,
          "free of probe Q, leased by the live victim: bytes in use unchanged (" + std::to_string(before - b0) +
              " bytes dropped)");
  }
  if (!box_barrier(c, all, kPhRunning)) return false;
  say("CXLPOOL-MH RUNNING id=%d\n", c.id);

  uint64_t iter = 0;
  if (is_victim) {  // churn until the runner kills this guest
    for (;;) {
      if (!churn_once(c, pool, iter++)) return false;
      store(me.loops, iter);
      if (now_ns() > deadline) {
        check(c, false, "still alive at the deadline: the runner never killed this participant");
        return false;
      }
    }
  }

  // Survivors: keep churning; the victim's death shows as one participant fewer (its slot
  // evicted), the recovery as recovered_slots of whoever recovered it.
  const uint64_t t_run = now_ns();
  uint64_t t_dead = 0, t_rec = 0, recovered_sum = 0;
  for (;;) {
    if (!churn_once(c, pool, iter++)) return false;
    store(me.loops, iter);
    if (t_dead) store(me.loops_after, load(me.loops_after) + 1);
    info = pool_info(pool);
    const uint64_t t = now_ns();
    if (!t_dead && info.participants < uint32_t(c.participants)) {
      t_dead = t;
      store(me.detect_ns, t);
      say("CXLPOOL-MH POOL-DEAD id=%d participants=%u mono_ns=%" PRIu64 "\n", c.id, info.participants, t);
    }
    if (!t_rec && info.recovered_slots > 0) {
      t_rec = t;
      store(me.recover_ns, t);
      say("CXLPOOL-MH POOL-RECOVERED id=%d slots=%" PRIu64 " mono_ns=%" PRIu64 "\n", c.id, info.recovered_slots, t);
    }
    store(me.recovered, info.recovered_slots);
    recovered_sum = 0;
    for (int p = 0; p < c.participants; ++p)
      if (survivors >> p & 1) recovered_sum += load(box(c, p).recovered);
    if (t_dead && recovered_sum > 0) {
      store(me.seen_ns, t);
      say("CXLPOOL-MH POOL-RECOVERY-SEEN id=%d mono_ns=%" PRIu64 "\n", c.id, t);
      break;
    }
    if (t - t_run > bound || t > deadline) {
      check(c, false,
            std::string(t_dead ? "the victim was evicted but nobody recovered it" : "the victim's death was not seen") +
                " within " + std::to_string(bound / 1000000) + " ms of RUNNING");
      return false;
    }
  }
  store(me.participants, info.participants);
  check(c, info.participants == uint32_t(c.participants - 1),
        "after the death: " + std::to_string(info.participants) + " participants active");
  check(c, recovered_sum == 1,
        "recovered by exactly one survivor so far (sum of recovered_slots " + std::to_string(recovered_sum) +
            ", mine " + std::to_string(info.recovered_slots) + ")");
  const bool recoverer = info.recovered_slots > 0;

  // The victim's blocks that this survivor holds: intact after the recovery adopted them.
  uint64_t checked = 0, ok = 0, adopted_all = 0, adopted_large = 0;
  for (const Held& h : held) {
    if (h.owner != victim) continue;
    ++checked;
    ok += block_sum(h.p, h.e.bytes, h.e.seed, 1) == h.e.sum;
    adopted_all += h.size;
    if (h.size >= info.extent_size) adopted_large += h.size;
  }
  store(me.victim_checked, checked);
  store(me.victim_intact, ok);
  check(c, checked == 4 && ok == checked,
        "the victim's blocks held here after its recovery: " + std::to_string(ok) + " of " + std::to_string(checked) +
            " intact");

  // Q, freed while the victim lived, was kept by its lease; that lease no longer counts, so
  // the owner's deferred free completes: bytes in use drop by Q (churn between iterations
  // holds nothing). The recoverer now also owns the victim's blocks the survivors hold.
  // q_done 1: bytes in use exact (every adopted block counted); 2: only the large ones
  // (a past bug, kept visible); 0: neither.
  const uint64_t q_bytes = load(me.q_bytes);
  const uint64_t want_all = b0 - q_bytes + (recoverer ? adopted_all : 0);
  const uint64_t want_large = b0 - q_bytes + (recoverer ? adopted_large : 0);
  uint64_t seen = 0;
  for (const uint64_t t0 = now_ns(); now_ns() - t0 < uint64_t(3000) * 1000000u;) {
    seen = bytes_in_use();
    if (seen == want_all || seen == want_large) break;
    if (!churn_once(c, pool, iter++)) return false;
    store(me.loops, iter);
    store(me.loops_after, load(me.loops_after) + 1);
  }
  const uint64_t q_done = seen == want_all ? 1 : seen == want_large ? 2 : 0;
  store(me.q_done, q_done);
  check(c, q_done == 1,
        "probe Q's deferred free completed once the victim's lease stopped counting (bytes in use " +
            std::to_string(seen) + ", expected " + std::to_string(want_all) +
            (want_large != want_all ? " or " + std::to_string(want_large) : "") + ")");

  // P, leased only by the dead victim: freeing it now frees it at once.
  const uint64_t before = bytes_in_use();
  if (!pool_ok(c, cxlpool_shared_free(pool, probe_dead), "free probe P")) return false;
  const uint64_t p_delta = before - bytes_in_use();
  store(me.p_delta, p_delta);
  check(c, p_delta == load(me.p_bytes),
        "free of probe P, leased only by the dead victim: freed at once (" + std::to_string(p_delta) + " of " +
            std::to_string(load(me.p_bytes)) + " bytes dropped)");
  if (!box_barrier(c, survivors, kPhChecked)) return false;

  // Drop the leases on the victim's blocks; then nothing of the victim's and none of the
  // probes can be imported any more.
  for (Held& h : held)
    if (h.owner == victim) {
      pool_ok(c, cxlpool_shared_release(pool, h.p), "release a block of the victim");
      h.p = nullptr;
    }
  uint64_t stale_expected = 0, stale_seen = 0, stale_invalid = 0;
  for (int p = 0; p < c.participants; ++p) {
    if (p == c.id) continue;
    for (uint64_t i = 0; i < load(box(c, p).exports) && i < kMaxExports; ++i) {
      Export e{};
      std::memcpy(&e, &box(c, p).e[i], sizeof e);
      if (p != victim && e.role == kShared) continue;  // alive and held: importable
      ++stale_expected;
      void* q = nullptr;
      const cxlpool_status_t st = cxlpool_shared_import(pool, &e.handle, &q, nullptr);
      stale_seen += st == CXLPOOL_E_STALE;
      // A genuine handle of a freed block is stale, also when its extent went back to the pool.
      stale_invalid += st == CXLPOOL_E_INVALID_ARGUMENT;
      if (st != CXLPOOL_E_STALE)
        say("import of block %" PRIu64 " of participant %d (generation %u, offset %" PRIu64 "): %s (%s)\n", i, p,
            e.handle.generation, e.handle.offset, cxlpool_status_str(st),
            st == CXLPOOL_OK ? "accepted" : cxlpool_last_error_message());
      if (st == CXLPOOL_OK) cxlpool_shared_release(pool, q);
    }
  }
  store(me.stale_expected, stale_expected);
  store(me.stale_seen, stale_seen);
  store(me.stale_invalid, stale_invalid);
  check(c, stale_seen == stale_expected,
        "the victim's handles and the freed probes are refused as stale: " + std::to_string(stale_seen) + " of " +
            std::to_string(stale_expected) + " (" + std::to_string(stale_invalid) + " as invalid)");

  // Keep working a while, then verify and drop the survivors' blocks held here.
  for (const uint64_t t0 = now_ns(); now_ns() - t0 < linger;) {
    if (!churn_once(c, pool, iter++)) return false;
    store(me.loops, iter);
    store(me.loops_after, load(me.loops_after) + 1);
  }
  ok = 0;
  checked = 0;
  for (Held& h : held) {
    if (!h.p) continue;
    ++checked;
    ok += block_sum(h.p, h.e.bytes, h.e.seed, 1) == h.e.sum;
    pool_ok(c, cxlpool_shared_release(pool, h.p), "release");
  }
  check(c, ok == checked,
        "the other survivors' blocks held here: " + std::to_string(ok) + " of " + std::to_string(checked) +
            " intact at the end");
  say("churn: %" PRIu64 " iterations, %" PRIu64 " after the death was seen\n", load(me.loops), load(me.loops_after));
  if (!box_barrier(c, survivors, kPhReleased)) return false;
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i] == probe_alive || mine[i] == probe_dead) continue;
    ok = block_sum(mine[i], specs[i].bytes, load(me.e[i].seed), 1) == load(me.e[i].sum);
    check(c, ok, "my block " + std::to_string(i) + " intact before its free");
    pool_ok(c, cxlpool_shared_free(pool, mine[i]), "free");
  }
  info = pool_info(pool);
  store(me.recovered, info.recovered_slots);
  check(c, info.leases_held == 0, "no lease left (" + std::to_string(info.leases_held) + ")");
  say("bytes in use at the end: %" PRIu64 "\n", info.bytes_in_use);
  return true;
}

int scenario_pool_kill(Ctx& c, const Args& args) {
  std::string device = args.str("pool");
  if (device.empty()) device = "devdax:" + args.str("path");
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_pool_t* pool = nullptr;
  bool ok = pool_ok(c, cxlpool_shared_params_create(&params), "params") &&
            pool_ok(c, cxlpool_shared_params_set_host_index(params, uint32_t(c.id)), "host index") &&
            pool_ok(c, cxlpool_shared_pool_open(device.c_str(), params, &pool), "open " + device);
  cxlpool_shared_params_destroy(params);
  if (ok) say("opened %s as host %d\n", device.c_str(), c.id);
  ok = ok && pool_kill_run(c, args, pool);
  if (pool) ok = pool_ok(c, cxlpool_shared_pool_close(pool), "close") && ok;
  if (ok) store(box(c, c.id).phase, kPhDone);
  store(box(c, c.id).failed, uint64_t(c.failed));
  return ok && !c.failed ? 0 : 1;
}

// ---- pool-compose: capacity moved between the two guests by a composer on the host --------
// The pool (pool-create --quotas=1) has quotas g0 and g1, one per guest, and a small default
// for the host process, which runs a composer (docs/compose.md "Policy": an idle quota's spare
// extents go back after the hold time, demand is served from what is unassigned). Guest 1 asks
// for more than its quota's extents (its allocations refused on the grant are its demand) while
// guest 0 is idle; then guest 0 asks while guest 1 has freed everything; then guest 0, holding
// its capacity, is killed by the runner, and guest 1 asks again: the host recovers guest 0
// and the composer moves its capacity to guest 1.
struct alignas(kLine) ComposeBox {  // written only by its participant
  uint64_t phase;                   // ComposePhase reached
  uint64_t failed;
  uint64_t target;                            // extents asked for (guests)
  uint64_t busy_ms, back_ms, after_kill_ms;   // how long each demand took to be served (guests)
  uint64_t g0_granted_busy, g1_granted_back;  // the other guest's grant when each was served (host)
  uint64_t moves_up, moves_down;              // the composer's grants and reclaims (host)
};
static_assert(sizeof(ComposeBox) <= kBoxBytes);
enum ComposePhase : uint64_t { kCoOpen = 1, kCoBusy, kCoFreed, kCoBack, kCoServedAfterKill, kCoDone };

ComposeBox& cbox(const Ctx& c, int who) {
  return *reinterpret_cast<ComposeBox*>(c.base + kBoxOffset + size_t(who) * kBoxBytes);
}
bool cbox_wait(Ctx& c, int who, ComposePhase phase) {
  const bool ok = wait_until([&] { return load(cbox(c, who).phase) >= phase; }, c.wait_ns);
  if (!ok) check(c, false, "participant " + std::to_string(who) + " did not reach phase " + std::to_string(phase));
  return ok;
}

// Allocates one-extent blocks until `want` are held, retrying every 5 ms while the quota
// refuses (each refusal is demand the composer sees); false when the wait bound passes.
bool take_extents(Ctx& c, cxlpool_shared_pool_t* pool, uint64_t extent, uint64_t want, std::vector<void*>* held,
                  uint64_t* took_ms) {
  const uint64_t start = now_ns(), until = start + c.wait_ns;
  while (held->size() < want) {
    void* p = nullptr;
    const cxlpool_status_t st = cxlpool_shared_alloc(pool, extent, &p);
    if (st == CXLPOOL_OK) {
      static_cast<uint64_t*>(p)[0] = area_word(load(c.l->h.nonce), c.id, held->size());
      cxlpool_publish(p, 8);
      held->push_back(p);
      continue;
    }
    if (st != CXLPOOL_E_CAPACITY || now_ns() > until) {
      check(c, false,
            "alloc extent " + std::to_string(held->size()) + " of " + std::to_string(want) + ": " +
                cxlpool_status_str(st) + " (" + cxlpool_last_error_message() + ")");
      return false;
    }
    sleep_ns(5000000);
  }
  *took_ms = (now_ns() - start) / 1000000;
  return true;
}
void give_back(Ctx& c, cxlpool_shared_pool_t* pool, std::vector<void*>* held) {
  bool intact = true;
  for (size_t i = 0; i < held->size(); ++i) {
    cxlpool_acquire((*held)[i], 8);
    intact = intact && static_cast<uint64_t*>((*held)[i])[0] == area_word(load(c.l->h.nonce), c.id, i);
    pool_ok(c, cxlpool_shared_free(pool, (*held)[i]), "free");
  }
  check(c, intact, std::to_string(held->size()) + " blocks intact before their free");
  held->clear();
}

uint64_t granted_of(cxlpool_shared_pool_t* pool, const char* quota) {
  cxlpool_compose_state_t s{};
  if (cxlpool_compose_get_state(pool, 10000, &s) != CXLPOOL_OK) return ~uint64_t{0};
  for (uint32_t q = 0; q < s.quota_count; ++q)
    if (std::strcmp(s.quotas[q].name, quota) == 0) return s.quotas[q].granted_extents;
  return ~uint64_t{0};
}

bool compose_guest(Ctx& c, const Args& args, cxlpool_shared_pool_t* pool) {
  ComposeBox& me = cbox(c, c.id);
  const cxlpool_shared_info_t info = pool_info(pool);
  // Half again the quota's extents at creation (its grant may be lower by now: the composer
  // gives idle spare back).
  cxlpool_compose_state_t st{};
  uint64_t reserved = 0;
  if (!pool_ok(c, cxlpool_compose_get_state(pool, 10000, &st), "compose state")) return false;
  for (uint32_t q = 0; q < st.quota_count; ++q)
    if (std::strcmp(st.quotas[q].name, info.quota) == 0) reserved = st.quotas[q].reserved_extents;
  const uint64_t want = args.num("compose-target", reserved + reserved / 2);
  store(me.target, want);
  std::vector<void*> held;
  uint64_t ms = 0;
  say("compose: quota %s, %" PRIu64 " extents of %" PRIu64 " KiB at creation, %" PRIu64
      " granted now, asking for %" PRIu64 "\n",
      info.quota, reserved, info.extent_size >> 10, info.quota_extents_max, want);
  store(me.phase, kCoOpen);
  if (c.id == 1) {
    if (!cbox_wait(c, 2, kCoOpen) || !take_extents(c, pool, info.extent_size, want, &held, &ms)) return false;
    store(me.busy_ms, ms);
    say("compose: guest 1 holds %" PRIu64 " extents after %" PRIu64 " ms\n", want, ms);
    store(me.phase, kCoBusy);
    if (!cbox_wait(c, 2, kCoBusy)) return false;  // the host read the grants
    give_back(c, pool, &held);
    store(me.phase, kCoFreed);
    // Guest 0 asks now; then it is killed while holding, and this guest asks again.
    if (!cbox_wait(c, 0, kCoBack)) return false;
    say("CXLPOOL-MH RUNNING id=%d\n", c.id);
    if (!take_extents(c, pool, info.extent_size, want, &held, &ms)) return false;
    store(me.after_kill_ms, ms);
    say("CXLPOOL-MH COMPOSE-SERVED id=%d mono_ns=%" PRIu64 "\n", c.id, now_ns());
    store(me.phase, kCoServedAfterKill);
    give_back(c, pool, &held);
    return true;
  }
  // Guest 0: idle while guest 1 is busy, then busy itself, then killed while holding.
  if (!cbox_wait(c, 1, kCoFreed) || !take_extents(c, pool, info.extent_size, want, &held, &ms)) return false;
  store(me.back_ms, ms);
  say("compose: guest 0 holds %" PRIu64 " extents after %" PRIu64 " ms\n", want, ms);
  store(me.phase, kCoBack);
  say("CXLPOOL-MH RUNNING id=%d\n", c.id);
  for (;;) sleep_ns(1000000000);  // until the runner kills this guest
}

bool compose_host(Ctx& c, const Args& args, cxlpool_shared_pool_t* pool) {
  ComposeBox& me = cbox(c, c.id);
  cxlpool_composer_t* composer = nullptr;
  if (!pool_ok(c, cxlpool_composer_create(pool, uint32_t(args.num("compose-hold-ms", 300)), &composer), "composer"))
    return false;
  std::atomic<bool> stop{false};
  uint64_t up = 0, down = 0;
  std::string step_error;
  const uint64_t period = args.num("compose-period-ms", 20) * 1000000u;
  std::thread runner([&] {
    while (!stop.load()) {
      cxlpool_compose_move_t moves[16];
      size_t n = 0;
      const cxlpool_status_t st = cxlpool_composer_step(composer, 10000, moves, 16, &n);
      if (st != CXLPOOL_OK && st != CXLPOOL_E_BUSY && step_error.empty())
        step_error = std::string(cxlpool_status_str(st)) + " (" + cxlpool_last_error_message() + ")";
      for (size_t k = 0; k < n && k < 16; ++k) (moves[k].delta_extents > 0 ? up : down) += 1;
      sleep_ns(period);
    }
  });
  store(me.phase, kCoOpen);
  bool ok = cbox_wait(c, 1, kCoBusy);
  if (ok) store(me.g0_granted_busy, granted_of(pool, "g0"));
  store(me.phase, kCoBusy);
  ok = ok && cbox_wait(c, 0, kCoBack);
  if (ok) {
    store(me.g1_granted_back, granted_of(pool, "g1"));
    say("CXLPOOL-MH RUNNING id=%d\n", c.id);
  }
  // Guest 0 is killed now; the watch recovers it and the composer moves its extents.
  ok = ok && cbox_wait(c, 1, kCoServedAfterKill);
  stop.store(true);
  runner.join();
  cxlpool_composer_destroy(composer);
  store(me.moves_up, up);
  store(me.moves_down, down);
  check(c, step_error.empty(),
        "every composer step succeeded or met a busy claim" + (step_error.empty() ? std::string() : ": " + step_error));
  say("compose: the composer made %" PRIu64 " grants and %" PRIu64 " reclaims\n", up, down);
  return ok;
}

int scenario_pool_compose(Ctx& c, const Args& args) {
  std::string device = args.str("pool");
  if (device.empty()) device = "devdax:" + args.str("path");
  const std::string quota = c.id == 2 ? "default" : "g" + std::to_string(c.id);
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_pool_t* pool = nullptr;
  bool ok = pool_ok(c, cxlpool_shared_params_create(&params), "params") &&
            pool_ok(c, cxlpool_shared_params_set_host_index(params, uint32_t(c.id)), "host index") &&
            pool_ok(c, cxlpool_shared_params_set_quota(params, quota.c_str()), "quota") &&
            pool_ok(c, cxlpool_shared_pool_open(device.c_str(), params, &pool), "open " + device);
  cxlpool_shared_params_destroy(params);
  if (ok) say("opened %s as host %d, quota %s\n", device.c_str(), c.id, quota.c_str());
  ok = ok && (c.id == 2 ? compose_host(c, args, pool) : compose_guest(c, args, pool));
  if (pool) ok = pool_ok(c, cxlpool_shared_pool_close(pool), "close") && ok;
  if (ok) store(cbox(c, c.id).phase, kCoDone);
  store(cbox(c, c.id).failed, uint64_t(c.failed));
  return ok && !c.failed ? 0 : 1;
}

// ---- runner commands: the pool of pool-kill -----------------------------------------------
// Creates the pool (file:PATH, which must not exist) with `pool-size` bytes, then extends the
// file to `device-size` (the guests' node 1) so that the layout fits after the pool.
int pool_create(Ctx& c, const Args& args) {
  const std::string device = args.str("pool");
  if (device.rfind("file:", 0) != 0) {
    say("FAIL pool-create needs --pool=file:PATH\n");
    return 2;
  }
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_pool_t* pool = nullptr;
  bool ok = pool_ok(c, cxlpool_shared_params_create(&params), "params") &&
            pool_ok(c, cxlpool_shared_params_set_size(params, args.num("pool-size", uint64_t(128) << 20)), "size") &&
            pool_ok(c, cxlpool_shared_params_set_coherence(params, CXLPOOL_COHERENCE_NONE), "coherence") &&
            pool_ok(c, cxlpool_shared_params_set_participants(params, uint32_t(args.num("hosts", 3)), 1), "hosts") &&
            pool_ok(c,
                    cxlpool_shared_params_set_lease_timing(params, uint32_t(args.num("heartbeat-ms", 10)),
                                                           uint32_t(args.num("lease-ms", 1000))),
                    "lease timing") &&
            pool_ok(c, cxlpool_shared_params_set_host_index(params, uint32_t(args.num("host-index", 2))), "host");
  // pool-compose: a quota per guest, each the given bytes; default (the host's) gets the rest.
  for (int g = 0; ok && g < 2 && args.num("quota-bytes", 0) > 0; ++g)
    ok = pool_ok(c,
                 cxlpool_shared_params_add_quota(params, ("g" + std::to_string(g)).c_str(), args.num("quota-bytes", 0)),
                 "quota");
  ok = ok && pool_ok(c, cxlpool_shared_pool_create(device.c_str(), params, 0, &pool), "create " + device);
  cxlpool_shared_params_destroy(params);
  if (!ok) return 1;
  cxlpool_shared_info_t info = pool_info(pool);
  std::printf("pool_size=%" PRIu64 "\nextents=%" PRIu64 "\nextent_size=%" PRIu64 "\n", info.size, info.extents_total,
              info.extent_size);
  if (!pool_ok(c, cxlpool_shared_pool_close(pool), "close")) return 1;
  const std::string path = device.substr(5);
  if (truncate(path.c_str(), off_t(args.num("device-size", uint64_t(256) << 20))) != 0) {
    say("FAIL truncate %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  return 0;
}

// cxlpool_shared_pool_check without repair, as key=value lines.
int pool_check(Ctx& c, const Args& args) {
  cxlpool_shared_check_report_t r{};
  const cxlpool_status_t st = cxlpool_shared_pool_check(args.str("pool").c_str(), nullptr, 0, &r);
  if (st != CXLPOOL_OK && st != CXLPOOL_E_CORRUPT) return pool_ok(c, st, "check") ? 0 : 1;
  std::printf("status=%s\nextents_total=%" PRIu64 "\nextents_free=%" PRIu64 "\nblocks_in_use=%" PRIu64
              "\nleases=%" PRIu64 "\nleaked_blocks=%" PRIu64 "\ndangling_leases=%" PRIu64 "\ncorrupt_words=%" PRIu64
              "\norphan_extents=%" PRIu64 "\nlive_participants=%u\ndead_participants=%u\n",
              st == CXLPOOL_OK ? "ok" : "corrupt", r.extents_total, r.extents_free, r.blocks_in_use, r.leases,
              r.leaked_blocks, r.dangling_leases, r.corrupt_words, r.orphan_extents, r.live_participants,
              r.dead_participants);
  return 0;
}

// ---- runner commands: set up and read back the layout ------------------------------------
int init(Ctx& c, const Args& args) {
  Header& h = c.l->h;
  std::memset(c.base, 0, kMapBytes);
  store(h.participants, args.num("participants", 3));
  store(h.iterations, args.num("iterations", 2000000));
  store(h.rounds, args.num("rounds", 1000));
  store(h.period_ms, args.num("period-ms", 10));
  store(h.misses, args.num("misses", 5));
  store(h.wait_s, args.num("wait-s", 400));
  store(h.nonce, args.num("nonce", 0));
  store(h.magic, kMagic);
  return load(h.participants) <= kMaxParticipants ? 0 : 2;
}

int inspect(Ctx& c, const Args&) {
  const Header& h = c.l->h;
  std::printf("magic=%s\nnonce=%" PRIu64 "\nparticipants=%" PRIu64 "\niterations=%" PRIu64 "\nrounds=%" PRIu64
              "\ncounter=%" PRIu64 "\ncontrol=%" PRIu64 "\n",
              load(h.magic) == kMagic ? "ok" : "bad", load(h.nonce), load(h.participants), load(h.iterations),
              load(h.rounds), load(c.l->counter.v), load(c.l->control.v));
  for (int p = 0; p < c.participants; ++p) {
    const Slot& s = c.l->slot[p];
    const uint64_t state = load(s.state);
    std::printf("slot%d.state=%s\nslot%d.heartbeat=%" PRIu64 "\nslot%d.dead_mask=%" PRIu64 "\nslot%d.own=%" PRIu64
                "\nslot%d.first_seen=%" PRIu64 "\nslot%d.last_seen=%" PRIu64 "\nslot%d.area=%s\n",
                p, state <= kDone ? kStateNames[state] : "bad", p, load(s.heartbeat), p, load(s.dead_mask), p,
                load(s.own), p, load(s.first_seen), p, load(s.last_seen), p,
                !load(s.area_written) ? "none" : (area_intact(c, p) ? "intact" : "corrupt"));
    for (int q = p + 1; q < c.participants; ++q)
      std::printf("pair%d%d=%" PRIu64 "\n", p, q, load(c.l->pair[pair_index(p, q, c.participants)].flag));
    const ComposeBox& cb = cbox(c, p);  // pool-compose (the same box, read as its own)
    const std::pair<const char*, const uint64_t*> cfields[] = {{"phase", &cb.phase},
                                                               {"failed", &cb.failed},
                                                               {"target", &cb.target},
                                                               {"busy_ms", &cb.busy_ms},
                                                               {"back_ms", &cb.back_ms},
                                                               {"after_kill_ms", &cb.after_kill_ms},
                                                               {"g0_granted_busy", &cb.g0_granted_busy},
                                                               {"g1_granted_back", &cb.g1_granted_back},
                                                               {"moves_up", &cb.moves_up},
                                                               {"moves_down", &cb.moves_down}};
    for (const auto& [name, word] : cfields) std::printf("cbox%d.%s=%" PRIu64 "\n", p, name, load(*word));
    const PoolBox& b = box(c, p);  // pool-kill
    const uint64_t phase = load(b.phase);
    if (phase == 0) continue;
    const std::pair<const char*, const uint64_t*> fields[] = {{"exports", &b.exports},
                                                              {"recovered", &b.recovered},
                                                              {"participants", &b.participants},
                                                              {"loops", &b.loops},
                                                              {"loops_after", &b.loops_after},
                                                              {"failed", &b.failed},
                                                              {"victim_checked", &b.victim_checked},
                                                              {"victim_intact", &b.victim_intact},
                                                              {"q_bytes", &b.q_bytes},
                                                              {"q_delta_alive", &b.q_delta_alive},
                                                              {"q_done", &b.q_done},
                                                              {"p_bytes", &b.p_bytes},
                                                              {"p_delta", &b.p_delta},
                                                              {"stale_expected", &b.stale_expected},
                                                              {"stale_seen", &b.stale_seen},
                                                              {"stale_invalid", &b.stale_invalid}};
    std::printf("box%d.phase=%s\n", p, phase <= kPhDone ? kPhaseNames[phase] : "bad");
    for (const auto& [name, word] : fields) std::printf("box%d.%s=%" PRIu64 "\n", p, name, load(*word));
  }
  return 0;
}

enum Kind {
  kLayout,       // a runner command on the layout
  kPool,         // a runner command on the pool only (--pool=DEVICE); maps no layout
  kParticipant,  // takes an ID and joins the run (the header must be initialized)
};
struct Command {
  const char* name;
  int (*run)(Ctx&, const Args&);
  Kind kind;
};
constexpr Command kCommands[] = {{"init", init, kLayout},
                                 {"inspect", inspect, kLayout},
                                 {"pool-create", pool_create, kPool},
                                 {"pool-check", pool_check, kPool},
                                 {"smoke", scenario_smoke, kParticipant},
                                 {"kill", scenario_kill, kParticipant},
                                 {"pool-kill", scenario_pool_kill, kParticipant},
                                 {"pool-compose", scenario_pool_compose, kParticipant}};

int usage() {
  std::fprintf(stderr,
               "usage: vm_multihost init|inspect --path=FILE [--layout-offset=N] [--key=value ...]\n"
               "       vm_multihost pool-create|pool-check --pool=file:FILE [--key=value ...]\n"
               "       vm_multihost SCENARIO ID --path=DEVICE --nonce=N [--key=value ...]   (smoke, kill, pool-kill,\n"
               "                                                                           pool-compose)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      auto eq = a.find('=');
      args.opt[a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] =
          eq == std::string::npos ? "1" : a.substr(eq + 1);
    } else if (args.command.empty()) {
      args.command = a;
    } else if (args.id < 0) {
      args.id = std::atoi(a.c_str());
    } else {
      return usage();
    }
  }
  const Command* cmd = nullptr;
  for (const Command& k : kCommands)
    if (args.command == k.name) cmd = &k;
  if (!cmd || (cmd->kind == kPool ? !args.opt.count("pool") : !args.opt.count("path"))) return usage();

  Ctx c;
  if (cmd->kind == kPool) return cmd->run(c, args);
  c.base = map_device(args.opt["path"], args.num("layout-offset", 0));
  if (!c.base) return 1;
  c.l = reinterpret_cast<Layout*>(c.base);
  if (cmd->kind == kLayout) {
    c.participants = int(std::min<uint64_t>(load(c.l->h.participants), kMaxParticipants));
    return cmd->run(c, args);
  }
  c.id = args.id;
  c.participants = int(load(c.l->h.participants));
  c.wait_ns = load(c.l->h.wait_s) * 1000000000u;
  if (load(c.l->h.magic) != kMagic || load(c.l->h.nonce) != args.num("nonce", 0)) {
    say("FAIL %s is not this run's shared file (magic %#" PRIx64 ", nonce %" PRIu64 ", expected %s)\n",
        args.opt["path"].c_str(), load(c.l->h.magic), load(c.l->h.nonce), args.opt["nonce"].c_str());
    return 1;
  }
  if (c.id < 0 || c.id >= c.participants || c.participants > kMaxParticipants) return usage();
  say("vm_multihost %s id=%d of %d on %s\n", cmd->name, c.id, c.participants, args.opt["path"].c_str());
  int rc = cmd->run(c, args);
  say("vm_multihost %s id=%d: %d passed, %d failed\n", cmd->name, c.id, c.passed, c.failed);
  return rc;
}

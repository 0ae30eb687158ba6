// SPDX-License-Identifier: MIT
// One participant of the two-host test bed (tests/vm/run_multihost_test.py): maps the shared
// far-memory device (/dev/dax0.0 in a guest, the /dev/shm file in the host process) and runs a
// scenario as participant ID; the runner's `init` and `inspect` commands set up and read back
// the same trivial layout. A new scenario is one more function in kCommands.
//
//   vm_multihost init --path=F --nonce=X [--participants=3 --iterations=N --rounds=K ...]
//   vm_multihost SCENARIO ID --path=F --nonce=X     (smoke, kill)
//   vm_multihost inspect --path=F                    (key=value lines)
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

unsigned char* map_device(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    say("FAIL open %s: %s\n", path.c_str(), std::strerror(errno));
    return nullptr;
  }
  void* p = mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    say("FAIL mmap %s (2 MiB at offset 0, MAP_SHARED): %s\n", path.c_str(), std::strerror(e));
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

// ---- runner commands: set up and read back the layout ------------------------------------
int init(Ctx& c, const Args& args) {
  Header& h = c.l->h;
  std::memset(c.base, 0, kMapBytes);
  store(h.participants, args.num("participants", 3));
  store(h.iterations, args.num("iterations", 2000000));
  store(h.rounds, args.num("rounds", 1000));
  store(h.period_ms, args.num("period-ms", 10));
  store(h.misses, args.num("misses", 5));
  store(h.wait_s, args.num("wait-s", 60));
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
  }
  return 0;
}

struct Command {
  const char* name;
  int (*run)(Ctx&, const Args&);
  bool participant;  // takes an ID and joins the run (the header must be initialized)
};
constexpr Command kCommands[] = {
    {"init", init, false}, {"inspect", inspect, false}, {"smoke", scenario_smoke, true}, {"kill", scenario_kill, true}};

int usage() {
  std::fprintf(stderr,
               "usage: vm_multihost init|inspect --path=FILE [--key=value ...]\n"
               "       vm_multihost SCENARIO ID --path=DEVICE --nonce=N [--key=value ...]   (smoke, kill)\n");
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
  if (!cmd || !args.opt.count("path")) return usage();

  Ctx c;
  c.base = map_device(args.opt["path"]);
  if (!c.base) return 1;
  c.l = reinterpret_cast<Layout*>(c.base);
  if (!cmd->participant) {
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

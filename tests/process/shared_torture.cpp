// SPDX-License-Identifier: MIT
// kill -9 torture of a shared pool. Workers (separate processes, each a participant) allocate
// blocks carrying checksummed cookies, free them, export handles through a mailbox, import
// other workers' blocks under leases and verify their cookies. A supervisor SIGKILLs a random
// worker at a random instant, starts a new one, and every --check-every kills pauses the
// workers, waits for the dead to be recovered and runs the checker: it must find 0 leaked
// blocks, 0 dangling leases, 0 corrupt words; no worker may ever see a damaged cookie. With
// --hogs H, H busy processes compete for the CPUs the whole time; a worker evicted (declared
// dead while alive) fails the run beyond --max-evictions (default 0): workers of one host are
// judged by their process, and a lease (--lease-ms, default 100) far below the stalls of a
// saturated machine must not matter.
//
//   shared_torture [--iterations N] [--workers W] [--check-every K] [--seed S] [--hogs H|auto]
//                  [--lease-ms L] [--max-evictions E]
// Prints one summary line; exit 0 on success.
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/shared.h"

namespace {

constexpr int kMaxWorkers = 16;
constexpr int kBoxPerWorker = 8;
constexpr uint64_t kMagic = 0xC0FFEE5AFEB10C5ull;

struct BoxSlot {
  std::atomic<uint64_t> seq;  // odd while being written
  cxlpool_shared_handle_t handle;
};
struct Mailbox {
  std::atomic<int> pause;  // 1: workers stop at the next loop and acknowledge
  std::atomic<int> paused[kMaxWorkers];
  std::atomic<uint64_t> ops[kMaxWorkers];
  std::atomic<uint64_t> imports_verified;
  std::atomic<uint64_t> stale_imports;
  BoxSlot box[kMaxWorkers][kBoxPerWorker];
};

struct Cookie {
  uint64_t magic;
  uint32_t worker, seq;
  uint64_t size;
  uint32_t crc;
  uint32_t pad;
};

uint32_t crc(const uint8_t* p, size_t n, uint32_t seed) {
  uint32_t h = seed ^ 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

// Bytes covered by the cookie: the first and the last 4 KiB after the header.
void covered(uint8_t* block, uint64_t size, uint8_t** a, size_t* an, uint8_t** b, size_t* bn) {
  const uint64_t body = size - sizeof(Cookie);
  *a = block + sizeof(Cookie);
  *an = static_cast<size_t>(std::min<uint64_t>(body, 4096));
  *bn = body > 8192 ? 4096 : 0;
  *b = block + size - *bn;
}

void stamp(void* p, uint64_t size, uint32_t worker, uint32_t seq) {
  auto* block = static_cast<uint8_t*>(p);
  uint8_t *a, *b;
  size_t an, bn;
  covered(block, size, &a, &an, &b, &bn);
  for (size_t i = 0; i < an; ++i) a[i] = static_cast<uint8_t>(seq * 7 + i);
  for (size_t i = 0; i < bn; ++i) b[i] = static_cast<uint8_t>(seq * 13 + i);
  Cookie c{kMagic, worker, seq, size, crc(a, an, crc(b, bn, seq)), 0};
  std::memcpy(block, &c, sizeof c);
}

bool verify(const void* p, uint64_t usable) {
  auto* block = const_cast<uint8_t*>(static_cast<const uint8_t*>(p));
  Cookie c;
  std::memcpy(&c, block, sizeof c);
  if (c.magic != kMagic || c.size > usable || c.size < sizeof(Cookie)) return false;
  uint8_t *a, *b;
  size_t an, bn;
  covered(block, c.size, &a, &an, &b, &bn);
  return crc(a, an, crc(b, bn, c.seq)) == c.crc;
}

[[noreturn]] void die(int code, const char* what, cxlpool_status_t st) {
  fprintf(stderr, "shared_torture worker %d: %s: %s (%s)\n", getpid(), what, cxlpool_status_str(st),
          cxlpool_last_error_message());
  _exit(code);
}

void worker(const std::string& device, Mailbox* mb, int id, uint64_t seed) {
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_status_t st = cxlpool_shared_pool_open(device.c_str(), nullptr, &pool);
  if (st != CXLPOOL_OK) die(2, "open", st);
  std::mt19937_64 rng(seed);
  struct Mine {
    void* p;
    uint64_t size;
  };
  struct Held {
    void* p;
    size_t usable;
  };
  std::vector<Mine> mine;
  std::vector<Held> held;
  uint32_t seq = 0;
  for (;;) {
    if (mb->pause.load()) {
      mb->paused[id].store(1);
      while (mb->pause.load()) usleep(500);
      mb->paused[id].store(0);
    }
    mb->ops[id].fetch_add(1, std::memory_order_relaxed);
    const unsigned op = rng() % 100;
    if (op < 40 || mine.empty()) {  // allocate and stamp
      uint64_t size = 128 + rng() % 8192;
      if (rng() % 64 == 0) size = (1u << 20) + rng() % (1u << 20);  // a large block of whole extents
      void* p = nullptr;
      st = cxlpool_shared_alloc(pool, size, &p);
      if (st == CXLPOOL_E_CAPACITY) {
        if (!mine.empty()) {
          cxlpool_shared_free(pool, mine.back().p);
          mine.pop_back();
        }
        continue;
      }
      if (st != CXLPOOL_OK) die(st == CXLPOOL_E_EVICTED ? 3 : 4, "alloc", st);
      stamp(p, size, static_cast<uint32_t>(id), ++seq);
      mine.push_back({p, size});
    } else if (op < 70) {  // free one of ours (verify first)
      size_t k = rng() % mine.size();
      if (!verify(mine[k].p, mine[k].size)) die(99, "own block's cookie damaged", CXLPOOL_OK);
      st = cxlpool_shared_free(pool, mine[k].p);
      if (st != CXLPOOL_OK) die(st == CXLPOOL_E_EVICTED ? 3 : 4, "free", st);
      mine[k] = mine.back();
      mine.pop_back();
    } else if (op < 80) {  // export one of ours into our mailbox
      size_t k = rng() % mine.size();
      cxlpool_shared_handle_t h{};
      st = cxlpool_shared_export(pool, mine[k].p, &h);
      if (st != CXLPOOL_OK) die(st == CXLPOOL_E_EVICTED ? 3 : 4, "export", st);
      BoxSlot& s = mb->box[id][rng() % kBoxPerWorker];
      s.seq.fetch_add(1);
      s.handle = h;
      s.seq.fetch_add(1);
    } else if (op < 92) {  // import someone's exported block, verify, hold it
      BoxSlot& s = mb->box[rng() % kMaxWorkers][rng() % kBoxPerWorker];
      uint64_t before = s.seq.load();
      cxlpool_shared_handle_t h = s.handle;
      if ((before & 1) || before == 0 || s.seq.load() != before) continue;
      void* q = nullptr;
      size_t usable = 0;
      st = cxlpool_shared_import(pool, &h, &q, &usable);
      if (st == CXLPOOL_E_STALE || st == CXLPOOL_E_INVALID_ARGUMENT) {  // freed, or its extent moved on
        mb->stale_imports.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (st == CXLPOOL_E_CAPACITY) continue;  // lease table full
      if (st != CXLPOOL_OK) die(st == CXLPOOL_E_EVICTED ? 3 : 4, "import", st);
      if (!verify(q, usable)) die(99, "imported block's cookie damaged", CXLPOOL_OK);
      mb->imports_verified.fetch_add(1, std::memory_order_relaxed);
      held.push_back({q, usable});
    } else if (!held.empty()) {  // verify and release a held block
      size_t k = rng() % held.size();
      if (!verify(held[k].p, held[k].usable)) die(99, "held block's cookie damaged", CXLPOOL_OK);
      st = cxlpool_shared_release(pool, held[k].p);
      if (st != CXLPOOL_OK) die(st == CXLPOOL_E_EVICTED ? 3 : 4, "release", st);
      held[k] = held.back();
      held.pop_back();
    }
  }
}

// A busy process at our priority, gone with us (and after 10 minutes in any case).
pid_t hog() {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    alarm(600);
    for (unsigned long x = 0;; ++x) asm volatile("" : "+r"(x));
  }
  return pid;
}

pid_t spawn(const std::string& device, Mailbox* mb, int id, uint64_t seed) {
  pid_t pid = fork();
  if (pid == 0) {
    worker(device, mb, id, seed);
    _exit(0);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 300, workers = 4, check_every = 10, hogs = 0, lease_ms = 100, max_evictions = 0;
  uint64_t seed = static_cast<uint64_t>(time(nullptr));
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> long {
      if (i + 1 >= argc) {
        fprintf(stderr, "shared_torture: %s needs a value\n", a.c_str());
        exit(2);
      }
      char* end = nullptr;
      long v = strtol(argv[++i], &end, 10);
      const bool may_be_zero = a == "--hogs" || a == "--max-evictions";
      if (*end || v < 0 || (v == 0 && !may_be_zero)) {
        fprintf(stderr, "shared_torture: bad value \"%s\" for %s\n", argv[i], a.c_str());
        exit(2);
      }
      return v;
    };
    if (a == "--iterations")
      iterations = next();
    else if (a == "--workers")
      workers = std::min<long>(next(), kMaxWorkers);
    else if (a == "--check-every")
      check_every = next();
    else if (a == "--seed")
      seed = static_cast<uint64_t>(next());
    else if (a == "--hogs" && i + 1 < argc && std::string(argv[i + 1]) == "auto")
      hogs = (++i, std::clamp(2 * sysconf(_SC_NPROCESSORS_ONLN), 4L, 16L));  // two per CPU
    else if (a == "--hogs")
      hogs = next();
    else if (a == "--lease-ms")
      lease_ms = next();
    else if (a == "--max-evictions")
      max_evictions = next();
    else {
      fprintf(stderr,
              "usage: shared_torture [--iterations N] [--workers W] [--check-every K] [--seed S] [--hogs H] "
              "[--lease-ms L] [--max-evictions E]\n");
      return 2;
    }
  }
  const std::string name = "cxlpool-torture-" + std::to_string(getpid());
  const std::string device = "shm:" + name;
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_params_create(&params);
  cxlpool_shared_params_set_size(params, 64u << 20);
  cxlpool_shared_params_set_extent_size(params, 1u << 20);
  cxlpool_shared_params_set_leases(params, 256);
  // Deaths here are seen by the process at once; the lease only judges participants that cannot
  // be looked at (other hosts), so however short, it must not evict a starved worker here.
  cxlpool_shared_params_set_lease_timing(params, 10, static_cast<uint32_t>(std::max(30L, lease_ms)));
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params, 0, &pool);
  cxlpool_shared_params_destroy(params);
  if (st != CXLPOOL_OK) {
    fprintf(stderr, "shared_torture: create: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_shared_pool_close(pool);  // the supervisor is not a participant: it only kills and checks
  auto* mb =
      static_cast<Mailbox*>(mmap(nullptr, sizeof(Mailbox), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::vector<pid_t> hog_pids;
  for (long h = 0; h < hogs; ++h) hog_pids.push_back(hog());
  std::mt19937_64 rng(seed);
  std::vector<pid_t> pids(static_cast<size_t>(workers));
  for (long w = 0; w < workers; ++w) pids[size_t(w)] = spawn(device, mb, int(w), rng());
  int failures = 0, evictions = 0, checks = 0;
  auto t0 = std::chrono::steady_clock::now();
  double max_recovery_ms = 0;
  for (long it = 1; it <= iterations && failures == 0; ++it) {
    usleep(static_cast<useconds_t>(rng() % 20000));
    const size_t victim = rng() % pids.size();
    kill(pids[victim], SIGKILL);
    int status = 0;
    waitpid(pids[victim], &status, 0);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      if (code == 3) {
        ++evictions;  // declared dead while alive: counted, fails the run beyond --max-evictions
      } else {
        fprintf(stderr, "shared_torture: worker exited with %d before its kill\n", code);
        ++failures;
      }
    }
    pids[victim] = spawn(device, mb, int(victim), rng());
    if (it % check_every != 0 && it != iterations) continue;
    // Quiesce, wait for recovery of the dead, check every invariant.
    mb->pause.store(1);
    for (size_t w = 0; w < pids.size(); ++w) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!mb->paused[w].load() && std::chrono::steady_clock::now() < deadline) {
        int s2 = 0;
        if (waitpid(pids[w], &s2, WNOHANG) == pids[w]) {  // died on its own
          fprintf(stderr, "shared_torture: worker %zu exited (%d) while pausing\n", w,
                  WIFEXITED(s2) ? WEXITSTATUS(s2) : -WTERMSIG(s2));
          if (WIFEXITED(s2) && WEXITSTATUS(s2) == 3)
            ++evictions;
          else
            ++failures;
          pids[w] = spawn(device, mb, int(w), rng());
        }
        usleep(200);
      }
    }
    auto rs = std::chrono::steady_clock::now();
    cxlpool_shared_check_report_t r{};
    cxlpool_status_t cs;
    do {
      cs = cxlpool_shared_pool_check(device.c_str(), nullptr, 0, &r);
      // Final once the dead are recovered: until then a survivor may be adopting a dead owner's
      // large block (tails re-owned before the head), which a check in between sees as a tail
      // its head does not cover. What is wrong after recovery stays wrong and fails below.
    } while (cs == CXLPOOL_E_CORRUPT && (r.corrupt_words == 0 || r.dead_participants > 0) &&
             std::chrono::steady_clock::now() - rs < std::chrono::seconds(5) && (usleep(1000), true));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - rs).count();
    max_recovery_ms = std::max(max_recovery_ms, ms);
    ++checks;
    if (cs != CXLPOOL_OK) {
      fprintf(stderr,
              "shared_torture: check after kill %ld: %s: leaked %llu dangling %llu corrupt %llu orphans %llu dead %u\n",
              it, cxlpool_status_str(cs), (unsigned long long)r.leaked_blocks, (unsigned long long)r.dangling_leases,
              (unsigned long long)r.corrupt_words, (unsigned long long)r.orphan_extents, r.dead_participants);
      ++failures;
      if (getenv("CXLPOOL_TORTURE_KEEP")) {  // freeze the scene for a post-mortem
        for (pid_t pid : pids) kill(pid, SIGSTOP);
        fprintf(stderr, "shared_torture: workers stopped; pool /dev/shm/%s\n", name.c_str());
        pause();
      }
    }
    mb->pause.store(0);
  }
  for (pid_t pid : pids) kill(pid, SIGKILL);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  for (pid_t pid : hog_pids) kill(pid, SIGKILL);
  for (pid_t pid : hog_pids) waitpid(pid, nullptr, 0);
  if (evictions > max_evictions) {
    fprintf(stderr, "shared_torture: %d live workers were evicted (at most %ld allowed)\n", evictions, max_evictions);
    ++failures;
  }
  // Nobody alive: a repair recovers the last victims; the pool must then be empty and whole.
  cxlpool_shared_check_report_t r{};
  st = cxlpool_shared_pool_check(device.c_str(), nullptr, 1, &r);
  if (st != CXLPOOL_OK || r.blocks_in_use != 0 || r.extents_free != r.extents_total) {
    fprintf(stderr, "shared_torture: final repair+check: %s, %llu blocks in use, %llu/%llu extents free\n",
            cxlpool_status_str(st), (unsigned long long)r.blocks_in_use, (unsigned long long)r.extents_free,
            (unsigned long long)r.extents_total);
    ++failures;
  }
  uint64_t ops = 0;
  for (long w = 0; w < workers; ++w) ops += mb->ops[w].load();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf(
      "shared_torture: %ld kills, %d checks, %llu operations, %llu imports verified, %llu stale imports refused, "
      "%d evictions, %ld CPU hogs, max wait for recovery+check %.1f ms, %.1f s, seed %llu: %s\n",
      iterations, checks, (unsigned long long)ops, (unsigned long long)mb->imports_verified.load(),
      (unsigned long long)mb->stale_imports.load(), evictions, hogs, max_recovery_ms, secs, (unsigned long long)seed,
      failures ? "FAILED" : "ok");
  if (failures && getenv("CXLPOOL_TORTURE_KEEP"))
    fprintf(stderr, "shared_torture: pool kept at /dev/shm/%s\n", name.c_str());
  else
    cxlpool_shared_pool_unlink(device.c_str());
  return failures ? 1 : 0;
}

// SPDX-License-Identifier: MIT
// Composition through the C ABI (include/cxlpool/compose.h): grants that move capacity between
// a shared pool's quotas, enforced on the quotas' participants; reclaims that wait for them and
// never take a live block; composers racing each other and claimers; composers killed at
// random points. The invariant every test checks: sum over quotas of max(granted, owned) is at
// most the pool's extents, and no extent has two owners (cxlpool_shared_pool_check).
#include "cxlpool/compose.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shared/compose_plan.hpp"  // the policy, a pure function
#include "shared/layout.hpp"        // claim and grant words, written here as another participant would
#include "shared_support.hpp"

namespace {

struct Pool {
  std::string name, device;
  explicit Pool(const char* tag, uint64_t size = 40u << 20) : name(unique_name(tag)), device("shm:" + name) {
    Params params(size);
    REQUIRE(cxlpool_shared_params_add_quota(params.p, "a", 8u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_add_quota(params.p, "b", 8u << 20) == CXLPOOL_OK);
    cxlpool_shared_pool_t* creator = nullptr;
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &creator) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_close(creator) == CXLPOOL_OK);
  }
  ~Pool() { unlink(("/dev/shm/" + name).c_str()); }
  cxlpool_shared_pool_t* open(const char* quota = "default") const {
    Params qp;
    REQUIRE(cxlpool_shared_params_set_quota(qp.p, quota) == CXLPOOL_OK);
    cxlpool_shared_pool_t* p = nullptr;
    REQUIRE(cxlpool_shared_pool_open(device.c_str(), qp.p, &p) == CXLPOOL_OK);
    return p;
  }
};

cxlpool_compose_state_t state_of(cxlpool_shared_pool_t* p) {
  cxlpool_compose_state_t s{};
  REQUIRE(cxlpool_compose_get_state(p, 10000, &s) == CXLPOOL_OK);
  return s;
}

const cxlpool_compose_quota_t& quota_of(const cxlpool_compose_state_t& s, const char* name) {
  for (uint32_t q = 0; q < s.quota_count; ++q)
    if (std::string(s.quotas[q].name) == name) return s.quotas[q];
  FAIL("no quota " << name);
  return s.quotas[0];
}

// The composer's invariant, from a state read now.
uint64_t counted(const cxlpool_compose_state_t& s) {
  uint64_t sum = 0;
  for (uint32_t q = 0; q < s.quota_count; ++q) sum += std::max(s.quotas[q].granted_extents, s.quotas[q].used_extents);
  return sum;
}

std::string last_error() { return cxlpool_last_error_message(); }

// Allocates one-extent blocks until the quota refuses; returns them.
std::vector<void*> fill(cxlpool_shared_pool_t* p, cxlpool_status_t* last) {
  std::vector<void*> out;
  void* b = nullptr;
  while ((*last = cxlpool_shared_alloc(p, 1u << 20, &b)) == CXLPOOL_OK) out.push_back(b);
  return out;
}

// The checker finds nothing wrong. It recovers participants a test killed (that is all it
// may repair: a word it had to restore or reset is a failure).
bool pool_consistent(const std::string& device) {
  cxlpool_shared_check_report_t r{};
  const cxlpool_status_t st = cxlpool_shared_pool_check(device.c_str(), nullptr, 1, &r);
  if (st != CXLPOOL_OK) UNSCOPED_INFO("check: " << last_error());
  UNSCOPED_INFO("repaired " << r.words_repaired << ", reset " << r.words_reset << ", reformatted "
                            << r.extents_reformatted << ", lost " << r.blocks_lost);
  return st == CXLPOOL_OK && r.words_repaired == 0 && r.words_reset == 0 && r.extents_reformatted == 0 &&
         r.blocks_lost == 0 && r.extents_free == r.extents_total;
}

namespace L = cxlpool::detail::shared;

// The pool's metadata mapped by the test itself: its superblock, and the words a participant
// or a scribbler writes.
struct Raw {
  int fd = -1;
  void* base = MAP_FAILED;
  size_t len = 0;
  L::Superblock sb{};
  explicit Raw(const std::string& name) {
    fd = ::open(("/dev/shm/" + name).c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(pread(fd, &sb, sizeof sb, 0) == ssize_t(sizeof sb));
    len = sb.extents_offset;
    base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(base != MAP_FAILED);
  }
  ~Raw() {
    munmap(base, len);
    close(fd);
  }
  uint64_t salt() const { return sb.pool_id[0] ^ sb.pool_id[1]; }
  uint64_t* claim_word(uint32_t slot, uint32_t word) const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base) + sb.slots_offset + slot * L::kSlotBytes +
                                       2 * L::kLine) +
           word;
  }
  uint64_t* grant_word(uint32_t quota) const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base) + L::kGrantOffset) + quota;
  }
  // As participant `slot` would while it claims: kind (and a quota + 1, or 0).
  void set_claim(uint32_t slot, L::ClaimKind kind, uint32_t quota_plus_one) const {
    __atomic_store_n(claim_word(slot, 1), L::encode_quota_claim(quota_plus_one, slot, salt()), __ATOMIC_SEQ_CST);
    __atomic_store_n(claim_word(slot, 0), L::encode_claim(kind, 0, 1, slot, salt()), __ATOMIC_SEQ_CST);
  }
  // Slot's participant inside a writing operation (its mark odd) when recoverer's recovery of
  // it begins (the eviction word, phase Recovering): recovery then waits for the operation.
  void set_recovering(uint32_t slot, uint32_t recoverer) const {
    auto* line0 = reinterpret_cast<L::SlotLine0*>(static_cast<char*>(base) + sb.slots_offset + slot * L::kSlotBytes);
    auto* line1 = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(line0) + L::kLine);
    auto* rline0 =
        reinterpret_cast<L::SlotLine0*>(static_cast<char*>(base) + sb.slots_offset + recoverer * L::kSlotBytes);
    uint32_t inc = 0, rinc = 0;
    L::SlotState state{};
    REQUIRE(L::decode_slot_identity(__atomic_load_n(&line0->identity, __ATOMIC_SEQ_CST), slot, salt(), &inc, &state));
    REQUIRE(L::decode_slot_identity(__atomic_load_n(&rline0->identity, __ATOMIC_SEQ_CST), recoverer, salt(), &rinc,
                                    &state));
    __atomic_store_n(&line0->op_seq, (uint64_t{inc} << 32) | 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(line1 + 1, (uint64_t{rinc} << 32) | (recoverer + 1), __ATOMIC_SEQ_CST);
    __atomic_store_n(line1, L::encode_eviction(inc, L::kEvictRecovering, slot, salt()), __ATOMIC_SEQ_CST);
  }
  void clear_claim(uint32_t slot) const {
    __atomic_store_n(claim_word(slot, 0), 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(claim_word(slot, 1), 0, __ATOMIC_SEQ_CST);
  }
};

uint32_t slot_of(cxlpool_shared_pool_t* p) {
  cxlpool_shared_info_t i{};
  REQUIRE(cxlpool_shared_pool_info(p, &i) == CXLPOOL_OK);
  return i.slot;
}

}  // namespace

TEST_CASE("compose: grants move capacity between quotas and never past the pool", "[compose]") {
  Pool pool("grant");
  cxlpool_shared_pool_t* c = pool.open();
  const cxlpool_compose_state_t s0 = state_of(c);
  const uint64_t n = s0.extents_total;
  REQUIRE(n > 20);
  CHECK(s0.extents_unassigned == 0);  // the quotas as created add up to the pool
  CHECK(quota_of(s0, "a").granted_extents == 8);
  CHECK(quota_of(s0, "a").reserved_extents == 8);
  CHECK(quota_of(s0, "a").grant_set == 0);
  CHECK(quota_of(s0, "default").granted_extents == n - 16);

  // Nothing unassigned: refused, nothing changed.
  CHECK(cxlpool_compose_grant(c, "a", 1, 1000) == CXLPOOL_E_CAPACITY);
  CHECK(last_error().find("0 of " + std::to_string(n) + " unassigned") != std::string::npos);
  CHECK(quota_of(state_of(c), "a").granted_extents == 8);
  // Bad arguments.
  CHECK(cxlpool_compose_grant(c, "nope", 1, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(last_error().find("\"nope\"") != std::string::npos);
  CHECK(cxlpool_compose_grant(c, "a", 0, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_compose_grant(c, nullptr, 1, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_compose_grant(nullptr, "a", 1, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_compose_reclaim(c, "b", 9, 0, 1000, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(last_error().find("granted 8 extents") != std::string::npos);
  CHECK(cxlpool_compose_get_state(c, 1000, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);

  // From default (unused) to a: reclaimed at once, then granted.
  uint64_t got = 99;
  CHECK(cxlpool_compose_reclaim(c, "default", 4, 0, 1000, &got) == CXLPOOL_OK);
  CHECK(got == 4);
  CHECK(state_of(c).extents_unassigned == 4);
  CHECK(cxlpool_compose_grant(c, "a", 5, 1000) == CXLPOOL_E_CAPACITY);
  REQUIRE(cxlpool_compose_grant(c, "a", 4, 1000) == CXLPOOL_OK);
  const cxlpool_compose_state_t s1 = state_of(c);
  CHECK(quota_of(s1, "a").granted_extents == 12);
  CHECK(quota_of(s1, "a").grant_set == 1);
  CHECK(quota_of(s1, "default").granted_extents == n - 20);
  CHECK(s1.extents_unassigned == 0);
  CHECK(counted(s1) == n);

  // The quota's participants follow: a owns exactly 12 now, default no more than its grant.
  cxlpool_shared_pool_t* a = pool.open("a");
  cxlpool_status_t last{};
  std::vector<void*> held = fill(a, &last);
  CHECK(last == CXLPOOL_E_CAPACITY);
  CHECK(last_error().find("quota \"a\" is full (12 extents") != std::string::npos);
  CHECK(held.size() == 12);
  cxlpool_shared_info_t ia{};
  REQUIRE(cxlpool_shared_pool_info(a, &ia) == CXLPOOL_OK);
  CHECK(ia.quota_extents_max == 12);
  std::vector<void*> d = fill(c, &last);
  CHECK(d.size() == n - 20);
  for (void* x : d) REQUIRE(cxlpool_shared_free(c, x) == CXLPOOL_OK);
  for (void* x : held) REQUIRE(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: a reclaim takes what the quota gives back and never a live block", "[compose]") {
  Pool pool("reclaim");
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* a = pool.open("a");
  cxlpool_status_t last{};
  std::vector<void*> held = fill(a, &last);
  REQUIRE(held.size() == 8);

  // Everything in use: at the deadline nothing is taken and the grant covers what a holds.
  uint64_t got = 99;
  CHECK(cxlpool_compose_reclaim(c, "a", 4, 50, 1000, &got) == CXLPOOL_E_BUSY);
  CHECK(got == 0);
  CHECK(last_error().find("still held 4 of the 4 extents") != std::string::npos);
  cxlpool_compose_state_t s = state_of(c);
  CHECK(quota_of(s, "a").granted_extents == 8);
  CHECK(quota_of(s, "a").used_extents == 8);
  CHECK(s.extents_unassigned == 0);

  // Two freed: the reclaim takes those two, and the grant keeps the other six.
  for (int i = 0; i < 2; ++i) {
    REQUIRE(cxlpool_shared_free(a, held.back()) == CXLPOOL_OK);
    held.pop_back();
  }
  CHECK(cxlpool_compose_reclaim(c, "a", 4, 50, 1000, &got) == CXLPOOL_E_BUSY);
  CHECK(got == 2);
  s = state_of(c);
  CHECK(quota_of(s, "a").granted_extents == 6);
  CHECK(s.extents_unassigned == 2);
  for (void* x : held) {
    std::memset(x, 0x5a, 1u << 20);  // the blocks a still holds are whole and its own
  }

  // All freed: the next reclaim completes, and a cannot grow past its new grant.
  for (void* x : held) REQUIRE(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  held.clear();
  CHECK(cxlpool_compose_reclaim(c, "a", 4, 10000, 1000, &got) == CXLPOOL_OK);
  CHECK(got == 4);
  held = fill(a, &last);
  CHECK(held.size() == 2);
  CHECK(last == CXLPOOL_E_CAPACITY);
  for (void* x : held) REQUIRE(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  s = state_of(c);
  CHECK(s.extents_unassigned == 6);
  CHECK(counted(s) == s.extents_total - 6);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: a reclaim at its deadline undoes only its own lowering", "[compose]") {
  Pool pool("two-reclaims");
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* c2 = pool.open();
  cxlpool_shared_pool_t* a = pool.open("a");
  REQUIRE(cxlpool_compose_reclaim(c, "default", 4, 0, 1000, nullptr) == CXLPOOL_OK);
  REQUIRE(cxlpool_compose_grant(c, "a", 4, 1000) == CXLPOOL_OK);  // a: 12
  cxlpool_status_t last{};
  std::vector<void*> held = fill(a, &last);
  REQUIRE(held.size() == 12);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(cxlpool_shared_free(a, held.back()) == CXLPOOL_OK);
    held.pop_back();
  }
  // The first reclaim (8, waiting up to 60 s) lowers a to 4; the second (2, no wait) to 2, and
  // at its deadline raises it back by its own 2 only: to 4, not to the 10 a holds.
  uint64_t got1 = 0;
  cxlpool_status_t st1{};
  std::thread first([&] { st1 = cxlpool_compose_reclaim(c, "a", 8, 60000, 10000, &got1); });
  while (quota_of(state_of(c2), "a").granted_extents != 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  uint64_t got2 = 99;
  CHECK(cxlpool_compose_reclaim(c2, "a", 2, 0, 10000, &got2) == CXLPOOL_E_BUSY);
  CHECK(got2 == 0);
  CHECK(quota_of(state_of(c2), "a").granted_extents == 4);
  // a frees down to 4: the first reclaim completes, having taken its 8.
  while (held.size() > 4) {
    REQUIRE(cxlpool_shared_free(a, held.back()) == CXLPOOL_OK);
    held.pop_back();
  }
  first.join();
  CHECK(st1 == CXLPOOL_OK);
  CHECK(got1 == 8);
  CHECK(quota_of(state_of(c2), "a").granted_extents == 4);
  for (void* x : held) REQUIRE(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  for (cxlpool_shared_pool_t* p : {a, c2, c}) cxlpool_shared_pool_close(p);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: a busy participant gives back what it keeps for speed when its grant is lowered", "[compose]") {
  // a's thread allocates and frees small blocks without pause: its class is never idle, so
  // only the lowered grant can make it give back the extent its block cache keeps.
  Pool pool("follow");
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* a = pool.open("a");
  void* big = nullptr;
  REQUIRE(cxlpool_shared_alloc(a, 1u << 20, &big) == CXLPOOL_OK);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, refused{0};
  std::thread busy([&] {
    while (!stop.load()) {
      void* x = nullptr;
      if (cxlpool_shared_alloc(a, 64, &x) == CXLPOOL_OK) {
        ok.fetch_add(1);
        cxlpool_shared_free(a, x);
      } else {
        refused.fetch_add(1);
      }
    }
  });
  while (ok.load() < 1000) std::this_thread::yield();
  CHECK(quota_of(state_of(c), "a").used_extents == 2);
  uint64_t got = 0;
  // Down to the one extent of the live large block: the small extent must go back.
  const cxlpool_status_t st = cxlpool_compose_reclaim(c, "a", 7, 30000, 30000, &got);
  stop.store(true);
  busy.join();
  CHECK(st == CXLPOOL_OK);
  CHECK(got == 7);
  CHECK(refused.load() > 0);  // the busy thread found its quota full afterwards
  CHECK(quota_of(state_of(c), "a").used_extents <= 1);
  CHECK(cxlpool_shared_free(a, big) == CXLPOOL_OK);
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: racing composers and allocating participants keep the invariant", "[compose]") {
  Pool pool("race");
  const uint64_t n = [&] {
    cxlpool_shared_pool_t* c = pool.open();
    const uint64_t total = state_of(c).extents_total;
    cxlpool_shared_pool_close(c);  // no participant here while the children fork
    return total;
  }();
  std::vector<pid_t> kids;
  // Four composers moving extents at random among the quotas, two participants (a, b)
  // allocating and freeing up to whatever their grants are at the moment.
  for (int k = 0; k < 6; ++k) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      Params qp;
      const char* quotas[] = {"default", "a", "b"};
      if (cxlpool_shared_params_set_quota(qp.p, k < 4 ? "default" : quotas[k - 3]) != CXLPOOL_OK) _exit(100);
      cxlpool_shared_pool_t* p = nullptr;
      if (cxlpool_shared_pool_open(pool.device.c_str(), qp.p, &p) != CXLPOOL_OK) _exit(101);
      std::minstd_rand rng(static_cast<uint32_t>(getpid()));
      std::vector<void*> mine;
      for (int op = 0; op < 1000; ++op) {
        if (k < 4) {
          const char* q = quotas[rng() % 3];
          const uint64_t count = 1 + rng() % 3;
          const cxlpool_status_t st = rng() % 2 ? cxlpool_compose_grant(p, q, count, 10000)
                                                : cxlpool_compose_reclaim(p, q, count, 0, 10000, nullptr);
          if (st != CXLPOOL_OK && st != CXLPOOL_E_CAPACITY && st != CXLPOOL_E_BUSY && st != CXLPOOL_E_INVALID_ARGUMENT)
            _exit(102);
          cxlpool_compose_state_t s{};
          if (cxlpool_compose_get_state(p, 10000, &s) != CXLPOOL_OK) _exit(103);
          if (counted(s) > s.extents_total || s.overcommitted) _exit(104);
        } else {
          void* b = nullptr;
          if (rng() % 3 != 0 && cxlpool_shared_alloc(p, 1u << 20, &b) == CXLPOOL_OK) {
            mine.push_back(b);
          } else if (!mine.empty()) {
            if (cxlpool_shared_free(p, mine.back()) != CXLPOOL_OK) _exit(105);
            mine.pop_back();
          }
        }
      }
      for (void* b : mine) cxlpool_shared_free(p, b);
      cxlpool_shared_pool_close(p);
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) CHECK(wait_exit(pid) == 0);
  cxlpool_shared_pool_t* c = pool.open();
  const cxlpool_compose_state_t s = state_of(c);
  CHECK(counted(s) <= n);
  CHECK(s.extents_over_grant == 0);
  for (uint32_t q = 0; q < s.quota_count; ++q) CHECK(s.quotas[q].used_extents == 0);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: composers killed at random points lose no extent and grant none twice", "[compose]") {
  Pool pool("kill");
  std::minstd_rand rng(static_cast<uint32_t>(getpid()));
  const char* quotas[] = {"default", "a", "b"};
  uint64_t n = 0;
  for (int round = 0; round < 100; ++round) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      cxlpool_shared_pool_t* p = nullptr;
      if (cxlpool_shared_pool_open(pool.device.c_str(), nullptr, &p) != CXLPOOL_OK) _exit(101);
      std::minstd_rand r(static_cast<uint32_t>(getpid()));
      for (;;) {
        const char* q = quotas[r() % 3];
        if (r() % 2)
          cxlpool_compose_grant(p, q, 1 + r() % 4, 10000);
        else
          cxlpool_compose_reclaim(p, q, 1 + r() % 4, 0, 10000, nullptr);
      }
    }
    // Killed anywhere: while joining, holding the compose claim, between its two stores.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    kill(pid, SIGKILL);
    CHECK(wait_exit(pid) == 128 + SIGKILL);
    if (round % 10 == 9) {
      cxlpool_shared_pool_t* c = pool.open();
      const cxlpool_compose_state_t s = state_of(c);
      n = s.extents_total;
      CHECK(counted(s) <= s.extents_total);
      CHECK(!s.overcommitted);
      for (uint32_t q = 0; q < s.quota_count; ++q) CHECK(s.quotas[q].grant_damaged == 0);
      cxlpool_shared_pool_close(c);
    }
  }
  // A new composer resumes: every extent is granted again (nothing was lost), then used.
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_compose_state_t s = state_of(c);
  if (s.extents_unassigned > 0) REQUIRE(cxlpool_compose_grant(c, "b", s.extents_unassigned, 10000) == CXLPOOL_OK);
  s = state_of(c);
  CHECK(s.extents_unassigned == 0);
  uint64_t granted = 0;
  for (uint32_t q = 0; q < s.quota_count; ++q) granted += s.quotas[q].granted_extents;
  CHECK(granted == n);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: the compose claim excludes other composers and the lowered quota's claimers", "[compose]") {
  Pool pool("claim");
  Raw raw(pool.name);
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* other = pool.open();  // a live participant whose claim words the test writes
  cxlpool_shared_pool_t* a = pool.open("a");
  cxlpool_shared_pool_t* b = pool.open("b");
  const uint32_t s2 = slot_of(other);

  // Another composer holds the claim: every compose call waits, then says who holds it.
  raw.set_claim(s2, L::kClaimCompose, 0);
  CHECK(cxlpool_compose_reclaim(c, "default", 1, 0, 100, nullptr) == CXLPOOL_E_BUSY);
  CHECK(last_error().find("by slot " + std::to_string(s2)) != std::string::npos);
  cxlpool_compose_state_t s{};
  CHECK(cxlpool_compose_get_state(c, 100, &s) == CXLPOOL_E_BUSY);
  // ... but no allocation: a composer that only raises grants excludes no claimer.
  void* x = nullptr;
  REQUIRE(cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_OK);
  REQUIRE(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  raw.clear_claim(s2);
  REQUIRE(cxlpool_compose_reclaim(c, "default", 1, 0, 100, nullptr) == CXLPOOL_OK);

  // A claimer of quota a's extents (another participant of a, counting): a reclaim from a
  // waits for it; a reclaim from another quota does not.
  raw.set_claim(s2, L::kClaimExtents, 1 + 1);
  CHECK(cxlpool_compose_reclaim(c, "a", 1, 0, 100, nullptr) == CXLPOOL_E_BUSY);
  CHECK(cxlpool_compose_reclaim(c, "b", 1, 0, 100, nullptr) == CXLPOOL_OK);
  CHECK(cxlpool_compose_grant(c, "a", 2, 100) == CXLPOOL_OK);  // raising excludes no claimer
  raw.clear_claim(s2);

  // A composer lowering a's grant: a's participants may not claim extents meanwhile (they
  // would count against the old grant), b's may.
  raw.set_claim(s2, L::kClaimCompose, 1 + 1);
  CHECK(cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_E_CAPACITY);
  void* y = nullptr;
  CHECK(cxlpool_shared_alloc(b, 1u << 20, &y) == CXLPOOL_OK);
  raw.clear_claim(s2);
  REQUIRE(cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_OK);
  CHECK(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  CHECK(cxlpool_shared_free(b, y) == CXLPOOL_OK);

  // A participant evicted while it holds a claim (stopped past its timeout inside its
  // operation, its recovery begun but held off until the operation ends) still holds it:
  // nobody composes on a snapshot it might overwrite when it resumes, nor claims what it was
  // claiming. Once its recovery has ended, its words count for nothing.
  raw.set_claim(s2, L::kClaimCompose, 0);
  raw.set_recovering(s2, slot_of(c));
  CHECK(cxlpool_compose_grant(c, "a", 1, 100) == CXLPOOL_E_BUSY);
  raw.set_claim(s2, L::kClaimExtents, 1 + 1);
  CHECK(cxlpool_compose_reclaim(c, "a", 1, 0, 100, nullptr) == CXLPOOL_E_BUSY);
  CHECK(cxlpool_compose_reclaim(c, "b", 1, 0, 100, nullptr) == CXLPOOL_OK);
  raw.clear_claim(s2);
  for (cxlpool_shared_pool_t* p : {b, a, other, c}) cxlpool_shared_pool_close(p);
  CHECK(pool_consistent(pool.device));
}

TEST_CASE("compose: a policy's fields are set apart, and a torn policy is seen and repaired", "[compose]") {
  Pool pool("policy-words");
  Raw raw(pool.name);
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_compose_policy_t p{};
  p.min_extents = 3;
  REQUIRE(cxlpool_compose_set_policy(c, "a", &p, CXLPOOL_COMPOSE_POLICY_MIN, 1000) == CXLPOOL_OK);
  p = {};
  p.priority = 7;
  REQUIRE(cxlpool_compose_set_policy(c, "a", &p, CXLPOOL_COMPOSE_POLICY_PRIORITY, 1000) == CXLPOOL_OK);
  const cxlpool_compose_quota_t qa = quota_of(state_of(c), "a");
  CHECK(qa.min_extents == 3);  // kept: only the priority was set
  CHECK(qa.priority == 7);
  CHECK(cxlpool_compose_set_policy(c, "a", &p, 8, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  // A crash between the two stores: the first word new, the second old.
  uint64_t* w = reinterpret_cast<uint64_t*>(static_cast<char*>(raw.base) + L::kPolicyOffset) + 2 * 1;
  L::QuotaPolicy next;
  next.min_extents = 4;
  next.max_extents = 6;
  uint64_t words[2];
  L::encode_policy(next, 1, raw.salt(), words);
  __atomic_store_n(&w[0], words[0], __ATOMIC_SEQ_CST);
  const cxlpool_compose_quota_t torn = quota_of(state_of(c), "a");
  CHECK(torn.policy_damaged == 1);
  CHECK(torn.min_extents == 0);  // read as none, never as a mix of the two
  cxlpool_shared_pool_close(c);
  cxlpool_shared_check_report_t r{};
  CHECK(cxlpool_shared_pool_check(pool.device.c_str(), nullptr, 0, &r) == CXLPOOL_E_CORRUPT);
  CHECK(r.corrupt_words == 1);
  CHECK(cxlpool_shared_pool_check(pool.device.c_str(), nullptr, 1, &r) == CXLPOOL_OK);
  CHECK(r.words_reset == 2);
  c = pool.open();
  CHECK(quota_of(state_of(c), "a").policy_damaged == 0);
  cxlpool_shared_pool_close(c);
}

TEST_CASE("compose: a damaged grant word stops its quota growing until a repair resets it", "[compose]") {
  Pool pool("damaged");
  Raw raw(pool.name);
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* a = pool.open("a");
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {
    void* x = nullptr;
    REQUIRE(cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_OK);
    held.push_back(x);
  }
  __atomic_store_n(raw.grant_word(1), 0x1234567890abcdefull, __ATOMIC_SEQ_CST);  // fails its check
  cxlpool_compose_state_t s = state_of(c);
  CHECK(quota_of(s, "a").grant_damaged == 1);
  CHECK(quota_of(s, "a").granted_extents == 0);
  CHECK(quota_of(s, "a").used_extents == 3);
  CHECK(s.extents_unassigned == 8 - 3);  // the rest of a's old grant: a counts as what it holds
  void* x = nullptr;
  CHECK(cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_E_CORRUPT);
  CHECK(last_error().find("grant word of quota \"a\" is damaged") != std::string::npos);
  CHECK(cxlpool_compose_grant(c, "b", 1, 1000) == CXLPOOL_E_CORRUPT);  // no grant on a damaged pool
  CHECK(cxlpool_compose_reclaim(c, "a", 1, 0, 1000, nullptr) == CXLPOOL_E_CORRUPT);
  for (void* h : held) CHECK(cxlpool_shared_free(a, h) == CXLPOOL_OK);  // what a holds stays usable
  cxlpool_shared_pool_close(a);
  cxlpool_shared_pool_close(c);

  cxlpool_shared_check_report_t r{};
  CHECK(cxlpool_shared_pool_check(pool.device.c_str(), nullptr, 0, &r) == CXLPOOL_E_CORRUPT);
  CHECK(r.corrupt_words == 1);
  CHECK(cxlpool_shared_pool_check(pool.device.c_str(), nullptr, 1, &r) == CXLPOOL_OK);
  CHECK(r.words_reset == 1);
  c = pool.open();
  s = state_of(c);
  CHECK(quota_of(s, "a").grant_damaged == 0);
  CHECK(quota_of(s, "a").granted_extents == 0);  // what a held then: nothing
  CHECK(s.extents_unassigned == 8);
  REQUIRE(cxlpool_compose_grant(c, "a", 8, 1000) == CXLPOOL_OK);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

namespace {
// Opens device on quota with key (nullptr: none given) and returns the status; closes a pool
// that opened.
cxlpool_status_t open_with_key(const std::string& device, const char* quota, const char* key) {
  Params qp;
  REQUIRE(cxlpool_shared_params_set_quota(qp.p, quota) == CXLPOOL_OK);
  if (key) REQUIRE(cxlpool_shared_params_set_quota_key(qp.p, key) == CXLPOOL_OK);
  cxlpool_shared_pool_t* p = nullptr;
  const cxlpool_status_t st = cxlpool_shared_pool_open(device.c_str(), qp.p, &p);
  if (st == CXLPOOL_OK) cxlpool_shared_pool_close(p);
  return st;
}
struct EnvKey {  // CXLPOOL_QUOTA_KEY for the length of a scope
  explicit EnvKey(const char* v) { setenv("CXLPOOL_QUOTA_KEY", v, 1); }
  ~EnvKey() { unsetenv("CXLPOOL_QUOTA_KEY"); }
};
}  // namespace

TEST_CASE("compose: a locked quota is joined only with its key, from params or the environment", "[compose]") {
  unsetenv("CXLPOOL_QUOTA_KEY");
  Pool pool("keys");
  Pool other("keys2");
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_shared_pool_t* early = pool.open("a");  // joined before the lock: stays
  char key[CXLPOOL_QUOTA_KEY_SIZE] = {};
  REQUIRE(cxlpool_compose_lock_quota(c, "a", 1000, key) == CXLPOOL_OK);
  CHECK(strlen(key) == 32);
  CHECK(quota_of(state_of(c), "a").locked == 1);
  CHECK(quota_of(state_of(c), "b").locked == 0);

  CHECK(open_with_key(pool.device, "a", nullptr) == CXLPOOL_E_PERMISSION);
  CHECK(last_error().find("quota \"a\" is locked: this program was not given its key") != std::string::npos);
  CHECK(open_with_key(pool.device, "a", key) == CXLPOOL_OK);
  CHECK(open_with_key(pool.device, "b", nullptr) == CXLPOOL_OK);  // b is not locked
  std::string wrong = key;
  wrong[5] = wrong[5] == '0' ? '1' : '0';
  CHECK(open_with_key(pool.device, "a", wrong.c_str()) == CXLPOOL_E_PERMISSION);
  CHECK(last_error().find("the key given is not its key") != std::string::npos);
  {
    EnvKey env(key);
    CHECK(open_with_key(pool.device, "a", nullptr) == CXLPOOL_OK);
  }
  {
    EnvKey env("not-a-key");
    CHECK(open_with_key(pool.device, "a", nullptr) == CXLPOOL_E_PERMISSION);
    CHECK(last_error().find("CXLPOOL_QUOTA_KEY is not a quota key") != std::string::npos);
  }
  Params bad;
  CHECK(cxlpool_shared_params_set_quota_key(bad.p, "abc") == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_shared_params_set_quota_key(bad.p, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);

  // A key opens only the quota and the pool it was made for.
  cxlpool_shared_pool_t* oc = other.open();
  char other_key[CXLPOOL_QUOTA_KEY_SIZE] = {};
  REQUIRE(cxlpool_compose_lock_quota(oc, "a", 1000, other_key) == CXLPOOL_OK);
  CHECK(open_with_key(other.device, "a", key) == CXLPOOL_E_PERMISSION);
  CHECK(open_with_key(other.device, "a", other_key) == CXLPOOL_OK);
  REQUIRE(cxlpool_compose_lock_quota(c, "b", 1000, other_key) == CXLPOOL_OK);
  CHECK(open_with_key(pool.device, "b", key) == CXLPOOL_E_PERMISSION);
  cxlpool_shared_pool_close(oc);

  // Locking again makes a new key; the old one stops working; those joined stay.
  char again[CXLPOOL_QUOTA_KEY_SIZE] = {};
  REQUIRE(cxlpool_compose_lock_quota(c, "a", 1000, again) == CXLPOOL_OK);
  CHECK(std::string(again) != key);
  CHECK(open_with_key(pool.device, "a", key) == CXLPOOL_E_PERMISSION);
  CHECK(open_with_key(pool.device, "a", again) == CXLPOOL_OK);
  void* x = nullptr;
  CHECK(cxlpool_shared_alloc(early, 4096, &x) == CXLPOOL_OK);
  CHECK(cxlpool_shared_free(early, x) == CXLPOOL_OK);

  // A damaged key word: nobody joins, with a message saying how to mend it; locking mends it.
  Raw raw(pool.name);
  auto* key_word = reinterpret_cast<uint64_t*>(static_cast<char*>(raw.base) + L::kKeyOffset) + 1;
  __atomic_store_n(key_word, __atomic_load_n(key_word, __ATOMIC_SEQ_CST) ^ (uint64_t{1} << 40), __ATOMIC_SEQ_CST);
  CHECK(quota_of(state_of(c), "a").key_damaged == 1);
  CHECK(open_with_key(pool.device, "a", again) == CXLPOOL_E_CORRUPT);
  CHECK(last_error().find("fails its check; lock it again") != std::string::npos);
  REQUIRE(cxlpool_compose_lock_quota(c, "a", 1000, again) == CXLPOOL_OK);
  CHECK(open_with_key(pool.device, "a", again) == CXLPOOL_OK);

  // A participant that joined a locked quota with its key is a tenant: it reads the grants
  // but changes nothing, keys least of all.
  {
    Params tp;
    REQUIRE(cxlpool_shared_params_set_quota(tp.p, "a") == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_quota_key(tp.p, again) == CXLPOOL_OK);
    cxlpool_shared_pool_t* tenant = nullptr;
    REQUIRE(cxlpool_shared_pool_open(pool.device.c_str(), tp.p, &tenant) == CXLPOOL_OK);
    char stolen[CXLPOOL_QUOTA_KEY_SIZE] = {};
    CHECK(cxlpool_compose_lock_quota(tenant, "default", 1000, stolen) == CXLPOOL_E_PERMISSION);
    CHECK(last_error().find("does not compose") != std::string::npos);
    CHECK(cxlpool_compose_unlock_quota(tenant, "b", 1000) == CXLPOOL_E_PERMISSION);
    CHECK(cxlpool_compose_grant(tenant, "a", 1, 1000) == CXLPOOL_E_PERMISSION);
    CHECK(cxlpool_compose_reclaim(tenant, "b", 1, 0, 1000, nullptr) == CXLPOOL_E_PERMISSION);
    cxlpool_compose_policy_t pol{};
    pol.priority = 9;
    CHECK(cxlpool_compose_set_policy(tenant, "a", &pol, CXLPOOL_COMPOSE_POLICY_PRIORITY, 1000) == CXLPOOL_E_PERMISSION);
    cxlpool_composer_t* comp = nullptr;
    REQUIRE(cxlpool_composer_create(tenant, 100, &comp) == CXLPOOL_OK);
    cxlpool_compose_move_t moves[4];
    size_t n = 0;
    CHECK(cxlpool_composer_step(comp, 1000, moves, 4, &n) == CXLPOOL_E_PERMISSION);
    cxlpool_composer_destroy(comp);
    cxlpool_compose_state_t seen{};
    CHECK(cxlpool_compose_get_state(tenant, 1000, &seen) == CXLPOOL_OK);  // reading is allowed
    CHECK(quota_of(state_of(c), "b").locked == 1);
    CHECK(quota_of(state_of(c), "default").locked == 0);
    cxlpool_shared_pool_close(tenant);
  }

  // A lost key: reset without joining, even with default locked and its key gone; only while
  // no program has the pool open (an offline recovery, not a way around running programs).
  char lost[CXLPOOL_QUOTA_KEY_SIZE] = {};
  REQUIRE(cxlpool_compose_lock_quota(c, "default", 1000, lost) == CXLPOOL_OK);
  CHECK(open_with_key(pool.device, "default", nullptr) == CXLPOOL_E_PERMISSION);
  uint32_t unlocked = 0;
  CHECK(cxlpool_compose_reset_keys(pool.device.c_str(), &unlocked) == CXLPOOL_E_BUSY);
  CHECK(last_error().find("participant(s) alive") != std::string::npos);
  CHECK(unlocked == 0);
  cxlpool_shared_pool_close(early);
  cxlpool_shared_pool_close(c);
  REQUIRE(cxlpool_compose_reset_keys(pool.device.c_str(), &unlocked) == CXLPOOL_OK);
  CHECK(unlocked == 3);  // default, a, b
  CHECK(open_with_key(pool.device, "default", nullptr) == CXLPOOL_OK);
  c = pool.open();
  early = pool.open("a");
  CHECK(open_with_key(pool.device, "b", nullptr) == CXLPOOL_OK);
  CHECK(cxlpool_compose_reset_keys("shm:no-such-pool-here", nullptr) == CXLPOOL_E_NOT_FOUND);
  REQUIRE(cxlpool_compose_lock_quota(c, "a", 1000, again) == CXLPOOL_OK);

  REQUIRE(cxlpool_compose_unlock_quota(c, "a", 1000) == CXLPOOL_OK);
  CHECK(quota_of(state_of(c), "a").locked == 0);
  CHECK(open_with_key(pool.device, "a", nullptr) == CXLPOOL_OK);
  CHECK(cxlpool_compose_lock_quota(c, "nope", 1000, again) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(cxlpool_compose_lock_quota(c, "a", 1000, nullptr) == CXLPOOL_E_INVALID_ARGUMENT);
  cxlpool_shared_pool_close(early);
  cxlpool_shared_pool_close(c);
  CHECK(pool_consistent(pool.device));
}

// ---- The policy (compose_plan.hpp), with made-up states and a made-up clock ---------------

namespace {
using L::PlanMemory;
using L::PlanMove;
using L::PlanQuota;
constexpr uint64_t kMs = 1000000;

int64_t delta_of(const std::vector<PlanMove>& moves, uint32_t q) {
  int64_t d = 0;
  for (const auto& m : moves)
    if (m.quota == q) d += m.delta;
  return d;
}
void apply_moves(std::vector<PlanQuota>* qs, const std::vector<PlanMove>& moves) {
  for (const auto& m : moves) (*qs)[m.quota].granted = uint64_t(int64_t((*qs)[m.quota].granted) + m.delta);
}
uint64_t counted(const std::vector<PlanQuota>& qs) {
  uint64_t sum = 0;
  for (const auto& q : qs) sum += std::max(q.granted, q.used);
  return sum;
}
}  // namespace

TEST_CASE("compose policy: minimums first, idle spare back only after the hold time", "[compose]") {
  PlanMemory mem;
  // 20 extents: a holds 2 of its 10, b nothing of 6, 4 unassigned; b is guaranteed 8.
  std::vector<PlanQuota> q(2);
  q[0] = {10, 2, 0, 0, 0, 0};
  q[1] = {6, 0, 0, 8, 0, 0};
  auto m = L::plan_grants(q, 20, 1 * kMs, 500 * kMs, &mem);
  CHECK(delta_of(m, 1) == 2);  // b to its minimum from the unassigned
  CHECK(delta_of(m, 0) == 0);  // a's spare is new: held
  apply_moves(&q, m);
  m = L::plan_grants(q, 20, 400 * kMs, 500 * kMs, &mem);
  CHECK(m.empty());
  m = L::plan_grants(q, 20, 502 * kMs, 500 * kMs, &mem);
  CHECK(delta_of(m, 0) == -8);  // a keeps what it uses
  CHECK(delta_of(m, 1) == 0);   // b's minimum is not spare
  apply_moves(&q, m);
  CHECK(counted(q) <= 20);
  // Demand within the hold time starts the clock again.
  PlanMemory mem2;
  std::vector<PlanQuota> r(1);
  r[0] = {10, 2, 0, 0, 0, 0};
  L::plan_grants(r, 10, 1 * kMs, 500 * kMs, &mem2);
  r[0].demand = 1;
  L::plan_grants(r, 10, 300 * kMs, 500 * kMs, &mem2);
  r[0].demand = 0;
  CHECK(L::plan_grants(r, 10, 700 * kMs, 500 * kMs, &mem2).empty());
  CHECK(delta_of(L::plan_grants(r, 10, 1300 * kMs, 500 * kMs, &mem2), 0) == -8);
}

TEST_CASE("compose policy: demand by priority, within maximums, never from an equal priority", "[compose]") {
  PlanMemory mem;
  // 30 extents, all granted: low (prio 0) holds 10 of 20, high (prio 5) 5 of 5, peer (prio 5) 5 of 5.
  std::vector<PlanQuota> q(3);
  q[0] = {20, 10, 0, 2, 0, 0};
  q[1] = {5, 5, 4, 0, 0, 5};
  q[2] = {5, 5, 0, 0, 0, 5};
  auto m = L::plan_grants(q, 30, 1 * kMs, 500 * kMs, &mem);
  CHECK(delta_of(m, 1) == 4);   // from low's spare at once
  CHECK(delta_of(m, 0) == -4);  // low keeps what it uses
  CHECK(delta_of(m, 2) == 0);
  CHECK(m.front().delta < 0);  // reclaims first
  apply_moves(&q, m);
  // More than low's spare: low's grant goes down to its minimum, below what it uses; the
  // extents come back as it frees them, so nothing is granted for them yet.
  q[1].used = 9;
  q[1].demand = 20;
  m = L::plan_grants(q, 30, 2 * kMs, 500 * kMs, &mem);
  CHECK(delta_of(m, 0) == -(16 - 2));
  CHECK(delta_of(m, 1) == 6);  // low's last spare (16 - 10)
  apply_moves(&q, m);
  CHECK(q[0].granted == 2);
  CHECK(counted(q) <= 30);
  // A maximum bounds demand; an equal priority's used extents are never taken.
  PlanMemory mem2;
  std::vector<PlanQuota> e(2);
  e[0] = {10, 10, 0, 0, 0, 1};
  e[1] = {10, 2, 50, 0, 12, 1};
  m = L::plan_grants(e, 20, 1 * kMs, 500 * kMs, &mem2);
  CHECK(m.empty());  // no unassigned, and e0's extents are in use by an equal
  e[0].used = 4;
  m = L::plan_grants(e, 20, 1000 * kMs, 500 * kMs, &mem2);
  CHECK(delta_of(m, 0) == 0);  // e0's spare is new: held even against an equal's demand
  m = L::plan_grants(e, 20, 1600 * kMs, 500 * kMs, &mem2);
  CHECK(delta_of(m, 0) == -6);
  CHECK(delta_of(m, 1) == 2);  // up to its maximum of 12
}

TEST_CASE("compose policy: a refusal is served once, and a minimum outranks every priority", "[compose]") {
  PlanMemory mem;
  // b holds its 8 and was refused a 9th, once; its demand stays fresh for the hold time.
  std::vector<PlanQuota> q(2);
  q[0] = {20, 0, 0, 0, 0, 0};
  q[1] = {8, 8, 1, 0, 0, 5};
  uint64_t given = 0;
  for (int step = 0; step < 20; ++step) {
    const auto m = L::plan_grants(q, 28, uint64_t(step + 1) * 10 * kMs, 500 * kMs, &mem);
    given += uint64_t(std::max<int64_t>(0, delta_of(m, 1)));
    apply_moves(&q, m);
  }
  CHECK(given == 1);  // not +1, +2, +4, ... for as long as the demand is fresh
  CHECK(q[0].granted == 19);
  // A quota of equal priority holding the whole pool: a minimum still lowers it (down to its
  // own minimum), and is served as it frees.
  PlanMemory mem2;
  std::vector<PlanQuota> e(2);
  e[0] = {37, 37, 0, 0, 0, 0};
  e[1] = {0, 0, 0, 5, 0, 0};
  auto m = L::plan_grants(e, 37, 1 * kMs, 500 * kMs, &mem2);
  CHECK(delta_of(m, 0) == -5);
  CHECK(delta_of(m, 1) == 0);  // e0 still holds them
  apply_moves(&e, m);
  e[0].used = 32;  // it frees five
  m = L::plan_grants(e, 37, 2 * kMs, 500 * kMs, &mem2);
  CHECK(delta_of(m, 1) == 5);
  apply_moves(&e, m);
  CHECK(counted(e) <= 37);
}

TEST_CASE("compose policy: a sawtooth load does not make capacity flap", "[compose]") {
  PlanMemory mem;
  std::vector<PlanQuota> q(2);
  q[0] = {10, 0, 0, 0, 0, 0};
  q[1] = {10, 0, 0, 0, 0, 0};
  uint64_t changes = 0;
  // a's load rises to 14 extents and falls to 2 every 200 ms for 10 s (it asks while it wants
  // more than it is granted); b is idle; the hold time is 500 ms.
  for (int step = 0; step < 1000; ++step) {
    const uint64_t want = (step / 10) % 2 == 0 ? 14 : 2;
    q[0].used = std::min(want, q[0].granted);
    q[0].demand = want > q[0].granted ? 1 : 0;
    const auto m = L::plan_grants(q, 20, uint64_t(step + 1) * 10 * kMs, 500 * kMs, &mem);
    changes += m.size();
    apply_moves(&q, m);
    REQUIRE(counted(q) <= 20);
  }
  INFO("changes " << changes);
  CHECK(changes <= 12);  // the spare given back once, a's growth in a few steps; not per tooth (50 teeth)
  CHECK(q[0].granted >= 14);
  // No state that adds up to more than the pool is composed.
  std::vector<PlanQuota> bad(2);
  bad[0] = {15, 0, 5, 0, 0, 0};
  bad[1] = {10, 0, 0, 0, 0, 0};
  CHECK(L::plan_grants(bad, 20, 1, 500 * kMs, &mem).empty());
}

TEST_CASE("compose: a composer moves idle capacity to a quota under demand, and its priority takes it back",
          "[compose]") {
  Pool pool("policy");
  cxlpool_shared_pool_t* c = pool.open();
  cxlpool_compose_policy_t pol{};
  pol.priority = 5;
  REQUIRE(cxlpool_compose_set_policy(c, "b", &pol, 0, 1000) == CXLPOOL_OK);
  pol = {};
  pol.min_extents = 2;
  REQUIRE(cxlpool_compose_set_policy(c, "a", &pol, 0, 1000) == CXLPOOL_OK);
  pol.min_extents = 100;
  CHECK(cxlpool_compose_set_policy(c, "a", &pol, 0, 1000) == CXLPOOL_E_INVALID_ARGUMENT);
  pol = {2, 1, 0, 0};
  CHECK(cxlpool_compose_set_policy(c, "a", &pol, 0, 1000) == CXLPOOL_E_INVALID_ARGUMENT);  // min above max
  const uint64_t n = state_of(c).extents_total;
  cxlpool_composer_t* composer = nullptr;
  REQUIRE(cxlpool_composer_create(c, 100, &composer) == CXLPOOL_OK);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> steps{0}, changes{0};
  std::thread daemon([&] {
    while (!stop.load()) {
      cxlpool_compose_move_t moves[16];
      size_t k = 0;
      if (cxlpool_composer_step(composer, 10000, moves, 16, &k) == CXLPOOL_OK) changes.fetch_add(k);
      steps.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  // a asks for every extent of the pool, retrying on refusals: the composer gives it the idle
  // quotas' spare after the hold time, in growing steps.
  cxlpool_shared_pool_t* a = pool.open("a");
  std::vector<void*> held;
  const auto t0 = std::chrono::steady_clock::now();
  while (held.size() < n) {
    void* x = nullptr;
    if (cxlpool_shared_alloc(a, 1u << 20, &x) == CXLPOOL_OK) {
      std::memset(x, int(held.size()), 1u << 20);
      held.push_back(x);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  const double all_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("a owns the whole pool (" << n << " extents) after " << all_ms << " ms (hold 100 ms, steps every 10 ms)");
  // b (priority 5) asks for one extent, once: a's grant goes below what it holds by one (not
  // to its minimum: the demand is one extent); b is served as a frees.
  cxlpool_shared_pool_t* b = pool.open("b");
  void* y = nullptr;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));          // the composer has seen b's slot
  CHECK(cxlpool_shared_alloc(b, 1u << 20, &y) == CXLPOOL_E_CAPACITY);  // its first claim asks
  for (int i = 0; i < 3000 && quota_of(state_of(c), "a").granted_extents == n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // more steps: no more is taken
  cxlpool_compose_state_t s = state_of(c);
  CHECK(quota_of(s, "a").granted_extents == n - 1);
  CHECK(quota_of(s, "a").used_extents == n);  // no block of a's is taken
  for (size_t i = 0; i < held.size(); ++i) CHECK(static_cast<unsigned char*>(held[i])[12345] == (unsigned char)(i));
  for (int i = 0; i < 4; ++i) {  // a frees four: they go to b
    REQUIRE(cxlpool_shared_free(a, held.back()) == CXLPOOL_OK);
    held.pop_back();
  }
  bool served = false;
  for (int i = 0; i < 3000 && !served; ++i) {
    served = cxlpool_shared_alloc(b, 1u << 20, &y) == CXLPOOL_OK;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(served);
  stop.store(true);
  daemon.join();
  cxlpool_composer_destroy(composer);
  s = state_of(c);
  CHECK(counted(s) <= n);
  INFO("steps " << steps.load() << ", changes " << changes.load());
  if (served) CHECK(cxlpool_shared_free(b, y) == CXLPOOL_OK);
  for (void* x : held) CHECK(cxlpool_shared_free(a, x) == CXLPOOL_OK);
  for (cxlpool_shared_pool_t* p : {b, a, c}) cxlpool_shared_pool_close(p);
  CHECK(pool_consistent(pool.device));
}

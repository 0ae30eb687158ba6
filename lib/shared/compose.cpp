// SPDX-License-Identifier: MIT
// Composition of a shared pool's capacity at run time: grants per quota, changed by whichever
// participant holds the compose claim, and followed by the quotas' participants (docs/compose.md).
//
// The invariant, kept by every holder of the compose claim and by nothing else:
//   sum over quotas of max(granted, owned) <= the pool's extents
// so every quota can own its grant at once. A grant is raised only from what that sum leaves;
// it is lowered under the quota's claim (claimers of that quota exclude the lowering, so none
// of them counts against the old grant after it), and what the quota still owns beyond the new
// grant keeps counting until it is freed. Each change is one store of one self-checking word:
// a composer killed at any instruction leaves every grant old or new, and the invariant whole.
#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "common/error.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

using detail::fail;

SharedPool::Grant SharedPool::grant(uint32_t quota) const {
  Grant g;
  if (!decode_grant(view_.load(view_.grant_word(quota)), quota, view_.salt(), &g.extents, &g.set)) {
    g.readable = false;
    return g;
  }
  if (!g.set) g.extents = view_.sb().quotas[quota].max_extents;
  return g;
}

std::vector<uint64_t> SharedPool::quota_uses() const {
  const uint32_t nq = view_.sb().quota_count;
  std::vector<uint64_t> used(nq, 0);
  for (uint64_t e = 0; e < view_.extent_count(); ++e) {
    ExtentWord w;
    if (!view_.extent(e, &w)) {
      for (auto& u : used) ++u;  // unreadable: counted against every quota, as quota_use does
      continue;
    }
    if (w.kind != kExtentFree && w.quota < nq) ++used[w.quota];
  }
  return used;
}

uint32_t SharedPool::quota_index(const std::string& name, const char* fn) const {
  const Superblock& sb = view_.sb();
  std::string known;
  for (uint32_t q = 0; q < sb.quota_count; ++q) {
    if (name == std::string(sb.quotas[q].name, strnlen(sb.quotas[q].name, sizeof sb.quotas[q].name))) return q;
    known += std::string(q ? ", " : "") + sb.quotas[q].name;
  }
  fail(CXLPOOL_E_INVALID_ARGUMENT,
       std::string(fn) + ": " + what_ + " has no quota named \"" + name + "\" (it has: " + known + ")");
}

std::string SharedPool::compose_holder() const {
  const uint64_t salt = view_.salt();
  for (uint32_t s = 0; s < view_.slot_count(); ++s) {
    const bool live = view_.slot_live(s);
    if (s == slot_ || !(live || view_.slot_recovering(s))) continue;
    ClaimKind k{};
    uint32_t f = 0, c = 0;
    if (!decode_claim(view_.load(view_.slot_word(s, 2, 0)), s, salt, &k, &f, &c) || k != kClaimCompose) continue;
    const SlotLine0* l = view_.slot_line0(s);
    return "slot " + std::to_string(s) + " (pid " + std::to_string(view_.load(&l->pid)) + " on host " +
           std::to_string(view_.load(&l->host_index)) +
           (live ? ")" : "; declared dead, but its recovery waits for the operation it is stopped in)");
  }
  return "";
}

template <class F>
void SharedPool::with_compose_claim(uint32_t lowered_plus_one, uint32_t wait_ms, const char* fn, F&& f) {
  const uint64_t deadline = os::monotonic_ns() + uint64_t{wait_ms} * 1000000u;
  std::minstd_rand rng(static_cast<uint32_t>(slot_ * 7919 + incarnation_));
  for (;;) {
    {
      Op op(*this);
      // A claim excludes other composers (every compose claim overlaps) and, with a quota,
      // that quota's claimers of extents; the claim words are this participant's, under mu_.
      if (claim(kClaimCompose, 0, 1, lowered_plus_one)) {
        try {
          f();
        } catch (...) {
          unclaim();
          throw;
        }
        unclaim();
        return;
      }
    }
    // Another composer, or a claimer of the quota being lowered: both hold it briefly. A dead
    // holder's claim stops counting once the watch has recovered its slot.
    if (os::monotonic_ns() >= deadline) {
      const std::string who = compose_holder();
      fail(CXLPOOL_E_BUSY, std::string(fn) + ": " + what_ + ": the compose claim stayed held for " +
                               std::to_string(wait_ms) + " ms" +
                               (who.empty() ? std::string(" (by claimers of the quota's extents)") : " by " + who));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 + rng() % 950));
  }
}

SharedPool::ComposeState SharedPool::compose_state(uint32_t wait_ms) {
  const Superblock& sb = view_.sb();
  ComposeState st;
  // Under the compose claim the grants are one snapshot (read one by one while another
  // composer moved extents, two grants could both look raised). Holdings are counted in one
  // pass over the extent table while participants claim and free: a quota within its grant
  // that frees an extent the pass counted and claims one it has not reached yet is counted
  // one over. Such a sum, over the pool, is no state the pool had; so a snapshot whose sum
  // exceeds the pool is taken again with the claim of a quota that looked over its grant
  // (whose participants then only free: its count is exact), and only a sum that stays over
  // is reported as overcommitted (damage).
  uint32_t exact_plus_one = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    st = ComposeState{};
    st.extents = view_.extent_count();
    st.extent_size = view_.extent_size();
    uint32_t suspect_plus_one = 0;
    with_compose_claim(exact_plus_one, wait_ms, "cxlpool_compose_get_state", [&] {
      const std::vector<uint64_t> used = quota_uses();
      const std::vector<uint64_t> demand = demands(nullptr, 0, 0);
      uint64_t counted = 0;
      for (uint32_t q = 0; q < sb.quota_count; ++q) {
        ComposeQuota cq;
        cq.name.assign(sb.quotas[q].name, strnlen(sb.quotas[q].name, sizeof sb.quotas[q].name));
        cq.reserved = sb.quotas[q].max_extents;
        const Grant g = grant(q);
        cq.granted = g.readable ? g.extents : 0;
        cq.grant_set = g.set;
        cq.grant_damaged = !g.readable;
        cq.used = used[q];
        cq.policy_damaged = !policy(q, &cq.policy);
        cq.key_damaged = !key_word_valid(view_.load(view_.key_word(q)), q, view_.salt(), &cq.locked);
        cq.demand = demand[q];
        // A damaged grant counts as what the quota owns (it may not grow past it).
        counted += std::max(cq.granted, cq.used);
        if (cq.used > cq.granted) {
          st.over_grant += cq.used - cq.granted;
          if (q + 1 != exact_plus_one && suspect_plus_one == 0) suspect_plus_one = q + 1;
        }
        st.quotas.push_back(std::move(cq));
      }
      st.overcommitted = counted > st.extents;
      st.unassigned = st.overcommitted ? 0 : st.extents - counted;
    });
    if (!st.overcommitted || suspect_plus_one == 0) break;
    exact_plus_one = suspect_plus_one;
  }
  return st;
}

uint64_t SharedPool::unassigned_locked(const char* fn) const {
  const uint32_t nq = view_.sb().quota_count;
  const std::vector<uint64_t> used = quota_uses();
  uint64_t counted = 0;
  for (uint32_t i = 0; i < nq; ++i) {
    const Grant g = grant(i);
    if (!g.readable)
      fail(CXLPOOL_E_CORRUPT, std::string(fn) + ": " + what_ + ": the grant word of quota \"" +
                                  view_.sb().quotas[i].name +
                                  "\" is damaged; nothing is granted until cxlpool-pool check --repair resets it");
    counted += std::max(g.extents, used[i]);
  }
  const uint64_t total = view_.extent_count();
  return counted >= total ? 0 : total - counted;
}

void SharedPool::compose_grant(const std::string& quota, uint64_t extents, uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_compose_grant";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t q = quota_index(quota, fn);
  if (extents == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": 0 extents");
  with_compose_claim(0, wait_ms, fn, [&] {
    const uint64_t free = unassigned_locked(fn);
    if (extents > free)
      fail(CXLPOOL_E_CAPACITY, std::string(fn) + ": " + what_ + ": " + std::to_string(extents) +
                                   " extents asked for quota \"" + quota + "\", " + std::to_string(free) + " of " +
                                   std::to_string(view_.extent_count()) +
                                   " unassigned (the rest is granted to the quotas or still held by them); "
                                   "reclaim from another quota first");
    store_grant(q, grant(q).extents + extents, fn);
  });
}

SharedPool::ReclaimResult SharedPool::compose_reclaim(const std::string& quota, uint64_t extents, uint32_t deadline_ms,
                                                      uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_compose_reclaim";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t q = quota_index(quota, fn);
  if (extents == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": 0 extents");
  uint64_t target = 0;
  with_compose_claim(q + 1, wait_ms, fn, [&] {
    const Grant g = grant(q);
    if (!g.readable)
      fail(CXLPOOL_E_CORRUPT, std::string(fn) + ": " + what_ + ": the grant word of quota \"" + quota +
                                  "\" is damaged; cxlpool-pool check --repair resets it");
    if (extents > g.extents)
      fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": quota \"" + quota + "\" of " + what_ + " is granted " +
                                           std::to_string(g.extents) + " extents; " + std::to_string(extents) +
                                           " cannot be reclaimed from it");
    target = g.extents - extents;
    store_grant(q, target, fn);
  });
  // The quota's participants give back what they keep for speed at their next watch pass, and
  // the rest as their programs free it. Wait for that, up to the deadline.
  const uint64_t deadline = os::monotonic_ns() + uint64_t{deadline_ms} * 1000000u;
  for (;;) {
    if (q == quota_) {
      std::lock_guard<HeapLock> lock(mu_);
      Marked marked(*this);
      if (marked.ok()) trim();
    }
    if (quota_use(q) <= target) return {extents, 0};
    if (os::monotonic_ns() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max<uint64_t>(1, heartbeat_ns_ / 1000000u)));
  }
  // At the deadline the quota keeps a grant for what it still holds of this reclaim's extents,
  // as a device keeps an extent it is using: the reclaim took what was given back. Only its own
  // lowering is undone (another reclaim of the quota may be waiting too), and the sum composers
  // count does not change (max(granted, owned) is what the quota owns either way).
  ReclaimResult r;
  auto held_back = [&](const Grant& g) {
    const uint64_t used = quota_use(q);
    return std::min<uint64_t>(extents, g.readable && used > g.extents ? used - g.extents : 0);
  };
  try {
    with_compose_claim(q + 1, wait_ms, fn, [&] {
      const Grant g = grant(q);
      r.still_held = held_back(g);
      r.reclaimed = extents - r.still_held;
      if (r.still_held) store_grant(q, g.extents + r.still_held, fn);
    });
  } catch (const Failure& e) {
    if (e.status() != CXLPOOL_E_BUSY) throw;
    // The grant stays lowered: what the quota holds beyond it comes back as it is freed.
    r.still_held = held_back(grant(q));
    r.reclaimed = extents - r.still_held;
    r.lowered = true;
  }
  return r;
}

void SharedPool::store_grant(uint32_t quota, uint64_t extents, const char* fn) {
  const uint64_t w = encode_grant(extents, quota, view_.salt());
  PoolView::fence();
  if (!still_ours_locked())
    fail(CXLPOOL_E_EVICTED, std::string(fn) + ": " + what_ +
                                ": this participant was declared dead while it composed; no grant was written");
  view_.store(view_.grant_word(quota), w);
}

// A program given a locked quota by its key (a container, by its CDI spec) is a tenant: it
// may read the grants but not change them, nor any policy or key. Composing is for the
// host's participants: of an unlocked quota, or of default.
void SharedPool::refuse_tenant(const char* fn) const {
  if (tenant_)
    fail(CXLPOOL_E_PERMISSION, std::string(fn) + ": " + what_ + ": this participant joined quota \"" +
                                   view_.sb().quotas[quota_].name +
                                   "\" with its key; a program given a locked quota does not compose (grants, "
                                   "reclaims, policies and keys are changed by the host, from default)");
}

std::string SharedPool::compose_lock(const std::string& quota, uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_compose_lock_quota";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t q = quota_index(quota, fn);
  unsigned char key[kKeyBytes];
  os::random_bytes(key, sizeof key);
  with_compose_claim(0, wait_ms, fn, [&] { store_key_word(q, encode_key(key, q, view_.salt()), fn); });
  return format_quota_key(key);
}

void SharedPool::compose_unlock(const std::string& quota, uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_compose_unlock_quota";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t q = quota_index(quota, fn);
  with_compose_claim(0, wait_ms, fn, [&] { store_key_word(q, 0, fn); });
}

void SharedPool::store_key_word(uint32_t quota, uint64_t word, const char* fn) {
  PoolView::fence();
  if (!still_ours_locked())
    fail(CXLPOOL_E_EVICTED,
         std::string(fn) + ": " + what_ + ": this participant was declared dead while it composed; no key was written");
  view_.store(view_.key_word(quota), word);
}

std::vector<std::string> SharedPool::compose_quota_names() const {
  std::vector<std::string> out;
  for (uint32_t q = 0; q < view_.sb().quota_count; ++q)
    out.emplace_back(view_.sb().quotas[q].name, strnlen(view_.sb().quotas[q].name, sizeof view_.sb().quotas[q].name));
  return out;
}

bool SharedPool::policy(uint32_t quota, QuotaPolicy* out) const {
  const uint64_t* w = view_.policy_words(quota);
  const uint64_t raw[2] = {view_.load(w), view_.load(w + 1)};
  return decode_policy(raw, quota, view_.salt(), out);
}

std::vector<uint64_t> SharedPool::demands(ComposerMemory* memory, uint64_t now_ns, uint64_t hold_ns) const {
  const uint32_t nq = view_.sb().quota_count;
  std::vector<uint64_t> out(nq, 0);
  if (memory) {
    memory->slot_seq.resize(view_.slot_count(), 0);
    memory->slot_changed_ns.resize(view_.slot_count(), 0);
  }
  for (uint32_t s = 0; s < view_.slot_count(); ++s) {
    if (!view_.slot_live(s) || !view_.slot_tables_current(s)) {
      if (memory && memory->steps) memory->slot_seq[s] = 1;  // seen empty: its next participant's demand is new
      continue;
    }
    const uint64_t raw = view_.load(&view_.slot_counters(s)->demand);
    const uint32_t q = static_cast<uint32_t>(raw >> 56);
    const uint64_t seq = (raw >> 32) & 0xffffffu, extents = raw & 0xffffffffu;
    if (memory && raw == 0 && memory->steps) memory->slot_seq[s] = 1;  // seen, asking for nothing
    if (raw == 0 || q >= nq) continue;  // none, or a word no participant of this pool writes
    if (memory) {
      // A demand in a slot this composer had never looked at is taken as old (a new composer
      // does not act on refusals made before it ran); one whose sequence moved since is new.
      // (Sequences start at 1: slot_seq holds seq + 1, 1 for "no demand", 0 for "not seen".)
      if (memory->slot_seq[s] != seq + 1) {
        const bool unseen = memory->slot_seq[s] == 0;
        memory->slot_seq[s] = seq + 1;
        memory->slot_changed_ns[s] = unseen ? 0 : now_ns;
      }
      if (memory->slot_changed_ns[s] == 0 || now_ns - memory->slot_changed_ns[s] > hold_ns) continue;
    }
    out[q] += extents;
  }
  return out;
}

void SharedPool::compose_set_policy(const std::string& quota, const QuotaPolicy& p, uint32_t fields, uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_compose_set_policy";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t q = quota_index(quota, fn);
  const uint64_t n = view_.extent_count();
  if (p.priority > 255)
    fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": priority " + std::to_string(p.priority) + " is above 255");
  if (fields == 0) fields = kPolicyMin | kPolicyMax | kPolicyPriority;
  with_compose_claim(0, wait_ms, fn, [&] {
    // The fields not set keep their value, read under the claim (a damaged policy is none).
    QuotaPolicy next;
    policy(q, &next);
    if (fields & kPolicyMin) next.min_extents = p.min_extents;
    if (fields & kPolicyMax) next.max_extents = p.max_extents;
    if (fields & kPolicyPriority) next.priority = p.priority;
    if (next.max_extents > n || next.min_extents > n)
      fail(CXLPOOL_E_INVALID_ARGUMENT,
           std::string(fn) + ": a minimum or maximum above the pool's " + std::to_string(n) + " extents");
    if (next.max_extents != 0 && next.min_extents > next.max_extents)
      fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": minimum " + std::to_string(next.min_extents) +
                                           " above maximum " + std::to_string(next.max_extents));
    // The minimums are guarantees: together they must fit in the pool.
    uint64_t mins = next.min_extents;
    for (uint32_t i = 0; i < view_.sb().quota_count; ++i) {
      QuotaPolicy other;
      if (i != q && policy(i, &other)) mins += other.min_extents;
    }
    if (mins > n)
      fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(fn) + ": the quotas' minimums would add up to " +
                                           std::to_string(mins) + " extents; the pool has " + std::to_string(n));
    uint64_t w[2];
    encode_policy(next, q, view_.salt(), w);
    PoolView::fence();
    if (!still_ours_locked())
      fail(CXLPOOL_E_EVICTED, std::string(fn) + ": " + what_ +
                                  ": this participant was declared dead while it composed; no policy was written");
    uint64_t* at = view_.policy_words(q);
    view_.store(at, w[0]);
    view_.store(at + 1, w[1]);
  });
}

std::vector<SharedPool::AppliedMove> SharedPool::compose_step(ComposerMemory* memory, uint64_t hold_ns,
                                                              uint32_t wait_ms) {
  static constexpr const char* fn = "cxlpool_composer_step";
  refuse_tenant(fn);
  ensure_usable();
  const uint32_t nq = view_.sb().quota_count;
  std::vector<PlanQuota> in(nq);
  std::vector<PlanMove> moves;
  with_compose_claim(0, wait_ms, fn, [&] {
    const uint64_t now = os::monotonic_ns();
    const std::vector<uint64_t> used = quota_uses();
    const std::vector<uint64_t> demand = demands(memory, now, hold_ns);
    for (uint32_t q = 0; q < nq; ++q) {
      const Grant g = grant(q);
      if (!g.readable) return;  // damaged: nothing is composed until a check repairs it
      QuotaPolicy pol;
      policy(q, &pol);  // a damaged policy is none
      in[q] = {g.extents, used[q], demand[q], pol.min_extents, pol.max_extents, pol.priority};
    }
    moves = plan_grants(in, view_.extent_count(), now, hold_ns, &memory->plan);
    ++memory->steps;
  });
  std::vector<AppliedMove> applied;
  for (const PlanMove& m : moves) {
    if (m.delta < 0) {  // lowered at once; what is held beyond comes back as it is freed
      uint64_t done = 0;
      with_compose_claim(m.quota + 1, wait_ms, fn, [&] {
        const Grant g = grant(m.quota);
        if (!g.readable) return;
        // Never below the minimum, and an idle quota's spare is judged again now: it may have
        // allocated since the snapshot.
        QuotaPolicy pol;
        policy(m.quota, &pol);
        const uint64_t floor = m.below_used ? pol.min_extents : std::max(pol.min_extents, quota_use(m.quota));
        const uint64_t target = std::max(floor, g.extents > uint64_t(-m.delta) ? g.extents - uint64_t(-m.delta) : 0);
        done = g.extents > target ? g.extents - target : 0;
        if (done) store_grant(m.quota, g.extents - done, fn);
      });
      if (done) applied.push_back({m.quota, -int64_t(done), m.why});
    } else {  // as much as is unassigned now (another composer may have moved some)
      uint64_t done = 0;
      with_compose_claim(0, wait_ms, fn, [&] {
        // Within the maximum as it is now: another composer may have served the same demand
        // since the snapshot.
        QuotaPolicy pol;
        policy(m.quota, &pol);
        const uint64_t n = view_.extent_count(), now = grant(m.quota).extents;
        const uint64_t cap = pol.max_extents ? std::min(pol.max_extents, n) : n;
        done = std::min<uint64_t>({unassigned_locked(fn), uint64_t(m.delta), cap > now ? cap - now : 0});
        if (done) store_grant(m.quota, now + done, fn);
      });
      if (done) applied.push_back({m.quota, int64_t(done), m.why});
    }
  }
  return applied;
}

uint64_t grant_problems(const PoolView& v, const std::vector<uint64_t>& used) {
  uint64_t problems = 0, counted = 0;
  for (uint32_t q = 0; q < v.sb().quota_count && q < used.size(); ++q) {
    uint64_t granted = 0;
    bool set = false;
    if (!decode_grant(v.load(v.grant_word(q)), q, v.salt(), &granted, &set)) {
      ++problems;
      granted = 0;
    } else if (!set) {
      granted = v.sb().quotas[q].max_extents;
    }
    counted += std::max(granted, used[q]);
    const uint64_t raw[2] = {v.load(v.policy_words(q)), v.load(v.policy_words(q) + 1)};
    QuotaPolicy pol;
    if (!decode_policy(raw, q, v.salt(), &pol)) ++problems;  // torn or scribbled: read as none
  }
  return problems + (counted > v.extent_count() ? 1 : 0);
}

void SharedPool::repair_grants(RepairCounts* counts) {
  Op op(*this);
  const uint32_t nq = view_.sb().quota_count;
  const std::vector<uint64_t> used = quota_uses();
  uint64_t counted = 0;
  for (uint32_t q = 0; q < nq; ++q) {
    const Grant g = grant(q);
    counted += std::max(g.readable ? g.extents : 0, used[q]);
  }
  const bool overcommitted = counted > view_.extent_count();
  for (uint32_t q = 0; q < nq; ++q) {
    const Grant g = grant(q);
    if (g.readable && !overcommitted) continue;
    // What the quota owns now: never more than the pool in sum (owned extents are disjoint),
    // and nothing taken from under a live block. The rest is unassigned, for a composer to give.
    view_.store(view_.grant_word(q), encode_grant(used[q], q, view_.salt()));
    ++counts->words_reset;
  }
  for (uint32_t q = 0; q < nq; ++q) {  // a damaged policy becomes none (what it reads as already)
    QuotaPolicy pol;
    if (policy(q, &pol)) continue;
    view_.store(view_.policy_words(q), 0);
    view_.store(view_.policy_words(q) + 1, 0);
    counts->words_reset += 2;
  }
}

void SharedPool::note_demand(uint64_t extents) {
  uint64_t w = 0;
  if (extents != 0) {
    demand_seq_ = (demand_seq_ + 1) & 0xffffffu;
    w = (uint64_t{quota_ & 0xffu} << 56) | (uint64_t{demand_seq_} << 32) | std::min<uint64_t>(extents, UINT32_MAX);
  }
  view_.store(&view_.slot_counters(slot_)->demand, w);
  demand_raw_ = w;
}

uint64_t SharedPool::quota_excess() const {
  const Grant g = grant(quota_);
  const uint64_t used = quota_use(quota_);
  return g.readable && used > g.extents ? used - g.extents : 0;
}

void SharedPool::follow_grant() {
  const Grant g = grant(quota_);
  if (!g.readable) return;
  if (g.extents < grant_seen_ && grant_seen_ != UINT64_MAX) over_grant_ = true;
  grant_seen_ = g.extents;
  // After a lowered grant: give back the cached blocks and kept empty extents every pass (the
  // program's frees empty more of them), until the quota's holdings are within the grant
  // (counted every 16th pass: a pass over the extent table).
  if (!over_grant_) return;
  trim();
  if (ticks_ % 16 == 0 && quota_use(quota_) <= g.extents) over_grant_ = false;
}

}  // namespace cxlpool::detail::shared

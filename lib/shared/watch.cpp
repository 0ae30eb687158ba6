// SPDX-License-Identifier: MIT
// The watch over the other participants: heartbeats, death detection (silence for the lease
// timeout, or a pid gone on this host), and recovery of a dead participant's extents by
// exactly one survivor (a recover claim), idempotent so a recoverer's own death is survived.
//
// Recovery of slot D (incarnation i), by the winner R of the claim (recover, D):
//   1. eviction word of D := (i, recovering, by R)   -- D self-fences on seeing it
//   2. for each extent owned by (D, i): formatting -> free; small/large -> R takes ownership,
//      then every block: allocated -> free; exported/released -> released if a live lease
//      holds it, else free; an extent left with no block in use goes back to the pool
//   3. eviction word of D := (i, done); D's leases stop counting from step 1 on
// A crash of R anywhere leaves D "recovering" with a dead recoverer: the next survivor repeats
// the steps (each is idempotent), and R's own extents, adopted ones included, are recovered
// as R's.
#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "common/json.hpp"
#include "os/os.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

namespace {
// The adaptive part of the lease: a participant that only its heartbeat can vouch for is
// allowed kGapFactor times the longest gap between its beats seen over the last one or two
// windows, never less than the lease and never more than kLeaseCap leases.
constexpr uint64_t kGapWindowNs = 300ull * 1000000000u;
constexpr uint64_t kGapFactor = 3;
constexpr uint64_t kLeaseCap = 4;
// A joiner writes its facts a few stores after it claims its slot; until then nothing of its
// process can be looked at. A joiner preempted between the two on a saturated machine is not
// dead: it gets at least this long (one that really died there is recovered after it).
constexpr uint64_t kJoinGraceNs = 10ull * 1000000000u;
}  // namespace

PeerLife judge_peer(const PoolView& v, uint32_t s, uint32_t inc, uint64_t boot_hash, uint64_t pidns) {
  const SlotLine0* line = v.slot_line0(s);
  // A participant that is still joining has not written its facts yet: those there describe
  // the slot's previous incarnation (perhaps a dead process) and prove nothing about this one.
  if (v.load(&line->facts_incarnation) != inc) return PeerLife::kJoining;
  if (boot_hash == 0 || pidns == 0 || v.load(&line->boot_hash) != boot_hash) return PeerLife::kUnverifiable;
  const uint64_t their_ns = v.load(&line->pidns);
  if (their_ns == 0) return PeerLife::kUnverifiable;
  auto pid = static_cast<int>(v.load(&line->pid));
  auto tid = static_cast<int>(v.load(&line->beat_tid));
  if (pid <= 0) return PeerLife::kUnverifiable;
  const uint64_t beat_start = v.load(&line->beat_start_ticks);
  if (their_ns == pidns && !os::proc_is_ours()) return PeerLife::kUnverifiable;  // its numbers name others here
  if (their_ns != pidns) {
    // Another pid namespace of this host (a container): its numbers mean something here only
    // if the namespace is below ours. Found, it is judged by its process like any other; a
    // start time that differs (a time namespace, or a reused id) proves nothing either way.
    if (tid <= 0) return PeerLife::kUnverifiable;
    int here_pid = 0, here_tid = 0;
    switch (os::find_in_pid_namespace(their_ns, pid, tid, beat_start, &here_pid, &here_tid)) {
      case os::NsFind::kGone:
        return PeerLife::kGone;
      case os::NsFind::kUnreachable:
        return PeerLife::kUnverifiable;
      case os::NsFind::kFound:
        break;
    }
    const uint64_t start_here = os::task_start_ticks(here_pid, here_tid);  // 0: unreadable now
    if (beat_start != 0 && start_here != 0 && start_here != beat_start) return PeerLife::kUnverifiable;
    pid = here_pid;
    tid = here_tid;
  }
  // The heartbeat thread itself when the participant named it: a process that exec'd, or
  // whose beat thread is gone with it, is no participant any more even if the pid lives on.
  const os::TaskLife life = tid > 0 ? os::task_life(pid, tid, their_ns != pidns ? 0 : beat_start)
                                    : os::task_life(pid, pid, v.load(&line->start_ticks));
  switch (life) {
    case os::TaskLife::kGone:
      return PeerLife::kGone;
    case os::TaskLife::kStopped:
      return PeerLife::kStopped;
    case os::TaskLife::kRunning:
    case os::TaskLife::kExists:  // there, but /proc cannot say in which state: alive
      return PeerLife::kRunning;
    case os::TaskLife::kUnknown:
      break;
  }
  return PeerLife::kUnverifiable;
}

void SharedPool::tick() {
  check_device();  // before anything reads the mapping
  if (!joined_ || evicted_.load() || failed_.load()) return;
  heartbeat_once(false);
  watch_pass();
}

// One pass of the watch thread (the heartbeat thread beats on its own).
void SharedPool::watch_pass() {
  check_device();
  if (!joined_ || failed_.load()) return;
  if (evict_seen_.load() && !evicted_.load()) mark_evicted(false);
  if (evicted_.load()) return;
  observe_others();
  if (++ticks_ % 16 == 0) sweep_orphans();
  std::lock_guard<HeapLock> lock(mu_);
  if (evicted_.load() || failed_.load()) return;  // (re-read under mu_: the mapping may be read-only now)
  Marked marked(*this);
  if (!marked.ok()) return;
  if (!released_pending_.empty()) recheck_released();
  trim_idle_classes();
  follow_grant();
  SlotCounters* c = view_.slot_counters(slot_);
  view_.store(&c->bytes_in_use, bytes_in_use_ - cached_bytes());
  view_.store(&c->recovered_slots, recovered_slots_);
}

bool SharedPool::may_be_in_operation(uint32_t s, uint32_t incarnation) const {
  const SlotLine0* line = view_.slot_line0(s);
  if (view_.load(&line->facts_incarnation) != incarnation) return false;
  if (view_.load(&line->boot_hash) != boot_hash_) return false;  // another host: the lease alone decides
  const uint64_t seq = view_.load(&line->op_seq);
  const auto tag = static_cast<uint32_t>(seq >> 32);  // 0: a participant that does not tag it
  if ((tag != 0 && tag != incarnation) || (seq & 1) == 0) return false;
  const PeerLife life = peer_life(s, incarnation);
  // A process of another pid namespace is waited for only when it could be looked at.
  if (view_.load(&line->pidns) != pidns_) return life == PeerLife::kRunning || life == PeerLife::kStopped;
  return life != PeerLife::kGone;
}

uint64_t SharedPool::silence_limit_ns(const Seen& seen) const {
  const uint64_t gap = std::max(seen.gap_max_ns, seen.gap_prev_ns);
  return std::clamp(kGapFactor * gap, timeout_ns_, kLeaseCap * timeout_ns_);
}

void SharedPool::observe_others() {
  std::lock_guard<std::mutex> watch(watch_mu_);
  const uint64_t now = os::monotonic_ns();
  // An observer that was not scheduled for a while (stopped, starved) did not watch anybody
  // meanwhile: silence it did not see is no evidence of death, so everyone starts afresh.
  const bool was_away = last_observe_ns_ != 0 && now - last_observe_ns_ > std::max(timeout_ns_ / 4, 5 * heartbeat_ns_);
  last_observe_ns_ = now;
  for (uint32_t s = 0; s < view_.slot_count(); ++s) {
    if (s == slot_) continue;
    uint32_t inc = 0, evict_inc = 0;
    SlotState state{};
    EvictPhase phase{};
    if (!view_.slot_identity(s, &inc, &state) || state == kSlotFree) continue;
    Seen& seen = seen_[s];
    const uint64_t beat = view_.load(&view_.slot_line0(s)->heartbeat);
    if (seen.incarnation != inc || seen.changed_ns == 0) {
      seen = Seen{inc, beat, now, now, 0, 0};
    } else if (seen.heartbeat != beat) {
      if (!was_away) {  // a gap between two beats both seen by a watch that was there
        if (now - seen.window_ns > kGapWindowNs) {
          seen.gap_prev_ns = seen.gap_max_ns;
          seen.gap_max_ns = 0;
          seen.window_ns = now;
        }
        seen.gap_max_ns = std::max(seen.gap_max_ns, now - seen.changed_ns);
      }
      seen.heartbeat = beat;
      seen.changed_ns = now;
    } else if (was_away) {
      seen.changed_ns = now;
    }
    const bool evict_ok = view_.slot_eviction(s, &evict_inc, &phase);
    const bool evicted_now = evict_ok && evict_inc == inc && phase != kEvictNone;
    if (evicted_now && phase == kEvictDone) continue;
    // Liveness (docs/shared.md): a participant that left is recovered; one whose process is on
    // this host is dead only when its heartbeat thread is gone, or stopped for longer than
    // the stopped timeout, never for silence alone; one that cannot be looked at (another host)
    // is dead after the lease, stretched for a peer seen stalling before. The /proc look-up
    // costs ~5 us: only for a peer whose heartbeat has stalled for 2 periods.
    const uint64_t silence = now - seen.changed_ns;
    bool dead = state == kSlotLeft;
    if (!dead && silence > 2 * heartbeat_ns_) {
      switch (peer_life(s, inc)) {
        case PeerLife::kGone:
          dead = true;
          break;
        case PeerLife::kRunning:
          break;
        case PeerLife::kStopped:
          dead = stopped_ns_ != 0 && silence > stopped_ns_;
          break;
        case PeerLife::kJoining:
          dead = silence > std::max(silence_limit_ns(seen), kJoinGraceNs);
          break;
        case PeerLife::kUnverifiable:
          dead = silence > silence_limit_ns(seen);
          break;
      }
    }
    if (evicted_now && phase == kEvictRecovering) {  // resume only if its recoverer died too
      const uint64_t by = view_.load(view_.slot_word(s, 1, 1));
      const auto by_slot = static_cast<uint32_t>(by & 0xffffffffu), by_inc = static_cast<uint32_t>(by >> 32);
      uint32_t rinc = 0;
      SlotState rstate{};
      // The recoverer is named with its incarnation: its slot may since hold someone else.
      dead = by_slot == 0 || by_slot - 1 >= view_.slot_count() || !view_.slot_live(by_slot - 1) ||
             !view_.slot_identity(by_slot - 1, &rinc, &rstate) || rinc != by_inc ||
             (by_slot - 1 == slot_ && by_inc == incarnation_);  // ours, waiting for the victim's operation
    }
    // A process of this host stopped in the middle of a writing operation is evicted, but its
    // state is reclaimed only once that operation is done (try_recover checks).
    if (dead) try_recover(s, inc);
  }
}

bool SharedPool::try_recover(uint32_t victim, uint32_t incarnation) {
  std::lock_guard<HeapLock> lock(mu_);
  if (evicted_.load()) return false;
  Marked marked(*this);
  if (!marked.ok() || !claim(kClaimRecover, victim, incarnation & 0xffffff)) return false;
  uint32_t inc = 0, evict_inc = 0;
  SlotState state{};
  EvictPhase phase{};
  // Re-read under the claim: someone may have finished it, or the slot moved on.
  const bool same = view_.slot_identity(victim, &inc, &state) && inc == incarnation && state != kSlotFree;
  const bool done = view_.slot_eviction(victim, &evict_inc, &phase) && evict_inc == incarnation && phase == kEvictDone;
  if (!same || done) {
    unclaim();
    return false;
  }
  const uint64_t salt = view_.salt();
  view_.store(view_.slot_word(victim, 1, 1), (uint64_t{incarnation_} << 32) | (slot_ + 1));
  view_.store(view_.slot_word(victim, 1, 0), encode_eviction(incarnation, kEvictRecovering, victim, salt));
  PoolView::fence();
  // The victim marks an operation, fences, then reads its eviction word; we wrote that word,
  // fenced, and now read its mark: if it is inside an operation it did not see the eviction
  // and is storing. A process of this host that is not gone finishes first (it then sees the
  // eviction); we come back at the next period.
  if (may_be_in_operation(victim, incarnation)) {
    unclaim();
    return false;
  }
  recover_slot(victim, incarnation);
  view_.store(view_.slot_word(victim, 1, 0), encode_eviction(incarnation, kEvictDone, victim, salt));
  unclaim();
  ++recovered_slots_;
  return true;
}

void SharedPool::recover_slot(uint32_t victim, uint32_t incarnation) {
  const uint64_t n = view_.extent_count();
  for (uint64_t e = 0; e < n; ++e) {
    ExtentWord w;
    if (!view_.extent(e, &w)) {
      ++corrupt_words_;
      continue;
    }
    if (w.kind == kExtentFree || w.owner_slot != victim || w.owner_inc != (incarnation & 0xffff)) continue;
    if (w.kind == kExtentFormatting) {  // no block was handed out yet
      view_.store(&view_.extent_entry(e)->word, 0);
      continue;
    }
    if (w.kind == kExtentLargeTail) {  // an orphan unless its head (recovered below or before) is the victim's
      ExtentWord head;
      const bool has_head = w.span <= e && view_.extent(e - w.span, &head) && head.kind == kExtentLargeHead &&
                            head.owner_slot == victim && head.owner_inc == w.owner_inc && head.span > w.span;
      if (!has_head) view_.store(&view_.extent_entry(e)->word, 0);
      continue;
    }
    adopt_extent(e, w);
  }
}

// A large block's owner gives its extents back tails first, the head last, once the block's
// state is free. An owner that died in between left a head whose span reaches extents that are
// free now or already another participant's: those are not the block's, and taking the whole
// span would overwrite them. Such a block is finished being released here: its own tails (those
// pointing back to this head at their distance) and then the head are cleared. True when every
// tail is still the block's: the caller adopts it. A tail whose word fails its check is left to
// the caller (restored as the block's, as before).
bool SharedPool::finish_interrupted_release(uint64_t e, const ExtentWord& w) {
  const uint64_t salt = view_.salt();
  auto own_tail = [&](uint32_t i, bool* unreadable) {
    ExtentWord t;
    if (!view_.extent(e + i, &t)) {
      *unreadable = true;
      return true;
    }
    return t.kind == kExtentLargeTail && t.span == i && t.owner_slot == w.owner_slot && t.owner_inc == w.owner_inc;
  };
  bool intact = true;
  for (uint32_t i = 1; i < w.span && intact; ++i) {
    bool unreadable = false;
    intact = own_tail(i, &unreadable);
  }
  if (intact) return true;
  BlockWord bw;
  if (!decode_block(view_.load(&view_.extent_entry(e)->large_state), view_.extent_offset(e), salt, &bw) ||
      bw.state != kBlockFree) {
    ++corrupt_words_;  // tails missing from a block that is not free: no correct writer does that
    return false;
  }
  for (uint32_t i = w.span; i-- > 1;) {
    bool unreadable = false;
    if (own_tail(i, &unreadable) && !unreadable) view_.store(&view_.extent_entry(e + i)->word, 0);
  }
  ExtentEntry* head = view_.extent_entry(e);
  if (bw.generation + 1 > view_.load(&head->next_generation)) view_.store(&head->next_generation, bw.generation + 1);
  view_.store(&head->word, 0);
  return false;
}

void SharedPool::adopt_extent(uint64_t e, const ExtentWord& w) {
  const uint64_t salt = view_.salt();
  const bool large = w.kind == kExtentLargeHead;
  const uint32_t span = large ? w.span : 1;
  if (large && (span == 0 || e + span > view_.extent_count())) {
    ++corrupt_words_;
    return;
  }
  if (large && !finish_interrupted_release(e, w)) return;
  // Take ownership first: from here on this participant is the extents' only writer.
  for (uint32_t i = span; i-- > 0;) {
    ExtentWord mine = w;
    mine.owner_slot = slot_;
    mine.owner_inc = incarnation_;
    if (large) {
      mine.kind = i == 0 ? kExtentLargeHead : kExtentLargeTail;
      mine.span = i == 0 ? span : i;
    }
    view_.store(&view_.extent_entry(e + i)->word, encode_extent(mine, e + i, salt));
  }
  Owned o;
  o.cls = large ? view_.sb().class_count : w.cls;
  o.span = span;
  const uint64_t blocks = large ? 1 : view_.geometry(w.cls).blocks;
  if (!large) o.app.assign(blocks, kNotHeld);  // what we adopt, the application does not hold
  bool corrupt = false;
  std::vector<uint64_t> held;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t offset = large ? view_.extent_offset(e) : view_.block_offset(e, w.cls, b);
    uint64_t* word = large ? &view_.extent_entry(e)->large_state : view_.block_word(e, b);
    BlockWord bw;
    if (!decode_block(view_.load(word), offset, salt, &bw)) {
      ++corrupt_words_;
      corrupt = true;  // unknown state: never handed out again, the extent stays owned
      continue;
    }
    o.max_gen = std::max(o.max_gen, bw.generation);
    if (bw.state == kBlockFree) {
      if (!large) o.free_blocks.push_back(static_cast<uint32_t>(b));
      continue;
    }
    if (bw.state != kBlockAllocated) {
      view_.store(word, encode_block({bw.generation, kBlockReleased}, offset, salt));
      PoolView::fence();
      if (view_.anyone_holds(offset, bw.generation)) {
        held.push_back(offset);
        ++o.used;
        if (!large) in_use_add(view_.class_size(w.cls));  // ours now, until the last lease goes
        continue;
      }
    }
    view_.store(word, encode_block({bw.generation, kBlockFree}, offset, salt));
    if (!large) o.free_blocks.push_back(static_cast<uint32_t>(b));
  }
  if (o.used == 0 && !corrupt) {
    release_extents(e, span, o.max_gen + 1);
    return;
  }
  std::reverse(o.free_blocks.begin(), o.free_blocks.end());
  if (large) in_use_add(uint64_t{span} * view_.extent_size());
  if (!large && !o.free_blocks.empty()) partial_[o.cls].push_back(e);
  owned_[e] = std::move(o);
  released_pending_.insert(released_pending_.end(), held.begin(), held.end());
}

// Extents whose owner incarnation is gone (recovered, left, or its slot moved on) that no
// recovery saw: a participant evicted while alive may have claimed one before it noticed (it
// learns at its next heartbeat). Whoever sweeps first adopts them under an extent claim.
void SharedPool::sweep_orphans() {
  std::lock_guard<HeapLock> lock(mu_);
  if (evicted_.load()) return;
  Marked marked(*this);
  if (!marked.ok()) return;
  const uint64_t salt = view_.salt();
  auto owner_gone = [&](const ExtentWord& w) {
    uint32_t inc = 0, evict_inc = 0;
    SlotState state{};
    EvictPhase phase{};
    if (w.owner_slot >= view_.slot_count() || !view_.slot_identity(w.owner_slot, &inc, &state)) return false;
    if ((inc & 0xffff) != w.owner_inc || state == kSlotFree) return true;
    return view_.slot_eviction(w.owner_slot, &evict_inc, &phase) && evict_inc == inc && phase == kEvictDone;
  };
  for (uint64_t e = 0; e < view_.extent_count(); ++e) {
    ExtentWord w;
    const uint64_t raw = view_.load(&view_.extent_entry(e)->word);
    if (raw == 0 || !decode_extent(raw, e, salt, &w)) continue;
    const bool impossible = (w.kind == kExtentLargeHead && (w.span == 0 || e + w.span > view_.extent_count())) ||
                            (w.kind == kExtentLargeTail && (w.span == 0 || w.span > e));
    if (impossible && owner_gone(w)) {  // a word no correct writer makes: give the extent back
      if (claim(kClaimExtents, static_cast<uint32_t>(e), 1)) {
        if (view_.load(&view_.extent_entry(e)->word) == raw) view_.store(&view_.extent_entry(e)->word, 0);
        unclaim();
      }
      continue;
    }
    if ((w.owner_slot == slot_ && w.owner_inc == owner_word_inc()) || !owner_gone(w)) continue;
    const uint32_t span = w.kind == kExtentLargeHead ? w.span : 1;
    if (span == 0 || e + span > view_.extent_count() || !claim(kClaimExtents, static_cast<uint32_t>(e), span)) continue;
    if (view_.load(&view_.extent_entry(e)->word) == raw) {
      if (w.kind == kExtentFormatting || w.kind == kExtentLargeTail) {
        ExtentWord head;  // a tail is swept alone only when its head no longer covers it
        const bool covered = w.kind == kExtentLargeTail && w.span <= e && view_.extent(e - w.span, &head) &&
                             head.kind == kExtentLargeHead && head.owner_slot == w.owner_slot &&
                             head.owner_inc == w.owner_inc && head.span > w.span;
        if (!covered) view_.store(&view_.extent_entry(e)->word, 0);
      } else {
        adopt_extent(e, w);
      }
    }
    unclaim();
  }
}

void SharedPool::recover_dead_now() {
  ensure_usable();
  const uint64_t deadline = os::monotonic_ns() + timeout_ns_ * 2 + heartbeat_ns_ * 4;
  for (;;) {
    tick();
    bool pending = false;
    for (uint32_t s = 0; s < view_.slot_count(); ++s) {
      uint32_t inc = 0, evict_inc = 0;
      SlotState state{};
      EvictPhase phase{};
      if (s == slot_ || !view_.slot_identity(s, &inc, &state) || state == kSlotFree) continue;
      const bool done = view_.slot_eviction(s, &evict_inc, &phase) && evict_inc == inc && phase == kEvictDone;
      if (done) continue;
      // Pending: what the watch recovers at its next pass (left, gone), and a participant only
      // its heartbeat vouches for while it is silent; a process of this host that lives (running
      // or stopped) is not waited for.
      const PeerLife life = peer_life(s, inc);
      if (state == kSlotLeft || life == PeerLife::kGone) pending = true;
      if (life != PeerLife::kUnverifiable && life != PeerLife::kJoining) continue;
      const uint64_t beat = view_.load(&view_.slot_line0(s)->heartbeat);
      std::lock_guard<std::mutex> watch(watch_mu_);
      if (seen_[s].heartbeat == beat && seen_[s].changed_ns != 0) pending = true;  // silent so far
    }
    if (!pending || os::monotonic_ns() > deadline) {
      sweep_orphans();
      return;
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(heartbeat_ns_));
  }
}

std::vector<cxlpool_shared_quota_t> SharedPool::quotas() {
  ensure_usable();
  std::vector<cxlpool_shared_quota_t> out(view_.sb().quota_count);
  for (uint32_t q = 0; q < view_.sb().quota_count; ++q) {
    std::memcpy(out[q].name, view_.sb().quotas[q].name, sizeof out[q].name);
    out[q].max_extents = grant(q).extents;  // as granted now (docs/compose.md)
    out[q].used_extents = quota_use(q);
  }
  return out;
}

cxlpool_shared_info_t SharedPool::info() {
  ensure_usable();
  cxlpool_shared_info_t out{};
  const Superblock& sb = view_.sb();
  out.pool_id[0] = sb.pool_id[0];
  out.pool_id[1] = sb.pool_id[1];
  out.size = sb.size;
  out.extent_size = sb.extent_size;
  out.extents_total = sb.extent_count;
  for (uint64_t e = 0; e < sb.extent_count; ++e) {
    ExtentWord w;
    if (view_.extent(e, &w) && w.kind == kExtentFree) ++out.extents_free;
  }
  for (uint32_t s = 0; s < view_.slot_count(); ++s)
    if (view_.slot_live(s)) ++out.participants;
  std::lock_guard<HeapLock> lock(mu_);
  owned_.for_each([&](uint64_t, const Owned& o) { out.extents_mine += o.span; });
  out.bytes_cached = cached_bytes();
  out.bytes_in_use = bytes_in_use_ - out.bytes_cached;
  out.slot = slot_;
  out.coherence = sb.coherence;
  out.leases_held = static_cast<uint32_t>(leases_.size());
  out.recovered_slots = recovered_slots_;
  out.corrupt_words = corrupt_words_;
  std::memcpy(out.quota, sb.quotas[quota_].name, sizeof out.quota);
  out.quota_extents_max = grant(quota_).extents;
  out.quota_extents_used = quota_use(quota_);
  return out;
}

// Statistics of this participant and of the pool as it sees it, as JSON: its own figures,
// health, quotas, and every slot in use with its state, liveness as the watch judges it
// (active and not evicted), extents owned, published bytes in use and lease entries. Nothing
// of the device is read once it failed (only this participant's own figures and health).
std::string SharedPool::stats_json() {
  if (in_fork_child()) ensure_usable();  // throws: the child's locks are copies
  const cxlpool_shared_health_t h = health();
  const Superblock& sb = view_.sb();
  JsonWriter j;
  char id[40];
  std::snprintf(id, sizeof id, "%016llx%016llx", static_cast<unsigned long long>(sb.pool_id[0]),
                static_cast<unsigned long long>(sb.pool_id[1]));
  j.begin_object();
  j.key("pool").value(what_).key("pool_id").value(id);
  j.key("coherence")
      .value(sb.coherence == CXLPOOL_COHERENCE_HOST     ? "host"
             : sb.coherence == CXLPOOL_COHERENCE_FABRIC ? "fabric"
                                                        : "none");
  j.key("failure_domain")
      .value(std::string_view(sb.failure_domain, strnlen(sb.failure_domain, sizeof sb.failure_domain)));
  j.key("extent_size").value(sb.extent_size).key("extents_total").value(sb.extent_count);
  j.key("heartbeat_ms").value(uint64_t{sb.heartbeat_ms}).key("lease_timeout_ms").value(uint64_t{sb.lease_timeout_ms});
  j.key("stopped_timeout_ms");
  if (stopped_ns_ == 0)
    j.value("never");
  else
    j.value(stopped_ns_ / 1000000u);
  j.key("health").begin_object();
  j.key("state").value(h.state == CXLPOOL_SHARED_HEALTHY  ? "healthy"
                       : h.state == CXLPOOL_SHARED_FAILED ? "failed"
                                                          : "evicted");
  j.key("reason").value(h.reason).key("leases_lost").value(uint64_t{h.leases_lost});
  j.key("bytes_lost").value(h.bytes_lost).key("extents_lost").value(h.extents_lost);
  j.end_object();
  {
    std::lock_guard<HeapLock> lock(mu_);
    uint64_t mine = 0;
    owned_.for_each([&](uint64_t, const Owned& o) { mine += o.span; });
    j.key("participant").begin_object();
    j.key("slot").value(uint64_t{slot_}).key("incarnation").value(uint64_t{incarnation_});
    j.key("quota").value(
        std::string_view(sb.quotas[quota_].name, strnlen(sb.quotas[quota_].name, sizeof sb.quotas[quota_].name)));
    j.key("extents_mine").value(mine);
    j.key("bytes_cached").value(cached_bytes()).key("bytes_in_use").value(bytes_in_use_ - cached_bytes());
    j.key("leases_held").value(uint64_t{leases_.size()}).key("recovered_slots").value(recovered_slots_);
    j.key("corrupt_words").value(corrupt_words_.load());
    // The gaps between this participant's own beats: what its machine does to a thread that
    // sleeps one period (docs/shared.md, "Liveness").
    j.key("heartbeat").begin_object();
    j.key("period_ms").value(uint64_t{sb.heartbeat_ms}).key("beats").value(gaps_.beats.load());
    j.key("max_gap_ms").value(static_cast<double>(gaps_.max_ns.load()) / 1e6);
    j.key("p99_gap_ms").value(gaps_.quantile_ms(0.99)).key("p999_gap_ms").value(gaps_.quantile_ms(0.999));
    j.end_object();
    j.end_object();
  }
  if (h.state != CXLPOOL_SHARED_FAILED) {
    std::vector<uint64_t> owned(view_.slot_count(), 0), quota_used(sb.quota_count, 0);
    uint64_t free_extents = 0;
    for (uint64_t e = 0; e < view_.extent_count(); ++e) {
      ExtentWord w;
      if (!view_.extent(e, &w)) continue;
      if (w.kind == kExtentFree) {
        ++free_extents;
        continue;
      }
      if (w.owner_slot < owned.size()) ++owned[w.owner_slot];
      if (w.quota < quota_used.size()) ++quota_used[w.quota];
    }
    j.key("extents_free").value(free_extents);
    j.key("quotas").begin_array();
    for (uint32_t q = 0; q < sb.quota_count; ++q) {
      j.begin_object();
      j.key("name").value(std::string_view(sb.quotas[q].name, strnlen(sb.quotas[q].name, sizeof sb.quotas[q].name)));
      const Grant g = grant(q);
      j.key("max_extents").value(g.extents).key("reserved_extents").value(sb.quotas[q].max_extents);
      j.key("grant_damaged").value(!g.readable).key("used_extents").value(quota_used[q]);
      j.end_object();
    }
    j.end_array();
    j.key("participants").begin_array();
    for (uint32_t s = 0; s < view_.slot_count(); ++s) {
      uint32_t inc = 0, evict_inc = 0;
      SlotState state{};
      EvictPhase phase{};
      if (!view_.slot_identity(s, &inc, &state) || state == kSlotFree) continue;
      const bool evicted = view_.slot_eviction(s, &evict_inc, &phase) && phase != kEvictNone && evict_inc == inc;
      uint64_t leases = 0;
      const LeaseEntry* table = view_.lease_table(s);
      for (uint32_t i = 0; i < sb.lease_entries; ++i) {
        const uint64_t off = view_.load(&table[i].offset);
        leases += off != 0 && off != kLeaseTombstone;
      }
      j.begin_object();
      j.key("slot").value(uint64_t{s}).key("host_index").value(uint64_t{s / sb.slots_per_host});
      j.key("incarnation").value(uint64_t{inc});
      j.key("state").value(state == kSlotLeft ? "left" : evicted ? "evicted" : "active");
      j.key("pid").value(view_.load(&view_.slot_line0(s)->pid));
      j.key("alive").value(view_.slot_live(s)).key("self").value(s == slot_);
      // What this host can see of its process: running, stopped, gone, or unverifiable
      // (another host or pid namespace: only its heartbeat tells).
      const PeerLife life = s == slot_ ? PeerLife::kRunning : peer_life(s, inc);
      j.key("process").value(life == PeerLife::kRunning   ? "running"
                             : life == PeerLife::kStopped ? "stopped"
                             : life == PeerLife::kGone    ? "gone"
                             : life == PeerLife::kJoining ? "joining"
                                                          : "unverifiable");
      j.key("extents_owned").value(owned[s]);
      j.key("bytes_in_use").value(view_.load(&view_.slot_counters(s)->bytes_in_use));
      j.key("leases").value(leases);
      j.end_object();
    }
    j.end_array();
  }
  j.end_object();
  return j.str();
}

}  // namespace cxlpool::detail::shared

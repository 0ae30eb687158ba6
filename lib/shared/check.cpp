// SPDX-License-Identifier: MIT
// The shared-pool checker: walks the whole metadata of a pool and counts what breaks an
// invariant (docs/shared.md lists them): words failing their check bits, blocks in use that
// nobody alive owns or leases (leaks), leases naming blocks that are not alive (dangling),
// extents of dead owners, tails without heads. With repair it first joins the pool and
// recovers every dead participant, exactly as a surviving participant would.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <thread>

#include "common/error.hpp"
#include "os/os.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

namespace {

// How a slot was judged, and which incarnation of it: a participant that took the slot after
// the judgement is not the one judged (the slot and extent words read later say whose).
enum class Life : uint8_t { kAlive, kDead, kUnknown };
struct SlotLife {
  Life life = Life::kDead;
  uint32_t incarnation = 0;
  bool joining = false;  // its lease table is not yet its own
};

// Which slots hold a participant that is alive: same host -> its heartbeat thread (or, for a
// participant that did not name one, its process) exists, stopped or not; another host, a
// participant still joining (its facts not yet written), or a process nothing can be told
// about -> its heartbeat moves within one lease timeout, sampled once for all such slots
// but for at most max_wait_ms: a slot whose lease is longer and whose heartbeat did not move
// in that time is kUnknown, never dead.
std::vector<SlotLife> judge_slots(const PoolView& v, uint64_t max_wait_ms, const std::function<void()>& refresh = {}) {
  const uint32_t n = v.slot_count();
  std::vector<SlotLife> out(n);
  std::vector<uint64_t> beats(n, 0);
  std::vector<uint32_t> sampled;
  const uint64_t boot = os::boot_id_hash(), pidns = os::pid_namespace_id();
  for (uint32_t s = 0; s < n; ++s) {
    uint32_t inc = 0;
    SlotState state{};
    if (!v.slot_identity(s, &inc, &state)) continue;
    out[s].incarnation = inc;
    if (!v.slot_live(s)) continue;
    const SlotLine0* line = v.slot_line0(s);
    const bool facts_ours = v.load(&line->facts_incarnation) == inc;
    const PeerLife peer = judge_peer(v, s, inc, boot, pidns);
    if (peer != PeerLife::kUnverifiable && peer != PeerLife::kJoining) {
      out[s].life = peer == PeerLife::kGone ? Life::kDead : Life::kAlive;
      continue;
    }
    out[s].joining = !facts_ours;
    sampled.push_back(s);
    beats[s] = v.load(&line->heartbeat);
  }
  if (sampled.empty()) return out;
  // Look again every heartbeat period (at least 1 ms, at most 100 ms) and stop as soon as every
  // sampled heartbeat has moved: live participants cost one or two periods, not the budget.
  const uint64_t full = uint64_t{v.sb().lease_timeout_ms} + 2 * uint64_t{v.sb().heartbeat_ms};
  const uint64_t budget = std::min(full, max_wait_ms);
  const uint64_t step = std::clamp<uint64_t>(v.sb().heartbeat_ms, 1, 100);
  std::vector<bool> moved(n, false), gone(n, false);
  for (uint64_t waited = 0; waited < budget;) {
    const uint64_t nap = std::min(step, budget - waited);
    std::this_thread::sleep_for(std::chrono::milliseconds(nap));
    waited += nap;
    if (refresh) refresh();  // a copy of the slots (the survey): read them again
    bool all = true;
    for (uint32_t s : sampled) {
      if (!moved[s] && !gone[s]) {
        moved[s] = v.load(&v.slot_line0(s)->heartbeat) != beats[s];
        // Its process may be told about now (one that was exiting, a namespace that ended).
        const PeerLife peer = moved[s] ? PeerLife::kRunning : judge_peer(v, s, out[s].incarnation, boot, pidns);
        moved[s] = moved[s] || peer == PeerLife::kRunning || peer == PeerLife::kStopped;
        gone[s] = peer == PeerLife::kGone;
      }
      all = all && (moved[s] || gone[s]);
    }
    if (all) break;
  }
  for (uint32_t s : sampled) {
    uint32_t inc = 0;
    SlotState state{};
    // A joiner that has not written its facts yet is undecided, never dead: the participants'
    // watch gives it a grace (watch.cpp) before it recovers it.
    out[s].life = moved[s]                            ? Life::kAlive
                  : gone[s]                           ? Life::kDead
                  : (budget < full || out[s].joining) ? Life::kUnknown
                                                      : Life::kDead;
    if (out[s].joining)
      out[s].joining = !(v.slot_identity(s, &inc, &state) && v.load(&v.slot_line0(s)->facts_incarnation) == inc);
  }
  return out;
}

// Whether slot s, as it is now, holds a participant that was judged dead (the same incarnation).
bool dead_now(const PoolView& v, const std::vector<SlotLife>& judged, uint32_t s) {
  uint32_t inc = 0;
  SlotState state{};
  return s < judged.size() && judged[s].life == Life::kDead && v.slot_identity(s, &inc, &state) &&
         inc == judged[s].incarnation;
}

// The checker waits at most this long for silent participants (a lease may be up to an hour):
// those it could not decide on are reported undecided, not dead.
constexpr uint64_t kCheckMaxWaitMs = 60000;
// A survey (cxlpool-info) is a quick look.
constexpr uint64_t kSurveyMaxWaitMs = 2000;

// --repair rewrites damaged words only when nobody but the repairer (slot self) can be writing
// the pool: how many other participants are alive or undecided, as judged from outside. A slot
// whose identity word fails its check counts as alive when that word or its heartbeat changes
// within a lease (a live holder rewrites its identity at every beat).
uint32_t others_alive(const PoolView& v, uint32_t self) {
  const std::vector<SlotLife> judged = judge_slots(v, kCheckMaxWaitMs);
  uint32_t alive = 0;
  std::vector<uint32_t> unreadable;
  for (uint32_t s = 0; s < v.slot_count(); ++s) {
    uint32_t inc = 0;
    SlotState state{};
    if (s == self) continue;
    if (!v.slot_identity(s, &inc, &state)) {
      unreadable.push_back(s);
      continue;
    }
    if (v.slot_live(s) && (inc != judged[s].incarnation || judged[s].life != Life::kDead)) ++alive;
  }
  if (unreadable.empty()) return alive;
  std::vector<uint64_t> identity(v.slot_count()), beat(v.slot_count());
  for (uint32_t s : unreadable) {
    identity[s] = v.load(v.slot_word(s, 0, 0));
    beat[s] = v.load(&v.slot_line0(s)->heartbeat);
  }
  const uint64_t wait_ms = uint64_t{v.sb().lease_timeout_ms} + 2 * uint64_t{v.sb().heartbeat_ms};
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(wait_ms, kCheckMaxWaitMs)));
  for (uint32_t s : unreadable)
    alive += v.load(v.slot_word(s, 0, 0)) != identity[s] || v.load(&v.slot_line0(s)->heartbeat) != beat[s];
  return alive;
}

}  // namespace

uint32_t reset_quota_keys(const std::string& device) {
  MappedPool m = map_pool_unjoined(device);  // refuses what is not a whole pool
  struct Unmap {
    const MappedPool& m;
    ~Unmap() { unmap_pool(m); }
  } unmap{m};
  PoolView v(m.base, m.sb.size, m.sb);
  // An offline recovery: with a participant alive (a tenant, or the host's own) nobody is
  // locked out, and keys changed under running programs would only be a way around them.
  const uint32_t alive = others_alive(v, UINT32_MAX);
  if (alive != 0)
    fail(CXLPOOL_E_BUSY, "shared pool \"" + device + "\": " + std::to_string(alive) +
                             " participant(s) alive; reset-keys is for a pool nobody can join, and runs only while "
                             "no program has it open (cxlpool-pool info lists them)");
  uint32_t reset = 0;
  for (uint32_t q = 0; q < v.sb().quota_count; ++q) {
    if (v.load(v.key_word(q)) == 0) continue;
    v.store(v.key_word(q), 0);
    ++reset;
  }
  writeback_lines(reinterpret_cast<std::byte*>(v.key_word(0)), kLine);
  full_fence();
  return reset;
}

cxlpool_shared_check_report_t check_pool(const std::string& device, const SharedParams* params, bool repair) {
  cxlpool_shared_check_report_t r{};
  RepairCounts fixed;
  if (repair) {
    repair_superblock(device, &fixed);  // before anything can open the pool
    auto pool = SharedPool::open(device, params);
    r.repair_blocked = others_alive(pool->view(), pool->slot());
    if (r.repair_blocked == 0) pool->repair_words_before_recovery(&fixed);
    if (r.repair_blocked == 0) pool->repair_grants(&fixed);
    pool->recover_dead_now();
    if (r.repair_blocked == 0) pool->repair_words_after_recovery(&fixed);
    r.recovered = pool->info().recovered_slots;
    pool->leave();
  }
  r.words_repaired = fixed.words_repaired;
  r.words_reset = fixed.words_reset;
  r.extents_reformatted = fixed.extents_reformatted;
  r.blocks_lost = fixed.blocks_lost;
  MappedPool m = map_pool_unjoined(device);
  try {
    PoolView v(m.base, m.sb.size, m.sb);
    const uint64_t salt = v.salt();
    const std::vector<SlotLife> judged = judge_slots(v, kCheckMaxWaitMs);
    // Alive for leases: judged alive or undecided, or a newer incarnation since the judgement.
    auto counts_alive = [&](uint32_t s) { return v.slot_live(s) && !dead_now(v, judged, s); };
    auto held_by_alive = [&](uint64_t offset, uint32_t gen) {
      for (uint32_t s = 0; s < v.slot_count(); ++s)
        if (counts_alive(s) && !judged[s].joining && v.slot_holds(s, offset, gen)) return true;
      return false;
    };
    for (uint32_t s = 0; s < v.slot_count(); ++s) {
      uint32_t inc = 0, evict_inc = 0;
      SlotState state{};
      EvictPhase phase{};
      if (!v.slot_identity(s, &inc, &state) || !v.slot_eviction(s, &evict_inc, &phase)) {
        ++r.corrupt_words;
        continue;
      }
      if (state == kSlotFree || (evict_inc == inc && phase == kEvictDone)) continue;
      if (inc != judged[s].incarnation || judged[s].life == Life::kAlive)
        ++r.live_participants;  // (a participant that joined the slot since: alive)
      else if (judged[s].life == Life::kUnknown)
        ++r.undecided_participants;
      else
        ++r.dead_participants;
    }
    r.extents_total = v.extent_count();
    std::vector<uint64_t> quota_used(v.sb().quota_count, 0);
    for (uint64_t e = 0; e < v.extent_count(); ++e) {
      ExtentWord w;
      if (v.load(&v.extent_entry(e)->next_generation) > UINT32_MAX) ++r.corrupt_words;  // generations are 32 bits
      if (!v.extent(e, &w)) {
        ++r.corrupt_words;
        continue;
      }
      if (w.kind == kExtentFree) {
        ++r.extents_free;
        continue;
      }
      if (w.quota < quota_used.size()) ++quota_used[w.quota];
      // Owned by the slot's current incarnation, which was not judged dead (an extent of an
      // earlier incarnation is an orphan whatever holds the slot now).
      uint32_t owner_inc_now = 0;
      SlotState owner_state{};
      const bool owner_alive = w.owner_slot < v.slot_count() && v.slot_live(w.owner_slot) &&
                               v.slot_identity(w.owner_slot, &owner_inc_now, &owner_state) &&
                               (owner_inc_now & 0xffff) == w.owner_inc && !dead_now(v, judged, w.owner_slot);
      if (!owner_alive) ++r.orphan_extents;
      if (w.kind == kExtentFormatting) {
        ++r.extents_formatting;
        continue;
      }
      if (w.kind == kExtentLargeTail) {
        ExtentWord head;
        if (w.span > e || !v.extent(e - w.span, &head) || head.kind != kExtentLargeHead ||
            head.owner_slot != w.owner_slot || head.span <= w.span)
          ++r.corrupt_words;  // a tail whose head does not cover it
        continue;
      }
      const bool large = w.kind == kExtentLargeHead;
      if (large)
        ++r.extents_large;
      else
        ++r.extents_small;
      if (!large && w.cls >= v.sb().class_count) {
        ++r.corrupt_words;
        continue;
      }
      const uint64_t blocks = large ? 1 : v.geometry(w.cls).blocks;
      for (uint64_t b = 0; b < blocks; ++b) {
        const uint64_t offset = large ? v.extent_offset(e) : v.block_offset(e, w.cls, b);
        const uint64_t* word = large ? &v.extent_entry(e)->large_state : v.block_word(e, b);
        BlockWord bw;
        if (!decode_block(v.load(word), offset, salt, &bw)) {
          ++r.corrupt_words;
          continue;
        }
        if (bw.state == kBlockFree) continue;
        ++r.blocks_in_use;
        if (bw.state != kBlockAllocated) ++r.blocks_exported;
        if (!owner_alive && !(bw.state != kBlockAllocated && held_by_alive(offset, bw.generation))) ++r.leaked_blocks;
      }
    }
    for (uint32_t s = 0; s < v.slot_count(); ++s) {
      if (!counts_alive(s) || judged[s].joining) continue;  // a joiner's table: its predecessor's leases
      const LeaseEntry* table = v.lease_table(s);
      for (uint32_t i = 0; i < v.sb().lease_entries; ++i) {
        const uint64_t offset = v.load(&table[i].offset);
        if (offset == 0 || offset == kLeaseTombstone) continue;
        ++r.leases;
        const uint64_t gc = v.load(&table[i].gen_check);
        const auto gen = static_cast<uint32_t>(gc >> 32);
        if (gc != lease_gen_check(offset, gen, s, salt)) {
          ++r.corrupt_words;
          continue;
        }
        BlockRef at;
        ExtentWord w;
        BlockWord bw;
        const bool ok = v.locate(offset, &at, &w) && decode_block(v.load(at.state), offset, salt, &bw) &&
                        (bw.state == kBlockExported || bw.state == kBlockReleased) && bw.generation == gen;
        if (!ok) ++r.dangling_leases;
      }
    }
    r.corrupt_words += grant_problems(v, quota_used);
  } catch (...) {
    unmap_pool(m);
    throw;
  }
  unmap_pool(m);
  return r;
}

// Read-only, with pread on a descriptor opened O_RDONLY after an O_PATH look: nothing of the
// device is mapped (a file truncated meanwhile cannot SIGBUS us, holes of a sparse file are
// not filled in on tmpfs), and the extent and lease tables are streamed in bounded chunks.
cxlpool_shared_survey_t survey_pool(const std::string& device, std::vector<cxlpool_shared_participant_t>* out) {
  const PoolLocation loc = locate_pool(device);
  const std::string what = "shared pool \"" + device + "\"";
  SharedObject obj = loc.ops->open(loc.spec, false, what);
  const int fd = obj.fd;
  auto not_a_pool = [&] {
    fail(CXLPOOL_E_NOT_FOUND, "\"" + device + "\" carries no cxlpool shared-pool header (not a pool); left untouched");
  };
  auto read = [&](void* buf, uint64_t len, uint64_t off) {
    if (!os::read_exact(fd, buf, len, off))
      fail(CXLPOOL_E_NOT_FOUND,
           what + ": shrank, vanished or could not be read while surveyed (" + std::strerror(errno) + ")");
  };
  const uint64_t device_size = obj.size;
  if (device_size < kSuperblockBytes) not_a_pool();
  std::vector<uint64_t> head(kSuperblockBytes / 8);
  read(head.data(), kSuperblockBytes, 0);
  if (std::memcmp(head.data(), kMagic, sizeof kMagic) != 0) not_a_pool();
  const Superblock sb = PoolView::validate(head.data(), device_size, what);
  const uint64_t slot_count = uint64_t{sb.hosts} * sb.slots_per_host;
  const uint64_t slots_end = sb.slots_offset + slot_count * kSlotBytes;
  std::vector<uint64_t> words((slots_end + 7) / 8);  // the superblock and the slots, nothing else
  auto* base = reinterpret_cast<std::byte*>(words.data());
  std::memcpy(base, head.data(), kSuperblockBytes);
  auto read_slots = [&] { read(base + sb.slots_offset, slot_count * kSlotBytes, sb.slots_offset); };
  read_slots();
  PoolView v(base, slots_end, sb);

  cxlpool_shared_survey_t r{};
  out->clear();
  r.pool_id[0] = sb.pool_id[0];
  r.pool_id[1] = sb.pool_id[1];
  r.size = sb.size;
  r.extent_size = sb.extent_size;
  r.extents_total = sb.extent_count;
  r.coherence = sb.coherence;
  r.hosts = sb.hosts;
  r.slots_per_host = sb.slots_per_host;
  r.heartbeat_ms = sb.heartbeat_ms;
  r.lease_timeout_ms = sb.lease_timeout_ms;
  r.stopped_timeout_ms = sb.stopped_timeout_ms == 0 ? kDefaultStoppedTimeoutMs : sb.stopped_timeout_ms;
  r.quota_count = std::min<uint32_t>(sb.quota_count, 16);
  std::memcpy(r.failure_domain, sb.failure_domain, sizeof r.failure_domain - 1);
  for (uint32_t q = 0; q < r.quota_count; ++q) {
    std::memcpy(r.quotas[q].name, sb.quotas[q].name, sizeof r.quotas[q].name - 1);
    uint64_t granted = 0;
    bool set = false;
    if (!decode_grant(v.load(v.grant_word(q)), q, v.salt(), &granted, &set)) ++r.corrupt_words;
    r.quotas[q].max_extents = set ? granted : sb.quotas[q].max_extents;  // as granted now
  }

  // The extent table, 8192 entries (one line each: kExtentEntryBytes) at a time.
  std::vector<uint64_t> owned(slot_count, 0);
  constexpr uint64_t kChunk = 8192, kWordsPerEntry = kExtentEntryBytes / 8;
  std::vector<uint64_t> chunk(kChunk * kWordsPerEntry);
  std::vector<std::pair<uint32_t, uint32_t>> extent_owners;  // (slot, incarnation low bits), per owned extent
  for (uint64_t e0 = 0; e0 < sb.extent_count; e0 += kChunk) {
    const uint64_t n = std::min<uint64_t>(kChunk, sb.extent_count - e0);
    read(chunk.data(), n * kExtentEntryBytes, sb.extents_offset + e0 * kExtentEntryBytes);
    for (uint64_t i = 0; i < n; ++i) {
      ExtentWord w;
      if (!v.extent_word(chunk[i * kWordsPerEntry + offsetof(ExtentEntry, word) / 8], e0 + i, &w)) {
        ++r.corrupt_words;
        continue;
      }
      if (w.kind == kExtentFree) {
        ++r.extents_free;
        continue;
      }
      if (w.quota < r.quota_count) ++r.quotas[w.quota].used_extents;
      if (w.owner_slot < slot_count) {
        ++owned[w.owner_slot];
        extent_owners.emplace_back(w.owner_slot, w.owner_inc);
      }
    }
  }

  const std::vector<SlotLife> judged = judge_slots(v, kSurveyMaxWaitMs, read_slots);
  std::vector<LeaseEntry> leases(std::min<uint64_t>(sb.lease_entries, 65536));
  for (uint32_t s = 0; s < slot_count; ++s) {
    uint32_t inc = 0, evict_inc = 0;
    SlotState state{};
    EvictPhase phase{};
    if (!v.slot_identity(s, &inc, &state)) {
      ++r.corrupt_words;
      continue;
    }
    if (state == kSlotFree) continue;
    const bool evicted = v.slot_eviction(s, &evict_inc, &phase) && phase != kEvictNone && evict_inc == inc;
    cxlpool_shared_participant_t p{};
    const SlotLine0* line = v.slot_line0(s);
    p.slot = s;
    p.host_index = s / sb.slots_per_host;
    p.incarnation = inc;
    p.state = state == kSlotLeft ? CXLPOOL_SHARED_SLOT_LEFT  // (its blocks adopted: an eviction record too)
              : evicted          ? CXLPOOL_SHARED_SLOT_EVICTED
                                 : CXLPOOL_SHARED_SLOT_ACTIVE;
    p.pid = static_cast<int64_t>(v.load(&line->pid));
    const bool newer = inc != judged[s].incarnation;  // joined the slot during the look
    p.alive = newer || judged[s].life == Life::kAlive ? 1 : judged[s].life == Life::kUnknown ? 2 : 0;
    if (p.alive == 0 && !(evicted && phase == kEvictDone)) ++r.dead_not_recovered;
    for (uint64_t i0 = 0; i0 < sb.lease_entries && !judged[s].joining && p.state != CXLPOOL_SHARED_SLOT_EVICTED;
         i0 += leases.size()) {
      const uint64_t n = std::min<uint64_t>(leases.size(), sb.lease_entries - i0);
      read(leases.data(), n * sizeof(LeaseEntry),
           sb.leases_offset + (uint64_t{s} * sb.lease_entries + i0) * sizeof(LeaseEntry));
      for (uint64_t i = 0; i < n; ++i)
        if (leases[i].offset != 0 && leases[i].offset != kLeaseTombstone) ++p.leases;
    }
    p.extents_owned = owned[s];
    p.bytes_in_use = v.load(&v.slot_counters(s)->bytes_in_use);
    if (p.alive == 1) ++r.participants_alive;
    out->push_back(p);
  }
  // Extents whose owner is not the live incarnation of their slot.
  for (const auto& [slot, inc16] : extent_owners) {
    uint32_t inc = 0;
    SlotState state{};
    const bool owner_alive = v.slot_live(slot) && v.slot_identity(slot, &inc, &state) && (inc & 0xffff) == inc16 &&
                             !dead_now(v, judged, slot);
    if (!owner_alive) ++r.orphan_extents;
  }
  r.participant_count = static_cast<uint32_t>(out->size());
  return r;
}

}  // namespace cxlpool::detail::shared

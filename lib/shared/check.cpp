// SPDX-License-Identifier: MIT
// The shared-pool checker: walks the whole metadata of a pool and counts what breaks an
// invariant (docs/shared.md lists them): words failing their check bits, blocks in use that
// nobody alive owns or leases (leaks), leases naming blocks that are not alive (dangling),
// extents of dead owners, tails without heads. With repair it first joins the pool and
// recovers every dead participant, exactly as a surviving participant would.
#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "os/os.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

namespace {

// Which slots hold a participant that is alive: same host -> its process exists; another host,
// or a participant still joining (its facts not yet written) -> its heartbeat moves within one
// lease timeout (sampled once for all such slots). joining[s]: its lease table is not yet its own.
std::vector<bool> alive_slots(const PoolView& v, std::vector<bool>* joining) {
  const uint32_t n = v.slot_count();
  std::vector<bool> alive(n, false);
  joining->assign(n, false);
  std::vector<uint64_t> beats(n, 0);
  std::vector<uint32_t> sampled;
  const uint64_t boot = os::boot_id_hash(), pidns = os::pid_namespace_id();
  for (uint32_t s = 0; s < n; ++s) {
    if (!v.slot_live(s)) continue;
    const SlotLine0* line = v.slot_line0(s);
    uint32_t inc = 0;
    SlotState state{};
    const bool facts_ours = v.slot_identity(s, &inc, &state) && v.load(&line->facts_incarnation) == inc;
    if (facts_ours && v.load(&line->boot_hash) == boot && v.load(&line->pidns) == pidns) {
      const auto pid = static_cast<int>(v.load(&line->pid));
      alive[s] = pid > 0 && os::process_start_ticks(pid) == v.load(&line->start_ticks);
    } else {
      (*joining)[s] = !facts_ours;
      sampled.push_back(s);
      beats[s] = v.load(&line->heartbeat);
    }
  }
  if (!sampled.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(v.sb().lease_timeout_ms + 2 * v.sb().heartbeat_ms));
    for (uint32_t s : sampled) {
      const SlotLine0* line = v.slot_line0(s);
      uint32_t inc = 0;
      SlotState state{};
      alive[s] = v.load(&line->heartbeat) != beats[s];
      if ((*joining)[s]) (*joining)[s] = !(v.slot_identity(s, &inc, &state) && v.load(&line->facts_incarnation) == inc);
    }
  }
  return alive;
}

}  // namespace

cxlpool_shared_check_report_t check_pool(const std::string& device, const SharedParams* params, bool repair) {
  cxlpool_shared_check_report_t r{};
  if (repair) {
    auto pool = SharedPool::open(device, params);
    pool->recover_dead_now();
    r.recovered = pool->info().recovered_slots;
    pool->leave();
  }
  MappedPool m = map_pool_unjoined(device);
  try {
    PoolView v(m.base, m.sb.size, m.sb);
    const uint64_t salt = v.salt();
    std::vector<bool> joining;
    const std::vector<bool> alive = alive_slots(v, &joining);
    auto held_by_alive = [&](uint64_t offset, uint32_t gen) {
      for (uint32_t s = 0; s < v.slot_count(); ++s)
        if (alive[s] && !joining[s] && v.slot_holds(s, offset, gen)) return true;
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
      if (alive[s]) {
        ++r.live_participants;
      } else if (state != kSlotFree && !(evict_inc == inc && phase == kEvictDone)) {
        ++r.dead_participants;
      }
    }
    r.extents_total = v.extent_count();
    for (uint64_t e = 0; e < v.extent_count(); ++e) {
      ExtentWord w;
      if (!v.extent(e, &w)) {
        ++r.corrupt_words;
        continue;
      }
      if (w.kind == kExtentFree) {
        ++r.extents_free;
        continue;
      }
      const bool owner_alive = w.owner_slot < v.slot_count() && alive[w.owner_slot];
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
      if (!alive[s] || joining[s]) continue;  // a joiner's table still holds its predecessor's leases
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
  } catch (...) {
    unmap_pool(m);
    throw;
  }
  unmap_pool(m);
  return r;
}

cxlpool_shared_survey_t survey_pool(const std::string& device, std::vector<cxlpool_shared_participant_t>* out) {
  if (!has_pool_header(device))
    fail(CXLPOOL_E_NOT_FOUND, "\"" + device + "\" carries no cxlpool shared-pool header (not a pool); left untouched");
  cxlpool_shared_survey_t r{};
  out->clear();
  MappedPool m = map_pool_unjoined(device);
  try {
    PoolView v(m.base, m.sb.size, m.sb);
    const Superblock& sb = v.sb();
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
    r.quota_count = std::min<uint32_t>(sb.quota_count, 16);
    std::memcpy(r.failure_domain, sb.failure_domain, sizeof r.failure_domain - 1);
    std::vector<uint64_t> owned(v.slot_count(), 0);
    for (uint32_t q = 0; q < r.quota_count; ++q) {
      std::memcpy(r.quotas[q].name, sb.quotas[q].name, sizeof r.quotas[q].name - 1);
      r.quotas[q].max_extents = sb.quotas[q].max_extents;
    }
    for (uint64_t e = 0; e < v.extent_count(); ++e) {
      ExtentWord w;
      if (v.extent(e, &w) && w.kind == kExtentFree) {
        ++r.extents_free;
        continue;
      }
      if (!v.extent(e, &w)) continue;
      if (w.quota < r.quota_count) ++r.quotas[w.quota].used_extents;
      if (w.owner_slot < v.slot_count()) ++owned[w.owner_slot];
    }
    std::vector<bool> joining;
    const std::vector<bool> alive = alive_slots(v, &joining);
    for (uint32_t s = 0; s < v.slot_count(); ++s) {
      uint32_t inc = 0, evict_inc = 0;
      SlotState state{};
      EvictPhase phase{};
      if (!v.slot_identity(s, &inc, &state) || state == kSlotFree) continue;
      const bool evicted = v.slot_eviction(s, &evict_inc, &phase) && phase != kEvictNone && evict_inc == inc;
      cxlpool_shared_participant_t p{};
      const SlotLine0* line = v.slot_line0(s);
      p.slot = s;
      p.host_index = s / sb.slots_per_host;
      p.incarnation = inc;
      p.state = evicted              ? CXLPOOL_SHARED_SLOT_EVICTED
                : state == kSlotLeft ? CXLPOOL_SHARED_SLOT_LEFT
                                     : CXLPOOL_SHARED_SLOT_ACTIVE;
      p.pid = static_cast<int64_t>(v.load(&line->pid));
      p.alive = alive[s] ? 1 : 0;
      const LeaseEntry* table = v.lease_table(s);
      for (uint32_t i = 0; i < sb.lease_entries && !joining[s]; ++i) {
        const uint64_t offset = v.load(&table[i].offset);
        if (offset != 0 && offset != kLeaseTombstone) ++p.leases;
      }
      p.extents_owned = owned[s];
      p.bytes_in_use = v.load(&v.slot_counters(s)->bytes_in_use);
      if (p.alive) ++r.participants_alive;
      out->push_back(p);
    }
    r.participant_count = static_cast<uint32_t>(out->size());
  } catch (...) {
    unmap_pool(m);
    throw;
  }
  unmap_pool(m);
  return r;
}

}  // namespace cxlpool::detail::shared

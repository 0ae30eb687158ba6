// SPDX-License-Identifier: MIT
// PoolView (see view.hpp): superblock validation, device names, lease-table probes.
#include "shared/view.hpp"

#include <cstring>

#include "common/error.hpp"

namespace cxlpool::detail::shared {

using detail::fail;

PoolLocation locate_pool(const std::string& device) {
  const std::string what = "shared pool \"" + device + "\"";
  PoolLocation loc;
  loc.text = device;
  const std::string why = parse_location(device, &loc.spec);
  if (!why.empty()) fail(CXLPOOL_E_CONFIG, what + ": " + why);
  loc.ops = &shared_object_ops(loc.spec, what);
  const Provider* p = provider_for(loc.spec.kind);
  loc.path = p->named_path(loc.spec);
  loc.device_node = p->device_node;
  return loc;
}

Superblock PoolView::validate(const void* base, uint64_t size, const std::string& what) {
  Superblock sb;
  if (size < kSuperblockBytes) fail(CXLPOOL_E_CORRUPT, what + ": too small to hold a shared pool");
  std::memcpy(&sb, base, sizeof sb);
  auto bad = [&](const std::string& why) { fail(CXLPOOL_E_CORRUPT, what + ": " + why); };
  if (std::memcmp(sb.magic, kMagic, sizeof kMagic) != 0)
    bad("no cxlpool shared-pool header (not a pool, or formatted by something else); left untouched");
  if (sb.layout_version != kLayoutVersion)
    bad("layout version " + std::to_string(sb.layout_version) + ", this library reads version " +
        std::to_string(kLayoutVersion));
  if (sb.checksum != crc32c(&sb, offsetof(Superblock, checksum))) bad("superblock checksum mismatch");
  if (sb.state != kStateReady) bad("pool creation never completed (the creator died while formatting)");
  const uint64_t slots = uint64_t{sb.hosts} * sb.slots_per_host;
  const bool pow2_leases = sb.lease_entries >= 8 && (sb.lease_entries & (sb.lease_entries - 1)) == 0;
  const bool pow2_extent = sb.extent_size >= (256u << 10) && (sb.extent_size & (sb.extent_size - 1)) == 0;
  if (sb.size > size)
    bad("superblock says " + std::to_string(sb.size) + " bytes, the device has " + std::to_string(size));
  if (slots == 0 || slots > kMaxSlots || !pow2_leases || !pow2_extent || sb.class_count == 0 ||
      sb.class_count > kMaxClasses || sb.heartbeat_ms == 0 || sb.heartbeat_ms > 60000 ||
      sb.lease_timeout_ms < 3 * uint64_t{sb.heartbeat_ms} || sb.lease_timeout_ms > 3600000 ||
      sb.coherence > CXLPOOL_COHERENCE_NONE ||
      (sb.stopped_timeout_ms != 0 && sb.stopped_timeout_ms != kStoppedNever &&
       (sb.stopped_timeout_ms < 3 * uint64_t{sb.heartbeat_ms} || sb.stopped_timeout_ms > 86400000)))
    bad("superblock geometry out of range");
  // Every product below is bounded first, so a forged superblock cannot wrap the arithmetic.
  const bool bounded = sb.size <= (uint64_t{1} << 52) && sb.extent_size <= (uint64_t{1} << 30) &&
                       sb.lease_entries <= (1u << 20) && sb.extent_count >= 1 && sb.extent_count <= (1u << 24) &&
                       sb.slots_offset <= sb.size && sb.leases_offset <= sb.size && sb.extents_offset <= sb.size &&
                       sb.data_offset <= sb.size;
  if (!bounded) bad("superblock geometry out of range");
  const uint64_t leases_end = sb.leases_offset + slots * sb.lease_entries * kLeaseEntryBytes;
  // The layout every creator writes (plan_superblock): the slots right after the superblock,
  // each table at the next page after the previous one. Nothing else is accepted, so a forged
  // superblock cannot make a reader size its buffers by a gap it invented.
  auto page_up = [](uint64_t v) { return (v + 4095) / 4096 * 4096; };
  if (sb.slots_offset != kSuperblockBytes || sb.leases_offset != page_up(sb.slots_offset + slots * kSlotBytes) ||
      sb.extents_offset != page_up(leases_end))
    bad("superblock offsets inconsistent");
  if (sb.slots_offset < kSuperblockBytes || sb.leases_offset < sb.slots_offset + slots * kSlotBytes ||
      sb.extents_offset < leases_end || sb.data_offset < sb.extents_offset + sb.extent_count * kExtentEntryBytes ||
      sb.data_offset % kLine != 0 || sb.extent_count * sb.extent_size > sb.size - sb.data_offset)
    bad("superblock offsets inconsistent");
  uint64_t quota_extents = 0;
  if (sb.quota_count == 0 || sb.quota_count > kMaxQuotas) bad("quota table invalid");
  for (uint32_t q = 0; q < sb.quota_count; ++q) {
    if (std::memchr(sb.quotas[q].name, 0, sizeof sb.quotas[q].name) == nullptr || sb.quotas[q].name[0] == 0)
      bad("quota table invalid");
    quota_extents += sb.quotas[q].max_extents;
  }
  if (quota_extents != sb.extent_count) bad("quotas do not add up to the pool's extents");
  if (std::memchr(sb.failure_domain, 0, sizeof sb.failure_domain) == nullptr) bad("failure domain invalid");
  uint32_t prev = 0;
  for (uint32_t c = 0; c < sb.class_count; ++c) {
    const uint32_t s = sb.class_size[c];
    if (s <= prev || s % kMinBlock != 0 || s > sb.extent_size / 4) bad("size class table invalid");
    prev = s;
  }
  return sb;
}

PoolView::PoolView(std::byte* base, uint64_t size, const Superblock& sb) : base_(base), size_(size), sb_(sb) {
  for (uint32_t c = 0; c < sb.class_count; ++c) geometry_.push_back(small_geometry(sb.extent_size, sb.class_size[c]));
}

uint32_t PoolView::class_for(uint64_t size) const {
  for (uint32_t c = 0; c < sb_.class_count; ++c)
    if (size <= sb_.class_size[c]) return c;
  return sb_.class_count;
}

bool PoolView::locate(uint64_t offset, BlockRef* out, ExtentWord* w) const {
  if (offset < sb_.data_offset || offset >= sb_.data_offset + sb_.extent_count * sb_.extent_size) return false;
  const uint64_t e = (offset - sb_.data_offset) / sb_.extent_size;
  if (!extent(e, w)) return false;
  out->extent = e;
  if (w->kind == kExtentSmall) {
    if (w->cls >= sb_.class_count) return false;
    const SmallGeometry& g = geometry_[w->cls];
    const uint64_t start = extent_offset(e) + g.meta_bytes;
    const uint64_t cs = class_size(w->cls);
    if (offset < start || (offset - start) % cs != 0 || (offset - start) / cs >= g.blocks) return false;
    out->block = (offset - start) / cs;
    out->bytes = cs;
    out->state = block_word(e, out->block);
  } else if (w->kind == kExtentLargeHead) {
    if (offset != extent_offset(e) || w->span == 0 || e + w->span > sb_.extent_count) return false;
    out->block = 0;
    out->bytes = uint64_t{w->span} * sb_.extent_size;
    out->state = &extent_entry(e)->large_state;
  } else {
    return false;
  }
  out->offset = offset;
  return true;
}

bool PoolView::slot_live(uint32_t slot) const {
  uint32_t inc = 0, evict_inc = 0;
  SlotState state{};
  EvictPhase phase{};
  if (!slot_identity(slot, &inc, &state) || state != kSlotActive) return false;
  if (!slot_eviction(slot, &evict_inc, &phase)) return true;  // conservative: a scribbled eviction word
  return !(phase != kEvictNone && evict_inc == inc);
}

bool PoolView::slot_recovering(uint32_t slot) const {
  uint32_t inc = 0, evict_inc = 0;
  SlotState state{};
  EvictPhase phase{};
  return slot_identity(slot, &inc, &state) && state == kSlotActive && slot_eviction(slot, &evict_inc, &phase) &&
         phase == kEvictRecovering && evict_inc == inc;
}

bool PoolView::slot_tables_current(uint32_t slot) const {
  uint32_t inc = 0;
  SlotState state{};
  return slot_identity(slot, &inc, &state) && load(&slot_line0(slot)->facts_incarnation) == inc;
}

bool PoolView::slot_holds(uint32_t slot, uint64_t offset, uint32_t generation) const {
  LeaseEntry* table = lease_table(slot);
  const uint64_t mask = sb_.lease_entries - 1;
  for (uint64_t i = 0, h = lease_hash(offset); i <= mask; ++i) {
    LeaseEntry* e = &table[(h + i) & mask];
    const uint64_t off = load(&e->offset);
    if (off == 0) return false;  // end of the probe chain
    if (off != offset) continue;
    const uint64_t gc = load(&e->gen_check);
    if (gc == lease_gen_check(offset, generation, slot, salt())) return true;
  }
  return false;
}

bool PoolView::anyone_holds(uint64_t offset, uint32_t generation) const {
  for (uint32_t s = 0; s < slot_count(); ++s)
    if (slot_live(s) && slot_tables_current(s) && slot_holds(s, offset, generation)) return true;
  return false;
}

}  // namespace cxlpool::detail::shared

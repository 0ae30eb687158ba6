// SPDX-License-Identifier: MIT
// PoolView: a mapped shared pool seen through its validated superblock: where every slot,
// lease table, extent entry and block lives, and the loads and stores that respect the pool's
// coherence (non-coherent pools write back after each store and invalidate before each load).
// Used by participants and by the offline checker alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backing/provider.hpp"
#include "cxlpool/shared.h"
#include "shared/coherence.hpp"
#include "shared/layout.hpp"

namespace cxlpool::detail::shared {

// A block found from its offset: its extent, index, size and state word.
struct BlockRef {
  uint64_t extent = 0;
  uint64_t block = 0;  // index in a small extent; 0 for a large block
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t* state = nullptr;
};

// Where a pool lives: a named device in the device layer's one location grammar
// (backing/provider.hpp: shm:NAME, file:PATH, devdax:PATH), opened through its provider.
struct PoolLocation {
  BackingSpec spec;                      // the device's kind and path
  const SharedObjectOps* ops = nullptr;  // its provider's named-object operations
  std::string path;                      // the object's name (shm:NAME -> /dev/shm/NAME)
  bool device_node = false;              // devdax: a device node, not a file
  std::string text;                      // as the user wrote it, for messages
};
// CXLPOOL_E_CONFIG naming the pool when device is not a named device that can hold one.
PoolLocation locate_pool(const std::string& device);

class PoolView {
 public:
  // Validates a superblock read from [base, base+size): magic, version, checksum, geometry.
  // Throws CXLPOOL_E_CORRUPT naming what is wrong (what names the pool in messages).
  static Superblock validate(const void* base, uint64_t size, const std::string& what);
  PoolView(std::byte* base, uint64_t size, const Superblock& sb);

  const Superblock& sb() const { return sb_; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t salt() const { return sb_.pool_id[0] ^ sb_.pool_id[1]; }
  uint32_t slot_count() const { return sb_.hosts * sb_.slots_per_host; }
  uint64_t extent_count() const { return sb_.extent_count; }
  uint64_t extent_size() const { return sb_.extent_size; }
  bool noncoherent() const { return sb_.coherence == CXLPOOL_COHERENCE_NONE; }

  // ---- addresses ----
  uint64_t* slot_word(uint32_t slot, uint32_t line, uint32_t word) const {
    return reinterpret_cast<uint64_t*>(base_ + sb_.slots_offset + uint64_t{slot} * kSlotBytes + line * kLine) + word;
  }
  SlotLine0* slot_line0(uint32_t slot) const { return reinterpret_cast<SlotLine0*>(slot_word(slot, 0, 0)); }
  SlotCounters* slot_counters(uint32_t slot) const { return reinterpret_cast<SlotCounters*>(slot_word(slot, 3, 0)); }
  LeaseEntry* lease_table(uint32_t slot) const {
    return reinterpret_cast<LeaseEntry*>(base_ + sb_.leases_offset +
                                         uint64_t{slot} * sb_.lease_entries * kLeaseEntryBytes);
  }
  ExtentEntry* extent_entry(uint64_t e) const {
    return reinterpret_cast<ExtentEntry*>(base_ + sb_.extents_offset + e * kExtentEntryBytes);
  }
  uint64_t extent_offset(uint64_t e) const { return sb_.data_offset + e * sb_.extent_size; }
  uint64_t* grant_word(uint32_t quota) const { return reinterpret_cast<uint64_t*>(base_ + kGrantOffset) + quota; }
  uint64_t* policy_words(uint32_t quota) const {
    return reinterpret_cast<uint64_t*>(base_ + kPolicyOffset) + 2 * size_t{quota};
  }
  uint64_t* key_word(uint32_t quota) const { return reinterpret_cast<uint64_t*>(base_ + kKeyOffset) + quota; }
  uint64_t class_size(uint32_t cls) const { return sb_.class_size[cls]; }
  const SmallGeometry& geometry(uint32_t cls) const { return geometry_[cls]; }
  uint64_t* block_word(uint64_t e, uint64_t block) const {
    return reinterpret_cast<uint64_t*>(base_ + extent_offset(e)) + block;
  }
  uint64_t block_offset(uint64_t e, uint32_t cls, uint64_t block) const {
    return extent_offset(e) + geometry_[cls].meta_bytes + block * class_size(cls);
  }
  // Smallest class holding size bytes, or class_count() when size needs whole extents.
  uint32_t class_for(uint64_t size) const;

  // ---- coherent access ----
  uint64_t load(const uint64_t* p) const noexcept {
    if (noncoherent()) invalidate_lines(p, sizeof(uint64_t));
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
  }
  void store(uint64_t* p, uint64_t v) const noexcept {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
    if (noncoherent()) writeback_lines(p, sizeof(uint64_t));
  }
  // Compare-and-swap, only on words written by processes of one host (a slot's words): one
  // host's caches are coherent. Written back on coherence none for the other hosts' readers.
  bool compare_and_swap(uint64_t* p, uint64_t expected, uint64_t desired) const noexcept {
    const bool ok = __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (ok && noncoherent()) writeback_lines(p, sizeof(uint64_t));
    return ok;
  }
  // Store-load ordering for the Dekker-style handshakes (claims, lease vs release).
  static void fence() noexcept { full_fence(); }

  // ---- decoded reads ----
  // The decoded word of extent e; false when it fails its check or describes the impossible
  // (a large block of 0 extents or running past the table, a tail before the table's start).
  bool extent(uint64_t e, ExtentWord* out) const { return extent_word(load(&extent_entry(e)->word), e, out); }
  // The same for a word read some other way (the survey reads the table with pread).
  bool extent_word(uint64_t raw, uint64_t e, ExtentWord* out) const {
    if (!decode_extent(raw, e, salt(), out)) return false;
    if (out->kind == kExtentLargeHead) return out->span != 0 && e + out->span <= sb_.extent_count;
    if (out->kind == kExtentLargeTail) return out->span != 0 && out->span <= e;
    return out->cls < sb_.class_count || out->kind == kExtentFree;
  }
  bool slot_identity(uint32_t slot, uint32_t* inc, SlotState* state) const {
    return decode_slot_identity(load(slot_word(slot, 0, 0)), slot, salt(), inc, state);
  }
  bool slot_eviction(uint32_t slot, uint32_t* inc, EvictPhase* phase) const {
    return decode_eviction(load(slot_word(slot, 1, 0)), slot, salt(), inc, phase);
  }
  // The block starting at offset (any owner); false when offset is not a block start.
  bool locate(uint64_t offset, BlockRef* out, ExtentWord* w) const;
  // Whether slot's participant currently counts as alive for leases: active and not evicted.
  bool slot_live(uint32_t slot) const;
  // Whether slot's participant is evicted and its recovery has begun but not ended (a process
  // of the recoverer's host that is inside an operation holds recovery off until it is out).
  bool slot_recovering(uint32_t slot) const;
  // Whether the slot's lease table and claim words are its present incarnation's: a joiner
  // clears its predecessor's before it writes facts_incarnation, so until then what the
  // tables hold is the predecessor's, recovered already, and holds nothing.
  bool slot_tables_current(uint32_t slot) const;
  // Whether slot's lease table holds (offset, generation) (probe of its hash table).
  bool slot_holds(uint32_t slot, uint64_t offset, uint32_t generation) const;
  // Whether any live slot holds a lease on (offset, generation).
  bool anyone_holds(uint64_t offset, uint32_t generation) const;
  uint64_t lease_hash(uint64_t offset) const { return (offset / kMinBlock) * 0x9e3779b97f4a7c15ull >> 20; }

 private:
  std::byte* base_;
  uint64_t size_;
  Superblock sb_;
  std::vector<SmallGeometry> geometry_;
};

}  // namespace cxlpool::detail::shared

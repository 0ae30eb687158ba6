// SPDX-License-Identifier: MIT
// --repair of damaged words (cxlpool-pool check --repair, cxlpool_shared_pool_check): a word
// that fails its check bits is restored when exactly one flipped bit explains it (or, for the
// superblock, from its copy); otherwise it is reset to what a free slot or extent holds, with
// the generations it may have issued skipped and the blocks it described counted as lost.
// Words are rewritten only while no participant but the repairer is alive (check.cpp), so no
// word rewritten here can be a live participant's. docs/shared.md, "Repair", lists every kind.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "os/os.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::shared {

namespace {

// What a lost word may have issued is unknown: generations resume half the 32-bit space above
// what is known, so no handle of a lost block names a block formatted later (handles compare
// generations for equality, and wrap like any generation).
constexpr uint32_t kLostGenerationMargin = 1u << 31;

// The single-bit flip of raw that ok() accepts, when there is exactly one.
template <class Ok>
bool one_bit_away(uint64_t raw, Ok ok, uint64_t* out) {
  int found = 0;
  uint64_t only = 0;
  for (int bit = 0; bit < 64; ++bit) {
    const uint64_t candidate = raw ^ (uint64_t{1} << bit);
    if (ok(candidate)) {
      if (++found > 1) return false;
      only = candidate;
    }
  }
  if (found == 1) *out = only;
  return found == 1;
}

bool superblock_valid(const Superblock& sb, uint64_t device_size, const std::string& what) {
  if (sb.checksum != crc32c(&sb, offsetof(Superblock, checksum))) return false;  // cheap first
  try {
    PoolView::validate(&sb, device_size, what);
    return true;
  } catch (const Failure&) {
    return false;
  }
}

}  // namespace

void repair_superblock(const std::string& device, RepairCounts* counts) {
  const PoolLocation loc = locate_pool(device);
  const std::string what = "shared pool \"" + device + "\"";
  SharedObject obj = loc.ops->open(loc.spec, true, what);
  const bool devdax = obj.device_node;
  const int fd = obj.fd;
  const uint64_t device_size = obj.size;
  if (device_size < kSuperblockBytes) return;  // not a pool: opening it says so
  const size_t head_len = devdax ? (2u << 20) : kSuperblockBytes;
  auto* head = static_cast<std::byte*>(os::map_shared_fd(fd, head_len, 0, what));
  struct Unmap {
    std::byte* p;
    size_t len;
    ~Unmap() { os::unmap(p, len); }
  } unmap{head, head_len};
  Superblock primary{}, copy{};
  std::memcpy(&primary, head, sizeof primary);
  std::memcpy(&copy, head + kSuperblockCopyOffset, sizeof copy);
  auto write = [&](const Superblock& sb, bool both) {
    if (both) std::memcpy(head, &sb, sizeof sb);
    std::memcpy(head + kSuperblockCopyOffset, &sb, sizeof sb);
    writeback_lines(head, kSuperblockCopyOffset + sizeof sb);
    full_fence();
  };
  if (superblock_valid(primary, device_size, what)) {
    constexpr size_t kChecked = offsetof(Superblock, checksum) + sizeof(uint32_t);  // (no padding)
    if (std::memcmp(head, head + kSuperblockCopyOffset, kChecked) != 0) {
      // A pool made before the copy existed has zeros there: given one, nothing was damaged.
      const bool was_copy = std::memcmp(copy.magic, kMagic, sizeof kMagic) == 0;
      write(primary, false);
      if (was_copy) ++counts->words_repaired;
    }
    return;
  }
  // Only what was such a pool is rewritten: its copy is whole, or exactly one flipped bit of
  // the primary gives a superblock that passes every check (a file that is not a pool is
  // neither, and stays untouched).
  Superblock fixed{};
  bool have = superblock_valid(copy, device_size, what);
  if (have) {
    fixed = copy;
  } else {
    auto* bytes = reinterpret_cast<unsigned char*>(&primary);
    int found = 0;
    for (size_t bit = 0; bit < sizeof primary * 8 && found < 2; ++bit) {
      bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      if (superblock_valid(primary, device_size, what)) {
        fixed = primary;
        ++found;
      }
      bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    }
    have = found == 1;
  }
  if (!have) return;  // beyond repair: opening it names what is wrong
  write(fixed, true);
  ++counts->words_repaired;
}

// The word of extent e when its neighbours say what it was: a tail is what the head covering
// it says (owner, quota, distance back); a head of several extents is what its tails say, when
// its own block word is whole. Never a word that would pass for this participant's own.
bool SharedPool::rebuild_large(uint64_t e, ExtentWord* out) const {
  const uint64_t n = view_.extent_count();
  ExtentWord prev, head, next, t;
  BlockWord bw;
  bool have = false;
  if (e > 0 && view_.extent(e - 1, &prev) && (prev.kind == kExtentLargeHead || prev.kind == kExtentLargeTail)) {
    const uint64_t h = prev.kind == kExtentLargeHead ? e - 1 : e - 1 - prev.span;
    if (view_.extent(h, &head) && head.kind == kExtentLargeHead && head.span > e - h &&
        head.owner_slot == prev.owner_slot && head.owner_inc == prev.owner_inc) {
      *out = head;
      out->kind = kExtentLargeTail;
      out->span = static_cast<uint32_t>(e - h);
      have = true;
    }
  }
  if (!have && e + 1 < n && view_.extent(e + 1, &next) && next.kind == kExtentLargeTail && next.span == 1 &&
      decode_block(view_.load(&view_.extent_entry(e)->large_state), view_.extent_offset(e), view_.salt(), &bw)) {
    uint32_t span = 1;
    while (e + span < n && span <= kMaxSpan && view_.extent(e + span, &t) && t.kind == kExtentLargeTail &&
           t.span == span && t.owner_slot == next.owner_slot && t.owner_inc == next.owner_inc)
      ++span;
    *out = next;
    out->kind = kExtentLargeHead;
    out->span = span;
    have = true;
  }
  return have && out->owner_slot < view_.slot_count() &&
         !(out->owner_slot == slot_ && out->owner_inc == owner_word_inc());
}

// Before recovery, holding no claim: other slots' identity and eviction words, the claim words
// of dead slots, and the extent table. What is restored here then goes through recovery and
// the orphan sweep like any dead participant's state.
void SharedPool::repair_words_before_recovery(RepairCounts* counts) {
  std::lock_guard<HeapLock> lock(mu_);
  ensure_usable(true);
  Marked marked(*this);
  const uint64_t salt = view_.salt();
  const uint64_t n = view_.extent_count();

  for (uint32_t s = 0; s < view_.slot_count(); ++s) {
    if (s == slot_) continue;
    uint64_t* identity = view_.slot_word(s, 0, 0);
    const uint64_t raw = view_.load(identity);
    uint32_t inc = 0;
    SlotState state{};
    if (!decode_slot_identity(raw, s, salt, &inc, &state)) {
      // Compare-and-swap is valid among the processes of one host only (one host's caches are
      // coherent): another host's slot is repaired from that host (--host-index).
      if (s / view_.sb().slots_per_host != view_.load(&view_.slot_line0(slot_)->host_index)) continue;
      uint64_t fixed = 0;
      const bool exact = one_bit_away(
          raw,
          [&](uint64_t w) {
            uint32_t i = 0;
            SlotState st{};
            return decode_slot_identity(w, s, salt, &i, &st);
          },
          &fixed);
      if (!exact) {
        // Free, with an incarnation that no extent names (nor the next one, which the next
        // joiner takes): the extents it held become orphans, adopted and freed by the sweep.
        std::vector<bool> named(1u << 16, false);
        for (uint64_t e = 0; e < n; ++e) {
          ExtentWord w;
          if (view_.extent(e, &w) && w.kind != kExtentFree && w.owner_slot == s) named[w.owner_inc & 0xffff] = true;
        }
        uint32_t next = static_cast<uint32_t>(raw >> 32) + 1;
        for (uint32_t k = 0; k < (1u << 16) && (named[next & 0xffff] || named[(next + 1) & 0xffff]); ++k) ++next;
        fixed = encode_slot_identity(next, kSlotFree, s, salt);
      }
      // Joiners take slots by compare-and-swap on this word: so does the repair.
      uint64_t expected = raw;
      if (!__atomic_compare_exchange_n(identity, &expected, fixed, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;  // taken meanwhile: its new holder wrote it
      if (view_.noncoherent()) writeback_lines(identity, sizeof *identity);
      ++(exact ? counts->words_repaired : counts->words_reset);
      decode_slot_identity(fixed, s, salt, &inc, &state);
    }
    uint64_t* eviction = view_.slot_word(s, 1, 0);
    uint32_t evict_inc = 0;
    EvictPhase phase{};
    const uint64_t eraw = view_.load(eviction);
    const bool eviction_ok = decode_eviction(eraw, s, salt, &evict_inc, &phase);
    const bool recovered = eviction_ok && phase == kEvictDone && evict_inc == inc;
    // Claim words of a dead participant no joiner can have taken yet (nothing reads those of
    // free or recovered slots, and the next joiner clears them).
    if (state != kSlotFree && !recovered) {
      for (uint32_t word = 0; word < 2; ++word) {
        uint64_t* claim_word = view_.slot_word(s, 2, word);
        ClaimKind k{};
        uint32_t f = 0, c = 0, q = 0;
        const uint64_t craw = view_.load(claim_word);
        const bool ok =
            word == 0 ? craw == 0 || decode_claim(craw, s, salt, &k, &f, &c) : decode_quota_claim(craw, s, salt, &q);
        if (ok) continue;
        view_.store(claim_word, 0);
        ++counts->words_reset;
      }
    }
    if (eviction_ok) continue;
    // The recoverer's word: written under the recover claim of the slot.
    if (!claim(kClaimRecover, s, inc & 0xffffff)) continue;  // someone recovers it: theirs to write
    uint64_t fixed = 0;
    const bool exact = one_bit_away(
        eraw,
        [&](uint64_t w) {
          uint32_t i = 0;
          EvictPhase p{};
          return decode_eviction(w, s, salt, &i, &p);
        },
        &fixed);
    // Not restorable: a free slot reads as recovered; a dead one as not yet evicted, which
    // the recovery that follows evicts and recovers from scratch (its steps are idempotent).
    if (!exact) fixed = encode_eviction(inc, state == kSlotFree ? kEvictDone : kEvictNone, s, salt);
    view_.store(eviction, fixed);
    unclaim();
    ++(exact ? counts->words_repaired : counts->words_reset);
  }

  for (uint64_t e = 0; e < n; ++e) {
    ExtentEntry* entry = view_.extent_entry(e);
    ExtentWord w;
    const bool word_ok = view_.extent(e, &w);
    const bool generation_ok = view_.load(&entry->next_generation) <= UINT32_MAX;  // generations are 32 bits
    if (word_ok && generation_ok) continue;
    if (!claim(kClaimExtents, static_cast<uint32_t>(e), 1)) continue;  // a live claimer: left for the check to report
    const uint64_t raw = view_.load(&entry->word);
    if (!word_ok && !view_.extent_word(raw, e, &w)) {
      uint64_t fixed = 0;
      // A candidate must agree with what the extent holds: its block words decode as its
      // class, a head's block word decodes, a tail's head covers it.
      auto fits = [&](uint64_t candidate) {
        ExtentWord c;
        if (!view_.extent_word(candidate, e, &c)) return false;
        if (c.kind == kExtentFree) return true;
        if (c.owner_slot >= view_.slot_count()) return false;
        if (c.owner_slot == slot_ && c.owner_inc == owner_word_inc()) return false;  // not ours: we just came
        BlockWord bw;
        if (c.kind == kExtentLargeHead)
          return decode_block(view_.load(&entry->large_state), view_.extent_offset(e), salt, &bw);
        if (c.kind == kExtentLargeTail) {
          ExtentWord head;
          return view_.extent(e - c.span, &head) && head.kind == kExtentLargeHead && head.owner_slot == c.owner_slot &&
                 head.owner_inc == c.owner_inc && head.span > c.span;
        }
        if (c.kind == kExtentFormatting) return true;  // its block words may be half written
        const SmallGeometry& g = view_.geometry(c.cls);
        uint64_t good = 0;
        for (uint64_t b = 0; b < g.blocks; ++b)
          good += decode_block(view_.load(view_.block_word(e, b)), view_.block_offset(e, c.cls, b), salt, &bw);
        return 2 * good >= g.blocks;
      };
      ExtentWord rebuilt;
      const bool exact = one_bit_away(raw, fits, &fixed);
      if (exact || rebuild_large(e, &rebuilt)) {
        if (!exact) fixed = encode_extent(rebuilt, e, salt);
        view_.store(&entry->word, fixed);  // its owner is dead: recovery or the sweep takes it from here
        ++counts->words_repaired;
      } else {
        // Whose it was and what it was cannot be told: what its memory holds still tells the
        // generations issued there and the blocks in use, under every class it could have had.
        uint32_t max_gen = static_cast<uint32_t>(view_.load(&entry->next_generation));
        bool known = false;
        uint64_t in_use = 0;
        BlockWord bw;
        if (decode_block(view_.load(&entry->large_state), view_.extent_offset(e), salt, &bw)) {
          known = true;
          max_gen = std::max(max_gen, bw.generation);
          in_use = bw.state != kBlockFree;
        }
        for (uint32_t cls = 0; cls < view_.sb().class_count; ++cls) {
          const SmallGeometry& g = view_.geometry(cls);
          uint32_t gen = 0;
          uint64_t used = 0;
          bool all = true;
          for (uint64_t b = 0; b < g.blocks && all; ++b) {
            all = decode_block(view_.load(view_.block_word(e, b)), view_.block_offset(e, cls, b), salt, &bw);
            gen = std::max(gen, bw.generation);
            used += bw.state != kBlockFree;
          }
          if (!all) continue;
          known = true;
          max_gen = std::max(max_gen, gen);
          in_use = std::max(in_use, used);
        }
        const uint32_t next = max_gen + (known ? 1 : kLostGenerationMargin);
        view_.store(&entry->next_generation, next == 0 ? 1 : next);
        view_.store(&entry->word, 0);
        ++counts->words_reset;
        ++counts->extents_reformatted;
        counts->blocks_lost += in_use;
      }
    }
    const uint64_t generation = view_.load(&entry->next_generation);
    if (generation > UINT32_MAX) {  // scribbled high bits: the low ones are not trusted either
      const uint32_t next = static_cast<uint32_t>(generation) + kLostGenerationMargin;
      view_.store(&entry->next_generation, next == 0 ? 1 : next);
      ++counts->words_reset;
    }
    unclaim();
  }
}

// After recovery: the block words of the extents this participant adopted (recovery keeps an
// extent whose block words it cannot read). Leaving then frees and releases them as usual.
void SharedPool::repair_words_after_recovery(RepairCounts* counts) {
  std::lock_guard<HeapLock> lock(mu_);
  ensure_usable(true);
  Marked marked(*this);
  const uint64_t salt = view_.salt();
  std::vector<uint64_t> extents;
  owned_.for_each([&](uint64_t e, const Owned&) { extents.push_back(e); });
  for (uint64_t e : extents) {
    Owned& o = owned_[e];
    const bool large = o.cls >= view_.sb().class_count;
    const uint64_t blocks = large ? 1 : view_.geometry(o.cls).blocks;
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t offset = large ? view_.extent_offset(e) : view_.block_offset(e, o.cls, b);
      uint64_t* word = large ? &view_.extent_entry(e)->large_state : view_.block_word(e, b);
      const uint64_t raw = view_.load(word);
      BlockWord bw;
      if (decode_block(raw, offset, salt, &bw)) continue;
      uint64_t fixed = 0;
      if (one_bit_away(
              raw, [&](uint64_t w) { return decode_block(w, offset, salt, &bw); }, &fixed)) {
        decode_block(fixed, offset, salt, &bw);
        view_.store(word, fixed);
        o.max_gen = std::max(o.max_gen, bw.generation);
        if (bw.state == kBlockFree) {
          if (!large) o.free_blocks.push_back(static_cast<uint32_t>(b));
        } else {
          ++o.used;  // in use by the dead: leaving frees it like the others
        }
        ++counts->words_repaired;
        continue;
      }
      // State and generation lost with the word: the block is lost, and generations in this
      // extent resume above anything it may have had.
      o.max_gen += kLostGenerationMargin;
      view_.store(word, encode_block({o.max_gen, kBlockFree}, offset, salt));
      if (!large) o.free_blocks.push_back(static_cast<uint32_t>(b));
      ++counts->words_reset;
      ++counts->blocks_lost;
    }
  }
}

}  // namespace cxlpool::detail::shared

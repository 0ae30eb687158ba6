// SPDX-License-Identifier: MIT
// The on-device layout of a shared pool: everything that describes the pool lives in the
// device, as offsets from its start (each participant maps it at its own address). Every
// word written after creation is a single aligned 64-bit store carrying its own check bits,
// so a crash at any instruction leaves each word either old or new, and scribbles are seen.
//
//   offset 0            superblock (4 KiB; written once at creation, checksummed)
//   slots_offset        hosts x slots_per_host participant slots, 512 B each (4 lines of 128 B)
//   leases_offset       one lease table per slot: lease_entries x 16 B
//   extents_offset      extent table: extent_count x 128 B (one line per extent, one writer)
//   data_offset         extent_count extents of extent_size bytes (aligned to extent_size)
//
// Single-writer rule (docs/shared.md): a slot's lines 0, 2, 3 and its lease table are written
// only by the participant holding the slot; line 1 only by whoever won the claim to recover
// it; an extent's line and its blocks' state words only by the extent's owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "backing/provider.hpp"

namespace cxlpool::detail::shared {

// The device layer recognises a shared device by it (backing/provider.hpp).
inline constexpr const char (&kMagic)[16] = kSharedPoolMagic;
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr size_t kLine = 128;  // one writer per 128-byte line (adjacent-line prefetch)
inline constexpr size_t kSuperblockBytes = 4096;
inline constexpr size_t kSlotBytes = 4 * kLine;
inline constexpr size_t kLeaseEntryBytes = 16;
inline constexpr size_t kExtentEntryBytes = kLine;
inline constexpr size_t kMinBlock = 128;  // blocks are 128-byte aligned: no two owners per line
inline constexpr uint32_t kMaxClasses = 48;
inline constexpr uint32_t kMaxSlots = 255;            // slot number + 1 fits in 8 bits of an extent word
inline constexpr uint32_t kMaxSpan = (1u << 11) - 1;  // extents in one large block
inline constexpr uint32_t kMaxQuotas = 16;            // quota 0 is "default": what the others leave

enum : uint32_t { kStateCreating = 1, kStateReady = 2 };
inline constexpr uint32_t kStoppedNever = 0xffffffffu;
inline constexpr uint32_t kDefaultStoppedTimeoutMs = 10 * 60 * 1000;

struct Superblock {
  char magic[16];
  uint32_t layout_version;
  uint32_t state;  // kStateReady once complete (devdax pools are formatted in place)
  uint64_t pool_id[2];
  uint64_t size;
  uint64_t created_ns;  // CLOCK_REALTIME at creation: the creation generation
  uint32_t coherence;   // cxlpool_coherence_t
  uint32_t hosts;
  uint32_t slots_per_host;
  uint32_t lease_entries;  // per slot, a power of two >= 8
  uint64_t extent_size;
  uint64_t extent_count;
  uint32_t heartbeat_ms;
  uint32_t lease_timeout_ms;
  uint64_t slots_offset, leases_offset, extents_offset, data_offset;
  uint32_t class_count;
  uint32_t mode;  // permission bits the creator asked for
  uint32_t class_size[kMaxClasses];
  uint32_t quota_count;  // >= 1
  // How long a participant of this host whose heartbeat thread is stopped (SIGSTOP, a
  // debugger) may stay silent before it is declared dead: 0 = kDefaultStoppedTimeoutMs (pools
  // created before the field existed hold 0), kStoppedNever = never while its process lives.
  uint32_t stopped_timeout_ms;
  struct Quota {
    char name[24];         // NUL-terminated
    uint64_t max_extents;  // extents its participants may own together
  } quotas[kMaxQuotas];
  char failure_domain[32];  // NUL-terminated; devices that fail together share one
  uint32_t checksum;        // crc32c of every byte before it
};
static_assert(sizeof(Superblock) <= kSuperblockBytes);
// A second copy of the superblock, written with it at creation in the same page: what
// --repair restores a damaged superblock from (pools made before it have zeros there, and get
// one the first time a check --repair finds their superblock whole).
inline constexpr size_t kSuperblockCopyOffset = kSuperblockBytes / 2;
static_assert(sizeof(Superblock) <= kSuperblockCopyOffset);

// ---- Grants (composition, docs/compose.md) -----------------------------------------------
// One line in the superblock's page, after its copy: a grant word per quota, the extents its
// participants may own together now. Written only by a participant holding the compose claim
// (line 2 of its slot, kind kClaimCompose), read by every claimer of extents. 0 = never
// granted: the quota's max_extents in the superblock holds. word: extents (40) | check (24);
// a written word is never 0. The grants never add up to more than the pool's extents counted
// as max(granted, owned) per quota (the composer's invariant).
inline constexpr size_t kGrantOffset = 3 * kSuperblockBytes / 4;
static_assert(kSuperblockCopyOffset + sizeof(Superblock) <= kGrantOffset);
static_assert(kGrantOffset + kMaxQuotas * sizeof(uint64_t) <= kSuperblockBytes);
static_assert(kMaxQuotas * sizeof(uint64_t) == kLine);
// The next two lines: each quota's policy, two words (min extents (40) | check (24); max
// extents (40) | priority (8) | check (16); each check covers both words, so a pair torn by a
// crash fails), written by the compose claim's holder. 0 = none (minimum 0, no maximum but
// the pool, priority 0).
inline constexpr size_t kPolicyOffset = kGrantOffset + kLine;
static_assert(kPolicyOffset + size_t{2} * kMaxQuotas * sizeof(uint64_t) <= kSuperblockBytes);
struct QuotaPolicy {
  uint64_t min_extents = 0;
  uint64_t max_extents = 0;  // 0: the pool
  uint32_t priority = 0;     // 0..255: higher is served first and never gives to a lower one
};
void encode_policy(const QuotaPolicy& p, uint32_t quota, uint64_t salt, uint64_t out[2]) noexcept;
bool decode_policy(const uint64_t raw[2], uint32_t quota, uint64_t salt, QuotaPolicy* out) noexcept;
// The line after: each quota's key word. 0 = the quota is open to any participant; set, a
// participant joins the quota only with the key whose hash it holds (docs/compose.md,
// "Containers"): hash (40) | check (24), written by the compose claim's holder. The key keeps
// cooperating programs to the quota they were given; the pool's memory itself is reachable
// by anyone who can map the device, so it is no boundary against a hostile one.
inline constexpr size_t kKeyOffset = kPolicyOffset + 2 * kLine;
static_assert(kKeyOffset + kMaxQuotas * sizeof(uint64_t) <= kSuperblockBytes);
inline constexpr size_t kKeyBytes = 16;  // a key: 128 random bits, written as 32 hex digits
uint64_t encode_key(const unsigned char key[kKeyBytes], uint32_t quota, uint64_t salt) noexcept;
// false when the check bits do not match (a damaged word); *set false for 0 (no key).
bool key_word_valid(uint64_t raw, uint32_t quota, uint64_t salt, bool* set) noexcept;
// A key's text: 32 hexadecimal digits (either case on input, lower case out).
bool parse_quota_key(std::string_view text, unsigned char out[kKeyBytes]) noexcept;
std::string format_quota_key(const unsigned char key[kKeyBytes]);
// A participant's demand, slot line 3 word 6 (owner-written): the extents its last failed
// claim needed beyond its quota's grant, with its quota and a sequence number that moves at
// every failure (a composer counts demand whose sequence moved recently). 0 = none.
// quota (8) | seq (24) | extents (32).
inline constexpr uint32_t kDemandWord = 6;
uint64_t encode_grant(uint64_t extents, uint32_t quota, uint64_t salt) noexcept;
// false when the check bits do not match; *set false for a word never written.
bool decode_grant(uint64_t raw, uint32_t quota, uint64_t salt, uint64_t* extents, bool* set) noexcept;

// ---- Checks ------------------------------------------------------------------------------
uint32_t crc32c(const void* data, size_t len, uint32_t seed = 0) noexcept;
// Mixes a value with its position and the pool's salt, so a word copied elsewhere fails.
uint32_t word_check(uint64_t payload, uint64_t where, uint64_t salt) noexcept;

// ---- Participant slot (512 B) ------------------------------------------------------------
// Line 0, word 0 "identity": incarnation (32) | check (24) | state (8). Claimed by CAS among
// the processes of one host (slots are grouped by host; one host's caches are coherent).
enum SlotState : uint8_t { kSlotFree = 0, kSlotActive = 1, kSlotLeft = 2 };
// The heartbeat and op_seq words carry the incarnation in their high 32 bits and are changed by
// compare-and-swap from the value their writer last stored: a participant that was evicted
// and whose slot another process of its host has taken since finds the word changed and stores
// nothing into the newcomer's slot.
struct SlotLine0 {
  uint64_t identity;
  uint64_t heartbeat;  // (incarnation << 32) | beats: moves every heartbeat period while alive
  uint64_t pid;        // same-host liveness (with boot id, pid namespace, start times)
  uint64_t start_ticks;
  uint64_t boot_hash;
  uint64_t pidns;
  uint64_t host_index;
  uint64_t facts_incarnation;  // written after the other facts: they describe this incarnation
  uint64_t op_seq;             // (incarnation << 32) | seq: seq odd while an operation writes the pool
  uint64_t beat_tid;           // facts too: the thread that beats (0: judge the process)
  uint64_t beat_start_ticks;   // its start time (0: unknown)
};
// Line 1, word 0 "eviction": incarnation (32) | check (24) | phase (8), written by the
// participant that won the claim to recover the slot; word 1 = that participant's incarnation
// (high 32 bits) and slot + 1 (low 32 bits).
enum EvictPhase : uint8_t { kEvictNone = 0, kEvictRecovering = 1, kEvictDone = 2 };
// Line 2, word 0 "claim": kind (2) | first (24) | count (24) | check (14). Dekker-style: write,
// fence, read everyone else's; any overlap -> withdraw. Word 1 "quota claim": quota + 1 (or 0)
// | check: claimers of extents for one quota exclude each other while they count its use.
// kClaimCompose: the holder changes grant words (compose.cpp); any two compose claims overlap,
// and its quota claim names the quota whose grant it lowers, excluding that quota's claimers.
enum ClaimKind : uint8_t { kClaimNone = 0, kClaimExtents = 1, kClaimRecover = 2, kClaimCompose = 3 };
// Line 3: counters (owner-written; informational).
struct SlotCounters {
  uint64_t allocs, frees, imports, releases, recovered_slots, bytes_in_use, demand;
};

// ---- Extent entry (128 B) ----------------------------------------------------------------
// word 0: payload (48) | check (16); 0 = free. payload: owner slot+1 (8) | owner incarnation
// low 16 bits (16) | kind (3) | class (6) | quota (4) | span (11). The quota travels with the
// extent: a recoverer holding a dead participant's extents holds them on its quota's account.
enum ExtentKind : uint8_t {
  kExtentFree = 0,
  kExtentFormatting = 1,  // claimed, state words being written; no block handed out yet
  kExtentSmall = 2,
  kExtentLargeHead = 3,
  kExtentLargeTail = 4,  // span = distance back to the head
};
// word 1: the large block's state word (heads only). word 2: next generation for the
// extent (blocks formatted later start above every generation issued before).
struct ExtentEntry {
  uint64_t word;
  uint64_t large_state;
  uint64_t next_generation;
};

struct ExtentWord {
  uint32_t owner_slot = 0;  // slot index; valid when kind != free
  uint32_t owner_inc = 0;   // low 16 bits of the owner's incarnation
  ExtentKind kind = kExtentFree;
  uint32_t cls = 0;
  uint32_t span = 0;
  uint32_t quota = 0;
};
uint64_t encode_extent(const ExtentWord& w, uint64_t index, uint64_t salt) noexcept;
// false when the check bits do not match (corrupt or torn by a scribbler).
bool decode_extent(uint64_t raw, uint64_t index, uint64_t salt, ExtentWord* out) noexcept;

// ---- Block state word (8 B per block) ----------------------------------------------------
// generation (32) | state (2) | check (30). 0 = free, generation 0, never allocated.
enum BlockState : uint8_t {
  kBlockFree = 0,
  kBlockAllocated = 1,  // held by the extent's owner only
  kBlockExported = 2,   // held by the owner; handles may exist, importers hold leases
  kBlockReleased = 3,   // the owner let go; lives while some participant holds a lease
};
struct BlockWord {
  uint32_t generation = 0;
  BlockState state = kBlockFree;
};
uint64_t encode_block(BlockWord w, uint64_t offset, uint64_t salt) noexcept;
bool decode_block(uint64_t raw, uint64_t offset, uint64_t salt, BlockWord* out) noexcept;

// ---- Lease entry (16 B) ------------------------------------------------------------------
// word 0: block offset (0 = empty, kLeaseTombstone = removed); word 1: generation (32) |
// check (32). Written generation first, offset last; removed by writing the tombstone.
inline constexpr uint64_t kLeaseTombstone = ~uint64_t{0};
struct LeaseEntry {
  uint64_t offset;
  uint64_t gen_check;
};

uint64_t encode_slot_identity(uint32_t incarnation, SlotState state, uint64_t slot, uint64_t salt) noexcept;
bool decode_slot_identity(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* inc, SlotState* state) noexcept;
uint64_t encode_eviction(uint32_t incarnation, EvictPhase phase, uint64_t slot, uint64_t salt) noexcept;
bool decode_eviction(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* inc, EvictPhase* phase) noexcept;
uint64_t encode_claim(ClaimKind kind, uint32_t first, uint32_t count, uint64_t slot, uint64_t salt) noexcept;
bool decode_claim(uint64_t raw, uint64_t slot, uint64_t salt, ClaimKind* kind, uint32_t* first,
                  uint32_t* count) noexcept;
uint64_t encode_quota_claim(uint32_t quota_plus_one, uint64_t slot, uint64_t salt) noexcept;
bool decode_quota_claim(uint64_t raw, uint64_t slot, uint64_t salt, uint32_t* quota_plus_one) noexcept;
uint64_t lease_gen_check(uint64_t offset, uint32_t generation, uint64_t slot, uint64_t salt) noexcept;

// ---- Geometry ----------------------------------------------------------------------------
// Blocks of class size s in one extent: n state words (rounded up to kMinBlock) then n blocks.
struct SmallGeometry {
  uint64_t blocks = 0;
  uint64_t meta_bytes = 0;  // state words, rounded up to kMinBlock
};
SmallGeometry small_geometry(uint64_t extent_size, uint64_t class_size) noexcept;

}  // namespace cxlpool::detail::shared

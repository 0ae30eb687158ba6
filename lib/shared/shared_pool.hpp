// SPDX-License-Identifier: MIT
// SharedPool: this process's participation in a shared pool: its slot, heartbeat and the
// watch over the other participants (recovery of the dead), the extents it owns and the
// blocks in them, its leases on other participants' blocks. Private bookkeeping here only
// speeds things up; the truth is in the device (layout.hpp) and recovery rebuilds from it.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cxlpool/shared.h"
#include "device/registry.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "shared/compose_plan.hpp"
#include "shared/noncoherent_view.hpp"
#include "shared/view.hpp"

namespace cxlpool::detail::shared {

struct SharedParams {
  uint64_t size = 0;
  uint64_t extent_size = 2u << 20;
  cxlpool_coherence_t coherence = CXLPOOL_COHERENCE_HOST;
  unsigned mode = 0600;
  uint32_t hosts = 1;
  uint32_t per_host = 32;
  uint32_t leases = 4096;
  uint32_t heartbeat_ms = 10;
  uint32_t lease_timeout_ms = 5000;
  uint32_t stopped_timeout_ms = 0;  // 0: kDefaultStoppedTimeoutMs; kStoppedNever
  uint32_t host_index = 0;
  std::vector<std::pair<std::string, uint64_t>> quotas;  // create: name -> bytes (whole extents)
  std::string quota;                                     // the quota this participant draws on
  std::string quota_key;                   // its key when the quota is locked (32 hex digits); empty: CXLPOOL_QUOTA_KEY
  std::string failure_domain = "default";  // create: what fails together
  bool coherence_set = false;              // unset with hosts > 1: NONE (no cross-host coherence assumed)
  // Test-only: see this participant's blocks through a NoncoherentView (coherence NONE only).
  bool noncoherent_view = false;
  uint64_t view_seed = 0;
  uint32_t view_evict_per_call = 0;
};

// The participant's heap lock. A cached alloc/free pair takes it twice, so it costs one
// atomic read-modify-write to take and a plain release store to give back (a pthread mutex's
// unlock is a second read-modify-write: a third of a pair's time here). A ticket lock, so
// that it is fair: a thread calling alloc/free back to back cannot starve the watch, whose
// heartbeat must not stop (an unfair lock got a busy participant evicted under TSan). Holders
// never wait on anything but the pool's memory (a claim's backoff is at most 50 us), so
// waiters spin a little, then yield.
class HeapLock {
 public:
  void lock() noexcept {
    const uint32_t me = next_.fetch_add(1, std::memory_order_relaxed);
    for (unsigned spins = 0; serving_.load(std::memory_order_acquire) != me; ++spins) {
      if (spins >= 128) {
        std::this_thread::yield();
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  bool try_lock() noexcept {
    uint32_t now = serving_.load(std::memory_order_acquire);
    return next_.compare_exchange_strong(now, now + 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept { serving_.store(serving_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

 private:
  std::atomic<uint32_t> next_{0};
  std::atomic<uint32_t> serving_{0};
};

struct RepairCounts;

// Geometry and offsets a creator writes into the superblock (validated; throws CONFIG).
Superblock plan_superblock(const SharedParams& params, uint64_t device_size);

// What an observer can tell about the process behind slot s (incarnation inc) without its
// heartbeat: on this host (same boot id, same pid namespace, facts written for inc) its
// heartbeat thread is gone, running (or there but /proc cannot say in which state) or stopped;
// joining: its facts are not written yet (they describe the slot's previous incarnation);
// anywhere else, or when nothing can be read, unverifiable: only the heartbeat tells.
enum class PeerLife : uint8_t { kGone, kRunning, kStopped, kJoining, kUnverifiable };
PeerLife judge_peer(const PoolView& v, uint32_t s, uint32_t inc, uint64_t boot_hash, uint64_t pidns);

// Gaps between this participant's own heartbeats (its heartbeat thread writes, anyone reads):
// 1 ms buckets up to 2 s, the last bucket holding every longer gap, and the exact maximum.
struct GapStats {
  static constexpr size_t kBuckets = 2048;
  std::array<std::atomic<uint32_t>, kBuckets> hist{};
  std::atomic<uint64_t> beats{0};
  std::atomic<uint64_t> max_ns{0};
  void record(uint64_t gap_ns) noexcept;
  double quantile_ms(double q) const noexcept;  // upper edge of the bucket holding quantile q
};

class SharedPool {
 public:
  static std::unique_ptr<SharedPool> create(const std::string& device, const SharedParams& params, unsigned flags);
  static std::unique_ptr<SharedPool> open(const std::string& device, const SharedParams* params);
  static void unlink(const std::string& device);
  ~SharedPool();
  SharedPool(const SharedPool&) = delete;
  SharedPool& operator=(const SharedPool&) = delete;

  void* alloc(size_t size, unsigned flags = 0);
  void free(void* ptr);
  cxlpool_shared_handle_t export_block(const void* ptr);
  void* import_block(const cxlpool_shared_handle_t& handle, size_t* size_out);
  void release(void* ptr);
  cxlpool_shared_info_t info();
  std::string stats_json();  // docs/shared.md, "Statistics"
  // Leaves the pool (the destructor does it too); idempotent.
  void leave();
  // In a forked child the pool's threads, mutexes and condition variable are copies of the
  // parent's (possibly held, possibly waited on): the child must not destroy them. This
  // unmaps the pool; the caller then forgets the object instead of deleting it.
  bool in_fork_child() const;
  void abandon_in_fork_child();

  // Failure of the device: declared (fault injection, or an operator) or seen by the watch
  // (the name removed, replaced or truncated). From then on cxlpool touches none of the
  // pool's memory and every call fails with CXLPOOL_E_DEVICE_FAILED; health() reports what
  // was lost, from this participant's own bookkeeping.
  void declare_failed(const std::string& reason);
  bool failed() const { return failed_.load(); }
  // Others declared this participant dead: what it owned is theirs to recover (health());
  // true from the heartbeat that finds it, before the watch fences the mapping.
  bool evicted() const { return evicted_.load() || evict_seen_.load(); }
  // Whether this participant must stop using the pool's memory now: failed (declared, or the
  // device's name gone, replaced or cut short: declared here, with its reason, when the watch
  // has not done it yet) or evicted. Touches nothing of the pool's memory.
  bool lost_now() noexcept;
  // Called on any thread, maybe under the pool's locks (so it only wakes someone), once per
  // participant of this process that finds its pool failed or itself evicted (the heartbeat,
  // the watch, an injection): a borrowed device's follower takes its runs away at once.
  static void set_loss_listener(void (*listener)() noexcept) noexcept;
  cxlpool_shared_health_t health();
  std::vector<cxlpool_shared_quota_t> quotas();

  // Composition (compose.cpp, docs/compose.md): the quotas' grants, changed at run time by
  // whichever participant holds the compose claim.
  struct ComposeQuota {
    std::string name;
    uint64_t reserved = 0;  // max_extents at creation
    uint64_t granted = 0;   // what its participants may own together now
    uint64_t used = 0;      // extents owned on its account
    bool grant_set = false, grant_damaged = false;
    QuotaPolicy policy;
    bool policy_damaged = false;
    uint64_t demand = 0;                       // extents its live participants' last failed claims asked for
    bool locked = false, key_damaged = false;  // joined only with its key; the key word fails its check
  };
  struct ComposeState {
    uint64_t extents = 0, extent_size = 0;
    uint64_t unassigned = 0;     // extents no quota is granted or holds
    uint64_t over_grant = 0;     // extents held beyond their quotas' grants (a reclaim waiting)
    bool overcommitted = false;  // grants and holdings add up to more than the pool (damage)
    std::vector<ComposeQuota> quotas;
  };
  struct ReclaimResult {
    uint64_t reclaimed = 0;
    uint64_t still_held = 0;  // of this reclaim's extents, what the quota still held at the deadline
    bool lowered = false;     // the grant could not be raised back for them (the claim stayed held)
  };
  ComposeState compose_state(uint32_t wait_ms);
  enum : uint32_t { kPolicyMin = 1, kPolicyMax = 2, kPolicyPriority = 4 };  // fields; 0: all
  void compose_set_policy(const std::string& quota, const QuotaPolicy& policy, uint32_t fields, uint32_t wait_ms);
  std::vector<std::string> compose_quota_names() const;
  // One step of a composer's policy (compose_plan.hpp): a snapshot under the compose claim,
  // the plan, then each move under its own claim (grants only from what is unassigned then).
  struct ComposerMemory {
    PlanMemory plan;
    std::vector<uint64_t> slot_seq, slot_changed_ns;  // per slot: its demand's sequence, when it moved
    uint64_t steps = 0;                               // what its first step sees was there before it ran
  };
  struct AppliedMove {
    uint32_t quota = 0;
    int64_t delta = 0;
    const char* why = "";
  };
  std::vector<AppliedMove> compose_step(ComposerMemory* memory, uint64_t hold_ns, uint32_t wait_ms);
  void compose_grant(const std::string& quota, uint64_t extents, uint32_t wait_ms);
  ReclaimResult compose_reclaim(const std::string& quota, uint64_t extents, uint32_t deadline_ms, uint32_t wait_ms);
  // Locks quota with a new random key and returns its text (a key it had before stops working
  // for new joiners; those joined stay); unlock opens it to any participant again.
  std::string compose_lock(const std::string& quota, uint32_t wait_ms);
  void compose_unlock(const std::string& quota, uint32_t wait_ms);

  // For a participant that lends this pool's extents to a private device (lib/borrow): whether
  // its quota's grant was lowered and the quota is not yet within it (the watch's judgement,
  // no pool access), and by how many extents the quota exceeds its grant now (a pass over
  // the extent table).
  bool over_grant() const noexcept { return over_grant_.load(std::memory_order_relaxed); }
  uint64_t quota_excess() const;

  const PoolView& view() const { return view_; }
  uint32_t slot() const { return slot_; }
  // Blocks as the application sees them: in the pool's mapping, or in this participant's
  // non-coherent view (test emulation) of the data area.
  std::byte* user_ptr(uint64_t offset) const;
  bool user_offset(const void* p, uint64_t* offset) const;
  // publish/acquire of application memory in this pool; false when p is not in it.
  bool publish(const void* p, size_t len);
  bool acquire(const void* p, size_t len);
  bool lines(const void* p, size_t len, bool publishing);
  bool noncoherent() const { return view_.noncoherent(); }
  // Throws (EVICTED, DEVICE_FAILED, NOT_SUPPORTED in a fork child, INVALID_ARGUMENT after
  // leaving) unless this participant may still use the pool's memory: for callers that hand out
  // pointers into it without another pool call (the KV cache's views and block tables).
  void check_usable() { ensure_usable(false); }
  // One beat and one pass of the watch: look at the others, recover the dead, re-check blocks
  // this participant let go that others still held. The watch thread runs the pass every
  // heartbeat period; the heartbeat thread only beats (it takes no lock the application's
  // calls hold, so no call, however long, delays a beat).
  void tick();
  const GapStats& heartbeat_gaps() const { return gaps_; }
  // Recovers every dead slot now, waiting at most the lease timeout for silent ones.
  void recover_dead_now();
  // --repair, only while no other participant is alive or undecided (check.cpp decides):
  // restores or resets the damaged words of the other slots and of the extent table (before
  // recovery), then those of the blocks of the extents this participant adopted (after it).
  // repair.cpp; docs/shared.md, "Repair".
  void repair_words_before_recovery(RepairCounts* counts);
  void repair_words_after_recovery(RepairCounts* counts);
  // --repair of the grants (compose.cpp), under the same condition: a damaged grant word, or
  // grants adding up to more than the pool, become what each quota owns now.
  void repair_grants(RepairCounts* counts);

 private:
  SharedPool(std::byte* base, uint64_t size, const Superblock& sb, std::string what, const SharedParams* params);
  void join(const SharedParams* params);
  void join_slot(uint32_t host);
  void check_quota_key(const std::string& quota, const std::string& given);
  void start_beat_thread();   // before the slot is claimed: its thread id is one of the facts
  void start_watch_thread();  // once joined
  void stop_threads();
  void stop_watch_thread();
  void stop_beat_thread();
  static void* beat_entry(void* self);
  static void* watch_entry(void* self);
  void watch_main();
  void beat_main();
  void watch_pass();
  void ensure_usable(bool holding_mu = false);  // fork child, left, failed, evicted, self-fencing
  // A writing operation: holds mu_, checks under it that this participant may still write,
  // and marks the operation in its slot (op_seq odd) for its duration, so that observers on
  // this host do not reclaim from a live process stopped in the middle of it.
  void op_mark(bool begin);
  // Whether this slot still holds this incarnation (a scribbled identity word counts as ours:
  // the heartbeat repairs it). A slot recovered and taken by another process of the host is not.
  bool slot_is_ours() const;
  // Caller holds mu_ and has marked and fenced: false (and the mapping made read-only) when the
  // others evicted this participant, by its eviction word or by taking its slot.
  bool still_ours_locked();
  uint64_t tagged(uint64_t low) const { return (uint64_t{incarnation_} << 32) | (low & 0xffffffffu); }
  class Op {
   public:
    explicit Op(SharedPool& p) : p_(p), lock_(p.mu_, std::defer_lock) {
      if (p.in_fork_child()) p.ensure_usable(true);  // throws: its locks are the parent's copies
      lock_.lock();
      p.op_mark(true);  // mark, fence, then read the eviction word (observers: the reverse)
      PoolView::fence();
      try {
        p.ensure_usable(true);
      } catch (...) {
        p.op_mark(false);
        throw;
      }
    }
    ~Op() { p_.op_mark(false); }
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;

   private:
    SharedPool& p_;
    std::unique_lock<HeapLock> lock_;
  };
  struct Marked {  // the same mark and check, for the watch's writes (the caller holds mu_)
    explicit Marked(SharedPool& p) : p_(p) {
      p.op_mark(true);
      PoolView::fence();
      ok_ = p.still_ours_locked();
    }
    ~Marked() { p_.op_mark(false); }
    Marked(const Marked&) = delete;
    Marked& operator=(const Marked&) = delete;
    bool ok() const { return ok_; }  // false: evicted, write nothing
    SharedPool& p_;
    bool ok_ = false;
  };
  uint64_t op_seq_ = 0;
  int op_depth_ = 0;
  PeerLife peer_life(uint32_t slot, uint32_t incarnation) const {
    return judge_peer(view_, slot, incarnation, boot_hash_, pidns_);
  }
  // A process of this host, not gone, whose slot shows a writing operation in progress.
  bool may_be_in_operation(uint32_t slot, uint32_t incarnation) const;
  void take_over_dead_slot(uint32_t host);
  void recover_predecessor();
  uint32_t predecessor_ = 0;  // incarnation of a dead slot taken over, until recovered
  void heartbeat_once(bool holding_mu);
  void mark_evicted(bool holding_mu);
  bool beat_locked();
  std::mutex beat_mu_;      // heartbeat stores vs making the mapping read-only
  uint64_t beat_word_ = 0;  // the heartbeat word as this participant last stored it (beat_mu_)
  void observe_others();
  void sweep_orphans();
  bool try_recover(uint32_t victim, uint32_t incarnation);
  void recover_slot(uint32_t victim, uint32_t incarnation);
  void adopt_extent(uint64_t e, const ExtentWord& w);
  bool finish_interrupted_release(uint64_t e, const ExtentWord& w);
  bool rebuild_large(uint64_t e, ExtentWord* out) const;  // repair.cpp

  // Claims (Dekker over the slots' claim words).
  bool claim(ClaimKind kind, uint32_t first, uint32_t count, uint32_t quota_plus_one = 0);
  uint64_t quota_use(uint32_t quota) const;  // extents owned on quota's account
  void unclaim();

  // Grants (compose.cpp).
  struct Grant {
    uint64_t extents = 0;  // granted now (the superblock's max_extents while never composed)
    bool readable = true;  // false: the word fails its check; the quota may not grow
    bool set = false;
  };
  Grant grant(uint32_t quota) const;
  std::vector<uint64_t> quota_uses() const;  // every quota's, in one pass
  uint32_t quota_index(const std::string& name, const char* fn) const;
  // Runs f holding mu_ (marked) and the compose claim (its quota claim on lowered + 1, or
  // none), waiting up to wait_ms for another holder to finish or be recovered.
  template <class F>
  void with_compose_claim(uint32_t lowered_plus_one, uint32_t wait_ms, const char* fn, F&& f);
  void store_key_word(uint32_t quota, uint64_t word, const char* fn);
  void refuse_tenant(const char* fn) const;
  std::string compose_holder() const;  // for messages: who holds the compose claim
  // Caller holds the compose claim: the unassigned extents (CORRUPT naming fn on a damaged grant).
  uint64_t unassigned_locked(const char* fn) const;
  // Caller holds the compose claim: stores quota's grant unless this participant was evicted
  // meanwhile (then EVICTED, nothing stored: a composer paused past its eviction writes no
  // grant computed before it).
  void store_grant(uint32_t quota, uint64_t extents, const char* fn);
  bool policy(uint32_t quota, QuotaPolicy* out) const;  // false: damaged (out: none)
  // Per quota: extents its live participants asked for, counting a slot's demand while its
  // sequence moved within hold_ns (memory: nullptr counts every nonzero demand).
  std::vector<uint64_t> demands(ComposerMemory* memory, uint64_t now_ns, uint64_t hold_ns) const;
  void follow_grant();  // the watch: a lowered grant gives back what is kept for speed
  // The demand word of this slot (layout.hpp): extents the last failed claim needed beyond
  // the grant, 0 to clear. Caller holds mu_.
  void note_demand(uint64_t extents);
  uint64_t demand_raw_ = 0;
  uint32_t demand_seq_ = 0;
  uint64_t grant_seen_ = UINT64_MAX;
  std::atomic<bool> over_grant_{false};  // written by the watch, read by borrowers (lib/borrow)
  bool grant_damaged_ = false;           // the last grab failed on an unreadable grant word

  // Heap (caller holds mu_).
  struct Owned {
    uint32_t cls = 0;      // class, or class_count for a large block head
    uint32_t span = 1;     // extents (large)
    uint64_t used = 0;     // blocks allocated in the pool (small, cached ones too) / 1 (large)
    uint32_t max_gen = 0;  // highest generation issued in this extent
    std::vector<uint32_t> free_blocks;
    // Small blocks as the application has them: kNotHeld (free in the pool, in the block
    // cache, or let go while leased), kHeld, kHeldExported. Only this process writes a
    // block's state word, so this shadow agrees with it (a scribbled word is found when the
    // block goes back to the pool).
    std::vector<uint8_t> app;
  };
  enum : uint8_t { kNotHeld = 0, kHeld = 1, kHeldExported = 2 };
  // Owned extents by extent index: one lookup per free, no hashing.
  class OwnedTable {
   public:
    void resize(uint64_t extents) { slots_.resize(extents); }
    Owned* find(uint64_t e) const { return e < slots_.size() ? slots_[e].get() : nullptr; }
    Owned& operator[](uint64_t e) {
      auto& s = slots_.at(e);
      if (!s) s = std::make_unique<Owned>();
      return *s;
    }
    void erase(uint64_t e) { slots_.at(e).reset(); }
    void clear() {
      for (auto& s : slots_) s.reset();
    }
    template <class F>
    void for_each(F&& f) const {
      for (uint64_t e = 0; e < slots_.size(); ++e)
        if (slots_[e]) f(e, *slots_[e]);
    }

   private:
    std::vector<std::unique_ptr<Owned>> slots_;
  };
  // The block cache: small blocks the application freed stay allocated in the pool, owned by
  // this participant, and are handed out again without a write to the pool (no fence, no
  // mark): the pool's truth does not change, and a crash frees them with everything else the
  // dead participant owned. Refilled and drained in batches under one Op. Bounded per class
  // (kCacheBytes) and to one extent per class, the one allocations come from (so it never
  // holds an extent the others could use); drained (trim) on a capacity failure.
  struct CachedBlock {
    uint64_t extent;
    uint64_t block;
  };
  static constexpr uint64_t kCacheBytes = 64u << 10;
  static constexpr uint64_t kCacheMaxBlocks = 64;
  uint64_t cache_cap(uint32_t cls) const;
  bool fast_path_usable() const;  // caller holds mu_: the cache may serve without an Op
  void* hand_out(uint32_t cls, CachedBlock c);
  void give_back_block(uint32_t cls, CachedBlock c);
  void flush_cache(uint32_t cls, uint64_t keep);
  void trim();
  void trim_class(uint32_t cls);
  void trim_idle_classes();
  std::vector<uint64_t> idle_ticks_;  // per class: watch passes since the last allocation
  uint64_t cached_bytes() const;
  bool alloc_small(uint32_t cls, bool may_grab, CachedBlock* out);
  void* alloc_large(uint64_t size);
  bool grab_extents(uint32_t count, ExtentKind kind, uint32_t cls, uint64_t* first);
  void format_small(uint64_t e, uint32_t cls, uint32_t start_gen);
  void release_extents(uint64_t first, uint32_t count, uint32_t next_gen);
  BlockRef own_block(const void* ptr, const char* fn, Owned** owned);
  void free_slow(void* ptr);
  void let_go(const BlockRef& at, BlockWord bw);  // owner drops its hold
  bool try_finish_release(const BlockRef& at, BlockWord bw);
  void recheck_released();
  void lease_insert(uint64_t offset, uint32_t gen);
  void lease_remove(uint64_t offset, uint32_t gen);
  uint64_t owner_word_inc() const { return incarnation_ & 0xffff; }
  [[noreturn]] void corrupt(const std::string& what);

  std::string what_;
  std::string path_;             // what the pool's name resolves to, for the health watch
  os::PathIdentity identity_{};  // what it was when opened
  bool check_path_ = false;
  std::atomic<bool> failed_{false};
  std::string failure_reason_;  // under mu_
  void check_device();
  const char* device_problem(os::PathIdentity* now) const noexcept;  // nullptr: intact
  // Watches the pool's name for the health check; keeps a device node's descriptor (its lock).
  void hold_device(const PoolLocation& loc, const os::PathIdentity& identity, SharedObject* obj,
                   std::shared_ptr<registry::SharedDevice> device);
  bool devdax_ = false;
  int device_fd_ = -1;  // a device node under flock(LOCK_SH) while the pool is open here
  os::prim::FileId device_fd_id_{};
  PoolView view_;
  uint32_t slot_ = 0;
  uint32_t incarnation_ = 0;
  uint32_t quota_ = 0;   // index in the superblock's quota table
  bool tenant_ = false;  // joined a locked quota other than default with its key: may not compose
  int pid_ = 0;
  uint64_t fork_generation_ = 0;
  uint64_t boot_hash_ = 0, pidns_ = 0;  // this process's, read once
  int beat_tid_ = 0;                    // the heartbeat thread's id and start time, for the facts
  uint64_t beat_start_ = 0;
  bool joined_ = false;
  uint64_t eviction_raw_ = 0;  // this slot's eviction word as it was when we joined
  std::atomic<bool> evicted_{false};
  std::atomic<uint64_t> last_beat_ns_{0};
  uint64_t timeout_ns_ = 0;
  uint64_t heartbeat_ns_ = 0;
  uint64_t stopped_ns_ = 0;  // 0: a stopped process of this host is never declared dead
  GapStats gaps_;

  HeapLock mu_;                                  // heap and leases of this participant
  OwnedTable owned_;                             // extent index -> state
  std::vector<std::vector<uint64_t>> partial_;   // per class: extents with free blocks
  std::vector<std::vector<CachedBlock>> cache_;  // per class: the block cache
  std::vector<uint64_t> cache_extent_;           // per class: the one extent the cache holds blocks of
  std::vector<uint64_t> released_pending_;       // offsets let go but still leased
  struct Lease {
    uint32_t generation;
    uint32_t count;
  };
  std::unordered_map<uint64_t, Lease> leases_;  // offset -> lease
  uint64_t bytes_in_use_ = 0;                   // blocks owned in the pool: held by the application, cached, or leased
  // Every change of bytes_in_use_ goes through these: the device's ledger follows.
  void in_use_add(uint64_t bytes) noexcept;
  void in_use_sub(uint64_t bytes) noexcept;
  std::shared_ptr<detail::registry::SharedDevice> device_;  // this pool's device in the process's registry
  std::atomic<uint64_t> corrupt_words_{0};
  uint64_t recovered_slots_ = 0;
  uint64_t extent_hint_ = 0;
  std::atomic<uint64_t> ticks_{0};
  bool quota_full_ = false;  // the last grab failed on the quota, not on the pool

  // The watch over the others: last heartbeat value seen and when it last changed, and the
  // longest gap between changes seen in this window and the one before (windows of
  // kGapWindowNs), for the silence allowed to a participant only its heartbeat can vouch for.
  struct Seen {
    uint32_t incarnation = 0;
    uint64_t heartbeat = 0;
    uint64_t changed_ns = 0;
    uint64_t window_ns = 0;
    uint64_t gap_max_ns = 0;
    uint64_t gap_prev_ns = 0;
  };
  uint64_t silence_limit_ns(const Seen& seen) const;
  std::vector<Seen> seen_;
  uint64_t last_observe_ns_ = 0;
  std::mutex watch_mu_;

  std::unique_ptr<NoncoherentView> nc_view_;  // test emulation of a stale cache, or null
  std::mutex nc_mu_;
  // Caches and extents: a participant writes back and drops its lines of an extent when it
  // gives the extent back, and drops stale lines when it takes one (coherence NONE).
  void extent_lines_handover(uint64_t first, uint32_t count);

  unsigned long watch_thread_ = 0;  // os::prim::start_thread's ids; never joined in a fork child
  bool watch_started_ = false;
  unsigned long beat_thread_ = 0;
  bool beat_started_ = false;
  std::atomic<bool> beat_go_{false};  // joined: beat
  std::atomic<bool> beat_stop_{false};
  std::atomic<bool> beat_ready_{false};  // its id and start time are written
  std::atomic<bool> evict_seen_{false};  // the heartbeat thread found this participant evicted
  std::atomic<bool> loss_told_{false};   // the loss listener was called for this participant
  void tell_loss() noexcept;
  std::mutex beat_wait_mu_;
  std::condition_variable beat_cv_;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
};

// What --repair did to damaged words (repair.cpp), for the checker's report.
struct RepairCounts {
  uint64_t words_repaired = 0;  // restored exactly: one flipped bit, or the superblock's copy
  uint64_t words_reset = 0;     // not restorable: reset to what a free slot or extent holds
  uint64_t extents_reformatted = 0;
  uint64_t blocks_lost = 0;
};
// The grants' problems (compose.cpp), for the checker: each damaged grant word, and one more
// when grants and holdings (max(granted, owned) per quota, used: owned per quota) add up to
// more than the pool.
uint64_t grant_problems(const PoolView& v, const std::vector<uint64_t>& used);
// Restores a superblock that fails its checksum from its copy, or from the one flipped bit
// that explains it (before the pool can be opened at all); writes the copy of a whole one
// when it is missing or damaged. Leaves anything that is not such a pool alone.
void repair_superblock(const std::string& device, RepairCounts* counts);
// Opens every quota of the pool at device to any participant (its key words zeroed), without
// joining it: the way back from a lost key, for whoever can write the device (which is all a
// key ever asked of anyone, docs/compose.md "Containers"). Returns how many were locked.
uint32_t reset_quota_keys(const std::string& device);

// A pool mapped without joining it (the checker): validated superblock, whole mapping.
struct MappedPool {
  std::byte* base = nullptr;
  uint64_t size = 0;  // bytes mapped
  Superblock sb{};
};
MappedPool map_pool_unjoined(const std::string& device);
void unmap_pool(const MappedPool& m);

// A look from outside, without joining or mapping (check.cpp): geometry, quotas, participants.
cxlpool_shared_survey_t survey_pool(const std::string& device, std::vector<cxlpool_shared_participant_t>* out);

// Checks every invariant (check.cpp); with repair, recovers dead participants first.
cxlpool_shared_check_report_t check_pool(const std::string& device, const SharedParams* params, bool repair);

// Shared pools open in this process, for cxlpool_publish/acquire to find an address's pool.
// Returns false when p is in no open pool (nothing to do: coherent memory).
bool publish_in_open_pool(const void* p, size_t len);
bool acquire_in_open_pool(const void* p, size_t len);

}  // namespace cxlpool::detail::shared

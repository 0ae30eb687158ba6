/* SPDX-License-Identifier: MIT */
/* cxlpool shared pools: one named far-memory device (shm:NAME, file:PATH, devdax:PATH) mapped
 * by several processes, and by several hosts on a CXL switch or multi-headed device. The pool
 * describes itself inside the device (docs/shared.md): any participant may be killed at any
 * instruction and the others recover its state; blocks travel between participants as handles
 * (pool id, offset, generation), never as pointers. */
#ifndef CXLPOOL_SHARED_H
#define CXLPOOL_SHARED_H

#include "cxlpool/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CXLPOOL_HAVE_SHARED_POOLS 1

typedef struct cxlpool_shared_pool cxlpool_shared_pool_t;
typedef struct cxlpool_shared_params cxlpool_shared_params_t;

/* Who sees whose writes without help. Values are never renumbered. */
typedef enum cxlpool_coherence {
  CXLPOOL_COHERENCE_HOST = 0,   /* processes of one host: CPU caches keep the pool coherent */
  CXLPOOL_COHERENCE_FABRIC = 1, /* hosts on a fabric that declares hardware coherence (CXL 3.x) */
  CXLPOOL_COHERENCE_NONE = 2,   /* software-managed: cxlpool_publish / cxlpool_acquire needed */
  CXLPOOL_COHERENCE_MAX_ENUM = 0x7fffffff
} cxlpool_coherence_t;

/* A block named across processes. Plain data: copy it through any channel. */
typedef struct cxlpool_shared_handle {
  uint64_t pool_id[2]; /* the pool's identity (random at creation) */
  uint64_t offset;     /* the block's offset in the device */
  uint32_t generation; /* which allocation of that block */
  uint32_t check;      /* detects a handle damaged in transit */
} cxlpool_shared_handle_t;

/* Parameters of create and open. Defaults: size 0 (must be set for create), extent 2 MiB,
 * coherence HOST (NONE when more than one host is declared and coherence is not set), mode 0600,
 * 1 host of 32 participants, 4096 leases per participant,
 * heartbeat 10 ms, lease timeout 5000 ms, stopped timeout 10 minutes, host index 0. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_create(cxlpool_shared_params_t** out);
CXLPOOL_API void cxlpool_shared_params_destroy(cxlpool_shared_params_t* params);
/* From 4 MiB to 2^63 - 1 bytes (the largest file); INVALID_ARGUMENT otherwise. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_size(cxlpool_shared_params_t* params, uint64_t bytes);
/* A power of two from 256 KiB to 1 GiB: the unit of ownership between participants. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_extent_size(cxlpool_shared_params_t* params, uint64_t bytes);
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_coherence(cxlpool_shared_params_t* params,
                                                                 cxlpool_coherence_t coherence);
/* Permission bits of a created shm/file pool (0600 default; 0660 shares with the group). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_mode(cxlpool_shared_params_t* params, unsigned mode);
/* hosts x participants_per_host slots, at most 255 in all. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_participants(cxlpool_shared_params_t* params, uint32_t hosts,
                                                                    uint32_t participants_per_host);
/* Leases (imported blocks held at once) per participant: a power of two from 8 to 2^20. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_leases(cxlpool_shared_params_t* params,
                                                              uint32_t per_participant);
/* Heartbeat period and the lease timeout; the timeout must be at least 3 heartbeats. A
 * participant whose process is alive on the observer's host (same boot, same pid namespace) is
 * never declared dead for silence, whatever the lease: it is dead when its process (its heartbeat
 * thread) is gone, at the next heartbeat, or stopped past the stopped timeout (below). The lease
 * judges the participants that cannot be looked
 * at (other hosts, other pid namespaces): silent for the lease, or for 3 times the longest gap
 * seen between its beats, at most 4 leases (docs/shared.md, "Liveness"). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_lease_timing(cxlpool_shared_params_t* params,
                                                                    uint32_t heartbeat_ms, uint32_t lease_timeout_ms);
/* What a stopped participant of this host is (its heartbeat thread stopped by SIGSTOP, job
 * control or a debugger): alive until it has been silent for timeout_ms (at least 3 heartbeats,
 * at most a day), then dead and recovered; on resuming, its calls fail with CXLPOOL_E_EVICTED.
 * CXLPOOL_SHARED_STOPPED_NEVER: a stopped process is alive for as long as it exists (its blocks
 * stay held). 0 restores the default, 10 minutes. A pool parameter, fixed at creation. */
#define CXLPOOL_SHARED_STOPPED_NEVER 0xffffffffu
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_stopped_timeout(cxlpool_shared_params_t* params,
                                                                       uint32_t timeout_ms);
/* Composition: create carves named quotas out of the pool, each of whole extents (bytes are
 * rounded down; at most 15 quotas). Participants of a quota together own at most its extents;
 * "default" gets what the named quotas leave. A quota is a reservation too: no other quota can
 * take its extents. Names: 1-23 characters of [A-Za-z0-9_.-]. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_add_quota(cxlpool_shared_params_t* params, const char* name,
                                                             uint64_t bytes);
/* The quota a participant draws on (create and open; "default" when not set). Opening with a
 * quota the pool does not have fails with CXLPOOL_E_CONFIG naming it. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_quota(cxlpool_shared_params_t* params, const char* name);
/* The key of a locked quota (32 hexadecimal digits, from cxlpool_compose_lock_quota): open
 * with a locked quota fails with CXLPOOL_E_PERMISSION without it. Unset, open takes the key
 * from the environment variable CXLPOOL_QUOTA_KEY (what a container's CDI spec sets). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_quota_key(cxlpool_shared_params_t* params, const char* key);

/* The failure domain of a created pool's device (1-31 characters of [A-Za-z0-9_.:-]; "default"
 * unless set): pools whose devices fail together (one device, one switch, one chassis) share
 * one. Sets of pools fail over to another domain (cxlpool_shared_set_alloc). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_failure_domain(cxlpool_shared_params_t* params,
                                                                      const char* domain);

/* Test emulation of non-coherent sharing (coherence NONE pools only). This participant sees
 * its blocks through a software model of a stale cache: a private copy of the pool's data area
 * (twice its size in private memory), refreshed only by cxlpool_acquire and written back only
 * by cxlpool_publish (whole 64-byte lines, as hardware does), plus evict_per_call random line
 * evictions at each of those calls (seeded: deterministic). A program that forgets acquire reads
 * stale data here every time, where coherent test machines would hide the bug. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_noncoherent_view(cxlpool_shared_params_t* params, uint64_t seed,
                                                                        uint32_t evict_per_call);

/* Which host group this process joins (0 .. hosts-1); every host sharing a device needs its
 * own index (the fabric manager's host id). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_params_set_host_index(cxlpool_shared_params_t* params, uint32_t index);

/* Creates a pool on device and joins it. shm:NAME and file:PATH are created fully formed and
 * then linked under their name (a crash leaves nothing); an existing name is refused with
 * CXLPOOL_E_EXISTS and left untouched. devdax:PATH is formatted in place only when it carries
 * no cxlpool header and flags has CXLPOOL_SHARED_FORMAT_DEVICE. A bad CXLPOOL_CONTROL (the
 * control socket opens with a program's first pool, shared or private) fails create and open
 * with CXLPOOL_E_CONFIG. */
#define CXLPOOL_SHARED_FORMAT_DEVICE 1u
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_create(const char* device, const cxlpool_shared_params_t* params,
                                                        unsigned flags, cxlpool_shared_pool_t** out);
/* Opens an existing pool and joins it (params may be NULL; only the host index, the quota and
 * the non-coherent view are taken from it: geometry, coherence and lease timing are the pool's,
 * fixed at creation). Anything without a valid cxlpool header is refused
 * (CXLPOOL_E_CORRUPT) and never written. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_open(const char* device, const cxlpool_shared_params_t* params,
                                                      cxlpool_shared_pool_t** out);
/* Leaves the pool: imported blocks are released, blocks no one else holds are freed, blocks
 * others still hold are left for them. The mapping goes away; pointers into it die. Calls on
 * the handle after the close fail with CXLPOOL_E_INVALID_ARGUMENT; a call running while
 * another thread closes the same handle is the caller's bug, as a use racing free(). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_close(cxlpool_shared_pool_t* pool);
/* Removes a shm/file pool's name (the memory lives on while mapped). Refuses anything that
 * does not carry a cxlpool shared-pool header. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_unlink(const char* device);

/* Allocates size bytes (128-byte aligned) owned by this participant. CXLPOOL_E_CAPACITY when
 * the pool is full; CXLPOOL_E_EVICTED when this participant was declared dead. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_alloc(cxlpool_shared_pool_t* pool, size_t size, void** out);
/* What an object will be used for (cxlpool_shared_alloc_flags). Pools of coherence NONE refuse
 * both with CXLPOOL_E_NOT_SUPPORTED: without hardware coherence, a line written by two hosts
 * loses one host's bytes at write-back, and locks or atomics do not work across hosts. */
#define CXLPOOL_SHARED_WRITE_SHARED 1u /* several participants write the object */
#define CXLPOOL_SHARED_LOCK_BEARING 2u /* it holds locks or atomics used by several participants */
CXLPOOL_API cxlpool_status_t cxlpool_shared_alloc_flags(cxlpool_shared_pool_t* pool, size_t size, unsigned flags,
                                                        void** out);
/* Frees a block this participant allocated. Blocks others have imported live on until the
 * last of them releases it. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_free(cxlpool_shared_pool_t* pool, void* ptr);
/* Names a block this participant allocated, for another participant to import. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_export(cxlpool_shared_pool_t* pool, const void* ptr,
                                                   cxlpool_shared_handle_t* out);
/* Validates a handle (pool, bounds, block start, generation, still held by its owner) and
 * takes a lease on the block: *out points to it in this process, *size_out (may be NULL) is
 * its usable size. Stale handles: CXLPOOL_E_STALE; forged or damaged: CXLPOOL_E_INVALID_ARGUMENT
 * or CXLPOOL_E_NOT_FOUND. Never a pointer outside a live block. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_import(cxlpool_shared_pool_t* pool, const cxlpool_shared_handle_t* handle,
                                                   void** out, size_t* size_out);
/* Drops one lease taken by cxlpool_shared_import. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_release(cxlpool_shared_pool_t* pool, void* ptr);

typedef struct cxlpool_shared_info {
  uint64_t pool_id[2];
  uint64_t size;              /* bytes of the device the pool uses */
  uint64_t extent_size;       /* bytes */
  uint64_t extents_total;     /* extents in the pool */
  uint64_t extents_free;      /* extents no participant owns */
  uint64_t extents_mine;      /* extents this participant owns */
  uint64_t bytes_in_use;      /* bytes of blocks this participant owns, its cache aside: held by the application,
                               freed while another participant leases them, or adopted from a dead one */
  uint32_t participants;      /* slots active now */
  uint32_t slot;              /* this participant's slot */
  uint32_t coherence;         /* cxlpool_coherence_t */
  uint32_t leases_held;       /* blocks this participant has imported */
  uint64_t recovered_slots;   /* dead participants this one has recovered */
  uint64_t corrupt_words;     /* metadata words that failed their check (quarantined) */
  char quota[24];             /* the quota this participant draws on ("default" unless set) */
  uint64_t quota_extents_max; /* extents the quota's participants may own together */
  uint64_t quota_extents_used;
  /* bytes of blocks the application freed that stay allocated to this participant in its block
   * cache (at most 64 blocks or 64 KiB per size class; given back on a capacity failure, at
   * close, and freed by recovery if the participant dies) */
  uint64_t bytes_cached;
  uint64_t reserved[7];
} cxlpool_shared_info_t;
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_info(cxlpool_shared_pool_t* pool, cxlpool_shared_info_t* out);
/* Where this process maps the pool's blocks: every block lies in [*base, *base + *size). For
 * registering the pool with a NIC or a transport once (RDMA memory regions, ucp_mem_map)
 * instead of block by block. The pool's own metadata is outside the range. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_data_range(cxlpool_shared_pool_t* pool, void** base, uint64_t* size);

/* The pool's quotas: up to capacity entries written to out, *count = how many the pool has. */
typedef struct cxlpool_shared_quota {
  char name[24];
  uint64_t max_extents;
  uint64_t used_extents;
} cxlpool_shared_quota_t;
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_quotas(cxlpool_shared_pool_t* pool, cxlpool_shared_quota_t* out,
                                                        size_t capacity, size_t* count);

/* Health of a pool as this participant sees it. A device fails when it is declared failed
 * (cxlpool_shared_pool_inject_failure: fault injection, or an operator who knows) or when the
 * watch sees its name removed, replaced or truncated. From then on cxlpool touches none of its
 * memory (the application should not either: it may fault), every call on the pool fails with
 * CXLPOOL_E_DEVICE_FAILED, and this report says what was lost. Never touches the device. */
typedef enum cxlpool_shared_state {
  CXLPOOL_SHARED_HEALTHY = 0,
  CXLPOOL_SHARED_FAILED = 1,
  CXLPOOL_SHARED_EVICTED = 2, /* this participant was declared dead; the pool itself is fine */
  CXLPOOL_SHARED_STATE_MAX_ENUM = 0x7fffffff
} cxlpool_shared_state_t;
typedef struct cxlpool_shared_health {
  cxlpool_shared_state_t state;
  uint32_t leases_lost;  /* blocks this participant had imported from the pool */
  uint64_t bytes_lost;   /* bytes of blocks it owned there */
  uint64_t extents_lost; /* extents it owned there */
  char failure_domain[32];
  char reason[128]; /* why it failed ("" when healthy) */
  uint64_t reserved[8];
} cxlpool_shared_health_t;
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_health(cxlpool_shared_pool_t* pool, cxlpool_shared_health_t* out);
/* Statistics of this participant and of the pool as it sees it, as JSON (docs/shared.md,
 * "Statistics"): pool id, coherence, failure domain, health, this participant's figures
 * (bytes in use and cached, leases held, recovered slots, corrupt words), quotas with their
 * use, and every slot in use (state, liveness as this participant's watch sees it, extents,
 * bytes in use, leases). After a device failure only this participant's figures and health.
 * Release *out with cxlpool_string_free (cxlpool/topology.h, or the umbrella cxlpool/cxlpool.h). */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_stats_json(cxlpool_shared_pool_t* pool, char** out);
/* Fault injection: this participant treats the pool's device as failed from now on. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_inject_failure(cxlpool_shared_pool_t* pool, const char* reason);

/* A set of pools to allocate from with failover: the first pool in order that is healthy, whose
 * failure domain holds no failed pool of the set, and that has room. *from (may be NULL) names
 * the pool the block came from (free it there). CXLPOOL_E_DEVICE_FAILED when every pool is
 * failed or in a failed domain; CXLPOOL_E_CAPACITY when the healthy ones are full. The set
 * does not own its pools: close them after destroying the set. */
typedef struct cxlpool_shared_set cxlpool_shared_set_t;
CXLPOOL_API cxlpool_status_t cxlpool_shared_set_create(cxlpool_shared_pool_t* const* pools, size_t count,
                                                       cxlpool_shared_set_t** out);
CXLPOOL_API void cxlpool_shared_set_destroy(cxlpool_shared_set_t* set);
CXLPOOL_API cxlpool_status_t cxlpool_shared_set_alloc(cxlpool_shared_set_t* set, size_t size, void** out,
                                                      cxlpool_shared_pool_t** from);

/* What cxlpool_shared_pool_check found. A leaked block is in use in an extent whose owner is
 * not alive and that no live participant holds a lease on; a dangling lease names a block that
 * is not exported or released at the lease's generation. */
typedef struct cxlpool_shared_check_report {
  uint64_t extents_total, extents_free, extents_small, extents_large, extents_formatting;
  uint64_t blocks_in_use;   /* allocated, exported or released */
  uint64_t blocks_exported; /* exported or released (handles may exist) */
  uint64_t leases;          /* lease entries of live participants */
  uint64_t leaked_blocks;
  uint64_t dangling_leases;
  uint64_t corrupt_words;  /* words failing their check bits */
  uint64_t orphan_extents; /* owned by a participant that is not alive */
  uint32_t live_participants;
  uint32_t dead_participants; /* not alive and not yet recovered */
  uint64_t recovered;         /* participants recovered by --repair */
  /* silent participants of another host (or whose process /proc cannot tell about) whose
   * lease is longer than the check waits (60 s): neither alive nor dead, never counted as a
   * problem; their blocks are not counted as leaked */
  uint32_t undecided_participants;
  /* --repair with another participant alive or undecided: damaged words are left alone (a word
   * the repairer cannot read may be a live participant's); this many participants stopped it */
  uint32_t repair_blocked;
  /* --repair, damaged words (docs/shared.md, "Repair"): */
  uint64_t words_repaired;      /* restored exactly: the one flipped bit found, or the superblock from its copy */
  uint64_t words_reset;         /* not restorable: reset to what a free slot or extent holds */
  uint64_t extents_reformatted; /* extents whose word was lost: formatted free, generations raised */
  uint64_t blocks_lost;         /* blocks in use whose state (or whose extent's word) was lost with it */
  uint64_t reserved[3];
} cxlpool_shared_check_report_t;
/* A look at a pool from outside, without joining it (cxlpool-info): geometry, quotas, the
 * participant slots in use and what the metadata says about health. Liveness as the checker
 * judges it: a participant on this host is alive while its process exists; one on another
 * host (or still joining, or one /proc cannot tell about) while its heartbeat moves, sampled
 * for at most 2 s (undecided when its lease is longer). Read-only and never mapped: the device
 * is opened O_RDONLY after an O_PATH look (FIFOs and the like are refused unopened) and read
 * with pread, so a device truncated meanwhile gives CXLPOOL_E_NOT_FOUND instead of a SIGBUS.
 * A device without a cxlpool header gives CXLPOOL_E_NOT_FOUND, a damaged header CXLPOOL_E_CORRUPT. */
typedef enum cxlpool_shared_slot_state {
  CXLPOOL_SHARED_SLOT_ACTIVE = 1,
  CXLPOOL_SHARED_SLOT_LEFT = 2,    /* left while others still held its blocks; they adopt them */
  CXLPOOL_SHARED_SLOT_EVICTED = 3, /* declared dead; recovery done (or under way, see alive) */
  CXLPOOL_SHARED_SLOT_STATE_MAX_ENUM = 0x7fffffff
} cxlpool_shared_slot_state_t;
typedef struct cxlpool_shared_participant {
  uint32_t slot;
  uint32_t host_index;
  uint32_t incarnation;
  cxlpool_shared_slot_state_t state;
  int64_t pid;            /* as it recorded itself (its host's, its pid namespace's) */
  uint32_t alive;         /* 1: alive as above; 0: dead; 2: undecided (silent, but the survey
                             waited less than its lease: at most 2 s) */
  uint32_t leases;        /* entries in its lease table (blocks it has imported) */
  uint64_t extents_owned; /* extents whose word names it */
  uint64_t bytes_in_use;  /* its own count, published at its heartbeat */
  uint64_t reserved[4];
} cxlpool_shared_participant_t;
typedef struct cxlpool_shared_survey {
  uint64_t pool_id[2];
  uint64_t size, extent_size, extents_total, extents_free;
  uint32_t coherence; /* cxlpool_coherence_t */
  uint32_t hosts, slots_per_host;
  uint32_t heartbeat_ms, lease_timeout_ms;
  uint32_t quota_count;
  cxlpool_shared_quota_t quotas[16];
  char failure_domain[32];
  uint32_t participant_count; /* slots in use: entries written up to the caller's capacity */
  uint32_t participants_alive;
  /* health as far as the metadata tells (cxlpool-pool check also walks every block): */
  uint32_t dead_not_recovered; /* participants judged dead whose recovery has not completed */
  uint32_t stopped_timeout_ms; /* see cxlpool_shared_params_set_stopped_timeout (NEVER: never) */
  uint64_t orphan_extents;     /* extents whose owner is not the live incarnation of its slot */
  uint64_t corrupt_words;      /* slot and extent words failing their check */
  uint64_t reserved[6];
} cxlpool_shared_survey_t;
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_survey(const char* device, cxlpool_shared_survey_t* out,
                                                        cxlpool_shared_participant_t* participants, size_t capacity);

/* Verifies every invariant of a pool's metadata. repair != 0 first restores a damaged
 * superblock (from its copy, or the one flipped bit), joins the pool (host index from params,
 * which may be NULL), and when no other participant is alive or undecided restores or resets
 * every damaged word (slots, extent table, block states; docs/shared.md, "Repair"); then it
 * recovers every dead participant (waiting up to two lease timeouts for silent participants of
 * other hosts) and leaves. The report is written also when problems are found; the status is
 * CXLPOOL_E_CORRUPT when any count of problems is non-zero. When the check cannot run at all
 * (no such pool, not a pool, a superblock beyond repair), extents_total is 0. */
CXLPOOL_API cxlpool_status_t cxlpool_shared_pool_check(const char* device, const cxlpool_shared_params_t* params,
                                                       int repair, cxlpool_shared_check_report_t* out);

/* Coherence for non-coherent pools: publish after writing [ptr, ptr+len) (write back + fence),
 * acquire before reading (invalidate + fence). No-ops for memory of coherent pools and for
 * memory that is not in a shared pool. */
CXLPOOL_API cxlpool_status_t cxlpool_publish(const void* ptr, size_t len);
CXLPOOL_API cxlpool_status_t cxlpool_acquire(const void* ptr, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CXLPOOL_SHARED_H */

/* SPDX-License-Identifier: MIT */
/* cxlpool composition: a shared pool's capacity moved between its quotas at run time
 * (docs/compose.md). Each quota has a grant, the extents its participants may own together;
 * any participant may change grants, one at a time (the compose claim, a claim in the pool
 * itself: no daemon, no lock file, nothing a crash leaves held). Grants never add up to more
 * than the pool, counting for each quota the larger of its grant and what it owns; a
 * composer killed at any instruction leaves every grant old or new. */
#ifndef CXLPOOL_COMPOSE_H
#define CXLPOOL_COMPOSE_H

#include "cxlpool/shared.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cxlpool_compose_quota {
  char name[24];
  uint64_t reserved_extents; /* the quota's extents at creation */
  uint64_t granted_extents;  /* what its participants may own together now */
  uint64_t used_extents;     /* extents owned on its account */
  uint32_t grant_set;        /* 0: never changed (granted = reserved) */
  uint32_t grant_damaged;    /* 1: the grant word fails its check; the quota may not grow */
  uint64_t demand_extents;   /* what its live participants' last refused claims asked for (until each claims again) */
  uint64_t min_extents;      /* policy (cxlpool_compose_set_policy) */
  uint64_t max_extents;      /* 0: the pool */
  uint32_t priority;
  uint32_t policy_damaged; /* 1: the policy words fail their check (taken as none) */
  uint32_t locked;         /* 1: joined only with its key (cxlpool_compose_lock_quota) */
  uint32_t key_damaged;    /* 1: the key word fails its check: nobody can join until it is locked again */
} cxlpool_compose_quota_t;

typedef struct cxlpool_compose_state {
  uint64_t extents_total;
  uint64_t extent_size;
  uint64_t extents_unassigned; /* neither granted to a quota nor held by one: what a grant may give */
  uint64_t extents_over_grant; /* held beyond their quotas' grants: a reclaim waiting for frees */
  uint32_t overcommitted;      /* 1: grants and holdings add up to more than the pool (damage) */
  uint32_t quota_count;
  cxlpool_compose_quota_t quotas[16];
} cxlpool_compose_state_t;

/* Grants and holdings of every quota: one snapshot, read under the compose claim (waiting up
 * to wait_ms for another composer; CXLPOOL_E_BUSY naming it after that). */
CXLPOOL_API cxlpool_status_t cxlpool_compose_get_state(cxlpool_shared_pool_t* pool, uint32_t wait_ms,
                                                       cxlpool_compose_state_t* out);

/* Raises quota's grant by extents, from the unassigned ones. CXLPOOL_E_CAPACITY (nothing
 * changed) when fewer are unassigned; CXLPOOL_E_INVALID_ARGUMENT for an unknown quota or 0;
 * CXLPOOL_E_BUSY when another participant held the compose claim for wait_ms; CXLPOOL_E_CORRUPT
 * when a grant word is damaged (cxlpool-pool check --repair resets it). */
CXLPOOL_API cxlpool_status_t cxlpool_compose_grant(cxlpool_shared_pool_t* pool, const char* quota, uint64_t extents,
                                                   uint32_t wait_ms);

/* Lowers quota's grant by extents and waits up to deadline_ms until the quota's participants
 * own no more than the new grant (they give back cached blocks and empty extents at once, the
 * rest as their programs free it; nothing is taken from under live blocks). OK: all of it is
 * reclaimed. CXLPOOL_E_BUSY at the deadline: the quota keeps a grant for what it still holds,
 * *reclaimed says what was taken (may be NULL), the message what is left. Other statuses as
 * cxlpool_compose_grant, plus CXLPOOL_E_INVALID_ARGUMENT when extents exceed the grant. */
CXLPOOL_API cxlpool_status_t cxlpool_compose_reclaim(cxlpool_shared_pool_t* pool, const char* quota, uint64_t extents,
                                                     uint32_t deadline_ms, uint32_t wait_ms, uint64_t* reclaimed);

/* Locks quota: from now on a participant joins it only with the key written to key (32
 * hexadecimal digits and a NUL; cxlpool_shared_params_set_quota_key or CXLPOOL_QUOTA_KEY).
 * Locking again makes a new key (the old one no longer opens it; participants already joined
 * stay). The key keeps cooperating programs, e.g. containers given one quota by a CDI spec
 * (cxlpool-compose cdi), to the quota they were given; it is no memory protection: whoever can
 * map the pool's device can read and write all of it (docs/compose.md, "Containers"). */
#define CXLPOOL_QUOTA_KEY_SIZE 33
CXLPOOL_API cxlpool_status_t cxlpool_compose_lock_quota(cxlpool_shared_pool_t* pool, const char* quota,
                                                        uint32_t wait_ms, char key[CXLPOOL_QUOTA_KEY_SIZE]);
/* Opens quota to any participant again. */
CXLPOOL_API cxlpool_status_t cxlpool_compose_unlock_quota(cxlpool_shared_pool_t* pool, const char* quota,
                                                          uint32_t wait_ms);
/* A participant that joined a locked quota other than "default" (with its key) is a tenant:
 * cxlpool_compose_grant, _reclaim, _set_policy, _lock_quota, _unlock_quota and
 * cxlpool_composer_step fail for it with CXLPOOL_E_PERMISSION; the host composes from default
 * (with default's key when it is locked) or from an unlocked quota. */
/* The way back from a lost key: opens every quota of the pool at device to any participant,
 * without joining it (a pool whose default quota's key is lost cannot be joined by the host's
 * tools). Needs write access to the device, which is all a key ever asks of anyone. *unlocked
 * (may be NULL): how many quotas were locked. Not serialized with a composer locking at the
 * same moment (each word ends old or new). */
CXLPOOL_API cxlpool_status_t cxlpool_compose_reset_keys(const char* device, uint32_t* unlocked);

/* A quota's policy, kept in the pool for every composer: a minimum that is granted first and
 * never reclaimed, a maximum (0: the pool) that demand never grows it past, and a priority
 * (0..255): demand of a higher priority is served first, takes the spare extents of lower ones,
 * then lowers their grants down to their minimums (their extents come back as they free them).
 * The minimums together must fit in the pool (CXLPOOL_E_INVALID_ARGUMENT otherwise). */
typedef struct cxlpool_compose_policy {
  uint64_t min_extents;
  uint64_t max_extents;
  uint32_t priority;
  uint32_t reserved; /* 0 */
} cxlpool_compose_policy_t;
/* fields: which of policy's fields to set (the others keep their value, read and written under
 * the compose claim, so concurrent changes of different fields both hold); 0: all of them. A
 * policy whose two words a crash tore apart reads as none, and cxlpool-pool check counts it. */
#define CXLPOOL_COMPOSE_POLICY_MIN 1u
#define CXLPOOL_COMPOSE_POLICY_MAX 2u
#define CXLPOOL_COMPOSE_POLICY_PRIORITY 4u
CXLPOOL_API cxlpool_status_t cxlpool_compose_set_policy(cxlpool_shared_pool_t* pool, const char* quota,
                                                        const cxlpool_compose_policy_t* policy, uint32_t fields,
                                                        uint32_t wait_ms);

/* A composer running the policy: each step reads grants, holdings, policies and the demand of
 * the pool's live participants (a participant whose claim of extents failed on its grant asks
 * for them), and changes grants: minimums first, spare extents of a quota with no demand for
 * hold_ms given back, then demand by priority. Any number of composers may run (on any host):
 * each step's changes are made under the compose claim, grants only from what is unassigned
 * then. The composer's memory (hold times) is its own; a new one starts afresh. */
typedef struct cxlpool_composer cxlpool_composer_t;
CXLPOOL_API cxlpool_status_t cxlpool_composer_create(cxlpool_shared_pool_t* pool, uint32_t hold_ms,
                                                     cxlpool_composer_t** out);
typedef struct cxlpool_compose_move {
  char quota[24];
  int64_t delta_extents; /* > 0 granted, < 0 reclaimed */
  char why[24];          /* "minimum", "idle", "demand", "to a higher priority" */
} cxlpool_compose_move_t;
/* One step: up to capacity moves made written to moves, *count = how many were made. */
CXLPOOL_API cxlpool_status_t cxlpool_composer_step(cxlpool_composer_t* composer, uint32_t wait_ms,
                                                   cxlpool_compose_move_t* moves, size_t capacity, size_t* count);
/* Once, as free(): a composer destroyed twice is the caller's bug. */
CXLPOOL_API void cxlpool_composer_destroy(cxlpool_composer_t* composer);

#ifdef __cplusplus
}
#endif

#endif /* CXLPOOL_COMPOSE_H */

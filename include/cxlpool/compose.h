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

#ifdef __cplusplus
}
#endif

#endif /* CXLPOOL_COMPOSE_H */

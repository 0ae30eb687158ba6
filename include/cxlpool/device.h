/* SPDX-License-Identifier: MIT */
/* cxlpool device C ABI: the elastic capacity of the devices this process has open (the ones
 * its pools and backings use). Capacity grows at once; a withdrawal first gives back the
 * pools' free memory, then moves what they hold in the withdrawn range under the same
 * addresses, and only then frees the range; what cannot move makes it BUSY (docs/devices.md). */
#ifndef CXLPOOL_DEVICE_H
#define CXLPOOL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "cxlpool/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one capacity change did. */
typedef struct cxlpool_capacity_report {
  uint64_t capacity_before;
  uint64_t capacity_after;
  uint64_t trimmed_bytes;   /* free memory of the pools given back first */
  uint64_t relocated;       /* reservations given other offsets of the device (no bytes moved) */
  uint64_t evacuated_units; /* regions and large blocks moved to other devices of their pools */
  uint64_t evacuated_bytes; /* their committed bytes */
  uint64_t returned_units;  /* growth: units that withdrawals had moved off the device, back home */
  uint64_t returned_bytes;
  uint64_t lost_units; /* forced release: reservations whose memory in the range was taken */
  uint64_t lost_bytes; /* their committed bytes there: data lost */
} cxlpool_capacity_report_t;

/* A device's capacity now, and what elastic capacity has done on it since it was opened. */
typedef struct cxlpool_device_capacity {
  uint64_t capacity_bytes;  /* the online extents' bytes */
  uint64_t committed_bytes; /* committed by every pool and backing of this process */
  uint64_t space_bytes;     /* end of the device's offset space (its files' length) */
  uint64_t extents;         /* online extents */
  uint64_t grows;           /* growths: one per add, accepted offer or resize up */
  uint64_t shrinks;         /* withdrawals finished: one per withdraw, release or resize down */
  uint64_t refusals;        /* withdrawals given up (BUSY) */
  uint64_t relocated;       /* reservations given other offsets */
  uint64_t evacuated_units;
  uint64_t evacuated_bytes;
  uint64_t forced;          /* releases that took memory by force (counted in shrinks too) */
  uint64_t lost_units;      /* reservations that lost memory to forced releases */
  uint64_t lost_bytes;      /* committed bytes they lost */
  uint64_t max_space_bytes; /* how far the offset space can grow (max_size; a devdax device's size) */
  uint64_t reserved[2];
} cxlpool_device_capacity_t;

/* device: a target name (e.g. "cxl0") of a device open in this process; NOT_FOUND otherwise.
 * report may be NULL. A shared pool's device open in this process (named by its location,
 * e.g. "shm:q", or its path) reports the pool's size as its capacity, one extent, and the
 * bytes this process holds in the pool as committed; every capacity change of it is BUSY (a
 * shared pool's size is fixed in its superblock). */
CXLPOOL_API cxlpool_status_t cxlpool_device_get_capacity(const char* device, cxlpool_device_capacity_t* out);
/* The online extents as [offset, end) pairs: pairs[2i], pairs[2i+1] for i < min(*count, max). */
CXLPOOL_API cxlpool_status_t cxlpool_device_get_extents(const char* device, uint64_t* pairs, size_t max, size_t* count);
/* Sets the capacity (a multiple of the page size, at least 4 MiB): grows into withdrawn
 * extents first, then past the end of the offset space (files grow; a devdax device cannot
 * grow past its size: CAPACITY); shrinks by withdrawing from the top of the offset space.
 * Statuses: OK, INVALID_ARGUMENT, NOT_FOUND, CAPACITY, BUSY (the last error names what could
 * not move; capacity_after says how far it got), NO_MEMORY, OS. */
CXLPOOL_API cxlpool_status_t cxlpool_device_resize(const char* device, uint64_t capacity,
                                                   cxlpool_capacity_report_t* report);
/* Adds [offset, offset+length) of the offset space (page-aligned, not online) to the capacity. */
CXLPOOL_API cxlpool_status_t cxlpool_device_add_extent(const char* device, uint64_t offset, uint64_t length,
                                                       cxlpool_capacity_report_t* report);
/* Withdraws the online [offset, offset+length): see the top of this file. */
CXLPOOL_API cxlpool_status_t cxlpool_device_withdraw_extent(const char* device, uint64_t offset, uint64_t length,
                                                            cxlpool_capacity_report_t* report);

/* ---- Dynamic capacity (CXL 3.x DCD semantics; docs/devices.md) ----------------------------
 * The device offers extents and the host accepts or rejects each; the device asks for an
 * extent back and the host releases it when nothing it cannot move holds it, within a
 * deadline; a forced release takes it whatever holds it, and what could not move first loses
 * its memory there (reported, never silent). */

/* An offer of count extents (1..4096), pairs[2i] the offset and pairs[2i+1] the length of extent i. Each
 * is accepted (added, as cxlpool_device_add_extent) or rejected on its own; verdicts (may be
 * NULL) gets each one's status. Returns OK when every extent was accepted, else the first
 * rejection's status, the last error naming every rejected extent and why. */
CXLPOOL_API cxlpool_status_t cxlpool_device_offer_extents(const char* device, const uint64_t* pairs, size_t count,
                                                          cxlpool_status_t* verdicts,
                                                          cxlpool_capacity_report_t* report);

/* cxlpool_device_release_extent flags. */
#define CXLPOOL_RELEASE_FORCE 1u /* at the deadline the extent goes whatever holds it */

/* A release the device asks for: withdraws the online [offset, offset+length) as
 * cxlpool_device_withdraw_extent does, trying again (10 ms, doubling to 500 ms) while it is
 * BUSY until deadline_ms (at most 86,400,000: a day) have passed (0: one attempt): memory may be freed or unpinned
 * meanwhile. At the deadline: BUSY and the extent stays online; or, with
 * CXLPOOL_RELEASE_FORCE, a forced release: everything that can move has moved and the range
 * goes; reservations still holding part of it lose that memory (it reads as zeros afterwards,
 * or is undefined on device DAX; the addresses stay valid, commits there fail until the range
 * is online again); the report counts them, the lost handler gets each range, and one line on
 * stderr names them. Returns OK once the range is gone (check report->lost_units). */
CXLPOOL_API cxlpool_status_t cxlpool_device_release_extent(const char* device, uint64_t offset, uint64_t length,
                                                           uint32_t deadline_ms, unsigned flags,
                                                           cxlpool_capacity_report_t* report);

/* Called once per range a forced release took, on the releasing thread, with no cxlpool lock
 * held: the device, the first address lost, its length, and how many of its bytes were
 * committed (data lost). */
typedef void (*cxlpool_lost_fn)(const char* device, void* addr, size_t length, uint64_t committed_bytes, void* ctx);
/* Sets the process's lost handler (NULL: none). */
CXLPOOL_API cxlpool_status_t cxlpool_device_set_lost_handler(cxlpool_lost_fn fn, void* ctx);

/* Memory hot-remove and hot-add (docs/devices.md): a numa device a pool opened follows its
 * node's memory. Once the node's MemTotal differs from what it was when the device opened, the
 * device's capacity is the smaller of it and the capacity it would have otherwise; a shrink
 * moves what it can to the pools' other devices first. A thread does this every
 * CXLPOOL_NODE_WATCH_MS (default 1000; 0: none); this call does it now. changed (may be NULL):
 * how many devices changed capacity. Statuses: OK. */
CXLPOOL_API cxlpool_status_t cxlpool_device_watch_nodes(size_t* changed);

#ifdef __cplusplus
}
#endif

#endif

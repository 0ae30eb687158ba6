/* SPDX-License-Identifier: MIT */
/* The tiering engine: a background thread that moves hot memory of a pool's slow devices to
 * its fastest device and cold memory back, under the same pointers (docs/tiering.md). It
 * starts by itself when CXLPOOL_TIERING is set (at the first pool), or with
 * cxlpool_tiering_start. Memory moves in units: 4 MiB segments of small blocks (regions made
 * while the engine runs; 64 MiB regions made before it) and whole huge blocks. Only private
 * pools with two devices or more move. */
#ifndef CXLPOOL_TIERING_H
#define CXLPOOL_TIERING_H

#include <stddef.h>
#include <stdint.h>

#include "cxlpool/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts the engine. config: the CXLPOOL_TIERING grammar ("key=value,..."; docs/tiering.md),
 * "" for the defaults, NULL for the CXLPOOL_TIERING variable's value (defaults when unset).
 * Statuses: OK (also when it runs already with the same config); CONFIG (a bad item, named;
 * or a monitor that is unavailable here, with the reason); BUSY (it runs with another
 * config); NO_MEMORY. */
CXLPOOL_API cxlpool_status_t cxlpool_tiering_start(const char* config);
/* Stops the engine: memory stays where it is; pins stay recorded. */
CXLPOOL_API cxlpool_status_t cxlpool_tiering_stop(void);
/* The engine's state as JSON (config in force, monitors with availability and the reason,
 * kernel cooperation mode and why, counters, bytes per tier); release with cxlpool_string_free. */
CXLPOOL_API cxlpool_status_t cxlpool_tiering_stats_json(char** out);

/* Explicit heat: [p, p+len) is accessed about `weight` times per page now (1..1000000).
 * Statuses: OK; INVALID_ARGUMENT; NOT_FOUND (not cxlpool memory); NOT_SUPPORTED (the engine is
 * not running, or this memory does not move). */
CXLPOOL_API cxlpool_status_t cxlpool_hint_access(const void* p, size_t len, uint32_t weight);

#define CXLPOOL_TIER_UNPIN (-1)
/* Moves the units holding [p, p+len) to the pool's device of `tier` (0 = fastest) now, and
 * keeps them there: the engine does not move pinned units. CXLPOOL_TIER_UNPIN releases the
 * pin. A pin covers whole units (other blocks in the same segment move with it). Works
 * whether or not the engine runs. Statuses: OK; INVALID_ARGUMENT; NOT_FOUND; NOT_SUPPORTED
 * (no device of that tier in the pool, or this memory does not move); CAPACITY (no device of
 * that tier has room); NO_MEMORY; OS. */
CXLPOOL_API cxlpool_status_t cxlpool_pin(const void* p, size_t len, int tier);

#ifdef __cplusplus
}
#endif

#endif

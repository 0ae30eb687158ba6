/* SPDX-License-Identifier: MIT */
/* cxlpool backing C ABI: reserve, commit, decommit and release pages of one memory target,
 * with capacity accounting. A backing is the lowest layer: arenas and pools sit above it. */
#ifndef CXLPOOL_BACKING_H
#define CXLPOOL_BACKING_H

#include "cxlpool/topology.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One opened target. Thread-safe: all functions may be called concurrently on one backing. */
typedef struct cxlpool_backing cxlpool_backing_t;

typedef struct cxlpool_backing_caps {
  cxlpool_backing_kind_t kind;
  int shareable;             /* another process can map the same memory (by name or fd) */
  int kernel_migratable;     /* move_pages/mbind can move its pages between NUMA nodes */
  int decommit_frees_memory; /* decommit returns physical memory (devdax: 0) */
  int numa_node;             /* node the memory is bound to, or -1 */
  size_t page_size;          /* granule of reserve/commit/decommit (4 KiB, 2 MiB, ...) */
  uint64_t capacity_bytes;   /* committed bytes may not exceed this (now: it can change, device.h) */
  uint64_t reserved[6];
} cxlpool_backing_caps_t;

typedef struct cxlpool_backing_usage {
  uint64_t capacity_bytes;
  uint64_t reserved_bytes;  /* virtual address space reserved (file kinds: file range) */
  uint64_t committed_bytes; /* bytes committed (counted once per device offset) */
  uint64_t peak_committed_bytes;
  uint64_t reservations; /* live reservations and mappings */
  uint64_t reserved[6];
} cxlpool_backing_usage_t;

/* Opens the target at index. The backing does not keep the topology alive.
 * memfd targets get a new anonymous memory object per open; shm:NAME and file:PATH targets
 * get an unnamed file (O_TMPFILE, mode 0600) in /dev/shm or PATH's directory, never the named
 * object (an existing one is refused at discovery); devdax targets open the device.
 * Statuses: OK, INVALID_ARGUMENT, NOT_FOUND, OS, PERMISSION, CAPACITY, NO_MEMORY, BUSY. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_open(const cxlpool_topology_t* topology, size_t index,
                                                  cxlpool_backing_t** out);
/* Closes a backing. Fails with BUSY (and changes nothing) while reservations are live.
 * Its memory goes with its last descriptor and mapping (nothing named is left). NULL: OK. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_close(cxlpool_backing_t* backing);

CXLPOOL_API cxlpool_status_t cxlpool_backing_get_caps(const cxlpool_backing_t* backing, cxlpool_backing_caps_t* out);
CXLPOOL_API cxlpool_status_t cxlpool_backing_get_usage(const cxlpool_backing_t* backing, cxlpool_backing_usage_t* out);

/* Reserves size bytes of address space (inaccessible until committed). size is rounded up
 * to the page size; alignment is 0 (page) or a power of two. Anonymous (numa) backings
 * reserve address space only; fd backings also take a range of the device, so the total
 * reserved is limited by capacity. Statuses: OK, INVALID_ARGUMENT, CAPACITY, OS. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_reserve(cxlpool_backing_t* backing, size_t size, size_t alignment,
                                                     void** out);
/* Maps [offset, offset+size) of a shareable device (shm/memfd/file/devdax), e.g. memory that
 * another process wrote. Committed state is shared with other mappings of the same range.
 * Statuses: OK, INVALID_ARGUMENT (unaligned), NOT_SUPPORTED (numa), CAPACITY (past end), OS. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_map(cxlpool_backing_t* backing, uint64_t offset, size_t size, void** out);

enum {
  CXLPOOL_COMMIT_POPULATE = 1u << 0 /* fault the pages in now (placement checked early) */
};
/* Makes [addr, addr+len) readable and writable and backed by the device. Page-aligned, inside
 * one reservation. Committing committed pages is allowed and not counted twice.
 * Statuses: OK, INVALID_ARGUMENT, NOT_FOUND (not in a reservation), CAPACITY, OS. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_commit(cxlpool_backing_t* backing, void* addr, size_t len, uint32_t flags);
/* Returns the pages' memory to the device and makes them inaccessible; contents are lost
 * (devdax keeps contents, see caps). Statuses: OK, INVALID_ARGUMENT, NOT_FOUND, OS. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_decommit(cxlpool_backing_t* backing, void* addr, size_t len);
/* Releases a whole reservation or mapping (addr = what reserve/map returned), decommitting
 * what is committed. Statuses: OK, INVALID_ARGUMENT, NOT_FOUND. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_release(cxlpool_backing_t* backing, void* addr);
/* Device offset of an address inside a reservation (for handing to another process). */
CXLPOOL_API cxlpool_status_t cxlpool_backing_offset_of(const cxlpool_backing_t* backing, const void* addr,
                                                       uint64_t* out);
/* The file descriptor behind an fd backing (owned by the backing; dup it to keep it).
 * NOT_SUPPORTED for numa backings. */
CXLPOOL_API cxlpool_status_t cxlpool_backing_fd(const cxlpool_backing_t* backing, int* out);

/* NUMA node of each resident page in [addr, addr + pages*page) by a move_pages status
 * query (no migration): out[i] is the node, or a negative errno (-ENOENT: not present).
 * Statuses: OK, INVALID_ARGUMENT, OS. */
CXLPOOL_API cxlpool_status_t cxlpool_memory_query_nodes(const void* addr, size_t pages, int* out);

#ifdef __cplusplus
}
#endif
#endif /* CXLPOOL_BACKING_H */

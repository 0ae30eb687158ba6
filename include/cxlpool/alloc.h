/* SPDX-License-Identifier: MIT */
/* cxlpool allocation C ABI: pools over topology targets, placement policies, the malloc family
 * with the exact malloc contract, pointer information and statistics. */
#ifndef CXLPOOL_ALLOC_H
#define CXLPOOL_ALLOC_H

#include "cxlpool/topology.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A pool: one heap per thread over the devices (targets) it was created with. All functions
 * below are thread-safe; destroying a pool while other threads use it is not. */
typedef struct cxlpool_pool cxlpool_pool_t;
typedef struct cxlpool_pool_params cxlpool_pool_params_t;

/* Pool parameters: devices (comma-separated target names, default: every target in tier
 * order, at most 8), placement policy (docs/policy.md, default "bind:near"), name. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_params_create(cxlpool_pool_params_t** out);
CXLPOOL_API void cxlpool_pool_params_destroy(cxlpool_pool_params_t* params);
CXLPOOL_API cxlpool_status_t cxlpool_pool_params_set_devices(cxlpool_pool_params_t* params, const char* names);
CXLPOOL_API cxlpool_status_t cxlpool_pool_params_set_policy(cxlpool_pool_params_t* params, const char* policy);
CXLPOOL_API cxlpool_status_t cxlpool_pool_params_set_name(cxlpool_pool_params_t* params, const char* name);

/* What a child made by fork() (without exec) gets of a pool's memory.
 *  PRIVATE (default): its own copy of every block, exactly as with malloc: nothing the parent
 *    or the child writes afterwards reaches the other, on every kind of device.
 *  SHARED: the same memory: blocks allocated before fork() are shared, and writes by either
 *    process are seen by the other. The child cannot allocate from the inherited pool
 *    (NULL + ENOMEM) and its frees of inherited blocks are ignored: the heap belongs to the
 *    parent. */
typedef enum cxlpool_sharing {
  CXLPOOL_SHARING_PRIVATE = 0,
  CXLPOOL_SHARING_SHARED = 1,
  CXLPOOL_SHARING_MAX_ENUM = 0x7fffffff
} cxlpool_sharing_t;
#define CXLPOOL_HAVE_SHARING 1
/* Statuses: OK, INVALID_ARGUMENT (NULL params or an unknown mode). */
CXLPOOL_API cxlpool_status_t cxlpool_pool_params_set_sharing(cxlpool_pool_params_t* params, cxlpool_sharing_t sharing);

/* Creates a pool. params may be NULL for defaults. A bad policy fails with CXLPOOL_E_CONFIG
 * naming the bad token, as does a bad process option in the environment (CXLPOOL_TIERING,
 * CXLPOOL_STAT_PAGE, CXLPOOL_STAT_INTERVAL_MS, CXLPOOL_CONTROL), for every pool created while
 * it is set. The pool does not keep the topology alive.
 * Statuses: OK, INVALID_ARGUMENT, CONFIG, NOT_FOUND (unknown device), OS, NO_MEMORY. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_create(const cxlpool_topology_t* topology,
                                                 const cxlpool_pool_params_t* params, cxlpool_pool_t** out);
/* Releases all memory of the pool; its pointers become invalid. The default pool cannot be
 * destroyed (INVALID_ARGUMENT). NULL: OK. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_destroy(cxlpool_pool_t* pool);
/* The process default pool, created on first use from the environment: CXLPOOL_DEVICES /
 * CXLPOOL_CONFIG for devices and CXLPOOL_POLICY for placement (default bind:near).
 * Statuses: OK, CONFIG (bad environment; the message names the token), OS, NO_MEMORY. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_default(cxlpool_pool_t** out);

/* Allocation hints, mapped to devices by the policy's hint rule. */
enum {
  CXLPOOL_HINT_HOT = 1u << 0,
  CXLPOOL_HINT_COLD = 1u << 1,
  CXLPOOL_HINT_READ_MOSTLY = 1u << 2,
  CXLPOOL_HINT_SHARED = 1u << 3
};
typedef struct cxlpool_hint {
  uint32_t flags; /* CXLPOOL_HINT_* */
  int device;     /* pool device index to use regardless of the policy, or -1 */
} cxlpool_hint_t;

/* The malloc family. pool NULL means the default pool. Failure: NULL with errno ENOMEM
 * (EINVAL for bad alignments); never aborts. Size 0 gives a unique freeable pointer.
 * Sizes whose computation overflows (calloc n*size) fail with ENOMEM. */
CXLPOOL_API void* cxlpool_malloc(cxlpool_pool_t* pool, size_t size);
CXLPOOL_API void* cxlpool_malloc_hint(cxlpool_pool_t* pool, size_t size, const cxlpool_hint_t* hint);
CXLPOOL_API void* cxlpool_calloc(cxlpool_pool_t* pool, size_t count, size_t size);
/* realloc(NULL, n) allocates from pool; realloc(p, 0) frees p and returns NULL (glibc's
 * behaviour); otherwise the block moves within p's own pool. On failure p is untouched. */
CXLPOOL_API void* cxlpool_realloc(cxlpool_pool_t* pool, void* p, size_t size);
/* alignment: a power of two (EINVAL otherwise); any size. */
CXLPOOL_API void* cxlpool_aligned_alloc(cxlpool_pool_t* pool, size_t alignment, size_t size);
/* aligned_alloc with a hint (NULL: none). */
CXLPOOL_API void* cxlpool_aligned_alloc_hint(cxlpool_pool_t* pool, size_t alignment, size_t size,
                                             const cxlpool_hint_t* hint);
/* Returns 0, EINVAL (alignment not a power of two multiple of sizeof(void*)) or ENOMEM;
 * *out is written only on success. */
CXLPOOL_API int cxlpool_posix_memalign(cxlpool_pool_t* pool, void** out, size_t alignment, size_t size);
/* Frees a pointer of any cxlpool pool. NULL is ignored; so are pointers cxlpool did not
 * allocate. A pointer inside a block (not its start) and a second free of a block never
 * release anything: they are ignored and counted (cxlpool_stats_t invalid_frees and
 * double_frees), in every order of frees by the owning and other threads, while the block's
 * memory is still the pool's: one given back since (a trim, a purge, a move that released a
 * freed huge block) is ignored without a count. Preserves errno. */
CXLPOOL_API void cxlpool_free(void* p);
/* Bytes usable at p (>= the size asked for); 0 for NULL, foreign and interior pointers. */
CXLPOOL_API size_t cxlpool_usable_size(const void* p);

/* Where a pointer lives. device, target_index, device_name and tier describe the device that
 * holds the bytes now (the resident device); home_device is the device the block was placed
 * on, whose lists it stays on when the tiering engine moves its bytes (docs/tiering.md).
 * Statuses: OK, INVALID_ARGUMENT, NOT_FOUND (not a cxlpool pointer). */
typedef struct cxlpool_pointer_info {
  cxlpool_pool_t* pool;
  int device;              /* index of the resident device within the pool */
  size_t target_index;     /* topology target index of the resident device */
  const char* device_name; /* owned by the pool */
  int tier;
  size_t block_size;
  size_t usable_size;
  int huge;        /* 1 for a block with segments of its own (> 1 MiB) */
  int home_device; /* index of the device the block was placed on */
  uint64_t reserved[4];
} cxlpool_ptr_info_t;
CXLPOOL_API cxlpool_status_t cxlpool_ptr_info(const void* p, cxlpool_ptr_info_t* out);

/* Statistics of one device of a pool, or of all devices summed (device = -1). */
typedef struct cxlpool_stats {
  uint64_t allocated_bytes;     /* bytes in live blocks */
  uint64_t active_bytes;        /* bytes of device memory carved into pages and huge blocks */
  uint64_t resident_bytes;      /* bytes committed on the device by this pool */
  uint64_t peak_resident_bytes; /* per device; the sum of per-device peaks for device = -1 */
  uint64_t capacity_bytes;
  uint64_t allocations;
  uint64_t frees;
  uint64_t fallbacks;              /* placed here because the policy's first choice was full */
  uint64_t failures;               /* NULL + ENOMEM */
  uint64_t device_committed_bytes; /* committed on the device by every pool and backing of the
                                      process (device = -1: summed over the pool's devices) */
  uint64_t double_frees;           /* frees of blocks already free: ignored, counted here */
  uint64_t invalid_frees;          /* frees of pointers inside a block, not at its start: ignored */
  uint64_t reserved[4];
} cxlpool_stats_t;
CXLPOOL_API cxlpool_status_t cxlpool_pool_get_stats(const cxlpool_pool_t* pool, int device, cxlpool_stats_t* out);
/* Pool statistics as JSON; release with cxlpool_string_free. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_stats_json(const cxlpool_pool_t* pool, char** out);
CXLPOOL_API cxlpool_status_t cxlpool_pool_device_count(const cxlpool_pool_t* pool, int* out);
/* Name (owned by the pool) and tier of device index. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_get_device(const cxlpool_pool_t* pool, int device, const char** name,
                                                     int* tier);
CXLPOOL_API cxlpool_status_t cxlpool_pool_find_device(const cxlpool_pool_t* pool, const char* name, int* out);
/* The canonical text of the pool's policy (owned by the pool). */
CXLPOOL_API cxlpool_status_t cxlpool_pool_policy(const cxlpool_pool_t* pool, const char** out);
/* Returns free committed memory to the devices. released may be NULL. */
CXLPOOL_API cxlpool_status_t cxlpool_pool_trim(cxlpool_pool_t* pool, uint64_t* released);

#ifdef __cplusplus
}
#endif
#endif /* CXLPOOL_ALLOC_H */

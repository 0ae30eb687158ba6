/* SPDX-License-Identifier: MIT */
/* cxlpool KV cache: fixed-size blocks of an inference model's attention keys and values in
 * shared pools (cxlpool/shared.h), per-sequence block tables, prefix sharing by content, LRU
 * eviction from near to far pools and then out, and zero-copy handoff of a sequence between
 * processes (a prefill server exports, a decode server imports and reads the blocks in place).
 * docs/kvcache.md has the protocol and the measured figures.
 *
 * Threads: an arena and its sequences may be used from any threads (one lock per arena); a
 * view may be read from any threads and released once. Nothing here is async-signal-safe or
 * usable from the interposer's malloc. Statuses as everywhere: 0 or a negative
 * cxlpool_status_t, with the thread's last error naming the call and the bad argument.
 *
 * Handles (arena, sequence, view, params) carry a magic word; destroyed ones are kept, marked
 * dead, in a bounded quarantine (the last 1,024 of each kind), so a second destroy or a call
 * on a destroyed handle is refused (CXLPOOL_E_INVALID_ARGUMENT) rather than reaching freed
 * memory or a later object at the same address. A pointer that was never a handle is the
 * caller's bug, as with free().
 *
 * Pools: a pool given to an arena or a view should stay open while it lives. One closed
 * anyway is noticed at the next call (its blocks went with it: they are forgotten, never
 * touched; calls that need them fail with CXLPOOL_E_INVALID_ARGUMENT). A participant the pool
 * evicted (CXLPOOL_E_EVICTED) or whose device failed (CXLPOOL_E_DEVICE_FAILED) gets that status
 * from every call that would hand out a pointer into the pool (cxlpool_kv_seq_block,
 * cxlpool_kv_view_block, a prefix-cache hit in cxlpool_kv_seq_append), never the pointer. */
#ifndef CXLPOOL_KVCACHE_H
#define CXLPOOL_KVCACHE_H

#include "cxlpool/common.h"
#include "cxlpool/shared.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CXLPOOL_HAVE_KVCACHE 1

/* Element types of keys and values. Values are never renumbered. */
typedef enum cxlpool_kv_dtype {
  CXLPOOL_KV_FP16 = 0,
  CXLPOOL_KV_BF16 = 1,
  CXLPOOL_KV_FP8 = 2,
  CXLPOOL_KV_FP32 = 3,
  CXLPOOL_KV_DTYPE_MAX_ENUM = 0x7fffffff
} cxlpool_kv_dtype_t;

/* The shape of a model's KV cache. A block holds tokens_per_block tokens of every layer,
 * laid out [layer][key = 0, value = 1][token][kv head][head_dim] (cxlpool_kv_block_offset).
 * Limits: layers, kv_heads 1..1024; head_dim 1..4096; tokens_per_block 1..65536; a block at
 * most 4 GiB. */
typedef struct cxlpool_kv_geometry {
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t dtype; /* cxlpool_kv_dtype_t */
  uint32_t tokens_per_block;
  uint32_t reserved[3]; /* zero */
} cxlpool_kv_geometry_t;

/* A known model's geometry: "opt-6.7b" (32 layers x 32 heads x 128, fp16: 512 KiB per token),
 * "opt-13b", "llama-3-8b" (GQA: 32 layers x 8 KV heads x 128, bf16: 128 KiB per token),
 * "llama-3-70b", "mistral-7b". CXLPOOL_E_NOT_FOUND names the known ones. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_geometry_preset(const char* model, uint32_t tokens_per_block,
                                                        cxlpool_kv_geometry_t* out);
/* Bytes per token (keys and values of every layer) and per block; INVALID_ARGUMENT when the
 * geometry breaks a limit above (the message names the field). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_geometry_sizes(const cxlpool_kv_geometry_t* geometry, uint64_t* bytes_per_token,
                                                       uint64_t* bytes_per_block);
/* Byte offset, inside a block, of the head vectors of one token of one layer (kv: 0 keys,
 * 1 values): kv_heads x head_dim elements follow. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_block_offset(const cxlpool_kv_geometry_t* geometry, uint32_t layer, uint32_t kv,
                                                     uint32_t token, uint64_t* offset);

/* Arena parameters. Defaults: prefix caching on, no block limit beyond the pools' capacity. */
typedef struct cxlpool_kv_params cxlpool_kv_params_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_params_create(cxlpool_kv_params_t** out);
CXLPOOL_API void cxlpool_kv_params_destroy(cxlpool_kv_params_t* params);
/* At most `blocks` blocks in tier `tier` (0 = the first pool given to the arena); 0: no limit. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_params_set_max_blocks(cxlpool_kv_params_t* params, uint32_t tier,
                                                              uint64_t blocks);
CXLPOOL_API cxlpool_status_t cxlpool_kv_params_set_prefix_caching(cxlpool_kv_params_t* params, int enabled);

/* An arena: blocks of one geometry in one or more shared pools, nearest first (at most 4).
 * New blocks go to the nearest pool with room; when every pool is full, cached blocks no
 * sequence holds are evicted, least recently used first: from a pool to the next farther one
 * (copied), from the farthest out. The pools must stay open while the arena lives; the arena
 * allocates in them as their participant (this process). */
typedef struct cxlpool_kv_arena cxlpool_kv_arena_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_arena_create(const cxlpool_kv_geometry_t* geometry,
                                                     cxlpool_shared_pool_t* const* pools, size_t npools,
                                                     const cxlpool_kv_params_t* params, cxlpool_kv_arena_t** out);
/* Frees every block the arena holds. CXLPOOL_E_BUSY while sequences of it exist (nothing is
 * freed). Blocks imported by other processes live on until they release them. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_arena_destroy(cxlpool_kv_arena_t* arena);

typedef struct cxlpool_kv_stats {
  uint64_t blocks[4];     /* blocks in each tier */
  uint64_t cached_blocks; /* blocks in the prefix cache (held by sequences or not) */
  uint64_t idle_blocks;   /* cached blocks no sequence holds: the eviction candidates */
  uint64_t sequences;     /* live sequences */
  uint64_t prefix_hits;   /* blocks a sequence found in the cache */
  uint64_t prefix_misses; /* full blocks it had to allocate */
  uint64_t demotions;     /* idle blocks copied to a farther pool to make room */
  uint64_t evictions;     /* idle blocks freed to make room */
  uint64_t promotions;    /* blocks found in a far pool and copied nearer */
  uint64_t exports;       /* sequences exported */
  uint64_t reserved[6];
} cxlpool_kv_stats_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_arena_stats(cxlpool_kv_arena_t* arena, cxlpool_kv_stats_t* out);

/* A sequence: a block table that grows by tokens. */
typedef struct cxlpool_kv_seq cxlpool_kv_seq_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_create(cxlpool_kv_arena_t* arena, cxlpool_kv_seq_t** out);
/* Drops the sequence's hold on its blocks: cached ones stay for reuse (until evicted), the
 * others are freed. Its export (if any) is withdrawn: imports already done keep their blocks. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_destroy(cxlpool_kv_seq_t* seq);
/* Extends the sequence by n tokens (their ids: the prefix cache's key; a sequence holds fewer
 * than 2^32). While the sequence has no block of its own yet past its start, every whole block
 * of tokens whose content (these tokens after exactly the same cached block) is in the cache
 * is shared instead of allocated;
 * *reused_tokens (may be NULL) says how many leading tokens of this call need no computing.
 * New blocks are the caller's to fill (cxlpool_kv_seq_block), then to seal. CXLPOOL_E_CAPACITY
 * when no pool has room even after eviction: the sequence is unchanged. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_append(cxlpool_kv_seq_t* seq, const int32_t* tokens, size_t n,
                                                   size_t* reused_tokens);
/* The caller has written the keys and values of the first `tokens` tokens: the whole blocks
 * among them enter the prefix cache (other sequences may share them from now on). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_seal(cxlpool_kv_seq_t* seq, uint64_t tokens);

typedef struct cxlpool_kv_sequence_info {
  uint64_t tokens;
  uint64_t blocks;
  uint64_t sealed_tokens;
  uint64_t shared_blocks; /* blocks found in the prefix cache */
  uint64_t reserved[4];
} cxlpool_kv_seq_info_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_info(cxlpool_kv_seq_t* seq, cxlpool_kv_seq_info_t* out);
/* Block `index` of the sequence (block_bytes long) and the tier it is in now. The pointer is
 * valid until the sequence is destroyed or appended to (an append may move idle blocks, never
 * the sequence's own). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_block(cxlpool_kv_seq_t* seq, uint64_t index, void** data, uint32_t* tier);

/* What a producer hands a consumer: plain data, copy it through any channel. */
typedef struct cxlpool_kv_handle {
  cxlpool_shared_handle_t descriptor; /* a block in one of the arena's pools: the block table */
  uint64_t tokens;
  uint32_t blocks;
  uint32_t check; /* detects a handle damaged in transit */
} cxlpool_kv_handle_t;
/* Publishes the sequence's first `tokens` tokens (all of them: 0) for import: writes its block
 * table into a pool, writes back the blocks' bytes (cxlpool_publish) and names the table. The
 * tokens must be sealed. Exports of different token counts live side by side (a prefix and the
 * whole); the same count again returns the same handle. Every export is withdrawn when the
 * sequence is destroyed. The blocks stay valid for importers while the sequence lives, and for
 * each importer until it releases its view, whatever the producer does after the import. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_seq_export(cxlpool_kv_seq_t* seq, uint64_t tokens, cxlpool_kv_handle_t* out);

/* A consumer's view of an exported sequence: the blocks, in place, leased. */
typedef struct cxlpool_kv_view cxlpool_kv_view_t;
/* Validates the handle and the block table it names (pool, bounds, generation, geometry,
 * checksums, every block's handle) against the pools this process has open, leases every block
 * and acquires its bytes (cxlpool_acquire). expected (may be NULL: any) must equal the
 * exporter's geometry. Damaged handles and tables: CXLPOOL_E_INVALID_ARGUMENT or
 * CXLPOOL_E_CORRUPT; a withdrawn export: CXLPOOL_E_STALE; a pool not open here:
 * CXLPOOL_E_NOT_FOUND; more blocks than the lease table holds (4,096 per participant by
 * default: cxlpool_shared_params_set_leases): CXLPOOL_E_CAPACITY. The checks are not secret: a
 * participant that writes a table of its own making can name any live blocks of the pool, but
 * never make this call return a pointer outside a live block. On failure no lease is kept. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_import(cxlpool_shared_pool_t* const* pools, size_t npools,
                                               const cxlpool_kv_geometry_t* expected, const cxlpool_kv_handle_t* handle,
                                               cxlpool_kv_view_t** out);
typedef struct cxlpool_kv_imported_info {
  cxlpool_kv_geometry_t geometry;
  uint64_t tokens;
  uint64_t blocks;
  uint64_t bytes_per_block;
  uint64_t reserved[4];
} cxlpool_kv_view_info_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_view_info(const cxlpool_kv_view_t* view, cxlpool_kv_view_info_t* out);
CXLPOOL_API cxlpool_status_t cxlpool_kv_view_block(const cxlpool_kv_view_t* view, uint64_t index, const void** data);
/* Drops every lease of the view and frees it (a landing view: frees its blocks too). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_view_release(cxlpool_kv_view_t* view);

/* A landing view: blocks for `tokens` tokens of `geometry`, allocated by this process in its
 * own pools (the first pool with room, then the next), for bytes that arrive another way than
 * a shared pool (a transport: libcxlpool_ucx, include/cxlpool/kvcache_remote.h). The caller
 * writes them through cxlpool_kv_view_block_writable and reads them as any view; release frees
 * them. No room in any pool: CXLPOOL_E_CAPACITY, nothing kept. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_view_create(cxlpool_shared_pool_t* const* pools, size_t npools,
                                                    const cxlpool_kv_geometry_t* geometry, uint64_t tokens,
                                                    cxlpool_kv_view_t** out);
/* Block `index` of a landing view, to be written; CXLPOOL_E_INVALID_ARGUMENT for an imported
 * view (its blocks are the exporter's). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_view_block_writable(cxlpool_kv_view_t* view, uint64_t index, void** data);

#ifdef __cplusplus
}
#endif

#endif /* CXLPOOL_KVCACHE_H */

/* SPDX-License-Identifier: MIT */
/* Named devices through the C API (pools of policy bind:far on DEVICE from CXLPOOL_DEVICES):
 *   two-pools DEVICE  two pools over the same device in one process get disjoint memory
 *   hold DEVICE MIB   a pool with MIB MiB written, "ready pid=N", kept until stdin closes
 *   try DEVICE MIB    one pool attempt: the status and message of discovery and creation. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"

static const char* device;

static cxlpool_status_t make_pool(cxlpool_topology_t* topo, cxlpool_pool_t** out) {
  cxlpool_pool_params_t* params = NULL;
  cxlpool_status_t st = cxlpool_pool_params_create(&params);
  if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_devices(params, device);
  if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_policy(params, "bind:far");
  if (st == CXLPOOL_OK) st = cxlpool_pool_create(topo, params, out);
  cxlpool_pool_params_destroy(params);
  return st;
}

/* ---- Blocks with a pattern per owner -------------------------------------------------------- */
typedef struct block {
  unsigned char* p;
  size_t size;
  unsigned owner;
} block_t;

/* owner: 1 or 2 for the two pools of one process, the pid for hold and try. */
static uint64_t word(unsigned owner, size_t block, size_t i) {
  return (owner * 0x100000001B3ull) ^ ((uint64_t)block << 32) ^ (i * 0x9E3779B1u);
}
static void fill(const block_t* b, size_t index) {
  for (size_t i = 0; i < b->size / 8; ++i) ((uint64_t*)b->p)[i] = word(b->owner, index, i);
}
static int intact(const block_t* b, size_t index) {
  for (size_t i = 0; i < b->size / 8; ++i)
    if (((const uint64_t*)b->p)[i] != word(b->owner, index, i)) return 0;
  return 1;
}
static size_t block_size(size_t i) {
  static const size_t sizes[] = {16, 64, 256, 1000, 4096, 65536, 200000, 524288, 2u << 20, 3u << 20};
  return sizes[i % 10];
}

/* ---- Where a block's memory comes from: the file and offset of its mapping ---------------- */
typedef struct vma {
  uintptr_t start, end;
  uint64_t offset;
  unsigned long long dev_major, dev_minor, inode;
} vma_t;
static vma_t vmas[65536];
static size_t nvmas;

static void read_maps(void) {
  FILE* f = fopen("/proc/self/maps", "re");
  char line[4096];
  nvmas = 0;
  while (f && fgets(line, sizeof line, f) && nvmas < sizeof vmas / sizeof *vmas) {
    vma_t v;
    char perms[8];
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %" SCNx64 " %llx:%llx %llu", &v.start, &v.end, perms, &v.offset,
               &v.dev_major, &v.dev_minor, &v.inode) == 7)
      vmas[nvmas++] = v;
  }
  if (f) fclose(f);
}
static const vma_t* vma_of(const void* p) {
  uintptr_t a = (uintptr_t)p;
  for (size_t i = 0; i < nvmas; ++i)
    if (a >= vmas[i].start && a < vmas[i].end) return &vmas[i];
  return NULL;
}

/* Two pools over one named device: every block keeps its own pattern, and no two blocks of
 * different pools share file offsets of the device. */
static int two_pools(void) {
  enum { N = 240 };
  static block_t blocks[N];
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_t* pools[2] = {NULL, NULL};
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK || make_pool(topo, &pools[0]) != CXLPOOL_OK) {
    printf("first pool: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_status_t st = make_pool(topo, &pools[1]);
  if (st != CXLPOOL_OK) {
    printf("second pool over the same device: status %d: %s\n", (int)st, cxlpool_last_error_message());
    return 1;
  }
  for (size_t i = 0; i < N; ++i) {
    block_t* b = &blocks[i];
    b->owner = (unsigned)(i % 2) + 1;
    b->size = block_size(i / 2);
    b->p = cxlpool_malloc(pools[i % 2], b->size);
    if (!b->p) {
      printf("pool %u: allocation of %zu bytes failed: %s\n", b->owner, b->size, strerror(errno));
      return 1;
    }
    fill(b, i);
  }
  int problems = 0, wrong = 0;
  for (size_t i = 0; i < N; ++i) wrong += !intact(&blocks[i], i);
  printf("blocks of both pools hold their own pattern: %s (%d of %d wrong)\n", wrong ? "WRONG" : "ok", wrong, N);
  problems += wrong;
  int overlap = 0, shared_offsets = 0, mapped = 0;
  read_maps();
  for (size_t i = 0; i < N; ++i) {
    const vma_t* vi = vma_of(blocks[i].p);
    mapped += vi && vi->inode;
    for (size_t j = i + 1; j < N; ++j) {
      if (blocks[i].owner == blocks[j].owner) continue;
      const block_t *a = &blocks[i], *b = &blocks[j];
      if (a->p < b->p + b->size && b->p < a->p + a->size) ++overlap;
      const vma_t* vj = vma_of(b->p);
      if (!vi || !vj || !vi->inode || vi->inode != vj->inode || vi->dev_major != vj->dev_major ||
          vi->dev_minor != vj->dev_minor)
        continue;
      uint64_t oa = vi->offset + ((uintptr_t)a->p - vi->start), ob = vj->offset + ((uintptr_t)b->p - vj->start);
      if (oa < ob + b->size && ob < oa + a->size) ++shared_offsets;
    }
  }
  printf("address ranges of the two pools overlap: %s (%d pairs)\n", overlap ? "WRONG" : "ok", overlap);
  printf("blocks of the two pools share device offsets: %s (%d pairs; %d of %d blocks file-mapped)\n",
         shared_offsets ? "WRONG" : "ok", shared_offsets, mapped, N);
  problems += overlap + shared_offsets;
  for (size_t i = 0; i < N; ++i) cxlpool_free(blocks[i].p);
  cxlpool_pool_destroy(pools[1]);
  cxlpool_pool_destroy(pools[0]);
  cxlpool_topology_destroy(topo);
  return problems ? 1 : 0;
}

/* Allocates mib MiB in 1 MiB and small blocks and writes them; NULL on failure. */
static block_t* write_blocks(cxlpool_pool_t* pool, size_t mib, size_t* count) {
  size_t n = mib + 1024;
  block_t* b = calloc(n, sizeof *b);
  for (size_t i = 0; b && i < n; ++i) {
    b[i].size = i < mib ? (1u << 20) : 64 + (i % 7) * 48;
    b[i].owner = (unsigned)getpid();
    b[i].p = cxlpool_malloc(pool, b[i].size);
    if (!b[i].p) {
      printf("allocation %zu of %zu bytes failed: %s\n", i, b[i].size, strerror(errno));
      *count = i;
      return b;
    }
    fill(&b[i], i);
  }
  *count = n;
  return b;
}

static int hold(size_t mib) {
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_t* pool = NULL;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK || make_pool(topo, &pool) != CXLPOOL_OK) {
    printf("hold: %s\n", cxlpool_last_error_message());
    return 1;
  }
  size_t n = 0;
  block_t* b = write_blocks(pool, mib, &n);
  printf("ready pid=%d\n", (int)getpid());
  fflush(stdout);
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += !intact(&b[i], i);
  printf("hold: %zu blocks, %zu changed by someone else: %s\n", n, wrong, wrong ? "WRONG" : "ok");
  for (size_t i = 0; i < n; ++i) cxlpool_free(b[i].p);
  free(b);
  cxlpool_pool_destroy(pool);
  cxlpool_topology_destroy(topo);
  return wrong || n != mib + 1024 ? 1 : 0;
}

static int try_pool(size_t mib) {
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_t* pool = NULL;
  cxlpool_status_t st = cxlpool_topology_discover(NULL, &topo);
  printf("discover=%d %s\n", (int)st, st == CXLPOOL_OK ? "" : cxlpool_last_error_message());
  if (st != CXLPOOL_OK) return 0;
  st = make_pool(topo, &pool);
  printf("pool=%d %s\n", (int)st, st == CXLPOOL_OK ? "" : cxlpool_last_error_message());
  if (st != CXLPOOL_OK) {
    cxlpool_topology_destroy(topo);
    return 0;
  }
  size_t n = 0;
  block_t* b = write_blocks(pool, mib, &n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += !intact(&b[i], i);
  printf("wrote %zu blocks, %zu wrong\n", n, wrong);
  for (size_t i = 0; i < n; ++i) cxlpool_free(b[i].p);
  free(b);
  cxlpool_pool_destroy(pool);
  cxlpool_topology_destroy(topo);
  return 0;
}

int main(int argc, char** argv) {
  device = argc >= 3 ? argv[2] : "";
  if (argc == 3 && strcmp(argv[1], "two-pools") == 0) return two_pools();
  if (argc == 4 && strcmp(argv[1], "hold") == 0) return hold(strtoull(argv[3], NULL, 10));
  if (argc == 4 && strcmp(argv[1], "try") == 0) return try_pool(strtoull(argv[3], NULL, 10));
  fprintf(stderr, "usage: named_device two-pools DEVICE | hold DEVICE MIB | try DEVICE MIB\n");
  return 2;
}

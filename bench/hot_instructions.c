/* SPDX-License-Identifier: MIT
 * The hot 64 B malloc+free loop of alloc_bench, alone, for counting instructions under
 * callgrind (bench/run_hot_instructions.py): a count that does not move with the machine's
 * load or speed, so two allocators (or two commits) compare on a busy machine too.
 *
 *   hot_instructions system N                 malloc/free (glibc, or a peer under LD_PRELOAD)
 *   hot_instructions cxlpool-near N           cxlpool_malloc on a pool bound to node0
 *   hot_instructions cxlpool-far N            ... bound to an emulated far device (memfd)
 *   hot_instructions cxlpool N POLICY         ... over node0 and the far device, with POLICY
 *
 * Runs N pairs after a warm-up of 1,000 (past a thread's first blocks of a class, which come
 * from a central heap), so the difference between two runs of N and 2N is N pairs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxlpool/cxlpool.h"

static cxlpool_pool_t* pool;
static int use_system;

/* noinline: the same call per pair for every allocator, as alloc_bench's function pointers. */
__attribute__((noinline)) static void* take(size_t n) { return use_system ? malloc(n) : cxlpool_malloc(pool, n); }
__attribute__((noinline)) static void give(void* p) {
  if (use_system)
    free(p);
  else
    cxlpool_free(p);
}

static int make_pool(const char* which, const char* policy) {
  cxlpool_config_t* c = NULL;
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_params_t* p = NULL;
  int ok = cxlpool_config_create(&c) == CXLPOOL_OK &&
           cxlpool_config_set_devices(c, "cxlfar:backing=memfd,size=1G") == CXLPOOL_OK &&
           cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC) == CXLPOOL_OK &&
           cxlpool_topology_discover(c, &topo) == CXLPOOL_OK && cxlpool_pool_params_create(&p) == CXLPOOL_OK;
  if (ok) {
    const char* devices = !strcmp(which, "cxlpool-near")  ? "node0"
                          : !strcmp(which, "cxlpool-far") ? "cxlfar"
                                                          : "node0,cxlfar";
    ok = cxlpool_pool_params_set_devices(p, devices) == CXLPOOL_OK &&
         (!policy || cxlpool_pool_params_set_policy(p, policy) == CXLPOOL_OK) &&
         cxlpool_pool_create(topo, p, &pool) == CXLPOOL_OK;
  }
  if (!ok) fprintf(stderr, "hot_instructions: %s\n", cxlpool_last_error_message());
  cxlpool_pool_params_destroy(p);
  cxlpool_topology_destroy(topo);
  cxlpool_config_destroy(c);
  return ok;
}

int main(int argc, char** argv) {
  const char* usage = "usage: hot_instructions system|cxlpool-near|cxlpool-far|cxlpool N [POLICY]\n";
  if (argc < 3) {
    fputs(usage, stderr);
    return 2;
  }
  char* end = NULL;
  const long n = strtol(argv[2], &end, 10);
  if (*end || n <= 0) {
    fprintf(stderr, "hot_instructions: N must be a positive number, not '%s'\n", argv[2]);
    return 2;
  }
  if (!strcmp(argv[1], "system")) {
    use_system = 1;
  } else if (!strcmp(argv[1], "cxlpool-near") || !strcmp(argv[1], "cxlpool-far") || !strcmp(argv[1], "cxlpool")) {
    if (!strcmp(argv[1], "cxlpool") != (argc == 4)) {
      fputs(usage, stderr);
      return 2;
    }
    if (!make_pool(argv[1], argc == 4 ? argv[3] : NULL)) return 1;
  } else {
    fputs(usage, stderr);
    return 2;
  }
  for (int i = 0; i < 1000; ++i) give(take(64));
  for (long i = 0; i < n; ++i) {
    void* p = take(64);
    if (!p) {
      fprintf(stderr, "hot_instructions: malloc(64) returned NULL\n");
      return 1;
    }
    __asm__ volatile("" : : "r"(p) : "memory");
    give(p);
  }
  return 0;
}

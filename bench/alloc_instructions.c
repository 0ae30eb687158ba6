/* SPDX-License-Identifier: MIT
 * Two of alloc_bench's workloads, alone, for counting instructions (and simulated cache misses)
 * under callgrind (bench/run_alloc_instructions.py): figures that do not move with the
 * machine's load or speed, so two allocators, or two commits, compare on a busy machine too.
 *
 *   alloc_instructions WORKLOAD system N                malloc/free (glibc, or a peer under LD_PRELOAD)
 *   alloc_instructions WORKLOAD cxlpool-near N          cxlpool_malloc on a pool bound to node0
 *   alloc_instructions WORKLOAD cxlpool-far N           ... bound to an emulated far device (memfd)
 *   alloc_instructions WORKLOAD cxlpool N POLICY        ... over node0 and the far device, with POLICY
 *
 * WORKLOAD hot: N malloc(64)+free pairs, after a warm-up of 1,000 (past a thread's first blocks
 * of a class, which come from a central heap). WORKLOAD shuffled: N blocks of 16-512 B
 * allocated, then freed in a shuffled order (the order drawn before the first malloc, outside
 * the allocator), twice. The difference between the runs of N and 2N is N pairs (hot) or 2N
 * pairs (shuffled).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cxlpool/cxlpool.h"

static cxlpool_pool_t* pool;
static int use_system;

/* noinline: the same call per operation for every allocator, as alloc_bench's function
 * pointers. */
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
  if (!ok) fprintf(stderr, "alloc_instructions: %s\n", cxlpool_last_error_message());
  cxlpool_pool_params_destroy(p);
  cxlpool_topology_destroy(topo);
  cxlpool_config_destroy(c);
  return ok;
}

static int hot(long n) {
  for (int i = 0; i < 1000; ++i) give(take(64));
  for (long i = 0; i < n; ++i) {
    void* p = take(64);
    if (!p) return 0;
    __asm__ volatile("" : : "r"(p) : "memory");
    give(p);
  }
  return 1;
}

static unsigned long long next(unsigned long long* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* The harness's arrays come from mmap, never from the allocator under test. */
static void* harness_array(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static int shuffled(long n) {
  void** blocks = harness_array((size_t)n * sizeof *blocks);
  size_t* sizes = harness_array((size_t)n * sizeof *sizes);
  long* order = harness_array((size_t)n * sizeof *order);
  if (!blocks || !sizes || !order) return 0;
  unsigned long long s = 88172645463325252ull;
  for (long i = 0; i < n; ++i) {
    sizes[i] = 16 + next(&s) % 497;
    order[i] = i;
  }
  for (long i = n - 1; i > 0; --i) {
    const long j = (long)(next(&s) % (unsigned long long)(i + 1));
    const long t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int round = 0; round < 2; ++round) {
    for (long i = 0; i < n; ++i)
      if (!(blocks[i] = take(sizes[i]))) return 0;
    for (long i = 0; i < n; ++i) give(blocks[order[i]]);
  }
  return 1;
}

int main(int argc, char** argv) {
  const char* usage = "usage: alloc_instructions hot|shuffled system|cxlpool-near|cxlpool-far|cxlpool N [POLICY]\n";
  if (argc < 4 || (strcmp(argv[1], "hot") && strcmp(argv[1], "shuffled"))) {
    fputs(usage, stderr);
    return 2;
  }
  char* end = NULL;
  const long n = strtol(argv[3], &end, 10);
  if (*end || n <= 0 || n > 100000000) {
    fprintf(stderr, "alloc_instructions: N must be a number from 1 to 100000000, not '%s'\n", argv[3]);
    return 2;
  }
  const char* which = argv[2];
  if (!strcmp(which, "system")) {
    if (argc != 4) {
      fputs(usage, stderr);
      return 2;
    }
    use_system = 1;
  } else if (!strcmp(which, "cxlpool-near") || !strcmp(which, "cxlpool-far") || !strcmp(which, "cxlpool")) {
    if (!strcmp(which, "cxlpool") != (argc == 5) || argc > 5) {
      fputs(usage, stderr);
      return 2;
    }
    if (!make_pool(which, argc == 5 ? argv[4] : NULL)) return 1;
  } else {
    fputs(usage, stderr);
    return 2;
  }
  if (!(strcmp(argv[1], "hot") ? shuffled(n) : hot(n))) {
    fprintf(stderr, "alloc_instructions: an allocation returned NULL (or the harness's mmap failed)\n");
    return 1;
  }
  return 0;
}

// SPDX-License-Identifier: MIT
// What an allocating thread waits for while a large unit of its pool moves (docs/tiering.md,
// "Locks"): a pool over two memfd devices (tiers 0 and 1); a block of BYTES (default 1 GiB) on
// tier 0 is pinned to tier 1 (cxlpool_pin: one staged copy) while another thread keeps
// allocating 60,000-byte blocks on tier 0 (a new page every eight). Prints the move's time and,
// before, during and after it, how many of those mallocs ran and the longest one.
//   malloc_during_move [DEVICES [BYTES [POLICY]]]
#include <cxlpool/cxlpool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static cxlpool_pool_t* pool;
static atomic_int phase;  // 0 before, 1 during, 2 after, 3 stop
static double longest[3];
static long count[3];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void* allocate(void* arg) {
  static void* kept[4096];
  int n = 0;
  (void)arg;
  for (int ph; (ph = atomic_load(&phase)) < 3;) {
    const double t0 = now();
    void* p = cxlpool_malloc(pool, 60000);
    const double took = now() - t0;
    if (p) {
      memset(p, 1, 64);
      kept[n++] = p;
    }
    if (took > longest[ph]) longest[ph] = took;
    ++count[ph];
    if (n == 4096)
      while (n) cxlpool_free(kept[--n]);
  }
  while (n) cxlpool_free(kept[--n]);
  return NULL;
}

int main(int argc, char** argv) {
  const char* devices = argc > 1 ? argv[1] : "a:backing=memfd,size=3G,tier=0;b:backing=memfd,size=3G,tier=1";
  const size_t bytes = argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)1 << 30;
  const char* policy = argc > 3 ? argv[3] : "spill:near=a,far=b,watermark=90%";
  cxlpool_config_t* config = NULL;
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_params_t* params = NULL;
  if (cxlpool_config_create(&config) || cxlpool_config_set_devices(config, devices) ||
      cxlpool_config_set_flags(config, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC |
                                           CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) ||
      cxlpool_topology_discover(config, &topo) || cxlpool_pool_params_create(&params) ||
      cxlpool_pool_params_set_devices(params, "a,b") || cxlpool_pool_params_set_policy(params, policy) ||
      cxlpool_pool_create(topo, params, &pool)) {
    fprintf(stderr, "malloc_during_move: %s (devices a and b)\n", cxlpool_last_error_message());
    return 2;
  }
  char* block = cxlpool_malloc(pool, bytes);
  if (!block) {
    fprintf(stderr, "malloc_during_move: %zu bytes: %s\n", bytes, cxlpool_last_error_message());
    return 2;
  }
  memset(block, 7, bytes);
  pthread_t thread;
  if (pthread_create(&thread, NULL, allocate, NULL)) return 2;
  const struct timespec settle = {0, 300000000};
  nanosleep(&settle, NULL);
  atomic_store(&phase, 1);
  const double t0 = now();
  const cxlpool_status_t st = cxlpool_pin(block, bytes, 1);
  const double moved = now() - t0;
  atomic_store(&phase, 2);
  nanosleep(&settle, NULL);
  atomic_store(&phase, 3);
  pthread_join(thread, NULL);
  printf("pin of %zu bytes to tier 1: %s%s%s in %.3f s (bytes intact: %s)\n", bytes, cxlpool_status_str(st),
         st ? ": " : "", st ? cxlpool_last_error_message() : "", moved, block[bytes - 1] == 7 ? "yes" : "NO");
  static const char* names[3] = {"before", "during", "after"};
  for (int i = 0; i < 3; ++i)
    printf("  %-6s %9ld mallocs of 60000 bytes on tier 0, longest %.3f ms\n", names[i], count[i], longest[i] * 1e3);
  return st == CXLPOOL_OK ? 0 : 1;
}

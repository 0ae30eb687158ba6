/* SPDX-License-Identifier: MIT */
/* Example: a size-threshold pool in C. Allocations of 1 MiB and more go to the far tier,
 * smaller ones stay near; per-device statistics show the split.
 * Usage: threshold_pool [POLICY]   (default "threshold:size=1M,tier=far") */
#include <stdio.h>
#include <string.h>

#include "cxlpool/cxlpool.h"

int main(int argc, char** argv) {
  const char* policy = argc > 1 ? argv[1] : "threshold:size=1M,tier=far";
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_params_t* params = NULL;
  cxlpool_pool_t* pool = NULL;
  void* blocks[64];
  int i, n = 0;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK || cxlpool_pool_params_create(&params) != CXLPOOL_OK ||
      cxlpool_pool_params_set_policy(params, policy) != CXLPOOL_OK ||
      cxlpool_pool_create(topo, params, &pool) != CXLPOOL_OK) {
    fprintf(stderr, "threshold_pool: %s\n", cxlpool_last_error_message());
    return 1;
  }
  for (i = 0; i < 32; ++i) {
    size_t size = (i % 2) ? (size_t)(2 + i) << 20 : (size_t)100 * (i + 1); /* big and small */
    cxlpool_ptr_info_t info;
    blocks[n] = cxlpool_malloc(pool, size);
    if (!blocks[n]) {
      perror("cxlpool_malloc");
      break;
    }
    memset(blocks[n], 1, size);
    cxlpool_ptr_info(blocks[n], &info);
    if (i < 6) printf("%9zu bytes -> %s (tier %d)\n", size, info.device_name, info.tier);
    ++n;
  }
  int devices = 0;
  cxlpool_pool_device_count(pool, &devices);
  for (i = 0; i < devices; ++i) {
    const char* name;
    cxlpool_stats_t s;
    cxlpool_pool_get_device(pool, i, &name, NULL);
    cxlpool_pool_get_stats(pool, i, &s);
    printf("%-8s %3llu allocations, %8.1f MiB live, %8.1f MiB resident\n", name, (unsigned long long)s.allocations,
           s.allocated_bytes / 1048576.0, s.resident_bytes / 1048576.0);
  }
  for (i = 0; i < n; ++i) cxlpool_free(blocks[i]);
  cxlpool_pool_destroy(pool);
  cxlpool_pool_params_destroy(params);
  cxlpool_topology_destroy(topo);
  return 0;
}

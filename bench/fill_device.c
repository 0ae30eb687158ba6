// SPDX-License-Identifier: MIT
// How full a declared device gets before the first NULL (docs/allocator.md, "Known limit"):
// one pool bound to one device, blocks of a mixed size distribution (70% 16-271 B, 25% up to
// 64 KiB, 5% up to 64 KiB + MAX) allocated and kept until one fails; prints the bytes asked
// for, the pool's allocated and resident bytes, the failure's message, and whether 64-byte
// blocks are still served after it.
//   fill_device [DEVICES [SEED [MAX]]]   default "d:backing=memfd,size=128M" 1 4194304
#include <cxlpool/cxlpool.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  const char* devices = argc > 1 ? argv[1] : "d:backing=memfd,size=128M";
  const unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 0) : 1;
  const size_t max = argc > 3 ? (size_t)strtoull(argv[3], NULL, 0) : (size_t)4 << 20;
  cxlpool_config_t* config = NULL;
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_params_t* params = NULL;
  cxlpool_pool_t* pool = NULL;
  if (cxlpool_config_create(&config) || cxlpool_config_set_devices(config, devices) ||
      cxlpool_config_set_flags(config, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC |
                                           CXLPOOL_CONFIG_NO_DEFAULT_DEVICE) ||
      cxlpool_topology_discover(config, &topo) || cxlpool_pool_params_create(&params) ||
      cxlpool_pool_params_set_devices(params, "d") || cxlpool_pool_params_set_policy(params, "bind:d") ||
      cxlpool_pool_create(topo, params, &pool)) {
    fprintf(stderr, "fill_device: %s (the device must be named d)\n", cxlpool_last_error_message());
    return 2;
  }
  srand(seed);
  size_t n = 0, asked = 0;
  for (;;) {
    const double r = rand() / (double)RAND_MAX;
    const size_t size = r < 0.70 ? 16 + (size_t)rand() % 256
                        : r < 0.95 ? 256 + (size_t)rand() % (64 << 10)
                                   : (64 << 10) + (size_t)rand() % max;
    if (cxlpool_malloc(pool, size)) {  // kept: the pool goes with the process
      ++n;
      asked += size;
      continue;
    }
    cxlpool_stats_t st = {0};
    cxlpool_pool_get_stats(pool, 0, &st);
    printf("first NULL: %zu bytes, after %zu blocks of %.1f MiB; allocated %.1f MiB, resident %.1f MiB\n  %s\n",
           size, n, asked / 1048576.0, st.allocated_bytes / 1048576.0, st.resident_bytes / 1048576.0,
           cxlpool_last_error_message());
    break;
  }
  int small = 0;
  for (int i = 0; i < 100; ++i) small += cxlpool_malloc(pool, 64) != NULL;
  printf("64-byte blocks served after it: %d of 100\n", small);
  return 0;
}

/* SPDX-License-Identifier: MIT */
/* Consumer of the installed C API: discover and print the number of targets. */
#include <cxlpool/cxlpool.h>
#include <stdio.h>

int main(void) {
  cxlpool_topology_t* topo = NULL;
  size_t n = 0;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK || cxlpool_topology_target_count(topo, &n) != CXLPOOL_OK) {
    fprintf(stderr, "consumer: %s\n", cxlpool_last_error_message());
    return 1;
  }
  printf("consumer (C, cxlpool %s): %zu targets\n", cxlpool_version_string(), n);
  cxlpool_topology_destroy(topo);
  return n > 0 ? 0 : 1;
}

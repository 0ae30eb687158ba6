/* SPDX-License-Identifier: MIT */
/* Example: map and touch memory on every device cxlpool discovers. For each target it opens
 * a backing, reserves and commits 16 MiB (less if the device is smaller), writes a pattern,
 * reads it back, reports where the pages are (move_pages status query for NUMA memory) and
 * releases everything. Usage: touch_devices [MiB] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxlpool/cxlpool.h"

static int touch_target(const cxlpool_topology_t* topo, size_t index, size_t bytes) {
  cxlpool_target_info_t info;
  cxlpool_backing_t* backing = NULL;
  cxlpool_backing_caps_t caps;
  void* p = NULL;
  int ok = 0;
  cxlpool_topology_get_target(topo, index, &info);
  if (info.capacity_bytes && bytes > info.capacity_bytes) bytes = (size_t)info.capacity_bytes;
  if (cxlpool_backing_open(topo, index, &backing) != CXLPOOL_OK) {
    printf("%-8s tier %d  open failed: %s\n", info.name, info.tier, cxlpool_last_error_message());
    return 0;
  }
  cxlpool_backing_get_caps(backing, &caps);
  bytes -= bytes % caps.page_size;
  if (cxlpool_backing_reserve(backing, bytes, 0, &p) != CXLPOOL_OK ||
      cxlpool_backing_commit(backing, p, bytes, CXLPOOL_COMMIT_POPULATE) != CXLPOOL_OK) {
    printf("%-8s tier %d  %s\n", info.name, info.tier, cxlpool_last_error_message());
  } else {
    unsigned char* c = (unsigned char*)p;
    size_t i, bad = 0;
    for (i = 0; i < bytes; ++i) c[i] = (unsigned char)(i * 131u + index);
    for (i = 0; i < bytes; ++i) bad += c[i] != (unsigned char)(i * 131u + index);
    size_t pages = bytes / caps.page_size;
    int* nodes = (int*)malloc(pages * sizeof(int));
    char where[96] = "n/a";
    if (nodes && caps.page_size == 4096 && cxlpool_memory_query_nodes(p, pages, nodes) == CXLPOOL_OK) {
      size_t on_first = 0;
      for (i = 0; i < pages; ++i) on_first += nodes[i] == nodes[0];
      snprintf(where, sizeof where, "%zu/%zu pages on node %d", on_first, pages, nodes[0]);
    }
    free(nodes);
    printf("%-8s tier %d  %-6s %6zu KiB committed, %s, %s\n", info.name, info.tier,
           cxlpool_backing_kind_str(info.backing), bytes >> 10, bad ? "VERIFY FAILED" : "verified", where);
    ok = bad == 0;
    cxlpool_backing_release(backing, p);
  }
  cxlpool_backing_close(backing);
  return ok;
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 16;
  cxlpool_topology_t* topo = NULL;
  size_t n = 0, ok = 0, i;
  if (mib == 0) {
    fprintf(stderr, "usage: touch_devices [MiB > 0]\n");
    return 2;
  }
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK) {
    fprintf(stderr, "touch_devices: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_topology_target_count(topo, &n);
  printf("touching %zu MiB on each of %zu targets\n", mib, n);
  for (i = 0; i < n; ++i) ok += (size_t)touch_target(topo, i, mib << 20);
  cxlpool_topology_destroy(topo);
  printf("%zu of %zu targets mapped, touched and verified\n", ok, n);
  return ok == n ? 0 : 1;
}

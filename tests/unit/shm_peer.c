/* SPDX-License-Identifier: MIT */
/* A second process for the shm visibility test: opens the device named argv[1] through
 * CXLPOOL_DEVICES, maps argv[2] bytes at offset 0 and checks they hold the byte pattern
 * (i * 7 + 3) & 0xff written by the first process; then writes 0x5a to the first byte. */
#include <stdio.h>
#include <stdlib.h>

#include "cxlpool/cxlpool.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: shm_peer DEVICE BYTES\n");
    return 2;
  }
  size_t bytes = (size_t)strtoull(argv[2], NULL, 10);
  cxlpool_topology_t* topo = NULL;
  size_t index = 0;
  cxlpool_backing_t* b = NULL;
  void* p = NULL;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK ||
      cxlpool_topology_find_target(topo, argv[1], &index) != CXLPOOL_OK ||
      cxlpool_backing_open(topo, index, &b) != CXLPOOL_OK || cxlpool_backing_map(b, 0, bytes, &p) != CXLPOOL_OK ||
      cxlpool_backing_commit(b, p, bytes, 0) != CXLPOOL_OK) {
    fprintf(stderr, "shm_peer: %s\n", cxlpool_last_error_message());
    return 3;
  }
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < bytes; ++i)
    if (c[i] != (unsigned char)((i * 7 + 3) & 0xff)) {
      fprintf(stderr, "shm_peer: byte %zu is %u\n", i, c[i]);
      return 4;
    }
  ((unsigned char*)p)[0] = 0x5a;
  printf("shm_peer: %zu bytes verified\n", bytes);
  cxlpool_backing_release(b, p);
  cxlpool_backing_close(b);
  cxlpool_topology_destroy(topo);
  return 0;
}

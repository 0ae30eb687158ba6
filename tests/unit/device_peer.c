/* SPDX-License-Identifier: MIT */
/* A second process for the device-ownership tests (C, public API only):
 *   device_peer busy DEVICE          opens DEVICE (from CXLPOOL_DEVICES) and expects BUSY naming
 *                                    the holder's pid (argv[3]); exit 0 when it does
 *   device_peer open DEVICE          opens DEVICE and expects it to succeed
 *   device_peer fd FD OFFSET BYTES   maps an inherited descriptor (cxlpool_backing_fd) directly,
 *                                    checks the byte pattern (i * 7 + 3) & 0xff written by the
 *                                    first process, then writes 0x5a to the first byte
 *   device_peer shared LOCATION      creates a 16 MiB shared pool at LOCATION and holds 1 MiB of
 *                                    it, prints "ready", waits for a line on stdin, then frees,
 *                                    closes and unlinks it (a program whose only pool is shared) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cxlpool/cxlpool.h"

static int busy(const char* device, const char* holder) {
  cxlpool_topology_t* topo = NULL;
  size_t index = 0;
  cxlpool_backing_t* b = NULL;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK ||
      cxlpool_topology_find_target(topo, device, &index) != CXLPOOL_OK) {
    fprintf(stderr, "device_peer: %s\n", cxlpool_last_error_message());
    return 3;
  }
  cxlpool_status_t st = cxlpool_backing_open(topo, index, &b);
  const char* msg = cxlpool_last_error_message();
  cxlpool_topology_destroy(topo);
  if (st != CXLPOOL_E_BUSY) {
    fprintf(stderr, "device_peer: expected BUSY, got %d (%s)\n", (int)st, msg);
    return 4;
  }
  char pid[32];
  snprintf(pid, sizeof pid, "pid %s", holder);
  if (!strstr(msg, pid) || !strstr(msg, device)) {
    fprintf(stderr, "device_peer: BUSY message lacks '%s' or the device: %s\n", pid, msg);
    return 5;
  }
  printf("device_peer: refused as expected: %s\n", msg);
  return 0;
}

static int open_ok(const char* device) {
  cxlpool_topology_t* topo = NULL;
  size_t index = 0;
  cxlpool_backing_t* b = NULL;
  if (cxlpool_topology_discover(NULL, &topo) != CXLPOOL_OK ||
      cxlpool_topology_find_target(topo, device, &index) != CXLPOOL_OK ||
      cxlpool_backing_open(topo, index, &b) != CXLPOOL_OK) {
    fprintf(stderr, "device_peer: %s\n", cxlpool_last_error_message());
    cxlpool_topology_destroy(topo);
    return 3;
  }
  cxlpool_backing_close(b);
  cxlpool_topology_destroy(topo);
  return 0;
}

static int by_fd(int fd, size_t offset, size_t bytes) {
  unsigned char* c = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
  if (c == MAP_FAILED) {
    perror("device_peer: mmap");
    return 3;
  }
  for (size_t i = 0; i < bytes; ++i)
    if (c[i] != (unsigned char)((i * 7 + 3) & 0xff)) {
      fprintf(stderr, "device_peer: byte %zu is %u\n", i, c[i]);
      return 4;
    }
  c[0] = 0x5a;
  printf("device_peer: %zu bytes verified\n", bytes);
  return 0;
}

static int shared_holder(const char* location) {
  cxlpool_shared_params_t* params = NULL;
  cxlpool_shared_pool_t* pool = NULL;
  void* p = NULL;
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK ||
      cxlpool_shared_params_set_size(params, 16u << 20) != CXLPOOL_OK ||
      cxlpool_shared_pool_create(location, params, 0, &pool) != CXLPOOL_OK ||
      cxlpool_shared_alloc(pool, 1u << 20, &p) != CXLPOOL_OK) {
    fprintf(stderr, "device_peer: %s\n", cxlpool_last_error_message());
    cxlpool_shared_params_destroy(params);
    if (pool) cxlpool_shared_pool_close(pool);
    return 3;
  }
  cxlpool_shared_params_destroy(params);
  memset(p, 0x5a, 1u << 20);
  printf("ready\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) line[0] = 0;
  int rc = cxlpool_shared_free(pool, p) == CXLPOOL_OK && cxlpool_shared_pool_close(pool) == CXLPOOL_OK &&
                   cxlpool_shared_pool_unlink(location) == CXLPOOL_OK
               ? 0
               : 6;
  if (rc) fprintf(stderr, "device_peer: %s\n", cxlpool_last_error_message());
  return rc;
}

int main(int argc, char** argv) {
  if (argc == 4 && strcmp(argv[1], "busy") == 0) return busy(argv[2], argv[3]);
  if (argc == 3 && strcmp(argv[1], "open") == 0) return open_ok(argv[2]);
  if (argc == 3 && strcmp(argv[1], "shared") == 0) return shared_holder(argv[2]);
  if (argc == 5 && strcmp(argv[1], "fd") == 0)
    return by_fd(atoi(argv[2]), (size_t)strtoull(argv[3], NULL, 10), (size_t)strtoull(argv[4], NULL, 10));
  fprintf(stderr, "usage: device_peer busy DEVICE PID | open DEVICE | fd FD OFFSET BYTES\n");
  return 2;
}

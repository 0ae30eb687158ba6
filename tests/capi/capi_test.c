/* SPDX-License-Identifier: MIT */
/* The public headers compiled as C (C11), exercising the C API end to end: configuration,
 * discovery, iteration with sources, errors with the last-error message, and a backing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxlpool/cxlpool.h"

static int failures = 0;
#define EXPECT(cond)                                                            \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fprintf(stderr, "%s:%d: EXPECT(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                               \
    }                                                                           \
  } while (0)

int main(void) {
  cxlpool_config_t* cfg = NULL;
  cxlpool_topology_t* topo = NULL;

  EXPECT(strcmp(cxlpool_status_str(CXLPOOL_E_CAPACITY), "CXLPOOL_E_CAPACITY: device capacity exceeded") == 0);
  EXPECT(strcmp(cxlpool_source_str(CXLPOOL_SOURCE_HMAT), "hmat") == 0);
  EXPECT(cxlpool_config_create(NULL) == CXLPOOL_E_INVALID_ARGUMENT);
  EXPECT(strstr(cxlpool_last_error_message(), "cxlpool_config_create") != NULL);

  /* A bad declaration: CONFIG, the token in the message, and *out untouched. */
  EXPECT(cxlpool_config_create(&cfg) == CXLPOOL_OK);
  EXPECT(cxlpool_config_set_flags(cfg, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC) == CXLPOOL_OK);
  EXPECT(cxlpool_config_set_flags(cfg, 1u << 30) == CXLPOOL_E_INVALID_ARGUMENT);
  EXPECT(cxlpool_config_set_devices(cfg, "cxl0:backing=shm,size=12Q") == CXLPOOL_OK);
  topo = (cxlpool_topology_t*)0x1;
  EXPECT(cxlpool_topology_discover(cfg, &topo) == CXLPOOL_E_CONFIG);
  EXPECT(topo == (cxlpool_topology_t*)0x1);
  {
    cxlpool_error_info_t err;
    EXPECT(cxlpool_last_error(&err) == CXLPOOL_OK);
    EXPECT(err.status == CXLPOOL_E_CONFIG);
    EXPECT(strstr(err.message, "12Q") != NULL);
  }

  /* A good one. */
  EXPECT(cxlpool_config_set_devices(cfg, "cxl0:backing=shm,size=32M,latency=300ns,bandwidth=20GB/s") == CXLPOOL_OK);
  EXPECT(cxlpool_topology_discover(cfg, &topo) == CXLPOOL_OK);
  cxlpool_config_destroy(cfg);

  size_t n = 0, idx = 0;
  EXPECT(cxlpool_topology_target_count(topo, &n) == CXLPOOL_OK);
  EXPECT(n >= 2);
  EXPECT(cxlpool_topology_find_target(topo, "cxl0", &idx) == CXLPOOL_OK);
  EXPECT(cxlpool_topology_find_target(topo, "nope", &idx) == CXLPOOL_E_NOT_FOUND);
  for (size_t i = 0; i < n; ++i) {
    cxlpool_target_info_t info;
    cxlpool_attr_value_t lat;
    EXPECT(cxlpool_topology_get_target(topo, i, &info) == CXLPOOL_OK);
    EXPECT(cxlpool_target_get_attr(topo, i, CXLPOOL_ATTR_READ_LATENCY_NS, &lat) == CXLPOOL_OK);
    printf("%-8s %-8s tier %d latency %s%lld [%s]\n", info.name, cxlpool_target_kind_str(info.kind), info.tier,
           lat.known ? "" : "?", (long long)lat.value, cxlpool_source_str(lat.source));
  }
  {
    cxlpool_target_info_t info;
    cxlpool_attr_value_t v;
    EXPECT(cxlpool_topology_get_target(topo, idx, &info) == CXLPOOL_OK);
    EXPECT(info.kind == CXLPOOL_TARGET_EMULATED);
    EXPECT(info.tier >= 1);
    EXPECT(info.capacity_bytes == 32u << 20);
    EXPECT(cxlpool_target_get_attr(topo, idx, CXLPOOL_ATTR_READ_LATENCY_NS, &v) == CXLPOOL_OK);
    EXPECT(v.known && v.value == 300 && v.source == CXLPOOL_SOURCE_CONFIG);
    EXPECT(cxlpool_target_get_attr(topo, idx, (cxlpool_attr_t)999, &v) == CXLPOOL_E_INVALID_ARGUMENT);
    EXPECT(cxlpool_topology_get_target(topo, n, &info) == CXLPOOL_E_NOT_FOUND);
  }
  {
    char* json = NULL;
    EXPECT(cxlpool_topology_to_json(topo, &json) == CXLPOOL_OK);
    EXPECT(json && strstr(json, "\"cxl0\"") != NULL);
    cxlpool_string_free(json);
  }
  {
    cxlpool_backing_t* b = NULL;
    void* p = NULL;
    cxlpool_backing_usage_t u;
    EXPECT(cxlpool_backing_open(topo, idx, &b) == CXLPOOL_OK);
    EXPECT(cxlpool_backing_reserve(b, 1 << 20, 0, &p) == CXLPOOL_OK);
    EXPECT(cxlpool_backing_commit(b, p, 1 << 20, CXLPOOL_COMMIT_POPULATE) == CXLPOOL_OK);
    memset(p, 0xab, 1 << 20);
    EXPECT(((unsigned char*)p)[12345] == 0xab);
    EXPECT(cxlpool_backing_get_usage(b, &u) == CXLPOOL_OK && u.committed_bytes == 1u << 20);
    EXPECT(cxlpool_backing_release(b, p) == CXLPOOL_OK);
    EXPECT(cxlpool_backing_close(b) == CXLPOOL_OK);
  }
  cxlpool_topology_destroy(topo);
  cxlpool_topology_destroy(NULL);
  cxlpool_config_destroy(NULL);
  if (failures)
    fprintf(stderr, "%d expectation(s) failed\n", failures);
  else
    printf("capi_test: all expectations held\n");
  return failures ? 1 : 0;
}

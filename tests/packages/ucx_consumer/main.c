/* SPDX-License-Identifier: MIT */
/* Consumer of the installed libcxlpool_ucx: a KV server on loopback over a shared pool, a
 * connection to it and the path it takes, then everything closed. Usage: main SHM_DEVICE */
#include <cxlpool/cxlpool.h>
#include <cxlpool/kvcache_remote.h>
#include <stdio.h>

static int fail(const char* what) {
  fprintf(stderr, "consumer_ucx: %s: %s\n", what, cxlpool_last_error_message());
  return 1;
}

int main(int argc, char** argv) {
  const char* device = argc > 1 ? argv[1] : "shm:cxlpool-ucx-consumer";
  cxlpool_shared_params_t* params = NULL;
  cxlpool_shared_pool_t* pool = NULL;
  cxlpool_kv_server_t* server = NULL;
  cxlpool_kv_remote_t* remote = NULL;
  char address[128], path[256];
  int rc = 1;
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK ||
      cxlpool_shared_params_set_size(params, 64ull << 20) != CXLPOOL_OK ||
      cxlpool_shared_pool_create(device, params, 0, &pool) != CXLPOOL_OK)
    return fail("shared pool");
  if (cxlpool_kv_server_start(&pool, 1, "127.0.0.1:0", 0, &server) != CXLPOOL_OK) {
    rc = fail("server");
  } else if (cxlpool_kv_server_address(server, address, sizeof address) != CXLPOOL_OK) {
    rc = fail("server address");
  } else if (cxlpool_kv_remote_connect(address, 10000, 0, &remote) != CXLPOOL_OK) {
    rc = fail("connect");
  } else if (cxlpool_kv_remote_path(remote, path, sizeof path) != CXLPOOL_OK) {
    rc = fail("path");
  } else {
    printf("consumer_ucx (cxlpool %s): server %s, connected: %s\n", cxlpool_version_string(), address, path);
    rc = 0;
  }
  if (remote && cxlpool_kv_remote_close(remote) != CXLPOOL_OK) rc = fail("close");
  if (server && cxlpool_kv_server_stop(server) != CXLPOOL_OK) rc = fail("stop");
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device);
  cxlpool_shared_params_destroy(params);
  return rc;
}

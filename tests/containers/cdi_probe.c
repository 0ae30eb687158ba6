/* SPDX-License-Identifier: MIT */
/* What a program in a container does with the pool its CDI spec gave it (podman_cdi_test.sh):
 * joins CXLPOOL_POOL on CXLPOOL_QUOTA with the spec's key and
 *   fill           allocates 1 MiB blocks until its quota refuses, prints "filled N MiB", frees
 *                  them and leaves the pool
 *   hold MIB       allocates MIB MiB, writes them, prints "holding", then sleeps until killed
 *   export         allocates a block, writes a pattern, exports it, prints "handle HEX", sleeps
 *   import HEX     imports the handle and checks the pattern, prints "read ok"
 *   open QUOTA     tries to join QUOTA instead (with the same key), prints the status
 *   compose        tries to change what a tenant may not: lock default, unlock b, grant
 *                  itself; prints "refused N of 3" (exit 0 only when all 3 were refused)
 * Exit 0 when it did what was asked, 1 (with the library's message) when not. */
#include <cxlpool/compose.h>
#include <cxlpool/cxlpool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char* what, cxlpool_status_t st) {
  printf("%s: %s: %s\n", what, cxlpool_status_str(st), cxlpool_last_error_message());
  fflush(stdout);
  return 1;
}

static void pattern(unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(i * 7 + 3);
}

int main(int argc, char** argv) {
  const char* pool_name = getenv("CXLPOOL_POOL");
  const char* quota = getenv("CXLPOOL_QUOTA");
  if (argc < 2 || !pool_name) {
    fprintf(stderr, "usage: cdi_probe fill|hold MIB|export|import HEX|open QUOTA (needs CXLPOOL_POOL)\n");
    return 2;
  }
  const char* cmd = argv[1];
  if (!strcmp(cmd, "open") && argc > 2) quota = argv[2];
  cxlpool_shared_params_t* params = NULL;
  cxlpool_shared_params_create(&params);
  if (quota) cxlpool_shared_params_set_quota(params, quota);
  cxlpool_shared_pool_t* pool = NULL;
  const cxlpool_status_t st = cxlpool_shared_pool_open(pool_name, params, &pool);
  cxlpool_shared_params_destroy(params);
  if (st != CXLPOOL_OK) return fail("open", st);
  cxlpool_shared_info_t info;
  cxlpool_shared_pool_info(pool, &info);
  printf("joined quota %s as pid %d\n", info.quota, (int)getpid());
  fflush(stdout);
  if (!strcmp(cmd, "open")) {
    cxlpool_shared_pool_close(pool);
    return 0;
  }
  if (!strcmp(cmd, "compose")) {
    char key[CXLPOOL_QUOTA_KEY_SIZE];
    int refused = 0;
    refused += cxlpool_compose_lock_quota(pool, "default", 1000, key) == CXLPOOL_E_PERMISSION;
    refused += cxlpool_compose_unlock_quota(pool, "b", 1000) == CXLPOOL_E_PERMISSION;
    refused += cxlpool_compose_grant(pool, info.quota, 1, 1000) == CXLPOOL_E_PERMISSION;
    printf("refused %d of 3: %s\n", refused, cxlpool_last_error_message());
    cxlpool_shared_pool_close(pool);
    return refused == 3 ? 0 : 1;
  }
  if (!strcmp(cmd, "fill")) {
    static void* blocks[4096];
    size_t mib = 0;
    while (mib < 4096 && cxlpool_shared_alloc(pool, 1u << 20, &blocks[mib]) == CXLPOOL_OK) {
      memset(blocks[mib], 0x5a, 1u << 20);
      ++mib;
    }
    printf("filled %zu MiB\n", mib);
    for (size_t i = 0; i < mib; ++i) cxlpool_shared_free(pool, blocks[i]);
    cxlpool_shared_pool_close(pool);
    return 0;
  }
  if (!strcmp(cmd, "hold") && argc > 2) {
    const long mib = atol(argv[2]);
    for (long i = 0; i < mib; ++i) {
      void* p;
      const cxlpool_status_t a = cxlpool_shared_alloc(pool, 1u << 20, &p);
      if (a != CXLPOOL_OK) return fail("alloc", a);
      memset(p, 0x5a, 1u << 20);
    }
    printf("holding %ld MiB\n", mib);
    fflush(stdout);
    for (;;) pause();
  }
  if (!strcmp(cmd, "export")) {
    void* p;
    cxlpool_status_t a = cxlpool_shared_alloc(pool, 4096, &p);
    if (a != CXLPOOL_OK) return fail("alloc", a);
    pattern(p, 4096);
    cxlpool_shared_handle_t h;
    a = cxlpool_shared_export(pool, p, &h);
    if (a != CXLPOOL_OK) return fail("export", a);
    printf("handle ");
    const unsigned char* b = (const unsigned char*)&h;
    for (size_t i = 0; i < sizeof h; ++i) printf("%02x", b[i]);
    printf("\n");
    fflush(stdout);
    for (;;) pause();
  }
  if (!strcmp(cmd, "import") && argc > 2 && strlen(argv[2]) == 2 * sizeof(cxlpool_shared_handle_t)) {
    cxlpool_shared_handle_t h;
    unsigned char* b = (unsigned char*)&h;
    for (size_t i = 0; i < sizeof h; ++i) {
      unsigned v;
      if (sscanf(argv[2] + 2 * i, "%2x", &v) != 1) return 2;
      b[i] = (unsigned char)v;
    }
    void* p;
    const cxlpool_status_t a = cxlpool_shared_import(pool, &h, &p, NULL);
    if (a != CXLPOOL_OK) return fail("import", a);
    unsigned char want[4096];
    pattern(want, sizeof want);
    const int same = memcmp(p, want, sizeof want) == 0;
    printf(same ? "read ok\n" : "read WRONG BYTES\n");
    cxlpool_shared_release(pool, p);
    cxlpool_shared_pool_close(pool);
    return same ? 0 : 1;
  }
  fprintf(stderr, "cdi_probe: unknown command %s\n", cmd);
  return 2;
}

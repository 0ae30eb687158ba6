/* SPDX-License-Identifier: MIT */
/* A device larger than its filesystem's room, through the C API (room_test.py runs it in a
 * small tmpfs of its own, DIR): a shared backing's commits stop with CXLPOOL_E_CAPACITY when
 * the filesystem is full, the ledger and the filesystem unchanged by the failed call, also for
 * a range partly committed before; room given back by a decommit can be committed again; a
 * private pool on the same file device (fork=cow) allocates up to its capacity; a shared pool
 * made while there was room is written whole after the filesystem filled; creating one on
 * the full filesystem is CXLPOOL_E_CAPACITY and leaves nothing in DIR; a sparse copy of a pool
 * is refused there (its holes would SIGBUS) and filled in once there is room. Prints "ok ..." or
 * "FAIL ..." per claim; exit status = number of failures. Usage: room_capi DIR */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"

static int failures;

static void check(int ok, const char* what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  fflush(stdout);
  failures += !ok;
}

static uint64_t fs_free(const char* dir) {
  struct statvfs sv;
  return statvfs(dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
}

static int entries(const char* dir) {
  DIR* d = opendir(dir);
  int n = 0;
  for (struct dirent* e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static int find(const cxlpool_topology_t* topo, const char* name, size_t* index) {
  return cxlpool_topology_find_target(topo, name, index) == CXLPOOL_OK;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: room_capi DIR\n");
    return 2;
  }
  const char* dir = argv[1];
  const size_t mib = (size_t)1 << 20;
  char spec[1024], path[1024];
  snprintf(spec, sizeof spec, "t:backing=file:%s/dev,size=64M;c:backing=file:%s/cow,size=64M,fork=cow", dir, dir);
  cxlpool_config_t* cfg = NULL;
  cxlpool_topology_t* topo = NULL;
  if (cxlpool_config_create(&cfg) || cxlpool_config_set_devices(cfg, spec) || cxlpool_topology_discover(cfg, &topo)) {
    printf("FAIL discovery: %s\n", cxlpool_last_error_message());
    return 1;
  }
  size_t nwarn = 0, warned = 0;
  cxlpool_topology_warning_count(topo, &nwarn);
  for (size_t i = 0; i < nwarn; ++i) {
    const char* w = NULL;
    if (cxlpool_topology_get_warning(topo, i, &w) == CXLPOOL_OK && strstr(w, "device 't'") &&
        strstr(w, "cannot all be had"))
      ++warned;
  }
  check(warned == 1, "discovery warns that device 't' (64 MiB) is larger than its filesystem's room");

  /* A raw backing: shared memory, kept in the device's file. */
  size_t ti = 0;
  cxlpool_backing_t* b = NULL;
  if (!find(topo, "t", &ti) || cxlpool_backing_open(topo, ti, &b) != CXLPOOL_OK) {
    printf("FAIL backing_open: %s\n", cxlpool_last_error_message());
    return 1;
  }
  unsigned char* base = NULL;
  if (cxlpool_backing_reserve(b, 64 * mib, 0, (void**)&base) != CXLPOOL_OK) {
    printf("FAIL reserve: %s\n", cxlpool_last_error_message());
    return 1;
  }
  size_t got = 0;
  cxlpool_status_t st = CXLPOOL_OK;
  for (; got < 64; ++got) {
    cxlpool_backing_usage_t before, after;
    cxlpool_backing_get_usage(b, &before);
    const uint64_t free_before = fs_free(dir);
    st = cxlpool_backing_commit(b, base + got * mib, mib, 0);
    if (st != CXLPOOL_OK) {
      cxlpool_backing_get_usage(b, &after);
      check(st == CXLPOOL_E_CAPACITY, "a commit past the filesystem's room is CXLPOOL_E_CAPACITY");
      check(strstr(cxlpool_last_error_message(), "full") != NULL, "its message says the filesystem is full");
      printf("     %s\n", cxlpool_last_error_message());
      check(
          after.committed_bytes == before.committed_bytes && after.peak_committed_bytes == before.peak_committed_bytes,
          "the failed commit left the ledger unchanged");
      check(fs_free(dir) == free_before, "the failed commit left nothing allocated in the filesystem");
      break;
    }
    memset(base + got * mib, (int)got + 1, mib);
  }
  printf("     %zu MiB committed of a 64 MiB device before the filesystem was full\n", got);
  check(got > 0 && got < 64, "commits succeeded up to the filesystem's room, no further");
  int intact = 1;
  for (size_t i = 0; i < got; ++i)
    for (size_t k = 0; k < mib; k += 4096) intact &= base[i * mib + k] == (unsigned char)(i + 1);
  check(intact, "every committed MiB holds what was written (no signal, nothing lost)");

  /* A range partly committed before: its new part needs room too. */
  if (got > 0) {
    cxlpool_backing_usage_t before, after;
    cxlpool_backing_get_usage(b, &before);
    st = cxlpool_backing_commit(b, base + (got - 1) * mib, 2 * mib, 0);
    cxlpool_backing_get_usage(b, &after);
    check(st == CXLPOOL_E_CAPACITY && after.committed_bytes == before.committed_bytes,
          "a commit of a committed MiB and a new one on the full filesystem is CAPACITY, ledger unchanged");
    int still = 1;
    for (size_t k = 0; k < mib; k += 4096) still &= base[(got - 1) * mib + k] == (unsigned char)got;
    check(still, "the committed part of that range keeps its bytes");
  }
  /* Room given back is room again. */
  if (got > 0) {
    st = cxlpool_backing_decommit(b, base, mib);
    cxlpool_status_t again = cxlpool_backing_commit(b, base + got * mib, mib, 0);
    if (again == CXLPOOL_OK) memset(base + got * mib, 7, mib);
    check(st == CXLPOOL_OK && again == CXLPOOL_OK, "after a decommit, the room it gave back can be committed again");
  }

  /* A private pool on a copy-on-write file device: its memory is anonymous, the full
   * filesystem does not limit it (nor does it ever SIGBUS). */
  cxlpool_pool_params_t* params = NULL;
  cxlpool_pool_t* pool = NULL;
  cxlpool_pool_params_create(&params);
  cxlpool_pool_params_set_devices(params, "c");
  cxlpool_pool_params_set_policy(params, "bind:c");
  if (cxlpool_pool_create(topo, params, &pool) != CXLPOOL_OK) {
    printf("FAIL pool_create: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_pool_params_destroy(params);
  size_t blocks = 0;
  static void* kept[1024];
  for (; blocks < 1024; ++blocks) {
    errno = 0;
    kept[blocks] = cxlpool_malloc(pool, 256 << 10);
    if (!kept[blocks]) break;
    memset(kept[blocks], 3, 256 << 10);
  }
  printf("     private pool on the copy-on-write device: %zu MiB, then NULL errno=%d\n", blocks / 4, errno);
  check(blocks > 4 * (got + 8) && errno == ENOMEM,
        "a private pool on a copy-on-write file device writes past the filesystem's room, then NULL + ENOMEM");
  for (size_t i = 0; i < blocks; ++i) cxlpool_free(kept[i]);
  cxlpool_pool_destroy(pool);

  /* Shared pools: one created with room is whole after the filesystem filled (its file was
   * allocated at creation); creating one on the full filesystem fails cleanly. */
  cxlpool_backing_release(b, base);
  cxlpool_backing_close(b);
  snprintf(path, sizeof path, "file:%s/pool-a", dir);
  cxlpool_shared_params_t* sp = NULL;
  cxlpool_shared_params_create(&sp);
  cxlpool_shared_params_set_size(sp, 8 * mib);
  cxlpool_shared_pool_t* sa = NULL;
  st = cxlpool_shared_pool_create(path, sp, 0, &sa);
  check(st == CXLPOOL_OK, "an 8 MiB shared pool is created while there is room");
  if (st != CXLPOOL_OK) printf("     %s\n", cxlpool_last_error_message());
  /* A sparse copy of a pool (what cp makes of its zero blocks), made while there is room. */
  char pool_c[1024], pool_s[1024];
  snprintf(pool_c, sizeof pool_c, "file:%s/pool-c", dir);
  snprintf(pool_s, sizeof pool_s, "%s/pool-s", dir);
  cxlpool_shared_params_t* small = NULL;
  cxlpool_shared_params_create(&small);
  cxlpool_shared_params_set_size(small, 4 * mib);
  cxlpool_shared_params_set_extent_size(small, 256 << 10);
  cxlpool_shared_pool_t* sc = NULL;
  int sparse_ok = cxlpool_shared_pool_create(pool_c, small, 0, &sc) == CXLPOOL_OK && cxlpool_shared_pool_close(sc) == 0;
  if (sparse_ok) {
    FILE* in = fopen(pool_c + 5, "rb");
    int out = open(pool_s, O_WRONLY | O_CREAT | O_EXCL, 0600);
    static unsigned char blk[4096];
    static const unsigned char zero[4096];
    off_t at = 0;
    for (size_t n; in && out >= 0 && (n = fread(blk, 1, sizeof blk, in)) > 0; at += (off_t)n)
      if (memcmp(blk, zero, n) != 0) sparse_ok &= pwrite(out, blk, n, at) == (ssize_t)n;
    sparse_ok &= in && out >= 0 && ftruncate(out, at) == 0;
    if (in) fclose(in);
    if (out >= 0) close(out);
    cxlpool_shared_pool_unlink(pool_c);
  }
  struct stat sst;
  check(sparse_ok && stat(pool_s, &sst) == 0 && (uint64_t)sst.st_blocks * 512 < (uint64_t)sst.st_size,
        "a sparse copy of a 4 MiB pool is made");
  /* Fill what is left of the filesystem with a backing of another device. */
  cxlpool_backing_t* filler = NULL;
  unsigned char* fb = NULL;
  size_t fi = 0;
  if (find(topo, "t", &fi) && cxlpool_backing_open(topo, fi, &filler) == CXLPOOL_OK &&
      cxlpool_backing_reserve(filler, 64 * mib, 0, (void**)&fb) == CXLPOOL_OK)
    for (size_t i = 0; i < 64 && cxlpool_backing_commit(filler, fb + i * mib, mib, 0) == CXLPOOL_OK; ++i) {
    }
  printf("     filesystem free after filling: %llu KiB\n", (unsigned long long)(fs_free(dir) >> 10));
  size_t written = 0;
  for (void* q; sa && cxlpool_shared_alloc(sa, 64 << 10, &q) == CXLPOOL_OK; written += 64 << 10) memset(q, 9, 64 << 10);
  check(sa && written >= 2 * mib, "the shared pool's blocks are written after the filesystem filled (no SIGBUS)");
  if (sa) cxlpool_shared_pool_close(sa);
  char pool_s_dev[1100];
  snprintf(pool_s_dev, sizeof pool_s_dev, "file:%s", pool_s);
  cxlpool_shared_pool_t* ss = NULL;
  st = cxlpool_shared_pool_open(pool_s_dev, NULL, &ss);
  printf("     %s\n", cxlpool_last_error_message());
  check(st == CXLPOOL_E_CAPACITY && strstr(cxlpool_last_error_message(), "holes"),
        "opening the sparse copy on the full filesystem is CXLPOOL_E_CAPACITY naming its holes (no SIGBUS later)");
  if (st == CXLPOOL_OK) cxlpool_shared_pool_close(ss);
  const int before = entries(dir);
  snprintf(path, sizeof path, "file:%s/pool-b", dir);
  cxlpool_shared_params_set_size(sp, 16 * mib);
  cxlpool_shared_pool_t* sb = NULL;
  st = cxlpool_shared_pool_create(path, sp, 0, &sb);
  printf("     %s\n", cxlpool_last_error_message());
  check(st == CXLPOOL_E_CAPACITY, "creating a shared pool on the full filesystem is CXLPOOL_E_CAPACITY");
  check(entries(dir) == before, "and leaves nothing in the directory");
  cxlpool_shared_params_destroy(sp);
  cxlpool_shared_params_destroy(small);
  if (filler) {
    cxlpool_backing_release(filler, fb);
    cxlpool_backing_close(filler);
  }
  /* With room again, the sparse copy opens and is whole afterwards. */
  ss = NULL;
  st = cxlpool_shared_pool_open(pool_s_dev, NULL, &ss);
  check(st == CXLPOOL_OK && stat(pool_s, &sst) == 0 && (uint64_t)sst.st_blocks * 512 >= (uint64_t)sst.st_size,
        "with room, the sparse copy opens and its holes are filled");
  if (st == CXLPOOL_OK) cxlpool_shared_pool_close(ss);
  cxlpool_shared_pool_unlink(pool_s_dev);
  cxlpool_topology_destroy(topo);
  cxlpool_config_destroy(cfg);
  return failures;
}

// SPDX-License-Identifier: MIT
// O_DIRECT reads into memory that moves: a 4 MiB block pinned back and forth between a numa
// device and a memfd device (cxlpool_pin, MOVES times) while 3 threads pread O_DIRECT 4-128
// KiB pieces of a 16 MiB file into it, each read first marked and then checked against the
// file. A read whose bytes are not where the program reads them landed in pages the move
// replaced (the device pinned the old ones). Prints moves done and refused, reads, wrong reads.
// Run as a user with kernel-mode write fences (root): otherwise no move copies.
// MODE spin: the 3 threads compute (no system call) while the O_DIRECT descriptor stays open;
// spin-nodirect: the same with it closed. They measure what the in-flight-read check costs a
// process whose threads stay on a CPU: moves made and refused, and the time per move.
//
// usage: odirect_move [MOVES [DIR [read|spin|spin-nodirect]]]   (DIR: a disk filesystem, default /tmp)
#define _GNU_SOURCE
#include <cxlpool/cxlpool.h>
#include <cxlpool/tiering.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kBlock = 4 << 20, kFile = 16 << 20, kThreads = 3 };
static unsigned char *g_block, *g_image;
static int g_fd;
static atomic_int g_stop;
static atomic_long g_reads, g_wrong, g_failed;

static void* reader(void* arg) {
  const long t = (long)arg;
  unsigned seed = 1234u + (unsigned)t;
  const size_t span = (kBlock / kThreads / 4096) * 4096;
  unsigned char* mine = g_block + t * span;
  while (!atomic_load(&g_stop)) {
    size_t n = 4096 * (1 + rand_r(&seed) % 32);
    if (n > span) n = span;
    const size_t off = 4096 * (rand_r(&seed) % ((kFile - n) / 4096));
    memset(mine, 0xEE, n);
    if (pread(g_fd, mine, n, (off_t)off) != (ssize_t)n) {
      atomic_fetch_add(&g_failed, 1);
      continue;
    }
    atomic_fetch_add(&g_reads, 1);
    if (memcmp(mine, g_image + off, n) != 0) atomic_fetch_add(&g_wrong, 1);
  }
  return NULL;
}

static void* spinner(void* arg) {
  volatile unsigned long x = (unsigned long)arg;
  while (!atomic_load_explicit(&g_stop, memory_order_relaxed))
    for (int i = 0; i < 1000; ++i) x = x * 6364136223846793005ul + 1442695040888963407ul;
  return NULL;
}

int main(int argc, char** argv) {
  const int moves = argc > 1 ? atoi(argv[1]) : 2000;
  const char* dir = argc > 2 ? argv[2] : "/tmp";
  const char* mode = argc > 3 ? argv[3] : "read";
  const int spin = strncmp(mode, "spin", 4) == 0;
  cxlpool_config_t* c = NULL;
  cxlpool_config_create(&c);
  cxlpool_config_set_devices(c, "fast:backing=numa:0,size=256M,tier=0;slow:backing=memfd,size=256M,tier=1");
  cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_topology_t* topo = NULL;
  if (cxlpool_topology_discover(c, &topo) != CXLPOOL_OK) {
    fprintf(stderr, "odirect_move: %s\n", cxlpool_last_error_message());
    return 2;
  }
  cxlpool_config_destroy(c);
  cxlpool_pool_params_t* p = NULL;
  cxlpool_pool_params_create(&p);
  cxlpool_pool_params_set_devices(p, "fast,slow");
  cxlpool_pool_params_set_policy(p, "bind:slow");
  cxlpool_pool_t* pool = NULL;
  if (cxlpool_pool_create(topo, p, &pool) != CXLPOOL_OK) {
    fprintf(stderr, "odirect_move: %s\n", cxlpool_last_error_message());
    return 2;
  }
  cxlpool_pool_params_destroy(p);
  g_block = cxlpool_aligned_alloc(pool, 4096, kBlock);
  g_image = malloc(kFile);
  if (!g_block || !g_image) return 2;
  memset(g_block, 1, kBlock);
  for (size_t i = 0; i < kFile; ++i) g_image[i] = (unsigned char)((i * 2654435761u) >> 13);
  char path[4096];
  snprintf(path, sizeof path, "%s/odirect_move.%d", dir, (int)getpid());
  const int w = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (w < 0 || pwrite(w, g_image, kFile, 0) != kFile || fsync(w) != 0) {
    perror("odirect_move: the file");
    return 2;
  }
  g_fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  unlink(path);
  close(w);
  if (g_fd < 0) {
    perror("odirect_move: O_DIRECT");
    return 2;
  }
  if (strcmp(mode, "spin-nodirect") == 0) close(g_fd);
  pthread_t threads[kThreads];
  for (long t = 0; t < kThreads; ++t) pthread_create(&threads[t], NULL, spin ? spinner : reader, (void*)t);
  int done = 0, refused = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int m = 0; m < moves; ++m) {
    // Each attempt asks for the tier the block is not on: a refused move leaves it where it
    // was, and the next attempt tries the same move again (it is never a no-op counted done).
    cxlpool_ptr_info_t where;
    if (cxlpool_ptr_info(g_block, &where) != CXLPOOL_OK) return 2;
    if (cxlpool_pin(g_block, kBlock, where.tier == 0 ? 1 : 0) == CXLPOOL_OK)
      ++done;
    else if (++refused == 1)
      fprintf(stderr, "odirect_move: first refusal: %s\n", cxlpool_last_error_message());
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  atomic_store(&g_stop, 1);
  for (int t = 0; t < kThreads; ++t) pthread_join(threads[t], NULL);
  const double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / moves;
  printf("odirect_move %s: %d moves done, %d refused, %.2f ms per attempt; %ld O_DIRECT reads, %ld wrong, %ld failed\n",
         mode, done, refused, ms, atomic_load(&g_reads), atomic_load(&g_wrong), atomic_load(&g_failed));
  cxlpool_free(g_block);
  cxlpool_pool_destroy(pool);
  cxlpool_topology_destroy(topo);
  return atomic_load(&g_wrong) ? 1 : 0;
}

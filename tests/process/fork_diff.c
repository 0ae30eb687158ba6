/* SPDX-License-Identifier: MIT */
/* fork() with a C API pool (policy bind:far) on the one device named on the command line and
 * declared by CXLPOOL_DEVICES: parent and child keep private copies of every block
 * (fork_common.h). --shared: a CXLPOOL_SHARING_SHARED pool, whose pre-fork blocks are shared and
 * from which the child can neither allocate nor free. Usage: fork_diff [--shared] DEVICE */
#include "cxlpool/cxlpool.h"
#include "fork_common.h"

static cxlpool_pool_t* pool;
static const char* device;

static void* pool_alloc(size_t size) { return cxlpool_malloc(pool, size); }
static void pool_release(void* p) { cxlpool_free(p); }
static void* pool_resize(void* p, size_t size) { return cxlpool_realloc(pool, p, size); }

/* Every block lives on our device of our pool. */
static int on_far(const void* p, size_t size, const char* who) {
  cxlpool_ptr_info_t info;
  cxlpool_status_t st = cxlpool_ptr_info(p, &info);
  if (st != CXLPOOL_OK) {
    fprintf(stderr, "%s: cxlpool_ptr_info of a %zu-byte block: %s\n", who, size, cxlpool_last_error_message());
    return 0;
  }
  if (info.pool != pool || strcmp(info.device_name, device) != 0) {
    fprintf(stderr, "%s: a %zu-byte block is on device '%s', not '%s'\n", who, size, info.device_name, device);
    return 0;
  }
  return 1;
}

static int create_pool(int shared) {
  cxlpool_topology_t* topo = NULL;
  cxlpool_pool_params_t* params = NULL;
  cxlpool_status_t st = cxlpool_topology_discover(NULL, &topo);
  if (st == CXLPOOL_OK) st = cxlpool_pool_params_create(&params);
  if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_devices(params, device);
  if (st == CXLPOOL_OK) st = cxlpool_pool_params_set_policy(params, "bind:far");
#if defined(CXLPOOL_HAVE_SHARING)
  if (st == CXLPOOL_OK && shared) st = cxlpool_pool_params_set_sharing(params, CXLPOOL_SHARING_SHARED);
#else
  (void)shared;
#endif
  if (st == CXLPOOL_OK) st = cxlpool_pool_create(topo, params, &pool);
  if (st != CXLPOOL_OK) fprintf(stderr, "fork_diff: cannot create the pool: %s\n", cxlpool_last_error_message());
  cxlpool_pool_params_destroy(params);
  cxlpool_topology_destroy(topo);
  return st == CXLPOOL_OK;
}

#if defined(CXLPOOL_HAVE_SHARING)
/* Shared pool: the child sees and changes the parent's pre-fork blocks, cannot allocate
 * (NULL + ENOMEM) and its frees of inherited blocks are no-ops. */
static int shared_fork(void) {
  enum { N = 64 };
  fork_block_t b[N];
  int problems = 0;
  for (int i = 0; i < N; ++i) {
    b[i].size = i % 8 == 7 ? (size_t)(2 + i % 3) << 20 : fk_small_sizes[i % 17];
    b[i].p = cxlpool_malloc(pool, b[i].size);
    b[i].id = (unsigned)i;
    if (!b[i].p || !on_far(b[i].p, b[i].size, "parent")) return fprintf(stderr, "parent: allocation failed\n"), 1;
    fk_fill(&b[i], TAG_PARENT, 1);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return perror("fork"), 2;
  if (pid == 0) {
    fk_who = "child";
    for (int i = 0; i < N; ++i) problems += !fk_verify(&b[i], b[i].size);
    for (int i = 0; i < N; ++i) fk_fill(&b[i], TAG_CHILD, 1);
    errno = 0;
    void* p = cxlpool_malloc(pool, 64);
    int e1 = errno;
    errno = 0;
    void* q = cxlpool_malloc(pool, 3 << 20);
    int e2 = errno;
    if (p || q || e1 != ENOMEM || e2 != ENOMEM) {
      fprintf(stderr, "child: cxlpool_malloc from the inherited shared pool gave %p (errno %d) and %p (errno %d)\n", p,
              e1, q, e2);
      ++problems;
    }
    size_t before = cxlpool_usable_size(b[0].p);
    cxlpool_free(b[0].p);
    cxlpool_free(b[7].p);
    if (cxlpool_usable_size(b[0].p) != before || !fk_verify(&b[0], b[0].size) || !fk_verify(&b[7], b[7].size)) {
      fprintf(stderr, "child: cxlpool_free of an inherited shared block was not a no-op\n");
      ++problems;
    }
    _exit(problems ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  int seen = 1;
  for (int i = 0; i < N; ++i) {
    b[i].tag = TAG_CHILD; /* what the child wrote into the shared blocks */
    if (!fk_verify(&b[i], b[i].size)) seen = 0;
  }
  printf("child: inherited blocks shared, allocation refused, frees ignored: %s\n", child_ok ? "ok" : "WRONG");
  printf("parent: the child's writes are visible: %s\n", seen ? "ok" : "WRONG");
  /* The parent's own pool still works and never hands out a block it still holds. */
  int fresh_ok = 1;
  for (int i = 0; i < 32; ++i) {
    unsigned char* p = cxlpool_malloc(pool, fk_small_sizes[i % 17]);
    if (!p) fresh_ok = 0;
    for (int j = 0; p && j < N; ++j)
      if (p < b[j].p + b[j].size && b[j].p < p + fk_small_sizes[i % 17]) fresh_ok = 0;
    cxlpool_free(p);
  }
  printf("parent: allocates after the fork without overlapping live blocks: %s\n", fresh_ok ? "ok" : "WRONG");
  for (int i = 0; i < N; ++i) cxlpool_free(b[i].p);
  int ok = child_ok && seen && fresh_ok;
  printf("shared fork: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
#endif

int main(int argc, char** argv) {
  int shared = argc > 2 && strcmp(argv[1], "--shared") == 0;
  if (argc != 2 + shared) {
    fprintf(stderr, "usage: fork_diff [--shared] DEVICE\n");
    return 2;
  }
  device = argv[1 + shared];
#if !defined(CXLPOOL_HAVE_SHARING)
  if (shared) {
    printf("skip: cxlpool_pool_params_set_sharing is not declared (no CXLPOOL_HAVE_SHARING)\n");
    return 0;
  }
#endif
  if (!create_pool(shared)) return 3;
#if defined(CXLPOOL_HAVE_SHARING)
  if (shared) return shared_fork();
#endif
  static const size_t huge[] = {2u << 20, (3u << 20) + 5, 5u << 20, 8u << 20, 0};
  fork_ops_t ops = {pool_alloc, pool_release, pool_resize, on_far, huge};
  return fork_differential(&ops, 300);
}

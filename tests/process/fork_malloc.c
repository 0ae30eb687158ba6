/* SPDX-License-Identifier: MIT */
/* fork() with plain malloc/free/realloc (sizes 16 B .. 16 MiB), for the interposer: parent and
 * child keep private copies of every block (fork_common.h). stdout is the same under glibc and
 * under cxlpool-run; the exit code is 0 when both processes saw only their own data. */
#include "fork_common.h"

static void* plain_alloc(size_t size) { return malloc(size); }
static void plain_release(void* p) { free(p); }
static void* plain_resize(void* p, size_t size) { return realloc(p, size); }

int main(void) {
  static const size_t huge[] = {2u << 20, (3u << 20) + 5, 5u << 20, 8u << 20, 12u << 20, 16u << 20, 0};
  fork_ops_t ops = {plain_alloc, plain_release, plain_resize, NULL, huge};
  return fork_differential(&ops, 300);
}

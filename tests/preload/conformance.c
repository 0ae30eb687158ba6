/* SPDX-License-Identifier: MIT */
/* Differential conformance: every malloc-family entry point across argument classes, printing
 * one normalized line per case (NULL or not, errno, alignment, usable >= n, untouched outputs).
 * Run once on glibc and once under the interposer; the outputs must match (preload_test.py). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cases = 0;
static void report(const char* what, void* p, size_t n, size_t align) {
  int e = errno;
  ++cases;
  if (!p) {
    printf("%-40s NULL errno=%s\n", what, e == ENOMEM ? "ENOMEM" : e == EINVAL ? "EINVAL" : e ? "other" : "0");
    return;
  }
  printf("%-40s ptr aligned=%d usable>=n=%d\n", what, align ? (uintptr_t)p % align == 0 : (uintptr_t)p % 16 == 0,
         malloc_usable_size(p) >= n);
}

int main(void) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t sizes[] = {0, 1, 15, 16, 17, 100, 1024, 4096, 65536, 1 << 20, 3 << 20};
  char name[64];
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; ++i) {
    size_t n = sizes[i];
    errno = 0;
    snprintf(name, sizeof name, "malloc(%zu)", n);
    void* p = malloc(n);
    report(name, p, n, 0);
    void* q = malloc(n);
    printf("%-40s distinct=%d\n", "malloc twice", p != q);
    ++cases;
    errno = 0;
    snprintf(name, sizeof name, "realloc(p, %zu*2+1)", n);
    p = realloc(p, n * 2 + 1);
    report(name, p, n * 2 + 1, 0);
    free(p);
    free(q);
    errno = 0;
    snprintf(name, sizeof name, "calloc(%zu, 3)", n);
    unsigned char* c = calloc(n, 3);
    report(name, c, n * 3, 0);
    int zero = 1;
    for (size_t k = 0; c && k < n * 3; ++k) zero &= c[k] == 0;
    printf("%-40s zeroed=%d\n", "calloc zeroed", zero);
    ++cases;
    free(c);
  }
  size_t aligns[] = {0, 1, 2, 3, 8, 16, 24, 32, 48, 64, 4096, 65536, 1 << 21};
  for (size_t i = 0; i < sizeof aligns / sizeof *aligns; ++i) {
    size_t a = aligns[i];
    size_t pow2 = 1;
    while (pow2 < a) pow2 <<= 1;
    errno = 0;
    snprintf(name, sizeof name, "memalign(%zu, 100)", a);
    void* p = memalign(a, 100);
    report(name, p, 100, a > 16 ? pow2 : 0);
    free(p);
    errno = 0;
    snprintf(name, sizeof name, "aligned_alloc(%zu, 100)", a);
    p = aligned_alloc(a, 100);
    report(name, p, 100, a > 16 ? pow2 : 0);
    free(p);
    void* out = (void*)0x1234;
    errno = 0;
    int r = posix_memalign(&out, a, 100);
    printf("%-40s ret=%s untouched=%d aligned=%d errno_kept=%d\n", "posix_memalign",
           r == 0        ? "0"
           : r == EINVAL ? "EINVAL"
                         : "other",
           out == (void*)0x1234, r == 0 && a ? (uintptr_t)out % a == 0 : 0, errno == 0);
    ++cases;
    if (r == 0) free(out);
  }
  errno = 0;
  report("memalign(SIZE_MAX/2+2, 10)", memalign(SIZE_MAX / 2 + 2, 10), 10, 0);
  void* v = valloc(100);
  report("valloc(100)", v, 100, page);
  free(v);
  v = pvalloc(0);
  printf("%-40s %s aligned=%d\n", "pvalloc(0)", v ? "ptr" : "NULL", v ? (uintptr_t)v % page == 0 : 0);
  ++cases;
  free(v);
  v = pvalloc(100);
  report("pvalloc(100)", v, page, page);
  free(v);
  size_t huge[] = {SIZE_MAX, SIZE_MAX - 15, SIZE_MAX / 2, (size_t)1 << 62};
  for (size_t i = 0; i < sizeof huge / sizeof *huge; ++i) {
    errno = 0;
    report("malloc(huge)", malloc(huge[i]), 0, 0);
    errno = 0;
    report("calloc(huge, 1)", calloc(huge[i], 1), 0, 0);
    errno = 0;
    report("memalign(64, huge)", memalign(64, huge[i]), 0, 0);
    void* out = (void*)0x1234;
    int r = posix_memalign(&out, 64, huge[i]);
    printf("%-40s ret=%s untouched=%d\n", "posix_memalign(64, huge)",
           r == ENOMEM ? "ENOMEM"
           : r         ? "other"
                       : "0",
           out == (void*)0x1234);
    ++cases;
    void* p = malloc(10);
    errno = 0;
    report("realloc(p, huge)", realloc(p, huge[i]), 0, 0);
    free(p);
  }
  errno = 0;
  report("calloc(SIZE_MAX, 2)", calloc(SIZE_MAX, 2), 0, 0);
  errno = 0;
  report("calloc(1<<33, 1<<33)", calloc((size_t)1 << 33, (size_t)1 << 33), 0, 0);
  void* p = malloc(10);
  errno = 0;
  report("reallocarray(p, SIZE_MAX, 2)", reallocarray(p, SIZE_MAX, 2), 0, 0);
  errno = 0;
  p = reallocarray(p, 10, 10);
  report("reallocarray(p, 10, 10)", p, 100, 0);
  errno = 0;
  report("realloc(p, 0)", realloc(p, 0), 0, 0);
  errno = 0;
  report("realloc(NULL, 50)", (p = realloc(NULL, 50)), 50, 0);
  free(p);
  errno = 77;
  free(NULL);
  printf("%-40s errno=%d\n", "free(NULL) keeps errno", errno);
  ++cases;
  p = malloc(1000);
  errno = 78;
  free(p);
  printf("%-40s errno=%d\n", "free keeps errno", errno);
  ++cases;
  printf("%-40s %zu\n", "malloc_usable_size(NULL)", malloc_usable_size(NULL));
  ++cases;
  printf("%-40s %d\n", "mallopt(M_ARENA_MAX, 2)", mallopt(M_ARENA_MAX, 2));
  ++cases;
  struct mallinfo2 mi = mallinfo2();
  (void)mi;
  printf("%-40s ok\n", "mallinfo2()");
  ++cases;
  malloc_trim(0);
  printf("%-40s ok\n", "malloc_trim(0)");
  ++cases;
  printf("cases: %d\n", cases);
  return 0;
}

/* SPDX-License-Identifier: MIT */
/* Invalid frees under the interposer, one case per process (`bad_free CASE`): an interior
 * pointer must not release its block (ignoring it or aborting like glibc are both allowed);
 * a double free, also from two threads, must never make malloc hand out one address twice. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LIVE = 20000, BATCH = 64 };

static int cmp_ptr(const void* a, const void* b) {
  uintptr_t x = (uintptr_t) * (void*const*)a, y = (uintptr_t) * (void*const*)b;
  return x < y ? -1 : x > y;
}

/* ---- interior pointers ---------------------------------------------------------------------- */
static int interior(size_t size, size_t offset) {
  unsigned char* p = malloc(size);
  if (!p) return 3;
  for (size_t i = 0; i < size; ++i) p[i] = (unsigned char)(i * 31 + 7);
  free(p + offset);
  /* Fill the heap with blocks of the same size: none may be p's block. */
  int count = size >= (1 << 20) ? 16 : size >= 65536 ? 400 : LIVE;
  unsigned char** q = malloc(sizeof *q * (size_t)count);
  int handed_out = 0;
  for (int i = 0; i < count; ++i) {
    q[i] = malloc(size);
    if (!q[i]) return 3;
    if (q[i] < p + size && p < q[i] + size) handed_out = 1;
    memset(q[i], 0xEE, size);
  }
  size_t changed = 0;
  for (size_t i = 0; i < size; ++i) changed += p[i] != (unsigned char)(i * 31 + 7);
  printf("free(p + %zu) of a %zu-byte block: block handed out again: %s, its bytes changed: %zu\n", offset, size,
         handed_out ? "YES" : "no", changed);
  for (int i = 0; i < count; ++i) free(q[i]);
  free(q);
  free(p);
  return handed_out || changed ? 1 : 0;
}

/* ---- double frees ----------------------------------------------------------------------------- */
static void* victims[BATCH];
static size_t victim_size = 64;

static void free_victims(void) {
  for (int i = 0; i < BATCH; ++i) free(victims[i]);
}
static void* free_victims_thread(void* arg) {
  (void)arg;
  free_victims();
  return NULL;
}
static void free_in_thread(void) {
  pthread_t t;
  pthread_create(&t, NULL, free_victims_thread, NULL);
  pthread_join(t, NULL);
}

typedef struct {
  void** out;
  int n;
  size_t size;
} alloc_job_t;
static void* alloc_many(void* arg) {
  alloc_job_t* job = arg;
  for (int i = 0; i < job->n; ++i) {
    job->out[i] = malloc(job->size);
    if (job->out[i]) memset(job->out[i], i & 0xff, job->size);
  }
  return NULL;
}

/* Many live blocks from the main thread and another thread at once: all distinct. */
static int all_distinct(const char* what) {
  int n = victim_size >= (1 << 20) ? 16 : LIVE;
  void** all = malloc(sizeof *all * (size_t)n * 2);
  alloc_job_t mine = {all, n, victim_size}, theirs = {all + n, n, victim_size};
  pthread_t t;
  pthread_create(&t, NULL, alloc_many, &theirs);
  alloc_many(&mine);
  pthread_join(t, NULL);
  qsort(all, (size_t)n * 2, sizeof *all, cmp_ptr);
  int dups = 0, nulls = 0;
  for (int i = 0; i < n * 2; ++i) {
    nulls += !all[i];
    if (i && all[i] && all[i] == all[i - 1]) ++dups;
  }
  printf("%s, %zu-byte blocks: %d live blocks from two threads, %d handed out twice, %d NULL\n", what, victim_size,
         n * 2, dups, nulls);
  for (int i = 0; i < n * 2; ++i)
    if (!i || all[i] != all[i - 1]) free(all[i]);
  free(all);
  return dups || nulls ? 1 : 0;
}

static int double_free(const char* how) {
  for (int i = 0; i < BATCH; ++i) {
    victims[i] = malloc(victim_size);
    memset(victims[i], 0x11, victim_size);
  }
  if (strcmp(how, "same-thread") == 0) {
    free_victims();
    free_victims();
  } else if (strcmp(how, "thread-then-thread") == 0) { /* thread A frees, joins; thread B frees */
    free_in_thread();
    free_in_thread();
  } else if (strcmp(how, "owner-then-thread") == 0) { /* the allocating thread, then another */
    free_victims();
    free_in_thread();
  } else if (strcmp(how, "thread-then-owner") == 0) { /* another thread, then the allocating one */
    free_in_thread();
    free_victims();
  } else {
    return 2;
  }
  char what[96];
  snprintf(what, sizeof what, "double free %s", how);
  return all_distinct(what);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) return 2;
  const char* c = argv[1];
  if (strcmp(c, "interior-64") == 0) return interior(64, 16);
  if (strcmp(c, "interior-100k") == 0) return interior(100000, 4096);
  if (strcmp(c, "interior-2m") == 0) return interior(2 << 20, 65536);
  if (argc >= 3) victim_size = strtoull(argv[2], NULL, 10);
  return double_free(c);
}

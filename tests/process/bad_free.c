/* SPDX-License-Identifier: MIT */
/* Invalid frees under the interposer, one case per process (`bad_free CASE`): an interior
 * pointer must not release its block (ignoring it or aborting like glibc are both allowed);
 * a double free, also from two threads, must never make malloc hand out one address twice. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
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

/* The owner and another thread free one block at the same moment, many times over (a race in
 * the program: each may check before the other's free lands); after each, a new block must not
 * be one of the blocks still live. */
enum { RACE_LIVE = 4096, RACE_SET = 1 << 14 };
static void* _Atomic race_target;
static long _Atomic race_go, race_done;
static int _Atomic race_stop;
static uintptr_t race_set[RACE_SET];
static unsigned race_slot(uintptr_t p) { return (unsigned)((p >> 4) * 2654435761u) & (RACE_SET - 1); }
static int race_has(void* p) {
  for (unsigned i = race_slot((uintptr_t)p); race_set[i]; i = (i + 1) & (RACE_SET - 1))
    if (race_set[i] == (uintptr_t)p) return 1;
  return 0;
}
static void race_add(void* p) {
  unsigned i = race_slot((uintptr_t)p);
  while (race_set[i]) i = (i + 1) & (RACE_SET - 1);
  race_set[i] = (uintptr_t)p;
}
static void race_del(void* p) {
  unsigned i = race_slot((uintptr_t)p);
  while (race_set[i] != (uintptr_t)p) i = (i + 1) & (RACE_SET - 1);
  race_set[i] = 0;
  for (unsigned j = (i + 1) & (RACE_SET - 1); race_set[j]; j = (j + 1) & (RACE_SET - 1)) {
    uintptr_t x = race_set[j];
    race_set[j] = 0;
    race_add((void*)x);
  }
}
static void* race_helper(void* arg) {
  (void)arg;
  long seen = 0;
  for (;;) {
    long g;
    while ((g = atomic_load(&race_go)) == seen)
      if (atomic_load(&race_stop)) return NULL;
    seen = g;
    free(atomic_load(&race_target));
    atomic_store(&race_done, g);
  }
}
static int racing(long rounds) {
  static void* live[RACE_LIVE];
  void* warm[64];
  for (int i = 0; i < 64; ++i) warm[i] = malloc(victim_size); /* past the central heaps' warm-up */
  for (int i = 0; i < 64; ++i) free(warm[i]);
  for (int i = 0; i < RACE_LIVE; ++i) {
    live[i] = malloc(victim_size);
    if (!live[i] || race_has(live[i])) return 3;
    race_add(live[i]);
  }
  pthread_t t;
  pthread_create(&t, NULL, race_helper, NULL);
  long twice = 0, nulls = 0;
  uint64_t s = 88172645463325252ull;
  for (long r = 1; r <= rounds; ++r) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    int k = (int)(s % RACE_LIVE);
    void* p = live[k];
    race_del(p);
    atomic_store(&race_target, p);
    atomic_store(&race_go, r);
    /* The helper sees the signal some 100 ns later: a varying delay here makes the two frees
     * overlap in some rounds, whatever the machine's speed. */
    for (volatile unsigned d = (unsigned)(s >> 56); d > 0; --d) {
    }
    free(p);
    while (atomic_load(&race_done) != r) {
    }
    void* q = malloc(victim_size);
    if (!q) {
      ++nulls;
      q = malloc(victim_size);
      if (!q) return 3;
    }
    if (race_has(q)) {
      ++twice; /* the live set no longer tells blocks apart: stop here */
      break;
    }
    race_add(q);
    live[k] = q;
  }
  atomic_store(&race_stop, 1);
  pthread_join(t, NULL);
  for (int i = 0; i < 20000 && !twice; ++i) /* blocks freed twice and still pending come out now */
    if (race_has(malloc(victim_size))) ++twice;
  printf("double free racing, %zu-byte blocks: %ld rounds, %ld handed out twice, %ld NULL\n", victim_size, rounds,
         twice, nulls);
  return twice || nulls ? 1 : 0;
}

static int double_free(const char* how) {
  if (strcmp(how, "racing") == 0) return racing(100000);
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

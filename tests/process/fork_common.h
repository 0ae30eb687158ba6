/* SPDX-License-Identifier: MIT */
/* The parent/child fork differential shared by fork_diff.c (C API pool) and fork_malloc.c
 * (plain malloc under the interposer): both processes must keep private copies of every
 * block, however the two interleave their writes, frees, reallocs and new allocations. */
#ifndef CXLPOOL_TESTS_PROCESS_FORK_COMMON_H
#define CXLPOOL_TESTS_PROCESS_FORK_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* How the program allocates; check (may be NULL) verifies a block's placement. */
typedef struct fork_ops {
  void* (*alloc)(size_t size);
  void (*release)(void* p);
  void* (*resize)(void* p, size_t size);
  int (*check)(const void* p, size_t size, const char* who);
  const size_t* huge_sizes; /* zero-terminated */
} fork_ops_t;

/* Every 8-byte word of a block says who wrote it: tag (P or C), generation, block id and the
 * word's index, so a mismatch tells whose data leaked in. */
enum { TAG_PARENT = 'P', TAG_CHILD = 'C', MAX_BLOCKS = 4096 };

typedef struct fork_block {
  unsigned char* p;
  size_t size;
  unsigned tag, gen, id;
} fork_block_t;

static fork_block_t fk_blocks[MAX_BLOCKS];
static int fk_count;
static int fk_problems;
static const char* fk_who = "parent";
static const fork_ops_t* fk_ops;

static const size_t fk_small_sizes[] = {16,   24,   48,    64,    100,   128,    256,    500,   1000,
                                        1024, 4096, 10000, 32768, 65536, 100000, 262144, 524288};

static uint64_t fk_word(unsigned tag, unsigned gen, unsigned id, size_t w) {
  return ((uint64_t)tag << 56) | ((uint64_t)(gen & 0xff) << 48) | ((uint64_t)(id & 0xffff) << 32) | (w & 0xffffffffu);
}

static void fk_fill(fork_block_t* b, unsigned tag, unsigned gen) {
  b->tag = tag;
  b->gen = gen;
  uint64_t* w = (uint64_t*)b->p;
  size_t words = b->size / 8;
  for (size_t i = 0; i < words; ++i) w[i] = fk_word(tag, gen, b->id, i);
  for (size_t i = words * 8; i < b->size; ++i) b->p[i] = (unsigned char)(tag ^ i);
}

__attribute__((format(printf, 1, 2))) static void fk_problem(const char* fmt, ...) {
  if (++fk_problems > 8) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", fk_who);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Checks the first `upto` bytes of a block hold exactly its expected words; names the first
 * wrong one and whose pattern it holds. */
static int fk_verify(const fork_block_t* b, size_t upto) {
  const uint64_t* w = (const uint64_t*)b->p;
  size_t words = upto / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t got = w[i];
    if (got == fk_word(b->tag, b->gen, b->id, i)) continue;
    int tag = (int)(got >> 56);
    fk_problem("block #%u (%zu bytes) word %zu: expected %c/gen %u/#%u, found %c/gen %u/#%u word %u (0x%016llx)", b->id,
               b->size, i, b->tag, b->gen, b->id, tag == 'P' || tag == 'C' ? tag : '?', (unsigned)(got >> 48) & 0xff,
               (unsigned)(got >> 32) & 0xffff, (unsigned)got, (unsigned long long)got);
    return 0;
  }
  for (size_t i = words * 8; i < upto; ++i)
    if (b->p[i] != (unsigned char)(b->tag ^ i)) {
      fk_problem("block #%u (%zu bytes) tail byte %zu is 0x%02x", b->id, b->size, i, b->p[i]);
      return 0;
    }
  return 1;
}

static int fk_verify_all(const char* when) {
  int bad = 0;
  for (int i = 0; i < fk_count; ++i)
    if (fk_blocks[i].p && !fk_verify(&fk_blocks[i], fk_blocks[i].size)) ++bad;
  if (bad) fprintf(stderr, "%s: %d of %d blocks wrong %s\n", fk_who, bad, fk_count, when);
  return bad == 0;
}

/* No two live blocks of this process overlap. */
static int fk_no_overlap(void) {
  for (int i = 0; i < fk_count; ++i)
    for (int j = i + 1; j < fk_count; ++j) {
      const fork_block_t *a = &fk_blocks[i], *b = &fk_blocks[j];
      if (a->p && b->p && a->p < b->p + b->size && b->p < a->p + a->size) {
        fk_problem("live blocks #%u and #%u overlap", a->id, b->id);
        return 0;
      }
    }
  return 1;
}

static fork_block_t* fk_add(size_t size, unsigned tag, unsigned gen, unsigned id) {
  if (fk_count >= MAX_BLOCKS) return NULL;
  unsigned char* p = fk_ops->alloc(size);
  if (!p) {
    fk_problem("allocation of %zu bytes failed: %s", size, strerror(errno));
    return NULL;
  }
  if (fk_ops->check && !fk_ops->check(p, size, fk_who)) ++fk_problems;
  fork_block_t* b = &fk_blocks[fk_count++];
  b->p = p;
  b->size = size;
  b->id = id;
  fk_fill(b, tag, gen);
  return b;
}

/* A mix of small blocks (16 B .. 512 KiB) and the huge sizes, ids from first_id on. */
static void fk_add_mix(int small, int huge_rounds, unsigned tag, unsigned gen, unsigned first_id) {
  unsigned id = first_id;
  for (int i = 0; i < small; ++i)
    fk_add(fk_small_sizes[(i * 7 + first_id) % (sizeof fk_small_sizes / sizeof *fk_small_sizes)], tag, gen, id++);
  for (int r = 0; r < huge_rounds; ++r)
    for (const size_t* h = fk_ops->huge_sizes; *h; ++h) fk_add(*h, tag, gen, id++);
}

/* Frees blocks with index % mod == rem (from index `from`). */
static int fk_free_some(int from, int mod, int rem) {
  int n = 0;
  for (int i = from; i < fk_count; ++i)
    if (fk_blocks[i].p && i % mod == rem) {
      fk_ops->release(fk_blocks[i].p);
      fk_blocks[i].p = NULL;
      ++n;
    }
  return n;
}

/* Reallocs blocks with index % mod == rem: the kept prefix must survive, then refill. */
static void fk_resize_some(int mod, int rem, unsigned tag, unsigned gen) {
  if (!fk_ops->resize) return;
  for (int i = 0; i < fk_count; ++i) {
    fork_block_t* b = &fk_blocks[i];
    if (!b->p || i % mod != rem) continue;
    size_t size = (i & 1) ? b->size + b->size / 2 + 40 : b->size / 2 + 8;
    unsigned char* q = fk_ops->resize(b->p, size);
    if (!q) {
      fk_problem("realloc of block #%u to %zu bytes failed: %s", b->id, size, strerror(errno));
      continue;
    }
    size_t kept = size < b->size ? size : b->size;
    b->p = q;
    if (!fk_verify(b, kept & ~(size_t)7)) fk_problem("realloc of block #%u lost its contents", b->id);
    b->size = size;
    if (fk_ops->check && !fk_ops->check(q, size, fk_who)) ++fk_problems;
    fk_fill(b, tag, gen);
  }
}

static void fk_fill_all(unsigned tag, unsigned gen) {
  for (int i = 0; i < fk_count; ++i)
    if (fk_blocks[i].p) fk_fill(&fk_blocks[i], tag, gen);
}

static void fk_send(int fd, char c) {
  fflush(stdout);
  fflush(stderr);
  if (write(fd, &c, 1) != 1) perror("write(pipe)");
}

/* 1 when the other process sent c, 0 when it went away. */
static int fk_wait(int fd, char c) {
  char got = 0;
  ssize_t n;
  do n = read(fd, &got, 1);
  while (n < 0 && errno == EINTR);
  if (n == 1 && got == c) return 1;
  fprintf(stderr, "%s: the other process went away before step '%c'\n", fk_who, c);
  ++fk_problems;
  return 0;
}

static void fk_report(const char* step, int ok) {
  printf("%s: %s: %s\n", fk_who, step, ok ? "ok" : "WRONG");
  if (!ok) ++fk_problems;
}

/* A process's own round after the fork: frees, reallocs, rewrites everything, allocates more. */
static void fk_own_round(int free_rem, int resize_rem, unsigned tag, unsigned gen, int small, unsigned first_id) {
  fk_free_some(0, 3, free_rem);
  fk_resize_some(5, resize_rem, tag, gen);
  fk_fill_all(tag, gen);
  fk_add_mix(small, 1, tag, gen, first_id);
  fk_report("own frees, reallocs and new blocks are consistent", fk_verify_all("after its own writes"));
  fk_report("own live blocks do not overlap", fk_no_overlap());
}

/* Frees some blocks allocated after the fork and allocates again: the space is reused by this
 * process only. */
static void fk_reuse_round(int first, int rem, unsigned tag, unsigned gen, int small, unsigned first_id) {
  fk_free_some(first, 2, rem);
  fk_add_mix(small, 1, tag, gen, first_id);
  fk_fill_all(tag, gen);
  fk_report("blocks it freed are reused by itself only", fk_verify_all("after reuse") && fk_no_overlap());
}

/* The whole differential. Returns the process exit code (0: both processes correct). */
static int fork_differential(const fork_ops_t* ops, int small) {
  fk_ops = ops;
  setvbuf(stdout, NULL, _IOLBF, 0);
  fk_add_mix(small, 1, TAG_PARENT, 1, 0);
  printf("parent: %d blocks allocated before fork%s\n", fk_count, fk_problems ? " (with problems)" : "");
  int old = fk_count;
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return perror("pipe"), 2;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return perror("fork"), 2;
  if (pid == 0) {
    fk_who = "child";
    alarm(120);
    close(to_child[1]);
    close(to_parent[0]);
    fk_report("inherited blocks hold the parent's data", fk_verify_all("right after fork"));
    fk_own_round(0, 1, TAG_CHILD, 1, small / 2, 20000);
    fk_send(to_parent[1], 'a');
    if (fk_wait(to_child[0], 'b')) {
      fk_report("parent's writes, frees and allocations are invisible", fk_verify_all("after the parent's writes"));
      fk_reuse_round(old, 0, TAG_CHILD, 2, small / 4, 30000);
      fk_send(to_parent[1], 'c');
    }
    if (fk_wait(to_child[0], 'd'))
      fk_report("parent's last writes are invisible", fk_verify_all("after the parent's last writes"));
    fk_free_some(0, 1, 0);
    _exit(fk_problems ? 1 : 0);
  }
  alarm(120);
  close(to_child[0]);
  close(to_parent[1]);
  if (fk_wait(to_parent[0], 'a')) {
    fk_report("child's writes, frees and reallocs are invisible", fk_verify_all("after the child's writes"));
    fk_own_round(1, 2, TAG_PARENT, 2, small / 2, 10000);
    fk_send(to_child[1], 'b');
  }
  if (fk_wait(to_parent[0], 'c')) {
    fk_report("child's second round is invisible", fk_verify_all("after the child's second round"));
    fk_reuse_round(old, 1, TAG_PARENT, 3, small / 4, 40000);
    fk_send(to_child[1], 'd');
  }
  close(to_child[1]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok) {
    if (WIFSIGNALED(status))
      fprintf(stderr, "parent: the child died of signal %d\n", WTERMSIG(status));
    else
      fprintf(stderr, "parent: the child exited with %d\n", WEXITSTATUS(status));
  }
  fk_report("blocks intact after the child exited", fk_verify_all("after the child exited"));
  fk_free_some(0, 1, 0);
  int ok = child_ok && !fk_problems;
  printf("fork differential: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

#endif

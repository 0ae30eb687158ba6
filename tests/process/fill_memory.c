/* SPDX-License-Identifier: MIT */
/* Fills memory until malloc returns NULL, for each block size given, writing every byte it
 * gets, then frees it all; never more than CAP MiB per size (a misconfigured run must not eat
 * the machine). With --pause MIB: after MIB MiB of the first size, prints "paused" and waits
 * for a line on stdin (the test fills the filesystem meanwhile), then goes on and checks that
 * every block written before still holds its pattern. One line per size:
 *   "block SIZE: N MiB, then NULL errno=ENOMEM" | "... then the cap"; exit 0 unless a check failed.
 * Usage: fill_memory CAP_MIB [--pause MIB] SIZE... */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int intact(const unsigned char* p, size_t len, unsigned char v) {
  for (size_t i = 0; i < len; i += 512)
    if (p[i] != v) return 0;
  return p[len - 1] == v;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: fill_memory CAP_MIB [--pause MIB] SIZE...\n");
    return 2;
  }
  const size_t cap = strtoull(argv[1], NULL, 10) << 20;
  size_t pause_at = 0;
  int first = 2, bad = 0;
  if (strcmp(argv[2], "--pause") == 0 && argc > 4) {
    pause_at = strtoull(argv[3], NULL, 10) << 20;
    first = 4;
  }
  for (int a = first; a < argc; ++a) {
    const size_t bs = strtoull(argv[a], NULL, 0);
    const size_t max = cap / bs + 1;
    unsigned char** v = calloc(max, sizeof *v);
    if (!v || bs == 0) return 2;
    size_t n = 0;
    int e = 0, paused = 0;
    while ((n + 1) * bs <= cap) {
      errno = 0;
      unsigned char* p = malloc(bs);
      if (!p) {
        e = errno;
        break;
      }
      memset(p, (int)(n % 251) + 1, bs);
      v[n++] = p;
      if (pause_at && !paused && n * bs >= pause_at) {
        paused = 1;
        printf("paused at %zu MiB\n", (n * bs) >> 20);
        fflush(stdout);
        char line[64];
        if (!fgets(line, sizeof line, stdin)) return 2;
        for (size_t i = 0; i < n; ++i) memset(v[i], (int)(i % 251) + 1, bs);  // rewrite what was had
      }
    }
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += !intact(v[i], bs, (unsigned char)(i % 251 + 1));
    bad |= wrong != 0;
    if ((n + 1) * bs > cap)
      printf("block %zu: %zu MiB, then the cap; %zu blocks changed\n", bs, (n * bs) >> 20, wrong);
    else
      printf("block %zu: %zu MiB, then NULL errno=%s; %zu blocks changed\n", bs, (n * bs) >> 20,
             e == ENOMEM ? "ENOMEM" : strerror(e), wrong);
    fflush(stdout);
    for (size_t i = 0; i < n; ++i) free(v[i]);
    free(v);
  }
  return bad;
}

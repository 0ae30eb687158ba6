/* SPDX-License-Identifier: MIT */
/* Bootstrap reproducers: free(NULL) and allocations from a constructor that runs before main
 * (priority 101), then a large allocation whose placement is reported from /proc/self/maps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void* early;
__attribute__((constructor(101))) static void early_ctor(void) {
  free(NULL);
  early = malloc(100);
  char* s = strdup("allocated before main");
  free(s);
}

int main(int argc, char** argv) {
  size_t big = argc > 1 ? strtoull(argv[1], NULL, 10) : (8u << 20);
  char* p = malloc(big);
  memset(p, 1, big);
  /* The mapping that holds p: a file by name, else [anonymous] (also a far device's private memory). */
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512], where[256] = "?";
  while (f && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi) {
      char* name = strchr(line, '/');
      snprintf(where, sizeof where, "%s", name ? name : "[anonymous]\n");
      where[strcspn(where, "\n")] = 0;
    }
  }
  if (f) fclose(f);
  printf("early=%d big block mapping: %s\n", early != NULL, where);
  free(p);
  free(early);
  return 0;
}

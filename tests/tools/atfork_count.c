/* SPDX-License-Identifier: MIT */
/* Preloaded by lifecycle_test.py: records every fork handler registration of the process.
 * glibc's pthread_atfork is a stub linked into each library (libc_nonshared.a) that calls
 * __register_atfork with the library's __dso_handle, so defining __register_atfork here sees
 * each registration and which library made it. One line per registration, "atfork PATH", is
 * appended to the file named by CXLPOOL_TEST_ATFORK_LOG; the call then goes on to glibc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*register_fn)(void (*)(void), void (*)(void), void (*)(void), void*);

int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void* dso) {
  register_fn real = (register_fn)dlvsym(RTLD_NEXT, "__register_atfork", "GLIBC_2.3.2");
  const char* log = getenv("CXLPOOL_TEST_ATFORK_LOG");
  if (log) {
    Dl_info info;
    const char* who = dladdr(dso, &info) && info.dli_fname ? info.dli_fname : "?";
    char line[4200];
    int n = snprintf(line, sizeof line, "atfork %s\n", who);
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0 && n > 0) {
      ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
      (void)w;
    }
    if (fd >= 0) close(fd);
  }
  return real ? real(prepare, parent, child, dso) : -1;
}

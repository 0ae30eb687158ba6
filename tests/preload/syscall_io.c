// SPDX-License-Identifier: MIT
// System calls that write into malloc'd memory while the tiering engine moves it: read(2) from
// a pipe, pread(2) from a file, recv(2) from a socket and pread(2) with O_DIRECT, one thread
// per kind in a tight loop. Each thread fills fresh 1 MiB buffers front to back, as a program
// reading a stream into a growing buffer does (the bytes were set to a marker when the buffer
// was made, not just before the call, so that nothing but the call touches them), and checks
// every call's bytes against what was sent. The buffers keep coming (a policy that spills
// puts them on the slow device once the fast one is full) and the calls write them: the engine
// moves them while the calls run. Prints one summary line; exits 0 when every call succeeded
// and every byte arrived, 1 otherwise, 2 on setup errors.
//
// usage: syscall_io DIR CALLS [direct=0|1]   (DIR: where the pread/O_DIRECT file goes)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
  kBufferBytes = 1 << 20,      // each thread's buffers, filled front to back
  kFileBytes = 8 << 20,        // the file read by pread
  kMaxFileChunk = 192 << 10,   // pread, O_DIRECT
  kMaxStreamChunk = 60 << 10,  // pipe and socket (within their default buffers)
  kMarker = 0xEE
};

static unsigned char* g_image;    // the file's bytes
static unsigned char* g_pattern;  // stream messages: g_pattern + a random offset
static int g_file, g_direct = -1, g_pipe[2], g_sock[2];
static long g_per_kind;

static uint64_t next_rand(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

// One kind of call in a tight loop: 0 read(2) from a pipe, 1 pread(2), 2 recv(2), 3 pread(2)
// with O_DIRECT. Pipe and socket: this thread writes the message, then reads it back.
struct Worker {
  int kind, setup_failed;
  long done, efault, failed, wrong;
};

static void* work(void* arg) {
  struct Worker* w = arg;
  const int kind = w->kind;
  const int stream = kind == 0 || kind == 2;
  uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 8) ^ (uint64_t)kind;
  unsigned char* buf = NULL;
  size_t used = kBufferBytes;
  for (long it = 0; it < g_per_kind; ++it) {
    const size_t max = stream ? kMaxStreamChunk : kMaxFileChunk;
    if (used + 4096 + max > kBufferBytes) {
      // A fresh buffer (4 KiB-aligned for O_DIRECT, from the malloc family: what the
      // interposer places and moves), kept: the process grows, and new memory spills.
      if (posix_memalign((void**)&buf, 4096, kBufferBytes) != 0) {
        fprintf(stderr, "syscall_io: posix_memalign failed\n");
        w->setup_failed = 1;
        return NULL;
      }
      memset(buf, kMarker, kBufferBytes);
      used = 0;
    }
    used += kind == 3 ? 0 : (size_t)(next_rand(&seed) % 4000);  // O_DIRECT needs alignment
    const size_t n = 4096 * (1 + next_rand(&seed) % (max / 4096)) - (kind == 3 ? 0 : 64);
    unsigned char* dst = buf + used;
    used = (used + n + 4095) & ~(size_t)4095;
    const unsigned char* want = NULL;
    ssize_t r = -1;
    if (stream) {
      want = g_pattern + next_rand(&seed) % kMaxStreamChunk;
      const int out = kind == 0 ? g_pipe[1] : g_sock[0], in = kind == 0 ? g_pipe[0] : g_sock[1];
      if (write(out, want, n) != (ssize_t)n) {
        perror("syscall_io: write to the stream");
        w->setup_failed = 1;
        return NULL;
      }
      size_t got = 0;
      while (got < n) {
        r = kind == 0 ? read(in, dst + got, n - got) : recv(in, dst + got, n - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
      }
      if (r > 0) r = (ssize_t)got;
      if (r <= 0) {
        // Drain what the stream still holds, so that the next message starts clean.
        const int e = errno;
        unsigned char sink[4096];
        for (size_t left = n - got; left > 0;) {
          ssize_t k = kind == 0 ? read(in, sink, left < sizeof sink ? left : sizeof sink)
                                : recv(in, sink, left < sizeof sink ? left : sizeof sink, 0);
          if (k <= 0) break;
          left -= (size_t)k;
        }
        errno = e;
      }
    } else {
      const uint64_t off = 4096 * (next_rand(&seed) % ((kFileBytes - kMaxFileChunk) / 4096));
      want = g_image + off;
      r = pread(kind == 1 ? g_file : g_direct, dst, n, (off_t)off);
    }
    if (r < 0 && errno == EFAULT) {
      ++w->efault;
      continue;
    }
    if (r != (ssize_t)n) {
      ++w->failed;
      if (w->failed <= 5) fprintf(stderr, "syscall_io: call %d returned %zd (%s)\n", kind, r, strerror(errno));
      continue;
    }
    ++w->done;
    if (memcmp(dst, want, n) != 0) {
      ++w->wrong;
      if (w->wrong <= 5)
        fprintf(stderr, "syscall_io: call %d: bytes did not arrive where the program reads them\n", kind);
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: syscall_io DIR CALLS [direct=0|1]\n");
    return 2;
  }
  const long calls = atol(argv[2]);
  const int use_direct = argc > 3 ? atoi(argv[3]) : 1;
  g_image = malloc(kFileBytes);
  g_pattern = malloc(2 * kMaxStreamChunk);
  if (!g_image || !g_pattern) return 2;
  uint64_t s = 12345;
  for (size_t i = 0; i < kFileBytes; ++i) g_image[i] = (unsigned char)(next_rand(&s) >> 24);
  for (size_t i = 0; i < 2 * kMaxStreamChunk; ++i) g_pattern[i] = (unsigned char)(next_rand(&s) >> 24);
  char path[4096];
  snprintf(path, sizeof path, "%s/syscall_io.%d", argv[1], (int)getpid());
  g_file = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (g_file < 0) {
    perror("syscall_io: create the file");
    return 2;
  }
  unlink(path);  // the descriptors keep it
  if (pwrite(g_file, g_image, kFileBytes, 0) != kFileBytes || fsync(g_file) != 0) {
    perror("syscall_io: write the file");
    return 2;
  }
  if (use_direct) {
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", g_file);
    g_direct = open(self, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (g_direct < 0) fprintf(stderr, "syscall_io: no O_DIRECT here (%s): those calls are left out\n", strerror(errno));
  }
  if (pipe(g_pipe) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, g_sock) != 0) {
    perror("syscall_io: pipe/socketpair");
    return 2;
  }
  const int kinds = g_direct >= 0 ? 4 : 3;
  g_per_kind = calls / kinds;
  struct Worker workers[4];
  pthread_t threads[4];
  for (int k = 0; k < kinds; ++k) {
    memset(&workers[k], 0, sizeof workers[k]);
    workers[k].kind = k;
    pthread_create(&threads[k], NULL, work, &workers[k]);
  }
  long efault = 0, failed = 0, wrong = 0, setup = 0;
  for (int k = 0; k < kinds; ++k) {
    pthread_join(threads[k], NULL);
    setup |= workers[k].setup_failed;
    efault += workers[k].efault;
    failed += workers[k].failed;
    wrong += workers[k].wrong;
  }
  printf("syscall_io: %ld calls (read %ld, pread %ld, recv %ld, O_DIRECT %ld), %ld EFAULT, %ld failed, %ld wrong\n",
         g_per_kind * kinds, workers[0].done, workers[1].done, workers[2].done, kinds > 3 ? workers[3].done : 0, efault,
         failed, wrong);
  if (setup) return 2;
  return efault == 0 && failed == 0 && wrong == 0 ? 0 : 1;
}

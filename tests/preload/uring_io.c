// SPDX-License-Identifier: MIT
// io_uring registered buffers in malloc'd memory while the tiering engine runs: the kernel
// pins registered pages and writes them directly (IORING_OP_READ_FIXED), so a buffer whose
// range were moved to new pages would get its bytes in pages the program no longer sees. Fills
// the fast tier with a cold block first, so that the buffers land on the slow device and turn
// hot (each is written before each read): the engine wants to move them. Every read is checked
// where the program reads it; the buffers are unregistered and registered again every few
// reads (registration racing the moves). Prints one summary line; exits 0 when every read
// landed, 1 otherwise, 2 on setup errors, 3 when io_uring is not available (a skip).
//
// usage: uring_io DIR READS [FILLER_MIB]
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
  kBuffers = 24,
  kBufferBytes = 1 << 20,
  kFileBytes = 8 << 20,
  kMaxRead = 256 << 10,
  kRegisterEvery = 64,  // reads between two registrations
  kMarker = 0xEE
};

static uint64_t next_rand(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: uring_io DIR READS [FILLER_MIB]\n");
    return 2;
  }
  const long reads = atol(argv[2]);
  const size_t filler_mib = argc > 3 ? (size_t)atol(argv[3]) : 60;
  // The cold block that fills the fast tier (written once, then never again).
  unsigned char* filler = malloc(filler_mib << 20);
  if (!filler) return 2;
  memset(filler, 1, filler_mib << 20);
  unsigned char* image = malloc(kFileBytes);
  if (!image) return 2;
  uint64_t s = 777;
  for (size_t i = 0; i < kFileBytes; ++i) image[i] = (unsigned char)(next_rand(&s) >> 24);
  char path[4096];
  snprintf(path, sizeof path, "%s/uring_io.%d", argv[1], (int)getpid());
  const int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    perror("uring_io: create the file");
    return 2;
  }
  unlink(path);
  if (pwrite(fd, image, kFileBytes, 0) != kFileBytes) {
    perror("uring_io: write the file");
    return 2;
  }
  struct io_uring ring;
  int e = io_uring_queue_init(8, &ring, 0);
  if (e < 0) {
    printf("uring_io: io_uring_queue_init: %s\n", strerror(-e));
    return 3;
  }
  struct iovec iov[kBuffers];
  for (int b = 0; b < kBuffers; ++b) {
    if (posix_memalign(&iov[b].iov_base, 4096, kBufferBytes) != 0) return 2;
    iov[b].iov_len = kBufferBytes;
    memset(iov[b].iov_base, b, kBufferBytes);
  }
  long done = 0, wrong = 0, failed = 0, registrations = 0;
  int registered = 0;
  for (long r = 0; r < reads; ++r) {
    if (r % kRegisterEvery == 0) {
      if (registered) io_uring_unregister_buffers(&ring);
      e = io_uring_register_buffers(&ring, iov, kBuffers);
      if (e < 0) {
        printf("uring_io: io_uring_register_buffers: %s\n", strerror(-e));
        return e == -ENOMEM || e == -EPERM ? 3 : 2;  // RLIMIT_MEMLOCK, or io_uring disabled
      }
      registered = 1;
      ++registrations;
    }
    const int b = (int)(next_rand(&s) % kBuffers);
    unsigned char* dst = (unsigned char*)iov[b].iov_base + 4096 * (next_rand(&s) % 16);
    const unsigned n = (unsigned)(4096 * (1 + next_rand(&s) % (kMaxRead / 4096)));
    const uint64_t off = 4096 * (next_rand(&s) % ((kFileBytes - kMaxRead) / 4096));
    memset(dst, kMarker, n);  // the program's own write: the buffer is hot
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read_fixed(sqe, fd, dst, n, off, b);
    if (io_uring_submit(&ring) != 1) return 2;
    struct io_uring_cqe* cqe = NULL;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) return 2;
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    if (res != (int)n) {
      ++failed;
      if (failed <= 5) fprintf(stderr, "uring_io: READ_FIXED returned %d\n", res);
      continue;
    }
    ++done;
    if (memcmp(dst, image + off, n) != 0) {
      ++wrong;
      if (wrong <= 5)
        fprintf(stderr, "uring_io: read %ld into buffer %d: the bytes are not where the program reads\n", r, b);
    }
  }
  io_uring_queue_exit(&ring);
  printf("uring_io: %ld READ_FIXED (%ld registrations of %d buffers), %ld wrong, %ld failed\n", done, registrations,
         kBuffers, wrong, failed);
  return wrong == 0 && failed == 0 ? 0 : 1;
}

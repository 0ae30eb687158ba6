/* SPDX-License-Identifier: MIT */
/* What the KV cache test peers (kv_peer.c, kv_remote_peer.c) share: handles as hex text on
 * their line protocols, and the FNV-1a checksum of blocks' bytes. */
#ifndef CXLPOOL_TESTS_KV_HEX_H
#define CXLPOOL_TESTS_KV_HEX_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline int from_hex(const char* hex, void* out, size_t n) {
  unsigned char* b = (unsigned char*)out;
  if (strlen(hex) < 2 * n) return -1;
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    b[i] = (unsigned char)v;
  }
  return 0;
}

static inline void to_hex(const void* p, size_t n, char* out) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) sprintf(out + 2 * i, "%02x", b[i]);
}

static inline uint64_t fnv(const void* p, size_t n, uint64_t h) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

#endif

// SPDX-License-Identifier: MIT
// cxlpool's internal heap (see internal_heap.hpp). Blocks carry a 16-byte header with
// their class; memory comes from chunks of lazily touched address space made with a raw mmap
// system call: without an RLIMIT_AS 32 MiB, doubling up to 1 GiB; under one, chunks that start
// at 1/1024 of what the limit leaves (at least 256 KiB) and double as needed, so the heap holds
// little address space the program could use. Never returned (the heap only holds cxlpool's own metadata).
#include "os/internal_heap.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "os/prim.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace cxlpool::os {
namespace {

// Chunks without an RLIMIT_AS: address space touched only as used, 32 MiB first, doubling up
// to 1 GiB (a program may set a limit later: what the heap holds then is not the program's).
constexpr size_t kFirstChunk = size_t(32) << 20;
constexpr size_t kMaxChunk = size_t(1) << 30;
constexpr size_t kMinChunk = size_t(256) << 10;
constexpr int kMaxChunks = 24;
constexpr unsigned kMinShift = 4, kClasses = 27;  // 16 B .. 1 GiB
constexpr size_t kHeader = 16;
// A block's header: its class, the distance from the block's start to the pointer handed
// out, and a check that ties both to the pointer's address under a per-process key, so that
// a pointer into a block (free(p + 16)) or a second free is recognised and refused instead of
// trusted.
struct Header {
  uint32_t cls, offset;
  uint64_t check;
};
static_assert(sizeof(Header) == kHeader);
uint64_t g_key = 0;
uint64_t header_check(const void* user, uint32_t cls, uint32_t offset) {
  uint64_t x = reinterpret_cast<uintptr_t>(user) ^ g_key ^ (uint64_t(cls) << 40) ^ (uint64_t(offset) << 8);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
bool read_header(const void* p, Header* h) {
  std::memcpy(h, static_cast<const char*>(p) - kHeader, kHeader);
  return h->cls < 27 && h->offset >= kHeader && h->check == header_check(p, h->cls, h->offset);
}

// The chunks, published in order: [base, base + size) of chunk i is g_chunk[i] once
// g_chunks > i. The first also in g_base/g_size, which decide most internal_owns() calls.
struct Chunk {
  uintptr_t base;
  size_t size;
};
std::atomic<uintptr_t> g_base{0};
size_t g_size = 0;
std::atomic<int> g_chunks{0};
Chunk g_chunk[kMaxChunks] = {};
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
thread_local bool tls_holding __attribute__((tls_model("initial-exec"))) = false;
uintptr_t g_next = 0, g_end = 0;
void* g_free[kClasses] = {};

// Spins a little, then yields: on a machine whose CPUs are all busy the holder may be off-CPU,
// and spinning for a whole time slice would keep it there.
void take_lock() noexcept {
  for (unsigned spins = 0; g_lock.test_and_set(std::memory_order_acquire); ++spins)
    if (spins >= 64) sched_yield();
}

// The spinlock; false when this thread holds it, or is about to (re-entered from a signal
// handler). The flag is raised before the lock is taken and dropped after it is released, so a
// handler that interrupts anywhere in between refuses instead of spinning on its own thread.
bool acquire() noexcept {
  if (tls_holding) return false;
  tls_holding = true;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  take_lock();
  return true;
}
void release() noexcept {
  g_lock.clear(std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls_holding = false;
}

// A new chunk of at least need bytes for the bump pointer (lock held); false when there is
// no address space for it (the caller then uses glibc's malloc).
bool grow(size_t need) noexcept {
  const int n = g_chunks.load(std::memory_order_relaxed);
  if (n == kMaxChunks) return false;
  const size_t headroom = os::prim::address_space_headroom();
  size_t size = n == 0 ? kFirstChunk : std::min(kMaxChunk, g_chunk[n - 1].size * 2);
  if (headroom != SIZE_MAX) {
    size = n == 0 ? headroom / 1024 : g_chunk[n - 1].size * 2;
    size = std::min(size, std::max(headroom / 16, kMinChunk));
    size = std::max(size, kMinChunk);
  }
  constexpr size_t kPage = 4096;
  size = std::max(size, (need + kPage - 1) & ~(kPage - 1));
  // Raw system call: the libc wrapper is fine too, but nothing here may allocate.
  long r = syscall(SYS_mmap, nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == -1 || reinterpret_cast<void*>(r) == MAP_FAILED) return false;
#if defined(__SANITIZE_ADDRESS__)
  // Blocks here may hold the only pointer to memory of the sanitizer's heap.
  __lsan_register_root_region(reinterpret_cast<void*>(r), size);
#endif
  g_chunk[n] = {uintptr_t(r), size};
  if (n == 0) {
    g_size = size;
    g_key = uint64_t(r) * 0x9e3779b97f4a7c15ull ^ uint64_t(syscall(SYS_getpid)) << 17;
    g_base.store(uintptr_t(r), std::memory_order_release);
  }
  g_chunks.store(n + 1, std::memory_order_release);
  g_next = uintptr_t(r);
  g_end = uintptr_t(r) + size;
  return true;
}

unsigned class_of(size_t n) {
  unsigned c = 0;
  while ((size_t(1) << (c + kMinShift)) < n && c + 1 < kClasses) ++c;
  return c;
}

}  // namespace

void* internal_alloc(size_t size, size_t alignment) noexcept {
  if (alignment < 16) alignment = 16;
  if (size > (size_t(1) << 30) || alignment > (size_t(1) << 20)) return nullptr;
  // Over-aligned requests take a block big enough to align inside; the header just before the
  // returned pointer always names the block's real start.
  size_t need = size + (alignment > 16 ? alignment : 0);
  unsigned c = class_of(need ? need : 1);
  size_t block = size_t(1) << (c + kMinShift);
  char* raw;
  if (!acquire()) return nullptr;
  if (g_free[c]) {
    raw = static_cast<char*>(g_free[c]);
    std::memcpy(&g_free[c], raw, sizeof(void*));
  } else {
    if (g_end - g_next < block + kHeader && !grow(block + kHeader)) {
      release();
      return nullptr;
    }
    raw = reinterpret_cast<char*>(g_next);
    g_next += block + kHeader;
  }
  release();
  char* user = raw + kHeader;
  if (alignment > 16)
    user = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(user) + alignment - 1) & ~(alignment - 1));
  Header hdr{c, uint32_t(user - raw), 0};
  hdr.check = header_check(user, hdr.cls, hdr.offset);
  std::memcpy(user - kHeader, &hdr, kHeader);
  return user;
}

bool internal_owns(const void* p) noexcept {
  uintptr_t base = g_base.load(std::memory_order_acquire);
  auto a = reinterpret_cast<uintptr_t>(p);
  if (!base) return false;
  if (a - base < g_size) return true;
  const int n = g_chunks.load(std::memory_order_acquire);
  for (int i = 1; i < n; ++i)
    if (a - g_chunk[i].base < g_chunk[i].size) return true;
  return false;
}

size_t internal_usable_size(const void* p) noexcept {
  Header h;
  if (!read_header(p, &h)) return 0;
  return (size_t(1) << (h.cls + kMinShift)) + kHeader - h.offset;
}

void internal_lock() noexcept { take_lock(); }
void internal_unlock() noexcept { g_lock.clear(std::memory_order_release); }
void internal_reset_lock() noexcept {
  g_lock.clear(std::memory_order_release);
  tls_holding = false;
}

bool internal_free(void* p) noexcept {
  Header h;
  if (!read_header(p, &h)) return true;  // not a block start, or freed already: ignored
  char* raw = static_cast<char*>(p) - h.offset;
  if (!acquire()) return false;
  if (!read_header(p, &h)) {  // freed by another thread meanwhile
    release();
    return true;
  }
  Header dead{h.cls, h.offset, ~h.check};  // a second free finds no valid header
  std::memcpy(static_cast<char*>(p) - kHeader, &dead, kHeader);
  std::memcpy(raw, &g_free[h.cls], sizeof(void*));
  g_free[h.cls] = raw;
  release();
  return true;
}

}  // namespace cxlpool::os

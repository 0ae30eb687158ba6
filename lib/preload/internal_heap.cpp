// SPDX-License-Identifier: MIT
// Internal heap of the interposer (see internal_heap.hpp). Blocks carry a 16-byte header with
// their class; memory comes from one reserved, lazily touched mapping made with a raw mmap
// system call (1 GiB, or 1/16 of what RLIMIT_AS leaves, at least 16 MiB), and is never
// returned (the heap only holds cxlpool's own metadata).
#include "preload/internal_heap.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "os/prim.hpp"

namespace cxlpool::detail::preload {
namespace {

constexpr size_t kMaxReserve = size_t(1) << 30;  // address space; touched only as used
constexpr size_t kMinReserve = size_t(16) << 20;
constexpr unsigned kMinShift = 4, kClasses = 27;  // 16 B .. 1 GiB
constexpr size_t kHeader = 16;

std::atomic<uintptr_t> g_base{0};
size_t g_size = 0;
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
thread_local bool tls_holding __attribute__((tls_model("initial-exec"))) = false;
uintptr_t g_next = 0, g_end = 0;
void* g_free[kClasses] = {};

// The spinlock; false when this thread holds it already (re-entered from a signal handler).
bool acquire() noexcept {
  if (tls_holding) return false;
  while (g_lock.test_and_set(std::memory_order_acquire)) {
  }
  tls_holding = true;
  return true;
}
void release() noexcept {
  tls_holding = false;
  g_lock.clear(std::memory_order_release);
}

uintptr_t reserve_once() {
  uintptr_t b = g_base.load(std::memory_order_acquire);
  if (b) return b;
  size_t headroom = os::prim::address_space_headroom();
  size_t size = headroom == SIZE_MAX ? kMaxReserve : headroom / 16;
  if (size > kMaxReserve) size = kMaxReserve;
  if (size < kMinReserve) size = kMinReserve;
  // Raw system call: the libc wrapper is fine too, but nothing here may allocate.
  long r = syscall(SYS_mmap, nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == -1 || reinterpret_cast<void*>(r) == MAP_FAILED) return 0;
  uintptr_t expected = 0;
  if (!g_base.compare_exchange_strong(expected, uintptr_t(r))) {
    syscall(SYS_munmap, r, size);
    return expected;
  }
  g_size = size;
  return uintptr_t(r);
}

unsigned class_of(size_t n) {
  unsigned c = 0;
  while ((size_t(1) << (c + kMinShift)) < n && c + 1 < kClasses) ++c;
  return c;
}

}  // namespace

void* internal_alloc(size_t size, size_t alignment) noexcept {
  uintptr_t base = reserve_once();
  if (!base) return nullptr;
  if (alignment < 16) alignment = 16;
  if (size > (size_t(1) << 30) || alignment > (size_t(1) << 20)) return nullptr;
  // Over-aligned requests take a block big enough to align inside; the header just before the
  // returned pointer always names the block's real start.
  size_t need = size + (alignment > 16 ? alignment : 0);
  unsigned c = class_of(need ? need : 1);
  size_t block = size_t(1) << (c + kMinShift);
  char* raw;
  if (!acquire()) return nullptr;
  if (!g_next) {
    g_next = base;
    g_end = base + g_size;
  }
  if (g_free[c]) {
    raw = static_cast<char*>(g_free[c]);
    std::memcpy(&g_free[c], raw, sizeof(void*));
  } else {
    if (g_end - g_next < block + kHeader) {
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
  uint64_t hdr[2] = {c, uint64_t(user - raw)};
  std::memcpy(user - kHeader, hdr, kHeader);
  return user;
}

bool internal_owns(const void* p) noexcept {
  uintptr_t base = g_base.load(std::memory_order_acquire);
  auto a = reinterpret_cast<uintptr_t>(p);
  return base && a >= base && a < base + g_size;
}

size_t internal_usable_size(const void* p) noexcept {
  uint64_t hdr[2];
  std::memcpy(hdr, static_cast<const char*>(p) - kHeader, kHeader);
  return (size_t(1) << (hdr[0] + kMinShift)) + kHeader - hdr[1];
}

void internal_lock() noexcept {
  while (g_lock.test_and_set(std::memory_order_acquire)) {
  }
}
void internal_unlock() noexcept { g_lock.clear(std::memory_order_release); }

bool internal_free(void* p) noexcept {
  uint64_t hdr[2];
  std::memcpy(hdr, static_cast<char*>(p) - kHeader, kHeader);
  char* raw = static_cast<char*>(p) - hdr[1];
  unsigned c = unsigned(hdr[0]);
  if (c >= kClasses) return true;
  if (!acquire()) return false;
  std::memcpy(raw, &g_free[c], sizeof(void*));
  g_free[c] = raw;
  release();
  return true;
}

}  // namespace cxlpool::detail::preload

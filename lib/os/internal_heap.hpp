// SPDX-License-Identifier: MIT
// cxlpool's internal heap: memory for cxlpool's own bookkeeping that must never come from the
// program's malloc.
//  - The interposer serves from it every allocation cxlpool makes while it is being initialised
//    or is inside an allocator call, so malloc never recurses into the allocator.
//  - The containers an allocation path fills on the program's thread (a device's committed
//    ranges and reservations, a pool device's regions) use InternalAllocator, so that a program
//    linking libcxlpool.so does not get one glibc arena per thread it allocates from (64 MiB of
//    address space each, which under an RLIMIT_AS turned into NULL from cxlpool_malloc).
// Power-of-two classes with free lists in chunks of address space sized from RLIMIT_AS; a
// spinlock that knows its holder (no pthread, no malloc, no I/O), so a signal handler that
// re-enters while this thread holds it is refused instead of spinning forever. Each copy of
// the library (libcxlpool.so, the interposer) has its own heap.
#pragma once

#include <cstddef>
#include <new>

namespace cxlpool::os {

// nullptr when out of space, or when the calling thread already holds the heap's lock (a
// signal handler interrupted it): the caller then uses glibc's malloc.
void* internal_alloc(size_t size, size_t alignment = 16) noexcept;
// False (and nothing freed: the block leaks) when the calling thread holds the lock.
bool internal_free(void* p) noexcept;
bool internal_owns(const void* p) noexcept;
size_t internal_usable_size(const void* p) noexcept;
// Held across fork() by the interposer's atfork handlers.
void internal_lock() noexcept;
void internal_unlock() noexcept;
// A fork child whose parent forked from a signal handler: the lock may be held by the
// interrupted code; start unlocked.
void internal_reset_lock() noexcept;

// A stateless C++ allocator over the internal heap. When the heap refuses (out of address
// space, or a signal handler re-entered while this thread holds its lock) the block comes from
// ::operator new instead, and goes back there: deallocate tells the two apart by address.
template <class T>
struct InternalAllocator {
  static_assert(alignof(T) <= 16, "the internal heap aligns to 16 bytes");
  using value_type = T;
  InternalAllocator() noexcept = default;
  template <class U>
  InternalAllocator(const InternalAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > size_t(-1) / 2 / sizeof(T)) throw std::bad_array_new_length();
    if (void* p = internal_alloc(n * sizeof(T))) return static_cast<T*>(p);
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) noexcept {
    if (internal_owns(p))
      internal_free(p);
    else
      ::operator delete(p);
  }
  friend bool operator==(const InternalAllocator&, const InternalAllocator&) noexcept { return true; }
};

}  // namespace cxlpool::os

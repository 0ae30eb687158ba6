// SPDX-License-Identifier: MIT
// The interposer's internal heap: serves every allocation cxlpool makes for itself while it
// is being initialised or is inside an allocator call (topology discovery, region vectors,
// error strings), so malloc never recurses into the allocator. Power-of-two classes with
// free lists in chunks of address space sized from RLIMIT_AS; a spinlock that knows its
// holder (no pthread, no malloc, no I/O), so a signal handler that re-enters while this
// thread holds it is refused instead of spinning forever.
#pragma once

#include <cstddef>

namespace cxlpool::detail::preload {

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

}  // namespace cxlpool::detail::preload

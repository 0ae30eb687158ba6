// SPDX-License-Identifier: MIT
// The stats publisher: creates this process's stats page (layout.hpp) and a thread that
// refreshes it every interval from the allocator's per-device figures and the tiering
// counters. Started when the first pool is made (C ABI, interposer) unless CXLPOOL_STAT_PAGE=0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cxlpool::detail::stats {

// Reads CXLPOOL_STAT_PAGE and CXLPOOL_STAT_INTERVAL_MS and starts the publisher (once per
// process; later calls do nothing). Throws Failure(CONFIG) naming the variable and the value.
// When the page cannot be made (no descriptors, memfd refused), CXLPOOL_STAT_PAGE=1 makes that
// a Failure(OS); unset, one line on stderr says so and the program goes on without a page.
void start_from_environment();
// Starts the publisher now (interval_ms 10..60000). Throws Failure: INVALID_ARGUMENT, BUSY
// (running already), OS (the page could not be made, with the reason).
void start(uint32_t interval_ms);
// Stops the thread and removes the page. Idempotent.
void stop() noexcept;
bool running() noexcept;
// Writes a fresh snapshot now (the thread does this every interval).
void publish_now() noexcept;
// The page as mapped here (tests), its size and descriptor; nullptr/-1 when not running.
const void* page() noexcept;
size_t page_bytes() noexcept;
int page_fd() noexcept;

// fork(): prepare takes the publisher's lock (after the engine's, before the allocator's);
// in the child there is no publisher and no page: the parent's page is unmapped and its
// descriptor closed there, so nothing the child does can write the parent's numbers.
// prepared: this thread's fork_prepare took the locks, and the child releases them (a lock
// made afresh while a thread holds it is, to ThreadSanitizer, still held: the next lock is a
// double lock); false (a fork that ran no prepare) makes them afresh.
void fork_prepare() noexcept;
void fork_parent() noexcept;
void after_fork_child(bool prepared) noexcept;

}  // namespace cxlpool::detail::stats

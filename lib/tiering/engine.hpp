// SPDX-License-Identifier: MIT
// The tiering engine: one background thread per process that, every interval, lists the
// allocator's movable units (alloc/residency), collects what the monitors saw and the hints
// the program gave, ages each unit's heat, and moves hot units of slow devices to the pool's
// fastest device and cold ones back, within a byte budget per second, honouring pins and
// the kernel's own tiering. The C ABI (capi) and the interposer (preload) start it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cxlpool/common.h"
#include "tiering/config.hpp"

namespace cxlpool::detail::tiering {

// Starts the engine with c. Throws Failure: CONFIG (a monitor the config names is
// unavailable here, with the reason), BUSY (running already with another config), NO_MEMORY.
// Pools made from now on use 4 MiB units (alloc::set_region_segments(1)).
void start(const Config& c);
// Starts the engine from CXLPOOL_TIERING when it is set and not "off" (once per process; later
// calls do nothing). Throws Failure(CONFIG) naming the variable and the bad item. Under the
// interposer (unmodified programs) the "sample" monitor is refused: the program's system
// calls on heap memory (execve's arguments, reads into buffers) would fail with EFAULT on
// armed pages, and its threads that block SIGSEGV would die.
void start_from_environment(bool under_interposer = false);
// Stops the thread and disarms every monitor; units stay where they are. Idempotent.
void stop() noexcept;
bool running() noexcept;

// Explicit heat for [p, p+len): weight accesses per page this interval. Statuses: OK;
// INVALID_ARGUMENT (len 0, weight 0 or above 1e6); NOT_FOUND (not cxlpool memory);
// NOT_SUPPORTED (the engine is not running, or the memory cannot move: its pool has one
// device, or it is shared). *why says which.
cxlpool_status_t hint_access(const void* p, size_t len, uint32_t weight, std::string* why) noexcept;
// Moves every unit overlapping [p, p+len) to the pool's device of `tier` now and keeps it
// there (the engine does not move pinned units); tier -1 unpins. Throws Failure:
// INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED (no device of that tier in the pool, shared or
// single-device memory), and the move's own statuses (CAPACITY, NO_MEMORY, OS).
void pin(const void* p, size_t len, int tier);

// The engine's state as JSON: config in force, monitors with availability and reasons, the
// kernel cooperation mode and why, counters, per-tier bytes.
std::string stats_json();

// fork(): prepare takes the engine's locks (before the allocator's), parent releases them;
// the thread does not survive fork(), so in the child the engine is stopped (its monitors'
// registrations are not inherited either) and its locks are released (prepared: this thread's
// fork_prepare took them) or made afresh (a fork that ran no prepare).
void fork_prepare() noexcept;
void fork_parent() noexcept;
void after_fork_child(bool prepared) noexcept;

}  // namespace cxlpool::detail::tiering

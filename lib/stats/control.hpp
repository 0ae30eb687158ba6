// SPDX-License-Identifier: MIT
// The control socket: how a tool outside the process (cxlpool-capacity) changes the capacity
// of the devices the process has open while it runs. Opt-in (CXLPOOL_CONTROL=1): a thread
// accepts connections on the abstract Unix socket "cxlpool-control.<pid>.<random>" (found by the
// tool through the process's descriptors, so no one can bind it first), serves only its own
// user and root (the kernel's SO_PEERCRED, never a claim in the request), reads one request
// line and writes one reply (docs/devices.md, "Control socket"). It lives beside the stats
// page: both are the process's face to the tools.
#pragma once

#include <string>

namespace cxlpool::detail::control {

// A fresh abstract socket name for a process: its pid and 64 random bits.
std::string socket_name(long pid);

// Reads CXLPOOL_CONTROL (unset or 0: nothing; 1: start) once per process. Throws
// Failure(CONFIG) for another value. When the socket cannot be had (the name is bound by
// someone else, no thread to spare), one line on stderr says so and the program goes on.
void start_from_environment();

// Executes one request line and returns the reply text: "OK\n" or "ERR <status>\n", then
// key=value lines. Requests:
//   show DEVICE                      capacity, committed, offset space, extents, counters
//   resize DEVICE SIZE               cxlpool_device_resize
//   add DEVICE OFFSET LENGTH         cxlpool_device_add_extent
//   withdraw DEVICE OFFSET LENGTH    cxlpool_device_withdraw_extent
// SIZE, OFFSET and LENGTH: bytes, with an optional K/M/G/T suffix (powers of 1024).
std::string handle(const std::string& request);

// fork(): the child does not answer on the parent's name; its copy of the socket is closed
// and it has no control thread.
void after_fork_child() noexcept;

}  // namespace cxlpool::detail::control

// SPDX-License-Identifier: MIT
// The lender behind a borrowed device (borrow.hpp): this process's participation in the
// shared pool the device borrows from, the runs of extents it holds, and the follower thread
// that gives runs back. Used by the provider (provider.cpp) only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backing/provider.hpp"

namespace cxlpool::detail::borrow {

// "QUOTA@LOCATION" or "LOCATION" (spec.path of a pool device) split; quota "" = "default".
struct Source {
  std::string quota;
  std::string location;  // shm:NAME, file:PATH or devdax:PATH
};
Source split_source(const std::string& path);

// Opens the device's lender: joins the pool on the quota, borrows spec.capacity (rounded up
// to whole extents) and fills out (the pool's descriptor, its size as the offset space, the
// borrowed run online). Throws Failure naming the device.
void open_lender(const BackingSpec& spec, StorageOpen* out);
// Provider::grow: borrows a run of at least bytes for the device named by spec and hands it
// to add before the follower can see it.
// A refusal's reason goes to why (why_len bytes).
bool grow(const BackingSpec& spec, uint64_t bytes, Provider::AddRange add, void* ctx, char* why, size_t why_len);

// Wakes the follower now (the shared pools' loss listener: a pool failed or evicted this
// process); only a futex wake, safe under any lock.
void wake_follower() noexcept;

}  // namespace cxlpool::detail::borrow

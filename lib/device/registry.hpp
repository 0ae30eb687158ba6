// SPDX-License-Identifier: MIT
// The process's device registry: each target is opened once per process and shared by every
// pool and raw backing that uses it (refcounted; closed with its last user). Also the device
// half of fork(): lock every device, give a forked child its own copies, and make the parent
// wait for copies that must be taken before it writes again.
#pragma once

#include <memory>
#include <string>

#include "device/device.hpp"

namespace cxlpool::detail::registry {

// The open Device for spec, opening it on first use. A named device already open in this
// process under a different configuration is CXLPOOL_E_BUSY. Throws Failure.
std::shared_ptr<Device> acquire(const BackingSpec& spec);

// The open Device named name (a topology target's name), or nullptr when none is open in this
// process; *matches (when given) counts the open devices of that name (two topologies may
// each have opened a target of one name: then the name alone is ambiguous).
std::shared_ptr<Device> find(const std::string& name, size_t* matches = nullptr);

// A shared pool's device open in this process: lib/shared registers it for as long as a pool
// is open on it, so that the registry knows every device the process has open. A private
// device of the same object is refused naming the pool, and a capacity change naming it is
// refused with the reason (alloc/elastic.cpp). Its ledger: capacity is the pool's size, fixed
// by its superblock; committed is what this process holds in it (its pools on the device
// together; other participants hold the rest).
struct SharedDevice {
  std::string location;   // as the provider formats it: "shm:q", "file:/p", "devdax:/dev/dax0.0"
  std::string path;       // the named object
  std::string identity;   // the claim identity (one object however spelled)
  std::string real_path;  // path with every symbolic link resolved, when it could be
  Ledger ledger;
};

// The record for the shared device spec names, made on first use (capacity = pool_bytes) and
// removed with its last reference. Throws Failure (BUSY) when a private device of this process
// has the same object open.
std::shared_ptr<SharedDevice> add_shared(const BackingSpec& spec, const std::string& path, uint64_t pool_bytes);
// The shared device named name (its location however spelled, or its path), or nullptr.
std::shared_ptr<SharedDevice> find_shared(const std::string& name);

// fork() handlers, called by the allocator's handlers in its lock order (alloc/fork.cpp), inside
// the move gate it closes and opens.
void fork_prepare() noexcept;
void fork_parent() noexcept;
void fork_child() noexcept;
// fork() from a signal handler that interrupted cxlpool on this thread: no lock could be taken
// before it, so the child re-creates every device lock (unlocked) and forgets the parent's
// fork page; then the normal prepare/child sequence runs in the child.
void reset_locks_in_child() noexcept;

}  // namespace cxlpool::detail::registry

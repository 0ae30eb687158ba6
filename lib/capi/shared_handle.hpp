// SPDX-License-Identifier: MIT
// The shared pool behind a cxlpool_shared_pool_t handle, for other parts of the C ABI that
// work on shared pools (the KV cache). Throws INVALID_ARGUMENT for NULL, closed or foreign
// handles, naming `who`.
#pragma once

#include "cxlpool/shared.h"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail {
shared::SharedPool* shared_pool_of(cxlpool_shared_pool_t* pool, const char* who);
// The pool behind a handle while it is open, else nullptr (closed handles stay in a bounded
// quarantine, so a recent close is seen; a handle closed long ago is the caller's bug).
shared::SharedPool* shared_pool_if_open(cxlpool_shared_pool_t* pool) noexcept;
}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The C boundary: run C++ code, turn any exception into a status plus the thread's last
// error. Every extern "C" function in lib/capi goes through guarded().
#pragma once

#include <new>
#include <string>

#include "common/error.hpp"

namespace cxlpool::detail {

template <class F>
cxlpool_status_t guarded(F&& body) noexcept {
  try {
    body();
    return CXLPOOL_OK;
  } catch (const Failure& f) {
    set_last_error(f.status(), f.os_errno(), f.what());
    return f.status();
  } catch (const std::bad_alloc&) {
    set_last_error(CXLPOOL_E_NO_MEMORY, 0, "out of host memory for cxlpool metadata");
    return CXLPOOL_E_NO_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(CXLPOOL_E_INTERNAL, 0, e.what());
    return CXLPOOL_E_INTERNAL;
  } catch (...) {
    set_last_error(CXLPOOL_E_INTERNAL, 0, "unknown internal error");
    return CXLPOOL_E_INTERNAL;
  }
}

// Argument check helper: fails with INVALID_ARGUMENT naming the function and argument.
inline void require(bool ok, const char* function, const char* what) {
  if (!ok) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(function) + ": " + what);
}
inline void require(bool ok, const char* function, const std::string& what) {
  if (!ok) fail(CXLPOOL_E_INVALID_ARGUMENT, std::string(function) + ": " + what);
}

}  // namespace cxlpool::detail

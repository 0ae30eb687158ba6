// SPDX-License-Identifier: MIT
// C ABI: status strings, last error, source names, version; and the library's load.
#include "capi/capi_guard.hpp"
#include "common/names.hpp"
#include "cxlpool/common.h"
#include "lifecycle/lifecycle.hpp"

using namespace cxlpool::detail;

namespace {
// libcxlpool.so's one load-time constructor: the fork handlers are registered when the library
// is loaded, before a program registers handlers of its own, so that a fork child gets its own
// copy of private memory before anything else runs in it (lib/lifecycle/lifecycle.cpp).
[[gnu::constructor]] void on_load() { lifecycle::init(); }
}  // namespace

extern "C" {

const char* cxlpool_status_str(cxlpool_status_t status) { return status_name(status); }

cxlpool_status_t cxlpool_last_error(cxlpool_error_info_t* out) {
  if (!out) return CXLPOOL_E_INVALID_ARGUMENT;
  *out = last_error();
  return CXLPOOL_OK;
}

const char* cxlpool_last_error_message(void) { return last_error().message; }

cxlpool_status_t cxlpool_set_last_error(cxlpool_status_t status, int os_errno, const char* message) {
  set_last_error(status, os_errno, message ? message : "");
  return status;
}

const char* cxlpool_source_str(cxlpool_source_t source) { return source_name(source); }

const char* cxlpool_version_string(void) { return version_string(); }

}  // extern "C"

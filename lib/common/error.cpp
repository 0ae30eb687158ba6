// SPDX-License-Identifier: MIT
// Failure helpers and the thread-local last error behind cxlpool_last_error().
#include "common/error.hpp"

#include <strings.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace cxlpool::detail {
namespace {
struct LastError {
  cxlpool_status_t status = CXLPOOL_OK;
  int os_errno = 0;
  char message[1024] = "";
};
thread_local LastError tls_last_error;
}  // namespace

void fail(cxlpool_status_t status, std::string message) { throw Failure(status, std::move(message)); }

void fail_os(const std::string& what, int err) {
  cxlpool_status_t status = CXLPOOL_E_OS;
  switch (err) {
    case EACCES:
    case EPERM:
      status = CXLPOOL_E_PERMISSION;
      break;
    case ENOENT:
      status = CXLPOOL_E_NOT_FOUND;
      break;
    case ENOMEM:
    case ENOSPC:
      status = CXLPOOL_E_CAPACITY;
      break;
    case ENOTDIR:  // a path the configuration named that cannot be what it says
    case EISDIR:
    case ELOOP:
    case ENAMETOOLONG:
      status = CXLPOOL_E_CONFIG;
      break;
    default:
      break;
  }
  // A message that already ends with the errno's text (a path walk's refusal says it) does
  // not say it twice.
  const std::string text = std::strerror(err);
  const bool said =
      what.size() >= text.size() && strcasecmp(what.c_str() + what.size() - text.size(), text.c_str()) == 0;
  throw Failure(status, said ? what : what + ": " + text, err);
}

void set_last_error(cxlpool_status_t status, int os_errno, const char* message) noexcept {
  tls_last_error.status = status;
  tls_last_error.os_errno = os_errno;
  std::snprintf(tls_last_error.message, sizeof tls_last_error.message, "%s", message ? message : "");
}

cxlpool_error_info_t last_error() noexcept {
  return {tls_last_error.status, tls_last_error.os_errno, tls_last_error.message};
}

}  // namespace cxlpool::detail

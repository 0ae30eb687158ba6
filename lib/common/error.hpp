// SPDX-License-Identifier: MIT
// Internal error model: cold paths throw Failure (status + errno + message); the C shim in
// lib/capi catches it and stores it as the thread's last error. Nothing throws across C.
#pragma once

#include <exception>
#include <string>

#include "cxlpool/common.h"

namespace cxlpool::detail {

class Failure : public std::exception {
 public:
  Failure(cxlpool_status_t status, std::string message, int os_errno = 0)
      : status_(status), os_errno_(os_errno), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  cxlpool_status_t status() const noexcept { return status_; }
  int os_errno() const noexcept { return os_errno_; }

 private:
  cxlpool_status_t status_;
  int os_errno_;
  std::string message_;
};

[[noreturn]] void fail(cxlpool_status_t status, std::string message);
// A failed system call: message "<what>: <strerror(err)>", status derived from err
// (EACCES/EPERM -> PERMISSION, ENOENT -> NOT_FOUND, ENOMEM/ENOSPC -> CAPACITY, else OS).
[[noreturn]] void fail_os(const std::string& what, int err);

// Thread-local last error.
void set_last_error(cxlpool_status_t status, int os_errno, const char* message) noexcept;
cxlpool_error_info_t last_error() noexcept;

}  // namespace cxlpool::detail

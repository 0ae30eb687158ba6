// SPDX-License-Identifier: MIT
// Enum names and version string (see names.hpp).
#include "common/names.hpp"

namespace cxlpool::detail {

const char* status_name(cxlpool_status_t status) noexcept {
  switch (status) {
    case CXLPOOL_OK:
      return "CXLPOOL_OK: success";
    case CXLPOOL_E_INVALID_ARGUMENT:
      return "CXLPOOL_E_INVALID_ARGUMENT: invalid argument";
    case CXLPOOL_E_NO_MEMORY:
      return "CXLPOOL_E_NO_MEMORY: out of host memory";
    case CXLPOOL_E_CONFIG:
      return "CXLPOOL_E_CONFIG: bad configuration";
    case CXLPOOL_E_NOT_FOUND:
      return "CXLPOOL_E_NOT_FOUND: not found";
    case CXLPOOL_E_CAPACITY:
      return "CXLPOOL_E_CAPACITY: device capacity exceeded";
    case CXLPOOL_E_OS:
      return "CXLPOOL_E_OS: system call failed";
    case CXLPOOL_E_NOT_SUPPORTED:
      return "CXLPOOL_E_NOT_SUPPORTED: not supported";
    case CXLPOOL_E_BUSY:
      return "CXLPOOL_E_BUSY: object still in use";
    case CXLPOOL_E_PERMISSION:
      return "CXLPOOL_E_PERMISSION: permission denied";
    case CXLPOOL_E_INTERNAL:
      return "CXLPOOL_E_INTERNAL: internal error";
    case CXLPOOL_E_CORRUPT:
      return "CXLPOOL_E_CORRUPT: shared-pool metadata is corrupt";
    case CXLPOOL_E_STALE:
      return "CXLPOOL_E_STALE: stale handle (block freed or reused)";
    case CXLPOOL_E_EVICTED:
      return "CXLPOOL_E_EVICTED: participant was evicted from the shared pool";
    case CXLPOOL_E_EXISTS:
      return "CXLPOOL_E_EXISTS: name already exists";
    case CXLPOOL_E_DEVICE_FAILED:
      return "CXLPOOL_E_DEVICE_FAILED: the device failed or vanished";
    default:
      break;
  }
  return "unknown status";
}

const char* source_name(cxlpool_source_t source) noexcept {
  switch (source) {
    case CXLPOOL_SOURCE_UNKNOWN:
      return "unknown";
    case CXLPOOL_SOURCE_SYSFS:
      return "sysfs";
    case CXLPOOL_SOURCE_HMAT:
      return "hmat";
    case CXLPOOL_SOURCE_HWLOC:
      return "hwloc";
    case CXLPOOL_SOURCE_SLIT:
      return "slit";
    case CXLPOOL_SOURCE_CONFIG:
      return "config";
    case CXLPOOL_SOURCE_DEFAULT:
      return "default";
    case CXLPOOL_SOURCE_COMPUTED:
      return "computed";
    case CXLPOOL_SOURCE_PROCFS:
      return "procfs";
    default:
      break;
  }
  return "unknown";
}

#define CXLPOOL_STR2(x) #x
#define CXLPOOL_STR(x) CXLPOOL_STR2(x)
const char* version_string() noexcept {
  return CXLPOOL_STR(CXLPOOL_VERSION_MAJOR) "." CXLPOOL_STR(CXLPOOL_VERSION_MINOR) "." CXLPOOL_STR(
      CXLPOOL_VERSION_PATCH);
}

}  // namespace cxlpool::detail

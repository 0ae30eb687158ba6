/* SPDX-License-Identifier: MIT */
/* cxlpool common C ABI: status codes, the thread-local last error, provenance sources and
 * library version. Every other public header includes this one. */
#ifndef CXLPOOL_COMMON_H
#define CXLPOOL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CXLPOOL_BUILDING_LIBRARY)
#define CXLPOOL_API __attribute__((visibility("default")))
#else
#define CXLPOOL_API
#endif

#define CXLPOOL_VERSION_MAJOR 0
#define CXLPOOL_VERSION_MINOR 1
#define CXLPOOL_VERSION_PATCH 0

/* Status codes. 0 is success, errors are negative. Values are never renumbered. */
typedef enum cxlpool_status {
  CXLPOOL_OK = 0,
  CXLPOOL_E_INVALID_ARGUMENT = -1,     /* a NULL/out-of-range argument to a cxlpool function */
  CXLPOOL_E_NO_MEMORY = -2,            /* host memory for cxlpool's own metadata ran out */
  CXLPOOL_E_CONFIG = -3,               /* bad device/policy configuration string or file */
  CXLPOOL_E_NOT_FOUND = -4,            /* no such target, device, file or reservation */
  CXLPOOL_E_CAPACITY = -5,             /* the request exceeds a device's capacity */
  CXLPOOL_E_OS = -6,                   /* a system call failed; see the last error's os_errno */
  CXLPOOL_E_NOT_SUPPORTED = -7,        /* the operation is not possible on this device or kernel */
  CXLPOOL_E_BUSY = -8,                 /* the object still has live dependents */
  CXLPOOL_E_PERMISSION = -9,           /* the OS refused access */
  CXLPOOL_E_INTERNAL = -10,            /* a bug in cxlpool; please report it */
  CXLPOOL_E_CORRUPT = -11,             /* shared-pool metadata failed a checksum or invariant */
  CXLPOOL_E_STALE = -12,               /* a handle names a block that was freed or reused */
  CXLPOOL_E_EVICTED = -13,             /* this participant missed its lease and was evicted */
  CXLPOOL_E_EXISTS = -14,              /* the name is already taken (pool or foreign object) */
  CXLPOOL_E_DEVICE_FAILED = -15,       /* the device failed or vanished; its blocks are lost */
  CXLPOOL_STATUS_MAX_ENUM = 0x7fffffff /* keeps any int a valid value (ABI width) */
} cxlpool_status_t;

/* Static English name of a status ("CXLPOOL_E_CAPACITY: device capacity exceeded").
 * Never NULL; unknown values give "unknown status". Thread-safe, async-signal-safe. */
CXLPOOL_API const char* cxlpool_status_str(cxlpool_status_t status);

/* The last error recorded on the calling thread by a failing cxlpool function.
 * Successful calls do not clear it (like errno). */
typedef struct cxlpool_error_info {
  cxlpool_status_t status; /* status returned by the failing call */
  int os_errno;            /* errno of the failing system call, or 0 */
  const char* message;     /* names the failing call and argument; valid until the next
                              failing cxlpool call on this thread. Never NULL. */
} cxlpool_error_info_t;

/* Writes the calling thread's last error to *out. Returns CXLPOOL_E_INVALID_ARGUMENT when
 * out is NULL. Thread-safe (per-thread state). */
CXLPOOL_API cxlpool_status_t cxlpool_last_error(cxlpool_error_info_t* out);

/* Shorthand for the message of cxlpool_last_error(); "" when nothing failed yet. */
CXLPOOL_API const char* cxlpool_last_error_message(void);

/* Records a failure as the calling thread's last error, for companion libraries built on the C
 * ABI (libcxlpool_ucx) so that their callers read every failure in one place. The message is
 * copied (truncated to 1 KiB); NULL records "". Returns status, so a caller can write
 * `return cxlpool_set_last_error(s, e, msg);`. */
CXLPOOL_API cxlpool_status_t cxlpool_set_last_error(cxlpool_status_t status, int os_errno, const char* message);

/* Where an attribute's value came from. Values are never renumbered. */
typedef enum cxlpool_source {
  CXLPOOL_SOURCE_UNKNOWN = 0,  /* no value: nothing told us */
  CXLPOOL_SOURCE_SYSFS = 1,    /* read from a sysfs file (e.g. node meminfo, cpulist) */
  CXLPOOL_SOURCE_HMAT = 2,     /* ACPI HMAT, read from nodeN/access0/initiators in sysfs */
  CXLPOOL_SOURCE_HWLOC = 3,    /* hwloc memory attributes */
  CXLPOOL_SOURCE_SLIT = 4,     /* ACPI SLIT distances (nodeN/distance) */
  CXLPOOL_SOURCE_CONFIG = 5,   /* declared by the user in CXLPOOL_DEVICES / CXLPOOL_CONFIG */
  CXLPOOL_SOURCE_DEFAULT = 6,  /* cxlpool's documented default (published CXL figures) */
  CXLPOOL_SOURCE_COMPUTED = 7, /* derived by cxlpool from other attributes (e.g. tier rank) */
  CXLPOOL_SOURCE_PROCFS = 8,   /* read from /proc (e.g. kernel.numa_balancing) */
  CXLPOOL_SOURCE_MAX_ENUM = 0x7fffffff
} cxlpool_source_t;

/* Short lowercase name of a source ("hmat", "sysfs", ...). Never NULL. */
CXLPOOL_API const char* cxlpool_source_str(cxlpool_source_t source);

/* Version string of the loaded library, e.g. "0.1.0". */
CXLPOOL_API const char* cxlpool_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* CXLPOOL_COMMON_H */

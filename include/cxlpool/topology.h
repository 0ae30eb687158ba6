/* SPDX-License-Identifier: MIT */
/* cxlpool topology C ABI: discover the memory targets of this machine (NUMA nodes, DAX
 * devices, emulated CXL devices), each attribute with its source, ranked into tiers. */
#ifndef CXLPOOL_TOPOLOGY_H
#define CXLPOOL_TOPOLOGY_H

#include "cxlpool/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Discovery configuration ------------------------------------------------------------
 * A config object collects discovery knobs so new knobs never change a signature.
 * Not thread-safe: build it on one thread, then it may be shared read-only. */
typedef struct cxlpool_config cxlpool_config_t;

enum {
  CXLPOOL_CONFIG_IGNORE_ENV = 1u << 0,        /* do not read CXLPOOL_DEVICES / CXLPOOL_CONFIG */
  CXLPOOL_CONFIG_NO_DEFAULT_DEVICE = 1u << 1, /* never add the default emulated device */
  CXLPOOL_CONFIG_NO_HWLOC = 1u << 2           /* do not consult hwloc memory attributes */
};

/* Creates a config with defaults: real /sys and /proc, environment honoured, default
 * emulated device when no CXL hardware and no device configuration is found.
 * Statuses: OK, INVALID_ARGUMENT (out NULL), NO_MEMORY. *out written only on success. */
CXLPOOL_API cxlpool_status_t cxlpool_config_create(cxlpool_config_t** out);
/* Destroys a config. NULL is accepted and ignored. */
CXLPOOL_API void cxlpool_config_destroy(cxlpool_config_t* config);
/* Reads sysfs from DIR instead of /sys (fake trees for tests and what-if analysis). When set
 * and no procfs root is set, /proc facts are read from DIR/../proc if that exists, otherwise
 * they are reported unknown. hwloc is not consulted with a custom root.
 * Statuses: OK, INVALID_ARGUMENT (NULL/empty dir), NO_MEMORY. */
CXLPOOL_API cxlpool_status_t cxlpool_config_set_sysfs_root(cxlpool_config_t* config, const char* dir);
/* Reads /proc facts (kernel.numa_balancing) from DIR instead of /proc. */
CXLPOOL_API cxlpool_status_t cxlpool_config_set_procfs_root(cxlpool_config_t* config, const char* dir);
/* Device declarations in the CXLPOOL_DEVICES grammar; takes precedence over the environment.
 * Parsed at discovery time (errors are reported by cxlpool_topology_discover). */
CXLPOOL_API cxlpool_status_t cxlpool_config_set_devices(cxlpool_config_t* config, const char* spec);
/* A device file in the CXLPOOL_CONFIG format; takes precedence over the environment. */
CXLPOOL_API cxlpool_status_t cxlpool_config_set_config_file(cxlpool_config_t* config, const char* path);
/* ORs CXLPOOL_CONFIG_* flags. Unknown bits give INVALID_ARGUMENT. */
CXLPOOL_API cxlpool_status_t cxlpool_config_set_flags(cxlpool_config_t* config, uint32_t flags);

/* ---- Topology ---------------------------------------------------------------------------
 * An immutable snapshot. Safe to read from many threads at once. */
typedef struct cxlpool_topology cxlpool_topology_t;

/* Discovers the topology. config may be NULL for defaults. On a configuration error nothing
 * is created and the last error names the device, the key and the offending token.
 * Statuses: OK, INVALID_ARGUMENT, CONFIG, NOT_FOUND (e.g. numa:N for a missing node), OS,
 * NO_MEMORY. *out written only on success. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_discover(const cxlpool_config_t* config, cxlpool_topology_t** out);
/* Destroys a topology. Backings opened from it stay valid. NULL is ignored. */
CXLPOOL_API void cxlpool_topology_destroy(cxlpool_topology_t* topology);

typedef enum cxlpool_target_kind {
  CXLPOOL_TARGET_NUMA_NODE = 1, /* a NUMA node with memory (DRAM, or CXL/HBM when CPU-less) */
  CXLPOOL_TARGET_EMULATED = 2,  /* a device declared in configuration (or the default) */
  CXLPOOL_TARGET_DAX = 3,       /* a device-DAX character device (/dev/daxX.Y) */
  CXLPOOL_TARGET_MAX_ENUM = 0x7fffffff
} cxlpool_target_kind_t;

typedef enum cxlpool_backing_kind {
  CXLPOOL_BACKING_NUMA = 1,   /* anonymous memory bound to a node with mbind */
  CXLPOOL_BACKING_MEMFD = 2,  /* anonymous shared memory (memfd); shareable by fd passing */
  CXLPOOL_BACKING_SHM = 3,    /* named POSIX shared memory (/dev/shm/NAME) */
  CXLPOOL_BACKING_FILE = 4,   /* a file on any filesystem (tmpfs, hugetlbfs, DAX fs, famfs) */
  CXLPOOL_BACKING_DEVDAX = 5, /* a device-DAX character device */
  CXLPOOL_BACKING_POOL = 6,   /* extents borrowed from a shared pool's quota (docs/compose.md) */
  CXLPOOL_BACKING_MAX_ENUM = 0x7fffffff
} cxlpool_backing_kind_t;

/* Short names: "numa", "emulated", "dax" / "numa", "memfd", "shm", "file", "devdax", "pool". */
CXLPOOL_API const char* cxlpool_target_kind_str(cxlpool_target_kind_t kind);
CXLPOOL_API const char* cxlpool_backing_kind_str(cxlpool_backing_kind_t kind);

/* Identity of one target. Strings are owned by the topology. */
typedef struct cxlpool_target_info {
  const char* name; /* "node0", "cxl0", "dax0.0" */
  cxlpool_target_kind_t kind;
  int numa_node;                  /* node the memory comes from, or -1 */
  int tier;                       /* cxlpool tier, 0 = fastest */
  int cpuless;                    /* 1 when no CPU is local to this memory */
  const char* cpulist;            /* local CPUs, "" when none */
  cxlpool_backing_kind_t backing; /* how cxlpool maps this target */
  const char* backing_path;       /* shm name, file or device path; "" when none */
  uint64_t capacity_bytes;        /* 0 when unknown */
  uint64_t reserved[8];           /* zero; room for growth without breaking the ABI */
} cxlpool_target_info_t;

typedef enum cxlpool_attr {
  CXLPOOL_ATTR_CAPACITY_BYTES = 1,
  CXLPOOL_ATTR_FREE_BYTES = 2,
  CXLPOOL_ATTR_READ_LATENCY_NS = 3,
  CXLPOOL_ATTR_WRITE_LATENCY_NS = 4,
  CXLPOOL_ATTR_READ_BANDWIDTH_MBPS = 5, /* MB/s (10^6 bytes per second) */
  CXLPOOL_ATTR_WRITE_BANDWIDTH_MBPS = 6,
  CXLPOOL_ATTR_KERNEL_TIER = 7, /* memory_tierN the kernel placed the node in */
  CXLPOOL_ATTR_TIER = 8,        /* cxlpool's tier (0 = fastest) */
  CXLPOOL_ATTR_CPU_COUNT = 9,
  CXLPOOL_ATTR_CPULESS = 10,    /* 0 or 1 */
  CXLPOOL_ATTR_CXL_BACKED = 11, /* 1 when a CXL region provides this memory */
  CXLPOOL_ATTR_PAGE_SIZE = 12,
  CXLPOOL_ATTR_ABSTRACT_DISTANCE = 13, /* ranking cost; 1000 = local DRAM (docs/topology.md) */
  CXLPOOL_ATTR_INTERLEAVE_WEIGHT = 14, /* kernel weighted-interleave weight of the node */
  CXLPOOL_ATTR_MAX_ENUM = 0x7fffffff   /* any int is a valid value; unknown ones are rejected */
} cxlpool_attr_t;

typedef struct cxlpool_attr_value {
  int64_t value;           /* meaningful only when known */
  cxlpool_source_t source; /* CXLPOOL_SOURCE_UNKNOWN when not known */
  int known;               /* 1 when a value is known */
} cxlpool_attr_value_t;

/* Number of targets. Statuses: OK, INVALID_ARGUMENT. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_target_count(const cxlpool_topology_t* topology, size_t* out);
/* Identity of target index (0 .. count-1). Statuses: OK, INVALID_ARGUMENT, NOT_FOUND. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_get_target(const cxlpool_topology_t* topology, size_t index,
                                                         cxlpool_target_info_t* out);
/* Index of the target named name. Statuses: OK, INVALID_ARGUMENT, NOT_FOUND. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_find_target(const cxlpool_topology_t* topology, const char* name,
                                                          size_t* out);
/* One attribute of a target with its source. An unknown attribute is not an error: the call
 * succeeds with known = 0. Statuses: OK, INVALID_ARGUMENT (bad attr), NOT_FOUND (index). */
CXLPOOL_API cxlpool_status_t cxlpool_target_get_attr(const cxlpool_topology_t* topology, size_t index,
                                                     cxlpool_attr_t attr, cxlpool_attr_value_t* out);
/* SLIT distance between the NUMA nodes behind two targets (known = 0 if either has none). */
CXLPOOL_API cxlpool_status_t cxlpool_target_get_distance(const cxlpool_topology_t* topology, size_t from, size_t to,
                                                         cxlpool_attr_value_t* out);
/* Number of distinct cxlpool tiers (highest tier + 1). */
CXLPOOL_API cxlpool_status_t cxlpool_topology_tier_count(const cxlpool_topology_t* topology, int* out);

/* The kernel's own tiering state. */
typedef struct cxlpool_kernel_state {
  cxlpool_attr_value_t numa_balancing;      /* 0 off, 1 normal, 2 memory tiering, 3 both */
  cxlpool_attr_value_t demotion_enabled;    /* 0/1 */
  cxlpool_attr_value_t weighted_interleave; /* 1 when MPOL_WEIGHTED_INTERLEAVE weights exist */
  cxlpool_attr_value_t memory_tier_count;   /* number of kernel memory_tierN directories */
  uint64_t reserved[8];
} cxlpool_kernel_state_t;
CXLPOOL_API cxlpool_status_t cxlpool_topology_get_kernel_state(const cxlpool_topology_t* topology,
                                                               cxlpool_kernel_state_t* out);

/* Inventory of CXL memory devices, CXL regions and DAX devices (what `cxl list` and
 * `daxctl list` would show). Strings are owned by the topology. */
typedef enum cxlpool_component_kind {
  CXLPOOL_COMPONENT_CXL_MEMDEV = 1,
  CXLPOOL_COMPONENT_CXL_REGION = 2,
  CXLPOOL_COMPONENT_DAX = 3,
  CXLPOOL_COMPONENT_MAX_ENUM = 0x7fffffff
} cxlpool_component_kind_t;

typedef struct cxlpool_component_info {
  cxlpool_component_kind_t kind;
  const char* name;    /* "mem0", "region0", "dax0.0" */
  uint64_t size_bytes; /* 0 when unknown */
  int numa_node;       /* memdev: device proximity; dax: target node; -1 when none */
  const char* mode;    /* memdev: ""; region: "ram"/"pmem"; dax: "devdax", "system-ram" or "unbound" */
  const char* detail;  /* one human-readable line of the rest */
  uint64_t reserved[4];
} cxlpool_component_info_t;

CXLPOOL_API cxlpool_status_t cxlpool_topology_component_count(const cxlpool_topology_t* topology, size_t* out);
CXLPOOL_API cxlpool_status_t cxlpool_topology_get_component(const cxlpool_topology_t* topology, size_t index,
                                                            cxlpool_component_info_t* out);

/* Warnings a user should read (e.g. numa_balancing=1 with CPU-less nodes). Strings are owned
 * by the topology. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_warning_count(const cxlpool_topology_t* topology, size_t* out);
CXLPOOL_API cxlpool_status_t cxlpool_topology_get_warning(const cxlpool_topology_t* topology, size_t index,
                                                          const char** out);

/* The whole topology as one JSON document (schema in docs/topology.md). *out is a
 * NUL-terminated string the caller releases with cxlpool_string_free. */
CXLPOOL_API cxlpool_status_t cxlpool_topology_to_json(const cxlpool_topology_t* topology, char** out);
CXLPOOL_API void cxlpool_string_free(char* s);

#ifdef __cplusplus
}
#endif
#endif /* CXLPOOL_TOPOLOGY_H */

// SPDX-License-Identifier: MIT
// The stats page: the fixed, versioned layout of the per-process memory that cxlpool-stat
// reads without attaching to the process. One sealed memfd named "cxlpool-stats" per process,
// written only by the process that created it (single writer, seqlock), readable through
// /proc/PID/fd or /proc/PID/map_files. The page describes itself: the metrics' names, kinds,
// units and help are in it, so a reader needs no compiled-in schema, only this layout.
//
//   Header                     (kHeaderBytes)
//   MetricSlot[n_metrics]      descriptors: scope, kind, name, unit, help
//   DeviceSlot[max_devices]    the process's devices
//   uint64 values              process metrics, then device metrics per device slot,
//                              then tier metrics per tier (kMaxTiers)
//
// Every field is naturally aligned, native-endian (the reader runs on the same host).
// Version changes whenever a field moves; new metrics only add descriptors.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlpool::detail::stats {

inline constexpr char kMagic[8] = {'C', 'X', 'L', 'P', 'S', 'T', 'A', 'T'};
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr char kMemfdName[] = "cxlpool-stats";
inline constexpr uint32_t kMaxDevices = 32;
inline constexpr uint32_t kMaxTierSlots = 8;

enum class Scope : uint8_t { kProcess = 1, kDevice = 2, kTier = 3 };

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t total_bytes;
  int32_t pid;
  uint32_t interval_ms;  // how often the publisher writes
  uint64_t seq;          // seqlock: odd while the writer is in the middle of an update
  uint64_t start_realtime_ns;
  uint64_t updated_realtime_ns;
  uint64_t updated_monotonic_ns;  // CLOCK_MONOTONIC: a reader on the same host judges staleness
  uint64_t publishes;
  uint32_t n_metrics;
  uint32_t max_devices;
  uint32_t n_devices;  // device slots in use (in the current snapshot)
  uint32_t n_tiers;    // tier slots (kMaxTierSlots)
  uint32_t metrics_offset, devices_offset, values_offset;
  uint32_t n_process_metrics, n_device_metrics, n_tier_metrics;
  char program[64];  // the program's name (comm), for the reader's heading
  uint8_t reserved[256 - 8 - 4 - 4 - 8 - 4 - 4 - 8 * 5 - 4 * 4 - 4 * 3 - 4 * 3 - 64];
};
static_assert(sizeof(Header) == 256, "the header is 256 bytes");
inline constexpr uint32_t kHeaderBytes = sizeof(Header);

struct MetricSlot {
  uint8_t scope;  // Scope
  uint8_t kind;   // MetricKind (1 counter, 2 gauge)
  uint8_t reserved[6];
  char name[40];
  char unit[16];
  char help[64];
};
static_assert(sizeof(MetricSlot) == 128, "a metric slot is 128 bytes");

struct DeviceSlot {
  char name[48];
  int32_t kind;  // cxlpool_backing_kind_t
  int32_t tier;
  int32_t numa_node;
  int32_t pools;  // live pools on the device
};
static_assert(sizeof(DeviceSlot) == 64, "a device slot is 64 bytes");

}  // namespace cxlpool::detail::stats

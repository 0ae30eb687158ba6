// SPDX-License-Identifier: MIT
// Emulated/declared device specifications and their strict parser. Grammar (docs/config.md):
//   DEVICES := DEVICE (';' DEVICE)*      DEVICE := NAME ':' [KEY '=' VALUE (',' KEY '=' VALUE)*]
// e.g. "cxl0:backing=shm,size=4G,latency=250ns,bandwidth=30GB/s;far1:backing=numa:1".
// A config file holds one DEVICE per line with '#' comments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxlpool/topology.h"

namespace cxlpool::detail {

struct DeviceSpec {
  std::string name;
  cxlpool_backing_kind_t backing = CXLPOOL_BACKING_MEMFD;
  int numa_node = -1;  // numa:N
  std::string path;    // shm name (shm:NAME), file path, devdax path
  std::optional<uint64_t> size;
  std::optional<uint64_t> max_size;  // how far elastic capacity may grow the device (docs/devices.md)
  std::optional<uint64_t> read_latency_ns, write_latency_ns;
  std::optional<uint64_t> read_bandwidth_mbps, write_bandwidth_mbps;
  std::optional<int> tier;
  std::optional<bool> fork_copy;  // fork=copy (true) or fork=cow (false); unset: the kind's default
  std::string origin;             // where it was declared, e.g. "CXLPOOL_DEVICES" or "/etc/cxlpool.conf:3"

  bool operator==(const DeviceSpec& o) const;
};

// Parses a ';'-separated device list. origin prefixes every error message. Throws
// Failure(CXLPOOL_E_CONFIG) naming the device, the key and the offending token.
std::vector<DeviceSpec> parse_device_list(std::string_view text, const std::string& origin);
// Parses a config file (one device per line, '#' comments, blank lines ignored).
std::vector<DeviceSpec> parse_device_file(const std::string& path);
// Parses file contents (separated from I/O for tests); origin is the file name.
std::vector<DeviceSpec> parse_device_lines(std::string_view text, const std::string& origin);
// Canonical text of one device; parse_device_list(format_device(d)) yields d again.
std::string format_device(const DeviceSpec& d);
// "shm", "shm:NAME", "numa:N", "file:PATH", "devdax:PATH".
std::string format_backing(const DeviceSpec& d);

}  // namespace cxlpool::detail

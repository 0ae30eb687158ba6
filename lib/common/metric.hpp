// SPDX-License-Identifier: MIT
// What a published number is: its name (schema name, also the JSON key and, prefixed with
// "cxlpool_", the Prometheus name), whether it only grows (counter) or goes up and down
// (gauge), its unit and one line of help. Components describe their numbers with these; the
// stats page (lib/stats) and every JSON rendering of them use the same descriptors.
#pragma once

#include <cstdint>

namespace cxlpool::detail {

enum class MetricKind : uint8_t { kCounter = 1, kGauge = 2 };

struct MetricDesc {
  const char* name;
  MetricKind kind;
  const char* unit;  // "bytes", "pages", "nanoseconds", "events", "count", "flag", ...
  const char* help;
};

}  // namespace cxlpool::detail

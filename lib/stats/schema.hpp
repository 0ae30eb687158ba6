// SPDX-License-Identifier: MIT
// The stats schema: every number the stats page publishes, in page order: the process's
// (tiering counters), each device's (allocator figures summed over pools), each tier's. One
// list, built from the components' own field tables, so the page, the JSON renderings and
// docs/stats.md cannot drift apart.
#pragma once

#include <cstddef>

#include "common/metric.hpp"
#include "stats/layout.hpp"

namespace cxlpool::detail::stats {

struct SchemaEntry {
  Scope scope;
  MetricDesc desc;
};

size_t schema_size() noexcept;
const SchemaEntry& schema_entry(size_t i) noexcept;
size_t schema_count(Scope scope) noexcept;
const char* scope_name(Scope scope) noexcept;

}  // namespace cxlpool::detail::stats

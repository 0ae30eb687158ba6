// SPDX-License-Identifier: MIT
// The stats schema (schema.hpp), assembled at compile time from tiering::kCounterFields,
// kVmaFields (device layer), alloc::kDeviceStatFields and tiering::kTierFields.
#include "stats/schema.hpp"

#include <array>
#include <cstring>

#include "alloc/pool.hpp"
#include "device/device.hpp"
#include "tiering/counters.hpp"

namespace cxlpool::detail::stats {
namespace {

constexpr size_t kProcess = std::size(tiering::kCounterFields) + std::size(kVmaFields);
constexpr size_t kDevice = std::size(alloc::kDeviceStatFields);
constexpr size_t kTier = std::size(tiering::kTierFields);

constexpr std::array<SchemaEntry, kProcess + kDevice + kTier> make_schema() {
  std::array<SchemaEntry, kProcess + kDevice + kTier> a{};
  size_t n = 0;
  for (const auto& f : tiering::kCounterFields) a[n++] = {Scope::kProcess, f.desc};
  for (const auto& f : kVmaFields) a[n++] = {Scope::kProcess, f.desc};
  for (const auto& f : alloc::kDeviceStatFields) a[n++] = {Scope::kDevice, f.desc};
  for (const auto& f : tiering::kTierFields) a[n++] = {Scope::kTier, f.desc};
  return a;
}
constexpr auto kSchema = make_schema();

constexpr size_t length(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  return n;
}
constexpr bool fits_slots() {
  for (const SchemaEntry& e : kSchema)
    if (length(e.desc.name) >= sizeof(MetricSlot::name) || length(e.desc.unit) >= sizeof(MetricSlot::unit) ||
        length(e.desc.help) >= sizeof(MetricSlot::help))
      return false;
  return true;
}
static_assert(fits_slots(), "every schema name, unit and help fits its slot in the stats page");
constexpr bool unique_names() {
  for (size_t i = 0; i < kSchema.size(); ++i)
    for (size_t k = i + 1; k < kSchema.size(); ++k) {
      const char *a = kSchema[i].desc.name, *b = kSchema[k].desc.name;
      size_t j = 0;
      while (a[j] && a[j] == b[j]) ++j;
      if (a[j] == b[j]) return false;
    }
  return true;
}
static_assert(unique_names(), "schema names are unique across scopes (they are Prometheus names)");

}  // namespace

size_t schema_size() noexcept { return kSchema.size(); }
const SchemaEntry& schema_entry(size_t i) noexcept { return kSchema[i]; }
size_t schema_count(Scope scope) noexcept {
  return scope == Scope::kProcess ? kProcess : scope == Scope::kDevice ? kDevice : kTier;
}
const char* scope_name(Scope scope) noexcept {
  return scope == Scope::kProcess ? "process" : scope == Scope::kDevice ? "device" : "tier";
}

}  // namespace cxlpool::detail::stats

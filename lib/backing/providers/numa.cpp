// SPDX-License-Identifier: MIT
// numa:N — anonymous memory bound to NUMA node N (mbind): no descriptor, no name, placed and
// migrated by the kernel's memory policy.
#include "backing/provider.hpp"
#include "common/parse.hpp"

namespace cxlpool::detail {
namespace {

constexpr uint64_t kMaxNode = 1023;

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  auto n = has_arg ? parse_u64(arg) : std::nullopt;
  if (!n || *n > kMaxNode)
    return "bad NUMA node 'numa" + std::string(has_arg ? ":" : "") + std::string(arg) +
           "' (expected numa:N with N in 0.." + std::to_string(kMaxNode) + ")";
  out->numa_node = static_cast<int>(*n);
  return "";
}

std::string format(const BackingSpec& s) { return "numa:" + std::to_string(s.numa_node); }
std::string no_name(const BackingSpec&) { return ""; }

void open_storage(const BackingSpec& spec, bool, StorageOpen* out) {
  out->numa_node = spec.numa_node;
  out->description = "anonymous memory bound to node " + std::to_string(spec.numa_node);
}

}  // namespace

extern const Provider kNumaProvider = {
    "numa",  CXLPOOL_BACKING_NUMA, "numa:N", true,    false,   parse, format, no_name,
    no_name, open_storage,         nullptr,  nullptr, nullptr,
};

}  // namespace cxlpool::detail

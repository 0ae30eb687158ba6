// SPDX-License-Identifier: MIT
// memfd ("shm" or "memfd" alone in the grammar) — an anonymous memfd of this process: no name
// another process can open, its pages placed by the process's memory policy.
#include "backing/provider.hpp"

namespace cxlpool::detail {
namespace {

std::string parse(std::string_view arg, bool has_arg, BackingSpec*) {
  if (has_arg) return "bad shm name '" + std::string(arg) + "' (memfd takes no name; a named device is shm:NAME)";
  return "";
}

std::string format(const BackingSpec&) { return "shm"; }
std::string no_name(const BackingSpec&) { return ""; }

void open_storage(const BackingSpec& spec, bool, StorageOpen* out) {
  out->fd = os::memfd_create("cxlpool:" + spec.device_name);
  out->description = "memfd";
  out->sized_by_cxlpool = true;
}

}  // namespace

extern const Provider kMemfdProvider = {
    "memfd", CXLPOOL_BACKING_MEMFD, "memfd", false,   false,   parse, format, no_name,
    no_name, open_storage,          nullptr, nullptr, nullptr,
};

}  // namespace cxlpool::detail

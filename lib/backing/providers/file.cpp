// SPDX-License-Identifier: MIT
// file:PATH — a device in a filesystem's directory (tmpfs, a DAX filesystem, hugetlbfs, ...).
// A private device lives in an unnamed file of PATH's directory (never PATH itself); a shared
// pool lives in the file PATH.
#include "backing/provider.hpp"

namespace cxlpool::detail {
namespace {

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  if (!has_arg || arg.empty() || arg[0] != '/')
    return "bad path '" + std::string(has_arg ? arg : std::string_view("file")) +
           "' (expected an absolute path, e.g. file:/dev/shm/pool0)";
  out->path = std::string(arg);
  return "";
}

std::string format(const BackingSpec& s) { return "file:" + s.path; }
std::string named_path(const BackingSpec& s) { return s.path; }
std::string claim_identity(const BackingSpec& s) { return "file:" + os::real_dir_path(s.path); }

void open_storage(const BackingSpec& spec, bool, StorageOpen* out) {
  const std::string dir = os::parent_dir(spec.path);
  out->fd = os::open_tmpfile(dir, "device '" + spec.device_name + "'");
  out->description = "unnamed file in " + dir;
  out->sized_by_cxlpool = true;
  out->room_limited = true;
  out->filesystem_file = true;
}

}  // namespace

extern const Provider kFileProvider = {
    "file", CXLPOOL_BACKING_FILE, "file:PATH",    false,        false,           parse,
    format, named_path,           claim_identity, open_storage, &kSharedFileOps,
};

}  // namespace cxlpool::detail

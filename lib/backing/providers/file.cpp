// SPDX-License-Identifier: MIT
// file:PATH — a device in a filesystem's directory (tmpfs, a DAX filesystem, hugetlbfs, ...).
// A private device lives in an unnamed file of PATH's directory (never PATH itself); a shared
// pool lives in the file PATH.
#include "backing/provider.hpp"

namespace cxlpool::detail {
namespace {

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  return parse_absolute_path(arg, has_arg, "file", "file:/dev/shm/pool0", out);
}

std::string format(const BackingSpec& s) { return "file:" + s.path; }
std::string named_path(const BackingSpec& s) { return s.path; }
std::string claim_identity(const BackingSpec& s) { return "file:" + os::real_dir_path(s.path); }

void open_storage(const BackingSpec& spec, bool, StorageOpen* out) {
  open_unnamed_file_storage(os::parent_dir(spec.path), spec, out);
  out->filesystem_file = true;  // any filesystem: DAX or hugetlbfs decide how it is mapped
}

}  // namespace

extern const Provider kFileProvider = {
    "file",  CXLPOOL_BACKING_FILE, "file:PATH",    false,        false,           parse,
    format,  named_path,           claim_identity, open_storage, &kSharedFileOps, check_named_file_declared,
    nullptr,
};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// shm:NAME — a device in /dev/shm. A private device lives in an unnamed file of that tmpfs
// (never the name itself); a shared pool lives in the file /dev/shm/NAME. "shm" alone is the
// memfd shorthand.
#include "backing/provider.hpp"

namespace cxlpool::detail {
namespace {

// A file name in /dev/shm: any bytes but '/', not "." or "..", at most 200 bytes (tools print
// such names escaped). In CXLPOOL_DEVICES ',' and ';' separate entries, so a name there
// cannot hold them.
bool valid_shm_name(std::string_view n) {
  return !n.empty() && n.size() <= 200 && n != "." && n != ".." && n.find('/') == std::string_view::npos;
}

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  if (!has_arg) {
    out->kind = CXLPOOL_BACKING_MEMFD;
    return "";
  }
  if (!valid_shm_name(arg))
    return "bad shm name '" + std::string(arg) + "' (a file name in /dev/shm: no '/', at most 200 bytes)";
  out->path = std::string(arg);
  return "";
}

std::string format(const BackingSpec& s) { return "shm:" + s.path; }
std::string named_path(const BackingSpec& s) { return "/dev/shm/" + s.path; }
std::string claim_identity(const BackingSpec& s) { return "file:" + os::real_dir_path(named_path(s)); }

void open_storage(const BackingSpec& spec, bool, StorageOpen* out) {
  open_unnamed_file_storage("/dev/shm", spec, out);  // gone with the last mapping
}

}  // namespace

extern const Provider kShmProvider = {
    "shm",   CXLPOOL_BACKING_SHM, "shm:NAME",     false,        false,           parse,
    format,  named_path,          claim_identity, open_storage, &kSharedFileOps, check_named_file_declared,
    nullptr,
};

}  // namespace cxlpool::detail

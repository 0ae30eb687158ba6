// SPDX-License-Identifier: MIT
// The named object of a file kind (shm:NAME, file:PATH) holding a shared pool: a regular file,
// opened without following a final symlink or another user's link above it, created unnamed
// and given its name only once whole (os/pool_files).
#include "backing/provider.hpp"
#include "common/error.hpp"

namespace cxlpool::detail {
namespace {

std::string path_of(const BackingSpec& spec) { return provider_for(spec.kind)->named_path(spec); }

SharedObject open_file(const BackingSpec& spec, bool writable, const std::string& what) {
  SharedObject o;
  o.path = path_of(spec);
  o.fd = writable ? os::open_existing(o.path, false, what) : os::open_existing_readonly(o.path, false, what);
  o.size = os::fd_size(o.fd);
  return o;
}

SharedObject create_file(const BackingSpec& spec, unsigned mode, const std::string& what, os::NewFileSite* site) {
  SharedObject o;
  o.path = path_of(spec);
  if (os::path_kind(o.path) == "directory")
    fail(CXLPOOL_E_CONFIG, what + ": \"" + o.path + "\" is a directory, which cannot hold a pool (name a file in it)");
  if (!os::path_kind(o.path).empty())
    fail(CXLPOOL_E_EXISTS, what + ": \"" + o.path + "\" already exists (" + os::path_kind(o.path) +
                               "); it was left untouched (open it, or remove it)");
  o.fd = os::create_unnamed_file(o.path, mode, what, site);
  return o;
}

void publish_file(SharedObject* obj, os::NewFileSite* site, const std::string& what) {
  os::link_new_file(obj->fd, site, obj->path, what);
}

void remove_file(const BackingSpec& spec, const os::PathIdentity& expected, const std::string& what) {
  os::unlink_path(path_of(spec), expected, what);
}

}  // namespace

const SharedObjectOps kSharedFileOps = {open_file, create_file, publish_file, remove_file};

}  // namespace cxlpool::detail

// SPDX-License-Identifier: MIT
// The provider table (provider.hpp): the built-in backends, registration, the location
// grammar, and what follows from a provider's traits (capabilities, fork mode).
#include "backing/provider.hpp"

#include <array>

#include "common/error.hpp"

namespace cxlpool::detail {

extern const Provider kNumaProvider;
extern const Provider kMemfdProvider;
extern const Provider kShmProvider;
extern const Provider kFileProvider;
extern const Provider kDevdaxProvider;

namespace {

constexpr size_t kMaxProviders = 16;

struct Table {
  std::array<const Provider*, kMaxProviders> entries{&kNumaProvider, &kMemfdProvider, &kShmProvider, &kFileProvider,
                                                     &kDevdaxProvider};
  size_t count = 5;
};

Table& table() noexcept {
  static Table t;  // constant-initialised: usable from the interposer's first malloc
  return t;
}

}  // namespace

const Provider* provider_for(int kind) noexcept {
  const Table& t = table();
  for (size_t i = 0; i < t.count; ++i)
    if (t.entries[i]->kind == kind) return t.entries[i];
  return nullptr;
}

const Provider* provider_named(std::string_view word) noexcept {
  const Table& t = table();
  for (size_t i = 0; i < t.count; ++i)
    if (word == t.entries[i]->word) return t.entries[i];
  return nullptr;
}

bool register_provider(const Provider* p) noexcept {
  Table& t = table();
  if (!p || t.count == kMaxProviders || provider_for(p->kind) || provider_named(p->word)) return false;
  t.entries[t.count++] = p;
  return true;
}

std::string provider_syntaxes() {
  const Table& t = table();
  std::string s;
  for (size_t i = 0; i < t.count; ++i) s += (i ? ", " : "") + std::string(t.entries[i]->syntax);
  return s;
}

std::string parse_location(std::string_view text, BackingSpec* out) {
  const size_t colon = text.find(':');
  const std::string_view word = text.substr(0, colon);
  const Provider* p = provider_named(word);
  if (!p) return "unknown backing '" + std::string(text) + "' (expected " + provider_syntaxes() + ")";
  const bool has_arg = colon != std::string_view::npos;
  out->kind = static_cast<cxlpool_backing_kind_t>(p->kind);
  out->numa_node = -1;
  out->path.clear();
  return p->parse(has_arg ? text.substr(colon + 1) : std::string_view(), has_arg, out);
}

std::string parse_absolute_path(std::string_view arg, bool has_arg, std::string_view word, const char* example,
                                BackingSpec* out) {
  if (!has_arg || arg.empty() || arg[0] != '/')
    return "bad path '" + std::string(has_arg ? arg : word) + "' (expected an absolute path, e.g. " + example + ")";
  if (arg.back() == '/')
    return "bad path '" + std::string(arg) + "' (it ends in '/', so it names a directory; e.g. " + example + ")";
  out->path = std::string(arg);
  return "";
}

void open_unnamed_file_storage(const std::string& dir, const BackingSpec& spec, StorageOpen* out) {
  out->fd = os::open_tmpfile(dir, "device '" + spec.device_name + "': key 'backing'");
  out->description = "unnamed file in " + dir;
  out->sized_by_cxlpool = true;
  out->room_limited = true;
}

std::string check_named_file_declared(const BackingSpec& spec, bool sized) {
  const Provider* p = provider_for(spec.kind);
  if (!sized)
    return "'" + format_location(spec) +
           "' needs size= (cxlpool creates the device's memory itself and never sizes it from an existing object)";
  const std::string named = p->named_path(spec);
  const std::string dir = os::parent_dir(named);
  if (!os::is_directory(dir)) {
    const std::string what = os::path_kind(dir);
    return dir + (what.empty() ? " does not exist" : " is a " + what) + ", so '" + format_location(spec) +
           "' has no directory to live in";
  }
  const std::string pseudo = os::pseudo_filesystem(dir);
  if (!pseudo.empty()) return dir + " is on a " + pseudo + " pseudo filesystem, which cannot hold memory";
  const std::string kind = os::path_kind(named);
  if (!kind.empty())
    return named + " exists (" + kind +
           ") and was not created by cxlpool for this device; a private device never uses or changes an existing "
           "file, a shared pool's included (open that with cxlpool_shared_pool_open): remove it or choose another " +
           (spec.kind == CXLPOOL_BACKING_SHM ? "name" : "path");
  return "";
}

std::string format_location(const BackingSpec& spec) {
  const Provider* p = provider_for(spec.kind);
  return p ? p->format(spec) : "?";
}

const SharedObjectOps& shared_object_ops(const BackingSpec& spec, const std::string& what) {
  const Provider* p = provider_for(spec.kind);
  if (!p || !p->shared) {
    std::string kinds;
    const Table& t = table();
    for (size_t i = 0; i < t.count; ++i)
      if (t.entries[i]->shared) kinds += (kinds.empty() ? "" : ", ") + std::string(t.entries[i]->syntax);
    fail(CXLPOOL_E_CONFIG,
         what + ": a shared pool lives in a named device (" + kinds + "); " +
             (p ? std::string(p->word) + " has no name another process can open" : std::string("unknown kind")));
  }
  return *p->shared;
}

void open_fork_copy_storage(const BackingSpec& spec, StorageOpen* out) {
  out->fd = os::memfd_create("cxlpool:" + spec.device_name);
  out->description = "memfd";
  out->sized_by_cxlpool = true;
}

ForkMode effective_fork_mode(const BackingSpec& spec, bool dax_or_hugetlb) {
  const Provider* p = provider_for(spec.kind);
  if (p && p->device_node) return ForkMode::kCopy;
  if (spec.fork_mode != ForkMode::kDefault) return spec.fork_mode;
  return dax_or_hugetlb ? ForkMode::kCopy : ForkMode::kCopyOnWrite;
}

cxlpool_backing_caps_t describe_backing(const BackingSpec& spec) {
  const Provider* p = provider_for(spec.kind);
  const bool anonymous = p && p->anonymous;
  cxlpool_backing_caps_t c{};
  c.kind = spec.kind;
  c.numa_node = anonymous ? spec.numa_node : -1;
  c.shareable = !anonymous;
  c.kernel_migratable = anonymous;
  c.decommit_frees_memory = !(p && p->device_node);
  c.page_size = spec.page_size ? spec.page_size : os::page_size();
  c.capacity_bytes = spec.capacity;
  return c;
}

}  // namespace cxlpool::detail

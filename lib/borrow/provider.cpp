// SPDX-License-Identifier: MIT
// pool:[QUOTA@]LOCATION — a private device whose memory is extents borrowed from the shared
// pool at LOCATION (shm:NAME, file:PATH, devdax:PATH) on QUOTA's account ("default" when
// omitted). Registered at load (lifecycle) rather than listed in backing/provider.cpp: it
// joins a shared pool, which the backing layer sits below. The device's offset space is the
// pool's object and its online extents are the runs it borrowed (lender.cpp); like a device
// node it is only ever mapped shared, and a fork child's copy goes to a memfd.
#include "backing/provider.hpp"

#include <cctype>
#include <cstring>
#include <string>

#include "borrow/borrow.hpp"
#include "borrow/lender.hpp"
#include "common/error.hpp"
#include "shared/shared_pool.hpp"

namespace cxlpool::detail::borrow {
namespace {

bool valid_quota(std::string_view q) {
  if (q.empty() || q.size() > 23) return false;
  for (char c : q)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

std::string parse(std::string_view arg, bool has_arg, BackingSpec* out) {
  constexpr const char* kExpect = "expected pool:LOCATION or pool:QUOTA@LOCATION, e.g. pool:tenant-a@shm:jobs";
  if (!has_arg || arg.empty()) return "a pool device names its shared pool (" + std::string(kExpect) + ")";
  const Source src = split_source(std::string(arg));
  if (!src.quota.empty() || arg.front() == '@')
    if (!valid_quota(src.quota))
      return "bad quota name '" + src.quota + "' (1-23 characters of [A-Za-z0-9_.-]; " + kExpect + ")";
  BackingSpec inner;
  if (std::string why = parse_location(src.location, &inner); !why.empty())
    return "the pool's location '" + src.location + "': " + why;
  const Provider* p = provider_for(inner.kind);
  if (!p || !p->shared || p->word == std::string_view("pool"))
    return "'" + src.location + "' cannot hold a shared pool (shm:NAME, file:PATH or devdax:PATH)";
  const std::string location = format_location(inner);
  out->path = src.quota.empty() ? location : src.quota + "@" + location;
  return "";
}

std::string format(const BackingSpec& s) { return "pool:" + s.path; }
std::string no_name(const BackingSpec&) { return ""; }  // the pool's object is the pool's, never the device's

void open_storage(const BackingSpec& spec, bool fork_copy, StorageOpen* out) {
  if (fork_copy) {  // a fork child's copy of what the parent borrowed: its own memory
    open_fork_copy_storage(spec, out);
    return;
  }
  open_lender(spec, out);
}

// The pool exists and has the quota: a look at its superblock that joins nothing.
std::string check_declared(const BackingSpec& spec, bool) {
  const Source src = split_source(spec.path);
  const std::string quota = src.quota.empty() ? "default" : src.quota;
  try {
    const shared::MappedPool m = shared::map_pool_unjoined(src.location);  // validates the superblock
    const shared::Superblock sb = m.sb;
    shared::unmap_pool(m);
    std::string known;
    for (uint32_t i = 0; i < sb.quota_count && i < shared::kMaxQuotas; ++i) {
      const std::string name(sb.quotas[i].name, strnlen(sb.quotas[i].name, sizeof sb.quotas[i].name));
      if (name == quota) return "";
      known += (known.empty() ? "" : ", ") + name;
    }
    return "the shared pool " + src.location + " has no quota named '" + quota + "' (it has: " + known + ")";
  } catch (const Failure& f) {
    return f.what();
  }
}

bool grow_device(const BackingSpec& spec, uint64_t bytes, Provider::AddRange add, void* ctx, char* why,
                 size_t why_len) {
  try {
    return grow(spec, bytes, add, ctx, why, why_len);
  } catch (...) {
    return false;  // no host memory for the bookkeeping: the reservation fails as full
  }
}

const Provider kPoolProvider = {
    "pool",
    CXLPOOL_BACKING_POOL,
    "pool:[QUOTA@]LOCATION",
    false,
    true,
    parse,
    format,
    no_name,
    no_name,
    open_storage,
    nullptr,
    check_declared,
    grow_device,
};

}  // namespace

void register_provider() noexcept {
  (void)cxlpool::detail::register_provider(&kPoolProvider);
  shared::SharedPool::set_loss_listener(wake_follower);
}

}  // namespace cxlpool::detail::borrow

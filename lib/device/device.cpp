// SPDX-License-Identifier: MIT
// Device: claim and storages of one target, its reservations and capacity ledger, and its
// fork semantics (see device.hpp and docs/backing.md).
#include "device/device.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/error.hpp"
#include "common/parse.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/sample_trap.hpp"

namespace cxlpool::detail {
namespace {

// The message of the last cold failure inside a noexcept device operation (storage creation),
// for describe(); one per thread, no allocation when it is read.
thread_local char tls_message[320];

void remember(const std::exception& e) noexcept { std::snprintf(tls_message, sizeof tls_message, "%s", e.what()); }

cxlpool_status_t status_of_errno(int e) {
  switch (e) {
    case ENOMEM:
      return CXLPOOL_E_NO_MEMORY;
    case EACCES:
    case EPERM:
      return CXLPOOL_E_PERMISSION;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EFAULT:
      return CXLPOOL_E_CAPACITY;
    default:
      return CXLPOOL_E_OS;
  }
}

bool is_pow2(size_t v) { return v && !(v & (v - 1)); }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

Device::Device(const BackingSpec& spec) : requested_(spec), spec_(spec) {
  const std::string dev = "device '" + spec_.device_name + "'";
  if (spec_.capacity == 0) fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": capacity is unknown or 0");
  provider_ = provider_for(spec_.kind);
  if (!provider_)
    fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": no provider for backing kind " + std::to_string(spec_.kind));
  if (provider_->anonymous && spec_.numa_node < 0)
    fail(CXLPOOL_E_INVALID_ARGUMENT, dev + ": " + provider_->word + " backing without a node");
  const std::string named = provider_->device_node ? "" : provider_->named_path(spec_);
  if (!named.empty()) {
    // The name itself is never created, opened or written: a private device lives in an
    // unnamed file. Something already there is not ours, so refuse rather than guess.
    std::string kind = os::path_kind(named);
    if (!kind.empty()) {
      unsigned uid = 0, mode = 0;
      os::path_owner(named, uid, mode);
      char owner[64];
      std::snprintf(owner, sizeof owner, " (owner uid %u, mode %04o)", uid, mode);
      fail(CXLPOOL_E_PERMISSION,
           dev + ": " + named + " exists (" + kind + owner +
               ") and was not created by cxlpool for this device; a private device never uses or "
               "changes an existing file, a shared pool's included. Remove it or choose another " +
               (std::string_view(provider_->syntax).find("NAME") != std::string_view::npos ? "name" : "path"));
    }
  }
  std::string identity = DeviceClaim::identity_of(spec_);
  if (!identity.empty()) claim_ = std::make_unique<DeviceClaim>(identity, spec_.device_name, provider_->format(spec_));
  private_storage_ = Storage::create(spec_);
  // The claim's lock file goes beside the device as the user named it (its directory walked
  // safely), after the storage: it never takes the room the storage needed.
  if (claim_ && !named.empty()) claim_->lock_beside(os::parent_dir(named), named.substr(named.find_last_of('/') + 1));
  if (!named.empty() && spec_.page_size == 0) spec_.page_size = os::fd_page_size(private_storage_->fd());
  // Storage that cannot be mapped (a filesystem that takes files but not mmap) fails here,
  // naming the device, instead of every allocation failing later without a word.
  if (!private_storage_->anonymous()) {
    void* probe = nullptr;
    size_t ps = spec_.page_size ? spec_.page_size : os::page_size();
    int e = os::prim::reserve(ps, ps, &probe);
    if (!e) {
      e = private_storage_->map(probe, ps, 0, true);
      os::prim::unmap(probe, ps);
    }
    if (e)
      fail(CXLPOOL_E_CONFIG, "device '" + spec_.device_name + "': its memory (" + private_storage_->description() +
                                 ") cannot be mapped: " + std::strerror(e));
  }
  if (provider_->device_node) shared_storage_ = private_storage_;  // one device, one offset space
  caps_ = describe_backing(spec_);
  fork_mode_ = effective_fork_mode(spec_, private_storage_->placement_in_storage());
  if (private_storage_->borrowed()) {
    // Borrowed capacity (a shared pool's extents): the offset space is the pool's, and only
    // what was borrowed at open is online; the provider's grow borrows more on request.
    uint64_t online = 0;
    for (auto& [lo, hi] : private_storage_->online_at_open()) {
      online_.insert(lo, hi);
      online += hi - lo;
    }
    caps_.capacity_bytes = online;
    ledger_.capacity.store(online, std::memory_order_relaxed);
    // Opened empty when the quota refused (the provider keeps asking): the first allocation
    // that fails names why.
    const std::string& refusal = private_storage_->refusal_at_open();
    std::snprintf(grow_refusal_, sizeof grow_refusal_, "%s", refusal.c_str());
    space_ = max_space_ = private_storage_->size();
    return;
  }
  ledger_.capacity.store(caps_.capacity_bytes, std::memory_order_relaxed);
  online_.insert(0, caps_.capacity_bytes);
  space_ = caps_.capacity_bytes;
  // A devdax device cannot hold more than its size; a file or memfd can grow, up to max_size.
  max_space_ = provider_->device_node ? caps_.capacity_bytes : uint64_t(1) << 50;
  if (spec_.max_space) max_space_ = std::max<uint64_t>(std::min(max_space_, spec_.max_space), caps_.capacity_bytes);
}

Device::~Device() {
  for (auto& [a, r] : reservations_)
    if (!r.arriving) os::prim::unmap(reinterpret_cast<void*>(r.addr), r.span);
}

bool Device::mapped_shared(const Reservation& r) const {
  if (r.sharing == Sharing::kShared) return true;
  if (r.storage->anonymous()) return false;
  return fork_mode_ == ForkMode::kCopy;
}

Device::Reservation* Device::find(const void* addr, size_t len) noexcept {
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto it = reservations_.upper_bound(a);
  if (it == reservations_.begin()) return nullptr;
  --it;
  Reservation& r = it->second;
  if (a >= r.addr && a - r.addr < r.size && len <= r.size - (a - r.addr)) return &r;
  return nullptr;
}

bool Device::wait_unless_moving(std::unique_lock<std::mutex>& lock, const void* addr) noexcept {
  for (;;) {
    const Reservation* r = find_const(addr);
    if (!r) return false;
    if (!r->leaving && !r->arriving) return true;
    moved_.wait(lock);
  }
}

const Device::Reservation* Device::find_const(const void* addr) const noexcept {
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto it = reservations_.upper_bound(a);
  if (it == reservations_.begin()) return nullptr;
  --it;
  const Reservation& r = it->second;
  return a - r.addr < r.size ? &r : nullptr;
}

cxlpool_status_t Device::storage_for(Sharing sharing, std::shared_ptr<Storage>& out, DeviceError* err) noexcept {
  std::shared_ptr<Storage>& slot = sharing == Sharing::kPrivate ? private_storage_ : shared_storage_;
  if (slot && !slot->anonymous()) slot->valid_fd();  // notices a descriptor the program took away
  if (slot && !slot->lost() && !slot->retired()) {
    out = slot;
    return CXLPOOL_OK;
  }
  if (provider_->device_node && !forked_child_ && slot && slot->lost()) {
    std::snprintf(tls_message, sizeof tls_message,
                  "device '%s': the program closed cxlpool's descriptor of devdax:%s; the device cannot be "
                  "reopened while its memory is mapped",
                  spec_.device_name.c_str(), spec_.path.c_str());
    return device_failure(err, CXLPOOL_E_OS, EBADF, "devdax descriptor");
  }
  try {
    // A fresh storage: after fork (the parent keeps the old one), or because the program
    // closed our descriptor. Device-DAX cannot be duplicated: a child's memory is a memfd.
    bool fresh_copy = forked_child_ && provider_->device_node;
    slot = Storage::create(spec_, fresh_copy);
    if (int e = conform(*slot)) {
      std::snprintf(tls_message, sizeof tls_message, "device '%s': sizing its fresh storage: %s",
                    spec_.device_name.c_str(), std::strerror(e));
      return device_failure(err, status_of_errno(e), e, "opening storage");
    }
    if (provider_->device_node && forked_child_) {
      // One memfd for both sharing modes in the child, as the device had one offset space.
      private_storage_ = slot;
      shared_storage_ = slot;
    }
  } catch (const std::exception& e) {
    remember(e);
    return device_failure(err, CXLPOOL_E_OS, errno, "opening storage");
  }
  out = slot;
  return CXLPOOL_OK;
}

void Device::account(Storage&, uint64_t added, uint64_t removed, int client) noexcept {
  if (added) {
    uint64_t now = ledger_.committed.fetch_add(added, std::memory_order_relaxed) + added;
    uint64_t peak = ledger_.peak.load(std::memory_order_relaxed);
    while (now > peak && !ledger_.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    if (client >= 0 && client < kMaxLedgerClients)
      ledger_.by_client[client].fetch_add(added, std::memory_order_relaxed);
  }
  if (removed) {
    ledger_.committed.fetch_sub(removed, std::memory_order_relaxed);
    if (client >= 0 && client < kMaxLedgerClients) {
      uint64_t cur = ledger_.by_client[client].load(std::memory_order_relaxed);
      ledger_.by_client[client].store(cur >= removed ? cur - removed : 0, std::memory_order_relaxed);
    }
  }
}

namespace {
std::atomic<int64_t> g_vmas{0};
std::atomic<int64_t> g_vma_budget{0};  // 0: not read yet
std::atomic<uint64_t> g_vma_refusals{0};

int64_t vma_budget() noexcept {
  int64_t b = g_vma_budget.load(std::memory_order_relaxed);
  if (b <= 0) {
    b = int64_t(os::max_map_count() / 2);
    g_vma_budget.store(b, std::memory_order_relaxed);
  }
  return b;
}
}  // namespace

VmaUse vma_use() noexcept {
  return {uint64_t(std::max<int64_t>(0, g_vmas.load(std::memory_order_relaxed))), uint64_t(vma_budget()),
          g_vma_refusals.load(std::memory_order_relaxed)};
}

bool vma_room_for(int64_t more) noexcept {
  if (more <= 0 || g_vmas.load(std::memory_order_relaxed) + more <= vma_budget()) return true;
  g_vma_refusals.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void set_vma_budget(int64_t budget) noexcept { g_vma_budget.store(budget > 0 ? budget : 0, std::memory_order_relaxed); }

int64_t Device::vma_delta(const Reservation& r, uint64_t lo, uint64_t hi, bool to_committed) const noexcept {
  const IntervalSet& c = r.storage->committed;
  const uint64_t w0 = r.offset, w1 = r.offset + r.size, ps = caps_.page_size;
  // -1 outside the reservation: a different mapping, never merged with ours.
  auto state = [&](uint64_t at) -> int { return at < w0 || at >= w1 ? -1 : c.covered(at, at + ps) ? 1 : 0; };
  const int to = to_committed ? 1 : 0;
  int64_t before = int64_t(c.boundaries_inside(lo, hi)), after = 0;
  if (lo > w0) {
    before += state(lo - ps) != state(lo);
    after += state(lo - ps) != to;
  }
  if (hi < w1) {
    before += state(hi - ps) != state(hi);
    after += to != state(hi);
  }
  return after - before;
}

cxlpool_status_t Device::reserve(size_t size, size_t alignment, size_t span, Sharing sharing, int client, void** out,
                                 DeviceError* err) noexcept {
  const size_t ps = caps_.page_size;
  if (size == 0 || (alignment && !is_pow2(alignment)) || size > (size_t(1) << 50) || span > (size_t(1) << 50))
    return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "reserve");
  size = (size + ps - 1) / ps * ps;
  span = std::max(size, (span + ps - 1) / ps * ps);
  alignment = std::max(alignment, ps);
  std::unique_lock<std::mutex> lock(mu_);
  bool grown = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::shared_ptr<Storage> st;
    if (cxlpool_status_t s = storage_for(sharing, st, err)) return s;
    uint64_t offset = 0, largest = 0;
    if (!st->anonymous()) {
      int e = st->take_mappable_range(size, alignment, &offset, &largest);
      if (e == ENOSPC && !grown && provider_->grow) {
        // Capacity on request (borrowed from a shared pool): asked without the device's lock,
        // which the provider's own withdrawals take.
        grown = true;
        lock.unlock();
        const bool got = grow_on_request(size);
        lock.lock();
        if (got) {
          --attempt;
          continue;
        }
      }
      if (e == ENOSPC) return device_failure(err, CXLPOOL_E_CAPACITY, 0, "device range", largest);
      if (e) return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "device range");
    }
    void* addr = nullptr;
    if (int e = os::prim::reserve(span, alignment, &addr)) {
      if (!st->anonymous()) st->give_back_range(offset, size);
      return device_failure(err, e == ENOMEM ? CXLPOOL_E_NO_MEMORY : CXLPOOL_E_OS, e, "mmap(PROT_NONE)");
    }
    Reservation r;
    r.addr = reinterpret_cast<uintptr_t>(addr);
    r.size = size;
    r.span = span;
    r.offset = st->anonymous() ? r.addr : offset;
    r.storage = st;
    r.sharing = sharing;
    r.client = client;
    r.vmas = span > size ? 2 : 1;  // the device's pages, and the address space beyond them
    int e = st->map(addr, size, offset, mapped_shared(r));
    if (e) {
      os::prim::unmap(addr, span);
      if (!st->anonymous() || st->lost()) st->give_back_range(offset, size);
      if (e == EBADF && st->lost() && attempt == 0) continue;  // the program closed our fd: fresh storage
      return device_failure(err, e == ENOMEM ? CXLPOOL_E_NO_MEMORY : CXLPOOL_E_OS, e,
                            st->anonymous() ? "mbind" : "mmap(fd)");
    }
    // The address space past the device's bytes is never accessed; marking it keeps the
    // kernel from merging it with device memory that is plain anonymous memory too (private
    // ranges of file devices), so that the mapping model (vma_delta) stays exact.
    if (span > size) os::prim::advise_thp(static_cast<char*>(addr) + size, span - size, false);
    try {
      reservations_.emplace(r.addr, r);
    } catch (...) {
      os::prim::unmap(addr, span);
      if (!st->anonymous()) st->give_back_range(offset, size);
      return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "reservation table");
    }
    reserved_bytes_ += size;
    g_vmas.fetch_add(r.vmas, std::memory_order_relaxed);
    *out = addr;
    return CXLPOOL_OK;
  }
  return device_failure(err, CXLPOOL_E_OS, EBADF, "mmap(fd)");
}

cxlpool_status_t Device::map_range(uint64_t offset, size_t size, int client, void** out, DeviceError* err) noexcept {
  const size_t ps = caps_.page_size;
  if (size == 0 || offset % ps) return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "map");
  if (provider_->anonymous) return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0, "map");
  size = (size + ps - 1) / ps * ps;
  std::lock_guard<std::mutex> lock(mu_);
  // Only online offsets: past the end, or in an extent withdrawn or being withdrawn, is none.
  if (offset > space_ || space_ - offset < size || online_.covered(offset, offset + size) != size ||
      (withdrawing_.hi > offset && offset + size > withdrawing_.lo))
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "map past the end", capacity());
  std::shared_ptr<Storage> st;
  if (cxlpool_status_t s = storage_for(Sharing::kShared, st, err)) return s;
  void* addr = nullptr;
  if (int e = os::prim::reserve(size, ps, &addr)) return device_failure(err, CXLPOOL_E_NO_MEMORY, e, "mmap(PROT_NONE)");
  if (int e = st->map(addr, size, offset, true)) {
    os::prim::unmap(addr, size);
    return device_failure(err, CXLPOOL_E_OS, e, "mmap(fd)");
  }
  Reservation r;
  r.addr = reinterpret_cast<uintptr_t>(addr);
  r.size = r.span = size;
  r.offset = offset;
  r.storage = st;
  r.sharing = Sharing::kShared;
  r.owns_range = false;
  r.client = client;
  r.vmas = 1;
  try {
    reservations_.emplace(r.addr, r);
  } catch (...) {
    os::prim::unmap(addr, size);
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "reservation table");
  }
  g_vmas.fetch_add(r.vmas, std::memory_order_relaxed);
  *out = addr;
  return CXLPOOL_OK;
}

Device::Reservation* Device::range_of(const void* addr, size_t len, const char* op, DeviceError* err,
                                      cxlpool_status_t* status) noexcept {
  const size_t ps = caps_.page_size;
  auto a = reinterpret_cast<uintptr_t>(addr);
  if (!addr || len == 0 || a % ps || len % ps) {
    *status = device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, op);
    return nullptr;
  }
  Reservation* r = find(addr, len);
  if (!r) *status = device_failure(err, CXLPOOL_E_NOT_FOUND, 0, op);
  return r;
}

cxlpool_status_t Device::commit(void* addr, size_t len, bool populate, int client, DeviceError* err) noexcept {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::unique_lock<std::mutex> lock(mu_);
  wait_unless_moving(lock, addr);
  cxlpool_status_t status = CXLPOOL_OK;
  Reservation* r = range_of(addr, len, "commit", err, &status);
  if (!r) return status;
  Storage& st = *r->storage;
  uint64_t off = r->offset + (a - r->addr);
  uint64_t added = len - st.committed.covered(off, off + len);
  if (committed() + added > capacity()) return device_failure(err, CXLPOOL_E_CAPACITY, 0, "capacity", committed());
  // Offsets a forced release took away (elastic.cpp) stay their reservation's but hold nothing.
  if (added && !st.anonymous() && online_.covered(off, off + len) != len)
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "capacity: the range was released", committed());
  const int64_t vmas = vma_delta(*r, off, off + len, true);
  if (int e = os::prim::protect(addr, len, true)) return device_failure(err, status_of_errno(e), e, "mprotect(RW)");
  // Bytes that live in the storage (shared mappings of a file or /dev/shm) get their room now,
  // so a full filesystem is CAPACITY here instead of SIGBUS at a later touch, whoever fills it
  // meanwhile. Only the pages not committed yet: the rest has its room.
  const bool in_storage = mapped_shared(*r) && !st.anonymous();
  const bool shared_fd = in_storage && !r->inherited;  // ours to free (a fork child's view is not)
  auto* const base = static_cast<char*>(addr);
  if (added && in_storage) {
    int e = 0;
    st.committed.for_each_gap(off, off + len, [&](uint64_t lo, uint64_t hi) {
      if (!e) e = st.reserve_room(base + (lo - off), lo, hi - lo);
    });
    if (e) {
      // What was taken before the filesystem ran out goes back (ext4 keeps it otherwise).
      if (shared_fd)
        st.committed.for_each_gap(
            off, off + len, [&](uint64_t lo, uint64_t hi) { os::prim::advise_remove(base + (lo - off), hi - lo); });
      if (added == len) os::prim::protect(addr, len, false);
      return device_failure(err, status_of_errno(e), e, "fallocate");
    }
  }
  // Private pages of hugetlbfs exist only once faulted in: a missing huge page is CAPACITY now.
  const bool must_populate = populate || (added && !in_storage && st.private_needs_populate());
  if (must_populate) {
    int e = os::prim::populate_write(addr, len);
    if (e == EINVAL && !populate) e = 0;  // kernels before 5.14: no early check
    if (e) {
      if (added == len) {
        if (shared_fd) os::prim::advise_remove(addr, len);
        os::prim::advise_dontneed(addr, len);
        os::prim::protect(addr, len, false);
      }
      return device_failure(err, status_of_errno(e), e, "madvise(POPULATE_WRITE)");
    }
  }
  try {
    st.committed.insert(off, off + len);
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "committed-range table");
  }
  r->vmas += vmas;
  g_vmas.fetch_add(vmas, std::memory_order_relaxed);
  account(st, added, 0, client);
  return CXLPOOL_OK;
}

cxlpool_status_t Device::decommit(void* addr, size_t len, int client, DeviceError* err) noexcept {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::unique_lock<std::mutex> lock(mu_);
  wait_unless_moving(lock, addr);
  cxlpool_status_t status = CXLPOOL_OK;
  Reservation* r = range_of(addr, len, "decommit", err, &status);
  if (!r) return status;
  Storage& st = *r->storage;
  // Shared memory this process owns is freed in the storage (MADV_REMOVE: the file's pages);
  // private copies and a fork child's view of the parent's shared memory only leave this
  // mapping. Device-DAX memory stays (caps: decommit_frees_memory = 0).
  bool remove = mapped_shared(*r) && !r->inherited && caps_.decommit_frees_memory && r->owns_range;
  int e = remove ? os::prim::advise_remove(addr, len) : EINVAL;
  if (e) e = os::prim::advise_dontneed(addr, len);
  if (e) return device_failure(err, CXLPOOL_E_OS, e, "madvise(DONTNEED)");
  uint64_t off = r->offset + (a - r->addr);
  // Splitting the mapping past the budget: the pages are freed (above), the range stays
  // accessible and committed.
  const int64_t vmas = vma_delta(*r, off, off + len, false);
  if (!vma_room_for(vmas)) return device_failure(err, CXLPOOL_E_BUSY, 0, "VMA budget", uint64_t(vma_budget()));
  if ((e = os::prim::protect(addr, len, false))) return device_failure(err, CXLPOOL_E_OS, e, "mprotect(NONE)");
  // Sampled pages in the range are the owner's again, PROT_NONE as it wants them: the sample
  // monitor must not make them accessible at the end of its period.
  os::sample_trap::forget(reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + len);
  r->vmas += vmas;
  g_vmas.fetch_add(vmas, std::memory_order_relaxed);
  uint64_t removed = 0;
  try {
    removed = st.committed.erase(off, off + len);
  } catch (...) {
    removed = 0;  // the range stays counted; only accounting is conservative
  }
  account(st, 0, removed, client);
  return CXLPOOL_OK;
}

bool Device::replace_lost(Reservation& r, const Lost& x) noexcept {
  // Piece by piece, each in one mmap: committed pages readable and writable from the instant
  // they change (a thread writing there meanwhile never meets a page of no access), the rest
  // inaccessible as before. The mapping is split in up to three (before, the replacement,
  // after) and each piece is a mapping of its own: counted, never refused (the old memory must
  // not stay reachable).
  const uint64_t lo = r.offset + (x.addr - r.addr), hi = lo + x.len;
  int64_t vmas = 2;
  bool ok = true;
  auto replace = [&](uint64_t a, uint64_t b, bool read_write) {
    ++vmas;
    if (os::prim::map_anonymous_fixed(reinterpret_cast<void*>(r.addr + (a - r.offset)), b - a, false, read_write))
      ok = false;
  };
  const IntervalSet& committed = r.storage->committed;
  committed.for_each_in(lo, hi, [&](uint64_t a, uint64_t b) { replace(a, b, true); });
  committed.for_each_gap(lo, hi, [&](uint64_t a, uint64_t b) { replace(a, b, false); });
  os::sample_trap::forget(x.addr, x.addr + x.len);
  r.vmas += vmas;
  g_vmas.fetch_add(vmas, std::memory_order_relaxed);
  return ok;
}

cxlpool_status_t Device::release(void* addr, int client, DeviceError* err) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  wait_unless_moving(lock, addr);
  auto it = reservations_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == reservations_.end()) return device_failure(err, CXLPOOL_E_NOT_FOUND, 0, "release");
  Reservation r = it->second;
  Storage& st = *r.storage;
  uint64_t removed = 0;
  try {
    if (r.owns_range) {
      if (st.committed.covered(r.offset, r.offset + r.size)) {
        bool remove = mapped_shared(r) && !r.inherited && caps_.decommit_frees_memory;
        if (remove) os::prim::advise_remove(addr, r.size);
      }
      removed = st.committed.erase(r.offset, r.offset + r.size);
    } else {
      // A mapping of a device range: keep the data, forget offsets that no other live
      // reservation of the same storage still covers.
      IntervalSet orphaned;
      orphaned.insert(r.offset, r.offset + r.size);
      for (auto& [x, other] : reservations_)
        if (x != r.addr && other.storage.get() == &st) orphaned.erase(other.offset, other.offset + other.size);
      orphaned.for_each([&](uint64_t lo, uint64_t hi) { removed += st.committed.erase(lo, hi); });
    }
  } catch (...) {
  }
  account(st, 0, removed, client);
  os::prim::unmap(addr, r.span);
  g_vmas.fetch_sub(r.vmas, std::memory_order_relaxed);
  if (r.owns_range) {
    if (!st.anonymous()) st.give_back_range(r.offset, r.size);
    reserved_bytes_ -= r.size;
  }
  reservations_.erase(it);
  return CXLPOOL_OK;
}

cxlpool_status_t Device::offset_of(const void* addr, uint64_t* out) const noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const Reservation* r = find_const(addr);
  if (!r) return CXLPOOL_E_NOT_FOUND;
  *out = r->offset + (reinterpret_cast<uintptr_t>(addr) - r->addr);
  return CXLPOOL_OK;
}

int Device::shared_fd() {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Storage> st;
  DeviceError err;
  if (storage_for(Sharing::kShared, st, &err)) fail(err.status, tls_message);
  return st->fd();
}

size_t Device::reservations_of(int client) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& [a, r] : reservations_) n += r.client == client && !r.arriving;
  return n;
}

uint64_t Device::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_bytes_;
}

size_t Device::reservation_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& [a, r] : reservations_) n += !r.arriving;
  return n;
}

std::string Device::describe(const char* op, const void* addr, size_t len, const DeviceError& err) const {
  std::string where = std::string(op) + "(" + hex(addr) + ", " + std::to_string(len) + "): device '" + name() + "'";
  // Capacity changes say what was wrong in their own words (the call names it).
  if (std::strncmp(err.call, "withdraw", 8) == 0 || std::strncmp(err.call, "add extent", 10) == 0) {
    std::string text = where + ": " + err.call;
    if (err.status == CXLPOOL_E_CAPACITY) text += " (" + format_bytes(err.detail) + ")";
    if (err.os_errno) text += std::string(": ") + std::strerror(err.os_errno);
    return text;
  }
  switch (err.status) {
    case CXLPOOL_E_INVALID_ARGUMENT:
      return where + " needs a non-empty range aligned to its page size " + std::to_string(caps_.page_size) +
             " (and a power-of-two alignment)";
    case CXLPOOL_E_NOT_FOUND:
      return where + ": range is not inside one reservation";
    case CXLPOOL_E_CAPACITY:
      if (std::strcmp(err.call, "device range") == 0)
        return where + ": no free device range of that size (largest free: " + format_bytes(err.detail) + " of " +
               format_bytes(capacity()) + ")";
      if (std::strcmp(err.call, "capacity") == 0)
        return where + ": committing it would exceed the capacity (" + format_bytes(err.detail) + " of " +
               format_bytes(capacity()) + " committed)";
      if (std::strcmp(err.call, "capacity: the range was released") == 0)
        return where +
               ": its device range was taken away by a forced release (its memory is gone; the "
               "addresses stay valid until freed)";
      if (std::strcmp(err.call, "move: target capacity") == 0)
        return where + ": the target device has no room for its committed bytes (its capacity is taken)";
      if (std::strcmp(err.call, "move: target offsets") == 0)
        return where + ": the target device has no free device range of that size";
      if (std::strcmp(err.call, "map past the end") == 0)
        return where + ": range is not online device capacity (past the end, or an extent withdrawn): capacity " +
               std::to_string(capacity());
      if (std::strcmp(err.call, "VMA budget") == 0)
        return where + ": moving it needs a staging mapping past cxlpool's mapping budget of " +
               std::to_string(err.detail) + " (half of vm.max_map_count)";
      if (std::strcmp(err.call, "mbind(MPOL_MF_MOVE)") == 0)
        return where + ": the target NUMA node has no room for its pages (move_pages: " + std::strerror(err.os_errno) +
               "); the move was undone";
      return where + ": the filesystem holding it is full (" + err.call + ": " + std::strerror(err.os_errno) +
             (caps_.page_size > size_t(os::page_size()) ? "; or no free huge page" : "") + ")";
    case CXLPOOL_E_NOT_SUPPORTED:
      // Moves say why in their own words (the call names the reason).
      if (std::strncmp(err.call, "move", 4) == 0) return where + ": " + err.call;
      return where + ": needs a shareable backing; numa memory is private anonymous memory";
    case CXLPOOL_E_BUSY:
      if (std::strcmp(err.call, "VMA budget") == 0)
        return where + ": cxlpool's mappings would exceed their budget of " + std::to_string(err.detail) +
               " (half of vm.max_map_count); the pages were freed, the range stays committed";
      break;
    default:
      break;
  }
  if (std::strcmp(err.call, "opening storage") == 0 || std::strcmp(err.call, "devdax descriptor") == 0)
    return tls_message;
  return where + ": " + err.call + ": " + (err.os_errno ? std::strerror(err.os_errno) : "failed");
}

bool Device::fork_needs_copy() const noexcept {
  if (fork_mode_ != ForkMode::kCopy) return false;
  for (auto& [a, r] : reservations_)
    if (r.sharing == Sharing::kPrivate && !r.storage->anonymous() &&
        r.storage->committed.covered(r.offset, r.offset + r.size))
      return true;
  return false;
}

int Device::copy_to_fresh(Reservation& r, const std::shared_ptr<Storage>& fresh) noexcept {
  Storage& old = *r.storage;
  // Copy every committed range into the fresh storage at the same offsets, then map the
  // fresh storage over the whole reservation.
  int e = 0;
  try {
    IntervalSet committed = committed_in(r);
    // In the kernel where both are files (no page faults on either side); through our
    // mapping where the source cannot be read as a file (device-DAX, a descriptor the
    // program took away).
    int in_fd = provider_->device_node ? -1 : old.valid_fd();
    committed.for_each([&](uint64_t lo, uint64_t hi) {
      if (e) return;
      if (in_fd >= 0) {
        e = os::prim::copy_range(in_fd, fresh->fd(), lo, hi - lo);
        if (!e) return;
        in_fd = -1;  // not between these two: copy through the mapping from here on
      }
      e = os::prim::pwrite_all(fresh->fd(), reinterpret_cast<void*>(r.addr + (lo - r.offset)), hi - lo, lo);
    });
    if (e) return e;
    if ((e = fresh->map(reinterpret_cast<void*>(r.addr), r.size, r.offset, true))) return e;
    committed.for_each([&](uint64_t lo, uint64_t hi) {
      if (!e) e = os::prim::protect(reinterpret_cast<void*>(r.addr + (lo - r.offset)), hi - lo, true);
      if (!e) {
        fresh->committed.insert(lo, hi);
        old.committed.erase(lo, hi);
      }
    });
  } catch (...) {
    return ENOMEM;
  }
  if (!e && !fresh->take_exact(r.offset, r.size)) e = ENOMEM;
  r.storage = fresh;
  return e;
}

int Device::copy_to_anonymous(Reservation& r, const std::shared_ptr<Storage>& anon) noexcept {
  Storage& old = *r.storage;
  int e = 0;
  try {
    IntervalSet committed = committed_in(r);
    IntervalSet gaps;
    gaps.insert(r.offset, r.offset + r.size);
    committed.for_each([&](uint64_t lo, uint64_t hi) { gaps.erase(lo, hi); });
    // Uncommitted parts become private anonymous address space (what a later commit gets);
    // committed parts are copied into private memory that replaces them in place.
    gaps.for_each([&](uint64_t lo, uint64_t hi) {
      if (!e) e = os::prim::map_anonymous_fixed(reinterpret_cast<void*>(r.addr + (lo - r.offset)), hi - lo, false);
    });
    committed.for_each([&](uint64_t lo, uint64_t hi) {
      if (!e) e = os::prim::replace_with_private_copy(reinterpret_cast<void*>(r.addr + (lo - r.offset)), hi - lo);
      if (!e) {
        anon->committed.insert(r.addr + (lo - r.offset), r.addr + (hi - r.offset));  // keyed by address
        old.committed.erase(lo, hi);
      }
    });
  } catch (...) {
    return ENOMEM;
  }
  r.offset = r.addr;
  r.storage = anon;
  r.owns_range = true;
  return e;
}

IntervalSet Device::committed_in(const Reservation& r) const {
  IntervalSet mine;
  mine.insert(r.offset, r.offset + r.size);
  IntervalSet gaps = mine;
  r.storage->committed.for_each([&](uint64_t lo, uint64_t hi) { gaps.erase(lo, hi); });
  gaps.for_each([&](uint64_t lo, uint64_t hi) { mine.erase(lo, hi); });
  return mine;
}

bool Device::child_after_fork(char* message, size_t message_size) noexcept {
  forked_child_ = true;
  // A withdrawal the parent had in progress: its thread is not here to end it.
  if (withdrawing_.hi > withdrawing_.lo) cancel_withdraw_locked();
  // Threads that waited on it in the parent do not exist here.
  new (&moved_) std::condition_variable();
  claim_.reset();  // the name stays the parent's; what the child maps from here is its own
  // One fresh storage per storage the parent keeps (their offsets would collide in one),
  // or private anonymous memory when none can be opened.
  std::pair<Storage*, std::shared_ptr<Storage>> fresh_for[8];
  size_t nfresh = 0;
  std::shared_ptr<Storage> anon;
  for (auto& [a, r] : reservations_) {
    if (r.sharing == Sharing::kShared) {
      r.inherited = true;  // the parent's memory as much as ours: never free it in the storage
      continue;
    }
    if (fork_mode_ != ForkMode::kCopy || r.storage->anonymous()) continue;  // kernel copy-on-write
    std::shared_ptr<Storage> target;
    for (size_t i = 0; i < nfresh; ++i)
      if (fresh_for[i].first == r.storage.get()) target = fresh_for[i].second;
    if (!target) {
      try {
        target = Storage::create(spec_, /*fork_copy=*/true);
        if (conform(*target)) target.reset();  // the file cannot take the device's length
      } catch (const std::exception&) {
      }
      if (!target) {
        if (!anon) anon = Storage::anonymous_copy();  // no descriptor, no space: DRAM
        target = anon;
      }
      if (!target) {
        std::snprintf(message, message_size, "device '%s': no memory for the child's copy", spec_.device_name.c_str());
        return false;
      }
      if (nfresh < 8 && target != anon) fresh_for[nfresh++] = {r.storage.get(), target};
    }
    Storage* old = r.storage.get();
    int e = target->anonymous() ? copy_to_anonymous(r, target) : copy_to_fresh(r, target);
    if ((e == ENOSPC || e == EDQUOT || e == EFBIG || e == EINVAL) && r.storage.get() == old) {
      // The fresh storage's filesystem filled up during the copy, or takes no write(2)
      // (hugetlbfs: EINVAL); the copy changed nothing of the range: it goes to private memory,
      // as when no storage can be opened.
      if (!anon) anon = Storage::anonymous_copy();
      if (anon) e = copy_to_anonymous(r, anon);
      target = anon;
    }
    if (e) {
      std::snprintf(message, message_size, "device '%s': copying %zu bytes for the child failed: %s",
                    spec_.device_name.c_str(), r.size, std::strerror(e));
      return false;
    }
    if (old == private_storage_.get() && !target->anonymous()) private_storage_ = target;
  }
  // New reservations in the child never share a storage with the parent: the parent keeps
  // using its storages and may write any offset the child would consider free.
  if (shared_storage_) shared_storage_->retire();
  if (fork_mode_ == ForkMode::kCopy && private_storage_ && private_storage_->retired() == false) {
    bool fresh = false;
    for (size_t i = 0; i < nfresh; ++i) fresh |= fresh_for[i].second == private_storage_;
    if (!fresh) private_storage_->retire();
  }
  if (provider_->device_node && private_storage_ && !private_storage_->retired()) shared_storage_ = private_storage_;
  return true;
}

}  // namespace cxlpool::detail

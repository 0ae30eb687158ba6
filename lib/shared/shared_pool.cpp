// SPDX-License-Identifier: MIT
// SharedPool lifecycle: creating a pool (formed completely before it gets its name), opening
// one (validated before anything is written), joining a slot, the heartbeat thread, leaving.
#include "shared/shared_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <system_error>
#include <thread>

#include "common/error.hpp"
#include "os/os.hpp"
#include "os/own_threads.hpp"
#include "os/prim.hpp"
#include "shared/fork_quiesce.hpp"

namespace cxlpool::detail::shared {

using detail::fail;

namespace {

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The pools open in this process, for cxlpool_publish/acquire. Registered after a pool is
// fully set up and removed before it is torn down; lookups take the lock shared. Made on
// first use (the interposer may open a pool before this library's constructors ran) and never
// destroyed (a pool may close on a thread of ours while the program's exit runs destructors).
std::shared_mutex g_open_mu;
std::vector<SharedPool*>* g_open = nullptr;  // (g_open_mu)

std::string pool_what(const std::string& device) { return "shared pool \"" + device + "\""; }

}  // namespace

namespace {
bool in_open_pool(const void* p, size_t len, bool publishing) {
  std::shared_lock<std::shared_mutex> lock(g_open_mu);
  if (!g_open) return false;
  for (SharedPool* pool : *g_open)
    if (publishing ? pool->publish(p, len) : pool->acquire(p, len)) return true;
  return false;
}
}  // namespace

bool publish_in_open_pool(const void* p, size_t len) { return in_open_pool(p, len, true); }
bool acquire_in_open_pool(const void* p, size_t len) { return in_open_pool(p, len, false); }

std::byte* SharedPool::user_ptr(uint64_t offset) const {
  if (nc_view_) return nc_view_->view() + (offset - view_.sb().data_offset);
  return view_.base() + offset;
}

bool SharedPool::user_offset(const void* p, uint64_t* offset) const {
  const auto* b = static_cast<const std::byte*>(p);
  if (nc_view_) {
    if (!nc_view_->contains(p, 1)) return false;
    *offset = view_.sb().data_offset + static_cast<uint64_t>(b - nc_view_->view());
    return true;
  }
  if (b < view_.base() || b >= view_.base() + view_.size()) return false;
  *offset = static_cast<uint64_t>(b - view_.base());
  return true;
}

bool SharedPool::publish(const void* p, size_t len) { return lines(p, len, true); }
bool SharedPool::acquire(const void* p, size_t len) { return lines(p, len, false); }

// publish (write back) or acquire (write back dirty, then reload) the lines of [p, p+len).
bool SharedPool::lines(const void* p, size_t len, bool publishing) {
  uint64_t off = 0;
  if (!user_offset(p, &off)) return false;
  if (in_fork_child()) return true;  // an abandoned copy: its memory is gone
  if (nc_view_) {
    std::lock_guard<std::mutex> lock(nc_mu_);
    const uint64_t begin = off - view_.sb().data_offset;
    const uint64_t n = std::min<uint64_t>(len, nc_view_->size() - begin);
    if (publishing)
      nc_view_->publish(begin, n);
    else
      nc_view_->acquire(begin, n);
  } else if (view_.noncoherent()) {
    if (publishing)
      writeback_lines(p, len);
    else
      invalidate_lines(p, len);
  }
  return true;
}

void SharedPool::extent_lines_handover(uint64_t first, uint32_t count) {
  const uint64_t len = uint64_t{count} * view_.extent_size();
  if (nc_view_) {
    std::lock_guard<std::mutex> lock(nc_mu_);
    nc_view_->acquire(first * view_.extent_size(), len);  // write back what is dirty, reload the rest
  } else if (view_.noncoherent()) {
    invalidate_lines(view_.base() + view_.extent_offset(first), len);
  }
}

Superblock plan_superblock(const SharedParams& p, uint64_t device_size) {
  auto bad = [](const std::string& why) { fail(CXLPOOL_E_CONFIG, "shared pool parameters: " + why); };
  if (p.size == 0) bad("size not set (cxlpool_shared_params_set_size)");
  if (p.size > device_size)
    bad("size " + std::to_string(p.size) + " exceeds the device's " + std::to_string(device_size));
  const uint64_t slots = uint64_t{p.hosts} * p.per_host;
  Superblock sb{};
  std::memcpy(sb.magic, kMagic, sizeof kMagic);
  sb.layout_version = kLayoutVersion;
  sb.state = kStateReady;
  os::random_bytes(sb.pool_id, sizeof sb.pool_id);
  sb.size = p.size;
  sb.created_ns = os::realtime_ns();
  sb.coherence = (!p.coherence_set && p.hosts > 1) ? CXLPOOL_COHERENCE_NONE : p.coherence;
  sb.hosts = p.hosts;
  sb.slots_per_host = p.per_host;
  sb.lease_entries = p.leases;
  sb.extent_size = p.extent_size;
  sb.heartbeat_ms = p.heartbeat_ms;
  sb.lease_timeout_ms = p.lease_timeout_ms;
  if (p.stopped_timeout_ms != 0 && p.stopped_timeout_ms != kStoppedNever &&
      p.stopped_timeout_ms < 3 * uint64_t{p.heartbeat_ms})
    bad("stopped timeout " + std::to_string(p.stopped_timeout_ms) + " ms is shorter than 3 heartbeats (" +
        std::to_string(3 * uint64_t{p.heartbeat_ms}) + " ms)");
  sb.stopped_timeout_ms = p.stopped_timeout_ms;
  sb.mode = p.mode;
  sb.slots_offset = kSuperblockBytes;
  sb.leases_offset = round_up(sb.slots_offset + slots * kSlotBytes, 4096);
  sb.extents_offset = round_up(sb.leases_offset + slots * p.leases * kLeaseEntryBytes, 4096);
  const uint64_t e = p.extent_size;
  uint64_t n = p.size > sb.extents_offset ? (p.size - sb.extents_offset) / (e + kExtentEntryBytes) : 0;
  while (n > 0 && round_up(sb.extents_offset + n * kExtentEntryBytes, e) + n * e > p.size) --n;
  if (n == 0)
    fail(CXLPOOL_E_CAPACITY, "shared pool of " + std::to_string(p.size) + " bytes holds no " + std::to_string(e) +
                                 "-byte extent after its metadata (" + std::to_string(sb.extents_offset) +
                                 " bytes); make it larger or the extent smaller");
  if (n > (1u << 24)) n = 1u << 24;
  sb.extent_count = n;
  sb.data_offset = round_up(sb.extents_offset + n * kExtentEntryBytes, e);
  uint32_t count = 0;
  for (uint64_t s = kMinBlock; s <= e / 4 && count < kMaxClasses && count < 63;) {
    sb.class_size[count++] = static_cast<uint32_t>(s);
    s = std::max(s + kMinBlock, round_up(s + s / 4, kMinBlock));
  }
  sb.class_count = count;
  // Quotas: each named one reserves whole extents; "default" (quota 0) gets the rest.
  if (p.quotas.size() + 1 > kMaxQuotas)
    bad(std::to_string(p.quotas.size()) + " quotas; at most " + std::to_string(kMaxQuotas - 1) +
        " besides \"default\"");
  uint64_t reserved = 0;
  sb.quota_count = static_cast<uint32_t>(p.quotas.size() + 1);
  std::strcpy(sb.quotas[0].name, "default");
  for (size_t i = 0; i < p.quotas.size(); ++i) {
    const auto& [name, bytes] = p.quotas[i];
    const uint64_t extents = bytes / e;
    if (extents == 0)
      bad("quota \"" + name + "\" of " + std::to_string(bytes) + " bytes is smaller than one " + std::to_string(e) +
          "-byte extent");
    std::strncpy(sb.quotas[i + 1].name, name.c_str(), sizeof sb.quotas[i + 1].name - 1);
    sb.quotas[i + 1].max_extents = extents;
    reserved += extents;
  }
  if (reserved > n) bad("quotas reserve " + std::to_string(reserved) + " extents; the pool has " + std::to_string(n));
  sb.quotas[0].max_extents = n - reserved;
  if (p.failure_domain.empty() || p.failure_domain.size() >= sizeof sb.failure_domain)
    bad("failure domain \"" + p.failure_domain + "\": need 1-31 characters");
  std::strncpy(sb.failure_domain, p.failure_domain.c_str(), sizeof sb.failure_domain - 1);
  sb.checksum = crc32c(&sb, offsetof(Superblock, checksum));
  return sb;
}

namespace {

// A mapping of a pool, unmapped with this unless taken (the pool owns it once made).
struct Mapped {
  std::byte* base = nullptr;
  uint64_t size = 0;
  Mapped() = default;
  Mapped(Mapped&& o) noexcept : base(std::exchange(o.base, nullptr)), size(o.size) {}
  Mapped& operator=(Mapped&& o) noexcept {
    std::swap(base, o.base);
    std::swap(size, o.size);
    return *this;
  }
  ~Mapped() {
    if (base) os::unmap(base, size);
  }
  std::byte* release() noexcept { return std::exchange(base, nullptr); }
};

// Maps [0, size) of fd; devdax needs 2 MiB multiples.
Mapped map_pool(int fd, uint64_t size, bool devdax, const std::string& what) {
  Mapped m;
  m.size = devdax ? round_up(size, 2u << 20) : size;  // what is mapped (and unmapped)
  m.base = static_cast<std::byte*>(os::map_shared_fd(fd, m.size, 0, what));
  return m;
}

// Reads and validates the superblock of an open pool file/device, then maps the whole pool.
Mapped map_existing(int fd, bool devdax, const std::string& what, Superblock* sb) {
  const uint64_t device_size = devdax ? 0 : os::fd_size(fd);
  if (!devdax && device_size < kSuperblockBytes) fail(CXLPOOL_E_CORRUPT, what + ": too small to be a shared pool");
  const uint64_t head_len = devdax ? (2u << 20) : kSuperblockBytes;
  void* head = os::map_shared_fd(fd, head_len, 0, what);
  try {
    *sb = PoolView::validate(head, devdax ? UINT64_MAX : device_size, what);
  } catch (...) {
    os::unmap(head, head_len);
    throw;
  }
  os::unmap(head, head_len);
  return map_pool(fd, sb->size, devdax, what);
}

}  // namespace

std::unique_ptr<SharedPool> SharedPool::create(const std::string& device, const SharedParams& params, unsigned flags) {
  const PoolLocation loc = locate_pool(device);
  // In the registry first: a private device of this process on the object refuses it (BUSY).
  std::shared_ptr<registry::SharedDevice> registered = registry::add_shared(loc.spec, loc.path, 0);
  const std::string what = pool_what(device);
  if (flags & ~unsigned{CXLPOOL_SHARED_FORMAT_DEVICE})
    fail(CXLPOOL_E_INVALID_ARGUMENT, "cxlpool_shared_pool_create: unknown flags " + std::to_string(flags));
  Mapped m;
  Superblock sb{};
  os::PathIdentity identity{};
  os::NewFileSite site;
  SharedObject obj = loc.ops->create(loc.spec, params.mode, what, &site);
  if (obj.device_node) {
    void* head = os::map_shared_fd(obj.fd, 2u << 20, 0, what);
    const bool has_magic = std::memcmp(head, kMagic, sizeof kMagic) == 0;
    const auto* old = static_cast<const Superblock*>(head);
    const bool incomplete = has_magic && old->state == kStateCreating;
    os::unmap(head, 2u << 20);
    if (has_magic && !incomplete)
      fail(CXLPOOL_E_EXISTS, what + ": the device already holds a cxlpool shared pool; open it instead");
    if (!(flags & CXLPOOL_SHARED_FORMAT_DEVICE))
      fail(CXLPOOL_E_EXISTS, what +
                                 ": the device carries no cxlpool header; formatting destroys its contents, so "
                                 "it needs CXLPOOL_SHARED_FORMAT_DEVICE");
    sb = plan_superblock(params, UINT64_MAX);
    m = map_pool(obj.fd, sb.size, true, what);
    Superblock creating = sb;
    creating.state = kStateCreating;
    creating.checksum = crc32c(&creating, offsetof(Superblock, checksum));
    std::memcpy(m.base, &creating, sizeof creating);
    writeback_lines(m.base, sizeof creating);
    std::memset(m.base + kSuperblockBytes, 0, sb.data_offset - kSuperblockBytes);
    writeback_lines(m.base + kSuperblockBytes, sb.data_offset - kSuperblockBytes);
    // Never granted, no policy, no key: the quotas as created.
    std::memset(m.base + kGrantOffset, 0, 4 * kLine);
    writeback_lines(m.base + kGrantOffset, 4 * kLine);
    full_fence();
    std::memcpy(m.base, &sb, sizeof sb);
    std::memcpy(m.base + kSuperblockCopyOffset, &sb, sizeof sb);
    writeback_lines(m.base, kSuperblockCopyOffset + sizeof sb);
    full_fence();
  } else {
    sb = plan_superblock(params, UINT64_MAX);
    os::truncate_fd(obj.fd, sb.size);
    os::allocate_file(obj.fd, sb.size, what);
    m = map_pool(obj.fd, sb.size, false, what);
    std::memcpy(m.base, &sb, sizeof sb);  // the rest of a new file reads as zeros: all free
    std::memcpy(m.base + kSuperblockCopyOffset, &sb, sizeof sb);
  }
  loc.ops->publish(&obj, &site, what);
  identity = os::fd_identity(obj.fd);
  std::unique_ptr<SharedPool> pool(new SharedPool(m.base, m.size, sb, what, &params));
  m.release();  // the pool unmaps it now
  pool->hold_device(loc, identity, &obj, std::move(registered));
  pool->join(&params);
  return pool;
}

std::unique_ptr<SharedPool> SharedPool::open(const std::string& device, const SharedParams* params) {
  const PoolLocation loc = locate_pool(device);
  // In the registry first: a private device of this process on the object refuses it (BUSY).
  std::shared_ptr<registry::SharedDevice> registered = registry::add_shared(loc.spec, loc.path, 0);
  const std::string what = pool_what(device);
  SharedObject obj = loc.ops->open(loc.spec, true, what);
  Mapped m;
  Superblock sb{};
  os::PathIdentity identity{};
  m = map_existing(obj.fd, obj.device_node, what, &sb);
  if (!obj.device_node) os::fill_holes(obj.fd, sb.size, what);
  identity = os::fd_identity(obj.fd);
  std::unique_ptr<SharedPool> pool(new SharedPool(m.base, m.size, sb, what, params));
  m.release();  // the pool unmaps it now
  pool->hold_device(loc, identity, &obj, std::move(registered));
  pool->join(params);
  return pool;
}

MappedPool map_pool_unjoined(const std::string& device) {
  const PoolLocation loc = locate_pool(device);
  const std::string what = pool_what(device);
  SharedObject obj = loc.ops->open(loc.spec, true, what);
  MappedPool out;
  Mapped m = map_existing(obj.fd, obj.device_node, what, &out.sb);
  out.size = m.size;
  out.base = m.release();
  return out;
}

void unmap_pool(const MappedPool& m) { os::unmap(m.base, m.size); }

void SharedPool::unlink(const std::string& device) {
  const PoolLocation loc = locate_pool(device);
  const std::string what = pool_what(device);
  if (loc.device_node) fail(CXLPOOL_E_NOT_SUPPORTED, what + ": a device has no name to remove");
  SharedObject obj = loc.ops->open(loc.spec, true, what);
  Superblock sb{};
  map_existing(obj.fd, false, what, &sb);  // refuses anything that is not our pool
  const os::PathIdentity identity = os::fd_identity(obj.fd);
  loc.ops->remove(loc.spec, identity, what);
}

void SharedPool::hold_device(const PoolLocation& loc, const os::PathIdentity& identity, SharedObject* obj,
                             std::shared_ptr<registry::SharedDevice> device) {
  device_ = std::move(device);
  device_->ledger.capacity.store(view_.sb().size, std::memory_order_relaxed);
  path_ = loc.path;
  identity_ = identity;
  check_path_ = true;
  devdax_ = loc.device_node;
  // A file's descriptor closes with obj: the mapping keeps the memory, and there is no
  // descriptor for a program to close. A device node stays open for its flock(LOCK_SH): no
  // private device takes it while the pool is in use here. Kept high and identity-checked,
  // like a device's storage descriptor.
  if (!obj->device_node) return;
  device_fd_ = os::prim::move_fd_high(obj->release());
  os::prim::file_id(device_fd_, &device_fd_id_);
}

SharedPool::SharedPool(std::byte* base, uint64_t size, const Superblock& sb, std::string what,
                       const SharedParams* params)
    : what_(std::move(what)), view_(base, size, sb) {
  timeout_ns_ = uint64_t{sb.lease_timeout_ms} * 1000000u;
  heartbeat_ns_ = uint64_t{sb.heartbeat_ms} * 1000000u;
  const uint32_t stopped_ms = sb.stopped_timeout_ms == 0 ? kDefaultStoppedTimeoutMs : sb.stopped_timeout_ms;
  stopped_ns_ = stopped_ms == kStoppedNever ? 0 : uint64_t{stopped_ms} * 1000000u;
  partial_.resize(sb.class_count);
  cache_.resize(sb.class_count);
  cache_extent_.assign(sb.class_count, UINT64_MAX);
  idle_ticks_.assign(sb.class_count, 0);
  owned_.resize(sb.extent_count);
  seen_.resize(view_.slot_count());
  if (params && params->noncoherent_view) {
    if (sb.coherence != CXLPOOL_COHERENCE_NONE)
      fail(CXLPOOL_E_CONFIG, what_ + ": a non-coherent view emulates coherence none; this pool's coherence is " +
                                 (sb.coherence == CXLPOOL_COHERENCE_HOST ? "host" : "fabric"));
    NoncoherentOptions options;
    options.evict_per_call = params->view_evict_per_call;
    nc_view_ = std::make_unique<NoncoherentView>(base + sb.data_offset, sb.extent_count * sb.extent_size,
                                                 params->view_seed, options);
  }
}

SharedPool::~SharedPool() {
  try {
    leave();
  } catch (...) {  // leaving is best effort in a destructor; survivors recover what is left
  }
  stop_threads();
  in_use_sub(bytes_in_use_);  // what this process held in the pool is the survivors' to recover now
  {
    std::unique_lock<std::shared_mutex> lock(g_open_mu);
    if (g_open) g_open->erase(std::remove(g_open->begin(), g_open->end(), this), g_open->end());
  }
  nc_view_.reset();
  const uint64_t len = view_.size();
  os::unmap(view_.base(), len);
  os::prim::FileId now;
  if (device_fd_ >= 0 && os::prim::file_id(device_fd_, &now) == 0 && now == device_fd_id_)
    os::prim::close_fd(device_fd_);
}

void SharedPool::in_use_add(uint64_t bytes) noexcept {
  bytes_in_use_ += bytes;
  if (!device_) return;
  Ledger& l = device_->ledger;
  const uint64_t now = l.committed.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  uint64_t peak = l.peak.load(std::memory_order_relaxed);
  while (now > peak && !l.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void SharedPool::in_use_sub(uint64_t bytes) noexcept {
  bytes = std::min(bytes, bytes_in_use_);
  bytes_in_use_ -= bytes;
  if (device_) device_->ledger.committed.fetch_sub(bytes, std::memory_order_relaxed);
}

void SharedPool::join(const SharedParams* params) {
  const uint32_t host = params ? params->host_index : 0;
  const Superblock& sb = view_.sb();
  if (host >= sb.hosts)
    fail(CXLPOOL_E_INVALID_ARGUMENT,
         what_ + ": host index " + std::to_string(host) + " but the pool has " + std::to_string(sb.hosts) + " host(s)");
  pid_ = os::prim::process_id();
  fork_generation_ = os::fork_generation();
  boot_hash_ = os::boot_id_hash();
  pidns_ = os::pid_namespace_id();
  const std::string quota = params && !params->quota.empty() ? params->quota : "default";
  quota_ = sb.quota_count;
  std::string known;
  for (uint32_t q = 0; q < sb.quota_count; ++q) {
    if (quota == sb.quotas[q].name) quota_ = q;
    known += std::string(q ? ", " : "") + sb.quotas[q].name;
  }
  if (quota_ == sb.quota_count)
    fail(CXLPOOL_E_CONFIG, what_ + ": no quota named \"" + quota + "\" (the pool has: " + known + ")");
  check_quota_key(quota, params ? params->quota_key : std::string());
  // The heartbeat thread first: its id and start time are facts observers judge us by, written
  // together with the others right after the slot is ours.
  start_beat_thread();
  try {
    join_slot(host);
  } catch (...) {
    stop_threads();
    throw;
  }
}

// A locked quota is joined only with its key (layout.hpp, kKeyOffset): from params, else from
// CXLPOOL_QUOTA_KEY (what a container's CDI spec sets, docs/compose.md "Containers").
void SharedPool::check_quota_key(const std::string& quota, const std::string& given) {
  const uint64_t word = view_.load(view_.key_word(quota_));
  bool set = false;
  if (!key_word_valid(word, quota_, view_.salt(), &set))
    fail(CXLPOOL_E_CORRUPT, what_ + ": quota \"" + quota +
                                "\" is locked by a key word that fails its check; lock it again with a new key "
                                "(cxlpool-compose lock) and hand the new key to its programs");
  if (!set) return;
  tenant_ = quota_ != 0;
  const char* env = os::env_value("CXLPOOL_QUOTA_KEY");
  const std::string text = !given.empty() ? given : env ? env : "";
  const char* from = !given.empty() ? "the key given" : "CXLPOOL_QUOTA_KEY";
  if (text.empty())
    fail(CXLPOOL_E_PERMISSION, what_ + ": quota \"" + quota +
                                   "\" is locked: this program was not given its key (cxlpool_shared_params_set_"
                                   "quota_key, or CXLPOOL_QUOTA_KEY, which a container's CDI spec sets; a key that "
                                   "is lost: cxlpool-compose reset-keys, with no program running)");
  unsigned char key[kKeyBytes];
  if (!parse_quota_key(text, key))
    fail(CXLPOOL_E_PERMISSION, what_ + ": " + from + " is not a quota key (32 hexadecimal digits)");
  if (encode_key(key, quota_, view_.salt()) != word)
    fail(CXLPOOL_E_PERMISSION, what_ + ": quota \"" + quota + "\" is locked and " + from +
                                   " is not its key (a key opens only the quota of the pool it was made for)");
}

void SharedPool::join_slot(uint32_t host) {
  const Superblock& sb = view_.sb();
  const uint64_t salt = view_.salt();
  for (uint32_t s = host * sb.slots_per_host; s < (host + 1) * sb.slots_per_host && !joined_; ++s) {
    uint64_t* word = view_.slot_word(s, 0, 0);
    uint64_t raw = view_.load(word);
    uint32_t inc = 0, evict_inc = 0;
    SlotState state{};
    EvictPhase phase{};
    if (!decode_slot_identity(raw, s, salt, &inc, &state)) {
      ++corrupt_words_;
      continue;
    }
    const bool recovered = view_.slot_eviction(s, &evict_inc, &phase) && phase == kEvictDone && evict_inc == inc;
    if (!(state == kSlotFree || (state != kSlotFree && recovered))) continue;
    uint64_t desired = encode_slot_identity(inc + 1, kSlotActive, s, salt);
    // Slots of one host are claimed by compare-and-swap: one host's caches are coherent.
    if (!__atomic_compare_exchange_n(word, &raw, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    if (view_.noncoherent()) writeback_lines(word, sizeof *word);
    slot_ = s;
    incarnation_ = inc + 1;
    joined_ = true;
  }
  if (!joined_) take_over_dead_slot(host);
  if (!joined_)
    fail(CXLPOOL_E_BUSY, what_ + ": all " + std::to_string(sb.slots_per_host) + " participant slots of host " +
                             std::to_string(host) + " are held by live participants");
  // The slot's previous incarnation left its leases and facts behind: clear the leases first,
  // then write the facts, then say whose they are. Until facts_incarnation names us, observers
  // judge us by the heartbeat alone and the checker ignores our lease table.
  SlotLine0* line = view_.slot_line0(slot_);
  beat_word_ = tagged(0);
  view_.store(&line->heartbeat, beat_word_);
  view_.store(view_.slot_word(slot_, 2, 0), 0);  // no claim
  view_.store(view_.slot_word(slot_, 2, 1), 0);
  view_.store(&view_.slot_counters(slot_)->demand, 0);  // no demand (compose.cpp)
  LeaseEntry* table = view_.lease_table(slot_);
  for (uint32_t i = 0; i < sb.lease_entries; ++i) {
    view_.store(&table[i].offset, 0);
    view_.store(&table[i].gen_check, 0);
  }
  view_.store(&line->pid, static_cast<uint64_t>(pid_));
  const uint64_t start = os::process_start_ticks(pid_);
  view_.store(&line->start_ticks, start == os::kStartUnknown ? 0 : start);  // 0: judged by heartbeat only
  view_.store(&line->boot_hash, boot_hash_);
  view_.store(&line->pidns, pidns_);
  view_.store(&line->host_index, host);
  view_.store(&line->op_seq, tagged(0));
  view_.store(&line->beat_tid, static_cast<uint64_t>(beat_tid_));
  view_.store(&line->beat_start_ticks, beat_start_);
  view_.store(&line->facts_incarnation, incarnation_);
  eviction_raw_ = view_.load(view_.slot_word(slot_, 1, 0));  // any change: the block cache stops serving
  last_beat_ns_ = os::coarse_now_ns();
  {
    std::unique_lock<std::shared_mutex> lock(g_open_mu);
    if (!g_open) g_open = new std::vector<SharedPool*>();
    g_open->push_back(this);
  }
  {
    std::lock_guard<std::mutex> lock(beat_wait_mu_);
    beat_go_.store(true);
  }
  beat_cv_.notify_all();
  start_watch_thread();
  if (predecessor_ != 0) recover_predecessor();
}

// Every slot of our host is taken. With nobody alive to recover them (every participant
// killed), the pool would be closed to everyone for good: a slot whose process is gone (this
// host), or silent for a lease (another host sharing our host index), is taken over by
// compare-and-swap; its previous incarnation is then recovered by us like any dead one.
void SharedPool::take_over_dead_slot(uint32_t host) {
  const Superblock& sb = view_.sb();
  const uint64_t salt = view_.salt();
  const uint32_t first = host * sb.slots_per_host, last = first + sb.slots_per_host;
  auto try_take = [&](uint32_t s, uint64_t raw, uint32_t inc) {
    const uint64_t desired = encode_slot_identity(inc + 1, kSlotActive, s, salt);
    uint64_t expected = raw;
    if (!__atomic_compare_exchange_n(view_.slot_word(s, 0, 0), &expected, desired, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
      return false;
    if (view_.noncoherent()) writeback_lines(view_.slot_word(s, 0, 0), sizeof(uint64_t));
    slot_ = s;
    incarnation_ = inc + 1;
    predecessor_ = inc;
    joined_ = true;
    return true;
  };
  std::vector<uint64_t> beats(view_.slot_count(), 0), idents(view_.slot_count(), 0);
  for (int pass = 0; pass < 2 && !joined_; ++pass) {
    if (pass == 1) {            // nobody gone on this host: look for silence over one lease
      bool candidates = false;  // slots held by processes this host can vouch for are not
      for (uint32_t s = first; s < last; ++s) {
        beats[s] = view_.load(&view_.slot_line0(s)->heartbeat);
        idents[s] = view_.load(view_.slot_word(s, 0, 0));
        uint32_t inc = 0;
        SlotState state{};
        candidates = candidates || !decode_slot_identity(idents[s], s, salt, &inc, &state) ||
                     (state != kSlotFree && peer_life(s, inc) == PeerLife::kUnverifiable);
      }
      if (!candidates) return;
      std::this_thread::sleep_for(std::chrono::nanoseconds(timeout_ns_ + 2 * heartbeat_ns_));
    }
    for (uint32_t s = first; s < last && !joined_; ++s) {
      const uint64_t raw = view_.load(view_.slot_word(s, 0, 0));
      uint32_t inc = 0;
      SlotState state{};
      if (!decode_slot_identity(raw, s, salt, &inc, &state)) {
        // Scribbled, and nobody repaired it (a live holder rewrites its own at every beat)
        // for a whole lease: take it with an incarnation its extents cannot match.
        if (pass == 1 && raw == idents[s]) try_take(s, raw, static_cast<uint32_t>(raw >> 32) + 0x10000u);
        continue;
      }
      if (state == kSlotFree) continue;
      // A process of this host that still exists, stopped or not, keeps its slot.
      const PeerLife life = peer_life(s, inc);
      const bool dead = pass == 0 ? life == PeerLife::kGone
                                  : life == PeerLife::kUnverifiable &&
                                        view_.load(&view_.slot_line0(s)->heartbeat) == beats[s] &&
                                        !may_be_in_operation(s, inc);
      if (dead) try_take(s, raw, inc);
    }
  }
}

void SharedPool::recover_predecessor() {
  // Someone may be recovering it already (it saw the death before we took the slot): then
  // our recover claim conflicts until that one finishes.
  const uint64_t deadline = os::monotonic_ns() + 2 * timeout_ns_ + 10 * heartbeat_ns_;
  for (;;) {
    {
      std::lock_guard<HeapLock> lock(mu_);
      if (evicted_.load()) return;
      Marked marked(*this);
      if (!marked.ok()) return;
      if (claim(kClaimRecover, slot_, predecessor_ & 0xffffff)) {
        view_.store(view_.slot_word(slot_, 1, 1), (uint64_t{incarnation_} << 32) | (slot_ + 1));
        view_.store(view_.slot_word(slot_, 1, 0), encode_eviction(predecessor_, kEvictRecovering, slot_, view_.salt()));
        PoolView::fence();
        recover_slot(slot_, predecessor_);
        view_.store(view_.slot_word(slot_, 1, 0), encode_eviction(predecessor_, kEvictDone, slot_, view_.salt()));
        unclaim();
        ++recovered_slots_;
        predecessor_ = 0;
        return;
      }
    }
    if (os::monotonic_ns() > deadline) return;  // the orphan sweep finishes it later
    std::this_thread::sleep_for(std::chrono::nanoseconds(heartbeat_ns_));
  }
}

void SharedPool::declare_failed(const std::string& reason) {
  if (in_fork_child()) ensure_usable();  // throws: the child's mu_ is a copy, maybe held
  {
    std::lock_guard<HeapLock> lock(mu_);
    if (failed_.load()) return;
    failure_reason_ = reason;
    failed_.store(true);
  }
  tell_loss();
}

namespace {
std::atomic<void (*)() noexcept> g_loss_listener{nullptr};
}  // namespace

void SharedPool::set_loss_listener(void (*listener)() noexcept) noexcept { g_loss_listener.store(listener); }

void SharedPool::tell_loss() noexcept {
  if (loss_told_.exchange(true)) return;
  if (auto f = g_loss_listener.load()) f();
}

bool SharedPool::lost_now() noexcept {
  if (failed_.load() || evicted_.load() || evict_seen_.load()) return true;
  if (!check_path_) return false;
  os::PathIdentity now{};
  if (device_problem(&now) == nullptr) return false;
  try {
    check_device();  // declares the failure, with its reason
  } catch (...) {
    // No memory for the reason, or a fork child: lost all the same.
  }
  return true;
}

// What is wrong with the device's name now, or nullptr: no allocation (the heartbeat thread asks).
const char* SharedPool::device_problem(os::PathIdentity* now) const noexcept {
  if (!check_path_) return nullptr;
  if (!os::path_identity(path_, now)) return "vanished";
  if (now->dev != identity_.dev || now->ino != identity_.ino) return "was replaced by another file or device";
  if (!devdax_ && now->size < view_.sb().size) return "was truncated";
  return nullptr;
}

void SharedPool::check_device() {
  if (!check_path_ || failed_.load()) return;
  os::PathIdentity now{};
  const char* problem = device_problem(&now);
  if (problem == nullptr) return;
  std::string why = "\"" + path_ + "\" " + problem;
  if (std::strcmp(problem, "was truncated") == 0) why += " to " + std::to_string(now.size) + " bytes";
  declare_failed(why);
}

cxlpool_shared_health_t SharedPool::health() {
  if (in_fork_child()) ensure_usable();  // throws: the child's mu_ is a copy, maybe held
  cxlpool_shared_health_t h{};
  std::lock_guard<HeapLock> lock(mu_);
  h.state = failed_.load() ? CXLPOOL_SHARED_FAILED : evicted_.load() ? CXLPOOL_SHARED_EVICTED : CXLPOOL_SHARED_HEALTHY;
  h.leases_lost = h.state == CXLPOOL_SHARED_HEALTHY ? 0 : static_cast<uint32_t>(leases_.size());
  h.bytes_lost = h.state == CXLPOOL_SHARED_HEALTHY ? 0 : bytes_in_use_;
  if (h.state != CXLPOOL_SHARED_HEALTHY) owned_.for_each([&](uint64_t, const Owned& o) { h.extents_lost += o.span; });
  std::strncpy(h.failure_domain, view_.sb().failure_domain, sizeof h.failure_domain - 1);
  std::strncpy(h.reason, failure_reason_.c_str(), sizeof h.reason - 1);
  return h;
}

bool SharedPool::in_fork_child() const { return pid_ != 0 && fork_generation_ != os::fork_generation(); }

void SharedPool::abandon_in_fork_child() {
  // The registry stays as it is (its lock may be a copy held by a parent thread); the object
  // is forgotten, not freed, so the entry stays valid. Its memory is gone from this process.
  evicted_.store(true);
  os::unmap(view_.base(), view_.size());
}

void SharedPool::start_beat_thread() {
  // A small stack: the thread only compares the device's identity, stores one word and waits.
  const int err = os::prim::start_thread(&SharedPool::beat_entry, this, size_t(256) << 10, false, &beat_thread_);
  if (err != 0)  // no thread to be had: a resource, not a bug
    fail(CXLPOOL_E_NO_MEMORY, what_ + ": cannot start the heartbeat thread (" + std::strerror(err) +
                                  "; RLIMIT_NPROC, threads-max or memory)");
  beat_started_ = true;
  std::unique_lock<std::mutex> lock(beat_wait_mu_);
  beat_cv_.wait(lock, [this] { return beat_ready_.load(); });
}

void* SharedPool::beat_entry(void* self) {
  static_cast<SharedPool*>(self)->beat_main();
  return nullptr;
}

// The heartbeat thread: one store per period, nothing else. It takes no lock that a call of the
// application holds (only beat_mu_, which mark_evicted holds for one mprotect) and allocates
// nothing, so neither a long call, a preempted lock holder nor recovery of another participant
// delays a beat; what it finds (eviction, a vanished device) it leaves to the watch thread.
void SharedPool::beat_main() {
  os::OwnThread mark("cxlpool/beat");
  os::prim::block_async_signals(nullptr);  // the program's handlers run on its own threads
  beat_tid_ = os::thread_id();
  beat_start_ = os::self_task_start_ticks();
  std::unique_lock<std::mutex> lock(beat_wait_mu_);
  beat_ready_.store(true);
  beat_cv_.notify_all();
  beat_cv_.wait(lock, [this] { return beat_go_.load() || beat_stop_.load(); });
  uint64_t prev = os::monotonic_ns();
  while (!beat_stop_.load()) {
    lock.unlock();
    os::PathIdentity now{};
    // A device gone or cut short: no store may touch it now (the watch declares the failure).
    const bool intact = device_problem(&now) == nullptr;
    if (intact && !evict_seen_.load() && !evicted_.load() && !failed_.load()) {
      bool evicted_now = false;
      {
        std::lock_guard<std::mutex> beat(beat_mu_);
        if (!evicted_.load()) evicted_now = beat_locked();
      }
      if (evicted_now) evict_seen_.store(true);  // the watch makes the mapping read-only (it needs mu_)
      const uint64_t t = os::monotonic_ns();
      gaps_.record(t - prev);
      prev = t;
    }
    // A borrowed device's follower acts now, not at the watch's next pass.
    if (!intact || evict_seen_.load()) tell_loss();
    lock.lock();
    beat_cv_.wait_for(lock, std::chrono::nanoseconds(heartbeat_ns_), [this] { return beat_stop_.load(); });
  }
}

void SharedPool::start_watch_thread() {
  // 1 MiB of stack (address space, mostly untouched) where a default thread would take 8 MiB
  // of a program's RLIMIT_AS: a pass recovers participants and allocates, but does not recurse.
  const int err = os::prim::start_thread(&SharedPool::watch_entry, this, size_t(1) << 20, false, &watch_thread_);
  if (err != 0)
    fail(CXLPOOL_E_NO_MEMORY,
         what_ + ": cannot start the watch thread (" + std::strerror(err) + "; RLIMIT_NPROC, threads-max or memory)");
  watch_started_ = true;
}

void* SharedPool::watch_entry(void* self) {
  static_cast<SharedPool*>(self)->watch_main();
  return nullptr;
}

void SharedPool::watch_main() {
  os::OwnThread mark("cxlpool/watch");
  os::prim::block_async_signals(nullptr);
  // Its allocations (under the pool's lock, some of them) never come from the program's pools
  // under the interposer: one could need a device borrowing from this very pool to grow.
  os::enter_internal_scope();
  std::unique_lock<std::mutex> lock(hb_mu_);
  while (!hb_stop_) {
    lock.unlock();
    try {
      NoForkDuringPass no_fork;
      watch_pass();
    } catch (...) {  // a failed pass is retried at the next period
    }
    lock.lock();
    hb_cv_.wait_for(lock, std::chrono::nanoseconds(heartbeat_ns_), [this] { return hb_stop_; });
  }
}

void SharedPool::stop_threads() {
  stop_watch_thread();
  stop_beat_thread();
}

void SharedPool::stop_watch_thread() {
  {
    std::lock_guard<std::mutex> lock(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (watch_started_) {
    if (!in_fork_child()) os::prim::join_thread(watch_thread_);  // a forked child has neither thread
    watch_started_ = false;
  }
}

void SharedPool::stop_beat_thread() {
  {
    std::lock_guard<std::mutex> lock(beat_wait_mu_);
    beat_stop_.store(true);
  }
  beat_cv_.notify_all();
  if (beat_started_) {
    if (!in_fork_child()) os::prim::join_thread(beat_thread_);
    beat_started_ = false;
  }
}

void GapStats::record(uint64_t gap_ns) noexcept {
  const uint64_t ms = gap_ns / 1000000u;
  hist[std::min<uint64_t>(ms, kBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  beats.fetch_add(1, std::memory_order_relaxed);
  if (gap_ns > max_ns.load(std::memory_order_relaxed)) max_ns.store(gap_ns, std::memory_order_relaxed);
}

double GapStats::quantile_ms(double q) const noexcept {
  const uint64_t n = beats.load(std::memory_order_relaxed);
  if (n == 0) return 0;
  const auto want = static_cast<uint64_t>(q * static_cast<double>(n));
  const double max_ms = static_cast<double>(max_ns.load(std::memory_order_relaxed)) / 1e6;
  uint64_t seen = 0;
  for (size_t b = 0; b + 1 < kBuckets; ++b) {
    seen += hist[b].load(std::memory_order_relaxed);
    if (seen > want) return std::min(static_cast<double>(b + 1), max_ms);
  }
  return max_ms;
}

void SharedPool::op_mark(bool begin) {
  op_depth_ += begin ? 1 : -1;  // callers hold mu_
  if (!joined_ || evicted_.load() || failed_.load() || in_fork_child()) return;
  const bool inside = op_depth_ > 0;
  if (inside == ((op_seq_ & 1) == 1)) return;
  uint64_t* word = &view_.slot_line0(slot_)->op_seq;
  const uint64_t next = tagged(op_seq_ + 1);
  if (!view_.compare_and_swap(word, tagged(op_seq_), next)) {
    // Not what we last stored: another process of this host holds the slot now (we were
    // evicted; the check that follows the mark says so), or the word was scribbled on.
    if (!slot_is_ours()) return;
    ++corrupt_words_;
    view_.store(word, next);  // only we write it: repair
  }
  ++op_seq_;
}

bool SharedPool::slot_is_ours() const {
  uint32_t inc = 0;
  SlotState state{};
  if (!view_.slot_identity(slot_, &inc, &state)) return true;  // scribbled: the heartbeat repairs it
  return inc == incarnation_ && state == kSlotActive;
}

bool SharedPool::still_ours_locked() {
  if (evicted_.load() || failed_.load()) return false;
  uint32_t evict_inc = 0;
  EvictPhase phase{};
  const bool named = view_.slot_eviction(slot_, &evict_inc, &phase) && phase != kEvictNone && evict_inc == incarnation_;
  if (named || !slot_is_ours()) {
    mark_evicted(true);
    return false;
  }
  return true;
}

void SharedPool::ensure_usable(bool holding_mu) {
  if (in_fork_child())
    fail(CXLPOOL_E_NOT_SUPPORTED, what_ + ": joined by process " + std::to_string(pid_) +
                                      "; a forked child is not a participant (open the pool in the child)");
  if (!joined_) fail(CXLPOOL_E_INVALID_ARGUMENT, what_ + ": this participant has left the pool");
  if (failed_.load()) {
    std::unique_lock<HeapLock> lock(mu_, std::defer_lock);
    if (!holding_mu) lock.lock();
    fail(CXLPOOL_E_DEVICE_FAILED, what_ + ": the device failed (" + failure_reason_ + "); " +
                                      std::to_string(leases_.size()) + " imported blocks and " +
                                      std::to_string(bytes_in_use_) + " bytes of owned blocks on it are lost");
  }
  // Self-fencing: a writing operation (holding mu_, its mark already published) reads its
  // eviction word and its slot's identity every time; anything else beats first after a stall
  // longer than half the lease. Either way it learns whether the others evicted us (by the
  // eviction word, or by recovering us and giving the slot to someone else, whose eviction may
  // be what the word names now) before touching anything.
  if (!evicted_.load()) {
    if (holding_mu) {
      (void)still_ours_locked();
    } else if (evict_seen_.load()) {
      mark_evicted(false);
    } else if (os::coarse_now_ns() - last_beat_ns_.load() > timeout_ns_ / 2) {
      heartbeat_once(false);
    }
  }
  if (evicted_.load())
    fail(CXLPOOL_E_EVICTED, what_ +
                                ": this participant was declared dead and evicted (stopped for longer than the pool's "
                                "stopped timeout, or silent past its lease where the others could not look at its "
                                "process); its blocks and leases are gone; reopen the pool");
}

// The others own what was ours now. Every store this process still makes into the pool (the
// application's too) must fault rather than land in memory someone else reuses: the mapping
// becomes read-only, once no operation of ours is half done (under mu_).
void SharedPool::mark_evicted(bool holding_mu) {
  std::unique_lock<HeapLock> lock(mu_, std::defer_lock);
  if (!holding_mu) lock.lock();
  std::lock_guard<std::mutex> beat(beat_mu_);  // lock order: mu_, then beat_mu_
  if (!evicted_.exchange(true)) os::prim::protect_read_only(view_.base(), view_.size());
  tell_loss();
}

void SharedPool::heartbeat_once(bool holding_mu) {
  bool evicted_now = false;
  {
    // Under beat_mu_: mark_evicted takes it before making the mapping read-only, so no beat
    // is stored after that.
    std::lock_guard<std::mutex> beat(beat_mu_);
    if (evicted_.load() || !joined_) return;
    evicted_now = beat_locked();
  }
  if (evicted_now) mark_evicted(holding_mu);
}

// One beat (caller holds beat_mu_); true when this participant was evicted: its eviction word
// names it, or its slot holds another incarnation (recovered, then taken by a newcomer).
bool SharedPool::beat_locked() {
  uint32_t evict_inc = 0, inc = 0;
  EvictPhase phase{};
  SlotState state{};
  if (view_.slot_eviction(slot_, &evict_inc, &phase) && phase != kEvictNone && evict_inc == incarnation_) return true;
  uint64_t* identity = view_.slot_word(slot_, 0, 0);
  if (!view_.slot_identity(slot_, &inc, &state)) {
    ++corrupt_words_;  // scribbled; only this participant writes it: repair
    view_.store(identity, encode_slot_identity(incarnation_, kSlotActive, slot_, view_.salt()));
  } else if (inc != incarnation_ || state != kSlotActive) {
    return true;  // a valid word naming another holder: never "repaired" back to us
  }
  // From the value we last stored: a newcomer that took the slot after we looked has stored
  // its own, and the swap fails instead of beating for it.
  uint64_t* word = &view_.slot_line0(slot_)->heartbeat;
  const uint64_t next = tagged(beat_word_ + 1);
  if (!view_.compare_and_swap(word, beat_word_, next)) {
    if (!slot_is_ours()) return true;
    ++corrupt_words_;
    view_.store(word, next);
  }
  beat_word_ = next;
  last_beat_ns_.store(os::coarse_now_ns());
  return false;
}

void SharedPool::leave() {
  if (!joined_ || in_fork_child()) return;
  // The heartbeat thread beats until the slot is given up: observers of this host judge us by
  // that thread, and a leaver whose thread is gone would be recovered while it still frees.
  stop_watch_thread();
  struct BeatStopper {
    SharedPool* pool;
    ~BeatStopper() { pool->stop_beat_thread(); }
  } stop_beat_last{this};
  if (failed_.load()) {  // nothing of the device may be touched; the others recover us if they can
    joined_ = false;
    return;
  }
  std::lock_guard<HeapLock> lock(mu_);
  // Marked and checked like any operation: a participant evicted unawares (its slot perhaps
  // another's by now) touches nothing.
  op_mark(true);
  PoolView::fence();
  if (!still_ours_locked()) {  // the others own our state now
    op_depth_ = 0;
    joined_ = false;
    return;
  }
  for (auto& [offset, lease] : leases_) lease_remove(offset, lease.generation);
  leases_.clear();
  bool others_hold = false;
  std::vector<uint64_t> extents;
  owned_.for_each([&](uint64_t e, const Owned&) { extents.push_back(e); });
  for (auto& cache : cache_) cache.clear();  // cached blocks are allocated in the pool: freed below
  for (uint64_t e : extents) {
    ExtentWord w;
    if (!view_.extent(e, &w)) continue;
    Owned& owned = owned_[e];
    const uint64_t blocks = owned.cls < view_.sb().class_count ? view_.geometry(owned.cls).blocks : 1;
    for (uint64_t b = 0; b < blocks; ++b) {
      BlockRef at;
      at.extent = e;
      at.block = b;
      at.offset = owned.cls < view_.sb().class_count ? view_.block_offset(e, owned.cls, b) : view_.extent_offset(e);
      at.state = owned.cls < view_.sb().class_count ? view_.block_word(e, b) : &view_.extent_entry(e)->large_state;
      BlockWord bw;
      if (!decode_block(view_.load(at.state), at.offset, view_.salt(), &bw)) continue;
      if (bw.state == kBlockAllocated) {
        view_.store(at.state, encode_block({bw.generation, kBlockFree}, at.offset, view_.salt()));
      } else if (bw.state == kBlockExported || bw.state == kBlockReleased) {
        view_.store(at.state, encode_block({bw.generation, kBlockReleased}, at.offset, view_.salt()));
        PoolView::fence();
        if (view_.anyone_holds(at.offset, bw.generation))
          others_hold = true;
        else
          view_.store(at.state, encode_block({bw.generation, kBlockFree}, at.offset, view_.salt()));
      }
    }
  }
  if (!others_hold) {
    for (uint64_t e : extents) {
      const Owned& owned = owned_[e];
      release_extents(e, owned.span, owned.max_gen + 1);
    }
    owned_.clear();
  }
  // Free: nothing left. Left: a survivor adopts the blocks others still hold, as for a death.
  // From our own word only: the slot is someone else's if we were recovered meanwhile.
  op_mark(false);
  const uint64_t salt = view_.salt();
  (void)view_.compare_and_swap(view_.slot_word(slot_, 0, 0),
                               encode_slot_identity(incarnation_, kSlotActive, slot_, salt),
                               encode_slot_identity(incarnation_, others_hold ? kSlotLeft : kSlotFree, slot_, salt));
  joined_ = false;
}

}  // namespace cxlpool::detail::shared

// SPDX-License-Identifier: MIT
// The stats publisher (publisher.hpp): the page is filled with the schema's descriptors once,
// then every interval the thread takes a snapshot (alloc::collect_device_totals, the tiering
// counters) and writes it under the page's seqlock. Nothing here allocates while it holds a
// lock that fork() handlers take: a sanitizer's fork() takes its allocator's lock before ours.
#include "stats/publisher.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <new>

#include "alloc/pool.hpp"
#include "common/env_once.hpp"
#include "common/error.hpp"
#include "common/parse.hpp"
#include "config/options.hpp"
#include "device/device.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"
#include "os/thread.hpp"
#include "stats/control.hpp"
#include "stats/layout.hpp"
#include "stats/schema.hpp"
#include "tiering/counters.hpp"

namespace cxlpool::detail::stats {
namespace {

static_assert(kMaxTierSlots == uint32_t(tiering::kMaxTiers), "one tier slot per tiering tier");

// Lock order: g_write_mu, then the allocator's locks (collect_device_totals). g_state_mu
// guards start/stop and is never held while publishing.
// Plain pthread objects, constant-initialised: the interposer starts the publisher before
// the library's dynamic initialisation has run, and nothing here is destroyed at exit while
// the thread may still wait.
pthread_mutex_t g_state_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;  // with g_state_mu
std::mutex g_write_mu;
struct StateLock {
  StateLock() { pthread_mutex_lock(&g_state_mu); }
  ~StateLock() { pthread_mutex_unlock(&g_state_mu); }
};
bool g_stopping = false;
EnvOnce g_env;
// The publisher's stack: a snapshot and a few stores (12 KiB used at most, measured in its
// mapping's resident pages at a 10 ms interval); far below the default 8 MiB, which would
// count against a program's RLIMIT_AS.
constexpr size_t kPublisherStack = size_t(128) << 10;
os::Thread* g_thread = nullptr;
uint8_t* g_page = nullptr;  // read-write mapping of the page (this process only)
size_t g_bytes = 0;
int g_fd = -1;
uint32_t g_interval_ms = 1000;
alloc::DeviceTotals g_devices[kMaxDevices];  // the snapshot buffer (g_write_mu)

uint64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Header* header() { return reinterpret_cast<Header*>(g_page); }
uint64_t* values() { return reinterpret_cast<uint64_t*>(g_page + header()->values_offset); }

// Stores inside the seqlock are atomics (a reader may copy while we write, and retries; this
// keeps in-process readers free of data races), with release order: the seqlock's writer side
// without a standalone fence, which ThreadSanitizer cannot model. No data store becomes
// visible before the odd sequence number that precedes it; readers load with acquire, a word
// at a time (the page is page aligned and a whole number of words).
void store(uint64_t* at, uint64_t v) { __atomic_store_n(at, v, __ATOMIC_RELEASE); }
void store_bytes(void* at, const void* from, size_t n) {
  auto* d = static_cast<uint8_t*>(at);
  auto* s = static_cast<const uint8_t*>(from);
  size_t i = 0;
  if (reinterpret_cast<uintptr_t>(d) % 8 == 0)
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      __atomic_store_n(reinterpret_cast<uint64_t*>(d + i), w, __ATOMIC_RELEASE);
    }
  for (; i < n; ++i) __atomic_store_n(d + i, s[i], __ATOMIC_RELEASE);
}

size_t layout_bytes(uint32_t* metrics_off, uint32_t* devices_off, uint32_t* values_off) {
  size_t off = kHeaderBytes;
  *metrics_off = uint32_t(off);
  off += schema_size() * sizeof(MetricSlot);
  *devices_off = uint32_t(off);
  off += kMaxDevices * sizeof(DeviceSlot);
  *values_off = uint32_t(off);
  off += (schema_count(Scope::kProcess) + kMaxDevices * schema_count(Scope::kDevice) +
          kMaxTierSlots * schema_count(Scope::kTier)) *
         sizeof(uint64_t);
  const size_t page = os::page_size();
  return (off + page - 1) / page * page;
}

// Into a fixed field of cap bytes, always terminated.
void copy_text(char* to, size_t cap, const char* from) {
  size_t n = std::min(std::strlen(from), cap - 1);
  std::memcpy(to, from, n);
  to[n] = '\0';
}

// The parts that never change: header fields and the metric descriptors.
void fill_static(uint32_t interval_ms, const std::string& program, uint32_t mo, uint32_t dof, uint32_t vo) {
  Header* h = header();
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kLayoutVersion;
  h->header_bytes = kHeaderBytes;
  h->total_bytes = g_bytes;
  h->pid = os::prim::process_id();
  h->interval_ms = interval_ms;
  h->start_realtime_ns = clock_ns(CLOCK_REALTIME);
  h->n_metrics = uint32_t(schema_size());
  h->max_devices = kMaxDevices;
  h->n_tiers = kMaxTierSlots;
  h->metrics_offset = mo;
  h->devices_offset = dof;
  h->values_offset = vo;
  h->n_process_metrics = uint32_t(schema_count(Scope::kProcess));
  h->n_device_metrics = uint32_t(schema_count(Scope::kDevice));
  h->n_tier_metrics = uint32_t(schema_count(Scope::kTier));
  copy_text(h->program, sizeof h->program, program.c_str());
  auto* slots = reinterpret_cast<MetricSlot*>(g_page + mo);
  for (size_t i = 0; i < schema_size(); ++i) {
    const SchemaEntry& e = schema_entry(i);
    slots[i].scope = uint8_t(e.scope);
    slots[i].kind = uint8_t(e.desc.kind);
    copy_text(slots[i].name, sizeof slots[i].name, e.desc.name);
    copy_text(slots[i].unit, sizeof slots[i].unit, e.desc.unit);
    copy_text(slots[i].help, sizeof slots[i].help, e.desc.help);
  }
}

void publish_locked() {
  if (!g_page) return;
  const size_t ndev = alloc::collect_device_totals(g_devices, kMaxDevices);
  const tiering::Counters& c = tiering::counters();
  Header* h = header();
  const uint64_t seq = __atomic_load_n(&h->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&h->seq, seq + 1, __ATOMIC_RELAXED);
  uint64_t* v = values();
  for (const auto& f : tiering::kCounterFields) store(v++, (c.*f.member).get());
  const VmaUse vmas = vma_use();
  for (const auto& f : kVmaFields) store(v++, vmas.*f.member);
  auto* slots = reinterpret_cast<DeviceSlot*>(g_page + h->devices_offset);
  for (size_t d = 0; d < kMaxDevices; ++d) {
    DeviceSlot slot{};
    const alloc::DeviceStats* s = nullptr;
    if (d < ndev) {
      const alloc::DeviceTotals& t = g_devices[d];
      copy_text(slot.name, sizeof slot.name, t.name);
      slot.kind = t.kind;
      slot.tier = t.tier;
      slot.numa_node = t.numa_node;
      slot.pools = t.pools;
      s = &t.stats;
    }
    store_bytes(&slots[d], &slot, sizeof slot);
    for (const auto& f : alloc::kDeviceStatFields) store(v++, s ? s->*f.member : 0);
  }
  for (uint32_t t = 0; t < kMaxTierSlots; ++t)
    for (const auto& f : tiering::kTierFields) store(v++, (c.*f.member)[t].get());
  __atomic_store_n(&h->n_devices, uint32_t(ndev), __ATOMIC_RELEASE);
  store(&h->updated_realtime_ns, clock_ns(CLOCK_REALTIME));
  store(&h->updated_monotonic_ns, clock_ns(CLOCK_MONOTONIC));
  store(&h->publishes, __atomic_load_n(&h->publishes, __ATOMIC_RELAXED) + 1);
  __atomic_store_n(&h->seq, seq + 2, __ATOMIC_RELEASE);
}

void run() {
  os::prim::block_async_signals(nullptr);  // the program's handlers run on its own threads
  pthread_mutex_lock(&g_state_mu);
  while (!g_stopping) {
    pthread_mutex_unlock(&g_state_mu);
    {
      std::lock_guard<std::mutex> w(g_write_mu);
      publish_locked();
    }
    pthread_mutex_lock(&g_state_mu);
    timespec until{};
    clock_gettime(CLOCK_MONOTONIC, &until);
    const uint64_t ns = uint64_t(until.tv_nsec) + uint64_t(g_interval_ms) * 1000000ull;
    until.tv_sec += time_t(ns / 1000000000ull);
    until.tv_nsec = long(ns % 1000000000ull);
    while (!g_stopping && pthread_cond_clockwait(&g_wake, &g_state_mu, CLOCK_MONOTONIC, &until) == 0) {
    }
  }
  pthread_mutex_unlock(&g_state_mu);
}

}  // namespace

void start(uint32_t interval_ms) {
  if (interval_ms < 10 || interval_ms > 60000)
    fail(CXLPOOL_E_INVALID_ARGUMENT, "stats: interval " + std::to_string(interval_ms) + " ms is outside 10..60000 ms");
  const std::string program = os::program_name();
  StateLock lock;
  if (g_thread) fail(CXLPOOL_E_BUSY, "stats: the publisher runs already");
  uint32_t mo = 0, dof = 0, vo = 0;
  const size_t bytes = layout_bytes(&mo, &dof, &vo);
  int fd = -1;
  void* p = os::create_sealed_page(kMemfdName, bytes, &fd);
  {
    std::lock_guard<std::mutex> w(g_write_mu);
    g_page = static_cast<uint8_t*>(p);
    g_bytes = bytes;
    g_fd = fd;
    g_interval_ms = interval_ms;
    fill_static(interval_ms, program, mo, dof, vo);
  }
  g_stopping = false;
  try {
    auto t = std::make_unique<os::Thread>();
    t->start(run, kPublisherStack, "stats: the publisher thread", "cxlpool/stats");
    g_thread = t.release();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> w(g_write_mu);
    os::unmap(g_page, g_bytes);
    os::close_fd(g_fd);
    g_page = nullptr;
    g_fd = -1;
    fail(CXLPOOL_E_OS, std::string("stats: cannot start the publisher thread: ") + e.what());
  }
}

namespace {

void start_now() {
  bool required = false;
  if (const char* v = option_value(Option::kStatPage)) {
    std::string_view t = trim(v);
    if (t == "0") return;
    if (t != "1") fail(CXLPOOL_E_CONFIG, std::string("CXLPOOL_STAT_PAGE: bad value '") + v + "' (expected 1 or 0)");
    required = true;
  }
  uint32_t interval = 1000;
  if (const char* v = option_value(Option::kStatInterval)) {
    auto ms = parse_u64(trim(v));
    if (!ms || *ms < 10 || *ms > 60000)
      fail(CXLPOOL_E_CONFIG,
           std::string("CXLPOOL_STAT_INTERVAL_MS: bad value '") + v + "' (expected milliseconds 10..60000)");
    interval = uint32_t(*ms);
  }
  if (!required && !os::prim::thread_headroom()) {  // its thread could be the program's last
    os::prim::write_stderr(
        "cxlpool: no stats page for this process (cxlpool-stat cannot read it): RLIMIT_NPROC leaves no thread to "
        "spare for its publisher; CXLPOOL_STAT_PAGE=1 starts it anyway\n");
    return;
  }
  try {
    start(interval);
  } catch (const Failure& f) {
    if (required || f.status() != CXLPOOL_E_OS) throw;
    std::string line = std::string("cxlpool: no stats page for this process (cxlpool-stat cannot read it): ") +
                       f.what() + "; CXLPOOL_STAT_PAGE=0 silences this\n";
    os::prim::write_stderr(line.c_str());
  }
}

}  // namespace

void start_from_environment() { g_env.run(start_now); }

void stop() noexcept {
  os::Thread* t = nullptr;
  {
    StateLock lock;
    t = g_thread;
    g_thread = nullptr;
    g_stopping = true;
    pthread_cond_broadcast(&g_wake);
  }
  if (t) {
    t->join();
    delete t;
  }
  std::lock_guard<std::mutex> w(g_write_mu);
  if (g_page) os::unmap(g_page, g_bytes);
  if (g_fd >= 0) os::close_fd(g_fd);
  g_page = nullptr;
  g_bytes = 0;
  g_fd = -1;
}

bool running() noexcept {
  StateLock lock;
  return g_thread != nullptr;
}

void publish_now() noexcept {
  std::lock_guard<std::mutex> w(g_write_mu);
  publish_locked();
}

const void* page() noexcept {
  std::lock_guard<std::mutex> w(g_write_mu);
  return g_page;
}
size_t page_bytes() noexcept {
  std::lock_guard<std::mutex> w(g_write_mu);
  return g_bytes;
}
int page_fd() noexcept {
  std::lock_guard<std::mutex> w(g_write_mu);
  return g_fd;
}

void fork_prepare() noexcept {
  pthread_mutex_lock(&g_state_mu);
  g_write_mu.lock();
}

void fork_parent() noexcept {
  g_write_mu.unlock();
  pthread_mutex_unlock(&g_state_mu);
}

void after_fork_child(bool prepared) noexcept {
  control::after_fork_child();
  if (prepared) {
    g_write_mu.unlock();
    pthread_mutex_unlock(&g_state_mu);
  } else {
    g_state_mu = PTHREAD_MUTEX_INITIALIZER;
    new (&g_write_mu) std::mutex();
  }
  g_wake = PTHREAD_COND_INITIALIZER;  // the parent's publisher may have been waiting on it
  // The parent's page: never written from here. The descriptor is ours (made by us, inherited
  // a moment ago, before the child's own code ran).
  if (g_page) os::unmap(g_page, g_bytes);
  if (g_fd >= 0) os::close_fd(g_fd);
  g_page = nullptr;
  g_bytes = 0;
  g_fd = -1;
  g_thread = nullptr;  // leaked on purpose: the thread is not in the child
  g_stopping = false;
}

}  // namespace cxlpool::detail::stats

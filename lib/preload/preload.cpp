// SPDX-License-Identifier: MIT
// libcxlpool_preload.so: the malloc family and every C++ operator new/delete, served from a
// cxlpool pool configured by CXLPOOL_DEVICES / CXLPOOL_CONFIG / CXLPOOL_POLICY. Rules:
//  - never recurse: while this thread is inside cxlpool (initialisation, discovery, allocator
//    slow paths) every allocation goes to the internal heap (os/internal_heap.hpp);
//  - never call dlsym: pointers cxlpool does not know go to glibc's __libc_* entry points;
//  - never abort, exit or hang on configuration: a bad setting prints one line (write(2))
//    and the process runs with default placement (or plain glibc if even that fails);
//  - fork handlers (lib/lifecycle) hold every allocator lock across fork().
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "alloc/pool.hpp"
#include "common/error.hpp"
#include "config/options.hpp"
#include "lifecycle/lifecycle.hpp"
#include "os/internal_heap.hpp"
#include "os/prim.hpp"
#include "os/safe_path.hpp"
#include "stats/control.hpp"
#include "stats/publisher.hpp"
#include "tiering/engine.hpp"
#include "topology/model.hpp"

// glibc's own entry points (exported by libc.so.6), for pointers cxlpool did not allocate.
extern "C" {  // NOLINTBEGIN(bugprone-reserved-identifier)
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}  // NOLINTEND(bugprone-reserved-identifier)

namespace cxlpool::detail::preload {
namespace {

namespace A = cxlpool::detail::alloc;
using cxlpool::os::internal_alloc;
using cxlpool::os::internal_free;
using cxlpool::os::internal_owns;
using cxlpool::os::internal_usable_size;

enum State : int { kUninit, kReady, kPassthrough };
std::atomic<int> g_state{kUninit};
A::Pool* g_pool = nullptr;
pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
thread_local int tls_busy __attribute__((tls_model("initial-exec"))) = 0;
// The dynamic loader's addresses (os::prim::loader_range): a free called from there may run
// under a lock pthread_create takes (A::set_thread_start_deferred).
uintptr_t g_loader_lo = 0;
uintptr_t g_loader_hi = 0;
// True when the caller's return address is in the dynamic loader.
bool from_loader(const void* ret) { return uintptr_t(ret) - g_loader_lo < g_loader_hi - g_loader_lo; }
// A free or realloc the dynamic loader calls: see A::set_thread_start_deferred.
struct LoaderCall {
  LoaderCall() { A::set_thread_start_deferred(true); }
  ~LoaderCall() { A::set_thread_start_deferred(false); }
  LoaderCall(const LoaderCall&) = delete;
  LoaderCall& operator=(const LoaderCall&) = delete;
};

std::atomic<uint64_t> g_foreign_frees{0};
char g_stats_target[512] = "";
// CXLPOOL_STATS=1: a copy of the program's stderr taken at start, so a program that closes
// stderr before exit (coreutils do) or reuses fd 2 for a file of its own neither loses the
// table nor gets it written into that file.
int g_stats_fd = -1;
cxlpool::os::prim::FileId g_stats_fd_id{};

struct Busy {
  Busy() { ++tls_busy; }
  ~Busy() { --tls_busy; }
};
void enter_internal() noexcept { ++tls_busy; }
void leave_internal() noexcept { --tls_busy; }

// One diagnostic line on stderr, without allocating.
void say(const char* fmt, const char* a = "", const char* b = "") {
  char line[1024];
  int n = std::snprintf(line, sizeof line, fmt, a, b);
  if (n > 0) {
    size_t len = std::min(size_t(n), sizeof line - 1);
    if (line[len - 1] != '\n' && len < sizeof line - 1) line[len++] = '\n';
    ssize_t w = write(2, line, len);
    (void)w;
  }
}

// The per-device table, written to fd: the schema's names (alloc::kDeviceStatFields), as
// cxlpool-stat and cxlpool_pool_stats_json show them. One write for the table: the processes
// of one run appending to one file do not interleave their lines.
char g_table[32768];
void write_stats(int fd) {
  Busy busy;
  char line[1024];
  size_t used = 0;
  auto flush = [&] {
    for (size_t done = 0; done < used;) {
      ssize_t w = write(fd, g_table + done, used - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += size_t(w);
    }
    used = 0;
  };
  auto put = [&](int n) {
    if (n <= 0) return;
    const size_t len = std::min(size_t(n), sizeof line - 1);
    if (used + len > sizeof g_table) flush();
    std::memcpy(g_table + used, line, len);
    used += len;
  };
  put(std::snprintf(line, sizeof line, "cxlpool: pid %d, policy %s\n", int(getpid()),
                    A::pool_policy_text(g_pool).c_str()));
  int n = std::snprintf(line, sizeof line, "%-10s %5s", "device", "tier");
  for (const A::DeviceStatField& f : A::kDeviceStatFields)
    n += std::snprintf(line + n, sizeof line - size_t(n), " %*s", int(std::max<size_t>(12, std::strlen(f.desc.name))),
                       f.desc.name);
  n += std::snprintf(line + n, sizeof line - size_t(n), "\n");
  put(n);
  for (int d = 0; d < A::pool_device_count(g_pool); ++d) {
    A::DeviceStats s = A::pool_device_stats(g_pool, d);
    n = std::snprintf(line, sizeof line, "%-10s %5d", A::pool_device_name(g_pool, d).c_str(),
                      A::pool_device_tier(g_pool, d));
    for (const A::DeviceStatField& f : A::kDeviceStatFields)
      n += std::snprintf(line + n, sizeof line - size_t(n), " %*llu",
                         int(std::max<size_t>(12, std::strlen(f.desc.name))), (unsigned long long)(s.*f.member));
    n += std::snprintf(line + n, sizeof line - size_t(n), "\n");
    put(n);
  }
  flush();
}

// At exit (CXLPOOL_STATS): to the named file, or to the program's stderr as it was at start.
void print_stats() {
  if (!g_pool || !g_stats_target[0]) return;
  Busy busy;
  if (std::strcmp(g_stats_target, "1") != 0) {
    // Appended, never truncated; another user's file or link is refused (os/safe_path.hpp).
    cxlpool::os::PathWhy why;
    int fd = cxlpool::os::open_user_output(g_stats_target, cxlpool::os::OutputMode::kAppend, &why);
    if (fd < 0) {
      say("cxlpool: CXLPOOL_STATS: statistics not written to '%s': %s", g_stats_target, why.text);
      return;
    }
    write_stats(fd);
    close(fd);
    return;
  }
  cxlpool::os::prim::FileId now;
  if (g_stats_fd >= 0 && cxlpool::os::prim::file_id(g_stats_fd, &now) == 0 && now == g_stats_fd_id)
    write_stats(g_stats_fd);
}

// The interposer's part of the fork handlers (lib/lifecycle/lifecycle.cpp has the order): the
// handlers run as "inside cxlpool", so what they allocate (a fork child opening storage for its
// copy) comes from the internal heap, never from the pools whose locks they hold; the init lock
// is outermost, the internal heap's innermost; and a fork from a signal handler that
// interrupted cxlpool on this thread (tls_busy) takes no lock, as glibc takes no malloc lock
// then, and the child starts with fresh ones.
bool inside_cxlpool() noexcept { return tls_busy > 0; }
void lock_init() noexcept { pthread_mutex_lock(&g_init_mu); }
void unlock_init() noexcept { pthread_mutex_unlock(&g_init_mu); }
void reset_init() noexcept { g_init_mu = PTHREAD_MUTEX_INITIALIZER; }
constexpr cxlpool::detail::lifecycle::InterposerHooks kLifecycle{
    .inside = inside_cxlpool,
    .enter = enter_internal,
    .leave = leave_internal,
    .init = {.take = lock_init, .release = unlock_init, .reset = reset_init}};

}  // namespace

// The same answer for the other copy of the library in the process (libcxlpool.so, which a
// program links while it runs under the interposer): its prepare handler must take nothing
// either when this thread's fork comes from a signal handler that interrupted the interposer,
// or it waits for its own locks that a thread waiting for the interrupted one holds
// (lib/lifecycle/lifecycle.cpp, "Across libraries").
extern "C" __attribute__((visibility("default"))) int cxlpool_preload_inside(void) noexcept { return tls_busy > 0; }

namespace {

// The fork handlers are registered as early as the interposer can: its first malloc-family
// call, or this constructor when nothing allocated before it. Other libraries' prepare
// handlers (which may allocate) then run before ours takes the allocator's locks, and their
// child handlers after ours released them (lib/lifecycle/lifecycle.cpp, "Across libraries").
void start_lifecycle() noexcept {
  Busy busy;  // what registering allocates is internal
  cxlpool::detail::lifecycle::init(&kLifecycle);
}

__attribute__((constructor)) void on_load() {
  start_lifecycle();
  uintptr_t lo = 0, hi = 0;
  if (cxlpool::os::prim::loader_range(&lo, &hi) == 0) {
    g_loader_lo = lo;
    g_loader_hi = hi;
  }
}

// Builds the pool from the environment; on a configuration error says so once and falls back
// to default placement. Runs with tls_busy set: everything it allocates is internal. Nothing
// it meets (bad settings, no address space under RLIMIT_AS, a FIFO as CXLPOOL_CONFIG, a device
// another process holds) may abort the program: the worst case is glibc's malloc.
void initialise() noexcept {
  Busy busy;
  std::string problem;
  // Background threads (the purger, the tiering engine) allocate from the internal heap.
  A::set_internal_scope_hooks(enter_internal, leave_internal);
  try {
    try {
      A::configure_from_environment();
    } catch (const Failure& f) {
      say("cxlpool: %s; the default is used for it", f.what());  // a bad process option: its default
    }
    try {
      cxlpool::detail::tiering::start_from_environment(true);  // before the pool: 4 MiB units
    } catch (const Failure& f) {
      say("cxlpool: %s; tiering is off", f.what());
    }
    try {
      // No hwloc here: it would add tens of milliseconds to every program's start, and sysfs
      // already carries the HMAT figures.
      DiscoverOptions env;
      env.no_hwloc = true;
      Topology topo = discover(env);
      try {
        g_pool = A::pool_create_from_environment(topo, "preload");
      } catch (const Failure& f) {
        if (f.status() != CXLPOOL_E_CONFIG) throw;
        if (problem.empty()) problem = f.what();  // a bad CXLPOOL_POLICY: default placement, same devices
        A::PoolOptions o;
        o.name = "preload";
        g_pool = A::pool_create(topo, o);
      }
    } catch (const Failure& f) {
      if (problem.empty()) problem = f.what();
      // The environment's devices are unusable: the machine's own targets.
      DiscoverOptions plain;
      plain.ignore_env = true;
      plain.no_hwloc = true;
      Topology topo = discover(plain);
      A::PoolOptions o;
      o.name = "preload";
      g_pool = A::pool_create(topo, o);
    }
  } catch (const std::exception& e) {
    if (problem.empty())
      problem = e.what();
    else
      problem += std::string("; then: ") + e.what();
    g_pool = nullptr;
  } catch (...) {
    if (problem.empty()) problem = "unknown error";
    g_pool = nullptr;
  }
  if (!g_pool) {
    say("cxlpool: %s; the interposer passes allocations to glibc", problem.empty() ? "no pool" : problem.c_str());
    g_state.store(kPassthrough, std::memory_order_release);
    return;
  }
  if (!problem.empty()) say("cxlpool: %s; running with default placement", problem.c_str());
  try {
    cxlpool::detail::stats::start_from_environment();  // the page cxlpool-stat reads
  } catch (const std::exception& e) {
    say("cxlpool: %s; no stats page", e.what());
  }
  try {
    cxlpool::detail::control::start_from_environment();  // what cxlpool-capacity talks to
  } catch (const std::exception& e) {
    say("cxlpool: %s; no control socket", e.what());
  }
  if (const char* stats = option_value(Option::kStats))
    if (*stats && std::strcmp(stats, "0") != 0) {
      std::snprintf(g_stats_target, sizeof g_stats_target, "%s", stats);
      if (std::strcmp(stats, "1") == 0) {
        g_stats_fd = cxlpool::os::prim::move_fd_high(fcntl(2, F_DUPFD_CLOEXEC, 3));
        if (g_stats_fd >= 0) cxlpool::os::prim::file_id(g_stats_fd, &g_stats_fd_id);
      }
      std::atexit(print_stats);
    }
  g_state.store(kReady, std::memory_order_release);
}

void ensure_initialised() {
  start_lifecycle();
  pthread_mutex_lock(&g_init_mu);
  if (g_state.load(std::memory_order_acquire) == kUninit) initialise();
  pthread_mutex_unlock(&g_init_mu);
}

// State after initialisation (kReady or kPassthrough).
inline int state() {
  int s = g_state.load(std::memory_order_acquire);
  if (__builtin_expect(s == kUninit, 0)) {
    ensure_initialised();
    s = g_state.load(std::memory_order_acquire);
  }
  return s;
}

void* do_malloc(size_t n) {
  if (__builtin_expect(tls_busy != 0, 0)) {
    // Inside cxlpool already (its own allocations, or a signal handler that interrupted it):
    // the internal heap, or glibc's malloc when that is full or this thread holds its lock.
    void* p = internal_alloc(n ? n : 1);
    return p ? p : __libc_malloc(n);
  }
  if (__builtin_expect(state() != kReady, 0)) return __libc_malloc(n);
  Busy busy;
  return A::pool_malloc(g_pool, n);
}

void* do_aligned(size_t alignment, size_t n) {
  if (__builtin_expect(tls_busy != 0, 0)) {
    void* p = internal_alloc(n ? n : 1, alignment);
    return p ? p : __libc_memalign(alignment, n);
  }
  if (state() != kReady) return __libc_memalign(alignment, n);
  Busy busy;
  return A::pool_aligned(g_pool, alignment, n);
}

// glibc's memalign rules: small alignments are plain malloc, others round up to a power of
// two, absurd ones are EINVAL.
void* memalign_like(size_t alignment, size_t n) {
  if (alignment <= 16) return do_malloc(n);
  if (alignment > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return nullptr;
  }
  if (alignment & (alignment - 1)) alignment = size_t(1) << (64 - __builtin_clzll(alignment));
  return do_aligned(alignment, n);
}

void do_free(void* p) {
  if (!p) return;
  if (internal_owns(p)) {
    internal_free(p);  // refused (the block leaks) only when re-entered under the heap's lock
    return;
  }
  if (__builtin_expect(tls_busy != 0, 0)) {
    // Re-entered (a signal handler interrupted this thread inside cxlpool): lock-free only.
    if (A::free_any_reentrant(p)) return;
  } else {
    Busy busy;
    if (A::free_any(p)) return;
  }
  // Not cxlpool's: memory from before the interposer (ld.so) belongs to glibc.
  g_foreign_frees.fetch_add(1, std::memory_order_relaxed);
  __libc_free(p);
}

size_t usable(void* p) {
  if (!p) return 0;
  if (internal_owns(p)) return internal_usable_size(p);
  return A::usable_size(p);  // 0 for pointers that are not ours
}

void* do_realloc(void* p, size_t n) {
  if (!p) return do_malloc(n);
  if (n == 0) {  // glibc: frees and returns NULL
    do_free(p);
    return nullptr;
  }
  if (internal_owns(p)) {
    void* q = do_malloc(n);
    if (q) {
      std::memcpy(q, p, std::min(n, internal_usable_size(p)));
      internal_free(p);
    }
    return q;
  }
  if (A::owns(p)) {
    if (tls_busy || state() != kReady) {  // cxlpool's own realloc of a user block: copy out
      size_t old = A::usable_size(p);
      void* q = do_malloc(n);
      if (q) {
        std::memcpy(q, p, std::min(n, old));
        do_free(p);
      }
      return q;
    }
    Busy busy;
    return A::pool_realloc(g_pool, p, n);
  }
  return __libc_realloc(p, n);
}

void* new_impl(size_t n, size_t alignment, bool nothrow) {
  for (;;) {
    void* p = alignment > 16 ? do_aligned(alignment, n) : do_malloc(n);
    if (p) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    if (nothrow) {
      try {
        handler();
      } catch (...) {
        return nullptr;
      }
    } else {
      handler();
    }
  }
}

}  // namespace
}  // namespace cxlpool::detail::preload

using namespace cxlpool::detail::preload;

#define CXLPOOL_EXPORT extern "C" __attribute__((visibility("default")))

CXLPOOL_EXPORT void* malloc(size_t n) { return do_malloc(n); }
CXLPOOL_EXPORT void free(void* p) {
  if (__builtin_expect(from_loader(__builtin_return_address(0)), 0)) {
    LoaderCall call;
    do_free(p);
    return;
  }
  do_free(p);
}
CXLPOOL_EXPORT void* calloc(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  void* p = do_malloc(bytes);
  if (p) std::memset(p, 0, bytes);
  return p;
}
CXLPOOL_EXPORT void* realloc(void* p, size_t n) {
  if (__builtin_expect(from_loader(__builtin_return_address(0)), 0)) {
    LoaderCall call;
    return do_realloc(p, n);
  }
  return do_realloc(p, n);
}
CXLPOOL_EXPORT void* reallocarray(void* p, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return do_realloc(p, bytes);
}
CXLPOOL_EXPORT void* memalign(size_t alignment, size_t n) { return memalign_like(alignment, n); }
// glibc 2.36 treats aligned_alloc like memalign (a non-power-of-two alignment is rounded up).
CXLPOOL_EXPORT void* aligned_alloc(size_t alignment, size_t n) { return memalign_like(alignment, n); }
CXLPOOL_EXPORT int posix_memalign(void** out, size_t alignment, size_t n) {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) || alignment == 0) return EINVAL;
  int saved = errno;
  void* p = memalign_like(alignment, n);
  if (!p) {
    int err = errno ? errno : ENOMEM;
    errno = saved;
    return err;
  }
  *out = p;
  return 0;
}
CXLPOOL_EXPORT void* valloc(size_t n) { return memalign_like(size_t(sysconf(_SC_PAGESIZE)), n); }
CXLPOOL_EXPORT void* pvalloc(size_t n) {
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t rounded;
  if (__builtin_add_overflow(n, page - 1, &rounded)) {
    errno = ENOMEM;
    return nullptr;
  }
  rounded &= ~(page - 1);
  return memalign_like(page, rounded ? rounded : page);
}
CXLPOOL_EXPORT size_t malloc_usable_size(void* p) { return usable(p); }
CXLPOOL_EXPORT int mallopt(int, int) { return 1; }  // accepted and ignored (glibc returns 1 on success)
CXLPOOL_EXPORT int malloc_trim(size_t) {
  if (g_state.load(std::memory_order_acquire) != kReady) return 0;
  Busy busy;
  return cxlpool::detail::alloc::pool_trim(g_pool) > 0 ? 1 : 0;
}
CXLPOOL_EXPORT struct mallinfo2 mallinfo2() {
  struct mallinfo2 m {};
  if (g_state.load(std::memory_order_acquire) != kReady) return m;
  Busy busy;
  for (int d = 0; d < cxlpool::detail::alloc::pool_device_count(g_pool); ++d) {
    auto s = cxlpool::detail::alloc::pool_device_stats(g_pool, d);
    m.arena += s.resident_bytes;
    m.uordblks += s.allocated_bytes;
    m.usmblks += s.peak_resident_bytes;
  }
  m.fordblks = m.arena > m.uordblks ? m.arena - m.uordblks : 0;
  return m;
}
CXLPOOL_EXPORT struct mallinfo mallinfo() {
  struct mallinfo2 m2 = mallinfo2();
  struct mallinfo m {};
  auto clip = [](size_t v) { return int(v > size_t(INT32_MAX) ? INT32_MAX : v); };
  m.arena = clip(m2.arena);
  m.uordblks = clip(m2.uordblks);
  m.fordblks = clip(m2.fordblks);
  m.usmblks = clip(m2.usmblks);
  return m;
}
CXLPOOL_EXPORT void malloc_stats() {
  if (g_state.load(std::memory_order_acquire) != kReady) return;
  write_stats(2);  // to stderr now, as glibc's does
}

// C++ operators: new, new[], each plain / nothrow / aligned / aligned+nothrow; delete and
// delete[] plain, nothrow, sized, aligned, sized+aligned, aligned+nothrow.
__attribute__((visibility("default"))) void* operator new(size_t n) { return new_impl(n, 0, false); }
__attribute__((visibility("default"))) void* operator new[](size_t n) { return new_impl(n, 0, false); }
__attribute__((visibility("default"))) void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return new_impl(n, 0, true);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return new_impl(n, 0, true);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t a) {
  return new_impl(n, size_t(a), false);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t a) {
  return new_impl(n, size_t(a), false);
}
__attribute__((visibility("default"))) void* operator new(size_t n, std::align_val_t a,
                                                          const std::nothrow_t&) noexcept {
  return new_impl(n, size_t(a), true);
}
__attribute__((visibility("default"))) void* operator new[](size_t n, std::align_val_t a,
                                                            const std::nothrow_t&) noexcept {
  return new_impl(n, size_t(a), true);
}
__attribute__((visibility("default"))) void operator delete(void* p) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete[](void* p) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete(void* p, const std::nothrow_t&) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete[](void* p, const std::nothrow_t&) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete(void* p, size_t) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete[](void* p, size_t) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete(void* p, std::align_val_t) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete[](void* p, std::align_val_t) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete(void* p, size_t, std::align_val_t) noexcept { do_free(p); }
__attribute__((visibility("default"))) void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  do_free(p);
}
__attribute__((visibility("default"))) void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  do_free(p);
}
__attribute__((visibility("default"))) void operator delete[](void* p, std::align_val_t,
                                                              const std::nothrow_t&) noexcept {
  do_free(p);
}

// SPDX-License-Identifier: MIT
// bench/kvcache: handing a prompt's KV cache from a prefill process to a decode process, real
// processes and real bytes (checksums verified), by every path side by side: (a) the shared
// pool's zero-copy handoff (cxlpool_kv_seq_export -> cxlpool_kv_import: a 48-byte handle, the
// decode side reads the blocks in place); (d) a loopback TCP socket; (c) the disaggregated
// demo's shape with a storage hop (prefill -> storage process -> decode: two TCP transfers,
// store and forward); (e) a copy through shared memory (memcpy into the decode process's own
// memory). Sizes from one block to 2048 tokens of OPT-6.7B (1 GiB); prefix reuse 0/50/90 %
// (the reused part is already on the decode side: only the rest moves, except in place).
// Reports handoff latency (until the decode side can read every byte) and a
// time-to-first-token style figure (handoff plus one read of the whole prefix), p50/p99 and
// GB/s, and a MODELLED table for hardware this machine does not have (CXL, RDMA NICs, PCIe),
// every parameter printed and overridable, labelled "model". Table, --json, --plot (gnuplot).
// (b) UCX (libcxlpool_ucx, ucx-tcp and ucx-sm): the decode process has a pool of its own and
// fetches the sequence from the prefill process's KV server over UCX tcp (UCX_TLS=tcp), or
// through shared memory and CMA (CXLPOOL_KV_REMOTE_SAME_HOST on both ends; the decode process
// refuses to run when its connection's path is not "same host"); it moves the whole sequence
// whatever the reuse (the remote import has no prefix to merge).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_output.hpp"
#include "cxlpool/cxlpool.h"
#include "cxlpool/kvcache_remote.h"

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Options {
  std::string model = "opt-6.7b";
  uint32_t tokens_per_block = 16;
  std::vector<uint64_t> tokens{16, 128, 512, 2048};
  std::vector<int> reuse{0, 50, 90};
  int reps = 7;
  std::vector<std::string> paths{"pool", "ucx-tcp", "ucx-sm", "tcp", "storage-hop", "shm-memcpy"};
  std::string json, plot;
  // The model's parameters (GB/s = 1e9 bytes per second; latencies in us).
  double cxl_gbps = 64, cxl_lat_us = 0.4;         // CXL 2.0 x16 Gen5 memory, read in place
  double rdma200_gbps = 25, rdma100_gbps = 12.5;  // 200 and 100 Gb/s RDMA NICs
  double rdma_lat_us = 3;                         // per transfer
  double copy_gbps = 64;                          // the extra copy on the RDMA side (host -> GPU, PCIe Gen5 x16)
  double storage_gbps = 7;                        // the storage hop's device (NVMe Gen4), when modelled
};

uint64_t sum_words(const void* p, size_t n) {
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t a = 0, b = 0;
  for (size_t i = 0; i + 1 < n / 8; i += 2) {
    a += w[i] ^ (i * 0x9e3779b97f4a7c15ull);
    b ^= w[i + 1] + i;
  }
  return a ^ (b << 1);
}

void fill(void* p, size_t n, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) w[i] = seed * 0x2545f4914f6cdd1dull + i;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}

// A listening loopback socket and its port.
int listen_lo(uint16_t* port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 4) != 0) return -1;
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return s;
}
int connect_lo(uint16_t port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  int one = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? s : -1;
}

struct Trial {
  double handoff = 0, ttft = 0;
  bool ok = false;
};

struct Row {
  std::string path;
  uint64_t tokens = 0;
  int reuse = 0;
  uint64_t bytes = 0, moved = 0;
  std::vector<double> handoff, ttft;
  int bad = 0;
  std::string error;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = size_t(p * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// ---- the decode side of the pool and UCX paths: its own process, its own participant ----
// remote == nullptr: imports from the shared pool device (in place); otherwise creates a pool
// of its own on device (pool_bytes) and fetches from the KV server at remote.
int consumer(const char* device, const char* remote, uint64_t pool_bytes, uint32_t flags, int in, int out,
             const cxlpool_kv_geometry_t& g) {
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_kv_remote_t* conn = nullptr;
  cxlpool_status_t st;
  if (!remote) {
    st = cxlpool_shared_pool_open(device, nullptr, &pool);
  } else {
    cxlpool_shared_params_t* p = nullptr;
    cxlpool_shared_params_create(&p);
    cxlpool_shared_params_set_size(p, pool_bytes);
    st = cxlpool_shared_pool_create(device, p, 0, &pool);
    cxlpool_shared_params_destroy(p);
    if (st == CXLPOOL_OK) st = cxlpool_kv_remote_connect(remote, 30000, flags, &conn);
  }
  if (st != CXLPOOL_OK) {
    std::fprintf(stderr, "consumer: %s\n", cxlpool_last_error_message());
    return 3;
  }
  if (flags & CXLPOOL_KV_REMOTE_SAME_HOST) {  // measured as shared memory only if it is
    char path[512] = "";
    cxlpool_kv_remote_path(conn, path, sizeof path);
    if (std::strncmp(path, "same host: ", 11) != 0) {
      std::fprintf(stderr, "consumer: ucx-sm: the connection is not through shared memory: %s\n", path);
      return 3;
    }
    std::fprintf(stderr, "ucx-sm: %s\n", path);
  }
  for (;;) {
    cxlpool_kv_handle_t h{};
    if (!read_all(in, &h, sizeof h)) break;
    cxlpool_kv_view_t* v = nullptr;
    uint64_t result[2] = {0, 0};  // status, checksum
    st = conn ? cxlpool_kv_remote_import(conn, &pool, 1, &g, &h, &v) : cxlpool_kv_import(&pool, 1, &g, &h, &v);
    if (st != CXLPOOL_OK) std::fprintf(stderr, "consumer: %s\n", cxlpool_last_error_message());
    const char ready = st == CXLPOOL_OK ? 'r' : 'x';
    write_all(out, &ready, 1);  // the handoff is done: every block is readable here
    if (st == CXLPOOL_OK) {
      cxlpool_kv_view_info_t info{};
      cxlpool_kv_view_info(v, &info);
      for (uint64_t b = 0; b < info.blocks; ++b) {
        const void* data = nullptr;
        cxlpool_kv_view_block(v, b, &data);
        result[1] ^= sum_words(data, size_t(info.bytes_per_block)) + b;
      }
      cxlpool_kv_view_release(v);
    }
    result[0] = uint64_t(-int64_t(st));
    write_all(out, result, sizeof result);
  }
  if (conn) cxlpool_kv_remote_close(conn);
  cxlpool_shared_pool_close(pool);
  if (remote) cxlpool_shared_pool_unlink(device);
  return 0;
}

class Bench {
 public:
  explicit Bench(const Options& o, const char* self) : o_(o), self_(self) {}
  int run();

 private:
  bool setup();
  Row measure(const std::string& path, uint64_t tokens, int reuse);
  Trial pool_trial(const std::string& path, uint64_t tokens, int reuse, uint64_t seed, uint64_t* moved);
  bool spawn_consumer(const std::string& path);
  Trial copy_trial(const std::string& path, uint64_t bytes, uint64_t seed);
  void model_table(FILE* json);
  void summary_table() const;
  struct Modelled {
    double cxl, r200, r100, r200s;  // seconds
  };
  Modelled model_at(uint64_t tokens) const;

  Options o_;
  const char* self_;
  cxlpool_kv_geometry_t g_{};
  uint64_t per_token_ = 0, per_block_ = 0;
  std::string pool_name_, device_;
  cxlpool_shared_pool_t* pool_ = nullptr;
  cxlpool_kv_arena_t* arena_ = nullptr;
  cxlpool_kv_server_t* server_ = nullptr;
  std::string server_address_;
  struct Consumer {
    std::string path;
    pid_t pid = -1;
    int to = -1, from = -1;
  };
  std::vector<Consumer> consumers_;  // the pool path's and each UCX path's decode process
  uint64_t consumer_pool_bytes_ = 0;
  std::vector<Row> rows_;
};

bool Bench::setup() {
  if (cxlpool_kv_geometry_preset(o_.model.c_str(), o_.tokens_per_block, &g_) != CXLPOOL_OK ||
      cxlpool_kv_geometry_sizes(&g_, &per_token_, &per_block_) != CXLPOOL_OK) {
    std::fprintf(stderr, "kvcache_bench: %s\n", cxlpool_last_error_message());
    return false;
  }
  uint64_t max_tokens = *std::max_element(o_.tokens.begin(), o_.tokens.end());
  // Room for two sequences of the largest size (the reused prefix's owner and the new one).
  const uint64_t bytes = 2 * ((max_tokens + o_.tokens_per_block) * per_token_) + (256u << 20);
  pool_name_ = "cxlpool-kvbench-" + std::to_string(getpid());
  device_ = "shm:" + pool_name_;
  cxlpool_shared_params_t* p = nullptr;
  cxlpool_shared_params_create(&p);
  cxlpool_shared_params_set_size(p, bytes);
  cxlpool_status_t st = cxlpool_shared_pool_create(device_.c_str(), p, 0, &pool_);
  cxlpool_shared_params_destroy(p);
  if (st != CXLPOOL_OK) {
    std::fprintf(stderr, "kvcache_bench: %s\n", cxlpool_last_error_message());
    return false;
  }
  cxlpool_kv_params_t* kp = nullptr;
  cxlpool_kv_params_create(&kp);
  st = cxlpool_kv_arena_create(&g_, &pool_, 1, kp, &arena_);
  cxlpool_kv_params_destroy(kp);
  if (st != CXLPOOL_OK) {
    std::fprintf(stderr, "kvcache_bench: %s\n", cxlpool_last_error_message());
    return false;
  }
  consumer_pool_bytes_ = (max_tokens + o_.tokens_per_block) * per_token_ + (64u << 20);
  for (const std::string& path : o_.paths) {
    if (path.rfind("ucx-", 0) == 0 && !server_) {
      if (cxlpool_kv_server_start(&pool_, 1, "127.0.0.1:0", CXLPOOL_KV_REMOTE_SAME_HOST, &server_) != CXLPOOL_OK) {
        std::fprintf(stderr, "kvcache_bench: %s\n", cxlpool_last_error_message());
        return false;
      }
      char a[128];
      cxlpool_kv_server_address(server_, a, sizeof a);
      server_address_ = a;
    }
    if ((path == "pool" || path.rfind("ucx-", 0) == 0) && !spawn_consumer(path)) return false;
  }
  return true;
}

// A decode process for path: exec'd, so that it is a participant of its own; the UCX ones with
// their transports chosen by UCX_TLS (loopback only).
bool Bench::spawn_consumer(const std::string& path) {
  int down[2], up[2];
  if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) return false;  // other decode processes must not hold them
  pid_t pid = fork();
  if (pid == 0) {
    dup2(down[0], 3);
    dup2(up[1], 4);
    fcntl(3, F_SETFD, 0);  // (dup2 onto itself keeps close-on-exec)
    fcntl(4, F_SETFD, 0);
    std::string tpb = std::to_string(o_.tokens_per_block);
    if (path == "pool") {
      execl(self_, self_, "--role", "pool-consumer", device_.c_str(), o_.model.c_str(), tpb.c_str(), (char*)nullptr);
    } else {
      const bool sm = path == "ucx-sm";
      setenv("UCX_TLS", sm ? "sm,tcp" : "tcp", 1);  // sm: tcp only for the connection it is made on
      setenv("UCX_NET_DEVICES", "lo", 1);
      std::string own = device_ + "-" + path, bytes = std::to_string(consumer_pool_bytes_);
      execl(self_, self_, "--role", "ucx-consumer", own.c_str(), o_.model.c_str(), tpb.c_str(), server_address_.c_str(),
            bytes.c_str(), sm ? "same-host" : "network", (char*)nullptr);
    }
    _exit(127);
  }
  close(down[0]);
  close(up[1]);
  consumers_.push_back({path, pid, down[1], up[0]});
  return true;
}

Trial Bench::pool_trial(const std::string& path, uint64_t tokens, int reuse, uint64_t seed, uint64_t* moved) {
  Trial t;
  const Consumer* c = nullptr;
  for (const Consumer& x : consumers_)
    if (x.path == path) c = &x;
  if (!c) return t;
  const uint64_t shared = tokens * uint64_t(reuse) / 100 / o_.tokens_per_block * o_.tokens_per_block;
  std::vector<int32_t> ids(tokens);
  for (uint64_t i = 0; i < tokens; ++i) ids[i] = int32_t(i < shared ? i : seed * 1000003 + i);
  // The reused prefix: a sequence that computed it before (sealed, cached).
  cxlpool_kv_seq_t* before = nullptr;
  if (shared) {
    cxlpool_kv_seq_create(arena_, &before);
    size_t r = 0;
    cxlpool_kv_seq_append(before, ids.data(), shared, &r);
    if (r == 0)
      for (uint64_t b = 0; b < shared / o_.tokens_per_block; ++b) {
        void* d = nullptr;
        cxlpool_kv_seq_block(before, b, &d, nullptr);
        fill(d, per_block_, b);
      }
    cxlpool_kv_seq_seal(before, shared);
  }
  cxlpool_kv_seq_t* s = nullptr;
  cxlpool_kv_seq_create(arena_, &s);
  size_t reused = 0;
  if (cxlpool_kv_seq_append(s, ids.data(), ids.size(), &reused) != CXLPOOL_OK) {
    std::fprintf(stderr, "kvcache_bench: %s\n", cxlpool_last_error_message());
    if (before) cxlpool_kv_seq_destroy(before);
    cxlpool_kv_seq_destroy(s);
    return t;
  }
  cxlpool_kv_seq_info_t info{};
  cxlpool_kv_seq_info(s, &info);
  uint64_t want = 0;
  for (uint64_t b = 0; b < info.blocks; ++b) {
    void* d = nullptr;
    cxlpool_kv_seq_block(s, b, &d, nullptr);
    if (b * o_.tokens_per_block >= reused) fill(d, per_block_, b < shared / o_.tokens_per_block ? b : seed + b);
    want ^= sum_words(d, per_block_) + b;
  }
  cxlpool_kv_seq_seal(s, tokens);
  // The pool path moves the handle (the blocks stay where they are); a UCX path every block.
  *moved = path == "pool" ? sizeof(cxlpool_kv_handle_t) : info.blocks * per_block_;  // pool: the handle
  const auto t0 = Clock::now();
  cxlpool_kv_handle_t h{};
  if (cxlpool_kv_seq_export(s, 0, &h) == CXLPOOL_OK && write_all(c->to, &h, sizeof h)) {
    char ready = 0;
    uint64_t result[2] = {};
    if (read_all(c->from, &ready, 1)) {
      const auto t1 = Clock::now();
      if (read_all(c->from, result, sizeof result)) {
        const auto t2 = Clock::now();
        t.handoff = secs(t0, t1);
        t.ttft = secs(t0, t2);
        t.ok = ready == 'r' && result[0] == 0 && result[1] == want;
      }
    }
  }
  cxlpool_kv_seq_destroy(s);
  if (before) cxlpool_kv_seq_destroy(before);
  return t;
}

// The copy paths, bytes of KV that must move (the reused part is on the decode side already).
Trial Bench::copy_trial(const std::string& path, uint64_t bytes, uint64_t seed) {
  Trial t;
  // The prefill side's KV, in shared memory (as it would be on a real server's pool or GPU).
  void* src = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (src == MAP_FAILED) return t;
  fill(src, bytes, seed);
  const uint64_t want = sum_words(src, bytes);
  int res[2], go[2];
  if (pipe(res) != 0 || pipe(go) != 0) {
    munmap(src, bytes);
    return t;
  }
  uint16_t port = 0, relay_port = 0;
  int lsock = path == "shm-memcpy" ? -1 : listen_lo(&port);
  int rlsock = path == "storage-hop" ? listen_lo(&relay_port) : -1;
  Clock::time_point t0;
  // The decode process: receives (or copies) into its own, pre-faulted memory, says when it
  // has every byte, then reads it once.
  pid_t dec = fork();
  if (dec == 0) {
    void* dst = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    char start = 0;
    bool ok = dst != MAP_FAILED && read_all(go[0], &start, 1);  // the clock runs from here
    if (path == "shm-memcpy") {
      if (ok) std::memcpy(dst, src, bytes);
    } else {
      int c = -1;
      if (path == "tcp") {
        c = accept(lsock, nullptr, nullptr);
      } else {
        c = accept(rlsock, nullptr, nullptr);  // from the storage process
      }
      ok = ok && c >= 0 && read_all(c, dst, bytes);
      if (c >= 0) close(c);
    }
    const char ready = ok ? 'r' : 'x';
    write_all(res[1], &ready, 1);
    const uint64_t got = ok ? sum_words(dst, bytes) : 0;
    write_all(res[1], &got, sizeof got);
    _exit(0);
  }
  // The storage process: receives everything, then forwards it (store and forward).
  pid_t relay = -1;
  if (path == "storage-hop") {
    relay = fork();
    if (relay == 0) {
      void* buf = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      int in = accept(lsock, nullptr, nullptr);
      bool ok = buf != MAP_FAILED && in >= 0 && read_all(in, buf, bytes);
      int out = connect_lo(relay_port);
      ok = ok && out >= 0 && write_all(out, buf, bytes);
      _exit(ok ? 0 : 1);
    }
  }
  usleep(20000);  // both are listening / mapped before the clock starts
  t0 = Clock::now();
  const char start = 'g';
  write_all(go[1], &start, 1);
  if (path != "shm-memcpy") {
    int c = connect_lo(port);
    if (c < 0 || !write_all(c, src, bytes)) std::fprintf(stderr, "kvcache_bench: %s send failed\n", path.c_str());
    if (c >= 0) close(c);
  }
  char ready = 0;
  uint64_t got = 0;
  if (read_all(res[0], &ready, 1)) {
    const auto t1 = Clock::now();
    if (read_all(res[0], &got, sizeof got)) {
      const auto t2 = Clock::now();
      t.handoff = secs(t0, t1);
      t.ttft = secs(t0, t2);
      t.ok = ready == 'r' && got == want;
    }
  }
  waitpid(dec, nullptr, 0);
  if (relay > 0) waitpid(relay, nullptr, 0);
  if (lsock >= 0) close(lsock);
  if (rlsock >= 0) close(rlsock);
  close(res[0]);
  close(res[1]);
  close(go[0]);
  close(go[1]);
  munmap(src, bytes);
  return t;
}

Row Bench::measure(const std::string& path, uint64_t tokens, int reuse) {
  Row r;
  r.path = path;
  r.tokens = tokens;
  r.reuse = reuse;
  r.bytes = tokens * per_token_;
  const uint64_t shared = tokens * uint64_t(reuse) / 100 / o_.tokens_per_block * o_.tokens_per_block;
  r.moved = (tokens - shared) * per_token_;
  const int reps = r.bytes > (uint64_t(256) << 20) ? std::max(3, o_.reps / 2) : o_.reps;
  for (int i = 0; i < reps + 1; ++i) {  // the first is a warm-up
    Trial t;
    if (path == "pool" || path.rfind("ucx-", 0) == 0) {
      uint64_t moved = 0;
      t = pool_trial(path, tokens, reuse, uint64_t(i + 1) * 7919 + tokens, &moved);
      r.moved = moved;
    } else {
      t = copy_trial(path, std::max<uint64_t>(r.moved, 4096), uint64_t(i + 1));
    }
    if (!t.ok) ++r.bad;
    if (i == 0) continue;
    r.handoff.push_back(t.handoff);
    r.ttft.push_back(t.ttft);
  }
  return r;
}

// Transfer of S bytes: latency + S / bandwidth. CXL: the decode side reads the pooled KV in
// place once (one pass at CXL bandwidth). RDMA: the NIC moves it into the decode host's memory,
// then one more copy (host -> GPU over PCIe, copy_gbps). With a storage hop: the same, twice
// over the network, plus the storage device once.
Bench::Modelled Bench::model_at(uint64_t tokens) const {
  const double s = double(tokens * per_token_) / 1e9;
  Modelled m{};
  m.cxl = o_.cxl_lat_us * 1e-6 + s / o_.cxl_gbps;
  m.r200 = o_.rdma_lat_us * 1e-6 + s / o_.rdma200_gbps + s / o_.copy_gbps;
  m.r100 = o_.rdma_lat_us * 1e-6 + s / o_.rdma100_gbps + s / o_.copy_gbps;
  m.r200s = 2 * (o_.rdma_lat_us * 1e-6 + s / o_.rdma200_gbps) + s / o_.storage_gbps + s / o_.copy_gbps;
  return m;
}

void Bench::model_table(FILE* json) {
  std::printf(
      "\nMODEL (not measured; parameters: CXL %.0f GB/s, %.1f us; RDMA 200 Gb %.1f GB/s, 100 Gb %.1f GB/s, %.0f us; "
      "extra copy %.0f GB/s; storage %.0f GB/s; override with --cxl-gbps, --rdma200-gbps, --rdma100-gbps, "
      "--copy-gbps, --storage-gbps)\n",
      o_.cxl_gbps, o_.cxl_lat_us, o_.rdma200_gbps, o_.rdma100_gbps, o_.rdma_lat_us, o_.copy_gbps, o_.storage_gbps);
  std::printf("%8s %10s %14s %14s %14s %16s %12s %12s\n", "tokens", "bytes", "model CXL ms", "model RDMA200",
              "model RDMA100", "model RDMA200+st", "200/CXL", "100/CXL");
  if (json)
    std::fprintf(json,
                 ",\"model\":{\"label\":\"model\",\"cxl_gbps\":%g,\"cxl_latency_us\":%g,\"rdma200_gbps\":%g,"
                 "\"rdma100_gbps\":%g,\"rdma_latency_us\":%g,\"copy_gbps\":%g,\"storage_gbps\":%g,\"rows\":[",
                 o_.cxl_gbps, o_.cxl_lat_us, o_.rdma200_gbps, o_.rdma100_gbps, o_.rdma_lat_us, o_.copy_gbps,
                 o_.storage_gbps);
  bool first = true;
  for (uint64_t tokens : o_.tokens) {
    const auto [cxl, r200, r100, r200s] = model_at(tokens);
    std::printf("%8llu %10llu %14.3f %14.3f %14.3f %16.3f %11.2fx %11.2fx\n", (unsigned long long)tokens,
                (unsigned long long)(tokens * per_token_), cxl * 1e3, r200 * 1e3, r100 * 1e3, r200s * 1e3, r200 / cxl,
                r100 / cxl);
    if (json)
      std::fprintf(
          json, "%s{\"tokens\":%llu,\"cxl_s\":%.6g,\"rdma200_s\":%.6g,\"rdma100_s\":%.6g,\"rdma200_storage_s\":%.6g}",
          first ? "" : ",", (unsigned long long)tokens, cxl, r200, r100, r200s);
    first = false;
  }
  if (json) std::fprintf(json, "]}");
  std::printf(
      "model: the demo's 3.8x (200 Gb) and 6.5x (100 Gb) come out when the RDMA path has one more copy at "
      "about the CXL bandwidth (host -> GPU over PCIe Gen5 x16) than the in-place CXL read: ratios "
      "1 + CXL/RDMA = %.2fx and %.2fx at these parameters\n",
      1 + o_.cxl_gbps / o_.rdma200_gbps, 1 + o_.cxl_gbps / o_.rdma100_gbps);
}

// Measured and modelled side by side, one row per size (no prefix reuse): what the seed's
// experiment compares, the model's columns named so.
void Bench::summary_table() const {
  std::printf("\nhandoff p50 in ms, no prefix reuse: measured paths, then the model's columns\n%8s", "tokens");
  for (const std::string& path : o_.paths) std::printf(" %12s", path.c_str());
  std::printf(" %12s %14s %14s\n", "model CXL", "model RDMA200", "model RDMA100");
  for (uint64_t tokens : o_.tokens) {
    std::printf("%8llu", (unsigned long long)tokens);
    for (const std::string& path : o_.paths) {
      double ms = -1;
      for (const Row& r : rows_)
        if (r.path == path && r.tokens == tokens && r.reuse == 0 && !r.handoff.empty() && r.bad == 0)
          ms = pct(r.handoff, 0.5) * 1e3;
      if (ms < 0)
        std::printf(" %12s", "-");
      else
        std::printf(" %12.3f", ms);
    }
    const Modelled m = model_at(tokens);
    std::printf(" %12.3f %14.3f %14.3f\n", m.cxl * 1e3, m.r200 * 1e3, m.r100 * 1e3);
  }
}

int Bench::run() {
  if (!setup()) return 1;
  std::printf(
      "kvcache_bench: %s, %u tokens per block (%llu bytes per token, %llu per block); %d repetitions "
      "(half above 256 MiB) after a warm-up; processes on this machine (2 vCPUs), loopback TCP\n\n",
      o_.model.c_str(), o_.tokens_per_block, (unsigned long long)per_token_, (unsigned long long)per_block_, o_.reps);
  for (int reuse : o_.reuse)
    for (uint64_t tokens : o_.tokens)
      for (const std::string& path : o_.paths) rows_.push_back(measure(path, tokens, reuse));
  std::printf("%-12s %6s %6s %12s %12s %12s %12s %12s %10s %6s\n", "path", "reuse", "tokens", "bytes", "moved",
              "handoff p50", "handoff p99", "TTFT p50 ms", "GB/s", "bad");
  for (const Row& r : rows_) {
    const double p50 = pct(r.handoff, 0.5), p99 = pct(r.handoff, 0.99), t50 = pct(r.ttft, 0.5);
    std::printf("%-12s %5d%% %6llu %12llu %12llu %10.3fms %10.3fms %12.3f %10.2f %6d\n", r.path.c_str(), r.reuse,
                (unsigned long long)r.tokens, (unsigned long long)r.bytes, (unsigned long long)r.moved, p50 * 1e3,
                p99 * 1e3, t50 * 1e3, p50 > 0 ? double(r.bytes) / p50 / 1e9 : 0, r.bad);
  }
  // Ratios against loopback TCP, same size and reuse.
  std::printf("\nhandoff p50, TCP / path (higher: faster than TCP):\n");
  for (const Row& r : rows_) {
    if (r.path == "tcp") continue;
    for (const Row& t : rows_)
      if (t.path == "tcp" && t.tokens == r.tokens && t.reuse == r.reuse && pct(r.handoff, 0.5) > 0)
        std::printf("  %-12s reuse %2d%% %5llu tokens: %8.1fx\n", r.path.c_str(), r.reuse, (unsigned long long)r.tokens,
                    pct(t.handoff, 0.5) / pct(r.handoff, 0.5));
  }
  FILE* json = o_.json.empty() ? nullptr : open_bench_output(o_.json);
  if (json) {
    std::fprintf(json, "{\"model_name\":\"%s\",\"tokens_per_block\":%u,\"bytes_per_token\":%llu,\"runs\":[",
                 o_.model.c_str(), o_.tokens_per_block, (unsigned long long)per_token_);
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      std::fprintf(json,
                   "%s{\"path\":\"%s\",\"reuse_percent\":%d,\"tokens\":%llu,\"bytes\":%llu,\"moved_bytes\":%llu,"
                   "\"handoff_p50_s\":%.6g,\"handoff_p99_s\":%.6g,\"ttft_p50_s\":%.6g,\"ttft_p99_s\":%.6g,\"bad\":%d}",
                   i ? "," : "", r.path.c_str(), r.reuse, (unsigned long long)r.tokens, (unsigned long long)r.bytes,
                   (unsigned long long)r.moved, pct(r.handoff, 0.5), pct(r.handoff, 0.99), pct(r.ttft, 0.5),
                   pct(r.ttft, 0.99), r.bad);
    }
    std::fprintf(json, "]");
  }
  model_table(json);
  summary_table();
  if (json) {
    std::fprintf(json, "}\n");
    std::fclose(json);
    std::printf("\nJSON: %s\n", o_.json.c_str());
  }
  if (!o_.plot.empty()) {
    const std::string dat = o_.plot + ".dat", gp = o_.plot + ".gp";
    FILE* d = open_bench_output(dat);
    FILE* g = d ? open_bench_output(gp) : nullptr;
    if (d && !g) std::fclose(d);
    if (g) {
      std::vector<std::string> titles;
      for (const std::string& path : o_.paths) {
        for (const Row& r : rows_)
          if (r.path == path && r.reuse == 0)
            std::fprintf(d, "%llu %.6g\n", (unsigned long long)r.tokens, pct(r.handoff, 0.5) * 1e3);
        std::fprintf(d, "\n\n");
        titles.push_back(path + " (measured)");
      }
      std::fclose(d);
      std::fprintf(
          g,
          "set terminal pngcairo size 1000,600\nset output '%s'\nset logscale xy\nset xlabel 'tokens of %s "
          "(%llu bytes each)'\nset ylabel 'handoff p50 (ms)'\nset key left top\nset title 'bench/kvcache: prefill "
          "-> decode handoff, no prefix reuse'\nplot ",
          o_.plot.c_str(), o_.model.c_str(), (unsigned long long)per_token_);
      for (size_t i = 0; i < titles.size(); ++i)
        std::fprintf(g, "%s'%s' index %zu with linespoints lw 2 title '%s'", i ? ", " : "", dat.c_str(), i,
                     titles[i].c_str());
      // The model's lines, labelled as such.
      std::fprintf(g,
                   ", %g*x*%llu/1e6 with lines dt 2 title 'model: CXL %.0f GB/s', %g*x*%llu/1e6 with lines dt 2 title "
                   "'model: RDMA 200 Gb + copy'\n",
                   1 / o_.cxl_gbps, (unsigned long long)per_token_, o_.cxl_gbps, 1 / o_.rdma200_gbps + 1 / o_.copy_gbps,
                   (unsigned long long)per_token_);
      std::fclose(g);
      if (std::system(("gnuplot '" + gp + "'").c_str()) == 0) std::printf("plot: %s\n", o_.plot.c_str());
    }
  }
  for (Consumer& c : consumers_) {
    close(c.to);
    close(c.from);
    waitpid(c.pid, nullptr, 0);
  }
  if (server_) cxlpool_kv_server_stop(server_);
  cxlpool_kv_arena_destroy(arena_);
  cxlpool_shared_pool_close(pool_);
  cxlpool_shared_pool_unlink(device_.c_str());
  int bad = 0;
  for (const Row& r : rows_) bad += r.bad;
  if (bad) std::printf("\n%d trials with a wrong checksum or a failed transfer\n", bad);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[1]) == "--role" && std::string(argv[2]) == "pool-consumer") {
    cxlpool_kv_geometry_t g{};
    if (cxlpool_kv_geometry_preset(argv[4], uint32_t(std::atoi(argv[5])), &g) != CXLPOOL_OK) return 2;
    return consumer(argv[3], nullptr, 0, 0, 3, 4, g);
  }
  if (argc >= 9 && std::string(argv[1]) == "--role" && std::string(argv[2]) == "ucx-consumer") {
    cxlpool_kv_geometry_t g{};
    if (cxlpool_kv_geometry_preset(argv[4], uint32_t(std::atoi(argv[5])), &g) != CXLPOOL_OK) return 2;
    const uint32_t flags = std::string(argv[8]) == "same-host" ? CXLPOOL_KV_REMOTE_SAME_HOST : 0;
    return consumer(argv[3], argv[6], std::strtoull(argv[7], nullptr, 10), flags, 3, 4, g);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int first = bench_options_start("kvcache_bench", CXLPOOL_BENCH_BUILD_TYPE, argc, argv);
  if (first < 0) return 2;
  Options o;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvcache_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      o.model = next();
    else if (a == "--tokens-per-block")
      o.tokens_per_block = uint32_t(std::atoi(next().c_str()));
    else if (a == "--tokens") {
      o.tokens.clear();
      for (auto& t : split_commas(next())) o.tokens.push_back(std::strtoull(t.c_str(), nullptr, 10));
    } else if (a == "--reuse") {
      o.reuse.clear();
      for (auto& t : split_commas(next())) o.reuse.push_back(std::atoi(t.c_str()));
    } else if (a == "--paths")
      o.paths = split_commas(next());
    else if (a == "--reps")
      o.reps = std::max(1, std::atoi(next().c_str()));
    else if (a == "--json")
      o.json = next();
    else if (a == "--plot")
      o.plot = next();
    else if (a == "--cxl-gbps")
      o.cxl_gbps = std::atof(next().c_str());
    else if (a == "--rdma200-gbps")
      o.rdma200_gbps = std::atof(next().c_str());
    else if (a == "--rdma100-gbps")
      o.rdma100_gbps = std::atof(next().c_str());
    else if (a == "--copy-gbps")
      o.copy_gbps = std::atof(next().c_str());
    else if (a == "--storage-gbps")
      o.storage_gbps = std::atof(next().c_str());
    else {
      std::fprintf(
          stderr,
          "usage: kvcache_bench [--any-build] [--model opt-6.7b] [--tokens-per-block 16] [--tokens 16,128,512,2048] "
          "[--reuse 0,50,90] [--paths pool,ucx-tcp,ucx-sm,tcp,storage-hop,shm-memcpy] [--reps 7] [--json F] "
          "[--plot F.png] "
          "[--cxl-gbps 64] [--rdma200-gbps 25] [--rdma100-gbps 12.5] [--copy-gbps 64] [--storage-gbps 7]\n");
      return 2;
    }
  }
  for (uint64_t t : o.tokens)
    if (t == 0 || t % o.tokens_per_block) {
      std::fprintf(stderr, "kvcache_bench: --tokens must be multiples of --tokens-per-block (%u)\n",
                   o.tokens_per_block);
      return 2;
    }
  for (const std::string& p : o.paths)
    if (p != "pool" && p != "ucx-tcp" && p != "ucx-sm" && p != "tcp" && p != "storage-hop" && p != "shm-memcpy") {
      std::fprintf(stderr, "kvcache_bench: unknown path '%s' (pool, ucx-tcp, ucx-sm, tcp, storage-hop, shm-memcpy)\n",
                   p.c_str());
      return 2;
    }
  Bench b(o, "/proc/self/exe");
  return b.run();
}

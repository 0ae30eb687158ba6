// SPDX-License-Identifier: MIT
// bench/ttft: time to first token of a decode server whose prompt was prefilled elsewhere, for
// an OPT model computed by lib/engine (opt-125m's shape, random weights made at startup: no
// download). Real processes, real bytes: the prefill process computes the prompt's keys and
// values into KV blocks of a shared pool once per size; a decode process then gets its first
// token (a) by recomputing the whole prefill itself, (b) from the pool handoff (a 48-byte
// handle; the last prompt token is run again over the blocks, read in place), (c) after the
// blocks came over a loopback TCP socket into a landing view of its own pool, (d) over UCX
// (libcxlpool_ucx: tcp on loopback, and the same-host shared-memory path). Every path's first
// token must equal the prefill's own (a mismatch counts as bad). TTFT = from asking the decode
// process until it has its first token. A MODELLED table for OPT-6.7B on hardware this machine
// lacks (CXL, RDMA NICs, a GPU), every parameter printed and overridable, labelled "model";
// its CXL and RDMA figures are bench/kvcache's. Table, --json, --plot (gnuplot).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_output.hpp"
#include "cxlpool/cxlpool.h"
#include "cxlpool/kvcache_remote.h"
#include "engine/error.hpp"
#include "engine/generate.hpp"
#include "engine/kernels.hpp"

using namespace cxlpool::engine;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<uint64_t> tokens{128, 256, 512, 1024, 2048};
  std::vector<std::string> paths{"recompute", "pool", "tcp", "ucx-tcp", "ucx-sm"};
  int reps = 3;
  unsigned threads = 0;
  uint32_t layers = 12;  // opt-125m: 12 layers, d 768, 12 heads, ffn 3072, vocab 50272, 2048 positions
  uint32_t block_tokens = 16;
  std::string json, plot;
  // The model (OPT-6.7B on hardware this machine lacks). CXL and RDMA: bench/kvcache's figures.
  double cxl_gbps = 64, cxl_lat_us = 0.4, rdma200_gbps = 25, rdma100_gbps = 12.5, rdma_lat_us = 3, copy_gbps = 64;
  double gpu_tflops = 312, mfu = 0.5, hbm_gbps = 2039;  // A100 80 GB: bf16 dense, a typical prefill MFU, HBM2e
};

OptConfig model_config(const Options& o) { return OptConfig{768, 12, o.layers, 3072, 50272, 2048}; }
constexpr uint64_t kSeed = 125;

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t k = write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    const ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}

std::vector<int32_t> prompt_of(uint64_t n) {
  std::vector<int32_t> p(n);
  uint64_t s = 0x9e3779b97f4a7c15ull * (n + 1);
  for (auto& t : p) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t = int32_t(s % 50272);
  }
  return p;
}

// What the prefill process asks of a decode process.
struct Request {
  uint32_t tokens = 0;
  uint32_t stop = 0;
  cxlpool_kv_handle_t handle{};
};
struct Reply {
  int32_t status = 0;  // 0 or a cxlpool status / -1000 engine error
  int32_t first = -1;
};

// ---- the decode process --------------------------------------------------------------
int decode_process(const std::string& path, const std::string& shared_device, const std::string& own_device,
                   const std::string& ucx_address, uint16_t tcp_port, const Options& o) {
  std::fprintf(stderr, "ttft_bench: decode process for %s: making the model\n", path.c_str());
  OptModel model(random_opt_weights(model_config(o), kSeed), o.threads);
  const auto g = model.kv_geometry(CXLPOOL_KV_FP16, o.block_tokens);
  uint64_t per_token = 0, per_block = 0;
  cxlpool_kv_geometry_sizes(&g, &per_token, &per_block);
  cxlpool_shared_pool_t* shared = nullptr;
  cxlpool_shared_pool_t* own = nullptr;
  cxlpool_kv_remote_t* remote = nullptr;
  cxlpool_kv_arena_t* arena = nullptr;
  int tcp = -1;
  try {
    const uint64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
    cxlpool_shared_params_t* p = nullptr;
    check_cxlpool(cxlpool_shared_params_create(&p), "params");
    check_cxlpool(cxlpool_shared_params_set_size(p, 4 * (max_tokens + 2 * o.block_tokens) * per_token + (256u << 20)),
                  "params");
    check_cxlpool(cxlpool_shared_pool_create(own_device.c_str(), p, 0, &own), own_device.c_str());
    cxlpool_shared_params_destroy(p);
    cxlpool_kv_params_t* kp = nullptr;
    check_cxlpool(cxlpool_kv_params_create(&kp), "kv params");
    check_cxlpool(cxlpool_kv_params_set_prefix_caching(kp, 0), "kv params");  // recompute means recompute
    check_cxlpool(cxlpool_kv_arena_create(&g, &own, 1, kp, &arena), "arena");
    cxlpool_kv_params_destroy(kp);
    if (path == "pool") check_cxlpool(cxlpool_shared_pool_open(shared_device.c_str(), nullptr, &shared), "open");
    if (path.rfind("ucx-", 0) == 0)
      check_cxlpool(cxlpool_kv_remote_connect(ucx_address.c_str(), 30000,
                                              path == "ucx-sm" ? CXLPOOL_KV_REMOTE_SAME_HOST : 0, &remote),
                    "UCX connect");
    if (path == "ucx-sm") {
      char why[512] = "";
      cxlpool_kv_remote_path(remote, why, sizeof why);
      if (std::strncmp(why, "same host: ", 11) != 0) fail(std::string("ucx-sm: not through shared memory: ") + why);
    }
    if (path == "tcp") {
      tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(tcp_port);
      const int one = 1;
      setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (connect(tcp, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("tcp connect");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ttft_bench: decode process %s: %s\n", path.c_str(), e.what());
    return 3;
  }
  const char ready = 'r';
  write_all(4, &ready, 1);
  for (;;) {
    Request rq;
    if (!read_all(3, &rq, sizeof rq) || rq.stop) break;
    Reply rp;
    cxlpool_kv_view_t* view = nullptr;
    cxlpool_kv_seq_t* seq = nullptr;
    try {
      const std::vector<int32_t> prompt = prompt_of(rq.tokens);
      check_cxlpool(cxlpool_kv_seq_create(arena, &seq), "sequence");
      KvStore kv(g);
      std::vector<float> logits;
      if (path == "recompute") {
        kv.add_sequence(seq);
        logits = prefill(model, kv, prompt, nullptr);
      } else {
        if (path == "pool") {
          check_cxlpool(cxlpool_kv_import(&shared, 1, &g, &rq.handle, &view), "import");
        } else if (path == "tcp") {
          // The blocks come over the socket, each straight into a landing block of this pool.
          check_cxlpool(cxlpool_kv_view_create(&own, 1, &g, rq.tokens, &view), "landing view");
          const uint64_t blocks = (rq.tokens + g.tokens_per_block - 1) / g.tokens_per_block;
          for (uint64_t b = 0; b < blocks; ++b) {
            void* data = nullptr;
            check_cxlpool(cxlpool_kv_view_block_writable(view, b, &data), "landing block");
            if (!read_all(tcp, data, per_block)) fail("tcp: short read");
          }
        } else {
          check_cxlpool(cxlpool_kv_remote_import(remote, &own, 1, &g, &rq.handle, &view), "UCX import");
        }
        kv.add_view(view);
        kv.add_sequence(seq);
        logits = logits_of_last(model, kv, prompt.back());
      }
      rp.first = greedy(logits);
    } catch (const Error& e) {
      std::fprintf(stderr, "ttft_bench: decode %s: %s\n", path.c_str(), e.what());
      rp.status = -1000;
    }
    write_all(4, &rp, sizeof rp);  // the first token: the clock stops here
    if (seq) cxlpool_kv_seq_destroy(seq);
    if (view) cxlpool_kv_view_release(view);
  }
  if (tcp >= 0) close(tcp);
  if (remote) cxlpool_kv_remote_close(remote);
  cxlpool_kv_arena_destroy(arena);
  if (shared) cxlpool_shared_pool_close(shared);
  cxlpool_shared_pool_close(own);
  cxlpool_shared_pool_unlink(own_device.c_str());
  return 0;
}

// ---- the prefill process (the bench) ----------------------------------------------------
struct Decoder {
  std::string path;
  pid_t pid = -1;
  int to = -1, from = -1;
  int tcp = -1;  // the tcp path's data connection (accepted)
};

double pct50(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  uint64_t tokens = 0, kv_bytes = 0;
  double prefill_s = 0;
  std::map<std::string, std::vector<double>> ttft;
  int bad = 0;
};

int run(const Options& o, const char* self) {
  const OptConfig cfg = model_config(o);
  std::printf(
      "ttft_bench: OPT %s, random weights (seed %llu); KV fp16, %u tokens per block; %d repetitions; "
      "processes on this machine (%ld CPUs), loopback\n",
      cfg.describe().c_str(), (unsigned long long)kSeed, o.block_tokens, o.reps, sysconf(_SC_NPROCESSORS_ONLN));
  OptModel model(random_opt_weights(cfg, kSeed), o.threads);
  std::printf("kernels: %s, %u threads per process\n", kernels().name, model.pool().threads());
  const auto g = model.kv_geometry(CXLPOOL_KV_FP16, o.block_tokens);
  uint64_t per_token = 0, per_block = 0;
  cxlpool_kv_geometry_sizes(&g, &per_token, &per_block);
  const uint64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  const std::string name = "cxlpool-ttft-" + std::to_string(getpid()), device = "shm:" + name;
  cxlpool_shared_params_t* p = nullptr;
  cxlpool_shared_params_create(&p);
  cxlpool_shared_params_set_size(p, 4 * (max_tokens + o.block_tokens) * per_token + (256u << 20));
  cxlpool_shared_pool_t* pool = nullptr;
  if (cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) != CXLPOOL_OK) {
    std::fprintf(stderr, "ttft_bench: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_shared_params_destroy(p);
  cxlpool_kv_params_t* kp = nullptr;
  cxlpool_kv_params_create(&kp);
  cxlpool_kv_params_set_prefix_caching(kp, 0);
  cxlpool_kv_arena_t* arena = nullptr;
  cxlpool_kv_arena_create(&g, &pool, 1, kp, &arena);
  cxlpool_kv_params_destroy(kp);
  cxlpool_kv_server_t* server = nullptr;
  char ucx_address[128] = "";
  if (cxlpool_kv_server_start(&pool, 1, "127.0.0.1:0", CXLPOOL_KV_REMOTE_SAME_HOST, &server) != CXLPOOL_OK) {
    std::fprintf(stderr, "ttft_bench: UCX server: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_kv_server_address(server, ucx_address, sizeof ucx_address);
  // The tcp path's listener.
  int lsock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in la{};
  la.sin_family = AF_INET;
  la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t llen = sizeof la;
  if (lsock < 0 || bind(lsock, reinterpret_cast<sockaddr*>(&la), sizeof la) != 0 || listen(lsock, 4) != 0 ||
      getsockname(lsock, reinterpret_cast<sockaddr*>(&la), &llen) != 0) {
    std::perror("ttft_bench: listen");
    return 1;
  }
  const std::string port = std::to_string(ntohs(la.sin_port));
  std::vector<Decoder> decoders;
  for (const std::string& path : o.paths) {
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) || pipe2(up, O_CLOEXEC)) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(down[0], 3);
      dup2(up[1], 4);
      fcntl(3, F_SETFD, 0);
      fcntl(4, F_SETFD, 0);
      setenv("UCX_TLS", path == "ucx-sm" ? "sm,tcp" : "tcp", 1);
      setenv("UCX_NET_DEVICES", "lo", 1);
      const std::string own = device + "-" + path, threads = std::to_string(o.threads),
                        layers = std::to_string(o.layers), bt = std::to_string(o.block_tokens);
      std::string tokens;
      for (uint64_t t : o.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
      execl(self, self, "--role", path.c_str(), device.c_str(), own.c_str(), ucx_address, port.c_str(), threads.c_str(),
            layers.c_str(), bt.c_str(), tokens.c_str(), (char*)nullptr);
      _exit(127);
    }
    close(down[0]);
    close(up[1]);
    Decoder d{path, pid, down[1], up[0]};
    if (path == "tcp") d.tcp = accept(lsock, nullptr, nullptr);
    char ready = 0;
    if (!read_all(d.from, &ready, 1)) {
      std::fprintf(stderr, "ttft_bench: the %s decode process did not start\n", path.c_str());
      return 1;
    }
    decoders.push_back(d);
  }
  std::vector<Row> rows;
  for (uint64_t n : o.tokens) {
    Row row;
    row.tokens = n;
    row.kv_bytes = n * per_token;
    const std::vector<int32_t> prompt = prompt_of(n);
    cxlpool_kv_seq_t* seq = nullptr;
    cxlpool_kv_seq_create(arena, &seq);
    KvStore kv(g);
    kv.add_sequence(seq);
    const auto t0 = Clock::now();
    const int32_t want = greedy(prefill(model, kv, prompt, nullptr));
    row.prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    Request rq;
    rq.tokens = uint32_t(n);
    cxlpool_kv_seq_export(seq, 0, &rq.handle);
    uint64_t blocks = (n + o.block_tokens - 1) / o.block_tokens;
    for (int rep = 0; rep < o.reps; ++rep)
      for (Decoder& d : decoders) {
        const auto s0 = Clock::now();
        bool ok = write_all(d.to, &rq, sizeof rq);
        if (d.path == "tcp")  // the prefill side sends its blocks as soon as it is asked
          for (uint64_t b = 0; ok && b < blocks; ++b) {
            void* data = nullptr;
            cxlpool_kv_seq_block(seq, b, &data, nullptr);
            ok = write_all(d.tcp, data, per_block);
          }
        Reply rp;
        ok = ok && read_all(d.from, &rp, sizeof rp);
        const double s = std::chrono::duration<double>(Clock::now() - s0).count();
        if (!ok || rp.status != 0 || rp.first != want) {
          ++row.bad;
          std::fprintf(stderr, "ttft_bench: %s %llu tokens: first token %d, the prefill's %d (status %d)\n",
                       d.path.c_str(), (unsigned long long)n, rp.first, want, rp.status);
        }
        row.ttft[d.path].push_back(s);
      }
    cxlpool_kv_seq_destroy(seq);
    std::printf("  %5llu tokens: prefill %.3f s here; ", (unsigned long long)n, row.prefill_s);
    for (const auto& path : o.paths) std::printf("%s %.2f ms  ", path.c_str(), pct50(row.ttft[path]) * 1e3);
    std::printf("\n");
    rows.push_back(row);
  }
  // ---- the table ----
  std::printf("\nTTFT p50 of the decode process (ms), measured; KV %llu bytes per token\n",
              (unsigned long long)per_token);
  std::printf("%7s %11s", "tokens", "KV bytes");
  for (const auto& path : o.paths) std::printf(" %11s", path.c_str());
  std::printf(" %15s %5s\n", "recompute/pool", "bad");
  for (const Row& r : rows) {
    std::printf("%7llu %11llu", (unsigned long long)r.tokens, (unsigned long long)r.kv_bytes);
    for (const auto& path : o.paths) std::printf(" %11.2f", pct50(r.ttft.at(path)) * 1e3);
    const bool both = r.ttft.count("recompute") && r.ttft.count("pool");
    std::printf(" %14.1fx %5d\n", both ? pct50(r.ttft.at("recompute")) / pct50(r.ttft.at("pool")) : 0.0, r.bad);
  }
  // ---- the model: OPT-6.7B (32 layers, d 4096, fp16 KV: 512 KiB per token) ----
  const double params = 6.7e9, weight_bytes = 2 * params, kv6 = 32.0 * 2 * 4096 * 2;
  std::printf(
      "\nMODEL (not measured): OPT-6.7B, %.0f KiB of KV per token. Parameters: CXL %.0f GB/s + %.1f us; RDMA 200 Gb "
      "%.1f GB/s, 100 Gb %.1f GB/s, + %.0f us, + one copy at %.0f GB/s (bench/kvcache's model); GPU %.0f TFLOP/s at "
      "MFU %.2f, HBM %.0f GB/s. recompute = 2 x %.1e x tokens FLOP / (TFLOP/s x MFU); handoff = transfer + one decode "
      "step ((weights %.1f GB + KV) / HBM); transfer = KV bytes / link + latency (override: --cxl-gbps, "
      "--rdma200-gbps, --rdma100-gbps, --copy-gbps, --gpu-tflops, --mfu, --hbm-gbps)\n",
      kv6 / 1024, o.cxl_gbps, o.cxl_lat_us, o.rdma200_gbps, o.rdma100_gbps, o.rdma_lat_us, o.copy_gbps, o.gpu_tflops,
      o.mfu, o.hbm_gbps, params, weight_bytes / 1e9);
  std::printf("%7s %12s %16s %16s %18s %18s %12s\n", "tokens", "KV bytes", "model recompute", "model CXL",
              "model RDMA 200G", "model RDMA 100G", "RDMA200/CXL");
  struct ModelRow {
    uint64_t tokens;
    double recompute, cxl, r200, r100;
  };
  std::vector<ModelRow> mrows;
  for (uint64_t n : o.tokens) {
    const double s = double(n) * kv6 / 1e9;  // GB
    const double step = (weight_bytes / 1e9 + s) / o.hbm_gbps;
    ModelRow m{n, 2 * params * double(n) / (o.gpu_tflops * 1e12 * o.mfu), o.cxl_lat_us * 1e-6 + s / o.cxl_gbps + step,
               o.rdma_lat_us * 1e-6 + s / o.rdma200_gbps + s / o.copy_gbps + step,
               o.rdma_lat_us * 1e-6 + s / o.rdma100_gbps + s / o.copy_gbps + step};
    mrows.push_back(m);
    std::printf("%7llu %12.0f %13.2f ms %13.2f ms %15.2f ms %15.2f ms %11.2fx\n", (unsigned long long)n, s * 1e9,
                m.recompute * 1e3, m.cxl * 1e3, m.r200 * 1e3, m.r100 * 1e3, m.r200 / m.cxl);
  }
  int bad = 0;
  for (const Row& r : rows) bad += r.bad;
  if (!o.json.empty()) {
    if (FILE* j = open_bench_output(o.json)) {
      std::fprintf(j, "{\"bench\":\"ttft\",\"model_shape\":\"%s\",\"kv_bytes_per_token\":%llu,\"tokens_per_block\":%u,",
                   cfg.describe().c_str(), (unsigned long long)per_token, o.block_tokens);
      std::fprintf(j, "\"kernels\":\"%s\",\"threads\":%u,\"reps\":%d,\"rows\":[", kernels().name,
                   model.pool().threads(), o.reps);
      for (size_t i = 0; i < rows.size(); ++i) {
        std::fprintf(j, "%s{\"tokens\":%llu,\"kv_bytes\":%llu,\"prefill_here_s\":%.6g,\"bad\":%d", i ? "," : "",
                     (unsigned long long)rows[i].tokens, (unsigned long long)rows[i].kv_bytes, rows[i].prefill_s,
                     rows[i].bad);
        for (const auto& [path, v] : rows[i].ttft) std::fprintf(j, ",\"ttft_p50_s_%s\":%.6g", path.c_str(), pct50(v));
        std::fprintf(j, "}");
      }
      std::fprintf(
          j,
          "],\"model\":{\"label\":\"model\",\"shape\":\"OPT-6.7B\",\"kv_bytes_per_token\":%.0f,"
          "\"cxl_gbps\":%g,\"cxl_latency_us\":%g,\"rdma200_gbps\":%g,\"rdma100_gbps\":%g,\"rdma_latency_us\":%g,"
          "\"copy_gbps\":%g,\"gpu_tflops\":%g,\"mfu\":%g,\"hbm_gbps\":%g,\"rows\":[",
          kv6, o.cxl_gbps, o.cxl_lat_us, o.rdma200_gbps, o.rdma100_gbps, o.rdma_lat_us, o.copy_gbps, o.gpu_tflops,
          o.mfu, o.hbm_gbps);
      for (size_t i = 0; i < mrows.size(); ++i)
        std::fprintf(j, "%s{\"tokens\":%llu,\"recompute_s\":%.6g,\"cxl_s\":%.6g,\"rdma200_s\":%.6g,\"rdma100_s\":%.6g}",
                     i ? "," : "", (unsigned long long)mrows[i].tokens, mrows[i].recompute, mrows[i].cxl, mrows[i].r200,
                     mrows[i].r100);
      std::fprintf(j, "]}}\n");
      std::fclose(j);
      std::printf("\nJSON: %s\n", o.json.c_str());
    }
  }
  if (!o.plot.empty()) {
    const std::string dat = o.plot + ".dat", gp = o.plot + ".gp";
    FILE* d = open_bench_output(dat);
    FILE* gpf = d ? open_bench_output(gp) : nullptr;
    if (d && !gpf) std::fclose(d);
    if (gpf) {
      for (const auto& path : o.paths) {
        for (const Row& r : rows)
          std::fprintf(d, "%llu %.6g\n", (unsigned long long)r.tokens, pct50(r.ttft.at(path)) * 1e3);
        std::fprintf(d, "\n\n");
      }
      for (int k = 0; k < 3; ++k) {
        for (const ModelRow& m : mrows)
          std::fprintf(d, "%llu %.6g\n", (unsigned long long)m.tokens,
                       (k == 0   ? m.recompute
                        : k == 1 ? m.cxl
                                 : m.r200) *
                           1e3);
        std::fprintf(d, "\n\n");
      }
      std::fclose(d);
      std::fprintf(
          gpf,
          "set terminal pngcairo size 1000,600\nset output '%s'\nset logscale xy\nset xlabel 'prompt tokens'\n"
          "set ylabel 'time to first token (ms)'\nset key left top\nset title 'bench/ttft: decode server TTFT, "
          "%s measured here; OPT-6.7B modelled'\nplot ",
          o.plot.c_str(), "opt-125m shape");
      size_t i = 0;
      for (; i < o.paths.size(); ++i)
        std::fprintf(gpf, "%s'%s' index %zu with linespoints lw 2 title '%s (measured, opt-125m shape)'", i ? ", " : "",
                     dat.c_str(), i, o.paths[i].c_str());
      const char* mt[] = {"model: OPT-6.7B recompute (GPU)", "model: OPT-6.7B CXL handoff",
                          "model: OPT-6.7B RDMA 200G handoff"};
      for (int k = 0; k < 3; ++k)
        std::fprintf(gpf, ", '%s' index %zu with lines dt 2 lw 2 title '%s'", dat.c_str(), i + size_t(k), mt[k]);
      std::fprintf(gpf, "\n");
      std::fclose(gpf);
      if (std::system(("gnuplot '" + gp + "'").c_str()) == 0) std::printf("plot: %s\n", o.plot.c_str());
    }
  }
  for (Decoder& d : decoders) {
    Request stop;
    stop.stop = 1;
    write_all(d.to, &stop, sizeof stop);
    close(d.to);
    close(d.from);
    if (d.tcp >= 0) close(d.tcp);
    waitpid(d.pid, nullptr, 0);
  }
  close(lsock);
  cxlpool_kv_server_stop(server);
  cxlpool_kv_arena_destroy(arena);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device.c_str());
  if (bad) std::printf("\n%d trials whose first token differed from the prefill's or failed\n", bad);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc == 11 && std::string(argv[1]) == "--role") {
    // --role PATH SHARED_DEVICE OWN_DEVICE UCX_ADDRESS TCP_PORT THREADS LAYERS BLOCK_TOKENS TOKENS
    o.threads = unsigned(std::atoi(argv[7]));
    o.layers = uint32_t(std::atoi(argv[8]));
    o.block_tokens = uint32_t(std::atoi(argv[9]));
    o.tokens.clear();
    for (const auto& t : split_commas(argv[10])) o.tokens.push_back(std::strtoull(t.c_str(), nullptr, 10));
    return decode_process(argv[2], argv[3], argv[4], argv[5], uint16_t(std::atoi(argv[6])), o);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int first = bench_options_start("ttft_bench", CXLPOOL_BENCH_BUILD_TYPE, argc, argv);
  if (first < 0) return 2;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ttft_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      o.tokens = {128, 256};
      o.reps = 1;
    } else if (a == "--tokens") {
      o.tokens.clear();
      for (const auto& t : split_commas(next())) o.tokens.push_back(std::strtoull(t.c_str(), nullptr, 10));
    } else if (a == "--paths") {
      o.paths = split_commas(next());
    } else if (a == "--reps") {
      o.reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--threads") {
      o.threads = unsigned(std::atoi(next().c_str()));
    } else if (a == "--layers") {
      o.layers = uint32_t(std::atoi(next().c_str()));
    } else if (a == "--json") {
      o.json = next();
    } else if (a == "--plot") {
      o.plot = next();
    } else if (a == "--cxl-gbps") {
      o.cxl_gbps = std::atof(next().c_str());
    } else if (a == "--rdma200-gbps") {
      o.rdma200_gbps = std::atof(next().c_str());
    } else if (a == "--rdma100-gbps") {
      o.rdma100_gbps = std::atof(next().c_str());
    } else if (a == "--copy-gbps") {
      o.copy_gbps = std::atof(next().c_str());
    } else if (a == "--gpu-tflops") {
      o.gpu_tflops = std::atof(next().c_str());
    } else if (a == "--mfu") {
      o.mfu = std::atof(next().c_str());
    } else if (a == "--hbm-gbps") {
      o.hbm_gbps = std::atof(next().c_str());
    } else {
      std::fprintf(stderr,
                   "usage: ttft_bench [--any-build] [--quick] [--tokens 128,256,512,1024,2048] "
                   "[--paths recompute,pool,tcp,ucx-tcp,ucx-sm] [--reps 3] [--threads N] [--layers 12] [--json F] "
                   "[--plot F.png] [--cxl-gbps 64] [--rdma200-gbps 25] [--rdma100-gbps 12.5] [--copy-gbps 64] "
                   "[--gpu-tflops 312] [--mfu 0.5] [--hbm-gbps 2039]\n");
      return 2;
    }
  }
  for (uint64_t t : o.tokens)
    if (t == 0 || t > 2048) {
      std::fprintf(stderr, "ttft_bench: --tokens must be 1..2048 (the model's positions)\n");
      return 2;
    }
  for (const auto& p : o.paths)
    if (p != "recompute" && p != "pool" && p != "tcp" && p != "ucx-tcp" && p != "ucx-sm") {
      std::fprintf(stderr, "ttft_bench: unknown path '%s' (recompute, pool, tcp, ucx-tcp, ucx-sm)\n", p.c_str());
      return 2;
    }
  try {
    return run(o, "/proc/self/exe");
  } catch (const Error& e) {
    std::fprintf(stderr, "ttft_bench: %s\n", e.what());
    return 1;
  }
}

// SPDX-License-Identifier: MIT
// The prefill half of a disaggregated OPT server pair (with opt_decode_server.cpp): it loads
// a checkpoint, owns a shared pool and a KV arena in it (prefix caching on), and for each
// request (a line "PROMPT id id ...") computes the prompt's keys and values straight into KV
// blocks (whole blocks the prefix cache already has are shared, not computed), exports the
// sequence and answers "HANDLE <hex> TOKENS n REUSED r COMPUTED c FIRST t". The decode server
// reads the blocks in place (same pool) or fetches them over UCX (--ucx-listen: another host)
// and answers DONE; then the sequence is dropped (its whole blocks stay in the prefix cache).
//   opt_prefill_server --model DIR --socket PATH|tcp:HOST:PORT --pool shm:NAME
//       [--pool-mib 1024] [--kv-dtype fp16] [--block-tokens 16] [--requests 0 (forever)]
//       [--threads 0] [--ucx-listen IP:PORT]
#include <signal.h>
#include <sys/stat.h>

#include <chrono>

#include "engine/generate.hpp"
#include "opt_common.hpp"
#ifdef CXLPOOL_EXAMPLE_UCX
#include "cxlpool/kvcache_remote.h"
#endif

using namespace cxlpool::engine;
using namespace opt_example;

namespace {

// SIGINT or SIGTERM: stop accepting, clean up (the pool's name, the socket) and exit.
volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

// Seconds a client may take to send a line (its prompt, its DONE) before it is dropped.
constexpr int kClientTimeoutS = 30;

const char* kUsage =
    "opt_prefill_server --model DIR --socket PATH|tcp:HOST:PORT --pool shm:NAME [--pool-mib 1024] "
    "[--kv-dtype fp16|bf16|fp32] [--block-tokens 16] [--requests N] [--threads N] [--ucx-listen IP:PORT]";

// One request on an accepted connection; true when it was answered with a handle (what
// --requests counts: a client that connects and goes away is not a request).
bool serve(Line& line, OptModel& model, cxlpool_kv_arena_t* arena, const cxlpool_kv_geometry_t& g,
           const std::string& ucx_address) {
  std::string req;
  if (!line.receive(&req)) return false;
  if (req.rfind("PROMPT ", 0) != 0) {
    line.send("ERROR expected PROMPT id id ...");
    return false;
  }
  bool answered = false;
  cxlpool_kv_seq_t* seq = nullptr;
  try {
    const std::vector<int32_t> prompt = parse_ids(req.substr(6));
    if (prompt.empty()) fail("empty prompt");
    if (prompt.size() > model.config().max_positions)  // before a block is taken for it
      fail("the prompt's " + std::to_string(prompt.size()) + " tokens exceed the model's " +
           std::to_string(model.config().max_positions) + " positions");
    check_cxlpool(cxlpool_kv_seq_create(arena, &seq), "sequence");
    KvStore kv(g);
    kv.add_sequence(seq);
    PrefillStats st;
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<float> logits = prefill(model, kv, prompt, &st);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cxlpool_kv_handle_t h{};
    check_cxlpool(cxlpool_kv_seq_export(seq, 0, &h), "export");
    const int32_t first = greedy(logits);
    std::printf("prefill: %zu tokens, %zu reused from the prefix cache, %zu computed in %.1f ms, first token %d\n",
                st.tokens, st.reused, st.computed, ms, first);
    std::fflush(stdout);
    answered = line.send("HANDLE " + handle_hex(h) + " TOKENS " + std::to_string(st.tokens) + " REUSED " +
                         std::to_string(st.reused) + " COMPUTED " + std::to_string(st.computed) + " FIRST " +
                         std::to_string(first) + (ucx_address.empty() ? "" : " UCX " + ucx_address));
    std::string done;
    line.receive(&done);  // DONE once imported (the view's leases keep the blocks from then on)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt_prefill_server: %s\n", describe(e).c_str());
    line.send("ERROR " + describe(e));
  }
  if (seq) cxlpool_kv_seq_destroy(seq);
  return answered;
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = parse_options(
      argc, argv,
      {"model", "socket", "pool", "pool-mib", "kv-dtype", "block-tokens", "requests", "threads", "ucx-listen"}, kUsage);
  if (!o.count("model") || !o.count("socket") || !o.count("pool")) {
    std::fprintf(stderr, "usage: %s\n", kUsage);
    return 2;
  }
  const std::string where = o.at("socket"), device = o.at("pool");
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_kv_arena_t* arena = nullptr;
  int ls = -1;
  struct stat bound {};
  int rc = 0;
#ifdef CXLPOOL_EXAMPLE_UCX
  cxlpool_kv_server_t* server = nullptr;
#endif
  try {
    const auto t0 = std::chrono::steady_clock::now();
    LoadedCheckpoint ck = load_opt_checkpoint(o.at("model"));
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    OptModel model(std::move(ck.weights), unsigned(number(o, "threads", 0)));
    const auto g = model.kv_geometry(kv_dtype(o), uint32_t(number(o, "block-tokens", 16)));
    uint64_t per_token = 0, per_block = 0;
    check_cxlpool(cxlpool_kv_geometry_sizes(&g, &per_token, &per_block), "geometry");
    pool = create_pool(device, number(o, "pool-mib", 1024, kMaxPoolMib) << 20);
    arena = create_arena(g, pool, true);
    std::string ucx_address;
    if (o.count("ucx-listen")) {
#ifdef CXLPOOL_EXAMPLE_UCX
      check_cxlpool(cxlpool_kv_server_start(&pool, 1, o.at("ucx-listen").c_str(), 0, &server), "UCX server");
      char a[128];
      check_cxlpool(cxlpool_kv_server_address(server, a, sizeof a), "UCX server address");
      ucx_address = a;
#else
      fail("--ucx-listen: built without libcxlpool_ucx (CXLPOOL_WITH_UCX=OFF)");
#endif
    }
    ls = listen_control(where);
    if (!is_tcp(where)) lstat(where.c_str(), &bound);
    std::printf(
        "prefill: %s (%s, %s) loaded in %.2f s; KV %s, %u tokens per block (%llu bytes per token); pool %s; "
        "listening on %s%s%s\n",
        ck.model_file.c_str(), model.config().describe().c_str(), ck.source_dtype.c_str(), load_s,
        o.count("kv-dtype") ? o.at("kv-dtype").c_str() : "fp16", g.tokens_per_block, (unsigned long long)per_token,
        device.c_str(), where.c_str(), ucx_address.empty() ? "" : ", UCX on ", ucx_address.c_str());
    std::fflush(stdout);
    const uint64_t requests = number(o, "requests", 0, UINT64_MAX);
    struct sigaction sa {};
    sa.sa_handler = on_stop;  // no SA_RESTART: accept returns EINTR
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    for (uint64_t served = 0; (requests == 0 || served < requests) && !g_stop;) {
      const int c = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      Line line(c);
      line.set_timeout(kClientTimeoutS);  // a client that stalls does not hold up the others
      if (serve(line, model, arena, g, ucx_address)) ++served;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt_prefill_server: %s\n", describe(e).c_str());
    rc = 1;
  }
#ifdef CXLPOOL_EXAMPLE_UCX
  if (server) cxlpool_kv_server_stop(server);
#endif
  if (ls >= 0) {
    close(ls);
    struct stat now {};
    // Only the socket this process bound is removed, not whatever has its name by now.
    if (!is_tcp(where) && lstat(where.c_str(), &now) == 0 && S_ISSOCK(now.st_mode) && now.st_dev == bound.st_dev &&
        now.st_ino == bound.st_ino)
      unlink(where.c_str());
  }
  if (arena) cxlpool_kv_arena_destroy(arena);
  if (pool) {
    // Decode servers go on generating in the pool after their DONE: its name is removed once
    // they have left (a name gone under a participant is a failed device to it), or after 60 s.
    cxlpool_shared_info_t info{};
    for (int waited = 0; waited < 600 && cxlpool_shared_pool_info(pool, &info) == CXLPOOL_OK && info.participants > 1;
         ++waited) {
      if (waited == 0)
        std::printf("prefill: waiting for %u decode server(s) to leave the pool\n", info.participants - 1);
      std::fflush(stdout);
      usleep(100000);
    }
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(device.c_str());
  }
  return rc;
}

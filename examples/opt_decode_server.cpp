// SPDX-License-Identifier: MIT
// The decode half of the OPT server pair (with opt_prefill_server.cpp): it loads the same
// checkpoint, sends the prompt's token ids to the prefill server, gets a KV handle back and
// takes the prompt's keys and values without computing them: in place from the shared pool
// (--pool: the blocks the prefill server wrote are read where they are, nothing copied), or
// over UCX into a pool of its own (--ucx, between hosts: the prefill server's UCX address comes
// with the handle). Its first token comes from the last prompt token run once more over those
// blocks (reading, never writing them); each further token's keys and values go into a
// sequence of its own (an arena without prefix caching) after the imported ones.
//   opt_decode_server --model DIR --socket PATH|tcp:HOST:PORT --prompt "ids" [--generate 16]
//       (--pool shm:NAME | --ucx 1 --own-pool shm:NAME [--pool-mib 256]) [--kv-dtype fp16]
//       [--block-tokens 16] [--threads 0]
// Prints "prefill: ..." (what the prefill server reported) and "tokens: id id ...".
#include <chrono>

#include "engine/generate.hpp"
#include "opt_common.hpp"
#ifdef CXLPOOL_EXAMPLE_UCX
#include "cxlpool/kvcache_remote.h"
#endif

using namespace cxlpool::engine;
using namespace opt_example;

namespace {
const char* kUsage =
    "opt_decode_server --model DIR --socket PATH|tcp:HOST:PORT --prompt \"id id ...\" [--generate 16] "
    "(--pool shm:NAME | --ucx 1 --own-pool shm:NAME [--pool-mib 256]) [--kv-dtype fp16|bf16|fp32] "
    "[--block-tokens 16] [--threads N]";

std::string field(const std::string& reply, const std::string& key) {
  const size_t at = reply.find(" " + key + " ");
  if (at == std::string::npos) return "";
  const size_t b = at + key.size() + 2, e = reply.find(' ', b);
  return reply.substr(b, e == std::string::npos ? std::string::npos : e - b);
}
}  // namespace

int main(int argc, char** argv) {
  const auto o = parse_options(argc, argv,
                               {"model", "socket", "prompt", "generate", "pool", "ucx", "own-pool", "pool-mib",
                                "kv-dtype", "block-tokens", "threads"},
                               kUsage);
  const bool ucx = o.count("ucx") && o.at("ucx") != "0";
  if (!o.count("model") || !o.count("socket") || !o.count("prompt") ||
      (ucx ? !o.count("own-pool") : !o.count("pool"))) {
    std::fprintf(stderr, "usage: %s\n", kUsage);
    return 2;
  }
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_kv_arena_t* own = nullptr;
  cxlpool_kv_view_t* view = nullptr;
  cxlpool_kv_seq_t* seq = nullptr;
#ifdef CXLPOOL_EXAMPLE_UCX
  cxlpool_kv_remote_t* remote = nullptr;
#endif
  int rc = 0;
  try {
    const std::vector<int32_t> prompt = parse_ids(o.at("prompt"));
    OptModel model(load_opt_checkpoint(o.at("model")).weights, unsigned(number(o, "threads", 0)));
    const auto g = model.kv_geometry(kv_dtype(o), uint32_t(number(o, "block-tokens", 16)));
    // Connected first: the prefill server listens once its pool exists.
    Line line(connect_control(o.at("socket")));
    if (ucx) {
      pool = create_pool(o.at("own-pool"), number(o, "pool-mib", 256, kMaxPoolMib) << 20);
    } else {
      check_cxlpool(cxlpool_shared_pool_open(o.at("pool").c_str(), nullptr, &pool), o.at("pool").c_str());
    }
    if (!line.send("PROMPT " + ids_text(prompt))) fail("the prefill server went away");
    std::string reply;
    if (!line.receive(&reply)) fail("the prefill server went away");
    if (reply.rfind("HANDLE ", 0) != 0) fail("the prefill server answered: " + reply);
    const cxlpool_kv_handle_t h = handle_from_hex(reply.substr(7, 2 * sizeof(cxlpool_kv_handle_t)));
    std::printf("prefill: %s tokens, %s reused from the prefix cache, %s computed, first token %s\n",
                field(reply, "TOKENS").c_str(), field(reply, "REUSED").c_str(), field(reply, "COMPUTED").c_str(),
                field(reply, "FIRST").c_str());
    const auto t0 = std::chrono::steady_clock::now();
    if (ucx) {
#ifdef CXLPOOL_EXAMPLE_UCX
      const std::string address = field(reply + " ", "UCX");
      if (address.empty()) fail("the prefill server has no UCX server (start it with --ucx-listen)");
      check_cxlpool(cxlpool_kv_remote_connect(address.c_str(), 0, 0, &remote), "UCX connect");
      check_cxlpool(cxlpool_kv_remote_import(remote, &pool, 1, &g, &h, &view), "UCX import");
#else
      fail("--ucx: built without libcxlpool_ucx (CXLPOOL_WITH_UCX=OFF)");
#endif
    } else {
      check_cxlpool(cxlpool_kv_import(&pool, 1, &g, &h, &view), "import");
    }
    line.send("DONE");
    own = create_arena(g, pool, false);  // generated tokens' K/V are keyed by nothing shareable
    check_cxlpool(cxlpool_kv_seq_create(own, &seq), "sequence");
    KvStore kv(g);
    kv.add_view(view);
    kv.add_sequence(seq);
    if (kv.tokens() != prompt.size())
      fail("the handle holds " + std::to_string(kv.tokens()) + " tokens, not the prompt's");
    std::vector<float> logits = logits_of_last(model, kv, prompt.back());
    const double ttft = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // The prefill server's first token is this model's over those blocks, or they are not
    // this model's KV of this prompt (another checkpoint, another prompt's handle).
    const std::string theirs = field(reply, "FIRST");
    if (theirs != std::to_string(greedy(logits)))
      fail("the prefill server's first token is " + theirs + ", this model's over its blocks " +
           std::to_string(greedy(logits)) + ": not the same model, or not this prompt's KV");
    const std::vector<int32_t> tokens = generate(model, kv, std::move(logits), number(o, "generate", 16));
    std::printf("decode: %zu prompt tokens read in place from %s, first token after %.2f ms\n", prompt.size(),
                ucx ? "blocks fetched over UCX" : "the prefill server's blocks", ttft);
    std::printf("tokens: %s\n", ids_text(tokens).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt_decode_server: %s\n", describe(e).c_str());
    rc = 1;
  }
  if (seq) cxlpool_kv_seq_destroy(seq);
  if (own) cxlpool_kv_arena_destroy(own);
  if (view) cxlpool_kv_view_release(view);
#ifdef CXLPOOL_EXAMPLE_UCX
  if (remote) cxlpool_kv_remote_close(remote);
#endif
  if (pool) {
    cxlpool_shared_pool_close(pool);
    if (ucx) cxlpool_shared_pool_unlink(o.at("own-pool").c_str());
  }
  return rc;
}

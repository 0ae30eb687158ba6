// SPDX-License-Identifier: MIT
// One process doing prefill and greedy decode of OPT on cxlpool KV blocks: the baseline the
// server pair must match token for token, and the simplest way to run a checkpoint.
//   opt_generate --model DIR --pool shm:NAME (--prompt "ids" | --prompts FILE: one prompt a line)
//       [--generate 16] [--prefix-cache 1] [--kv-dtype fp16] [--block-tokens 16] [--threads 0]
// Prints, per prompt, "prefill: ..." and "tokens: id id ...".
#include <fstream>

#include "engine/generate.hpp"
#include "opt_common.hpp"

using namespace cxlpool::engine;
using namespace opt_example;

int main(int argc, char** argv) {
  const char* usage =
      "opt_generate --model DIR --pool shm:NAME (--prompt \"ids\" | --prompts FILE) [--generate 16] "
      "[--prefix-cache 1|0] [--kv-dtype fp16|bf16|fp32] [--block-tokens 16] [--threads N] [--pool-mib 1024]";
  const auto o = parse_options(argc, argv,
                               {"model", "pool", "prompt", "prompts", "generate", "prefix-cache", "kv-dtype",
                                "block-tokens", "threads", "pool-mib"},
                               usage);
  if (!o.count("model") || !o.count("pool") || (o.count("prompt") == o.count("prompts"))) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_kv_arena_t* arena = nullptr;
  int rc = 0;
  try {
    std::vector<std::vector<int32_t>> prompts;
    if (o.count("prompt")) {
      prompts.push_back(parse_ids(o.at("prompt")));
    } else {
      std::ifstream in(o.at("prompts"));
      if (!in) fail(o.at("prompts") + ": cannot open");
      for (std::string l; std::getline(in, l);) prompts.push_back(parse_ids(l));
    }
    OptModel model(load_opt_checkpoint(o.at("model")).weights, unsigned(number(o, "threads", 0)));
    const auto g = model.kv_geometry(kv_dtype(o), uint32_t(number(o, "block-tokens", 16)));
    pool = create_pool(o.at("pool"), number(o, "pool-mib", 1024, kMaxPoolMib) << 20);
    arena = create_arena(g, pool, number(o, "prefix-cache", 1) != 0);
    for (const auto& prompt : prompts) {
      cxlpool_kv_seq_t* seq = nullptr;
      check_cxlpool(cxlpool_kv_seq_create(arena, &seq), "sequence");
      try {
        KvStore kv(g);
        kv.add_sequence(seq);
        PrefillStats st;
        std::vector<float> logits = prefill(model, kv, prompt, &st);
        const auto tokens = generate(model, kv, std::move(logits), number(o, "generate", 16));
        std::printf("prefill: %zu tokens, %zu reused from the prefix cache, %zu computed\ntokens: %s\n", st.tokens,
                    st.reused, st.computed, ids_text(tokens).c_str());
      } catch (...) {
        cxlpool_kv_seq_destroy(seq);
        throw;
      }
      cxlpool_kv_seq_destroy(seq);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt_generate: %s\n", describe(e).c_str());
    rc = 1;
  }
  if (arena) cxlpool_kv_arena_destroy(arena);
  if (pool) {
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(o.at("pool").c_str());
  }
  return rc;
}

// SPDX-License-Identifier: MIT
// Prefill and greedy decoding (generate.hpp).
#include "engine/generate.hpp"

#include "engine/error.hpp"

namespace cxlpool::engine {

std::vector<float> prefill(OptModel& model, KvStore& kv, const std::vector<int32_t>& prompt, PrefillStats* stats) {
  if (prompt.empty()) fail("prefill: empty prompt");
  const size_t n = prompt.size();
  const size_t reused = kv.append(prompt.data(), n);
  const uint64_t start = kv.tokens() - n;
  std::vector<float> logits;
  size_t computed = 0;
  if (reused < n) {
    computed = n - reused;
    logits = model.forward(kv, prompt.data() + reused, computed, start + reused, true);
  } else {
    // Every block was in the cache: the last token is run once more to get its logits.
    computed = 1;
    logits = model.forward(kv, prompt.data() + n - 1, 1, start + n - 1, false);
  }
  cxlpool_kv_seq_info_t info{};
  check_cxlpool(cxlpool_kv_seq_info(kv.sequence(), &info), "prefill: sequence info");
  check_cxlpool(cxlpool_kv_seq_seal(kv.sequence(), info.tokens), "prefill: seal");
  if (stats) *stats = PrefillStats{n, reused, computed};
  return logits;
}

std::vector<float> logits_of_last(OptModel& model, KvStore& kv, int32_t last_token) {
  if (kv.tokens() == 0) fail("logits_of_last: empty store");
  return model.forward(kv, &last_token, 1, kv.tokens() - 1, false);
}

int32_t greedy(const std::vector<float>& logits) {
  if (logits.empty()) fail("greedy: no logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

std::vector<float> decode_step(OptModel& model, KvStore& kv, int32_t token) {
  const size_t reused = kv.append(&token, 1);
  return model.forward(kv, &token, 1, kv.tokens() - 1, reused == 0);
}

std::vector<int32_t> generate(OptModel& model, KvStore& kv, std::vector<float> logits, size_t count) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < count; ++i) {
    out.push_back(greedy(logits));
    if (i + 1 == count) break;
    if (kv.tokens() >= model.config().max_positions) break;  // no position left for the next step
    logits = decode_step(model, kv, out.back());
  }
  return out;
}

}  // namespace cxlpool::engine

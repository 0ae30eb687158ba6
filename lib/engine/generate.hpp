// SPDX-License-Identifier: MIT
// Prefill and greedy decoding on a KvStore: the prompt goes into the store's sequence (whole
// blocks the prefix cache has are shared and not computed), decode steps append one token
// each. The same functions serve one process doing both and the two halves of the servers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/kv_store.hpp"
#include "engine/opt_model.hpp"

namespace cxlpool::engine {

struct PrefillStats {
  size_t tokens = 0;    // the prompt's
  size_t reused = 0;    // found in the prefix cache: not computed
  size_t computed = 0;  // tokens run through the model (the last one again when all were reused)
};

// Appends the prompt to kv's sequence, computes what was not reused, seals the sequence's
// tokens (its whole blocks enter the prefix cache) and returns the last token's logits.
std::vector<float> prefill(OptModel& model, KvStore& kv, const std::vector<int32_t>& prompt, PrefillStats* stats);
// The logits of position kv.tokens()-1 from keys and values already in the store (an imported
// view): the last token is run again, reading, never writing.
std::vector<float> logits_of_last(OptModel& model, KvStore& kv, int32_t last_token);
// The highest logit (the lowest id among equals).
int32_t greedy(const std::vector<float>& logits);
// One decode step: token goes at the end of the store; returns its logits.
std::vector<float> decode_step(OptModel& model, KvStore& kv, int32_t token);
// count greedy tokens from the logits of the store's last token; fewer when the model's
// positions run out first (the tokens made so far are kept).
std::vector<int32_t> generate(OptModel& model, KvStore& kv, std::vector<float> logits, size_t count);

}  // namespace cxlpool::engine

// StreamingLLM: keep the attention sinks (the first sink_tokens entries) and the most recent
// K - sink_tokens entries; no queries are looked at.
#include <algorithm>

#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

LayerDecodePlan StreamingLLMPolicy::plan(const DecodeInputs& inputs) const {
  check_decode_inputs(inputs, false);
  LayerDecodePlan plan;
  plan.per_query_head = params_.per_query_head;
  const int64_t length = inputs.cache_length;
  const int64_t budget = params_.budget;
  if (length <= budget) return plan;
  const int64_t sinks = std::min<int64_t>(params_.sink_tokens, budget);
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(budget));
  for (int64_t position = 0; position < sinks; ++position)
    kept.push_back(static_cast<int32_t>(position));
  for (int64_t position = length - (budget - sinks); position < length; ++position) {
    kept.push_back(static_cast<int32_t>(position));
  }
  const int heads = params_.per_query_head ? inputs.num_q_heads : inputs.num_kv_heads;
  plan.kept.assign(heads, kept);
  return plan;
}

}  // namespace entropyinfer

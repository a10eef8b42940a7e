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
  const DecodeSelection selection =
      decode_selection(DecodeMethod::kStreamingLLM, params_, inputs.num_q_heads,
                       inputs.num_kv_heads, inputs.layer, inputs.num_layers, inputs.cache_length);
  if (!selection.compresses) return plan;
  const int64_t length = inputs.cache_length;
  std::vector<int32_t> kept;
  kept.reserve(static_cast<size_t>(selection.sinks + selection.recent));
  for (int64_t position = 0; position < selection.sinks; ++position)
    kept.push_back(static_cast<int32_t>(position));
  for (int64_t position = length - selection.recent; position < length; ++position) {
    kept.push_back(static_cast<int32_t>(position));
  }
  plan.kept.assign(selection.lists, kept);
  return plan;
}

}  // namespace entropyinfer

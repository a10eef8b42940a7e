// SnapKV: right after prefill, each head keeps the last W entries and the K - W candidates that the
// last W prompt queries attend to most (pooled window scores, see window_scores.h).
#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

LayerDecodePlan SnapKVPolicy::plan(const DecodeInputs& inputs) const {
  return select_top_per_head(
      inputs, params_,
      decode_selection(DecodeMethod::kSnapKV, params_, inputs.num_q_heads, inputs.num_kv_heads,
                       inputs.layer, inputs.num_layers, inputs.cache_length));
}

}  // namespace entropyinfer

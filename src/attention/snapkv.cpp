// SnapKV: right after prefill, each head keeps the last W entries and the K - W candidates that the
// last W prompt queries attend to most (pooled window scores, see window_scores.h).
#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

LayerDecodePlan SnapKVPolicy::plan(const DecodeInputs& inputs) const {
  return select_top_per_head(DecodeMethod::kSnapKV, inputs, params_);
}

}  // namespace entropyinfer

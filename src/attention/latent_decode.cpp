// EntropyInfer's latent compression (docs/method.md section 3). The selection is SnapKV's, but it
// runs once G generated tokens have been decoded over the full cache: the window the caller passes
// then holds the last W - G prompt queries followed by the G generated queries, so the entries the
// answer actually attends to decide what survives. The plan itself only sees "the last W queries".
#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

LayerDecodePlan LatentDecodePolicy::plan(const DecodeInputs& inputs) const {
  return select_top_per_head(DecodeMethod::kLatent, inputs, params_);
}

}  // namespace entropyinfer

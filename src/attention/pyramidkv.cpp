// PyramidKV: SnapKV's selection with a per-layer budget that shrinks linearly from the bottom layer
// to the top one while averaging (about) K over the layers.
//
// With c = K - W candidates per head on average, beta = pyramid_beta and N layers:
//   c_min = max(1, floor(c / beta)) (at most c),   c_max = 2c - c_min;
//   if c_max exceeds the L - W candidates of the cache: c_max = L - W, c_min = 2c - c_max;
//   step = floor((c_max - c_min) / (N - 1)),   c_layer = c_max - layer * step;
//   budget(layer) = c_layer + W  (with N = 1: K).
// The top layer keeps its window plus c_min >= 1 candidates (>= 0 when c = 0). The floor of the
// step makes upper layers keep slightly more than the exact line, never less than c_min.
#include "attention/pyramidkv.h"

#include <algorithm>
#include <cmath>

#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

int64_t pyramid_layer_budget(const DecodeParams& params, int layer, int num_layers,
                             int64_t cache_length) {
  const int64_t window = params.window;
  const int64_t average = params.budget - window;
  if (num_layers <= 1 || average <= 0) return params.budget;
  int64_t smallest =
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(average / params.pyramid_beta)));
  smallest = std::min(smallest, average);
  int64_t largest = 2 * average - smallest;
  const int64_t available = cache_length - window;
  if (largest > available) {
    largest = std::max<int64_t>(available, average);
    smallest = 2 * average - largest;
  }
  const int64_t step = (largest - smallest) / (num_layers - 1);
  const int clamped_layer = std::clamp(layer, 0, num_layers - 1);
  return largest - clamped_layer * step + window;
}

LayerDecodePlan PyramidKVPolicy::plan(const DecodeInputs& inputs) const {
  // Like SnapKV, nothing is compressed while the cache fits the (average) budget.
  return select_top_per_head(DecodeMethod::kPyramidKV, inputs, params_);
}

}  // namespace entropyinfer

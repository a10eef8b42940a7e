#include "attention/decode_selection.h"

#include <algorithm>

#include "attention/pyramidkv.h"

namespace entropyinfer {

int64_t DecodeSelection::longest_list() const {
  if (!compresses) return 0;
  if (positional) return sinks + recent;
  return std::min(candidates, keep + shared) + window;
}

int64_t DecodeSelection::entries_bound() const {
  if (!compresses) return 0;
  if (positional) return lists * (sinks + recent);
  return lists * (keep + window) + shared;
}

DecodeSelection decode_selection(DecodeMethod method, const DecodeParams& params, int num_q_heads,
                                 int num_kv_heads, int layer, int num_layers,
                                 int64_t cache_length) {
  DecodeSelection s;
  s.lists = params.per_query_head ? num_q_heads : num_kv_heads;
  if (cache_length <= params.budget) return s;  // no method compresses a cache within K
  switch (method) {
    case DecodeMethod::kLatent:
    case DecodeMethod::kSnapKV:
    case DecodeMethod::kPyramidKV: {  // the top candidates of each list under the layer's budget
      const int64_t budget = method == DecodeMethod::kPyramidKV
                                 ? pyramid_layer_budget(params, layer, num_layers, cache_length)
                                 : params.budget;
      if (cache_length <= budget) return s;
      s.window = std::min<int64_t>(params.window, budget);
      s.candidates = cache_length - s.window;
      s.keep = std::clamp<int64_t>(budget - s.window, 0, s.candidates);
      break;
    }
    case DecodeMethod::kAdaKV: {  // floors per head, then the layer's rest shared (adakv.cpp)
      s.window = params.window;
      s.candidates = cache_length - s.window;
      const int64_t candidate_budget =
          std::clamp<int64_t>(params.budget - s.window, 0, s.candidates);
      const auto floor_per_head =
          static_cast<int64_t>(params.adakv_floor * static_cast<double>(params.budget - s.window));
      s.keep = std::clamp<int64_t>(floor_per_head, 0, candidate_budget);
      s.shared = static_cast<int64_t>(s.lists) * (candidate_budget - s.keep);
      break;
    }
    case DecodeMethod::kStreamingLLM:
      s.positional = true;
      s.sinks = std::min<int64_t>(params.sink_tokens, params.budget);
      s.recent = params.budget - s.sinks;
      break;
    case DecodeMethod::kFull:
      return s;
  }
  s.compresses = true;
  return s;
}

DecodeSelectionBounds decode_selection_bounds(DecodeMethod method, const DecodeParams& params,
                                              int num_q_heads, int num_kv_heads, int num_layers,
                                              int64_t max_cache_length) {
  DecodeSelectionBounds bounds;
  for (int layer = 0; layer < std::max(1, num_layers); ++layer) {
    const DecodeSelection s = decode_selection(method, params, num_q_heads, num_kv_heads, layer,
                                               num_layers, max_cache_length);
    bounds.longest_list = std::max(bounds.longest_list, s.longest_list());
    bounds.entries = std::max(bounds.entries, s.entries_bound());
  }
  return bounds;
}

}  // namespace entropyinfer

// AdaKV: SnapKV's pooled window scores, but the layer's candidate budget (K - W) * heads is shared:
//   1. every head keeps its own top floor(adakv_floor * (K - W)) candidates (the safeguard floor);
//   2. the rest of the layer's budget, (K - W) * heads minus the floors, goes to the highest scores
//      among the candidates not yet kept, over all heads of the layer together;
//   3. every head also keeps its last W entries.
// Heads whose attention is spread out thus keep more than K entries and concentrated heads fewer,
// while the layer total stays K * heads. Scores are attention probabilities averaged over the
// window, so they are comparable across heads.
#include "attention/adakv.h"

#include <algorithm>
#include <numeric>

#include "attention/policies.h"
#include "attention/window_scores.h"

namespace entropyinfer {

std::vector<std::vector<int32_t>> adaptive_head_selection(const float* scores, int heads,
                                                          int64_t candidates,
                                                          int64_t candidate_budget,
                                                          int64_t floor_per_head) {
  candidate_budget = std::clamp<int64_t>(candidate_budget, 0, candidates);
  floor_per_head = std::clamp<int64_t>(floor_per_head, 0, candidate_budget);
  const int64_t total = static_cast<int64_t>(heads) * candidates;
  std::vector<uint8_t> taken(static_cast<size_t>(total), 0);
  std::vector<std::vector<int32_t>> chosen(heads);

  // 1. The floors, per head.
  std::vector<int32_t> order(static_cast<size_t>(candidates));
  for (int head = 0; head < heads; ++head) {
    const float* row = scores + head * candidates;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + floor_per_head, order.end(),
                      [row](int32_t a, int32_t b) {
                        if (row[a] != row[b]) return row[a] > row[b];
                        return a < b;
                      });
    for (int64_t k = 0; k < floor_per_head; ++k) {
      chosen[head].push_back(order[k]);
      taken[head * candidates + order[k]] = 1;
    }
  }

  // 2. The shared rest, over flat indices head * candidates + position (so equal scores fall to the
  // lower head, then the lower position).
  const int64_t shared = static_cast<int64_t>(heads) * (candidate_budget - floor_per_head);
  std::vector<int64_t> rest;
  rest.reserve(static_cast<size_t>(total - heads * floor_per_head));
  for (int64_t flat = 0; flat < total; ++flat) {
    if (!taken[flat]) rest.push_back(flat);
  }
  const auto by_score = [scores](int64_t a, int64_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  };
  const int64_t granted = std::min<int64_t>(shared, static_cast<int64_t>(rest.size()));
  std::nth_element(rest.begin(), rest.begin() + granted, rest.end(), by_score);
  for (int64_t k = 0; k < granted; ++k) {
    chosen[rest[k] / candidates].push_back(static_cast<int32_t>(rest[k] % candidates));
  }
  for (auto& list : chosen) std::sort(list.begin(), list.end());
  return chosen;
}

LayerDecodePlan AdaKVPolicy::plan(const DecodeInputs& inputs) const {
  check_decode_inputs(inputs, true);
  LayerDecodePlan plan;
  plan.per_query_head = params_.per_query_head;
  const DecodeSelection selection =
      decode_selection(DecodeMethod::kAdaKV, params_, inputs.num_q_heads, inputs.num_kv_heads,
                       inputs.layer, inputs.num_layers, inputs.cache_length);
  if (!selection.compresses) return plan;
  const int64_t candidates = selection.candidates;
  const std::vector<float> scores = candidate_scores(inputs, params_, candidates);
  plan.kept =
      adaptive_head_selection(scores.data(), selection.lists, candidates,
                              selection.keep + selection.shared / selection.lists, selection.keep);
  for (auto& kept : plan.kept) {
    for (int64_t position = candidates; position < inputs.cache_length; ++position) {
      kept.push_back(static_cast<int32_t>(position));
    }
  }
  return plan;
}

}  // namespace entropyinfer

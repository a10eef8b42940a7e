// The observation-window scores shared by the query-guided decode policies (EntropyInfer's latent
// compression, SnapKV, AdaKV, PyramidKV), split into the steps of docs/method.md section 3 so each
// can be tested against its formula.
//
// With cache length L and window W (DecodeParams::window), the last W entries are always kept; the
// other L - W entries, positions [0, L - W), are the candidates that compete for the budget.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention_config.h"
#include "attention/decode_plan.h"
#include "attention/decode_selection.h"

namespace entropyinfer {

// Per query head, the mean over the window's queries of their attention probabilities
// softmax(q.k / sqrt(d)) over the cache, for keys [0, candidates). The window's query i sits at
// cache position L - window_tokens + i and, causally, sees keys 0 .. that position only; the
// softmax runs over all the keys it sees (so the probabilities of the window's own keys count in
// the normalisation, as in SnapKV). Returns [num_q_heads][candidates].
std::vector<float> window_attention_scores(const DecodeInputs& inputs, int64_t candidates);

// 1-D pooling of one row to the same length, stride 1, like SnapKV's
// F.avg_pool1d / F.max_pool1d(kernel, padding = kernel / 2, stride = 1) over the candidates only:
//   avg: out[i] = sum of in[i - k/2 .. i + k/2] / k, positions outside the row counting as 0
//        (PyTorch's default count_include_pad=True), so edge entries are damped;
//   max: out[i] = max of in[i - k/2 .. i + k/2] within the row (padding never wins);
//   none: a copy. kernel must be odd.
void pool_scores(const float* scores, int64_t count, Pooling pooling, int kernel, float* out);

// Candidate scores per selection head: each query head's window scores are pooled, then (unless
// params.per_query_head) the g query heads of a group are aggregated to their KV head by mean or
// max. Returns [selection_heads][candidates], selection_heads = Hq if per_query_head else Hkv.
std::vector<float> candidate_scores(const DecodeInputs& inputs, const DecodeParams& params,
                                    int64_t candidates);

// Ascending cache indices: the `keep` highest-scoring candidates (equal scores: lower index first)
// and every entry from `candidates` up to cache_length (the window).
std::vector<int32_t> keep_top_and_window(const float* scores, int64_t candidates, int64_t keep,
                                         int64_t cache_length);

// SnapKV's selection under `method`'s decode_selection() for the layer: each list keeps its window
// and its selection.keep best candidates (an empty plan when the selection does not compress).
// Used by SnapKV, latent decode and PyramidKV.
LayerDecodePlan select_top_per_head(DecodeMethod method, const DecodeInputs& inputs,
                                    const DecodeParams& params);

// Checks the shape of decode inputs (heads, window, strides); throws Error naming the problem.
void check_decode_inputs(const DecodeInputs& inputs, bool needs_queries);

}  // namespace entropyinfer

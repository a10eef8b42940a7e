#include "attention/window_scores.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/simd.h"

namespace entropyinfer {
namespace {}  // namespace

void check_decode_inputs(const DecodeInputs& inputs, bool needs_queries) {
  if (inputs.num_kv_heads <= 0 || inputs.num_q_heads <= 0 ||
      inputs.num_q_heads % inputs.num_kv_heads != 0) {
    throw Error("decode compression: query heads (" + std::to_string(inputs.num_q_heads) +
                ") must be a positive multiple of KV heads (" +
                std::to_string(inputs.num_kv_heads) + ")");
  }
  if (inputs.cache_length < 0 || inputs.key_stride < inputs.cache_length) {
    throw Error("decode compression: cache length " + std::to_string(inputs.cache_length) +
                " does not fit the key stride " + std::to_string(inputs.key_stride));
  }
  if (!needs_queries) return;
  if (inputs.head_dim <= 0 || inputs.keys == nullptr || inputs.window_queries == nullptr ||
      inputs.window_tokens <= 0) {
    throw Error("decode compression: the policy needs the window's queries and the keys");
  }
  if (inputs.window_tokens > inputs.cache_length) {
    throw Error("decode compression: " + std::to_string(inputs.window_tokens) +
                " window queries for a cache of " + std::to_string(inputs.cache_length) +
                " entries (the window's queries must be cached positions)");
  }
}

namespace {

// Window scores of one query head into row[0 .. candidates). logits is scratch space
// [window][length] filled key-outer, so each cached key is read once for all the window's queries.
ENTROPYINFER_SIMD_CLONES void head_window_scores(const float* window_queries, int q_heads, int head,
                                                 int window, const float* keys, int64_t length,
                                                 int head_dim, float scale, int64_t candidates,
                                                 std::vector<float>& logits,
                                                 std::vector<double>& sums, float* row) {
  logits.resize(static_cast<size_t>(window) * length);
  const int64_t first_position = length - window;  // cache position of window query 0
  for (int64_t j = 0; j < length; ++j) {
    const float* key = keys + j * head_dim;
    // Causal: only the queries at positions >= j see key j.
    const int first_query = static_cast<int>(std::max<int64_t>(0, j - first_position));
    for (int i = first_query; i < window; ++i) {
      const float* query = window_queries + (static_cast<int64_t>(i) * q_heads + head) * head_dim;
      logits[i * length + j] = cpu::inline_dot(query, key, head_dim) * scale;
    }
  }
  sums.assign(static_cast<size_t>(candidates), 0.0);
  for (int i = 0; i < window; ++i) {
    float* query_logits = logits.data() + static_cast<int64_t>(i) * length;
    const int64_t seen = first_position + i + 1;  // keys 0 .. own position
    float largest = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < seen; ++j) largest = std::max(largest, query_logits[j]);
    double total = 0.0;
    for (int64_t j = 0; j < seen; ++j) {
      query_logits[j] = std::exp(query_logits[j] - largest);
      total += query_logits[j];
    }
    const double inverse = 1.0 / total;
    const int64_t counted = std::min(candidates, seen);
    for (int64_t j = 0; j < counted; ++j) sums[j] += query_logits[j] * inverse;
  }
  for (int64_t j = 0; j < candidates; ++j) row[j] = static_cast<float>(sums[j] / window);
}

}  // namespace

std::vector<float> window_attention_scores(const DecodeInputs& inputs, int64_t candidates) {
  const int q_heads = inputs.num_q_heads;
  const int group = q_heads / inputs.num_kv_heads;
  const int head_dim = inputs.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> result(static_cast<size_t>(q_heads) * candidates, 0.0f);
#pragma omp parallel
  {
    std::vector<float> logits;
    std::vector<double> sums;
#pragma omp for schedule(dynamic, 1)
    for (int head = 0; head < q_heads; ++head) {
      head_window_scores(inputs.window_queries, q_heads, head, inputs.window_tokens,
                         inputs.keys + (head / group) * inputs.key_stride * head_dim,
                         inputs.cache_length, head_dim, scale, candidates, logits, sums,
                         result.data() + static_cast<int64_t>(head) * candidates);
    }
  }
  return result;
}

void pool_scores(const float* scores, int64_t count, Pooling pooling, int kernel, float* out) {
  const int64_t half = kernel / 2;
  switch (pooling) {
    case Pooling::kNone:
      std::copy(scores, scores + count, out);
      return;
    case Pooling::kAvg:
      for (int64_t i = 0; i < count; ++i) {
        double sum = 0.0;
        for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(count - 1, i + half); ++j) {
          sum += scores[j];
        }
        out[i] = static_cast<float>(sum / kernel);
      }
      return;
    case Pooling::kMax:
      for (int64_t i = 0; i < count; ++i) {
        float largest = -std::numeric_limits<float>::infinity();
        for (int64_t j = std::max<int64_t>(0, i - half); j <= std::min(count - 1, i + half); ++j) {
          largest = std::max(largest, scores[j]);
        }
        out[i] = largest;
      }
      return;
  }
}

std::vector<float> candidate_scores(const DecodeInputs& inputs, const DecodeParams& params,
                                    int64_t candidates) {
  const std::vector<float> raw = window_attention_scores(inputs, candidates);
  const int q_heads = inputs.num_q_heads;
  std::vector<float> pooled(raw.size());
  for (int head = 0; head < q_heads; ++head) {
    pool_scores(raw.data() + head * candidates, candidates, params.pooling, params.pool_kernel,
                pooled.data() + head * candidates);
  }
  if (params.per_query_head) return pooled;
  // Pool first, then aggregate the group, as GQA-aware SnapKV variants do.
  const int kv_heads = inputs.num_kv_heads;
  const int group = q_heads / kv_heads;
  std::vector<float> aggregated(static_cast<size_t>(kv_heads) * candidates);
  for (int kv_head = 0; kv_head < kv_heads; ++kv_head) {
    float* row = aggregated.data() + kv_head * candidates;
    for (int64_t j = 0; j < candidates; ++j) {
      double mean = 0.0;
      float largest = -std::numeric_limits<float>::infinity();
      for (int g = 0; g < group; ++g) {
        const float value = pooled[(kv_head * group + g) * candidates + j];
        mean += value;
        largest = std::max(largest, value);
      }
      row[j] =
          params.aggregation == GroupAggregation::kMax ? largest : static_cast<float>(mean / group);
    }
  }
  return aggregated;
}

std::vector<int32_t> keep_top_and_window(const float* scores, int64_t candidates, int64_t keep,
                                         int64_t cache_length) {
  keep = std::clamp<int64_t>(keep, 0, candidates);
  std::vector<int32_t> order(static_cast<size_t>(candidates));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [scores](int32_t a, int32_t b) {
                      if (scores[a] != scores[b]) return scores[a] > scores[b];
                      return a < b;
                    });
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());
  for (int64_t position = candidates; position < cache_length; ++position) {
    order.push_back(static_cast<int32_t>(position));
  }
  return order;
}

LayerDecodePlan select_top_per_head(DecodeMethod method, const DecodeInputs& inputs,
                                    const DecodeParams& params) {
  check_decode_inputs(inputs, true);
  const DecodeSelection selection =
      decode_selection(method, params, inputs.num_q_heads, inputs.num_kv_heads, inputs.layer,
                       inputs.num_layers, inputs.cache_length);
  LayerDecodePlan plan;
  plan.per_query_head = params.per_query_head;
  if (!selection.compresses) return plan;
  const int64_t candidates = selection.candidates;
  const std::vector<float> scores = candidate_scores(inputs, params, candidates);
  plan.kept.resize(selection.lists);
  for (int list = 0; list < selection.lists; ++list) {
    plan.kept[list] = keep_top_and_window(scores.data() + list * candidates, candidates,
                                          selection.keep, inputs.cache_length);
  }
  return plan;
}

}  // namespace entropyinfer

#include "backends/cpu/block_sparse_attention.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/inline_dot.h"
#include "core/error.h"

namespace entropyinfer::cpu {
namespace {

// A run of consecutive key positions [first, first + count).
struct KeyRange {
  int64_t first;
  int64_t count;
};

void check_plan(const AttentionShape& shape, const LayerPrefillPlan& plan) {
  if (shape.first_position != 0 || shape.window != 0) {
    throw Error("block-sparse attention runs a whole prompt: first_position and window must be 0");
  }
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("block-sparse attention: query heads must be a multiple of KV heads");
  }
  if (plan.dense) return;
  const std::string prefix = "block-sparse attention: the plan ";
  if (plan.num_tokens != shape.tokens || plan.num_kv_heads != shape.kv_heads) {
    throw Error(prefix + "describes " + std::to_string(plan.num_tokens) + " tokens and " +
                std::to_string(plan.num_kv_heads) + " KV heads, the call " +
                std::to_string(shape.tokens) + " and " + std::to_string(shape.kv_heads));
  }
  if (plan.segment_size <= 0 || plan.block_size <= 0 ||
      plan.num_segments != (plan.num_tokens + plan.segment_size - 1) / plan.segment_size ||
      static_cast<int64_t>(plan.segment_sparse.size()) != plan.num_segments ||
      static_cast<int64_t>(plan.row_offsets.size()) !=
          static_cast<int64_t>(plan.num_kv_heads) * plan.num_segments + 1 ||
      plan.row_offsets.back() != static_cast<int32_t>(plan.block_indices.size())) {
    throw Error(prefix + "has inconsistent segment or row sizes");
  }
  for (int kv_head = 0; kv_head < plan.num_kv_heads; ++kv_head) {
    for (int segment = 0; segment < plan.num_segments; ++segment) {
      const int row = kv_head * plan.num_segments + segment;
      const int64_t start = static_cast<int64_t>(segment) * plan.segment_size;
      if (plan.row_offsets[row] > plan.row_offsets[row + 1]) {
        throw Error(prefix + "has decreasing row offsets");
      }
      for (int32_t k = plan.row_offsets[row]; k < plan.row_offsets[row + 1]; ++k) {
        const int64_t block = plan.block_indices[k];
        if (block < 0 || (block + 1) * plan.block_size > start) {
          throw Error(prefix + "selects block " + std::to_string(block) + " for segment " +
                      std::to_string(segment) + ", which does not end before the segment");
        }
      }
    }
  }
}

// Softmax-weighted sum of the values at `ranges` for one query; scores is scratch space. Cloned for
// AVX2 like the dense kernels, so sparse and dense attention are compared on equal terms.
__attribute__((target_clones("arch=haswell", "default"))) void attend(
    const float* query, const float* keys, const float* values, int64_t head_dim, float scale,
    const std::vector<KeyRange>& ranges, std::vector<float>& scores, float* result) {
  int64_t total = 0;
  for (const KeyRange& range : ranges) total += range.count;
  scores.resize(static_cast<size_t>(total));
  int64_t next = 0;
  for (const KeyRange& range : ranges) {
    for (int64_t j = 0; j < range.count; ++j) {
      scores[next++] =
          cpu::inline_dot(query, keys + (range.first + j) * head_dim, head_dim) * scale;
    }
  }
  softmax_inplace(scores.data(), total);
  std::fill(result, result + head_dim, 0.0f);
  next = 0;
  for (const KeyRange& range : ranges) {
    for (int64_t j = 0; j < range.count; ++j) {
      const float weight = scores[next++];
      const float* value = values + (range.first + j) * head_dim;
#pragma omp simd
      for (int64_t d = 0; d < head_dim; ++d) result[d] += weight * value[d];
    }
  }
}

}  // namespace

void block_sparse_attention(const float* q, const float* key_cache, const float* value_cache,
                            const AttentionShape& shape, const LayerPrefillPlan& plan, float* out) {
  check_plan(shape, plan);
  if (plan.dense) {
    causal_attention(q, key_cache, value_cache, shape, out);
    return;
  }
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t segments = plan.num_segments;
  const int64_t items = segments * shape.q_heads;
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<KeyRange> ranges;
    // Late dense segments cost the most; handing items out last segment first balances the cores.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t segment = segments - 1 - item / shape.q_heads;
      const int64_t head = item % shape.q_heads;
      const int64_t kv_head = head / group;
      const int64_t start = segment * plan.segment_size;
      const int64_t end = std::min<int64_t>(shape.tokens, start + plan.segment_size);
      const float* keys = key_cache + kv_head * shape.cache_stride * head_dim;
      const float* values = value_cache + kv_head * shape.cache_stride * head_dim;
      // Keys before the segment: the selected blocks (adjacent ones merged) or everything.
      ranges.clear();
      if (plan.segment_sparse[segment]) {
        const int64_t row = kv_head * segments + segment;
        for (int32_t k = plan.row_offsets[row]; k < plan.row_offsets[row + 1]; ++k) {
          const int64_t first = static_cast<int64_t>(plan.block_indices[k]) * plan.block_size;
          if (!ranges.empty() && ranges.back().first + ranges.back().count == first) {
            ranges.back().count += plan.block_size;
          } else {
            ranges.push_back({first, plan.block_size});
          }
        }
      } else if (start > 0) {
        ranges.push_back({0, start});
      }
      const size_t before = ranges.size();
      for (int64_t t = start; t < end; ++t) {
        ranges.resize(before);
        ranges.push_back({start, t - start + 1});  // the segment's own keys, causally
        attend(q + (t * shape.q_heads + head) * head_dim, keys, values, head_dim, shape.scale,
               ranges, scores, out + (t * shape.q_heads + head) * head_dim);
      }
    }
  }
}

}  // namespace entropyinfer::cpu

#include "backends/cpu/compressed_decode_attention.h"

#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/simd.h"

namespace entropyinfer::cpu {
namespace {

// One query head over its cache: softmax(q.k * scale) weighted sum of the values.
ENTROPYINFER_SIMD_CLONES void attend_one_head(const float* query, const float* keys,
                                              const float* values, int64_t length, int64_t head_dim,
                                              float scale, std::vector<float>& scores,
                                              float* result) {
  std::fill(result, result + head_dim, 0.0f);
  if (length <= 0) return;
  scores.resize(static_cast<size_t>(length));
  for (int64_t j = 0; j < length; ++j)
    scores[j] = cpu::inline_dot(query, keys + j * head_dim, head_dim) * scale;
  softmax_inplace(scores.data(), length);
  for (int64_t j = 0; j < length; ++j) {
    const float weight = scores[j];
    const float* value = values + j * head_dim;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) result[d] += weight * value[d];
  }
}

}  // namespace

void compressed_decode_attention(const float* q, const float* const* key_heads,
                                 const float* const* value_heads, const int64_t* lengths,
                                 const CompressedDecodeShape& shape, float* out) {
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("compressed decode attention: query heads must be a multiple of KV heads");
  }
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t head_dim = shape.head_dim;
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t head = 0; head < shape.q_heads; ++head) {
      const int64_t cache = shape.per_query_head ? head : head / group;
      attend_one_head(q + head * head_dim, key_heads[cache], value_heads[cache], lengths[cache],
                      head_dim, shape.scale, scores, out + head * head_dim);
    }
  }
}

}  // namespace entropyinfer::cpu

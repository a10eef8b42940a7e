#include "attention/entropy_prefill.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attention/entropy_budget.h"
#include "attention/policies.h"
#include "core/error.h"
#include "core/simd.h"

namespace entropyinfer {
namespace {

// Extrema over `count` rows starting at `first`, rows `row_step` floats apart.
void row_extrema(const float* first, int64_t count, int64_t row_step, int head_dim, float* max_out,
                 float* min_out) {
  std::copy(first, first + head_dim, max_out);
  std::copy(first, first + head_dim, min_out);
  for (int64_t row = 1; row < count; ++row) {
    const float* values = first + row * row_step;
    for (int c = 0; c < head_dim; ++c) {
      max_out[c] = std::max(max_out[c], values[c]);
      min_out[c] = std::min(min_out[c], values[c]);
    }
  }
}

void check_inputs(const PrefillInputs& inputs) {
  if (inputs.num_kv_heads <= 0 || inputs.num_q_heads <= 0 ||
      inputs.num_q_heads % inputs.num_kv_heads != 0) {
    throw Error("prefill estimate: query heads (" + std::to_string(inputs.num_q_heads) +
                ") must be a positive multiple of KV heads (" +
                std::to_string(inputs.num_kv_heads) + ")");
  }
  if (inputs.head_dim <= 0 || inputs.num_tokens < 0 || inputs.key_stride < inputs.num_tokens) {
    throw Error("prefill estimate: bad shape (head_dim " + std::to_string(inputs.head_dim) +
                ", tokens " + std::to_string(inputs.num_tokens) + ", key stride " +
                std::to_string(inputs.key_stride) + ")");
  }
}

// Orders block indices by score, highest first, lower index first among equal scores.
struct ByScoreThenIndex {
  const float* scores;
  bool operator()(int32_t a, int32_t b) const {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  }
};

// The first `keep` block indices of the row in ByScoreThenIndex order (not sorted by index).
std::vector<int32_t> ranked_prefix(const float* scores, int64_t count, int64_t keep) {
  keep = std::clamp<int64_t>(keep, 0, count);
  std::vector<int32_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), ByScoreThenIndex{scores});
  order.resize(static_cast<size_t>(keep));
  return order;
}

}  // namespace

HeadExtrema block_key_extrema(const float* keys, int64_t key_stride, int64_t num_tokens,
                              int num_kv_heads, int head_dim, int block_size) {
  HeadExtrema extrema;
  extrema.num_heads = num_kv_heads;
  extrema.num_groups = (num_tokens + block_size - 1) / block_size;
  extrema.head_dim = head_dim;
  const size_t size = static_cast<size_t>(num_kv_heads) * extrema.num_groups * head_dim;
  extrema.max.resize(size);
  extrema.min.resize(size);
  const int64_t total = num_kv_heads * extrema.num_groups;
#pragma omp parallel for schedule(static)
  for (int64_t index = 0; index < total; ++index) {
    const int head = static_cast<int>(index / extrema.num_groups);
    const int64_t block = index % extrema.num_groups;
    const int64_t first = block * block_size;
    const int64_t count = std::min<int64_t>(block_size, num_tokens - first);
    const float* rows = keys + (head * key_stride + first) * head_dim;
    row_extrema(rows, count, head_dim, head_dim, extrema.max.data() + index * head_dim,
                extrema.min.data() + index * head_dim);
  }
  return extrema;
}

HeadExtrema segment_query_extrema(const float* queries, int64_t num_tokens, int num_q_heads,
                                  int head_dim, int segment_size) {
  HeadExtrema extrema;
  extrema.num_heads = num_q_heads;
  extrema.num_groups = count_segments(num_tokens, segment_size);
  extrema.head_dim = head_dim;
  const size_t size = static_cast<size_t>(num_q_heads) * extrema.num_groups * head_dim;
  extrema.max.resize(size);
  extrema.min.resize(size);
  const int64_t total = num_q_heads * extrema.num_groups;
  const int64_t token_step = static_cast<int64_t>(num_q_heads) * head_dim;
#pragma omp parallel for schedule(static)
  for (int64_t index = 0; index < total; ++index) {
    const int head = static_cast<int>(index / extrema.num_groups);
    const int64_t segment = index % extrema.num_groups;
    const int64_t first = segment * segment_size;
    const int64_t count = std::min<int64_t>(segment_size, num_tokens - first);
    const float* rows = queries + first * token_step + static_cast<int64_t>(head) * head_dim;
    row_extrema(rows, count, token_step, head_dim, extrema.max.data() + index * head_dim,
                extrema.min.data() + index * head_dim);
  }
  return extrema;
}

ENTROPYINFER_SIMD_CLONES void criticality_row(const HeadExtrema& query_extrema,
                                              const HeadExtrema& key_extrema, int kv_head,
                                              int64_t segment, int64_t count, float* scores) {
  const int group = query_extrema.num_heads / key_extrema.num_heads;
  const int head_dim = key_extrema.head_dim;
  // Midpoints (qmax + qmin) / 2 of the group's query heads, [group][head_dim].
  std::vector<float> midpoints(static_cast<size_t>(group) * head_dim);
  for (int g = 0; g < group; ++g) {
    const int q_head = kv_head * group + g;
    const float* qmax = query_extrema.max_row(q_head, segment);
    const float* qmin = query_extrema.min_row(q_head, segment);
    for (int c = 0; c < head_dim; ++c) midpoints[g * head_dim + c] = 0.5f * (qmax[c] + qmin[c]);
  }
  for (int64_t block = 0; block < count; ++block) {
    const float* kmax = key_extrema.max_row(kv_head, block);
    const float* kmin = key_extrema.min_row(kv_head, block);
    float sum = 0.0f;
    for (int g = 0; g < group; ++g) {
      const float* midpoint = midpoints.data() + g * head_dim;
      sum += std::max(cpu::inline_dot(midpoint, kmax, head_dim),
                      cpu::inline_dot(midpoint, kmin, head_dim));
    }
    scores[block] = sum / static_cast<float>(group);
  }
}

std::vector<double> block_softmax(const float* scores, int64_t count) {
  std::vector<double> probabilities(static_cast<size_t>(count));
  if (count == 0) return probabilities;
  const double largest = *std::max_element(scores, scores + count);
  double total = 0.0;
  for (int64_t j = 0; j < count; ++j) {
    probabilities[j] = std::exp(static_cast<double>(scores[j]) - largest);
    total += probabilities[j];
  }
  for (double& p : probabilities) p /= total;
  return probabilities;
}

double block_entropy(const float* scores, int64_t count) {
  double entropy = 0.0;
  for (double p : block_softmax(scores, count)) entropy -= p * std::log(p + 1e-9);
  return entropy;
}

bool is_rigid_head(const double* entropy, int64_t num_segments, double threshold) {
  for (int64_t s = 1; s < num_segments; ++s) {
    if (!(entropy[s] < threshold)) return false;
  }
  return true;
}

std::vector<double> segment_budgets(const double* entropy, int64_t num_segments, bool rigid,
                                    const PrefillParams& params) {
  const double base = params.base_budget;
  const double cap = static_cast<double>(params.budget_cap_factor) * base;
  std::vector<double> budgets(static_cast<size_t>(num_segments), base);
  if (rigid) return budgets;
  for (int64_t s = 1; s < num_segments; ++s) {
    budgets[s] = entropy_budget::segment_budget(
        false, params.per_segment_rigid, params.entropy_threshold, budgets[s - 1], entropy[s],
        entropy[s - 1], s, base, cap, params.delta, params.alpha);
  }
  return budgets;
}

int64_t budget_blocks(double budget_tokens, int block_size, int64_t visible) {
  return entropy_budget::budget_blocks(budget_tokens, block_size, visible);
}

std::vector<int32_t> top_blocks(const float* scores, int64_t count, int64_t keep) {
  std::vector<int32_t> chosen = ranked_prefix(scores, count, keep);
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

LayerPrefillPlan dense_prefill_plan(const PrefillInputs& inputs, const PrefillParams& params) {
  LayerPrefillPlan plan;
  plan.dense = true;
  plan.num_tokens = inputs.num_tokens;
  plan.num_kv_heads = inputs.num_kv_heads;
  plan.segment_size = params.segment_size;
  plan.block_size = params.block_size;
  plan.num_segments = static_cast<int>(count_segments(inputs.num_tokens, params.segment_size));
  return plan;
}

LayerPrefillPlan estimate_prefill_plan(const PrefillInputs& inputs, const PrefillParams& params,
                                       BudgetRule rule) {
  check_inputs(inputs);
  LayerPrefillPlan plan = dense_prefill_plan(inputs, params);
  const int64_t num_segments = plan.num_segments;
  const int kv_heads = inputs.num_kv_heads;
  const int S = params.segment_size;
  const int b = params.block_size;
  if (S % b != 0) {
    throw Error("prefill estimate: segment_size must be a multiple of block_size");
  }
  std::vector<uint8_t> sparse(static_cast<size_t>(num_segments));
  bool any_sparse = false;
  for (int64_t s = 0; s < num_segments; ++s) {
    sparse[s] = segment_is_sparse(s, num_segments, S, params.sparse_threshold) ? 1 : 0;
    any_sparse = any_sparse || (sparse[s] != 0);
  }
  if (inputs.layer < params.dense_layers || !any_sparse) return plan;

  const HeadExtrema key_extrema = block_key_extrema(
      inputs.keys, inputs.key_stride, inputs.num_tokens, kv_heads, inputs.head_dim, b);
  const HeadExtrema query_extrema = segment_query_extrema(inputs.queries, inputs.num_tokens,
                                                          inputs.num_q_heads, inputs.head_dim, S);

  // Pass 1, per (KV head, segment) row: scores, entropy, and for sparse segments the ranked blocks
  // up to the largest budget any rule may grant (the final choice is a prefix of this ranking).
  const bool with_entropy = rule == BudgetRule::kEntropy;
  const double largest_budget =
      with_entropy ? static_cast<double>(params.budget_cap_factor) * params.base_budget
                   : static_cast<double>(params.critiprefill_budget);
  const int64_t rows = kv_heads * num_segments;
  std::vector<double> entropy(static_cast<size_t>(rows), 0.0);
  std::vector<std::vector<int32_t>> ranked(static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> scores;
    // Later segments see more blocks; dynamic scheduling balances the triangle.
#pragma omp for schedule(dynamic, 1)
    for (int64_t index = 0; index < rows; ++index) {
      // Segment-major order puts the expensive late segments first.
      const int64_t s = num_segments - 1 - index / kv_heads;
      const int h = static_cast<int>(index % kv_heads);
      const int64_t row = h * num_segments + s;
      const int64_t visible = visible_blocks(s, S, b);
      if (visible == 0 || (!with_entropy && !sparse[s])) continue;
      scores.resize(static_cast<size_t>(visible));
      criticality_row(query_extrema, key_extrema, h, s, visible, scores.data());
      if (with_entropy) entropy[row] = block_entropy(scores.data(), visible);
      if (sparse[s]) {
        ranked[row] =
            ranked_prefix(scores.data(), visible, budget_blocks(largest_budget, b, visible));
      }
    }
  }

  // Pass 2: budgets per (KV head, segment).
  std::vector<double> budgets(static_cast<size_t>(rows),
                              static_cast<double>(params.critiprefill_budget));
  if (with_entropy) {
    plan.rigid_head.resize(kv_heads);
    for (int h = 0; h < kv_heads; ++h) {
      const double* head_entropy = entropy.data() + h * num_segments;
      const bool rigid = is_rigid_head(head_entropy, num_segments, params.entropy_threshold);
      plan.rigid_head[h] = rigid ? 1 : 0;
      const std::vector<double> head_budgets =
          segment_budgets(head_entropy, num_segments, rigid, params);
      std::copy(head_budgets.begin(), head_budgets.end(), budgets.begin() + h * num_segments);
    }
    if (params.share_segment_budget) {
      for (int64_t s = 0; s < num_segments; ++s) {
        double shared = 0.0;
        for (int h = 0; h < kv_heads; ++h) shared = std::max(shared, budgets[h * num_segments + s]);
        for (int h = 0; h < kv_heads; ++h) budgets[h * num_segments + s] = shared;
      }
    }
    plan.entropy.assign(entropy.begin(), entropy.end());
  }
  plan.budget_tokens.resize(static_cast<size_t>(rows));
  for (int64_t row = 0; row < rows; ++row) {
    plan.budget_tokens[row] = static_cast<int32_t>(std::floor(budgets[row]));
  }

  // Pass 3: the CSR rows, the first B/b ranked blocks of each sparse row, ascending.
  plan.dense = false;
  plan.segment_sparse = sparse;
  plan.row_offsets.assign(static_cast<size_t>(rows) + 1, 0);
  for (int h = 0; h < kv_heads; ++h) {
    for (int64_t s = 0; s < num_segments; ++s) {
      const int64_t row = h * num_segments + s;
      if (sparse[s]) {
        const int64_t keep = budget_blocks(budgets[row], b, visible_blocks(s, S, b));
        std::vector<int32_t>& chosen = ranked[row];
        chosen.resize(static_cast<size_t>(keep));
        std::sort(chosen.begin(), chosen.end());
        plan.block_indices.insert(plan.block_indices.end(), chosen.begin(), chosen.end());
      }
      plan.row_offsets[row + 1] = static_cast<int32_t>(plan.block_indices.size());
    }
  }
  return plan;
}

// --- EntropyInfer's prefill policy ---------------------------------------------------------------

EntropyPrefillPolicy::EntropyPrefillPolicy(const PrefillParams& params) : params_(params) {}

LayerPrefillPlan EntropyPrefillPolicy::plan(const PrefillInputs& inputs) const {
  return estimate_prefill_plan(inputs, params_, BudgetRule::kEntropy);
}

}  // namespace entropyinfer

// EntropyInfer's prefill estimate (docs/method.md section 2), split into the steps it names so that
// each can be tested on its own against the formula. CritiPrefill shares every step except the
// budget.
//
// Layout conventions: heads are outermost. Key blocks are [kv_head][block][head_dim]; query
// segments are [q_head][segment][head_dim]; score rows are one per (KV head, segment).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention_config.h"
#include "attention/prefill_plan.h"

namespace entropyinfer {

// Element-wise max and min over groups of consecutive rows (key blocks or query segments), per
// head. The last group may be shorter than the others; its extrema are over the rows it has.
struct HeadExtrema {
  int num_heads = 0;
  int64_t num_groups = 0;
  int head_dim = 0;
  std::vector<float> max;  // [num_heads][num_groups][head_dim]
  std::vector<float> min;

  const float* max_row(int head, int64_t group) const {
    return max.data() + (static_cast<int64_t>(head) * num_groups + group) * head_dim;
  }
  const float* min_row(int head, int64_t group) const {
    return min.data() + (static_cast<int64_t>(head) * num_groups + group) * head_dim;
  }
};

// kmax/kmin of every key block of every KV head. keys: per KV head a slab [key_stride, head_dim].
HeadExtrema block_key_extrema(const float* keys, int64_t key_stride, int64_t num_tokens,
                              int num_kv_heads, int head_dim, int block_size);

// qmax/qmin of every query segment of every query head. queries: [num_tokens, num_q_heads,
// head_dim].
HeadExtrema segment_query_extrema(const float* queries, int64_t num_tokens, int num_q_heads,
                                  int head_dim, int segment_size);

inline int64_t count_segments(int64_t num_tokens, int segment_size) {
  return (num_tokens + segment_size - 1) / segment_size;
}

// Blocks that end before the segment starts (the only ones it may select): segment * S / b, because
// S is a multiple of b. Segment 0 sees none.
inline int64_t visible_blocks(int64_t segment, int segment_size, int block_size) {
  return segment * segment_size / block_size;
}

// Criticality of blocks [0, count) for one (KV head, segment): for each query head of the group,
//   max( mean(qmax.kmax, qmin.kmax), mean(qmax.kmin, qmin.kmin) )
// with raw (unscaled) dot products, then averaged over the group's query heads. Because the dot
// product is linear, mean(qmax.k, qmin.k) = ((qmax + qmin) / 2).k; that form halves the work.
void criticality_row(const HeadExtrema& query_extrema, const HeadExtrema& key_extrema, int kv_head,
                     int64_t segment, int64_t count, float* scores);

// Softmax of one score row (computed in double, max subtracted first).
std::vector<double> block_softmax(const float* scores, int64_t count);

// H = -sum p log(p + 1e-9) of the softmax of the row, natural log. An empty row has entropy 0.
double block_entropy(const float* scores, int64_t count);

// A head is rigid when its entropy is below `threshold` in every segment s >= 1 (entropy[0] is not
// looked at). With a single segment the condition holds vacuously; budgets are then base either
// way.
bool is_rigid_head(const double* entropy, int64_t num_segments, double threshold);

// Token budgets B[s] of one KV head over its segments (docs/method.md section 2.6). Rigid: base
// everywhere. Dynamic: B[0] = base; r[1] = delta; r[s] = (H[s] - H[s-1]) / (H[s-1] + 1e-9) for s >=
// 2; r clamped to [0, 1 + delta]; B[s] = clamp(B[s-1] + alpha * base * (r[s] - delta), base, cap *
// base).
std::vector<double> segment_budgets(const double* entropy, int64_t num_segments, bool rigid,
                                    const PrefillParams& params);

// Blocks a budget buys: floor(budget / b), capped by the blocks the segment may see.
int64_t budget_blocks(double budget_tokens, int block_size, int64_t visible);

// Indices of the `keep` highest scores of the row, returned ascending. Equal scores are broken in
// favour of the lower block index (the earlier block), so the result is deterministic.
std::vector<int32_t> top_blocks(const float* scores, int64_t count, int64_t keep);

// A segment runs sparse when it starts at or after the threshold and is not the prompt's last one.
inline bool segment_is_sparse(int64_t segment, int64_t num_segments, int segment_size,
                              int threshold) {
  return segment * segment_size >= threshold && segment + 1 < num_segments;
}

// How a plan turns the estimate into per-(KV head, segment) budgets.
enum class BudgetRule {
  kEntropy,  // EntropyInfer: rigid/dynamic classification and the budget recursion
  kFixed,    // CritiPrefill: critiprefill_budget for every head and segment
};

// The whole estimate for one layer. Returns a dense plan for the first dense_layers layers and when
// no segment of the prompt is sparse (nothing to estimate then). Otherwise the plan lists, for
// every (KV head, sparse segment) row, the top floor(B/b) visible blocks; with share_segment_budget
// every head of a segment gets the largest budget among them (the released behaviour). entropy,
// budget_tokens (the budget applied, floor(B)) and rigid_head are filled for kEntropy;
// budget_tokens only for kFixed.
LayerPrefillPlan estimate_prefill_plan(const PrefillInputs& inputs, const PrefillParams& params,
                                       BudgetRule rule);

// A plan that runs the whole layer densely (shape fields filled, no rows).
LayerPrefillPlan dense_prefill_plan(const PrefillInputs& inputs, const PrefillParams& params);

}  // namespace entropyinfer

// EntropyInfer's prefill estimate and CritiPrefill against a naive reference written here from the
// formulas of the method (docs/method.md section 2): block/segment extrema, criticality scores,
// softmax and entropy, rigid/dynamic classification, the budget recursion and the chosen blocks.
// Plus invariants that must hold for any input: causality of the selection, full coverage when
// budgets exceed the context, and per-head budgets that really differ.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/entropy_prefill.h"
#include "attention/policies.h"
#include "core/error.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::random_vector;

// A prompt's queries [n, Hq, d] and keys, per KV head a slab [stride, d] (stride > n on purpose).
struct Prompt {
  int64_t tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t stride = 0;
  std::vector<float> queries;
  std::vector<float> keys;

  float& q(int64_t t, int head, int c) { return queries[(t * q_heads + head) * head_dim + c]; }
  float& k(int head, int64_t t, int c) { return keys[(head * stride + t) * head_dim + c]; }
  float qv(int64_t t, int head, int c) const {
    return queries[(t * q_heads + head) * head_dim + c];
  }
  float kv(int head, int64_t t, int c) const { return keys[(head * stride + t) * head_dim + c]; }

  PrefillInputs inputs(int layer = 1) const {
    PrefillInputs in;
    in.queries = queries.data();
    in.keys = keys.data();
    in.key_stride = stride;
    in.num_tokens = tokens;
    in.num_q_heads = q_heads;
    in.num_kv_heads = kv_heads;
    in.head_dim = head_dim;
    in.layer = layer;
    return in;
  }
};

Prompt random_prompt(int64_t tokens, int q_heads, int kv_heads, int head_dim, uint32_t seed,
                     float scale = 1.0f) {
  Prompt prompt;
  prompt.tokens = tokens;
  prompt.q_heads = q_heads;
  prompt.kv_heads = kv_heads;
  prompt.head_dim = head_dim;
  prompt.stride = tokens + 3;
  prompt.queries = random_vector(static_cast<size_t>(tokens * q_heads * head_dim), seed, scale);
  prompt.keys =
      random_vector(static_cast<size_t>(kv_heads * prompt.stride * head_dim), seed + 1, scale);
  return prompt;
}

// ---- The naive reference, formula by formula
// ------------------------------------------------------

double naive_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// Element-wise max (want_max) or min of the keys of block j of KV head h.
std::vector<double> naive_block_extreme(const Prompt& p, int h, int64_t j, int b, bool want_max) {
  std::vector<double> result(p.head_dim, want_max ? -1e300 : 1e300);
  for (int64_t t = j * b; t < std::min<int64_t>(p.tokens, (j + 1) * b); ++t) {
    for (int c = 0; c < p.head_dim; ++c) {
      const double v = p.kv(h, t, c);
      result[c] = want_max ? std::max(result[c], v) : std::min(result[c], v);
    }
  }
  return result;
}

std::vector<double> naive_segment_extreme(const Prompt& p, int qh, int64_t s, int S,
                                          bool want_max) {
  std::vector<double> result(p.head_dim, want_max ? -1e300 : 1e300);
  for (int64_t t = s * S; t < std::min<int64_t>(p.tokens, (s + 1) * S); ++t) {
    for (int c = 0; c < p.head_dim; ++c) {
      const double v = p.qv(t, qh, c);
      result[c] = want_max ? std::max(result[c], v) : std::min(result[c], v);
    }
  }
  return result;
}

// score = max(mean(qmax.kmax, qmin.kmax), mean(qmax.kmin, qmin.kmin)), averaged over the group.
double naive_score(const Prompt& p, int kv_head, int64_t s, int64_t j, int S, int b) {
  const int group = p.q_heads / p.kv_heads;
  const auto kmax = naive_block_extreme(p, kv_head, j, b, true);
  const auto kmin = naive_block_extreme(p, kv_head, j, b, false);
  double total = 0.0;
  for (int g = 0; g < group; ++g) {
    const int qh = kv_head * group + g;
    const auto qmax = naive_segment_extreme(p, qh, s, S, true);
    const auto qmin = naive_segment_extreme(p, qh, s, S, false);
    const double with_kmax = (naive_dot(qmax, kmax) + naive_dot(qmin, kmax)) / 2.0;
    const double with_kmin = (naive_dot(qmax, kmin) + naive_dot(qmin, kmin)) / 2.0;
    total += std::max(with_kmax, with_kmin);
  }
  return total / group;
}

std::vector<double> naive_softmax(const std::vector<double>& x) {
  std::vector<double> p(x.size());
  if (x.empty()) return p;
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0.0;
  for (size_t i = 0; i < x.size(); ++i) z += std::exp(x[i] - m);
  for (size_t i = 0; i < x.size(); ++i) p[i] = std::exp(x[i] - m) / z;
  return p;
}

double naive_entropy(const std::vector<double>& scores) {
  double h = 0.0;
  for (double p : naive_softmax(scores)) h += -p * std::log(p + 1e-9);
  return h;
}

std::vector<double> naive_budgets(const std::vector<double>& H, bool rigid,
                                  const PrefillParams& pp) {
  const double base = pp.base_budget;
  std::vector<double> B(H.size(), base);
  if (rigid) return B;
  for (size_t s = 1; s < H.size(); ++s) {
    double r = (s == 1) ? pp.delta : (H[s] - H[s - 1]) / (H[s - 1] + 1e-9);
    if (r < 0.0) r = 0.0;
    if (r > 1.0 + pp.delta) r = 1.0 + pp.delta;
    double next = B[s - 1] + pp.alpha * base * (r - pp.delta);
    if (next < base) next = base;
    if (next > pp.budget_cap_factor * base) next = pp.budget_cap_factor * base;
    B[s] = next;
  }
  return B;
}

// Blocks whose keys all come before position `start`.
std::vector<int64_t> naive_visible(int64_t start, int64_t tokens, int b) {
  std::vector<int64_t> blocks;
  for (int64_t j = 0; j * b < tokens; ++j) {
    if ((j + 1) * b <= start) blocks.push_back(j);
  }
  return blocks;
}

struct NaivePlan {
  bool dense = true;
  std::vector<double> entropy;             // [kv][seg]
  std::vector<int> rigid;                  // [kv]
  std::vector<double> budget;              // [kv][seg]
  std::vector<int> sparse;                 // [seg]
  std::vector<std::vector<int32_t>> rows;  // [kv][seg]
};

NaivePlan naive_plan(const Prompt& p, const PrefillParams& pp, bool entropy_rule, int layer) {
  NaivePlan plan;
  const int S = pp.segment_size, b = pp.block_size;
  int64_t segments = 0;
  while (segments * S < p.tokens) ++segments;
  plan.sparse.resize(segments);
  bool any = false;
  for (int64_t s = 0; s < segments; ++s) {
    plan.sparse[s] = (s * S >= pp.sparse_threshold) && (s != segments - 1);
    any = any || plan.sparse[s];
  }
  if (layer < pp.dense_layers || !any) return plan;
  plan.dense = false;
  plan.entropy.assign(p.kv_heads * segments, 0.0);
  plan.budget.assign(p.kv_heads * segments, pp.critiprefill_budget);
  plan.rigid.assign(p.kv_heads, 0);
  std::vector<std::vector<double>> scores(p.kv_heads * segments);
  for (int h = 0; h < p.kv_heads; ++h) {
    for (int64_t s = 0; s < segments; ++s) {
      for (int64_t j : naive_visible(s * S, p.tokens, b)) {
        scores[h * segments + s].push_back(naive_score(p, h, s, j, S, b));
      }
      if (s >= 1) plan.entropy[h * segments + s] = naive_entropy(scores[h * segments + s]);
    }
    if (entropy_rule) {
      bool rigid = true;
      for (int64_t s = 1; s < segments; ++s) {
        if (!(plan.entropy[h * segments + s] < pp.entropy_threshold)) rigid = false;
      }
      plan.rigid[h] = rigid;
      const std::vector<double> H(plan.entropy.begin() + h * segments,
                                  plan.entropy.begin() + (h + 1) * segments);
      const auto B = naive_budgets(H, rigid, pp);
      std::copy(B.begin(), B.end(), plan.budget.begin() + h * segments);
    }
  }
  if (entropy_rule && pp.share_segment_budget) {
    for (int64_t s = 0; s < segments; ++s) {
      double most = 0.0;
      for (int h = 0; h < p.kv_heads; ++h) most = std::max(most, plan.budget[h * segments + s]);
      for (int h = 0; h < p.kv_heads; ++h) plan.budget[h * segments + s] = most;
    }
  }
  plan.rows.resize(p.kv_heads * segments);
  for (int h = 0; h < p.kv_heads; ++h) {
    for (int64_t s = 0; s < segments; ++s) {
      if (!plan.sparse[s]) continue;
      const int64_t blocks = static_cast<int64_t>(std::floor(plan.budget[h * segments + s] / b));
      plan.rows[h * segments + s] = testing::naive_top(scores[h * segments + s], blocks);
    }
  }
  return plan;
}

std::vector<int32_t> plan_row(const LayerPrefillPlan& plan, int kv_head, int segment) {
  const int row = kv_head * plan.num_segments + segment;
  return std::vector<int32_t>(plan.block_indices.begin() + plan.row_offsets[row],
                              plan.block_indices.begin() + plan.row_offsets[row + 1]);
}

PrefillParams small_prefill_params() {
  PrefillParams pp;
  pp.segment_size = 32;
  pp.block_size = 4;
  pp.sparse_threshold = 32;
  pp.base_budget = 16;
  pp.critiprefill_budget = 24;
  pp.dense_layers = 1;
  return pp;
}

// ---- Building blocks
// ------------------------------------------------------------------------------

TEST(EntropyPrefill, BlockKeyExtremaMatchNaiveIncludingShortLastBlock) {
  for (auto [tokens, b] : {std::pair<int64_t, int>{37, 4}, {16, 8}, {5, 8}, {9, 1}}) {
    const Prompt p = random_prompt(tokens, 4, 2, 6, 11);
    const HeadExtrema e = block_key_extrema(p.keys.data(), p.stride, tokens, 2, 6, b);
    ASSERT_EQ(e.num_groups, (tokens + b - 1) / b);
    for (int h = 0; h < 2; ++h) {
      for (int64_t j = 0; j < e.num_groups; ++j) {
        const auto kmax = naive_block_extreme(p, h, j, b, true);
        const auto kmin = naive_block_extreme(p, h, j, b, false);
        for (int c = 0; c < 6; ++c) {
          ASSERT_EQ(e.max_row(h, j)[c], static_cast<float>(kmax[c])) << h << " " << j;
          ASSERT_EQ(e.min_row(h, j)[c], static_cast<float>(kmin[c])) << h << " " << j;
        }
      }
    }
  }
}

TEST(EntropyPrefill, SegmentQueryExtremaMatchNaiveIncludingShortLastSegment) {
  const Prompt p = random_prompt(77, 6, 3, 5, 12);
  const HeadExtrema e = segment_query_extrema(p.queries.data(), 77, 6, 5, 16);
  ASSERT_EQ(e.num_groups, 5);
  for (int qh = 0; qh < 6; ++qh) {
    for (int64_t s = 0; s < 5; ++s) {
      const auto qmax = naive_segment_extreme(p, qh, s, 16, true);
      const auto qmin = naive_segment_extreme(p, qh, s, 16, false);
      for (int c = 0; c < 5; ++c) {
        ASSERT_EQ(e.max_row(qh, s)[c], static_cast<float>(qmax[c]));
        ASSERT_EQ(e.min_row(qh, s)[c], static_cast<float>(qmin[c]));
      }
    }
  }
}

TEST(EntropyPrefill, CriticalityScoresMatchFormulaForEveryGroupSize) {
  for (auto [q_heads, kv_heads] : {std::pair{2, 2}, {4, 2}, {8, 2}, {3, 1}}) {
    const int S = 16, b = 4, d = 13;
    const Prompt p = random_prompt(70, q_heads, kv_heads, d, 20 + q_heads);
    const HeadExtrema ke = block_key_extrema(p.keys.data(), p.stride, p.tokens, kv_heads, d, b);
    const HeadExtrema qe = segment_query_extrema(p.queries.data(), p.tokens, q_heads, d, S);
    for (int h = 0; h < kv_heads; ++h) {
      for (int64_t s = 0; s < qe.num_groups; ++s) {
        const int64_t visible = visible_blocks(s, S, b);
        ASSERT_EQ(visible, static_cast<int64_t>(naive_visible(s * S, p.tokens, b).size()));
        std::vector<float> scores(visible);
        criticality_row(qe, ke, h, s, visible, scores.data());
        for (int64_t j = 0; j < visible; ++j) {
          const double expected = naive_score(p, h, s, j, S, b);
          ASSERT_NEAR(scores[j], expected, 1e-5 * (1.0 + std::fabs(expected)))
              << "group " << q_heads / kv_heads << " head " << h << " segment " << s << " block "
              << j;
        }
      }
    }
  }
}

TEST(EntropyPrefill, CriticalityScoresAreRawDotProductsNotScaled) {
  // One query head, one block of one key: qmax = qmin = q, kmax = kmin = k, so score = q.k exactly.
  const float q[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float k[4] = {0.5f, -1.0f, 2.0f, 1.0f};
  const HeadExtrema ke = block_key_extrema(k, 1, 1, 1, 4, 1);
  const HeadExtrema qe = segment_query_extrema(q, 1, 1, 4, 1);
  float score = 0.0f;
  criticality_row(qe, ke, 0, 0, 1, &score);
  EXPECT_FLOAT_EQ(score, 0.5f - 2.0f + 6.0f + 4.0f);
}

TEST(EntropyPrefill, SoftmaxAndEntropyMatchFormula) {
  for (int count : {1, 2, 7, 64}) {
    const auto raw = random_vector(count, 30 + count, 4.0f);
    std::vector<double> as_double(raw.begin(), raw.end());
    const auto expected = naive_softmax(as_double);
    const auto got = block_softmax(raw.data(), count);
    double total = 0.0;
    for (int j = 0; j < count; ++j) {
      EXPECT_NEAR(got[j], expected[j], 1e-12);
      total += got[j];
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
    EXPECT_NEAR(block_entropy(raw.data(), count), naive_entropy(as_double), 1e-12);
  }
  // Uniform scores: H = log N (up to the 1e-9 inside the log); one dominant block: H ~ 0; empty: 0.
  std::vector<float> uniform(50, 0.3f);
  EXPECT_NEAR(block_entropy(uniform.data(), 50), std::log(50.0), 1e-6);
  std::vector<float> peaked(50, 0.0f);
  peaked[17] = 200.0f;
  EXPECT_LT(std::fabs(block_entropy(peaked.data(), 50)), 1e-8);
  EXPECT_EQ(block_entropy(nullptr, 0), 0.0);
}

TEST(EntropyPrefill, RigidClassificationMatchesDefinition) {
  const double e_t = 1e-5;
  // Segment 0 is never looked at; any later segment at or above e_t makes the head dynamic.
  const std::vector<double> rigid = {5.0, 1e-6, 0.0, 9.9e-6};
  const std::vector<double> boundary = {0.0, 1e-6, 1e-5, 0.0};
  const std::vector<double> dynamic = {0.0, 0.0, 0.0, 0.7};
  EXPECT_TRUE(is_rigid_head(rigid.data(), 4, e_t));
  EXPECT_FALSE(is_rigid_head(boundary.data(), 4, e_t));
  EXPECT_FALSE(is_rigid_head(dynamic.data(), 4, e_t));
  std::mt19937 generator(5);
  std::uniform_real_distribution<double> uniform(0.0, 2e-5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> H(1 + trial % 6);
    for (double& h : H) h = uniform(generator);
    bool expected = true;
    for (size_t s = 1; s < H.size(); ++s) expected = expected && H[s] < e_t;
    EXPECT_EQ(is_rigid_head(H.data(), static_cast<int64_t>(H.size()), e_t), expected);
  }
}

TEST(EntropyPrefill, BudgetRecursionHandWorkedExample) {
  PrefillParams pp;  // base 2048, delta 0.4, alpha 0.5, cap 3
  const std::vector<double> H = {0.0, 1.0, 2.0, 2.0, 1.0, 1.0};
  const auto B = segment_budgets(H.data(), 6, false, pp);
  // B1 = 2048 (r1 = delta); r2 = 1 -> +1024*0.6; r3 = 0 -> -1024*0.4; r4 = -0.5 -> clamp 0 ->
  // -409.6
  // -> below base -> 2048; r5 = 0 -> 2048 - 409.6 -> 2048.
  const std::vector<double> expected = {2048, 2048, 2662.4, 2252.8, 2048, 2048};
  for (int s = 0; s < 6; ++s) EXPECT_NEAR(B[s], expected[s], 1e-5) << s;
  // Steep entropy growth: r clamps at 1 + delta (+1024 per segment) until the cap 3 * base.
  const std::vector<double> steep = {0.0, 0.01, 1.0, 100.0, 1e4, 1e6, 1e8};
  const auto C = segment_budgets(steep.data(), 7, false, pp);
  const std::vector<double> capped = {2048, 2048, 3072, 4096, 5120, 6144, 6144};
  for (int s = 0; s < 7; ++s) EXPECT_NEAR(C[s], capped[s], 1e-5) << s;
  // Rigid: base everywhere.
  for (double b : segment_budgets(steep.data(), 7, true, pp)) EXPECT_EQ(b, 2048.0);
}

// The per-segment variant: a segment below e_t takes the base budget by itself (the head is not
// rigid: another segment is above e_t), the next one restarts the recursion from the base; off,
// the same entropies follow the recursion throughout.
TEST(EntropyPrefill, PerSegmentRigidGivesLowEntropySegmentsTheBase) {
  PrefillParams pp;  // base 2048, delta 0.4, alpha 0.5, cap 3, e_t 1e-5
  const std::vector<double> H = {0.0, 1.0, 2.0, 1e-6, 2.0, 3.0};
  ASSERT_FALSE(is_rigid_head(H.data(), 6, pp.entropy_threshold));
  // Off (alpha * base = 1024 per unit of r above delta): r2 = 1 -> 2662.4; r3 = -1 -> clamp 0 ->
  // 2252.8; r4 = (2 - 1e-6) / (1e-6 + 1e-9), clamped to 1.4 -> 3276.8; r5 = 0.5 -> 3379.2.
  const auto off = segment_budgets(H.data(), 6, false, pp);
  const std::vector<double> recursion = {2048, 2048, 2662.4, 2252.8, 3276.8, 3379.2};
  for (int s = 0; s < 6; ++s) EXPECT_NEAR(off[s], recursion[s], 1e-5) << s;
  pp.per_segment_rigid = true;
  // On: segment 3 is below e_t -> 2048; segment 4 moves from the base: 2048 + 1024 = 3072; r5 =
  // 0.5 -> 3174.4.
  const auto on = segment_budgets(H.data(), 6, false, pp);
  const std::vector<double> per_segment = {2048, 2048, 2662.4, 2048, 3072, 3174.4};
  for (int s = 0; s < 6; ++s) EXPECT_NEAR(on[s], per_segment[s], 1e-5) << s;
}

TEST(EntropyPrefill, BudgetRecursionMatchesNaiveOnRandomEntropies) {
  std::mt19937 generator(8);
  std::uniform_real_distribution<double> uniform(0.0, 4.0);
  for (int trial = 0; trial < 300; ++trial) {
    PrefillParams pp;
    pp.base_budget = 64 + 16 * (trial % 7);
    pp.delta = 0.1 * (trial % 9);
    pp.alpha = 0.25 * (trial % 5);
    pp.budget_cap_factor = 1 + trial % 4;
    std::vector<double> H(1 + trial % 12);
    for (double& h : H) h = uniform(generator) * (trial % 3 == 0 ? 1e-3 : 1.0);
    const auto got = segment_budgets(H.data(), static_cast<int64_t>(H.size()), false, pp);
    const auto expected = naive_budgets(H, false, pp);
    for (size_t s = 0; s < H.size(); ++s) {
      ASSERT_NEAR(got[s], expected[s], 1e-9) << trial << " " << s;
      ASSERT_GE(got[s], pp.base_budget);
      ASSERT_LE(got[s], pp.budget_cap_factor * pp.base_budget);
    }
  }
}

TEST(EntropyPrefill, BudgetBlocksFloorAndCap) {
  EXPECT_EQ(budget_blocks(2048.0, 8, 1000), 256);
  EXPECT_EQ(budget_blocks(2662.4, 8, 1000), 332);
  EXPECT_EQ(budget_blocks(2662.4, 8, 100), 100);
  EXPECT_EQ(budget_blocks(7.9, 8, 100), 0);
  EXPECT_EQ(budget_blocks(64.0, 8, 0), 0);
}

TEST(EntropyPrefill, TopBlocksPickHighestAndBreakTiesByLowerIndex) {
  const std::vector<float> scores = {0.5f, 2.0f, 2.0f, -1.0f, 2.0f, 3.0f};
  EXPECT_EQ(top_blocks(scores.data(), 6, 1), (std::vector<int32_t>{5}));
  EXPECT_EQ(top_blocks(scores.data(), 6, 3), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(top_blocks(scores.data(), 6, 4), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(top_blocks(scores.data(), 6, 10), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(top_blocks(scores.data(), 6, 0).empty());
}

TEST(EntropyPrefill, SparseSegmentsStartAtThresholdAndExcludeTheLast) {
  // 10 segments of 512, threshold 4096: segments 8 (starts at 4096) sparse, 9 is the last.
  for (int64_t s = 0; s < 10; ++s) {
    EXPECT_EQ(segment_is_sparse(s, 10, 512, 4096), s == 8) << s;
  }
  // A threshold between segment starts: the first segment starting at or after it.
  EXPECT_FALSE(segment_is_sparse(1, 5, 512, 600));
  EXPECT_TRUE(segment_is_sparse(2, 5, 512, 600));
  EXPECT_FALSE(segment_is_sparse(0, 1, 512, 0));
}

// ---- Whole plans against the naive reference
// ------------------------------------------------------

void expect_plan_matches_naive(const Prompt& p, const PrefillParams& pp, bool entropy_rule,
                               int layer, const std::string& label) {
  const LayerPrefillPlan plan = entropy_rule ? EntropyPrefillPolicy(pp).plan(p.inputs(layer))
                                             : CritiPrefillPolicy(pp).plan(p.inputs(layer));
  const NaivePlan expected = naive_plan(p, pp, entropy_rule, layer);
  ASSERT_EQ(plan.dense, expected.dense) << label;
  ASSERT_EQ(plan.num_tokens, p.tokens);
  ASSERT_EQ(plan.num_kv_heads, p.kv_heads);
  if (plan.dense) return;
  const int segments = plan.num_segments;
  ASSERT_EQ(segments, static_cast<int>(expected.sparse.size())) << label;
  for (int s = 0; s < segments; ++s) ASSERT_EQ(plan.segment_sparse[s], expected.sparse[s]) << label;
  if (entropy_rule) {
    ASSERT_EQ(plan.entropy.size(), expected.entropy.size());
    for (size_t i = 0; i < plan.entropy.size(); ++i) {
      ASSERT_NEAR(plan.entropy[i], expected.entropy[i], 1e-5) << label << " row " << i;
    }
    for (int h = 0; h < p.kv_heads; ++h) ASSERT_EQ(plan.rigid_head[h], expected.rigid[h]) << label;
  }
  for (int h = 0; h < p.kv_heads; ++h) {
    for (int s = 0; s < segments; ++s) {
      ASSERT_EQ(plan.budget_tokens[h * segments + s],
                static_cast<int32_t>(std::floor(expected.budget[h * segments + s])))
          << label << " head " << h << " segment " << s;
      ASSERT_EQ(plan_row(plan, h, s), expected.rows[h * segments + s])
          << label << " head " << h << " segment " << s;
    }
  }
}

TEST(EntropyPrefill, PlanMatchesNaiveReference) {
  int case_index = 0;
  for (int64_t tokens : {100, 161, 256}) {
    for (auto [q_heads, kv_heads] : {std::pair{2, 2}, {4, 2}, {6, 3}}) {
      for (bool share : {false, true}) {
        PrefillParams pp = small_prefill_params();
        pp.delta = 0.0;  // budgets then follow every entropy increase, so heads differ
        pp.share_segment_budget = share;
        const Prompt p = random_prompt(tokens, q_heads, kv_heads, 8, 100 + case_index++, 1.5f);
        expect_plan_matches_naive(p, pp, true, 1,
                                  "tokens " + std::to_string(tokens) + " heads " +
                                      std::to_string(q_heads) + "/" + std::to_string(kv_heads) +
                                      (share ? " shared" : ""));
      }
    }
  }
}

TEST(EntropyPrefill, PlanMatchesNaiveWithReleasedDefaultsScaledDown) {
  PrefillParams pp = small_prefill_params();  // delta 0.4, alpha 0.5, cap 3, as released
  pp.sparse_threshold = 64;
  const Prompt p = random_prompt(300, 4, 2, 8, 77, 2.0f);
  expect_plan_matches_naive(p, pp, true, 3, "defaults");
}

// Budgets from the base all the way to the cap, against the reference: large alphas turn small
// entropy rises into large budget steps, and the test asserts that the plans it checks hold budgets
// above 1.5x the base and at the cap, so that every kept-block count up to the cap is compared.
TEST(EntropyPrefill, PlanMatchesNaiveAcrossTheWholeBudgetRange) {
  bool above_one_and_a_half = false, at_cap = false;
  int case_index = 0;
  for (const double alpha : {4.0, 8.0}) {
    for (const int cap_factor : {3, 6}) {
      PrefillParams pp = small_prefill_params();
      pp.delta = 0.0;
      pp.alpha = alpha;
      pp.budget_cap_factor = cap_factor;
      const Prompt p = random_prompt(480, 4, 2, 8, 900 + case_index++, 1.5f);
      const std::string label =
          "alpha " + std::to_string(alpha) + " cap " + std::to_string(cap_factor);
      expect_plan_matches_naive(p, pp, true, 1, label);
      const LayerPrefillPlan plan = EntropyPrefillPolicy(pp).plan(p.inputs(1));
      for (const int32_t budget : plan.budget_tokens) {
        above_one_and_a_half = above_one_and_a_half || budget > 1.5 * pp.base_budget;
        at_cap = at_cap || budget == cap_factor * pp.base_budget;
      }
    }
  }
  EXPECT_TRUE(above_one_and_a_half) << "no budget above 1.5x the base was exercised";
  EXPECT_TRUE(at_cap) << "no budget at the cap was exercised";
}

TEST(EntropyPrefill, CritiPrefillPlanMatchesNaiveReference) {
  for (int budget : {4, 12, 40}) {
    PrefillParams pp = small_prefill_params();
    pp.critiprefill_budget = budget;
    pp.block_size = 4;
    const Prompt p = random_prompt(200, 4, 2, 8, 300 + budget);
    expect_plan_matches_naive(p, pp, false, 1, "budget " + std::to_string(budget));
    const LayerPrefillPlan plan = CritiPrefillPolicy(pp).plan(p.inputs());
    EXPECT_TRUE(plan.entropy.empty());
    for (int32_t b : plan.budget_tokens) EXPECT_EQ(b, budget);
  }
}

TEST(EntropyPrefill, DenseLayersAndPromptsWithoutSparseSegmentsGiveDensePlans) {
  const PrefillParams pp = small_prefill_params();  // dense_layers 1, threshold 32, S 32
  const Prompt p = random_prompt(200, 2, 1, 4, 9);
  EXPECT_TRUE(EntropyPrefillPolicy(pp).plan(p.inputs(0)).dense);
  EXPECT_FALSE(EntropyPrefillPolicy(pp).plan(p.inputs(1)).dense);
  EXPECT_TRUE(CritiPrefillPolicy(pp).plan(p.inputs(0)).dense);
  // Two segments: segment 1 is the last one, so nothing is sparse.
  const Prompt short_prompt = random_prompt(64, 2, 1, 4, 10);
  const LayerPrefillPlan plan = EntropyPrefillPolicy(pp).plan(short_prompt.inputs(5));
  EXPECT_TRUE(plan.dense);
  EXPECT_EQ(plan.keys_read(), plan.keys_read_dense());
  const LayerPrefillPlan full = FullPrefillPolicy(pp).plan(p.inputs(4));
  EXPECT_TRUE(full.dense);
  EXPECT_EQ(full.num_tokens, 200);
  EXPECT_EQ(full.keys_read_dense(), 200 * 201 / 2);
}

// ---- Invariants
// -----------------------------------------------------------------------------------

TEST(EntropyPrefill, NoBlockAtOrAfterTheSegmentStartIsEverSelected) {
  std::mt19937 generator(2024);
  for (int trial = 0; trial < 120; ++trial) {
    PrefillParams pp;
    const int block_choices[] = {1, 2, 4, 8};
    pp.block_size = block_choices[generator() % 4];
    pp.segment_size = pp.block_size * static_cast<int>(1 + generator() % 8);
    pp.sparse_threshold =
        static_cast<int>(generator() % 3) * pp.segment_size + static_cast<int>(generator() % 2);
    pp.base_budget = pp.block_size * static_cast<int>(1 + generator() % 6);
    pp.critiprefill_budget = pp.block_size * static_cast<int>(1 + generator() % 6);
    pp.delta = (generator() % 5) * 0.1;
    pp.dense_layers = 0;
    pp.share_segment_budget = generator() % 2;
    const int kv_heads = 1 + static_cast<int>(generator() % 3);
    const int q_heads = kv_heads * static_cast<int>(1 + generator() % 3);
    const int64_t tokens = 1 + static_cast<int64_t>(generator() % 150);
    const Prompt p = random_prompt(tokens, q_heads, kv_heads, 1 + static_cast<int>(generator() % 9),
                                   5000 + trial, 3.0f);
    for (bool entropy_rule : {true, false}) {
      const LayerPrefillPlan plan = entropy_rule ? EntropyPrefillPolicy(pp).plan(p.inputs(0))
                                                 : CritiPrefillPolicy(pp).plan(p.inputs(0));
      if (plan.dense) continue;
      ASSERT_EQ(plan.segment_sparse[plan.num_segments - 1], 0) << "the last segment is dense";
      for (int h = 0; h < kv_heads; ++h) {
        for (int s = 0; s < plan.num_segments; ++s) {
          const auto row = plan_row(plan, h, s);
          const int64_t start = static_cast<int64_t>(s) * pp.segment_size;
          if (!plan.segment_sparse[s]) {
            ASSERT_TRUE(row.empty());
          }
          if (s == 0) {
            ASSERT_TRUE(row.empty()) << "segment 0 selects nothing";
          }
          for (size_t i = 0; i < row.size(); ++i) {
            ASSERT_LE((row[i] + 1) * pp.block_size, start) << "trial " << trial;
            if (i > 0) {
              ASSERT_LT(row[i - 1], row[i]) << "rows ascend without repeats";
            }
          }
        }
      }
    }
  }
}

TEST(EntropyPrefill, BudgetsCoveringTheContextSelectEveryEarlierBlock) {
  const Prompt p = random_prompt(230, 4, 2, 8, 41);
  PrefillParams pp = small_prefill_params();
  pp.base_budget = 256;
  pp.critiprefill_budget = 256;
  pp.sparse_threshold = 0;
  for (bool entropy_rule : {true, false}) {
    const LayerPrefillPlan plan = entropy_rule ? EntropyPrefillPolicy(pp).plan(p.inputs())
                                               : CritiPrefillPolicy(pp).plan(p.inputs());
    ASSERT_FALSE(plan.dense);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < plan.num_segments; ++s) {
        if (!plan.segment_sparse[s]) continue;
        std::vector<int32_t> all(static_cast<size_t>(s * pp.segment_size / pp.block_size));
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(plan_row(plan, h, s), all);
      }
    }
    EXPECT_EQ(plan.keys_read(), plan.keys_read_dense());
  }
}

// KV head 0: every query points at the keys of block 0, which stand far out, so every segment's
// distribution sits on that single block (rigid). KV head 1: block 0 stands out moderately over the
// rest of segment 0, but from segment 1 on every block is as strong, so its entropy jumps
// (dynamic).
Prompt rigid_and_dynamic_prompt() {
  const int S = 32, b = 4, d = 8;
  Prompt p = random_prompt(4 * S, 2, 2, d, 99, 0.05f);
  for (int64_t t = 0; t < p.tokens; ++t) {
    p.q(t, 0, 0) = 1.0f;
    p.q(t, 1, 1) = 1.0f;
  }
  for (int64_t t = 0; t < b; ++t) p.k(0, t, 0) = 60.0f;
  for (int64_t t = 0; t < p.tokens; ++t) {
    if (t < b || t >= S) p.k(1, t, 1) = 6.0f;
  }
  return p;
}

TEST(EntropyPrefill, ConstructedHeadsAreClassifiedRigidAndDynamic) {
  PrefillParams pp = small_prefill_params();  // released delta/alpha/cap; base 16 tokens = 4 blocks
  const Prompt p = rigid_and_dynamic_prompt();
  const LayerPrefillPlan plan = EntropyPrefillPolicy(pp).plan(p.inputs());
  ASSERT_FALSE(plan.dense);
  ASSERT_EQ(plan.num_segments, 4);
  EXPECT_EQ(plan.rigid_head[0], 1);
  EXPECT_EQ(plan.rigid_head[1], 0);
  for (int s = 1; s < 4; ++s) {
    EXPECT_LT(plan.entropy[0 * 4 + s], pp.entropy_threshold) << s;
    EXPECT_GT(plan.entropy[1 * 4 + s], 0.01) << s;
  }
  EXPECT_GT(plan.entropy[1 * 4 + 2], 1.4 * plan.entropy[1 * 4 + 1]);
  // Rigid head: base budget everywhere, and block 0 is the top choice.
  for (int s = 0; s < 4; ++s) EXPECT_EQ(plan.budget_tokens[s], pp.base_budget);
  EXPECT_EQ(plan_row(plan, 0, 1).front(), 0);
  // Dynamic head: the jump raises its budget in segment 2 by alpha * base * 1.0 (r clamped at
  // 1 + delta): 16 + 8 = 24 tokens = 6 blocks, while the rigid head reads 4.
  EXPECT_EQ(plan.budget_tokens[1 * 4 + 2], 24);
  EXPECT_EQ(plan_row(plan, 0, 2).size(), 4u);
  EXPECT_EQ(plan_row(plan, 1, 2).size(), 6u);
  EXPECT_LT(plan.keys_read(), plan.keys_read_dense());

  // The released behaviour gives both heads of the segment the larger budget.
  pp.share_segment_budget = true;
  const LayerPrefillPlan shared = EntropyPrefillPolicy(pp).plan(p.inputs());
  EXPECT_EQ(shared.budget_tokens[0 * 4 + 2], 24);
  EXPECT_EQ(plan_row(shared, 0, 2).size(), 6u);
  EXPECT_EQ(plan_row(shared, 1, 2), plan_row(plan, 1, 2));
  EXPECT_GT(shared.keys_read(), plan.keys_read());
}

TEST(EntropyPrefill, HeadsWithDifferentEntropiesGetDifferentBudgetsUnlessShared) {
  PrefillParams pp = small_prefill_params();
  pp.delta = 0.0;
  // Heads whose keys differ in scale have differently peaked block distributions.
  Prompt p = random_prompt(256, 8, 4, 8, 4321, 2.0f);
  for (int h = 0; h < 4; ++h) {
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int c = 0; c < p.head_dim; ++c) p.k(h, t, c) *= 1.0f + 4.0f * h;
    }
  }
  const LayerPrefillPlan plan = EntropyPrefillPolicy(pp).plan(p.inputs());
  ASSERT_FALSE(plan.dense);
  const int segments = plan.num_segments;
  bool some_segment_differs = false;
  for (int s = 0; s < segments; ++s) {
    if (!plan.segment_sparse[s]) continue;
    int32_t low = plan.budget_tokens[s], high = plan.budget_tokens[s];
    for (int h = 1; h < 4; ++h) {
      low = std::min(low, plan.budget_tokens[h * segments + s]);
      high = std::max(high, plan.budget_tokens[h * segments + s]);
    }
    if (low < high) some_segment_differs = true;
  }
  EXPECT_TRUE(some_segment_differs);
  pp.share_segment_budget = true;
  const LayerPrefillPlan shared = EntropyPrefillPolicy(pp).plan(p.inputs());
  for (int s = 0; s < segments; ++s) {
    int32_t most = 0;
    for (int h = 0; h < 4; ++h) most = std::max(most, plan.budget_tokens[h * segments + s]);
    for (int h = 0; h < 4; ++h) EXPECT_EQ(shared.budget_tokens[h * segments + s], most);
  }
}

TEST(EntropyPrefill, BadHeadCountsAreAnError) {
  const Prompt p = random_prompt(100, 3, 2, 4, 1);
  EXPECT_THROW(EntropyPrefillPolicy(small_prefill_params()).plan(p.inputs()), Error);
}

}  // namespace
}  // namespace entropyinfer

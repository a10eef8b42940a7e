// The GPU prefill estimate (backends/cuda/prefill_estimate.h) against the CPU policy's plan
// (estimate_prefill_plan) on the same bf16-rounded queries and keys.
//
// What must be identical: dense flags and shapes, segment_sparse, rigid_head, budget_tokens,
// row_offsets and the block indices of every row. The GPU sums the fp32 dot products in another
// order than the CPU, so two exceptions are allowed, counted and printed ("[ measure ]" lines):
// - near ties: a row may choose block x instead of block y only where the CPU's scores of all the
//   blocks that differ lie within kScoreTieRelative of each other (relative to the larger, with
//   kScoreTieAbsolute for scores near zero);
// - floor boundaries: a budget (entropy rule) may floor to the neighbouring token or block count
//   only where the budget the CPU's own entropies give lies within kBudgetBoundary tokens of that
//   boundary (the recursion turns a 1e-7 relative entropy difference into ~1e-4 tokens).
// Entropies must agree within kEntropyRelative (relative) + kEntropyAbsolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/entropy_prefill.h"
#include "backends/cuda/prefill_estimate.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

using cuda::bf16;
using gpu_test::random_bf16_values;

constexpr double kScoreTieRelative = 1e-5;
constexpr double kScoreTieAbsolute = 1e-6;
constexpr double kEntropyRelative = 1e-5;
constexpr double kEntropyAbsolute = 1e-12;
constexpr double kBudgetBoundary = 1e-3;

struct Shape {
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int64_t tokens = 0;
};

// A prompt as the CPU reads it: queries [tokens][q_heads][head_dim], keys per KV head a slab
// [key_stride][head_dim].
struct Prompt {
  Shape shape;
  std::vector<float> queries;
  std::vector<float> keys;
  int64_t key_stride = 0;
};

float round_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }

Prompt random_prompt(Shape shape, uint32_t seed) {
  Prompt prompt;
  prompt.shape = shape;
  prompt.key_stride = shape.tokens + 5;
  prompt.queries = random_bf16_values(
      static_cast<size_t>(shape.tokens) * shape.q_heads * shape.head_dim, seed, 1.0f, true);
  prompt.keys =
      random_bf16_values(static_cast<size_t>(shape.kv_heads) * prompt.key_stride * shape.head_dim,
                         seed + 1, 1.0f, true);
  return prompt;
}

float& query_at(Prompt& p, int64_t token, int head, int dim) {
  return p.queries[(static_cast<size_t>(token) * p.shape.q_heads + head) * p.shape.head_dim + dim];
}
float& key_at(Prompt& p, int head, int64_t token, int dim) {
  return p.keys[(static_cast<size_t>(head) * p.key_stride + token) * p.shape.head_dim + dim];
}

PrefillInputs cpu_inputs(const Prompt& p, int layer) {
  PrefillInputs inputs;
  inputs.queries = p.queries.data();
  inputs.keys = p.keys.data();
  inputs.key_stride = p.key_stride;
  inputs.num_tokens = p.shape.tokens;
  inputs.num_q_heads = p.shape.q_heads;
  inputs.num_kv_heads = p.shape.kv_heads;
  inputs.head_dim = p.shape.head_dim;
  inputs.layer = layer;
  return inputs;
}

// The prompt on the GPU: queries with rows q_stride apart (the gap and the key rows past the
// prompt hold NaN, so that a kernel reading them spoils the plan visibly).
struct DevicePrompt {
  cuda::DeviceBuffer<bf16> queries;
  cuda::DeviceBuffer<bf16> keys;
  int64_t q_stride = 0;
};

DevicePrompt upload_prompt(const Prompt& p, int64_t q_stride) {
  const Shape& s = p.shape;
  const int64_t width = static_cast<int64_t>(s.q_heads) * s.head_dim;
  std::vector<float> queries(static_cast<size_t>(s.tokens * q_stride), NAN);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::copy_n(p.queries.begin() + t * width, width, queries.begin() + t * q_stride);
  }
  std::vector<float> keys = p.keys;
  for (int h = 0; h < s.kv_heads; ++h) {
    for (int64_t t = s.tokens; t < p.key_stride; ++t) {
      std::fill_n(keys.begin() + (h * p.key_stride + t) * s.head_dim, s.head_dim, NAN);
    }
  }
  // An empty prompt still gets (unread) buffers, so that no copy is asked for zero bytes.
  const auto upload = [](const std::vector<float>& values) {
    return values.empty() ? cuda::DeviceBuffer<bf16>(1) : gpu_test::upload_bf16(values);
  };
  DevicePrompt device;
  device.queries = upload(queries);
  device.keys = upload(keys);
  device.q_stride = q_stride;
  return device;
}

// Records the keys (in chunks of `chunk` tokens, or at once) and estimates one layer.
LayerPrefillPlan run_gpu(cuda::PrefillEstimator& estimator, const Prompt& p,
                         const DevicePrompt& device, int layer, int64_t chunk = 0,
                         cudaStream_t stream = nullptr) {
  const int64_t n = p.shape.tokens;
  if (chunk <= 0) chunk = std::max<int64_t>(1, n);
  for (int64_t first = 0; first < n; first += chunk) {
    estimator.record_key_blocks(device.keys.data(), p.key_stride, first, std::min(chunk, n - first),
                                stream);
  }
  estimator.estimate(device.queries.data(), device.q_stride, n, layer, stream);
  return estimator.download_last(stream);
}

// The CPU's criticality rows, computed on demand for the rows where the plans differ.
class CpuScores {
 public:
  CpuScores(const Prompt& p, const PrefillParams& params) : prompt_(p), params_(params) {}
  std::vector<float> row(int kv_head, int64_t segment) {
    if (keys_.num_heads == 0) {
      const Shape& s = prompt_.shape;
      keys_ = block_key_extrema(prompt_.keys.data(), prompt_.key_stride, s.tokens, s.kv_heads,
                                s.head_dim, params_.block_size);
      queries_ = segment_query_extrema(prompt_.queries.data(), s.tokens, s.q_heads, s.head_dim,
                                       params_.segment_size);
    }
    std::vector<float> scores(
        static_cast<size_t>(visible_blocks(segment, params_.segment_size, params_.block_size)));
    criticality_row(queries_, keys_, kv_head, segment, static_cast<int64_t>(scores.size()),
                    scores.data());
    return scores;
  }

 private:
  const Prompt& prompt_;
  PrefillParams params_;
  HeadExtrema keys_;
  HeadExtrema queries_;
};

// The budgets the CPU's recursion gives from the CPU plan's (float) entropies: within ~1e-4
// tokens of the CPU's own, enough to tell whether a floor could have gone either way.
std::vector<double> reference_budgets(const LayerPrefillPlan& cpu, const PrefillParams& params,
                                      BudgetRule rule) {
  const int segments = cpu.num_segments;
  const size_t rows = static_cast<size_t>(cpu.num_kv_heads) * segments;
  if (rule == BudgetRule::kFixed) {
    return std::vector<double>(rows, static_cast<double>(params.critiprefill_budget));
  }
  std::vector<double> budgets(rows);
  for (int h = 0; h < cpu.num_kv_heads; ++h) {
    const std::vector<double> entropy(cpu.entropy.begin() + h * segments,
                                      cpu.entropy.begin() + (h + 1) * segments);
    const std::vector<double> head =
        segment_budgets(entropy.data(), segments, cpu.rigid_head[h] != 0, params);
    std::copy(head.begin(), head.end(), budgets.begin() + h * segments);
  }
  if (params.share_segment_budget) {
    for (int s = 0; s < segments; ++s) {
      double shared = 0;
      for (int h = 0; h < cpu.num_kv_heads; ++h)
        shared = std::max(shared, budgets[h * segments + s]);
      for (int h = 0; h < cpu.num_kv_heads; ++h) budgets[h * segments + s] = shared;
    }
  }
  return budgets;
}

struct PlanDifferences {
  int64_t sparse_rows = 0;
  int64_t selected = 0;
  int64_t near_ties = 0;        // blocks chosen differently at a near tie
  int64_t budget_boundary = 0;  // budgets or block counts floored the other way at a boundary
  double entropy_relative = 0;  // largest relative error where |H| > 1e-6
  double entropy_absolute = 0;
  int64_t budgets_above_base = 0;
};

std::vector<int32_t> row_of(const LayerPrefillPlan& plan, size_t row) {
  return std::vector<int32_t>(plan.block_indices.begin() + plan.row_offsets[row],
                              plan.block_indices.begin() + plan.row_offsets[row + 1]);
}

PlanDifferences compare_plans(const LayerPrefillPlan& cpu, const LayerPrefillPlan& gpu,
                              const Prompt& prompt, const PrefillParams& params, BudgetRule rule,
                              const std::string& label, bool ties_must_match = false) {
  SCOPED_TRACE(label);
  PlanDifferences diff;
  EXPECT_EQ(gpu.dense, cpu.dense);
  EXPECT_EQ(gpu.num_tokens, cpu.num_tokens);
  EXPECT_EQ(gpu.num_kv_heads, cpu.num_kv_heads);
  EXPECT_EQ(gpu.segment_size, cpu.segment_size);
  EXPECT_EQ(gpu.block_size, cpu.block_size);
  EXPECT_EQ(gpu.num_segments, cpu.num_segments);
  if (cpu.dense || gpu.dense) {
    EXPECT_TRUE(gpu.row_offsets.empty() && gpu.block_indices.empty() && gpu.entropy.empty());
    return diff;
  }
  EXPECT_EQ(gpu.segment_sparse, cpu.segment_sparse);
  EXPECT_EQ(gpu.rigid_head, cpu.rigid_head);
  const int segments = cpu.num_segments;
  const size_t rows = static_cast<size_t>(cpu.num_kv_heads) * segments;
  const int b = params.block_size;
  if (::testing::Test::HasFatalFailure() || gpu.row_offsets.size() != rows + 1 ||
      gpu.budget_tokens.size() != rows || gpu.entropy.size() != cpu.entropy.size() ||
      gpu.segment_sparse != cpu.segment_sparse) {
    ADD_FAILURE() << "plan shapes differ: row_offsets " << gpu.row_offsets.size() << " vs "
                  << cpu.row_offsets.size() << ", budget_tokens " << gpu.budget_tokens.size()
                  << " vs " << cpu.budget_tokens.size() << ", entropy " << gpu.entropy.size()
                  << " vs " << cpu.entropy.size();
    return diff;
  }
  const std::vector<double> reference = reference_budgets(cpu, params, rule);

  for (size_t i = 0; i < cpu.entropy.size(); ++i) {
    const double expected = cpu.entropy[i], actual = gpu.entropy[i];
    const double error = std::fabs(actual - expected);
    EXPECT_LE(error, kEntropyRelative * std::fabs(expected) + kEntropyAbsolute)
        << "entropy of row " << i << ": " << actual << " vs " << expected;
    if (std::fabs(expected) > 1e-6) {
      diff.entropy_relative = std::max(diff.entropy_relative, error / std::fabs(expected));
    } else {
      diff.entropy_absolute = std::max(diff.entropy_absolute, error);
    }
  }

  CpuScores cpu_scores(prompt, params);
  for (size_t row = 0; row < rows; ++row) {
    const int h = static_cast<int>(row / segments);
    const int s = static_cast<int>(row % segments);
    if (cpu.budget_tokens[row] > params.base_budget) ++diff.budgets_above_base;
    if (gpu.budget_tokens[row] != cpu.budget_tokens[row]) {
      const int larger = std::max(gpu.budget_tokens[row], cpu.budget_tokens[row]);
      const bool boundary = rule == BudgetRule::kEntropy &&
                            std::abs(gpu.budget_tokens[row] - cpu.budget_tokens[row]) == 1 &&
                            std::fabs(reference[row] - larger) < kBudgetBoundary;
      if (boundary) {
        ++diff.budget_boundary;
      } else {
        ADD_FAILURE() << "budget of head " << h << " segment " << s << ": "
                      << gpu.budget_tokens[row] << " vs " << cpu.budget_tokens[row]
                      << " (reference " << reference[row] << ")";
      }
    }

    const std::vector<int32_t> expected = row_of(cpu, row), actual = row_of(gpu, row);
    const int64_t visible = visible_blocks(s, params.segment_size, b);
    for (size_t i = 0; i < actual.size(); ++i) {
      if (actual[i] < 0 || actual[i] >= visible || (i > 0 && actual[i - 1] >= actual[i])) {
        ADD_FAILURE() << "head " << h << " segment " << s << ": block " << actual[i]
                      << " out of order or outside [0, " << visible << ")";
        return diff;
      }
    }
    if (!cpu.segment_sparse[s]) {
      EXPECT_TRUE(actual.empty()) << "dense segment " << s << " has blocks";
      continue;
    }
    ++diff.sparse_rows;
    diff.selected += static_cast<int64_t>(expected.size());
    if (actual == expected) continue;
    if (actual.size() != expected.size()) {
      const auto larger = static_cast<int64_t>(std::max(actual.size(), expected.size()));
      const bool boundary =
          rule == BudgetRule::kEntropy &&
          std::abs(static_cast<int64_t>(actual.size()) - static_cast<int64_t>(expected.size())) ==
              1 &&
          std::fabs(reference[row] - static_cast<double>(larger * b)) < kBudgetBoundary;
      if (!boundary) {
        ADD_FAILURE() << "head " << h << " segment " << s << ": " << actual.size() << " blocks vs "
                      << expected.size() << " (reference budget " << reference[row] << ")";
        continue;
      }
      ++diff.budget_boundary;
    }
    // The CPU's ranking, cut at the GPU's count: the blocks that differ must be near ties.
    const std::vector<float> scores = cpu_scores.row(h, s);
    std::vector<int32_t> ranked(scores.size());
    std::iota(ranked.begin(), ranked.end(), 0);
    const auto keep = static_cast<std::ptrdiff_t>(actual.size());
    std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(),
                      [&](int32_t x, int32_t y) {
                        return scores[x] != scores[y] ? scores[x] > scores[y] : x < y;
                      });
    ranked.resize(actual.size());
    std::sort(ranked.begin(), ranked.end());
    std::vector<int32_t> differing;
    std::set_symmetric_difference(actual.begin(), actual.end(), ranked.begin(), ranked.end(),
                                  std::back_inserter(differing));
    if (differing.empty()) continue;  // only the count differed, at a boundary
    float lowest = scores[differing[0]], highest = lowest;
    for (int32_t block : differing) {
      lowest = std::min(lowest, scores[block]);
      highest = std::max(highest, scores[block]);
    }
    const double scale = std::max(std::fabs(lowest), std::fabs(highest));
    const bool near_tie = highest - lowest <= kScoreTieRelative * scale + kScoreTieAbsolute;
    if (ties_must_match || !near_tie) {
      ADD_FAILURE() << "head " << h << " segment " << s << ": " << differing.size()
                    << " blocks differ, CPU scores from " << lowest << " to " << highest;
    }
    diff.near_ties += static_cast<int64_t>(differing.size()) / 2;
  }
  if (diff.budget_boundary == 0) {
    EXPECT_EQ(gpu.row_offsets, cpu.row_offsets);
    EXPECT_EQ(gpu.keys_read(), cpu.keys_read());
  }
  EXPECT_LE(diff.near_ties, 2 + diff.selected / 1000) << "near ties should be rare";
  EXPECT_LE(diff.budget_boundary, 2) << "floor boundaries should be rare";
  std::cout << "[ measure ] " << label << ": " << diff.sparse_rows << " sparse rows, "
            << diff.selected << " blocks, near-tie swaps " << diff.near_ties
            << ", floor-boundary rows " << diff.budget_boundary << ", budgets above base "
            << diff.budgets_above_base << ", entropy max rel err " << diff.entropy_relative
            << " (abs err near 0: " << diff.entropy_absolute << ")\n";
  return diff;
}

struct Case {
  std::string label;
  Shape shape;
  PrefillParams params;
  BudgetRule rule = BudgetRule::kEntropy;
  int64_t extra_q_stride = 0;  // elements between a token's last query head and the next token
  int layer = 1;
  uint32_t seed = 1;
};

// Small-segment parameters so that short prompts have many sparse rows and real choices.
PrefillParams small_params(int segment_size, int block_size, int threshold, int base) {
  PrefillParams params;
  params.segment_size = segment_size;
  params.block_size = block_size;
  params.sparse_threshold = threshold;
  params.base_budget = base;
  params.critiprefill_budget = base + block_size / 2;
  return params;
}

PlanDifferences run_case(const Case& c, Prompt* custom = nullptr, bool ties_must_match = false) {
  const Prompt prompt = custom != nullptr ? *custom : random_prompt(c.shape, c.seed);
  const LayerPrefillPlan cpu = estimate_prefill_plan(cpu_inputs(prompt, c.layer), c.params, c.rule);
  cuda::PrefillEstimator estimator(c.shape.q_heads, c.shape.kv_heads, c.shape.head_dim,
                                   c.shape.tokens + 37, c.params, c.rule);
  const DevicePrompt device = upload_prompt(
      prompt, static_cast<int64_t>(c.shape.q_heads) * c.shape.head_dim + c.extra_q_stride);
  const LayerPrefillPlan gpu = run_gpu(estimator, prompt, device, c.layer);
  EXPECT_FALSE(cpu.dense) << c.label << ": the case should be sparse";
  return compare_plans(cpu, gpu, prompt, c.params, c.rule, c.label, ties_must_match);
}

TEST(CudaPrefillEstimate, RecordKeyBlocksChunkByChunkEqualsOneCallAndTheCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  for (int head_dim : {128, 64, 40}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const Shape shape{8, 2, head_dim, 1001};
    const PrefillParams params = small_params(64, 8, 128, 64);
    const Prompt prompt = random_prompt(shape, 11);
    const Prompt other = random_prompt(shape, 12);
    const HeadExtrema expected = block_key_extrema(prompt.keys.data(), prompt.key_stride,
                                                   shape.tokens, shape.kv_heads, head_dim, 8);
    cuda::PrefillEstimator estimator(shape.q_heads, shape.kv_heads, head_dim, 1100, params,
                                     BudgetRule::kEntropy);
    const DevicePrompt device = upload_prompt(prompt, shape.q_heads * head_dim);
    const DevicePrompt other_device = upload_prompt(other, shape.q_heads * head_dim);

    estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 0, shape.tokens, nullptr);
    const HeadExtrema at_once = estimator.download_key_extrema(shape.tokens, nullptr);
    EXPECT_EQ(at_once.num_groups, expected.num_groups);
    EXPECT_EQ(at_once.max, expected.max);
    EXPECT_EQ(at_once.min, expected.min);

    // Another layer's keys first, then this one's in uneven chunks; the chunk that ends inside
    // block 12 is followed by one that starts at that block again.
    estimator.record_key_blocks(other_device.keys.data(), other.key_stride, 0, shape.tokens,
                                nullptr);
    int64_t first = 0;
    for (int64_t end : {24, 64, 72, 100, 400, 408, 1001}) {
      if (first == 100) first = 96;
      estimator.record_key_blocks(device.keys.data(), prompt.key_stride, first, end - first,
                                  nullptr);
      first = end;
    }
    const HeadExtrema chunked = estimator.download_key_extrema(shape.tokens, nullptr);
    EXPECT_EQ(chunked.max, expected.max);
    EXPECT_EQ(chunked.min, expected.min);

    EXPECT_THROW(estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 4, 8, nullptr),
                 Error);  // not at a block start
    estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 0, 80, nullptr);
    EXPECT_THROW(
        estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 160, 8, nullptr),
        Error);  // a gap after 80
  }
}

TEST(CudaPrefillEstimate, EntropyRuleMatchesCpuGroupFourHeadDim128) {
  ENTROPYINFER_REQUIRE_GPU();
  for (bool share : {false, true}) {
    Case c;
    c.label = std::string("entropy g4 d128 S64 b4 n2001") + (share ? " shared" : "");
    c.shape = {16, 4, 128, 2001};  // not a multiple of S or b
    c.params = small_params(64, 4, 256, 32);
    c.params.share_segment_budget = share;
    c.seed = 21;
    run_case(c);
  }
}

TEST(CudaPrefillEstimate, EntropyRuleMatchesCpuGroupOneHeadDim64) {
  ENTROPYINFER_REQUIRE_GPU();
  for (bool share : {false, true}) {
    Case c;
    c.label = std::string("entropy g1 d64 S32 b8 n1500") + (share ? " shared" : "");
    c.shape = {4, 4, 64, 1500};
    c.params = small_params(32, 8, 100, 48);
    c.params.share_segment_budget = share;
    c.seed = 31;
    run_case(c);
  }
}

// The per-segment rigid variant, with a threshold inside the range random inputs give (early
// segments see few blocks and have low entropy), so that some segments of a non-rigid head fall
// below it.
TEST(CudaPrefillEstimate, PerSegmentRigidVariantMatchesCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  for (double threshold : {3.0, 4.5}) {
    Case c;
    c.label = "entropy per-segment rigid g4 d128 S64 b4 n2001 e_t " + std::to_string(threshold);
    c.shape = {16, 4, 128, 2001};
    c.params = small_params(64, 4, 256, 32);
    c.params.per_segment_rigid = true;
    c.params.entropy_threshold = threshold;
    c.seed = 23;
    run_case(c);
  }
}

TEST(CudaPrefillEstimate, CritiPrefillRuleMatchesCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  for (auto [q_heads, kv_heads, head_dim] : {std::tuple{16, 4, 128}, {4, 4, 64}}) {
    Case c;
    c.label = "critiprefill g" + std::to_string(q_heads / kv_heads) + " d" +
              std::to_string(head_dim) + " S64 b4 n1777";
    c.shape = {q_heads, kv_heads, head_dim, 1777};
    c.params = small_params(64, 4, 200, 40);
    c.rule = BudgetRule::kFixed;
    c.seed = 41;
    run_case(c);
  }
}

// Group sizes 2 and 8 (their own tile shapes) and 3 (the untiled kernel), a head_dim that is not
// a multiple of the 16-dimension slice, and a query stride that rules out 16-byte loads.
TEST(CudaPrefillEstimate, OtherGroupSizesAndUnalignedShapesMatchCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  struct Variant {
    int q_heads, kv_heads, head_dim;
    int64_t extra_stride;
  };
  for (const Variant& v : {Variant{8, 4, 64, 16}, Variant{16, 2, 128, 512}, Variant{6, 2, 40, 3},
                           Variant{3, 1, 24, 0}}) {
    Case c;
    c.label = "entropy g" + std::to_string(v.q_heads / v.kv_heads) + " d" +
              std::to_string(v.head_dim) + " stride+" + std::to_string(v.extra_stride);
    c.shape = {v.q_heads, v.kv_heads, v.head_dim, 1234};
    c.params = small_params(32, 8, 96, 40);
    c.extra_q_stride = v.extra_stride;
    c.seed = 51;
    run_case(c);
  }
}

// KV head 0: every query of its group has +4 in dimension 0 and block 0 has 60 there, so block 0
// outscores every other by ~230 in every segment: entropy ~0, a rigid head. KV head 1: its
// queries follow one random direction per segment, scaled by 0.01 and 3 in turn, so its entropy
// jumps up and down and the recursion moves its budgets. KV head 2 is random.
Prompt rigid_and_dynamic_prompt(const PrefillParams& params) {
  const Shape shape{12, 3, 64, 1300};
  Prompt prompt = random_prompt(shape, 61);
  const int group = shape.q_heads / shape.kv_heads;
  std::mt19937 generator(62);
  std::uniform_real_distribution<float> flat(-1.0f, 1.0f);
  const int64_t segments = count_segments(shape.tokens, params.segment_size);
  for (int64_t s = 0; s < segments; ++s) {
    const float scale = s % 2 == 0 ? 0.01f : 3.0f;
    std::vector<float> direction(shape.head_dim);
    for (float& x : direction) x = flat(generator) * scale;
    const int64_t end = std::min<int64_t>(shape.tokens, (s + 1) * params.segment_size);
    for (int64_t t = s * params.segment_size; t < end; ++t) {
      for (int g = 0; g < group; ++g) {
        query_at(prompt, t, g, 0) = 4.0f;
        for (int d = 0; d < shape.head_dim; ++d) {
          query_at(prompt, t, group + g, d) = round_bf16(direction[d] + 0.05f * flat(generator));
        }
      }
    }
  }
  for (int t = 0; t < params.block_size; ++t) key_at(prompt, 0, t, 0) = 60.0f;
  return prompt;
}

TEST(CudaPrefillEstimate, RigidAndDynamicHeadsMatchCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  const PrefillParams base_params = small_params(64, 8, 128, 64);
  Prompt prompt = rigid_and_dynamic_prompt(base_params);
  for (bool share : {false, true}) {
    Case c;
    c.label = std::string("rigid and dynamic heads") + (share ? " shared" : "");
    c.shape = prompt.shape;
    c.params = base_params;
    c.params.share_segment_budget = share;
    const LayerPrefillPlan cpu =
        estimate_prefill_plan(cpu_inputs(prompt, 1), c.params, BudgetRule::kEntropy);
    ASSERT_EQ(cpu.rigid_head, (std::vector<uint8_t>{1, 0, 0})) << "the construction failed";
    const PlanDifferences diff = run_case(c, &prompt);
    EXPECT_GT(diff.budgets_above_base, 0) << "the recursion should have raised some budgets";
  }
}

// Keys made of three block patterns only: every row has three distinct scores, so the selection
// is decided by the tie rule (lower block first). Exact scores tie exactly on both sides, so the
// plans must be identical.
Prompt tied_prompt() {
  const Shape shape{4, 2, 64, 1200};
  Prompt prompt = random_prompt(shape, 71);
  const std::vector<float> patterns =
      random_bf16_values(static_cast<size_t>(3) * shape.kv_heads * 8 * shape.head_dim, 72);
  std::mt19937 generator(73);
  for (int h = 0; h < shape.kv_heads; ++h) {
    for (int64_t block = 0; block * 8 < shape.tokens; ++block) {
      const int pattern = static_cast<int>(generator() % 3);
      for (int r = 0; r < 8 && block * 8 + r < shape.tokens; ++r) {
        for (int d = 0; d < shape.head_dim; ++d) {
          key_at(prompt, h, block * 8 + r, d) =
              patterns[((pattern * shape.kv_heads + h) * 8 + r) * shape.head_dim + d];
        }
      }
    }
  }
  return prompt;
}

TEST(CudaPrefillEstimate, ExactTiesRankByBlockIndexLikeTheCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  Prompt prompt = tied_prompt();
  for (BudgetRule rule : {BudgetRule::kEntropy, BudgetRule::kFixed}) {
    Case c;
    c.label = std::string("exact ties ") + (rule == BudgetRule::kEntropy ? "entropy" : "fixed");
    c.shape = prompt.shape;
    c.params = small_params(64, 8, 128, 40);
    c.rule = rule;
    const PlanDifferences diff = run_case(c, &prompt, /*ties_must_match=*/true);
    EXPECT_EQ(diff.near_ties, 0);
  }
}

TEST(CudaPrefillEstimate, DenseLayersAndShortPromptsLaunchNothingAndCountDenseKeys) {
  ENTROPYINFER_REQUIRE_GPU();
  const Shape shape{8, 2, 64, 1000};
  const PrefillParams params = small_params(64, 8, 256, 64);
  const Prompt prompt = random_prompt(shape, 81);
  cuda::PrefillEstimator estimator(shape.q_heads, shape.kv_heads, shape.head_dim, 1000, params,
                                   BudgetRule::kEntropy);
  const DevicePrompt device = upload_prompt(prompt, shape.q_heads * shape.head_dim);
  cuda::DeviceBuffer<unsigned long long> counters(2);
  cuda::check(cudaMemset(counters.data(), 0, counters.bytes()), "cudaMemset");
  int64_t expected_read = 0, expected_dense = 0;
  const auto account = [&](const LayerPrefillPlan& plan) {
    estimator.accumulate_keys_read(counters.data(), counters.data() + 1, nullptr);
    expected_read += plan.keys_read();
    expected_dense += plan.keys_read_dense();
  };

  // Layer 0 is dense (dense_layers = 1) even for a long prompt.
  estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 0, shape.tokens, nullptr);
  const cuda::DevicePrefillPlan view =
      estimator.estimate(device.queries.data(), device.q_stride, shape.tokens, 0, nullptr);
  EXPECT_TRUE(view.dense);
  EXPECT_EQ(view.num_segments, 16);
  LayerPrefillPlan gpu = estimator.download_last(nullptr);
  LayerPrefillPlan cpu = estimate_prefill_plan(cpu_inputs(prompt, 0), params, BudgetRule::kEntropy);
  ASSERT_TRUE(cpu.dense);
  compare_plans(cpu, gpu, prompt, params, BudgetRule::kEntropy, "dense layer 0");
  account(gpu);

  // A sparse layer next, then prompts too short for a sparse segment: 300 tokens make 5
  // segments, the first at or past the threshold (256) is the last one; and the empty prompt.
  gpu = run_gpu(estimator, prompt, device, 1);
  cpu = estimate_prefill_plan(cpu_inputs(prompt, 1), params, BudgetRule::kEntropy);
  ASSERT_FALSE(gpu.dense);
  compare_plans(cpu, gpu, prompt, params, BudgetRule::kEntropy, "sparse layer 1");
  EXPECT_LT(gpu.keys_read(), gpu.keys_read_dense());
  account(gpu);
  for (int64_t tokens : {300, 0}) {
    Prompt short_prompt = random_prompt({8, 2, 64, tokens}, 82);
    const DevicePrompt short_device = upload_prompt(short_prompt, shape.q_heads * shape.head_dim);
    gpu = run_gpu(estimator, short_prompt, short_device, 1);
    cpu = estimate_prefill_plan(cpu_inputs(short_prompt, 1), params, BudgetRule::kEntropy);
    EXPECT_TRUE(gpu.dense) << tokens;
    ASSERT_TRUE(cpu.dense);
    compare_plans(cpu, gpu, short_prompt, params, BudgetRule::kEntropy,
                  "short prompt " + std::to_string(tokens));
    account(gpu);
  }
  unsigned long long host[2];
  counters.download(host, 2);
  EXPECT_EQ(static_cast<int64_t>(host[0]), expected_read);
  EXPECT_EQ(static_cast<int64_t>(host[1]), expected_dense);
  std::cout << "[ measure ] keys read " << host[0] << " of " << host[1] << " dense\n";
}

TEST(CudaPrefillEstimate, BadArgumentsThrowClearErrors) {
  ENTROPYINFER_REQUIRE_GPU();
  const PrefillParams params = small_params(64, 8, 128, 64);
  const auto construct = [](int q_heads, int kv_heads, int head_dim, const PrefillParams& p) {
    cuda::PrefillEstimator estimator(q_heads, kv_heads, head_dim, 1000, p, BudgetRule::kEntropy);
  };
  EXPECT_THROW(construct(6, 4, 64, params), Error);    // 6 query heads over 4 KV heads
  EXPECT_THROW(construct(8, 2, 0, params), Error);     // no head_dim
  EXPECT_THROW(construct(8, 2, 1024, params), Error);  // head_dim past 512
  PrefillParams bad = params;
  bad.block_size = 6;
  EXPECT_THROW(construct(8, 2, 64, bad), Error);  // S not a multiple of b

  const Shape shape{8, 2, 64, 1000};
  const Prompt prompt = random_prompt(shape, 91);
  const DevicePrompt device = upload_prompt(prompt, shape.q_heads * shape.head_dim);
  cuda::PrefillEstimator estimator(8, 2, 64, 1000, params, BudgetRule::kEntropy);
  EXPECT_THROW(estimator.estimate(device.queries.data(), device.q_stride, 1001, 1, nullptr),
               Error);  // past max_tokens
  estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 0, 512, nullptr);
  EXPECT_THROW(estimator.estimate(device.queries.data(), device.q_stride, 1000, 1, nullptr),
               Error);  // keys 512.. not recorded
  estimator.record_key_blocks(device.keys.data(), prompt.key_stride, 512, 488, nullptr);
  EXPECT_THROW(estimator.estimate(device.queries.data(), 100, 1000, 1, nullptr),
               Error);  // token stride below q_heads * head_dim
  EXPECT_NO_THROW(estimator.estimate(device.queries.data(), device.q_stride, 1000, 1, nullptr));
}

double elapsed_ms(cudaEvent_t begin, cudaEvent_t end) {
  float ms = 0;
  cuda::check(cudaEventSynchronize(end), "cudaEventSynchronize");
  cuda::check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  return ms;
}

// Llama-3-8B's attention layout at the released defaults, on a 16k-token prompt whose queries
// and keys have a per-dimension bias (as real ones do) so that the scores are not all alike.
Prompt biased_prompt(Shape shape) {
  Prompt prompt = random_prompt(shape, 101);
  const std::vector<float> bias = gpu_test::random_floats(
      static_cast<size_t>(shape.q_heads + shape.kv_heads) * shape.head_dim, 102, 0.5f);
  for (int64_t t = 0; t < shape.tokens; ++t) {
    for (int h = 0; h < shape.q_heads; ++h) {
      for (int d = 0; d < shape.head_dim; ++d) {
        float& q = query_at(prompt, t, h, d);
        q = round_bf16(q + bias[h * shape.head_dim + d]);
      }
    }
    for (int h = 0; h < shape.kv_heads; ++h) {
      for (int d = 0; d < shape.head_dim; ++d) {
        float& k = key_at(prompt, h, t, d);
        k = round_bf16(k + bias[(shape.q_heads + h) * shape.head_dim + d]);
      }
    }
  }
  return prompt;
}

TEST(CudaPrefillEstimate, LargePromptMatchesCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  const Shape shape{32, 8, 128, 16384};
  const PrefillParams params;  // S 512, b 8, threshold 4096, base 2048
  const Prompt prompt = biased_prompt(shape);
  const auto cpu_start = std::chrono::steady_clock::now();
  const LayerPrefillPlan cpu =
      estimate_prefill_plan(cpu_inputs(prompt, 1), params, BudgetRule::kEntropy);
  const double cpu_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cpu_start)
          .count();

  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::PrefillEstimator estimator(shape.q_heads, shape.kv_heads, shape.head_dim, shape.tokens,
                                   params, BudgetRule::kEntropy);
  const DevicePrompt device = upload_prompt(
      prompt, static_cast<int64_t>(shape.q_heads + 2 * shape.kv_heads) * shape.head_dim);
  const LayerPrefillPlan gpu = run_gpu(estimator, prompt, device, 1, 4096, stream);
  compare_plans(cpu, gpu, prompt, params, BudgetRule::kEntropy, "16k tokens 32/8 heads d128");

  cudaEvent_t begin = nullptr, end = nullptr;
  cuda::check(cudaEventCreate(&begin), "cudaEventCreate");
  cuda::check(cudaEventCreate(&end), "cudaEventCreate");
  cuda::check(cudaEventRecord(begin, stream), "cudaEventRecord");
  estimator.estimate(device.queries.data(), device.q_stride, shape.tokens, 1, stream);
  cuda::check(cudaEventRecord(end, stream), "cudaEventRecord");
  const double gpu_ms = elapsed_ms(begin, end);
  std::cout << "[ measure ] 16k-token estimate: GPU " << gpu_ms << " ms, CPU reference " << cpu_ms
            << " ms\n";
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
}

// The speed bar: at 128k tokens (Llama-3-8B layout, defaults) one layer's estimate must stay well
// under 3 ms on an H200, a small part of the sparse prefill it plans. The prompt repeats one 16k
// random block (generating 128k tokens on the host would take longer than the test may).
TEST(CudaPrefillEstimate, EstimateOf128kTokensIsFast) {
  ENTROPYINFER_REQUIRE_GPU();
  const Shape shape{32, 8, 128, 131072};
  const int64_t period = 16384;
  const int64_t q_width = static_cast<int64_t>(shape.q_heads) * shape.head_dim;
  const PrefillParams params;
  const std::vector<float> queries = random_bf16_values(period * q_width, 111, 1.0f, true);
  const std::vector<float> keys =
      random_bf16_values(static_cast<size_t>(period) * shape.head_dim, 112, 1.0f, true);
  const cuda::DeviceBuffer<bf16> query_block = gpu_test::upload_bf16(queries);
  const cuda::DeviceBuffer<bf16> key_block = gpu_test::upload_bf16(keys);
  cuda::DeviceBuffer<bf16> all_queries(static_cast<size_t>(shape.tokens * q_width));
  cuda::DeviceBuffer<bf16> all_keys(static_cast<size_t>(shape.kv_heads * shape.tokens) *
                                    shape.head_dim);
  for (int64_t copy = 0; copy < shape.tokens / period; ++copy) {
    cuda::check(cudaMemcpy(all_queries.data() + copy * period * q_width, query_block.data(),
                           query_block.bytes(), cudaMemcpyDeviceToDevice),
                "cudaMemcpy");
    for (int h = 0; h < shape.kv_heads; ++h) {
      // Each head's copy is shifted by a few rows so that the heads differ.
      const int64_t shift = 8 * h;
      bf16* slab = all_keys.data() + (h * shape.tokens + copy * period) * shape.head_dim;
      cuda::check(
          cudaMemcpy(slab, key_block.data() + shift * shape.head_dim,
                     (period - shift) * shape.head_dim * sizeof(bf16), cudaMemcpyDeviceToDevice),
          "cudaMemcpy");
      cuda::check(cudaMemcpy(slab + (period - shift) * shape.head_dim, key_block.data(),
                             shift * shape.head_dim * sizeof(bf16), cudaMemcpyDeviceToDevice),
                  "cudaMemcpy");
    }
  }
  std::cout << "[ measure ] 128k estimator device bytes "
            << cuda::PrefillEstimator::device_bytes(shape.q_heads, shape.kv_heads, shape.head_dim,
                                                    shape.tokens, params)
            << "\n";
  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t begin = nullptr, end = nullptr;
  cuda::check(cudaEventCreate(&begin), "cudaEventCreate");
  cuda::check(cudaEventCreate(&end), "cudaEventCreate");
  for (BudgetRule rule : {BudgetRule::kEntropy, BudgetRule::kFixed}) {
    cuda::PrefillEstimator estimator(shape.q_heads, shape.kv_heads, shape.head_dim, shape.tokens,
                                     params, rule);
    cuda::check(cudaEventRecord(begin, stream), "cudaEventRecord");
    for (int64_t first = 0; first < shape.tokens; first += 16384) {
      estimator.record_key_blocks(all_keys.data(), shape.tokens, first, 16384, stream);
    }
    cuda::check(cudaEventRecord(end, stream), "cudaEventRecord");
    const double record_ms = elapsed_ms(begin, end);
    double best_ms = 1e30;
    for (int run = 0; run < 4; ++run) {  // the first run warms up
      cuda::check(cudaEventRecord(begin, stream), "cudaEventRecord");
      estimator.estimate(all_queries.data(), q_width, shape.tokens, 1, stream);
      cuda::check(cudaEventRecord(end, stream), "cudaEventRecord");
      const double ms = elapsed_ms(begin, end);
      if (run > 0) best_ms = std::min(best_ms, ms);
    }
    const LayerPrefillPlan plan = estimator.download_last(stream);
    ASSERT_FALSE(plan.dense);
    int64_t misplaced = 0;
    for (size_t row = 0; row + 1 < plan.row_offsets.size(); ++row) {
      const int64_t visible = visible_blocks(static_cast<int64_t>(row % plan.num_segments),
                                             params.segment_size, params.block_size);
      for (int32_t i = plan.row_offsets[row]; i < plan.row_offsets[row + 1]; ++i) {
        const bool ordered =
            i == plan.row_offsets[row] || plan.block_indices[i - 1] < plan.block_indices[i];
        if (!ordered || plan.block_indices[i] < 0 || plan.block_indices[i] >= visible) ++misplaced;
      }
    }
    EXPECT_EQ(misplaced, 0);
    const char* name = rule == BudgetRule::kEntropy ? "entropy" : "critiprefill";
    std::cout << "[ measure ] 128k tokens, 32/8 heads, d128 (" << name << "): estimate " << best_ms
              << " ms, key extrema (8 chunks) " << record_ms << " ms, " << plan.block_indices.size()
              << " blocks, keys read "
              << static_cast<double>(plan.keys_read()) / plan.keys_read_dense() << " of dense\n";
    // The time is printed, not asserted: speed belongs to the benchmarks (bench --stage-times).
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace entropyinfer

// The CPU block-sparse prefill kernel against naive attention under an explicit mask built here
// from the plan: random plans of many shapes, the plans EntropyInfer and CritiPrefill produce,
// dense plans, and plans whose budgets cover the context (which must reproduce dense causal
// attention).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attention/entropy_prefill.h"
#include "attention/policies.h"
#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::random_vector;

struct Problem {
  cpu::AttentionShape shape;
  std::vector<float> q, k, v;
};

Problem random_problem(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                       uint32_t seed, float scale = 1.0f) {
  Problem p;
  p.shape.tokens = tokens;
  p.shape.q_heads = q_heads;
  p.shape.kv_heads = kv_heads;
  p.shape.head_dim = head_dim;
  p.shape.cache_stride = tokens + 5;
  p.shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.q = random_vector(tokens * q_heads * head_dim, seed, scale);
  p.k = random_vector(kv_heads * p.shape.cache_stride * head_dim, seed + 1, scale);
  p.v = random_vector(kv_heads * p.shape.cache_stride * head_dim, seed + 2);
  return p;
}

// mask[kv_head][t][key]: what the plan lets query t of the head's group see.
std::vector<uint8_t> explicit_mask(const LayerPrefillPlan& plan, int64_t tokens, int64_t kv_heads) {
  std::vector<uint8_t> mask(kv_heads * tokens * tokens, 0);
  for (int64_t h = 0; h < kv_heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      uint8_t* row = mask.data() + (h * tokens + t) * tokens;
      const int64_t segment = plan.dense ? 0 : t / plan.segment_size;
      if (plan.dense || !plan.segment_sparse[segment]) {
        for (int64_t key = 0; key <= t; ++key) row[key] = 1;
        continue;
      }
      const int64_t start = segment * plan.segment_size;
      for (int64_t key = start; key <= t; ++key) row[key] = 1;
      const int64_t r = h * plan.num_segments + segment;
      for (int32_t i = plan.row_offsets[r]; i < plan.row_offsets[r + 1]; ++i) {
        for (int64_t key = int64_t{plan.block_indices[i]} * plan.block_size;
             key < int64_t{plan.block_indices[i] + 1} * plan.block_size; ++key) {
          row[key] = 1;
        }
      }
    }
  }
  return mask;
}

std::vector<double> naive_masked_attention(const Problem& p, const std::vector<uint8_t>& mask) {
  const auto& s = p.shape;
  const int64_t group = s.q_heads / s.kv_heads;
  std::vector<double> out(s.tokens * s.q_heads * s.head_dim, 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t head = 0; head < s.q_heads; ++head) {
      const int64_t h = head / group;
      const uint8_t* row = mask.data() + (h * s.tokens + t) * s.tokens;
      std::vector<double> logits(s.tokens, -1e300);
      double largest = -1e300;
      for (int64_t key = 0; key < s.tokens; ++key) {
        if (!row[key]) continue;
        double dot = 0.0;
        for (int64_t c = 0; c < s.head_dim; ++c) {
          dot += double{p.q[(t * s.q_heads + head) * s.head_dim + c]} *
                 p.k[(h * s.cache_stride + key) * s.head_dim + c];
        }
        logits[key] = dot * s.scale;
        largest = std::max(largest, logits[key]);
      }
      double total = 0.0;
      for (int64_t key = 0; key < s.tokens; ++key) {
        if (row[key]) total += std::exp(logits[key] - largest);
      }
      for (int64_t key = 0; key < s.tokens; ++key) {
        if (!row[key]) continue;
        const double weight = std::exp(logits[key] - largest) / total;
        for (int64_t c = 0; c < s.head_dim; ++c) {
          out[(t * s.q_heads + head) * s.head_dim + c] +=
              weight * p.v[(h * s.cache_stride + key) * s.head_dim + c];
        }
      }
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& expected,
                  const std::string& label) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], expected[i], 1e-5 * std::max(1.0, std::fabs(expected[i])))
        << label << " at " << i;
  }
}

// Also checks the keys the kernel says it read against the plan's mask: the (query token, key)
// pairs each KV head's group may see.
std::vector<float> run_kernel(const Problem& p, const LayerPrefillPlan& plan) {
  std::vector<float> out(p.shape.tokens * p.shape.q_heads * p.shape.head_dim, -7.0f);
  const int64_t keys_read =
      cpu::block_sparse_attention(p.q.data(), p.k.data(), p.v.data(), p.shape, plan, out.data());
  const std::vector<uint8_t> mask = explicit_mask(plan, p.shape.tokens, p.shape.kv_heads);
  EXPECT_EQ(keys_read, std::count(mask.begin(), mask.end(), uint8_t{1}));
  return out;
}

std::vector<float> run_dense(const Problem& p) {
  std::vector<float> out(p.shape.tokens * p.shape.q_heads * p.shape.head_dim);
  cpu::causal_attention(p.q.data(), p.k.data(), p.v.data(), p.shape, out.data());
  return out;
}

// A plan with random sparse segments and random (ascending, causal) block rows.
LayerPrefillPlan random_plan(int64_t tokens, int kv_heads, int segment_size, int block_size,
                             std::mt19937& generator) {
  LayerPrefillPlan plan;
  plan.dense = false;
  plan.num_tokens = tokens;
  plan.num_kv_heads = kv_heads;
  plan.segment_size = segment_size;
  plan.block_size = block_size;
  plan.num_segments = static_cast<int>((tokens + segment_size - 1) / segment_size);
  plan.segment_sparse.resize(plan.num_segments);
  for (auto& sparse : plan.segment_sparse) sparse = generator() % 3 != 0;
  plan.row_offsets.assign(kv_heads * plan.num_segments + 1, 0);
  for (int h = 0; h < kv_heads; ++h) {
    for (int s = 0; s < plan.num_segments; ++s) {
      const int r = h * plan.num_segments + s;
      if (plan.segment_sparse[s]) {
        for (int32_t j = 0; j < s * segment_size / block_size; ++j) {
          if (generator() % 2) plan.block_indices.push_back(j);
        }
      }
      plan.row_offsets[r + 1] = static_cast<int32_t>(plan.block_indices.size());
    }
  }
  return plan;
}

TEST(BlockSparseAttention, RandomPlansMatchNaiveAttentionUnderTheExplicitMask) {
  std::mt19937 generator(77);
  for (int trial = 0; trial < 30; ++trial) {
    const int block = 1 << (generator() % 4);
    const int segment = block * static_cast<int>(1 + generator() % 5);
    const int kv_heads = 1 + static_cast<int>(generator() % 3);
    const int q_heads = kv_heads * static_cast<int>(1 + generator() % 3);
    const int64_t tokens = 1 + static_cast<int64_t>(generator() % 90);
    const int64_t head_dim = 1 + static_cast<int64_t>(generator() % 20);
    const Problem p = random_problem(tokens, q_heads, kv_heads, head_dim, 900 + trial, 2.0f);
    const LayerPrefillPlan plan = random_plan(tokens, kv_heads, segment, block, generator);
    expect_close(run_kernel(p, plan),
                 naive_masked_attention(p, explicit_mask(plan, tokens, kv_heads)),
                 "trial " + std::to_string(trial));
  }
}

TEST(BlockSparseAttention, PolicyPlansMatchNaiveAttentionUnderTheExplicitMask) {
  PrefillParams pp;
  pp.segment_size = 16;
  pp.block_size = 4;
  pp.sparse_threshold = 16;
  pp.base_budget = 8;
  pp.critiprefill_budget = 12;
  pp.delta = 0.0;
  pp.dense_layers = 0;
  const Problem p = random_problem(117, 4, 2, 16, 31, 1.5f);
  PrefillInputs inputs;
  inputs.queries = p.q.data();
  inputs.keys = p.k.data();
  inputs.key_stride = p.shape.cache_stride;
  inputs.num_tokens = p.shape.tokens;
  inputs.num_q_heads = 4;
  inputs.num_kv_heads = 2;
  inputs.head_dim = 16;
  for (const LayerPrefillPlan& plan :
       {EntropyPrefillPolicy(pp).plan(inputs), CritiPrefillPolicy(pp).plan(inputs)}) {
    ASSERT_FALSE(plan.dense);
    const auto mask = explicit_mask(plan, 117, 2);
    expect_close(run_kernel(p, plan), naive_masked_attention(p, mask), "policy plan");
    // The plan's own work count agrees with the mask.
    int64_t visible = 0;
    for (uint8_t m : mask) visible += m;
    EXPECT_EQ(plan.keys_read(), visible);
    EXPECT_LT(plan.keys_read(), plan.keys_read_dense());
  }
}

TEST(BlockSparseAttention, DensePlansAndFullBudgetsEqualDenseCausalAttention) {
  PrefillParams pp;
  pp.segment_size = 16;
  pp.block_size = 2;
  pp.sparse_threshold = 0;
  pp.base_budget = 200;  // covers the whole 150-token context
  pp.critiprefill_budget = 200;
  pp.dense_layers = 0;
  const Problem p = random_problem(150, 6, 2, 24, 51, 2.0f);
  PrefillInputs inputs;
  inputs.queries = p.q.data();
  inputs.keys = p.k.data();
  inputs.key_stride = p.shape.cache_stride;
  inputs.num_tokens = p.shape.tokens;
  inputs.num_q_heads = 6;
  inputs.num_kv_heads = 2;
  inputs.head_dim = 24;
  const std::vector<float> dense = run_dense(p);
  const std::vector<double> dense_as_double(dense.begin(), dense.end());
  for (const LayerPrefillPlan& plan :
       {EntropyPrefillPolicy(pp).plan(inputs), CritiPrefillPolicy(pp).plan(inputs),
        FullPrefillPolicy(pp).plan(inputs)}) {
    expect_close(run_kernel(p, plan), dense_as_double, plan.dense ? "dense plan" : "full budget");
    EXPECT_EQ(plan.keys_read(), plan.keys_read_dense());
  }
  // And the dense masked reference agrees with cpu::causal_attention itself.
  LayerPrefillPlan dense_plan;
  expect_close(dense, naive_masked_attention(p, explicit_mask(dense_plan, 150, 2)), "reference");
}

TEST(BlockSparseAttention, NonCausalOrMismatchedPlansAreRejected) {
  const Problem p = random_problem(32, 2, 1, 4, 3);
  std::mt19937 generator(1);
  LayerPrefillPlan plan = random_plan(32, 1, 8, 4, generator);
  plan.segment_sparse[1] = 1;
  plan.block_indices.insert(plan.block_indices.begin() + plan.row_offsets[1],
                            2);  // block 2 = 8..11
  for (size_t r = 2; r < plan.row_offsets.size(); ++r) ++plan.row_offsets[r];
  std::vector<float> out(32 * 2 * 4);
  EXPECT_THROW(
      cpu::block_sparse_attention(p.q.data(), p.k.data(), p.v.data(), p.shape, plan, out.data()),
      Error);
  LayerPrefillPlan wrong_size = random_plan(31, 1, 8, 4, generator);
  EXPECT_THROW(cpu::block_sparse_attention(p.q.data(), p.k.data(), p.v.data(), p.shape, wrong_size,
                                           out.data()),
               Error);
}

}  // namespace
}  // namespace entropyinfer

// The decode-time cache selections (EntropyInfer's latent compression, SnapKV, AdaKV, StreamingLLM,
// PyramidKV) and the compressed decode attention kernel, each against a naive reference written
// here from the method (docs/method.md sections 3 and 4), on random inputs without ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "attention/adakv.h"
#include "attention/decode_selection.h"
#include "attention/policies.h"
#include "attention/pyramidkv.h"
#include "attention/window_scores.h"
#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "decode_policy_inputs.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::random_vector;

using Cache = decode_test::DecodeCache;

Cache random_cache(int64_t length, int window_tokens, int q_heads, int kv_heads, int head_dim,
                   uint32_t seed) {
  Cache c(length, window_tokens, q_heads, kv_heads, head_dim,
          /*stride=*/length + 2);
  c.queries = random_vector(c.query_count(), seed, 2.0f);
  c.keys = random_vector(c.key_count(), seed + 1, 2.0f);
  return c;
}

// ---- Naive reference
// --------------------------------------------------------------------------------

// Mean over the window's queries of softmax(q.k / sqrt(d)) over keys 0..(own position), for key j.
std::vector<double> naive_window_scores(const Cache& c, int head, int64_t candidates,
                                        bool causal = true) {
  const int group = c.q_heads / c.kv_heads;
  const int kv = head / group;
  std::vector<double> scores(candidates, 0.0);
  for (int i = 0; i < c.window_tokens; ++i) {
    const int64_t position = c.length - c.window_tokens + i;
    const int64_t seen = causal ? position + 1 : c.length;
    std::vector<double> logits(seen);
    double largest = -1e300;
    for (int64_t j = 0; j < seen; ++j) {
      double dot = 0.0;
      for (int d = 0; d < c.head_dim; ++d) {
        dot += double{c.queries[(i * c.q_heads + head) * c.head_dim + d]} *
               c.keys[(kv * c.stride + j) * c.head_dim + d];
      }
      logits[j] = dot / std::sqrt(static_cast<double>(c.head_dim));
      largest = std::max(largest, logits[j]);
    }
    double total = 0.0;
    for (double l : logits) total += std::exp(l - largest);
    for (int64_t j = 0; j < std::min(seen, candidates); ++j) {
      scores[j] += std::exp(logits[j] - largest) / total / c.window_tokens;
    }
  }
  return scores;
}

// Pooling with an explicitly padded row: avg divides by the kernel (padding counts as 0), max skips
// padding (-inf).
std::vector<double> naive_pool(const std::vector<double>& x, Pooling pooling, int kernel) {
  if (pooling == Pooling::kNone) return x;
  const int half = kernel / 2;
  const double pad = pooling == Pooling::kAvg ? 0.0 : -1e300;
  std::vector<double> padded(half, pad);
  padded.insert(padded.end(), x.begin(), x.end());
  padded.insert(padded.end(), half, pad);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double acc = pooling == Pooling::kAvg ? 0.0 : -1e300;
    for (int k = 0; k < kernel; ++k) {
      acc = pooling == Pooling::kAvg ? acc + padded[i + k] : std::max(acc, padded[i + k]);
    }
    out[i] = pooling == Pooling::kAvg ? acc / kernel : acc;
  }
  return out;
}

// Scores per selection head: pooled per query head, then mean/max over the group (or per query
// head).
std::vector<std::vector<double>> naive_candidate_scores(const Cache& c, const DecodeParams& p,
                                                        int64_t candidates) {
  std::vector<std::vector<double>> pooled;
  for (int head = 0; head < c.q_heads; ++head) {
    pooled.push_back(
        naive_pool(naive_window_scores(c, head, candidates), p.pooling, p.pool_kernel));
  }
  if (p.per_query_head) return pooled;
  const int group = c.q_heads / c.kv_heads;
  std::vector<std::vector<double>> result(c.kv_heads, std::vector<double>(candidates));
  for (int kv = 0; kv < c.kv_heads; ++kv) {
    for (int64_t j = 0; j < candidates; ++j) {
      double mean = 0.0, largest = -1e300;
      for (int g = 0; g < group; ++g) {
        mean += pooled[kv * group + g][j] / group;
        largest = std::max(largest, pooled[kv * group + g][j]);
      }
      result[kv][j] = p.aggregation == GroupAggregation::kMax ? largest : mean;
    }
  }
  return result;
}

std::vector<int32_t> with_window(std::vector<int32_t> kept, int64_t from, int64_t length) {
  for (int64_t j = from; j < length; ++j) kept.push_back(static_cast<int32_t>(j));
  return kept;
}

// SnapKV's selection: per head the top K - W candidates and the last W entries.
std::vector<std::vector<int32_t>> naive_snapkv(const Cache& c, const DecodeParams& p,
                                               int64_t budget) {
  const int64_t candidates = c.length - p.window;
  std::vector<std::vector<int32_t>> kept;
  for (const auto& scores : naive_candidate_scores(c, p, candidates)) {
    kept.push_back(
        with_window(testing::naive_top(scores, budget - p.window), candidates, c.length));
  }
  return kept;
}

DecodeParams small_decode_params() {
  DecodeParams p;
  p.budget = 40;
  p.window = 8;
  p.gap = 3;
  return p;
}

// ---- Building blocks
// ----------------------------------------------------------------------------------

TEST(DecodePolicies, WindowScoresMatchFormula) {
  for (auto [q_heads, kv_heads, window] : {std::tuple{2, 2, 4}, {4, 2, 8}, {6, 2, 1}}) {
    const Cache c = random_cache(57, window, q_heads, kv_heads, 12, 10 + q_heads);
    const int64_t candidates = c.length - window;
    const auto scores = window_attention_scores(c.inputs(), candidates);
    for (int head = 0; head < q_heads; ++head) {
      const auto expected = naive_window_scores(c, head, candidates);
      for (int64_t j = 0; j < candidates; ++j) {
        ASSERT_NEAR(scores[head * candidates + j], expected[j], 1e-6 * (1 + expected[j]))
            << head << " " << j;
      }
    }
  }
}

TEST(DecodePolicies, WindowScoresAreCausalWithinTheWindow) {
  // Ask for scores of every key, the window's own included: the window query at position L - T + i
  // must not see later keys, so the last key's score comes from the last query alone and the
  // causal result differs from a non-causal one.
  const Cache c = random_cache(30, 10, 2, 1, 8, 3);
  const auto scores = window_attention_scores(c.inputs(), c.length);
  for (int head = 0; head < 2; ++head) {
    const auto causal = naive_window_scores(c, head, c.length, true);
    const auto full = naive_window_scores(c, head, c.length, false);
    double difference = 0.0;
    for (int64_t j = 0; j < c.length; ++j) {
      ASSERT_NEAR(scores[head * c.length + j], causal[j], 1e-6);
      difference += std::fabs(causal[j] - full[j]);
    }
    EXPECT_GT(difference, 1e-3);
  }
}

TEST(DecodePolicies, PoolingMatchesPaddedReference) {
  for (Pooling pooling : {Pooling::kAvg, Pooling::kMax, Pooling::kNone}) {
    for (int kernel : {1, 3, 5, 7}) {
      for (int count : {1, 2, 3, 6, 25}) {
        const auto raw = random_vector(count, 40 + count + kernel);
        std::vector<double> as_double(raw.begin(), raw.end());
        const auto expected = naive_pool(as_double, pooling, kernel);
        std::vector<float> got(count);
        pool_scores(raw.data(), count, pooling, kernel, got.data());
        for (int i = 0; i < count; ++i) {
          ASSERT_NEAR(got[i], expected[i], 1e-6) << int(pooling) << " k" << kernel << " n" << count;
        }
      }
    }
  }
  // Edge damping of avgpool (count_include_pad): a constant row of 1 pools to 3/5 at the ends.
  std::vector<float> ones(9, 1.0f), pooled(9);
  pool_scores(ones.data(), 9, Pooling::kAvg, 5, pooled.data());
  EXPECT_FLOAT_EQ(pooled[0], 0.6f);
  EXPECT_FLOAT_EQ(pooled[1], 0.8f);
  EXPECT_FLOAT_EQ(pooled[4], 1.0f);
  EXPECT_FLOAT_EQ(pooled[8], 0.6f);
}

// ---- SnapKV and latent decode
// -----------------------------------------------------------------------

TEST(DecodePolicies, SnapKVSelectionMatchesNaive) {
  int seed = 100;
  for (Pooling pooling : {Pooling::kAvg, Pooling::kMax, Pooling::kNone}) {
    for (GroupAggregation aggregation : {GroupAggregation::kMean, GroupAggregation::kMax}) {
      for (bool per_query_head : {false, true}) {
        DecodeParams p = small_decode_params();
        p.pooling = pooling;
        p.aggregation = aggregation;
        p.per_query_head = per_query_head;
        const Cache c = random_cache(150, p.window, 4, 2, 16, seed++);
        const LayerDecodePlan plan = SnapKVPolicy(p).plan(c.inputs());
        EXPECT_EQ(plan.per_query_head, per_query_head);
        const auto expected = naive_snapkv(c, p, p.budget);
        ASSERT_EQ(plan.kept.size(), per_query_head ? 4u : 2u);
        // The per-query-head layout stores g = 2 times the entries.
        EXPECT_EQ(plan.kept_entries(), (per_query_head ? 4 : 2) * p.budget);
        for (size_t h = 0; h < expected.size(); ++h) {
          ASSERT_EQ(plan.kept[h].size(), static_cast<size_t>(p.budget));
          EXPECT_EQ(plan.kept[h], expected[h])
              << "pooling " << int(pooling) << " aggregation " << int(aggregation) << " head " << h;
        }
      }
    }
  }
}

TEST(DecodePolicies, LatentDecodeSelectsLikeSnapKVAfterTheGap) {
  DecodeParams p = small_decode_params();
  // The window: last W - G prompt queries then G generated ones; the cache holds them all.
  const Cache c = random_cache(133, p.window, 8, 2, 16, 7);
  const LatentDecodePolicy latent(p);
  const SnapKVPolicy snapkv(p);
  EXPECT_EQ(latent.compress_after_generated(), p.gap);
  EXPECT_EQ(snapkv.compress_after_generated(), 0);
  EXPECT_TRUE(latent.needs_window_queries());
  const LayerDecodePlan plan = latent.plan(c.inputs());
  const auto expected = naive_snapkv(c, p, p.budget);
  ASSERT_EQ(plan.kept.size(), 2u);
  for (int h = 0; h < 2; ++h) EXPECT_EQ(plan.kept[h], expected[h]);
  // The generated queries matter: different window queries, different selection.
  Cache other = c;
  const auto fresh = random_vector(other.queries.size() / p.window * p.gap, 999, 2.0f);
  std::copy(fresh.begin(), fresh.end(), other.queries.end() - static_cast<long>(fresh.size()));
  EXPECT_NE(latent.plan(other.inputs()).kept, plan.kept);
}

// ---- AdaKV
// ------------------------------------------------------------------------------------------

std::vector<std::vector<int32_t>> naive_adakv(const std::vector<std::vector<double>>& scores,
                                              int64_t candidate_budget, int64_t floor_count) {
  const int heads = static_cast<int>(scores.size());
  const int64_t candidates = static_cast<int64_t>(scores[0].size());
  std::vector<std::set<int32_t>> chosen(heads);
  for (int h = 0; h < heads; ++h) {
    for (int32_t j : testing::naive_top(scores[h], floor_count)) chosen[h].insert(j);
  }
  struct Entry {
    double score;
    int head;
    int32_t index;
  };
  std::vector<Entry> rest;
  for (int h = 0; h < heads; ++h) {
    for (int32_t j = 0; j < candidates; ++j) {
      if (!chosen[h].count(j)) rest.push_back({scores[h][j], h, j});
    }
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const Entry& a, const Entry& b) { return a.score > b.score; });
  const int64_t remaining = heads * candidate_budget - heads * floor_count;
  for (int64_t k = 0; k < remaining; ++k) chosen[rest[k].head].insert(rest[k].index);
  std::vector<std::vector<int32_t>> result;
  for (const auto& set : chosen) result.emplace_back(set.begin(), set.end());
  return result;
}

TEST(DecodePolicies, AdaKVSelectionMatchesNaive) {
  int seed = 200;
  for (double floor : {0.0, 0.2, 0.5, 1.0}) {
    for (bool per_query_head : {false, true}) {
      DecodeParams p = small_decode_params();
      p.adakv_floor = floor;
      p.per_query_head = per_query_head;
      const Cache c = random_cache(160, p.window, 4, 2, 16, seed++);
      const LayerDecodePlan plan = AdaKVPolicy(p).plan(c.inputs());
      const int64_t candidates = c.length - p.window;
      const int64_t candidate_budget = p.budget - p.window;
      const auto floor_count = static_cast<int64_t>(floor * candidate_budget);
      const auto scores = naive_candidate_scores(c, p, candidates);
      const auto expected = naive_adakv(scores, candidate_budget, floor_count);
      const size_t heads = per_query_head ? 4 : 2;
      ASSERT_EQ(plan.kept.size(), heads);
      size_t total = 0;
      for (size_t h = 0; h < heads; ++h) {
        EXPECT_EQ(plan.kept[h], with_window(expected[h], candidates, c.length))
            << "floor " << floor << " head " << h;
        EXPECT_GE(plan.kept[h].size(), static_cast<size_t>(floor_count + p.window));
        total += plan.kept[h].size();
      }
      EXPECT_EQ(total, heads * p.budget) << "the layer total is K per head";
      if (floor == 1.0) {
        // Every slot is a floor slot: AdaKV degenerates to SnapKV.
        const auto snap = SnapKVPolicy(p).plan(c.inputs());
        EXPECT_EQ(plan.kept, snap.kept);
      }
    }
  }
}

TEST(DecodePolicies, AdaKVMovesBudgetToTheHeadThatSpreadsItsAttention) {
  // Head 0's scores sit on 2 candidates, head 1's spread evenly: with no floor, head 1 gets the
  // slots.
  const int64_t candidates = 20;
  std::vector<float> scores(2 * candidates);
  for (int64_t j = 0; j < candidates; ++j) {
    scores[j] = (j == 3 || j == 11) ? 0.45f : 0.0005f * (j + 1);
    scores[candidates + j] = 0.05f - 0.0001f * j;
  }
  const auto chosen = adaptive_head_selection(scores.data(), 2, candidates, 6, 0);
  EXPECT_EQ(chosen[0], (std::vector<int32_t>{3, 11}));
  EXPECT_EQ(chosen[1].size(), 10u);
  const auto floored = adaptive_head_selection(scores.data(), 2, candidates, 6, 3);
  EXPECT_EQ(floored[0], (std::vector<int32_t>{3, 11, 19}));
  EXPECT_EQ(floored[1].size(), 9u);
}

// ---- StreamingLLM
// -----------------------------------------------------------------------------------

TEST(DecodePolicies, StreamingLLMKeepsSinksAndRecentEntries) {
  DecodeParams p = small_decode_params();
  p.sink_tokens = 4;
  DecodeInputs inputs;  // no queries, no keys needed
  inputs.cache_length = 100;
  inputs.key_stride = 100;
  inputs.num_q_heads = 6;
  inputs.num_kv_heads = 3;
  const StreamingLLMPolicy policy(p);
  EXPECT_FALSE(policy.needs_window_queries());
  EXPECT_EQ(policy.compress_after_generated(), 0);
  const LayerDecodePlan plan = policy.plan(inputs);
  std::vector<int32_t> expected;
  for (int32_t j = 0; j < 4; ++j) expected.push_back(j);
  for (int32_t j = 100 - 36; j < 100; ++j) expected.push_back(j);
  ASSERT_EQ(plan.kept.size(), 3u);
  for (const auto& kept : plan.kept) EXPECT_EQ(kept, expected);
  p.per_query_head = true;
  EXPECT_EQ(StreamingLLMPolicy(p).plan(inputs).kept.size(), 6u);
  p.sink_tokens = 0;
  p.per_query_head = false;
  const auto recent = StreamingLLMPolicy(p).plan(inputs);
  EXPECT_EQ(recent.kept[0].front(), 60);
  EXPECT_EQ(recent.kept[0].size(), 40u);
}

// ---- PyramidKV
// --------------------------------------------------------------------------------------

int64_t naive_pyramid_budget(int64_t K, int64_t W, double beta, int layer, int layers, int64_t L) {
  const int64_t c = K - W;
  if (layers == 1) return K;
  int64_t lo = std::min<int64_t>(c, std::max<int64_t>(1, static_cast<int64_t>(c / beta)));
  int64_t hi = 2 * c - lo;
  if (hi > L - W) {
    hi = L - W;
    lo = 2 * c - hi;
  }
  const int64_t step = (hi - lo) / (layers - 1);
  return hi - layer * step + W;
}

TEST(DecodePolicies, PyramidBudgetsDecreaseLinearlyAndAverageTheBudget) {
  DecodeParams p;  // K 1024, W 32, beta 20
  const int layers = 32;
  double total = 0.0;
  for (int layer = 0; layer < layers; ++layer) {
    const int64_t budget = pyramid_layer_budget(p, layer, layers, 100000);
    EXPECT_EQ(budget, naive_pyramid_budget(1024, 32, 20.0, layer, layers, 100000));
    if (layer > 0) {
      EXPECT_LT(budget, pyramid_layer_budget(p, layer - 1, layers, 100000));
    }
    EXPECT_GE(budget, p.window + 1);
    total += budget;
  }
  EXPECT_EQ(pyramid_layer_budget(p, 0, layers, 100000), 2 * 992 - 49 + 32);
  EXPECT_EQ(pyramid_layer_budget(p, layers - 1, layers, 100000), 32 + 2 * 992 - 49 - 31 * 60);
  EXPECT_NEAR(total / layers, 1024.0, 60.0 / 2 + 1);
  // A short cache caps the bottom layer at the whole cache and shifts the rest to keep the average.
  EXPECT_EQ(pyramid_layer_budget(p, 0, layers, 1500), 1500);
  EXPECT_EQ(pyramid_layer_budget(p, 0, 1, 1500), 1024);
}

TEST(DecodePolicies, PyramidKVSelectionMatchesNaive) {
  DecodeParams p = small_decode_params();
  p.pyramid_beta = 4.0;
  const Cache c = random_cache(120, p.window, 4, 2, 8, 333);
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t budget = naive_pyramid_budget(p.budget, p.window, 4.0, layer, 4, c.length);
    const LayerDecodePlan plan = PyramidKVPolicy(p).plan(c.inputs(layer, 4));
    const auto expected = naive_snapkv(c, p, budget);
    ASSERT_EQ(plan.kept.size(), 2u);
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(plan.kept[h].size(), static_cast<size_t>(budget));
      EXPECT_EQ(plan.kept[h], expected[h]) << "layer " << layer;
    }
  }
}

// ---- Invariants
// -------------------------------------------------------------------------------------

TEST(DecodePolicies, NothingIsCompressedWhileTheCacheFitsTheBudget) {
  DecodeParams p = small_decode_params();
  for (int64_t length : {int64_t{10}, int64_t{39}, int64_t{40}}) {
    const Cache c = random_cache(length, p.window, 4, 2, 8, 5);
    EXPECT_TRUE(SnapKVPolicy(p).plan(c.inputs()).kept.empty()) << length;
    EXPECT_TRUE(LatentDecodePolicy(p).plan(c.inputs()).kept.empty());
    EXPECT_TRUE(AdaKVPolicy(p).plan(c.inputs()).kept.empty());
    EXPECT_TRUE(StreamingLLMPolicy(p).plan(c.inputs()).kept.empty());
    EXPECT_TRUE(PyramidKVPolicy(p).plan(c.inputs(3, 4)).kept.empty());
  }
  const Cache c = random_cache(41, p.window, 4, 2, 8, 5);
  EXPECT_EQ(SnapKVPolicy(p).plan(c.inputs()).kept.size(), 2u);
}

TEST(DecodePolicies, EveryPlanKeepsTheWindowAndAscendingUniqueIndices) {
  std::mt19937 generator(11);
  for (int trial = 0; trial < 40; ++trial) {
    DecodeParams p;
    p.window = 1 + static_cast<int>(generator() % 8);
    p.budget = p.window + static_cast<int>(generator() % 30);
    p.gap = static_cast<int>(generator() % p.window);
    p.sink_tokens = static_cast<int>(generator() % 5);
    p.adakv_floor = (generator() % 5) * 0.25;
    p.per_query_head = generator() % 2;
    const int kv_heads = 1 + static_cast<int>(generator() % 3);
    const int q_heads = kv_heads * (1 + static_cast<int>(generator() % 3));
    const int64_t length = p.budget + 1 + static_cast<int64_t>(generator() % 60);
    const Cache c = random_cache(length, p.window, q_heads, kv_heads, 4, 7000 + trial);
    const size_t heads = p.per_query_head ? q_heads : kv_heads;
    std::vector<std::unique_ptr<DecodePolicy>> policies;
    policies.push_back(std::make_unique<SnapKVPolicy>(p));
    policies.push_back(std::make_unique<LatentDecodePolicy>(p));
    policies.push_back(std::make_unique<AdaKVPolicy>(p));
    policies.push_back(std::make_unique<StreamingLLMPolicy>(p));
    policies.push_back(std::make_unique<PyramidKVPolicy>(p));
    for (const auto& policy : policies) {
      const LayerDecodePlan plan = policy->plan(c.inputs(trial % 3, 3));
      if (plan.kept.empty()) continue;  // PyramidKV's bottom layer may keep everything
      ASSERT_EQ(plan.kept.size(), heads) << policy->name();
      // The shape rules the GPU and the memory planner size by hold every list: exactly for the
      // fixed-size methods, as a bound for AdaKV's and PyramidKV's.
      const DecodeSelection selection = decode_selection(parse_decode_method(policy->name()), p,
                                                         q_heads, kv_heads, trial % 3, 3, length);
      size_t longest = 0, entries = 0;
      for (const auto& kept : plan.kept) {
        longest = std::max(longest, kept.size());
        entries += kept.size();
      }
      EXPECT_LE(static_cast<int64_t>(longest), selection.longest_list()) << policy->name();
      EXPECT_LE(static_cast<int64_t>(entries), selection.entries_bound()) << policy->name();
      EXPECT_LE(static_cast<int64_t>(longest),
                decode_selection_bounds(parse_decode_method(policy->name()), p, q_heads, kv_heads,
                                        3, length)
                    .longest_list)
          << policy->name();
      if (policy->name() != "adakv") {
        EXPECT_EQ(static_cast<int64_t>(longest), selection.longest_list()) << policy->name();
      }
      for (const auto& kept : plan.kept) {
        for (size_t i = 1; i < kept.size(); ++i) ASSERT_LT(kept[i - 1], kept[i]) << policy->name();
        ASSERT_GE(kept.front(), 0);
        ASSERT_LT(kept.back(), length);
        if (policy->name() != "streaming") {
          for (int64_t j = length - p.window; j < length; ++j) {
            ASSERT_TRUE(std::binary_search(kept.begin(), kept.end(), static_cast<int32_t>(j)))
                << policy->name() << " must keep the window";
          }
        }
        if (policy->name() == "snapkv" || policy->name() == "latent" ||
            policy->name() == "streaming") {
          ASSERT_EQ(kept.size(), static_cast<size_t>(p.budget)) << policy->name();
        }
      }
    }
  }
}

// ---- Compressed decode attention
// ----------------------------------------------------------------------

std::vector<double> naive_decode(const std::vector<float>& q,
                                 const std::vector<std::vector<float>>& k,
                                 const std::vector<std::vector<float>>& v, int q_heads,
                                 int head_dim, bool per_query_head, float scale) {
  const int caches = static_cast<int>(k.size());
  const int group = per_query_head ? 1 : q_heads / caches;
  std::vector<double> out(q_heads * head_dim, 0.0);
  for (int head = 0; head < q_heads; ++head) {
    const int cache = head / group;
    const int64_t length = static_cast<int64_t>(k[cache].size()) / head_dim;
    if (length == 0) continue;
    std::vector<double> logits(length);
    for (int64_t j = 0; j < length; ++j) {
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d)
        dot += double{q[head * head_dim + d]} * k[cache][j * head_dim + d];
      logits[j] = dot * scale;
    }
    const double largest = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (double l : logits) total += std::exp(l - largest);
    for (int64_t j = 0; j < length; ++j) {
      const double weight = std::exp(logits[j] - largest) / total;
      for (int d = 0; d < head_dim; ++d)
        out[head * head_dim + d] += weight * v[cache][j * head_dim + d];
    }
  }
  return out;
}

TEST(DecodePolicies, CompressedDecodeAttentionMatchesNaiveWithUnequalHeadLengths) {
  for (bool per_query_head : {false, true}) {
    const int q_heads = 6, kv_heads = 2, head_dim = 20;
    const int caches = per_query_head ? q_heads : kv_heads;
    const std::vector<int64_t> lengths =
        per_query_head ? std::vector<int64_t>{5, 1, 77, 0, 30, 12} : std::vector<int64_t>{41, 9};
    std::vector<std::vector<float>> k, v;
    std::vector<const float*> key_heads, value_heads;
    for (int c = 0; c < caches; ++c) {
      k.push_back(random_vector(lengths[c] * head_dim, 60 + c, 2.0f));
      v.push_back(random_vector(lengths[c] * head_dim, 80 + c));
    }
    for (int c = 0; c < caches; ++c) {
      key_heads.push_back(k[c].data());
      value_heads.push_back(v[c].data());
    }
    const auto q = random_vector(q_heads * head_dim, 5, 2.0f);
    cpu::CompressedDecodeShape shape;
    shape.q_heads = q_heads;
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.scale = 1.0f / std::sqrt(float(head_dim));
    shape.per_query_head = per_query_head;
    std::vector<float> out(q_heads * head_dim, -3.0f);
    cpu::compressed_decode_attention(q.data(), key_heads.data(), value_heads.data(), lengths.data(),
                                     shape, out.data());
    const auto expected = naive_decode(q, k, v, q_heads, head_dim, per_query_head, shape.scale);
    for (int i = 0; i < q_heads * head_dim; ++i) {
      ASSERT_NEAR(out[i], expected[i], 1e-5 * std::max(1.0, std::fabs(expected[i]))) << i;
    }
  }
}

TEST(DecodePolicies, CompressedDecodeOverAFullCacheEqualsDenseDecode) {
  // With nothing dropped, per-head compacted caches reproduce cpu::causal_attention's decode step.
  const int q_heads = 4, kv_heads = 2, head_dim = 16;
  const int64_t length = 50;
  const auto key_cache = random_vector(kv_heads * length * head_dim, 1, 2.0f);
  const auto value_cache = random_vector(kv_heads * length * head_dim, 2);
  const auto q = random_vector(q_heads * head_dim, 3, 2.0f);
  cpu::AttentionShape dense_shape;
  dense_shape.tokens = 1;
  dense_shape.q_heads = q_heads;
  dense_shape.kv_heads = kv_heads;
  dense_shape.head_dim = head_dim;
  dense_shape.first_position = length - 1;
  dense_shape.cache_stride = length;
  dense_shape.scale = 0.25f;
  std::vector<float> dense(q_heads * head_dim), compressed(q_heads * head_dim);
  cpu::causal_attention(q.data(), key_cache.data(), value_cache.data(), dense_shape, dense.data());
  const float* key_heads[2] = {key_cache.data(), key_cache.data() + length * head_dim};
  const float* value_heads[2] = {value_cache.data(), value_cache.data() + length * head_dim};
  const int64_t lengths[2] = {length, length};
  cpu::CompressedDecodeShape shape{q_heads, kv_heads, head_dim, 0.25f, false};
  cpu::compressed_decode_attention(q.data(), key_heads, value_heads, lengths, shape,
                                   compressed.data());
  for (int i = 0; i < q_heads * head_dim; ++i) EXPECT_NEAR(compressed[i], dense[i], 1e-5);
}

TEST(DecodePolicies, BadInputsAreErrors) {
  DecodeParams p = small_decode_params();
  Cache c = random_cache(100, p.window, 3, 2, 8, 1);
  EXPECT_THROW(SnapKVPolicy(p).plan(c.inputs()), Error);  // 3 query heads over 2 KV heads
  Cache no_queries = random_cache(100, p.window, 4, 2, 8, 1);
  DecodeInputs inputs = no_queries.inputs();
  inputs.window_queries = nullptr;
  EXPECT_THROW(SnapKVPolicy(p).plan(inputs), Error);
  EXPECT_THROW(AdaKVPolicy(p).plan(inputs), Error);
}

}  // namespace
}  // namespace entropyinfer

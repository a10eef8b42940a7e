// The GPU decode compression (cuda::DecodeCompressor) against the CPU decode policies on identical
// random bf16 inputs: every method (latent, SnapKV, AdaKV, StreamingLLM, PyramidKV), pooling
// avg / max / none, group aggregation mean / max, per-query-head selection, several window sizes,
// head sizes 64 and 128, and caches within the budget (empty plans). Then compact_cache followed by
// ragged_append and ragged_decode against cpu::compressed_decode_attention on the kept rows.
//
// Tolerances:
//   - plans: the lists must be equal, except that a candidate one side keeps and the other drops
//     is allowed when it is a near-tie: the dropped candidates, sorted by CPU score, pair up with
//     the added ones with CPU scores within 1e-5 relative (the GPU sums in another order, so its
//     scores differ from the CPU's by ~1e-6 relative). The count of such candidates is printed.
//     The window part and StreamingLLM's lists must be exactly equal.
//   - candidate scores: max relative error <= 1e-4 against cpu candidate_scores (printed).
//   - attention after compaction: relative L2 <= 1e-2 and max |error| <= 1e-2 (V in [-1, 1];
//     P is rounded to bf16 for P*V and the output to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "attention/decode_policy.h"
#include "attention/pyramidkv.h"
#include "attention/window_scores.h"
#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cuda/decode_compression.h"
#include "backends/cuda/ragged_decode.h"
#include "decode_policy_inputs.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

constexpr double kTieRelative = 1e-5;
constexpr double kMaxScoreRelativeError = 1e-4;
constexpr double kMaxRelativeL2 = 1e-2;
constexpr double kMaxAbsError = 1e-2;

using Inputs = decode_test::DecodeCache;

// bf16-rounded queries and keys.
Inputs random_inputs(int64_t length, int window_tokens, int q_heads, int kv_heads, int head_dim,
                     uint32_t seed) {
  // Rows past the cache must never be read.
  Inputs in(length, window_tokens, q_heads, kv_heads, head_dim,
            /*stride=*/length + 5);
  // Logits of a few units: peaked softmax rows, scores spread over several decades.
  in.queries = gpu_test::random_bf16_values(in.query_count(), seed, 2.0f);
  in.keys = gpu_test::random_bf16_values(in.key_count(), seed + 1);
  return in;
}

DecodeParams small_params(int budget = 512, int window = 32) {
  DecodeParams params;
  params.budget = budget;
  params.window = window;
  params.gap = std::min(params.gap, window - 1);
  return params;
}

struct Case {
  std::string name;
  DecodeMethod method = DecodeMethod::kSnapKV;
  DecodeParams params = small_params();
  int q_heads = 8, kv_heads = 2, head_dim = 128;
  int64_t length = 3001;
  int window_tokens = 32;
  int num_layers = 1;
};

// Candidates per head the CPU policy scores (0 when it needs no scores).
int64_t candidates_of(const Case& c, int layer) {
  const DecodeParams& p = c.params;
  switch (c.method) {
    case DecodeMethod::kAdaKV:
      return c.length - p.window;
    case DecodeMethod::kPyramidKV: {
      const int64_t budget = pyramid_layer_budget(p, layer, c.num_layers, c.length);
      return c.length - std::min<int64_t>(p.window, budget);
    }
    case DecodeMethod::kLatent:
    case DecodeMethod::kSnapKV:
      return c.length - std::min(p.window, p.budget);
    default:
      return 0;
  }
}

// Checks the GPU plan against the CPU's (see the tolerance above); returns the near-tie count.
int64_t expect_same_plan(const LayerDecodePlan& gpu, const LayerDecodePlan& cpu,
                         const std::vector<float>& cpu_scores, int64_t candidates,
                         int64_t cache_length, bool shared_budget, const std::string& what) {
  EXPECT_EQ(gpu.per_query_head, cpu.per_query_head) << what;
  if (gpu.kept.size() != cpu.kept.size()) {
    ADD_FAILURE() << what << ": " << gpu.kept.size() << " GPU lists, " << cpu.kept.size()
                  << " CPU lists";
    return 0;
  }
  if (candidates == 0) {  // no scores: exactly equal
    for (size_t h = 0; h < cpu.kept.size(); ++h) EXPECT_EQ(gpu.kept[h], cpu.kept[h]) << what;
    return 0;
  }
  int64_t mismatches = 0;
  std::vector<float> only_cpu_all, only_gpu_all;
  for (size_t h = 0; h < cpu.kept.size(); ++h) {
    const auto& g = gpu.kept[h];
    const auto& c = cpu.kept[h];
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] < 0 || g[i] >= cache_length || (i > 0 && g[i] <= g[i - 1])) {
        ADD_FAILURE() << what << ": head " << h << " entry " << i << " = " << g[i]
                      << " is out of range or out of order";
        return mismatches;
      }
    }
    std::vector<int32_t> g_window, c_window;
    std::set<int32_t> g_candidates, c_candidates;
    for (int32_t j : g) {
      if (j >= candidates) {
        g_window.push_back(j);
      } else {
        g_candidates.insert(j);
      }
    }
    for (int32_t j : c) {
      if (j >= candidates) {
        c_window.push_back(j);
      } else {
        c_candidates.insert(j);
      }
    }
    EXPECT_EQ(g_window, c_window) << what << ": head " << h << " window";
    std::vector<float> only_cpu, only_gpu;
    for (int32_t j : c_candidates) {
      if (!g_candidates.count(j)) only_cpu.push_back(cpu_scores[h * candidates + j]);
    }
    for (int32_t j : g_candidates) {
      if (!c_candidates.count(j)) only_gpu.push_back(cpu_scores[h * candidates + j]);
    }
    mismatches += static_cast<int64_t>(only_cpu.size() + only_gpu.size());
    if (shared_budget) {
      only_cpu_all.insert(only_cpu_all.end(), only_cpu.begin(), only_cpu.end());
      only_gpu_all.insert(only_gpu_all.end(), only_gpu.begin(), only_gpu.end());
    } else {
      EXPECT_EQ(g_candidates.size(), c_candidates.size()) << what << ": head " << h;
      only_cpu.swap(only_cpu_all);
      only_gpu.swap(only_gpu_all);
    }
    if (!shared_budget || h + 1 == cpu.kept.size()) {
      if (only_cpu_all.size() != only_gpu_all.size()) {
        ADD_FAILURE() << what << ": " << only_cpu_all.size() << " candidates only the CPU keeps, "
                      << only_gpu_all.size() << " only the GPU keeps";
        return mismatches;
      }
      std::sort(only_cpu_all.begin(), only_cpu_all.end());
      std::sort(only_gpu_all.begin(), only_gpu_all.end());
      for (size_t i = 0; i < only_cpu_all.size(); ++i) {
        const double a = only_cpu_all[i], b = only_gpu_all[i];
        EXPECT_LE(std::fabs(a - b), kTieRelative * std::max(std::fabs(a), std::fabs(b)))
            << what << ": the CPU keeps a candidate of score " << a << ", the GPU one of " << b;
      }
      only_cpu_all.clear();
      only_gpu_all.clear();
    }
  }
  return mismatches;
}

// Runs one case on both sides for every layer; returns the near-tie count.
int64_t run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  const Inputs in =
      random_inputs(c.length, c.window_tokens, c.q_heads, c.kv_heads, c.head_dim, seed);
  AttentionConfig config;
  config.decode = c.method;
  config.decode_params = c.params;
  const auto policy = make_decode_policy(config);
  cuda::DecodeCompressor compressor(c.method, c.params, c.q_heads, c.kv_heads, c.head_dim,
                                    c.num_layers, c.length);
  auto queries = gpu_test::upload_bf16(in.queries);
  auto keys = gpu_test::upload_bf16(in.keys);
  int64_t mismatches = 0;
  double worst_score_error = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const std::string what = c.name + ", layer " + std::to_string(layer);
    const LayerDecodePlan expected = policy->plan(in.inputs(layer, c.num_layers));
    const cuda::DeviceDecodePlan view = compressor.plan(
        queries.data(), in.window_tokens, keys.data(), in.stride, in.length, layer, nullptr);
    const LayerDecodePlan actual = compressor.download_last(nullptr);
    if (expected.kept.empty()) {
      EXPECT_EQ(view.heads, 0) << what;
      EXPECT_TRUE(actual.kept.empty()) << what;
      continue;
    }
    EXPECT_EQ(view.heads, static_cast<int>(expected.kept.size())) << what;
    EXPECT_LE(static_cast<int64_t>(
                  std::max_element(expected.kept.begin(), expected.kept.end(),
                                   [](const auto& a, const auto& b) { return a.size() < b.size(); })
                      ->size()),
              compressor.longest_list_bound(in.length, layer))
        << what;
    const int64_t candidates = candidates_of(c, layer);
    std::vector<float> cpu_scores;
    if (candidates > 0) {
      cpu_scores = candidate_scores(in.inputs(layer, c.num_layers), c.params, candidates);
      const std::vector<float> gpu_scores = compressor.download_last_scores(nullptr);
      EXPECT_EQ(gpu_scores.size(), cpu_scores.size()) << what;
      for (size_t i = 0; i < std::min(gpu_scores.size(), cpu_scores.size()); ++i) {
        const double error = std::fabs(static_cast<double>(gpu_scores[i]) - cpu_scores[i]) /
                             std::max(std::fabs(static_cast<double>(cpu_scores[i])), 1e-30);
        worst_score_error = std::max(worst_score_error, error);
      }
    }
    mismatches += expect_same_plan(actual, expected, cpu_scores, candidates, in.length,
                                   c.method == DecodeMethod::kAdaKV, what);
  }
  EXPECT_LE(worst_score_error, kMaxScoreRelativeError);
  std::cout << "[ measure ] " << c.name << ": " << mismatches
            << " near-tie candidates differ, candidate scores max relative error "
            << worst_score_error << "\n";
  return mismatches;
}

TEST(CudaDecodeCompression, TopKMethodsMatchCpuPolicies) {
  ENTROPYINFER_REQUIRE_GPU();
  std::vector<Case> cases;
  {
    Case c;
    c.name = "snapkv avgpool mean, 8/2 heads, d 128";
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "snapkv maxpool max, 8/2 heads, d 64";
    c.head_dim = 64;
    c.params.pooling = Pooling::kMax;
    c.params.aggregation = GroupAggregation::kMax;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "snapkv no pooling, mean, 4/4 heads (MHA), d 128";
    c.q_heads = c.kv_heads = 4;
    c.params.pooling = Pooling::kNone;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "latent avgpool, per query head, 8/2 heads, d 128";
    c.method = DecodeMethod::kLatent;
    c.params.per_query_head = true;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "latent maxpool mean, 20 window queries of 32, d 64";
    c.method = DecodeMethod::kLatent;
    c.head_dim = 64;
    c.window_tokens = 20;
    c.params.pooling = Pooling::kMax;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "snapkv window 48 (two query groups), pool kernel 7, 6/2 heads, length 4099";
    c.q_heads = 6;
    c.length = 4099;
    c.window_tokens = 48;
    c.params = small_params(700, 48);
    c.params.pool_kernel = 7;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "snapkv budget = window (no candidate kept), d 64";
    c.head_dim = 64;
    c.length = 900;
    c.params = small_params(32, 32);
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "pyramidkv avgpool mean, 4 layers, 8/2 heads";
    c.method = DecodeMethod::kPyramidKV;
    c.num_layers = 4;
    c.params = small_params(600, 32);
    c.params.pyramid_beta = 5.0;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "pyramidkv maxpool, per query head, 3 layers, short cache (layer 0 keeps all)";
    c.method = DecodeMethod::kPyramidKV;
    c.num_layers = 3;
    c.length = 1000;
    c.params = small_params(600, 32);
    c.params.pooling = Pooling::kMax;
    c.params.per_query_head = true;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "streaming, 8/2 heads";
    c.method = DecodeMethod::kStreamingLLM;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "streaming, per query head, no sinks";
    c.method = DecodeMethod::kStreamingLLM;
    c.params.per_query_head = true;
    c.params.sink_tokens = 0;
    cases.push_back(c);
  }
  uint32_t seed = 1000;
  int64_t total = 0;
  for (const Case& c : cases) total += run_case(c, seed += 7);
  std::cout << "[ measure ] top-k methods: " << total << " near-tie candidates differ in all\n";
}

TEST(CudaDecodeCompression, AdaKVMatchesCpuPolicy) {
  ENTROPYINFER_REQUIRE_GPU();
  std::vector<Case> cases;
  for (double floor : {0.2, 0.0, 1.0}) {
    Case c;
    c.name = "adakv floor " + std::to_string(floor) + ", 8/2 heads, d 128";
    c.method = DecodeMethod::kAdaKV;
    c.params = small_params(400, 32);
    c.params.adakv_floor = floor;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "adakv maxpool max, per query head, 8/4 heads, d 64";
    c.method = DecodeMethod::kAdaKV;
    c.head_dim = 64;
    c.q_heads = 8;
    c.kv_heads = 4;
    c.params = small_params(300, 16);
    c.params.pooling = Pooling::kMax;
    c.params.aggregation = GroupAggregation::kMax;
    c.params.per_query_head = true;
    c.window_tokens = 16;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "adakv no pooling, 16 window queries, 12/4 heads, length 5000";
    c.method = DecodeMethod::kAdaKV;
    c.q_heads = 12;
    c.kv_heads = 4;
    c.length = 5000;
    c.window_tokens = 16;
    c.params = small_params(1024, 32);
    c.params.pooling = Pooling::kNone;
    cases.push_back(c);
  }
  uint32_t seed = 2000;
  int64_t total = 0;
  for (const Case& c : cases) total += run_case(c, seed += 7);
  std::cout << "[ measure ] adakv: " << total << " near-tie candidates differ in all\n";
}

TEST(CudaDecodeCompression, CachesWithinTheBudgetGiveEmptyPlans) {
  ENTROPYINFER_REQUIRE_GPU();
  for (DecodeMethod method : {DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
                              DecodeMethod::kStreamingLLM, DecodeMethod::kPyramidKV}) {
    Case c;
    c.name = "empty " + decode_method_name(method);
    c.method = method;
    c.params = small_params(512, 32);
    c.length = 512;  // == budget: nothing to drop
    c.num_layers = 2;
    run_case(c, 3000);
    c.length = 100;
    run_case(c, 3001);
  }
}

// Compaction and decoding over the compressed cache: GPU plan -> compact_cache -> ragged_append
// -> ragged_decode, against the CPU's attention over the kept rows plus the appended one.
void run_compaction_case(DecodeMethod method, bool per_query_head, int head_dim, uint32_t seed) {
  const int q_heads = 8, kv_heads = 2, group = q_heads / kv_heads;
  const int64_t length = 2500;
  DecodeParams params = small_params(300, 32);
  params.per_query_head = per_query_head;
  const std::string what = decode_method_name(method) + (per_query_head ? ", per query head" : "") +
                           ", d " + std::to_string(head_dim);
  SCOPED_TRACE(what);
  const Inputs in = random_inputs(length, 32, q_heads, kv_heads, head_dim, seed);
  const auto values =
      gpu_test::random_bf16_values(in.keys.size(), seed + 2, 1.0f, /*uniform=*/true);
  auto queries = gpu_test::upload_bf16(in.queries);
  auto keys = gpu_test::upload_bf16(in.keys);
  auto values_gpu = gpu_test::upload_bf16(values);

  cuda::DecodeCompressor compressor(method, params, q_heads, kv_heads, head_dim, 1, length);
  const cuda::DeviceDecodePlan view =
      compressor.plan(queries.data(), 32, keys.data(), in.stride, length, 0, nullptr);
  ASSERT_GT(view.heads, 0);
  const LayerDecodePlan plan = compressor.download_last(nullptr);
  int64_t longest = 0;
  for (const auto& list : plan.kept) longest = std::max<int64_t>(longest, list.size());
  const int64_t new_stride = longest + 3;  // room for the appended token and a little more
  const int caches = view.heads;
  cuda::DeviceBuffer<cuda::bf16> new_keys(static_cast<size_t>(caches) * new_stride * head_dim);
  cuda::DeviceBuffer<cuda::bf16> new_values(new_keys.size());
  gpu_test::poison(new_keys);
  gpu_test::poison(new_values);
  cuda::DeviceBuffer<int32_t> lengths(caches);
  EXPECT_THROW(cuda::compact_cache(keys.data(), values_gpu.data(), in.stride, kv_heads, head_dim,
                                   view, per_query_head ? group : 1, new_keys.data(),
                                   new_values.data(), longest - 1, lengths.data(), nullptr),
               Error);
  cuda::compact_cache(keys.data(), values_gpu.data(), in.stride, kv_heads, head_dim, view,
                      per_query_head ? group : 1, new_keys.data(), new_values.data(), new_stride,
                      lengths.data(), nullptr);

  // One new token: its key and value are appended, then its queries attend.
  const auto k_new =
      gpu_test::random_bf16_values(static_cast<size_t>(kv_heads) * head_dim, seed + 3);
  const auto v_new = gpu_test::random_bf16_values(k_new.size(), seed + 4, 1.0f, true);
  const auto q_new =
      gpu_test::random_bf16_values(static_cast<size_t>(q_heads) * head_dim, seed + 5, 2.0f);
  auto k_new_gpu = gpu_test::upload_bf16(k_new), v_new_gpu = gpu_test::upload_bf16(v_new);
  auto q_new_gpu = gpu_test::upload_bf16(q_new);
  cuda::RaggedShape shape;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.cache_stride = new_stride;
  shape.max_length = longest + 1;
  shape.per_query_head = per_query_head;
  cuda::ragged_append(k_new_gpu.data(), v_new_gpu.data(), shape, new_keys.data(), new_values.data(),
                      lengths.data(), nullptr);
  const int splits = cuda::ragged_decode_splits(shape, 0);
  cuda::DeviceBuffer<float> workspace(
      std::max<size_t>(1, cuda::ragged_decode_workspace_floats(shape, splits)));
  cuda::DeviceBuffer<cuda::bf16> out(static_cast<size_t>(q_heads) * head_dim);
  gpu_test::poison(out);
  cuda::ragged_decode(q_new_gpu.data(), new_keys.data(), new_values.data(), lengths.data(), shape,
                      out.data(), workspace.data(), workspace.size(), nullptr, splits);
  cuda::check(cudaDeviceSynchronize(), "compaction and ragged decode");

  std::vector<int32_t> gpu_lengths(caches);
  lengths.download(gpu_lengths.data(), caches);
  // The CPU side: gather the kept rows of the plan, append the new row.
  std::vector<std::vector<float>> key_rows(caches), value_rows(caches);
  std::vector<const float*> key_heads(caches), value_heads(caches);
  std::vector<int64_t> cpu_lengths(caches);
  for (int c = 0; c < caches; ++c) {
    const int kv = per_query_head ? c / group : c;
    for (int32_t row : plan.kept[c]) {
      const size_t offset = (static_cast<size_t>(kv) * in.stride + row) * head_dim;
      key_rows[c].insert(key_rows[c].end(), in.keys.begin() + offset,
                         in.keys.begin() + offset + head_dim);
      value_rows[c].insert(value_rows[c].end(), values.begin() + offset,
                           values.begin() + offset + head_dim);
    }
    key_rows[c].insert(key_rows[c].end(), k_new.begin() + kv * head_dim,
                       k_new.begin() + (kv + 1) * head_dim);
    value_rows[c].insert(value_rows[c].end(), v_new.begin() + kv * head_dim,
                         v_new.begin() + (kv + 1) * head_dim);
    cpu_lengths[c] = static_cast<int64_t>(plan.kept[c].size()) + 1;
    EXPECT_EQ(gpu_lengths[c], cpu_lengths[c]) << "cache " << c;
    key_heads[c] = key_rows[c].data();
    value_heads[c] = value_rows[c].data();
  }
  // The compacted rows themselves (the appended one included) must be the gathered ones exactly.
  const auto all_keys = gpu_test::download_bf16(new_keys);
  for (int c = 0; c < caches; ++c) {
    for (int64_t i = 0; i < cpu_lengths[c] * head_dim; ++i) {
      ASSERT_EQ(all_keys[(c * new_stride) * head_dim + i], key_rows[c][i])
          << "cache " << c << " element " << i;
    }
  }
  cpu::CompressedDecodeShape cpu_shape;
  cpu_shape.q_heads = q_heads;
  cpu_shape.kv_heads = kv_heads;
  cpu_shape.head_dim = head_dim;
  cpu_shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cpu_shape.per_query_head = per_query_head;
  std::vector<float> expected(static_cast<size_t>(q_heads) * head_dim);
  cpu::compressed_decode_attention(q_new.data(), key_heads.data(), value_heads.data(),
                                   cpu_lengths.data(), cpu_shape, expected.data());
  const auto difference = gpu_test::compare(gpu_test::download_bf16(out), expected);
  std::cout << "[ measure ] compaction + ragged decode, " << what << ": max |error| "
            << difference.max_abs_error << ", relative L2 " << difference.relative_l2 << "\n";
  EXPECT_EQ(difference.non_finite, 0);
  EXPECT_LE(difference.relative_l2, kMaxRelativeL2);
  EXPECT_LE(difference.max_abs_error, kMaxAbsError);
}

TEST(CudaDecodeCompression, CompactedCacheDecodesLikeTheCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  run_compaction_case(DecodeMethod::kSnapKV, false, 128, 4000);
  run_compaction_case(DecodeMethod::kAdaKV, false, 128, 4010);
  run_compaction_case(DecodeMethod::kAdaKV, true, 64, 4020);
  run_compaction_case(DecodeMethod::kStreamingLLM, true, 128, 4030);
  run_compaction_case(DecodeMethod::kPyramidKV, false, 64, 4040);
}

TEST(CudaDecodeCompression, LongCacheMatchesCpuPolicy) {
  ENTROPYINFER_REQUIRE_GPU();
  Case c;
  c.name = "snapkv 32k cache, 32/8 heads, d 128, budget 1024";
  c.q_heads = 32;
  c.kv_heads = 8;
  c.length = 32768;
  c.params = DecodeParams{};
  run_case(c, 5000);
}

// Speed at 128k: one layer's plan (32 heads x 32 window queries x 128k keys of scores, then the
// selection), which must take well under 5 ms. The keys repeat a random block of 8192 rows (making
// them all random would take the CPU seconds); equal scores only exercise the tie order.
TEST(CudaDecodeCompression, PlanSpeedAt128k) {
  ENTROPYINFER_REQUIRE_GPU();
  const int q_heads = 32, kv_heads = 8, head_dim = 128, window = 32;
  const int64_t length = 131072;
  const auto queries =
      gpu_test::random_bf16_values(static_cast<size_t>(window) * q_heads * head_dim, 6000, 2.0f);
  const size_t block = size_t{8192} * head_dim;
  const auto key_block = gpu_test::random_bf16_values(block, 6001);
  std::vector<uint16_t> key_bits(block);
  for (size_t i = 0; i < block; ++i) key_bits[i] = f32_to_bf16(key_block[i]);
  cuda::DeviceBuffer<cuda::bf16> keys_gpu(static_cast<size_t>(kv_heads) * length * head_dim);
  for (size_t offset = 0; offset < keys_gpu.size(); offset += block) {
    keys_gpu.upload(reinterpret_cast<const cuda::bf16*>(key_bits.data()), block, offset);
  }
  auto queries_gpu = gpu_test::upload_bf16(queries);
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  for (DecodeMethod method : {DecodeMethod::kSnapKV, DecodeMethod::kAdaKV}) {
    cuda::DecodeCompressor compressor(method, DecodeParams{}, q_heads, kv_heads, head_dim, 1,
                                      length);
    compressor.plan(queries_gpu.data(), window, keys_gpu.data(), length, length, 0, nullptr);
    const int repeats = 5;
    cuda::check(cudaEventRecord(start), "cudaEventRecord");
    for (int r = 0; r < repeats; ++r) {
      compressor.plan(queries_gpu.data(), window, keys_gpu.data(), length, length, 0, nullptr);
    }
    cuda::check(cudaEventRecord(stop), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float milliseconds = 0;
    cuda::check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
    const double per_plan = milliseconds / repeats;
    std::cout << "[ measure ] " << decode_method_name(method)
              << " plan of one layer at 128k (32/8 heads, d 128, window 32): " << per_plan
              << " ms\n";
    EXPECT_LT(per_plan, 5.0);
    const LayerDecodePlan plan = compressor.download_last(nullptr);
    EXPECT_EQ(plan.kept_entries(), int64_t{kv_heads} * 1024);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

TEST(CudaDecodeCompression, RejectsBadArgumentsWithOneMessage) {
  ENTROPYINFER_REQUIRE_GPU();
  const DecodeParams params = small_params(256, 32);
  EXPECT_THROW(cuda::DecodeCompressor(DecodeMethod::kFull, params, 8, 2, 128, 1, 1000), Error);
  EXPECT_THROW(cuda::DecodeCompressor(DecodeMethod::kSnapKV, params, 8, 3, 128, 1, 1000), Error);
  EXPECT_THROW(cuda::DecodeCompressor(DecodeMethod::kSnapKV, params, 8, 2, 96, 1, 1000), Error);
  DecodeParams bad = params;
  bad.window = 300;  // above the budget
  EXPECT_THROW(cuda::DecodeCompressor(DecodeMethod::kSnapKV, bad, 8, 2, 128, 1, 1000), Error);
  cuda::DecodeCompressor compressor(DecodeMethod::kSnapKV, params, 8, 2, 128, 2, 1000);
  cuda::DeviceBuffer<cuda::bf16> queries(64 * 8 * 128), keys(2 * 1000 * 128);
  // More window queries than the window, a cache past the maximum, a bad layer.
  EXPECT_THROW(compressor.plan(queries.data(), 33, keys.data(), 1000, 1000, 0, nullptr), Error);
  EXPECT_THROW(compressor.plan(queries.data(), 32, keys.data(), 1001, 1001, 0, nullptr), Error);
  EXPECT_THROW(compressor.plan(queries.data(), 32, keys.data(), 1000, 1000, 2, nullptr), Error);
  EXPECT_THROW(compressor.plan(nullptr, 32, keys.data(), 1000, 1000, 0, nullptr), Error);
  EXPECT_GT(
      cuda::DecodeCompressor::device_bytes(DecodeMethod::kAdaKV, params, 32, 8, 128, 32, 131072),
      size_t{0});
}

}  // namespace
}  // namespace entropyinfer

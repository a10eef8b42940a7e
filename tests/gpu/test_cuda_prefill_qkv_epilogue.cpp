// The fused q/k/v epilogue of a layer-by-layer prefill (backends/cuda/prefill_qkv_epilogue.h)
// against what it replaces: the CPU's RoPE (within one bf16 ulp, as apply_rope is held to), the
// separate GPU kernels (the same bits: rotated queries, key and value caches), the CPU's block
// extrema of the keys it wrote (the same bits) and the plans the estimator makes from its
// statistics and from its own kernels (identical).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/entropy_prefill.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/prefill_estimate.h"
#include "backends/cuda/prefill_qkv_epilogue.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

using cuda::bf16;
using gpu_test::download_bf16;
using gpu_test::random_bf16_values;
using gpu_test::upload_bf16;
using gpu_test::upload_floats;

constexpr double kBf16Relative = 1.0 / 128;  // one bf16 ulp, as the RoPE test allows

struct Case {
  int q_heads = 8;
  int kv_heads = 2;
  int head_dim = 128;
  bool adjacent = false;
  int64_t tokens = 1001;
  int64_t call_tokens = 256;  // tokens per call, a multiple of the segment
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, int64_t* differing) {
  *differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++*differing;
  }
  return *differing == 0;
}

void run_case(const Case& c) {
  const int D = c.head_dim, half = D / 2;
  const int heads = c.q_heads + 2 * c.kv_heads;
  const int64_t stride = static_cast<int64_t>(heads) * D + 8;  // fused rows with a gap
  const int64_t q_stride = static_cast<int64_t>(c.q_heads) * D + 16;
  const int64_t cache_stride = c.tokens + 24;
  const int64_t n = c.tokens;
  PrefillParams params;
  params.segment_size = 64;
  params.block_size = 8;
  params.sparse_threshold = 128;
  params.base_budget = 64;

  const auto qkv = random_bf16_values(static_cast<size_t>(n * stride), 21);
  const auto angles = gpu_test::random_floats(static_cast<size_t>(n * half), 22, 3.14159f);
  std::vector<float> cos(angles.size()), sin(angles.size());
  for (size_t i = 0; i < angles.size(); ++i) {
    cos[i] = std::cos(angles[i]);
    sin[i] = std::sin(angles[i]);
  }
  const auto qkv_gpu = upload_bf16(qkv);
  const auto cos_gpu = upload_floats(cos), sin_gpu = upload_floats(sin);

  // The CPU reference: q and k heads rotated, rounded to bf16 as they are stored.
  std::vector<float> rotated(static_cast<size_t>(n) * (c.q_heads + c.kv_heads) * D);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(qkv.begin() + t * stride, (c.q_heads + c.kv_heads) * D,
                rotated.begin() + t * (c.q_heads + c.kv_heads) * D);
  }
  cpu::apply_rope(rotated.data(), n, c.q_heads + c.kv_heads, D, cos.data(), sin.data(), D,
                  c.adjacent);
  for (float& value : rotated) value = bf16_to_f32(f32_to_bf16(value));

  // The fused pass, call by call, with the statistics going to an estimator.
  cuda::PrefillEstimator fused_estimator(c.q_heads, c.kv_heads, D, n, params, BudgetRule::kEntropy);
  cuda::DeviceBuffer<bf16> q_out(static_cast<size_t>(n * q_stride));
  cuda::DeviceBuffer<bf16> keys(static_cast<size_t>(c.kv_heads * cache_stride * D));
  cuda::DeviceBuffer<bf16> values(keys.size());
  gpu_test::poison(q_out);
  gpu_test::poison(keys);
  gpu_test::poison(values);
  cuda::PrefillQkvStats stats = fused_estimator.fused_stats();
  for (int64_t first = 0; first < n; first += c.call_tokens) {
    cuda::PrefillQkvShape shape;
    shape.tokens = std::min(c.call_tokens, n - first);
    shape.token_stride = stride;
    shape.q_heads = c.q_heads;
    shape.kv_heads = c.kv_heads;
    shape.head_dim = D;
    shape.adjacent_pairs = c.adjacent;
    shape.q_out_stride = q_stride;
    shape.cache_stride = cache_stride;
    shape.first_position = first;
    ASSERT_TRUE(cuda::prefill_qkv_epilogue_fits(
        qkv_gpu.data() + first * stride, shape, D, cos_gpu.data() + first * half,
        sin_gpu.data() + first * half, q_out.data() + first * q_stride, &stats));
    cuda::prefill_qkv_epilogue(qkv_gpu.data() + first * stride, shape,
                               cos_gpu.data() + first * half, sin_gpu.data() + first * half,
                               q_out.data() + first * q_stride, keys.data(), values.data(), &stats,
                               nullptr);
    fused_estimator.record_fused(first, shape.tokens);
  }
  const auto fused_q = download_bf16(q_out);
  const auto fused_keys = download_bf16(keys);
  const auto fused_values = download_bf16(values);

  // 1. Against the CPU: queries and keys within one bf16 ulp, values copied exactly.
  std::vector<float> got_q, want_q, got_k, want_k, got_v, want_v, key_slabs;
  key_slabs.assign(static_cast<size_t>(c.kv_heads * cache_stride * D), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < c.q_heads; ++h) {
      for (int d = 0; d < D; ++d) {
        got_q.push_back(fused_q[t * q_stride + h * D + d]);
        want_q.push_back(rotated[(t * (c.q_heads + c.kv_heads) + h) * D + d]);
      }
    }
    for (int h = 0; h < c.kv_heads; ++h) {
      for (int d = 0; d < D; ++d) {
        const size_t cache_index = (h * cache_stride + t) * D + d;
        got_k.push_back(fused_keys[cache_index]);
        want_k.push_back(rotated[(t * (c.q_heads + c.kv_heads) + c.q_heads + h) * D + d]);
        got_v.push_back(fused_values[cache_index]);
        want_v.push_back(qkv[t * stride + (c.q_heads + c.kv_heads + h) * D + d]);
        key_slabs[cache_index] = fused_keys[cache_index];
      }
    }
  }
  EXPECT_LE(gpu_test::worst_excess(got_q, want_q, kBf16Relative), 1e-5) << "queries";
  EXPECT_LE(gpu_test::worst_excess(got_k, want_k, kBf16Relative), 1e-5) << "keys";
  EXPECT_EQ(got_v, want_v) << "values";

  // 2. Against the separate kernels: the same bits.
  auto separate_qkv = upload_bf16(qkv);
  cuda::DeviceBuffer<bf16> separate_q(q_out.size()), separate_keys(keys.size()),
      separate_values(values.size());
  gpu_test::poison(separate_q);
  gpu_test::poison(separate_keys);
  gpu_test::poison(separate_values);
  cuda::apply_rope_queries_out(separate_qkv.data(), n, c.q_heads + c.kv_heads, D, stride,
                               cos_gpu.data(), sin_gpu.data(), D, c.adjacent, c.q_heads,
                               separate_q.data(), q_stride, nullptr);
  cuda::append_kv(separate_qkv.data() + c.q_heads * D,
                  separate_qkv.data() + (c.q_heads + c.kv_heads) * D, n, stride, c.kv_heads, D,
                  separate_keys.data(), separate_values.data(), cache_stride, 0, nullptr);
  int64_t differing = 0;
  EXPECT_TRUE(same_bits(fused_q, download_bf16(separate_q), &differing))
      << differing << " query elements differ from apply_rope_queries_out";
  EXPECT_TRUE(same_bits(fused_keys, download_bf16(separate_keys), &differing))
      << differing << " key cache elements differ from apply_rope + append_kv";
  EXPECT_TRUE(same_bits(fused_values, download_bf16(separate_values), &differing))
      << differing << " value cache elements differ from append_kv";

  // 3. The key-block extrema: those of the keys written, bit for bit.
  const HeadExtrema expected_extrema =
      block_key_extrema(key_slabs.data(), cache_stride, n, c.kv_heads, D, params.block_size);
  const HeadExtrema fused_extrema = fused_estimator.download_key_extrema(n, nullptr);
  EXPECT_EQ(fused_extrema.max, expected_extrema.max);
  EXPECT_EQ(fused_extrema.min, expected_extrema.min);

  // 4. The plan from the fused statistics equals the plan from the estimator's own kernels over
  // the same rotated queries and keys (the midpoints must then be the same bits too).
  cuda::PrefillEstimator own_estimator(c.q_heads, c.kv_heads, D, n, params, BudgetRule::kEntropy);
  own_estimator.record_key_blocks(keys.data(), cache_stride, 0, n, nullptr);
  own_estimator.estimate(q_out.data(), q_stride, n, 1, nullptr);
  const LayerPrefillPlan own = own_estimator.download_last(nullptr);
  fused_estimator.estimate(q_out.data(), q_stride, n, 1, nullptr);
  const LayerPrefillPlan fused = fused_estimator.download_last(nullptr);
  ASSERT_FALSE(own.dense);
  EXPECT_FALSE(fused.dense);
  EXPECT_EQ(fused.segment_sparse, own.segment_sparse);
  EXPECT_EQ(fused.row_offsets, own.row_offsets);
  EXPECT_EQ(fused.block_indices, own.block_indices);
  EXPECT_EQ(fused.entropy, own.entropy);
  EXPECT_EQ(fused.budget_tokens, own.budget_tokens);
  EXPECT_EQ(fused.rigid_head, own.rigid_head);
}

TEST(CudaPrefillQkvEpilogue, HalvesLayoutGroupFourMatchesCpuAndTheSeparateKernels) {
  ENTROPYINFER_REQUIRE_GPU();
  run_case(Case{});
}

TEST(CudaPrefillQkvEpilogue, LlamaHeadsFourToACtaMatchCpuAndTheSeparateKernels) {
  ENTROPYINFER_REQUIRE_GPU();
  Case c;
  c.q_heads = 32;
  c.kv_heads = 8;
  c.tokens = 700;
  c.call_tokens = 128;
  run_case(c);
}

TEST(CudaPrefillQkvEpilogue, AdjacentPairsGroupOneHeadDim64OneCall) {
  ENTROPYINFER_REQUIRE_GPU();
  Case c;
  c.q_heads = 4;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.adjacent = true;
  c.tokens = 517;
  c.call_tokens = 517;
  run_case(c);
}

TEST(CudaPrefillQkvEpilogue, HeadDims256And40AndCallsOfOneSegment) {
  ENTROPYINFER_REQUIRE_GPU();
  Case c;
  c.q_heads = 4;
  c.kv_heads = 1;
  c.head_dim = 256;
  c.tokens = 300;
  c.call_tokens = 64;
  run_case(c);
  c.head_dim = 40;
  c.adjacent = true;
  run_case(c);
}

TEST(CudaPrefillQkvEpilogue, ShapesItDoesNotTakeAreRefused) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::DeviceBuffer<bf16> buffer(1 << 16);
  cuda::DeviceBuffer<float> table(1 << 12);
  cuda::PrefillQkvShape shape;
  shape.tokens = 8;
  shape.token_stride = 6 * 128;
  shape.q_heads = 4;
  shape.kv_heads = 1;
  shape.head_dim = 128;
  shape.q_out_stride = 4 * 128;
  shape.cache_stride = 64;
  cuda::PrefillQkvStats stats;
  stats.segment_size = 64;
  stats.block_size = 8;
  stats.padded_dim = 128;
  const bf16* qkv = buffer.data();
  EXPECT_TRUE(cuda::prefill_qkv_epilogue_fits(qkv, shape, 128, table.data(), table.data(),
                                              buffer.data(), &stats));
  EXPECT_FALSE(cuda::prefill_qkv_epilogue_fits(qkv, shape, 64, table.data(), table.data(),
                                               buffer.data(), &stats))
      << "partial rotation";
  shape.first_position = 8;
  EXPECT_FALSE(cuda::prefill_qkv_epilogue_fits(qkv, shape, 128, table.data(), table.data(),
                                               buffer.data(), &stats))
      << "a segment split between calls";
  EXPECT_TRUE(cuda::prefill_qkv_epilogue_fits(qkv, shape, 128, table.data(), table.data(),
                                              buffer.data(), nullptr))
      << "without statistics any position will do";
  shape.first_position = 0;
  EXPECT_FALSE(cuda::prefill_qkv_epilogue_fits(qkv + 1, shape, 128, table.data(), table.data(),
                                               buffer.data(), &stats))
      << "unaligned rows";
  shape.head_dim = 36;
  EXPECT_FALSE(cuda::prefill_qkv_epilogue_fits(qkv, shape, 36, table.data(), table.data(),
                                               buffer.data(), nullptr))
      << "head_dim not a multiple of 8";
  shape.head_dim = 128;
  shape.cache_stride = 4;
  EXPECT_THROW(cuda::prefill_qkv_epilogue(qkv, shape, table.data(), table.data(), buffer.data(),
                                          buffer.data(), buffer.data(), &stats, nullptr),
               Error);
}

}  // namespace
}  // namespace entropyinfer

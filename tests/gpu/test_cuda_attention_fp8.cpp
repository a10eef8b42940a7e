// FP8 prefill attention (flash_prefill_fp8) against the host.
//
// Staging is checked bit for bit: every code follows core/fp8.h from the bf16 inputs, with one
// scale per KV head (the weight rule over all its staged keys), values transposed and permuted in
// groups of 32 as the kernel's P fragments need.
//
// The kernel is checked against cpu::causal_attention (fp32) over the same quantized inputs
// (queries per (token, head) row, keys and values per KV head), so what remains is the kernel's own
// rounding. Its bound: P is rounded to E4M3 after scaling by 256, a relative error of at most 2^-4
// per weight in E4M3's normal range, so |O - O_ref| <= 2^-4 * max|V| from those; weights below
// 2^-14 of their row's maximum (subnormal) err by at most 2^-18 each, at most keys * 2^-18 * max|V|
// in all; the bf16 output adds 2^-8 of |O|. The relative L2 error stays below the weights' own rms
// rounding error, 2^-4 / sqrt(3) = 0.036: at most 4e-2 (measured 1.1e-2 to 1.6e-2 on an H100).
//
// Against unquantized attention (the bf16 wgmma kernel on the same bf16 inputs), on a long prompt,
// E4M3 rounds each element of Q and K with a relative error of about 2^-4 / sqrt(3) rms, so a score
// of spread sigma moves by about 0.05 sigma (natural-log units); these scores have sigma about 2,
// and the output, an average over many keys, moves by about the same relative amount: relative L2
// <= 0.1 (measured 7.2e-2 on an H100).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/flash_attention.h"
#include "core/fp8.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

constexpr int kHeadDim = 128;

// The key held in column c of a staged group of 32 values: the wgmma 8-bit A fragment gives thread
// t of a quad columns 4t .. 4t+3 and 16 + 4t .. 19 + 4t; its fp32 scores are keys 2t, 2t+1 of each
// 8-key tile.
int key_of_column(int c) {
  const int in_half = c % 16;
  const int t = in_half / 4, i = in_half % 4;
  const int key_in_half = (i < 2 ? 0 : 8) + 2 * t + i % 2;
  return (c / 16) * 16 + key_in_half;
}

struct StagedHost {
  std::vector<uint8_t> keys, values;
  std::vector<float> amax;
};

struct Staging {
  int64_t stride;
  cuda::DeviceBuffer<uint8_t> codes;
  cuda::DeviceBuffer<float> amax;
  cuda::Fp8StagedKeys staged;
  Staging(int64_t kv_heads, int64_t keys)
      : stride(cuda::fp8_staged_stride(keys)),
        codes(cuda::fp8_staged_code_bytes(kv_heads, kHeadDim, keys)),
        amax(static_cast<size_t>(2 * kv_heads)) {
    staged.keys = codes.data();
    staged.values = codes.data() + kv_heads * stride * kHeadDim;
    staged.amax = amax.data();
    staged.kv_heads = kv_heads;
    staged.stride = stride;
  }
};

float largest_magnitude(const std::vector<float>& x, int64_t head, int64_t cache_stride,
                        int64_t keys) {
  float amax = 0.0f;
  for (int64_t i = 0; i < keys * kHeadDim; ++i)
    amax = std::max(amax, std::fabs(x[head * cache_stride * kHeadDim + i]));
  return amax;
}

TEST(CudaFp8Attention, StagingFollowsTheHostRulesAndLayout) {
  ENTROPYINFER_REQUIRE_GPU();
  const int64_t kv_heads = 3, keys = 300, cache_stride = 310;
  const auto k = gpu_test::random_bf16_values(kv_heads * cache_stride * kHeadDim, 11, 3.0f);
  const auto v = gpu_test::random_bf16_values(k.size(), 12, 0.5f);
  auto k_gpu = gpu_test::upload_bf16(k), v_gpu = gpu_test::upload_bf16(v);
  Staging staging(kv_heads, keys);
  ASSERT_EQ(staging.stride, 384);
  cuda::check(cudaMemset(staging.codes.data(), 0x5a, staging.codes.bytes()), "cudaMemset");
  cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), cache_stride, kHeadDim, keys, staging.staged,
                       nullptr);
  cuda::check(cudaDeviceSynchronize(), "staging");
  const auto codes = gpu_test::download(staging.codes);
  const auto amax = gpu_test::download(staging.amax);
  const uint8_t* key_codes = codes.data();
  const uint8_t* value_codes = codes.data() + kv_heads * staging.stride * kHeadDim;
  for (int64_t h = 0; h < kv_heads; ++h) {
    const float key_amax = largest_magnitude(k, h, cache_stride, keys);
    const float value_amax = largest_magnitude(v, h, cache_stride, keys);
    ASSERT_EQ(amax[h], key_amax) << "head " << h;
    ASSERT_EQ(amax[kv_heads + h], value_amax) << "head " << h;
    const float key_scale = fp8_weight_scale(key_amax);
    const float value_scale = fp8_weight_scale(value_amax);
    for (int64_t key = 0; key < staging.stride; ++key) {
      for (int d = 0; d < kHeadDim; ++d) {
        const size_t source = (h * cache_stride + key) * kHeadDim + d;
        const uint8_t expected = key < keys ? f32_to_fp8_e4m3(k[source] / key_scale) : 0;
        ASSERT_EQ(key_codes[(h * staging.stride + key) * kHeadDim + d], expected)
            << "key " << key << " of head " << h << ", column " << d;
      }
    }
    for (int d = 0; d < kHeadDim; ++d) {
      for (int64_t column = 0; column < staging.stride; ++column) {
        const int64_t key = column / 32 * 32 + key_of_column(static_cast<int>(column % 32));
        const uint8_t expected =
            key < keys ? f32_to_fp8_e4m3(v[(h * cache_stride + key) * kHeadDim + d] / value_scale)
                       : 0;
        ASSERT_EQ(value_codes[(h * kHeadDim + d) * staging.stride + column], expected)
            << "value column " << column << " (key " << key << ") of head " << h << ", dim " << d;
      }
    }
  }
}

struct Case {
  int q_heads;
  int kv_heads;
  int tokens;
  int first_position;
  int extra_q_stride = 0;
  int extra_out_stride = 0;
};

std::string describe(const Case& c) {
  return std::to_string(c.q_heads) + "/" + std::to_string(c.kv_heads) + " heads, " +
         std::to_string(c.tokens) + " tokens after " + std::to_string(c.first_position);
}

void run_case(const Case& c, uint32_t seed) {
  const int64_t keys = c.first_position + c.tokens;
  const int64_t cache_stride = keys + 5;
  const int64_t q_stride = static_cast<int64_t>(c.q_heads) * kHeadDim + c.extra_q_stride;
  const int64_t out_stride = static_cast<int64_t>(c.q_heads) * kHeadDim + c.extra_out_stride;
  const auto q = gpu_test::random_bf16_values(static_cast<size_t>(c.tokens) * q_stride, seed, 2.0f);
  const auto k = gpu_test::random_bf16_values(
      static_cast<size_t>(c.kv_heads) * cache_stride * kHeadDim, seed + 1);
  const auto v = gpu_test::random_bf16_values(k.size(), seed + 2, 1.0f, /*uniform=*/true);

  // The inputs as the kernel sees them after quantization.
  std::vector<float> q_packed(static_cast<size_t>(c.tokens) * c.q_heads * kHeadDim);
  for (int t = 0; t < c.tokens; ++t) {
    for (int h = 0; h < c.q_heads; ++h) {
      const float* row = q.data() + t * q_stride + h * kHeadDim;
      float* packed = q_packed.data() + (static_cast<size_t>(t) * c.q_heads + h) * kHeadDim;
      std::copy_n(row, kHeadDim, packed);
      fp8_kv_round_trip_row(packed, kHeadDim);
    }
  }
  std::vector<float> k_quantized = k, v_quantized = v;
  float value_amax_all = 0.0f;
  for (int h = 0; h < c.kv_heads; ++h) {
    const float key_scale = fp8_weight_scale(largest_magnitude(k, h, cache_stride, keys));
    const float value_amax = largest_magnitude(v, h, cache_stride, keys);
    value_amax_all = std::max(value_amax_all, value_amax);
    const float value_scale = fp8_weight_scale(value_amax);
    for (int64_t i = 0; i < keys * kHeadDim; ++i) {
      const size_t index = h * cache_stride * kHeadDim + i;
      k_quantized[index] = fp8_round_trip(k[index], key_scale);
      v_quantized[index] = fp8_round_trip(v[index], value_scale);
    }
  }
  cpu::AttentionShape cpu_shape;
  cpu_shape.tokens = c.tokens;
  cpu_shape.q_heads = c.q_heads;
  cpu_shape.kv_heads = c.kv_heads;
  cpu_shape.head_dim = kHeadDim;
  cpu_shape.first_position = c.first_position;
  cpu_shape.cache_stride = cache_stride;
  cpu_shape.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  std::vector<float> expected(q_packed.size());
  cpu::causal_attention(q_packed.data(), k_quantized.data(), v_quantized.data(), cpu_shape,
                        expected.data());

  auto q_gpu = gpu_test::upload_bf16(q);
  auto k_gpu = gpu_test::upload_bf16(k), v_gpu = gpu_test::upload_bf16(v);
  Staging staging(c.kv_heads, keys);
  cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), cache_stride, kHeadDim, keys, staging.staged,
                       nullptr);
  cuda::DeviceBuffer<cuda::bf16> out_gpu(static_cast<size_t>(c.tokens) * out_stride);
  gpu_test::poison(out_gpu);
  cuda::FlashShape shape;
  shape.tokens = c.tokens;
  shape.q_heads = c.q_heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = kHeadDim;
  shape.first_position = c.first_position;
  shape.q_token_stride = q_stride;
  shape.out_token_stride = out_stride;
  cuda::flash_prefill_fp8(q_gpu.data(), staging.staged, shape, out_gpu.data(), nullptr);
  cuda::check(cudaDeviceSynchronize(), "FP8 attention");
  const auto out_rows = gpu_test::download_bf16(out_gpu);
  std::vector<float> actual(expected.size());
  double output_max = 0;
  for (int t = 0; t < c.tokens; ++t) {
    std::copy_n(out_rows.begin() + t * out_stride, c.q_heads * kHeadDim,
                actual.begin() + t * c.q_heads * kHeadDim);
  }
  for (float x : expected) output_max = std::max(output_max, std::fabs(static_cast<double>(x)));
  const double bound =
      (0x1p-4 + static_cast<double>(keys) * 0x1p-18) * value_amax_all + 0x1p-8 * output_max;
  const auto difference = gpu_test::compare(actual, expected);
  EXPECT_EQ(difference.non_finite, 0) << describe(c);
  EXPECT_LE(difference.relative_l2, 4e-2) << describe(c);
  EXPECT_LE(difference.max_abs_error, bound)
      << describe(c) << " (worst at " << difference.worst_index << ")";
  std::printf("[fp8 attention] %s: relative L2 %.2e, max |error| %.2e (bound %.2e)\n",
              describe(c).c_str(), difference.relative_l2, difference.max_abs_error, bound);
}

TEST(CudaFp8Attention, PrefillMatchesTheCpuOverQuantizedInputs) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const std::vector<Case> cases = {
      {8, 2, 1, 0},     {8, 2, 37, 0},   {32, 8, 300, 0},   {8, 1, 513, 129},
      {6, 2, 1000, 0},  {8, 8, 2048, 0}, {12, 4, 45, 3000}, {4, 2, 96, 64, 256, 128},
      {16, 2, 700, 31},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) run_case(c, seed += 3);
}

TEST(CudaFp8Attention, StaysCloseToBf16AttentionOnALongPrompt) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const int tokens = 8192, q_heads = 32, kv_heads = 8;
  const auto q =
      gpu_test::random_bf16_values(static_cast<size_t>(tokens) * q_heads * kHeadDim, 900, 2.0f);
  const auto k =
      gpu_test::random_bf16_values(static_cast<size_t>(kv_heads) * tokens * kHeadDim, 901);
  const auto v = gpu_test::random_bf16_values(k.size(), 902, 1.0f, true);
  auto q_gpu = gpu_test::upload_bf16(q), k_gpu = gpu_test::upload_bf16(k),
       v_gpu = gpu_test::upload_bf16(v);
  cuda::DeviceBuffer<cuda::bf16> out_bf16(q.size()), out_fp8(q.size());
  gpu_test::poison(out_fp8);
  cuda::FlashShape shape;
  shape.tokens = tokens;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = kHeadDim;
  shape.cache_stride = tokens;
  Staging staging(kv_heads, tokens);
  cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_bf16.data(), nullptr,
                      cuda::FlashKernel::kWgmma);
  cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), tokens, kHeadDim, tokens, staging.staged,
                       nullptr);
  cuda::flash_prefill_fp8(q_gpu.data(), staging.staged, shape, out_fp8.data(), nullptr);
  cuda::check(cudaDeviceSynchronize(), "attention kernels");
  const auto difference =
      gpu_test::compare(gpu_test::download_bf16(out_fp8), gpu_test::download_bf16(out_bf16));
  EXPECT_EQ(difference.non_finite, 0);
  EXPECT_LE(difference.relative_l2, 0.1);
  std::printf("[fp8 attention] 8192 tokens against bf16: relative L2 %.2e, max |error| %.2e\n",
              difference.relative_l2, difference.max_abs_error);
}

TEST(CudaFp8Attention, RejectsWhatItCannotRun) {
  ENTROPYINFER_REQUIRE_GPU();
  Staging staging(2, 64);
  cuda::FlashShape shape;
  shape.tokens = 4;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 64;
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.staged, shape, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::stage_fp8_keys(nullptr, nullptr, 64, 64, 64, staging.staged, nullptr), Error);
  shape.head_dim = 128;
  shape.kv_heads = 4;  // not what was staged
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.staged, shape, nullptr, nullptr), Error);
  shape.kv_heads = 2;
  shape.first_position = 126;  // keys past the staged 128
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.staged, shape, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::stage_fp8_keys(nullptr, nullptr, 100, 128, 200, staging.staged, nullptr),
               Error);
}

}  // namespace
}  // namespace entropyinfer

// The attention kernels against cpu::causal_attention (fp32) on random bf16 inputs: both prefill
// kernels (mma.sync and Hopper wgmma) and split-KV decoding, for head sizes 64 and 128, group sizes
// 1 to 8, chunked prefill after cached tokens, and strided query/output rows.
//
// Tolerance: the kernels round the softmax weights P to bf16 before P*V (relative 2^-9 each) and
// round the output to bf16 (relative 2^-9); scores and sums stay fp32. Expected error is a few 1e-3
// of the output's scale, so each case must reach relative L2 error <= 1e-2 and max |error| <= 2e-2
// (outputs are O(1): V is uniform in [-1, 1]). Outputs are poisoned with NaN first: every element
// must be written.
#include <gtest/gtest.h>

#include <string>

#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/flash_attention.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

constexpr double kMaxRelativeL2 = 1e-2;
constexpr double kMaxAbsError = 2e-2;

struct Case {
  int head_dim;
  int q_heads;
  int kv_heads;
  int tokens;
  int first_position;
  int extra_q_stride = 0;    // query rows wider than q_heads * head_dim (a fused QKV buffer)
  int extra_out_stride = 0;  // output rows wider than q_heads * head_dim
};

std::string describe(const Case& c) {
  return "head_dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.q_heads) + "/" +
         std::to_string(c.kv_heads) + " heads, " + std::to_string(c.tokens) + " tokens after " +
         std::to_string(c.first_position);
}

enum class Mode { kPrefillMma, kPrefillWgmma, kPrefillWgmmaSimple, kDecode };

// Runs one case on the GPU and the CPU; returns {gpu, cpu} outputs as [tokens][q_heads][head_dim].
void run_case(const Case& c, Mode mode, int splits, uint32_t seed) {
  const int64_t keys = c.first_position + c.tokens;
  const int64_t cache_stride = keys + 7;  // rows past the filled ones must never be read
  const int64_t q_stride = static_cast<int64_t>(c.q_heads) * c.head_dim + c.extra_q_stride;
  const int64_t out_stride = static_cast<int64_t>(c.q_heads) * c.head_dim + c.extra_out_stride;
  // Scores of a few units: a peaked softmax whose running maximum moves between key tiles.
  const auto q = gpu_test::random_bf16_values(static_cast<size_t>(c.tokens) * q_stride, seed, 2.0f);
  const auto k = gpu_test::random_bf16_values(
      static_cast<size_t>(c.kv_heads) * cache_stride * c.head_dim, seed + 1);
  const auto v = gpu_test::random_bf16_values(k.size(), seed + 2, 1.0f, /*uniform=*/true);

  std::vector<float> q_packed(static_cast<size_t>(c.tokens) * c.q_heads * c.head_dim);
  for (int t = 0; t < c.tokens; ++t) {
    std::copy_n(q.begin() + t * q_stride, c.q_heads * c.head_dim,
                q_packed.begin() + t * c.q_heads * c.head_dim);
  }
  cpu::AttentionShape cpu_shape;
  cpu_shape.tokens = c.tokens;
  cpu_shape.q_heads = c.q_heads;
  cpu_shape.kv_heads = c.kv_heads;
  cpu_shape.head_dim = c.head_dim;
  cpu_shape.first_position = c.first_position;
  cpu_shape.cache_stride = cache_stride;
  cpu_shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<float> expected(q_packed.size());
  cpu::causal_attention(q_packed.data(), k.data(), v.data(), cpu_shape, expected.data());

  auto q_gpu = gpu_test::upload_bf16(q);
  auto k_gpu = gpu_test::upload_bf16(k), v_gpu = gpu_test::upload_bf16(v);
  cuda::DeviceBuffer<cuda::bf16> out_gpu(static_cast<size_t>(c.tokens) * out_stride);
  gpu_test::poison(out_gpu);
  cuda::FlashShape shape;
  shape.tokens = c.tokens;
  shape.q_heads = c.q_heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.first_position = c.first_position;
  shape.cache_stride = cache_stride;
  shape.q_token_stride = q_stride;
  shape.out_token_stride = out_stride;
  if (mode == Mode::kDecode) {
    const int resolved = cuda::flash_decode_splits(shape, splits);
    cuda::DeviceBuffer<float> workspace(
        std::max<size_t>(1, cuda::flash_decode_workspace_floats(shape, resolved)));
    cuda::flash_decode(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_gpu.data(),
                       workspace.data(), workspace.size(), nullptr, resolved);
  } else {
    const cuda::FlashKernel kernel = mode == Mode::kPrefillMma ? cuda::FlashKernel::kMma
                                     : mode == Mode::kPrefillWgmma
                                         ? cuda::FlashKernel::kWgmma
                                         : cuda::FlashKernel::kWgmmaSimple;
    cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_gpu.data(), nullptr,
                        kernel);
  }
  cuda::check(cudaDeviceSynchronize(), "attention kernel");
  const auto out_rows = gpu_test::download_bf16(out_gpu);
  std::vector<float> actual(expected.size());
  for (int t = 0; t < c.tokens; ++t) {
    std::copy_n(out_rows.begin() + t * out_stride, c.q_heads * c.head_dim,
                actual.begin() + t * c.q_heads * c.head_dim);
  }
  const auto difference = gpu_test::compare(actual, expected);
  EXPECT_EQ(difference.non_finite, 0) << describe(c);
  EXPECT_LE(difference.relative_l2, kMaxRelativeL2) << describe(c);
  EXPECT_LE(difference.max_abs_error, kMaxAbsError)
      << describe(c) << " (worst at " << difference.worst_index << ")";
}

const std::vector<Case> kPrefillCases = {
    {128, 8, 2, 1, 0},    {128, 8, 2, 37, 0},     {128, 32, 8, 300, 0},          {64, 4, 4, 130, 0},
    {64, 14, 2, 77, 200}, {128, 8, 1, 513, 129},  {128, 6, 2, 1000, 0},          {64, 8, 2, 700, 0},
    {128, 8, 2, 2048, 0}, {128, 12, 4, 45, 3000}, {128, 4, 2, 96, 64, 256, 128},
};

TEST(CudaAttention, MmaPrefillMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  uint32_t seed = 100;
  for (const Case& c : kPrefillCases) run_case(c, Mode::kPrefillMma, 0, seed += 3);
}

TEST(CudaAttention, WgmmaPrefillMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::wgmma_attention_available())
    GTEST_SKIP() << "the wgmma kernel needs an sm_90a build on a Hopper GPU";
  uint32_t seed = 200;
  for (const Case& c : kPrefillCases) run_case(c, Mode::kPrefillWgmma, 0, seed += 3);
}

TEST(CudaAttention, WgmmaSimplePrefillMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::wgmma_attention_available()) {
    GTEST_SKIP() << "the wgmma kernel needs an sm_90a build on a Hopper GPU";
  }
  uint32_t seed = 500;
  for (const Case& c : kPrefillCases) run_case(c, Mode::kPrefillWgmmaSimple, 0, seed += 3);
}

TEST(CudaAttention, SplitKvDecodeMatchesCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::vector<Case> cases = {
      {128, 32, 8, 1, 0},   {128, 32, 8, 1, 1},
      {128, 32, 8, 1, 999}, {128, 8, 2, 1, 4500},
      {64, 14, 2, 1, 3000}, {128, 8, 8, 1, 257},
      {128, 8, 2, 3, 700},  {128, 4, 1, 1, 20000, 128, 64},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    for (int splits : {1, 0, 7}) {
      SCOPED_TRACE("splits " + std::to_string(splits));
      run_case(c, Mode::kDecode, splits, seed += 3);
    }
  }
}

TEST(CudaAttention, WgmmaAndMmaAgreeOnLongPrompt) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::wgmma_attention_available())
    GTEST_SKIP() << "the wgmma kernel needs an sm_90a build on a Hopper GPU";
  const int tokens = 8192, q_heads = 32, kv_heads = 8, head_dim = 128;
  const auto q =
      gpu_test::random_bf16_values(static_cast<size_t>(tokens) * q_heads * head_dim, 400, 2.0f);
  const auto k =
      gpu_test::random_bf16_values(static_cast<size_t>(kv_heads) * tokens * head_dim, 401);
  const auto v = gpu_test::random_bf16_values(k.size(), 402, 1.0f, true);
  auto q_gpu = gpu_test::upload_bf16(q), k_gpu = gpu_test::upload_bf16(k),
       v_gpu = gpu_test::upload_bf16(v);
  cuda::DeviceBuffer<cuda::bf16> out_mma(q.size()), out_wgmma(q.size());
  gpu_test::poison(out_mma);
  gpu_test::poison(out_wgmma);
  cuda::FlashShape shape;
  shape.tokens = tokens;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.cache_stride = tokens;
  cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_mma.data(), nullptr,
                      cuda::FlashKernel::kMma);
  cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_wgmma.data(), nullptr,
                      cuda::FlashKernel::kWgmma);
  cuda::check(cudaDeviceSynchronize(), "attention kernels");
  const auto a = gpu_test::download_bf16(out_mma), b = gpu_test::download_bf16(out_wgmma);
  const auto difference = gpu_test::compare(b, a);
  EXPECT_EQ(difference.non_finite, 0);
  EXPECT_LE(difference.relative_l2, kMaxRelativeL2);
  EXPECT_LE(difference.max_abs_error, kMaxAbsError);
}

TEST(CudaAttention, RejectsUnsupportedShapesWithOneMessage) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::FlashShape shape;
  shape.tokens = 4;
  shape.q_heads = 8;
  shape.kv_heads = 3;
  shape.head_dim = 128;
  shape.cache_stride = 16;
  EXPECT_THROW(cuda::flash_prefill(nullptr, nullptr, nullptr, shape, nullptr, nullptr), Error);
  shape.kv_heads = 2;
  shape.head_dim = 96;
  EXPECT_THROW(cuda::flash_prefill(nullptr, nullptr, nullptr, shape, nullptr, nullptr), Error);
  shape.head_dim = 128;
  shape.first_position = 14;  // 14 + 4 rows do not fit a stride of 16
  EXPECT_THROW(cuda::flash_prefill(nullptr, nullptr, nullptr, shape, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace entropyinfer

// Block-sparse prefill (cuda::flash_prefill_block_sparse) against cpu::block_sparse_attention
// (fp32) on random bf16 inputs and random plans made on the host: rows of every length (empty,
// a few blocks, a random subset, every visible block), dense and sparse segments mixed, segment
// sizes from 16 to 512, block sizes from 1 to 200 (larger than a key tile), group sizes 1 to 8,
// head sizes 64 and 128, prompt lengths that are no multiple of a tile; on the mma kernel and
// both wgmma kernels wherever the shape allows them. Also: a dense layer plan, a plan that selects
// every visible block (the same result as flash_prefill), and the errors for shapes no kernel runs.
//
// Tolerance as in test_cuda_attention.cpp: P and the output are rounded to bf16 (relative 2^-9
// each), scores and sums stay fp32, so each case must reach relative L2 error <= 1e-2 and max
// |error| <= 2e-2 (outputs are O(1): V is uniform in [-1, 1]). Outputs are poisoned with NaN
// first (every element must be written), and so are the cache rows past the prompt (no kernel
// may read them, not even for a masked key).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"
#include "core/error.h"
#include "gpu/gpu_test_support.h"
#include "gpu/sparse_plan_support.h"

namespace entropyinfer {
namespace {

using gpu_test::random_plan;
using gpu_test::RowChoice;

constexpr double kMaxRelativeL2 = 1e-2;
constexpr double kMaxAbsError = 2e-2;

struct SparseCase {
  int head_dim;
  int q_heads;
  int kv_heads;
  int tokens;
  int segment_size;
  int block_size;
};

std::string describe(const SparseCase& c) {
  return "head_dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.q_heads) + "/" +
         std::to_string(c.kv_heads) + " heads, " + std::to_string(c.tokens) + " tokens, segment " +
         std::to_string(c.segment_size) + ", block " + std::to_string(c.block_size);
}

// Inputs of one case: q [tokens][q_heads][head_dim]; caches per KV head [cache_stride][head_dim]
// with rows past the prompt NaN on the GPU (the CPU never reads them).
struct Inputs {
  SparseCase shape_case;
  int64_t cache_stride = 0;
  std::vector<float> q, k, v;
  cuda::DeviceBuffer<cuda::bf16> q_gpu, k_gpu, v_gpu;

  Inputs(const SparseCase& c, uint32_t seed) : shape_case(c), cache_stride(c.tokens + 5) {
    // Scores of a few units: a peaked softmax whose running maximum moves between key tiles.
    q = gpu_test::random_bf16_values(static_cast<size_t>(c.tokens) * c.q_heads * c.head_dim, seed,
                                     2.0f);
    k = gpu_test::random_bf16_values(static_cast<size_t>(c.kv_heads) * cache_stride * c.head_dim,
                                     seed + 1);
    v = gpu_test::random_bf16_values(k.size(), seed + 2, 1.0f, /*uniform=*/true);
    q_gpu = gpu_test::upload_bf16(q);
    std::vector<float> k_poisoned = k, v_poisoned = v;
    for (int h = 0; h < c.kv_heads; ++h) {
      for (int64_t row = c.tokens; row < cache_stride; ++row) {
        const size_t first = (static_cast<size_t>(h) * cache_stride + row) * c.head_dim;
        std::fill_n(k_poisoned.begin() + first, c.head_dim, NAN);
        std::fill_n(v_poisoned.begin() + first, c.head_dim, NAN);
      }
    }
    k_gpu = gpu_test::upload_bf16(k_poisoned);
    v_gpu = gpu_test::upload_bf16(v_poisoned);
  }

  cpu::AttentionShape cpu_shape() const {
    cpu::AttentionShape shape;
    shape.tokens = shape_case.tokens;
    shape.q_heads = shape_case.q_heads;
    shape.kv_heads = shape_case.kv_heads;
    shape.head_dim = shape_case.head_dim;
    shape.cache_stride = cache_stride;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(shape_case.head_dim));
    return shape;
  }
  cuda::FlashShape gpu_shape() const {
    cuda::FlashShape shape;
    shape.tokens = shape_case.tokens;
    shape.q_heads = shape_case.q_heads;
    shape.kv_heads = shape_case.kv_heads;
    shape.head_dim = shape_case.head_dim;
    shape.cache_stride = cache_stride;
    return shape;
  }

  // The keys each side's kernel says it read in its last call: per KV head on the CPU, summed over
  // query heads (the packed rows) on the GPU.
  int64_t cpu_keys_read = 0;
  unsigned long long gpu_keys_read = 0;

  std::vector<float> cpu_sparse(const LayerPrefillPlan& plan) {
    std::vector<float> out(q.size());
    cpu_keys_read =
        cpu::block_sparse_attention(q.data(), k.data(), v.data(), cpu_shape(), plan, out.data());
    return out;
  }
  std::vector<float> gpu_sparse(const cuda::DevicePrefillPlan& plan, cuda::FlashKernel kernel) {
    cuda::DeviceBuffer<cuda::bf16> out(q.size());
    cuda::DeviceBuffer<unsigned long long> counter(1);
    cuda::check(cudaMemset(counter.data(), 0, sizeof(unsigned long long)), "counter");
    gpu_test::poison(out);
    cuda::flash_prefill_block_sparse(q_gpu.data(), k_gpu.data(), v_gpu.data(), gpu_shape(), plan,
                                     out.data(), nullptr, kernel, counter.data());
    cuda::check(cudaDeviceSynchronize(), "block-sparse attention");
    cuda::check(
        cudaMemcpy(&gpu_keys_read, counter.data(), sizeof(gpu_keys_read), cudaMemcpyDeviceToHost),
        "counter");
    return gpu_test::download_bf16(out);
  }
  std::vector<float> gpu_dense(cuda::FlashKernel kernel) {
    cuda::DeviceBuffer<cuda::bf16> out(q.size());
    gpu_test::poison(out);
    cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), gpu_shape(), out.data(), nullptr,
                        kernel);
    cuda::check(cudaDeviceSynchronize(), "dense attention");
    return gpu_test::download_bf16(out);
  }
};

const char* kernel_name(cuda::FlashKernel kernel) {
  switch (kernel) {
    case cuda::FlashKernel::kMma:
      return "mma";
    case cuda::FlashKernel::kWgmma:
      return "wgmma";
    case cuda::FlashKernel::kWgmmaSimple:
      return "wgmma_simple";
    default:
      return "auto";
  }
}

// The kernels that can run the case: a tile of packed rows (64 for mma, 128 for wgmma) must lie
// in one segment.
std::vector<cuda::FlashKernel> kernels_for(const SparseCase& c) {
  const int segment_rows = c.segment_size * (c.q_heads / c.kv_heads);
  std::vector<cuda::FlashKernel> kernels;
  if (segment_rows % 64 == 0) kernels.push_back(cuda::FlashKernel::kMma);
  if (segment_rows % 128 == 0 && cuda::wgmma_attention_available()) {
    kernels.push_back(cuda::FlashKernel::kWgmma);
    kernels.push_back(cuda::FlashKernel::kWgmmaSimple);
  }
  return kernels;
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::string& what) {
  const auto difference = gpu_test::compare(actual, expected);
  std::cout << "[ measure ] " << what << ": max |error| " << difference.max_abs_error
            << ", relative L2 " << difference.relative_l2 << "\n";
  EXPECT_EQ(difference.non_finite, 0) << what;
  EXPECT_LE(difference.relative_l2, kMaxRelativeL2) << what;
  EXPECT_LE(difference.max_abs_error, kMaxAbsError)
      << what << " (worst at " << difference.worst_index << ")";
}

const std::vector<SparseCase> kCases = {
    // head_dim, q_heads, kv_heads, tokens, segment_size, block_size
    {128, 8, 2, 1000, 128, 8},    // group 4: 512 rows per segment, every kernel
    {64, 4, 4, 777, 128, 16},     // group 1: 128 rows per segment
    {128, 4, 4, 600, 256, 5},     // a block size that divides neither segments nor tiles
    {64, 8, 2, 450, 32, 3},       // segments of exactly one wgmma tile of rows
    {128, 8, 2, 200, 16, 4},      // 64 rows per segment: mma only
    {64, 4, 4, 333, 64, 7},       // 64 rows per segment: mma only
    {128, 8, 2, 1300, 512, 200},  // blocks longer than a key tile
    {64, 8, 2, 1300, 512, 1},     // one-key blocks
    {128, 8, 2, 96, 32, 8},       // fewer tokens than a tile of rows
    {128, 32, 8, 2100, 512, 8},   // the defaults (S 512, b 8) on a real head layout
    {64, 6, 2, 500, 128, 8},      // group 3: tiles of rows split a token's heads
    {128, 8, 1, 300, 16, 8},      // group 8: 128 rows per segment
};

TEST(CudaBlockSparse, MatchesCpuReferenceOnRandomPlans) {
  ENTROPYINFER_REQUIRE_GPU();
  uint32_t seed = 1000;
  for (const SparseCase& c : kCases) {
    Inputs inputs(c, seed += 7);
    const LayerPrefillPlan plan =
        random_plan(c.tokens, c.kv_heads, c.segment_size, c.block_size, RowChoice::kMixed, seed);
    const auto expected = inputs.cpu_sparse(plan);
    const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
    const auto kernels = kernels_for(c);
    ASSERT_FALSE(kernels.empty()) << describe(c);
    const int64_t group = c.q_heads / c.kv_heads;
    EXPECT_EQ(inputs.cpu_keys_read, plan.keys_read()) << describe(c);
    for (const cuda::FlashKernel kernel : kernels) {
      expect_close(inputs.gpu_sparse(device_plan.view, kernel), expected,
                   describe(c) + ", " + kernel_name(kernel));
      // The kernel's own count of what its masks admitted, against the CPU kernel's.
      EXPECT_EQ(static_cast<int64_t>(inputs.gpu_keys_read), inputs.cpu_keys_read * group)
          << describe(c) << ", " << kernel_name(kernel);
    }
    // kAuto picks one of them.
    expect_close(inputs.gpu_sparse(device_plan.view, cuda::FlashKernel::kAuto), expected,
                 describe(c) + ", auto");
  }
}

// Every visible block of every row: the same keys as causal attention. With segments a multiple
// of the key tiles (64 and 128 keys) the virtual key sequence is the dense one, tile for tile, so
// the result must equal flash_prefill's bit for bit; otherwise within the bf16 bound.
TEST(CudaBlockSparse, EveryVisibleBlockEqualsDensePrefill) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::vector<SparseCase> cases = {
      {128, 8, 2, 1100, 512, 8},
      {64, 4, 4, 700, 128, 16},
      {128, 8, 2, 500, 96, 8},  // 96-key segments: tiles mix selected and own keys
  };
  uint32_t seed = 2000;
  for (const SparseCase& c : cases) {
    Inputs inputs(c, seed += 7);
    const LayerPrefillPlan plan = random_plan(c.tokens, c.kv_heads, c.segment_size, c.block_size,
                                              RowChoice::kAllVisible, seed);
    ASSERT_EQ(plan.keys_read(), plan.keys_read_dense()) << describe(c);
    const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
    const bool same_tiles = c.segment_size % 128 == 0;
    for (const cuda::FlashKernel kernel : kernels_for(c)) {
      const std::string what = describe(c) + ", " + kernel_name(kernel) + ", vs flash_prefill";
      const auto sparse = inputs.gpu_sparse(device_plan.view, kernel);
      const auto dense = inputs.gpu_dense(kernel);
      expect_close(sparse, dense, what);
      if (same_tiles) {
        EXPECT_EQ(gpu_test::compare(sparse, dense).max_abs_error, 0.0) << what;
      }
    }
  }
}

TEST(CudaBlockSparse, DenseLayerPlanRunsFlashPrefill) {
  ENTROPYINFER_REQUIRE_GPU();
  const SparseCase c = {128, 8, 2, 700, 512, 8};
  Inputs inputs(c, 3000);
  LayerPrefillPlan plan;  // dense: no rows
  plan.dense = true;
  std::vector<float> expected(inputs.q.size());
  cpu::causal_attention(inputs.q.data(), inputs.k.data(), inputs.v.data(), inputs.cpu_shape(),
                        expected.data());
  const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
  for (const cuda::FlashKernel kernel : kernels_for(c)) {
    const auto sparse = inputs.gpu_sparse(device_plan.view, kernel);
    expect_close(sparse, expected, describe(c) + ", dense plan, " + kernel_name(kernel));
    EXPECT_EQ(gpu_test::compare(sparse, inputs.gpu_dense(kernel)).max_abs_error, 0.0);
  }
}

// Checks made on the host before anything runs: these need no GPU.
TEST(CudaBlockSparse, RejectsPlansThatDoNotFitTheCall) {
  cuda::FlashShape shape;
  shape.tokens = 100;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 128;
  shape.cache_stride = 100;
  cuda::DevicePrefillPlan plan;
  plan.dense = false;
  plan.num_tokens = 100;
  plan.num_kv_heads = 2;
  plan.segment_size = 32;
  plan.block_size = 8;
  plan.num_segments = 4;
  auto call = [&] {
    cuda::flash_prefill_block_sparse(nullptr, nullptr, nullptr, shape, plan, nullptr, nullptr);
  };
  EXPECT_THROW(call(), Error);  // the plan's arrays are missing
  shape.first_position = 3;
  EXPECT_THROW(call(), Error);
  shape.first_position = 0;
  plan.num_tokens = 99;
  EXPECT_THROW(call(), Error);
  plan.num_tokens = 100;
  plan.num_kv_heads = 1;
  EXPECT_THROW(call(), Error);
  plan.num_kv_heads = 2;
  plan.num_segments = 3;
  EXPECT_THROW(call(), Error);
  plan.num_segments = 4;
  plan.block_size = 0;
  EXPECT_THROW(call(), Error);
}

TEST(CudaBlockSparse, RejectsSegmentsThatSplitATileOfRows) {
  ENTROPYINFER_REQUIRE_GPU();
  // 8 tokens * group 4 = 32 rows per segment: neither kernel's tile (64 or 128 rows) fits in one.
  const SparseCase c = {128, 8, 2, 100, 8, 4};
  Inputs inputs(c, 4000);
  const auto plan =
      random_plan(c.tokens, c.kv_heads, c.segment_size, c.block_size, RowChoice::kMixed, 4000);
  const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
  for (const cuda::FlashKernel kernel :
       {cuda::FlashKernel::kAuto, cuda::FlashKernel::kMma, cuda::FlashKernel::kWgmma}) {
    try {
      inputs.gpu_sparse(device_plan.view, kernel);
      ADD_FAILURE() << kernel_name(kernel) << " ran a shape it cannot";
    } catch (const Error& error) {
      const std::string message = error.what();
      if (kernel != cuda::FlashKernel::kWgmma || cuda::wgmma_attention_available()) {
        EXPECT_NE(message.find("segment_size * (q_heads / kv_heads)"), std::string::npos)
            << message;
      }
    }
  }
  // 16-token segments (64 rows) run on the mma kernel only.
  const SparseCase mma_only = {128, 8, 2, 100, 16, 4};
  const auto plan16 = random_plan(mma_only.tokens, mma_only.kv_heads, mma_only.segment_size,
                                  mma_only.block_size, RowChoice::kMixed, 4001);
  const auto device_plan16 = cuda::DevicePrefillPlanStorage::upload(plan16);
  Inputs inputs16(mma_only, 4001);
  EXPECT_THROW(inputs16.gpu_sparse(device_plan16.view, cuda::FlashKernel::kWgmma), Error);
  expect_close(inputs16.gpu_sparse(device_plan16.view, cuda::FlashKernel::kAuto),
               inputs16.cpu_sparse(plan16), describe(mma_only) + ", auto");
}

}  // namespace
}  // namespace entropyinfer

// FP8 prefill attention (flash_prefill_fp8) against the host.
//
// Staging is checked bit for bit: every code follows core/fp8.h from the bf16 inputs, with one
// scale per KV head (the weight rule over all its staged keys), values transposed within runs of
// 8 keys.
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
//
// Block-sparse FP8 prefill (flash_prefill_block_sparse_fp8) is checked against
// cpu::block_sparse_attention over the same quantized inputs with the same bound, on random plans
// (gpu/sparse_plan_support.h) of the shapes it runs (blocks and segments multiples of 8 keys), with
// its count of keys read against the CPU's; a plan selecting every visible block, with segments a
// multiple of the key tile, must reproduce flash_prefill_fp8 bit for bit (the same tiles in the
// same order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"
#include "core/fp8.h"
#include "gpu/gpu_test_support.h"
#include "gpu/sparse_plan_support.h"

namespace entropyinfer {
namespace {

using Staging = cuda::Fp8StagingBuffers;

float largest_magnitude(const std::vector<float>& x, int64_t head, int64_t cache_stride,
                        int64_t keys, int64_t head_dim) {
  float amax = 0.0f;
  for (int64_t i = 0; i < keys * head_dim; ++i)
    amax = std::max(amax, std::fabs(x[head * cache_stride * head_dim + i]));
  return amax;
}

TEST(CudaFp8Attention, StagingFollowsTheHostRulesAndLayout) {
  ENTROPYINFER_REQUIRE_GPU();
  for (const int head_dim : {128, 64}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const int64_t kv_heads = 3, keys = 300, cache_stride = 310;
    const auto k = gpu_test::random_bf16_values(kv_heads * cache_stride * head_dim, 11, 3.0f);
    const auto v = gpu_test::random_bf16_values(k.size(), 12, 0.5f);
    auto k_gpu = gpu_test::upload_bf16(k), v_gpu = gpu_test::upload_bf16(v);
    Staging staging(kv_heads, head_dim, keys);
    ASSERT_EQ(staging.view.stride, 384);
    cuda::check(cudaMemset(staging.codes.data(), 0x5a, staging.codes.bytes()), "cudaMemset");
    cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), cache_stride, head_dim, keys, staging.view,
                         nullptr);
    cuda::check(cudaDeviceSynchronize(), "staging");
    const auto codes = gpu_test::download(staging.codes);
    const auto amax = gpu_test::download(staging.amax);
    const uint8_t* key_codes = codes.data();
    const uint8_t* value_codes = codes.data() + kv_heads * staging.view.stride * head_dim;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float key_amax = largest_magnitude(k, h, cache_stride, keys, head_dim);
      const float value_amax = largest_magnitude(v, h, cache_stride, keys, head_dim);
      ASSERT_EQ(amax[h], key_amax) << "head " << h;
      ASSERT_EQ(amax[kv_heads + h], value_amax) << "head " << h;
      const float key_scale = fp8_weight_scale(key_amax);
      const float value_scale = fp8_weight_scale(value_amax);
      for (int64_t key = 0; key < staging.view.stride; ++key) {
        for (int d = 0; d < head_dim; ++d) {
          const size_t source = (h * cache_stride + key) * head_dim + d;
          const uint8_t expected = key < keys ? f32_to_fp8_e4m3(k[source] / key_scale) : 0;
          ASSERT_EQ(key_codes[(h * staging.view.stride + key) * head_dim + d], expected)
              << "key " << key << " of head " << h << ", column " << d;
        }
      }
      for (int d = 0; d < head_dim; ++d) {
        for (int64_t key = 0; key < staging.view.stride; ++key) {
          const uint8_t expected =
              key < keys ? f32_to_fp8_e4m3(v[(h * cache_stride + key) * head_dim + d] / value_scale)
                         : 0;
          // Transposed within runs of 8 keys: [stride / 8][head_dim][8] per head.
          const int64_t at = (h * staging.view.stride + key / 8 * 8) * head_dim + d * 8 + key % 8;
          ASSERT_EQ(value_codes[at], expected)
              << "value of key " << key << " of head " << h << ", dim " << d;
        }
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
  int head_dim = 128;
};

std::string describe(const Case& c) {
  return "head_dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.q_heads) + "/" +
         std::to_string(c.kv_heads) + " heads, " + std::to_string(c.tokens) + " tokens after " +
         std::to_string(c.first_position);
}

// Random bf16 inputs of a case on both sides: the GPU stages them, and the host holds them as the
// kernel sees them after quantization (queries per (token, head) row packed [tokens][q_heads][d],
// keys and values per KV head over every key of the prompt).
struct QuantizedInputs {
  Case shape_case;
  int64_t keys, cache_stride, q_stride, out_stride;
  std::vector<float> q_packed, k_quantized, v_quantized;
  float value_amax_all = 0.0f;
  cuda::DeviceBuffer<cuda::bf16> q_gpu, k_gpu, v_gpu;
  Staging staging;

  QuantizedInputs(const Case& c, uint32_t seed)
      : shape_case(c),
        keys(c.first_position + c.tokens),
        cache_stride(keys + 5),
        q_stride(static_cast<int64_t>(c.q_heads) * c.head_dim + c.extra_q_stride),
        out_stride(static_cast<int64_t>(c.q_heads) * c.head_dim + c.extra_out_stride),
        staging(c.kv_heads, c.head_dim, keys) {
    const int64_t head_dim = c.head_dim;
    const auto q =
        gpu_test::random_bf16_values(static_cast<size_t>(c.tokens) * q_stride, seed, 2.0f);
    const auto k = gpu_test::random_bf16_values(
        static_cast<size_t>(c.kv_heads) * cache_stride * head_dim, seed + 1);
    const auto v = gpu_test::random_bf16_values(k.size(), seed + 2, 1.0f, /*uniform=*/true);
    q_packed.resize(static_cast<size_t>(c.tokens) * c.q_heads * head_dim);
    for (int t = 0; t < c.tokens; ++t) {
      for (int h = 0; h < c.q_heads; ++h) {
        const float* row = q.data() + t * q_stride + h * head_dim;
        float* packed = q_packed.data() + (static_cast<size_t>(t) * c.q_heads + h) * head_dim;
        std::copy_n(row, head_dim, packed);
        fp8_kv_round_trip_row(packed, head_dim);
      }
    }
    k_quantized = k;
    v_quantized = v;
    for (int h = 0; h < c.kv_heads; ++h) {
      const float key_scale =
          fp8_weight_scale(largest_magnitude(k, h, cache_stride, keys, head_dim));
      const float value_amax = largest_magnitude(v, h, cache_stride, keys, head_dim);
      value_amax_all = std::max(value_amax_all, value_amax);
      const float value_scale = fp8_weight_scale(value_amax);
      for (int64_t i = 0; i < keys * head_dim; ++i) {
        const size_t index = h * cache_stride * head_dim + i;
        k_quantized[index] = fp8_round_trip(k[index], key_scale);
        v_quantized[index] = fp8_round_trip(v[index], value_scale);
      }
    }
    q_gpu = gpu_test::upload_bf16(q);
    k_gpu = gpu_test::upload_bf16(k);
    v_gpu = gpu_test::upload_bf16(v);
    cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), cache_stride, head_dim, keys, staging.view,
                         nullptr);
  }

  cpu::AttentionShape cpu_shape() const {
    cpu::AttentionShape shape;
    shape.tokens = shape_case.tokens;
    shape.q_heads = shape_case.q_heads;
    shape.kv_heads = shape_case.kv_heads;
    shape.head_dim = shape_case.head_dim;
    shape.first_position = shape_case.first_position;
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
    shape.first_position = shape_case.first_position;
    shape.q_token_stride = q_stride;
    shape.out_token_stride = out_stride;
    return shape;
  }

  // Runs `attend(out)` into a poisoned output and returns its rows packed as q_packed.
  template <class Attend>
  std::vector<float> gpu_output(Attend&& attend) const {
    cuda::DeviceBuffer<cuda::bf16> out_gpu(static_cast<size_t>(shape_case.tokens) * out_stride);
    gpu_test::poison(out_gpu);
    attend(out_gpu.data());
    cuda::check(cudaDeviceSynchronize(), "FP8 attention");
    const auto out_rows = gpu_test::download_bf16(out_gpu);
    std::vector<float> packed(q_packed.size());
    const int64_t width = static_cast<int64_t>(shape_case.q_heads) * shape_case.head_dim;
    for (int t = 0; t < shape_case.tokens; ++t) {
      std::copy_n(out_rows.begin() + t * out_stride, width, packed.begin() + t * width);
    }
    return packed;
  }

  // The kernel's error against the host over the same quantized inputs, within the bound the file
  // header derives (`keys_read`: the most keys a row reads).
  void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                    int64_t keys_read, const std::string& what) const {
    double output_max = 0;
    for (float x : expected) output_max = std::max(output_max, std::fabs(static_cast<double>(x)));
    const double bound =
        (0x1p-4 + static_cast<double>(keys_read) * 0x1p-18) * value_amax_all + 0x1p-8 * output_max;
    const auto difference = gpu_test::compare(actual, expected);
    EXPECT_EQ(difference.non_finite, 0) << what;
    EXPECT_LE(difference.relative_l2, 4e-2) << what;
    EXPECT_LE(difference.max_abs_error, bound)
        << what << " (worst at " << difference.worst_index << ")";
    std::printf("[fp8 attention] %s: relative L2 %.2e, max |error| %.2e (bound %.2e)\n",
                what.c_str(), difference.relative_l2, difference.max_abs_error, bound);
  }
};

void run_case(const Case& c, uint32_t seed) {
  const QuantizedInputs inputs(c, seed);
  std::vector<float> expected(inputs.q_packed.size());
  cpu::causal_attention(inputs.q_packed.data(), inputs.k_quantized.data(),
                        inputs.v_quantized.data(), inputs.cpu_shape(), expected.data());
  const auto actual = inputs.gpu_output([&](cuda::bf16* out) {
    cuda::flash_prefill_fp8(inputs.q_gpu.data(), inputs.staging.view, inputs.gpu_shape(), out,
                            nullptr);
  });
  inputs.expect_close(actual, expected, inputs.keys, describe(c));
}

TEST(CudaFp8Attention, PrefillMatchesTheCpuOverQuantizedInputs) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const std::vector<Case> cases = {
      {8, 2, 1, 0},
      {8, 2, 37, 0},
      {32, 8, 300, 0},
      {8, 1, 513, 129},
      {6, 2, 1000, 0},
      {8, 8, 2048, 0},
      {12, 4, 45, 3000},
      {4, 2, 96, 64, 256, 128},
      {16, 2, 700, 31},
      // head_dim 64: half-used rows of Q and K, half the value tile
      {8, 2, 37, 0, 0, 0, 64},
      {32, 8, 300, 0, 0, 0, 64},
      {8, 1, 513, 129, 0, 0, 64},
      {12, 4, 45, 3000, 0, 0, 64},
      {4, 2, 96, 64, 128, 64, 64},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) run_case(c, seed += 3);
}

TEST(CudaFp8Attention, StaysCloseToBf16AttentionOnALongPrompt) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  for (const int head_dim : {128, 64}) {
    const int tokens = 8192, q_heads = 32, kv_heads = 8;
    const auto q =
        gpu_test::random_bf16_values(static_cast<size_t>(tokens) * q_heads * head_dim, 900, 2.0f);
    const auto k =
        gpu_test::random_bf16_values(static_cast<size_t>(kv_heads) * tokens * head_dim, 901);
    const auto v = gpu_test::random_bf16_values(k.size(), 902, 1.0f, true);
    auto q_gpu = gpu_test::upload_bf16(q), k_gpu = gpu_test::upload_bf16(k),
         v_gpu = gpu_test::upload_bf16(v);
    cuda::DeviceBuffer<cuda::bf16> out_bf16(q.size()), out_fp8(q.size());
    gpu_test::poison(out_fp8);
    cuda::FlashShape shape;
    shape.tokens = tokens;
    shape.q_heads = q_heads;
    shape.kv_heads = kv_heads;
    shape.head_dim = head_dim;
    shape.cache_stride = tokens;
    Staging staging(kv_heads, head_dim, tokens);
    cuda::flash_prefill(q_gpu.data(), k_gpu.data(), v_gpu.data(), shape, out_bf16.data(), nullptr,
                        cuda::FlashKernel::kWgmma);
    cuda::stage_fp8_keys(k_gpu.data(), v_gpu.data(), tokens, head_dim, tokens, staging.view,
                         nullptr);
    cuda::flash_prefill_fp8(q_gpu.data(), staging.view, shape, out_fp8.data(), nullptr);
    cuda::check(cudaDeviceSynchronize(), "attention kernels");
    const auto difference =
        gpu_test::compare(gpu_test::download_bf16(out_fp8), gpu_test::download_bf16(out_bf16));
    EXPECT_EQ(difference.non_finite, 0) << "head_dim " << head_dim;
    EXPECT_LE(difference.relative_l2, 0.1) << "head_dim " << head_dim;
    std::printf(
        "[fp8 attention] 8192 tokens, head_dim %d, against bf16: relative L2 %.2e, max |error| "
        "%.2e\n",
        head_dim, difference.relative_l2, difference.max_abs_error);
  }
}

struct SparseCase {
  Case shape;  // first_position 0: the plan describes the whole prompt
  int segment_size;
  int block_size;
};

std::string describe(const SparseCase& c) {
  return describe(c.shape) + ", segment " + std::to_string(c.segment_size) + ", block " +
         std::to_string(c.block_size);
}

// Runs the plan's queries in slices that start on segments (as the layer-major prefill does) and
// returns the whole output with the keys the kernel counted.
std::vector<float> sparse_fp8_output(const QuantizedInputs& inputs, const SparseCase& c,
                                     const cuda::DevicePrefillPlan& plan, int64_t slice_tokens,
                                     unsigned long long& keys_read) {
  cuda::DeviceBuffer<unsigned long long> counter(1);
  cuda::check(cudaMemset(counter.data(), 0, sizeof(unsigned long long)), "counter");
  const auto out = inputs.gpu_output([&](cuda::bf16* out_rows) {
    for (int64_t first = 0; first < c.shape.tokens; first += slice_tokens) {
      cuda::FlashShape shape = inputs.gpu_shape();
      shape.first_position = first;
      shape.tokens = std::min<int64_t>(slice_tokens, c.shape.tokens - first);
      cuda::flash_prefill_block_sparse_fp8(
          inputs.q_gpu.data() + first * inputs.q_stride, inputs.staging.view, shape, plan,
          out_rows + first * inputs.out_stride, nullptr, counter.data());
    }
  });
  cuda::check(cudaMemcpy(&keys_read, counter.data(), sizeof(keys_read), cudaMemcpyDeviceToHost),
              "counter");
  return out;
}

TEST(CudaFp8Attention, BlockSparsePrefillMatchesTheCpuOverQuantizedInputs) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const std::vector<SparseCase> cases = {
      {{32, 8, 2100, 0}, 512, 8},            // the defaults (S 512, b 8) on a real head layout
      {{8, 2, 1000, 0}, 128, 8},             // group 4: 512 rows per segment
      {{4, 4, 777, 0}, 128, 16},             // group 1: one tile of rows per segment
      {{8, 2, 1300, 0}, 512, 200},           // blocks longer than a key tile
      {{8, 2, 500, 0}, 96, 16},              // 96-key segments: tiles mix selected and own keys
      {{6, 2, 500, 0}, 128, 8},              // group 3: tiles of rows split a token's heads
      {{8, 1, 300, 0}, 16, 8},               // group 8, 16-key segments
      {{8, 2, 96, 0}, 32, 8},                // fewer tokens than a tile of rows
      {{8, 2, 600, 0, 256, 128}, 128, 24},   // padded q and out rows
      {{32, 8, 2100, 0, 0, 0, 64}, 512, 8},  // head_dim 64 (the shipped model's)
      {{8, 2, 500, 0, 0, 0, 64}, 96, 16},
  };
  uint32_t seed = 800;
  for (const SparseCase& c : cases) {
    const QuantizedInputs inputs(c.shape, seed += 5);
    const LayerPrefillPlan plan =
        gpu_test::random_plan(c.shape.tokens, c.shape.kv_heads, c.segment_size, c.block_size,
                              gpu_test::RowChoice::kMixed, seed);
    std::vector<float> expected(inputs.q_packed.size());
    const int64_t cpu_keys_read = cpu::block_sparse_attention(
        inputs.q_packed.data(), inputs.k_quantized.data(), inputs.v_quantized.data(),
        inputs.cpu_shape(), plan, expected.data());
    const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
    ASSERT_TRUE(cuda::fp8_block_sparse_fits(device_plan.view, c.shape.q_heads, c.shape.kv_heads))
        << describe(c);
    // Whole, then in slices of two segments.
    for (const int64_t slice :
         {static_cast<int64_t>(c.shape.tokens), static_cast<int64_t>(2 * c.segment_size)}) {
      unsigned long long keys_read = 0;
      const auto actual = sparse_fp8_output(inputs, c, device_plan.view, slice, keys_read);
      const std::string what = describe(c) + ", slices of " + std::to_string(slice);
      inputs.expect_close(actual, expected, inputs.keys, what);
      EXPECT_EQ(static_cast<int64_t>(keys_read),
                cpu_keys_read * (c.shape.q_heads / c.shape.kv_heads))
          << what;
    }
  }
}

// Every visible block of every row, with segments a multiple of the 128-key tile: the virtual key
// sequence is the dense one tile for tile, so the sparse producer's gathered tiles must give
// exactly what the dense producer's streamed tiles give.
TEST(CudaFp8Attention, BlockSparseOverEveryBlockEqualsDensePrefill) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const SparseCase c = {{8, 2, 1100, 0}, 256, 8};
  const QuantizedInputs inputs(c.shape, 900);
  const LayerPrefillPlan plan =
      gpu_test::random_plan(c.shape.tokens, c.shape.kv_heads, c.segment_size, c.block_size,
                            gpu_test::RowChoice::kAllVisible, 900);
  const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
  unsigned long long keys_read = 0;
  const auto sparse = sparse_fp8_output(inputs, c, device_plan.view, c.shape.tokens, keys_read);
  const auto dense = inputs.gpu_output([&](cuda::bf16* out) {
    cuda::flash_prefill_fp8(inputs.q_gpu.data(), inputs.staging.view, inputs.gpu_shape(), out,
                            nullptr);
  });
  const auto difference = gpu_test::compare(sparse, dense);
  EXPECT_EQ(difference.non_finite, 0);
  EXPECT_EQ(difference.max_abs_error, 0.0) << "worst at " << difference.worst_index;
}

TEST(CudaFp8Attention, BlockSparseRejectsPlansItCannotRun) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  const Case shape = {8, 2, 300, 0};
  const QuantizedInputs inputs(shape, 950);
  // Blocks of 4 keys: values are copied 8 keys at a time. Segments of 16 tokens with group 4: 64
  // rows, half a tile of rows.
  for (const auto& [segment_size, block_size, rule] :
       {std::tuple{128, 4, "multiples of 8"},
        std::tuple{16, 8, "segment_size * (q_heads / kv_heads)"}}) {
    const LayerPrefillPlan plan = gpu_test::random_plan(
        shape.tokens, shape.kv_heads, segment_size, block_size, gpu_test::RowChoice::kMixed, 950);
    const auto device_plan = cuda::DevicePrefillPlanStorage::upload(plan);
    EXPECT_FALSE(cuda::fp8_block_sparse_fits(device_plan.view, shape.q_heads, shape.kv_heads));
    cuda::DeviceBuffer<cuda::bf16> out(inputs.q_packed.size());
    try {
      cuda::flash_prefill_block_sparse_fp8(inputs.q_gpu.data(), inputs.staging.view,
                                           inputs.gpu_shape(), device_plan.view, out.data(),
                                           nullptr);
      ADD_FAILURE() << "ran segment " << segment_size << ", block " << block_size;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(rule), std::string::npos) << error.what();
    }
  }
}

TEST(CudaFp8Attention, RejectsWhatItCannotRun) {
  ENTROPYINFER_REQUIRE_GPU();
  Staging staging(2, 64, 128);
  cuda::FlashShape shape;
  shape.tokens = 4;
  shape.q_heads = 8;
  shape.kv_heads = 2;
  shape.head_dim = 96;
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.view, shape, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::stage_fp8_keys(nullptr, nullptr, 64, 96, 64, staging.view, nullptr), Error);
  shape.head_dim = 128;
  shape.kv_heads = 4;  // not what was staged
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.view, shape, nullptr, nullptr), Error);
  shape.kv_heads = 2;
  shape.first_position = 126;  // keys past the staged 128
  EXPECT_THROW(cuda::flash_prefill_fp8(nullptr, staging.view, shape, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::stage_fp8_keys(nullptr, nullptr, 100, 128, 200, staging.view, nullptr), Error);
}

}  // namespace
}  // namespace entropyinfer

// Every CUDA op against the CPU reference op (backends/cpu/cpu_ops.h) on random inputs rounded to
// bf16, with awkward sizes. Tolerances: results stored as bf16 may differ by the bf16 rounding of
// the output (relative 2^-8) plus fp32 accumulation-order noise; fp32 results by accumulation order
// only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/cuda_ops.h"
#include "gpu/gpu_test_support.h"

namespace entropyinfer {
namespace {

using gpu_test::compare;
using gpu_test::download_bf16;
using gpu_test::download_floats;
using gpu_test::random_bf16_values;
using gpu_test::upload_bf16;
using gpu_test::upload_floats;
using gpu_test::worst_excess;

constexpr double kBf16Relative =
    1.0 / 128;  // one bf16 ulp relative: output rounding plus order noise

TEST(CudaOps, LinearBf16OutputMatchesCpuProduct) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas blas;
  for (auto [tokens, in, out] :
       {std::tuple{1, 64, 8}, {7, 200, 96}, {64, 4096, 1000}, {300, 512, 1536}}) {
    const auto x = random_bf16_values(static_cast<size_t>(tokens) * in, 1, 1.0f);
    const auto w = random_bf16_values(static_cast<size_t>(out) * in, 2, 1.0f / std::sqrt(in));
    std::vector<float> expected(static_cast<size_t>(tokens) * out);
    cpu::linear(x.data(), tokens, in, w.data(), nullptr, out, expected.data());
    auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
    cuda::DeviceBuffer<cuda::bf16> y_gpu(expected.size());
    gpu_test::poison(y_gpu);
    blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y_gpu.data());
    const auto actual = download_bf16(y_gpu);
    EXPECT_LE(worst_excess(actual, expected, kBf16Relative), 1e-3)
        << tokens << "x" << in << "x" << out;
    EXPECT_LE(compare(actual, expected).relative_l2, 4e-3) << tokens << "x" << in << "x" << out;
  }
}

TEST(CudaOps, LinearFp32OutputAccumulatesIntoStridedRows) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas blas;
  const int tokens = 37, in = 1024, out = 320, stride = 352;
  const auto x = random_bf16_values(static_cast<size_t>(tokens) * in, 3);
  const auto w = random_bf16_values(static_cast<size_t>(out) * in, 4, 1.0f / 32);
  const auto initial = gpu_test::random_floats(static_cast<size_t>(tokens) * stride, 5);
  std::vector<float> product(static_cast<size_t>(tokens) * out);
  cpu::linear(x.data(), tokens, in, w.data(), nullptr, out, product.data());
  std::vector<float> expected = initial;
  for (int t = 0; t < tokens; ++t) {
    for (int o = 0; o < out; ++o) expected[t * stride + o] += product[t * out + o];
  }
  auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
  auto y_gpu = upload_floats(initial);
  blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y_gpu.data(), /*accumulate=*/true,
              stride);
  const auto actual = download_floats(y_gpu);
  // fp32 accumulation of 1024 products of size ~1/32: order noise far below 1e-4.
  EXPECT_LE(worst_excess(actual, expected, 1e-5), 1e-4);
  // Columns past `out` in each row are untouched.
  for (int t = 0; t < tokens; ++t) {
    for (int o = out; o < stride; ++o) ASSERT_EQ(actual[t * stride + o], initial[t * stride + o]);
  }

  // Without accumulate the old values are replaced.
  blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y_gpu.data(), false, stride);
  const auto replaced = download_floats(y_gpu);
  double worst = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int o = 0; o < out; ++o) {
      worst = std::max<double>(worst, std::fabs(replaced[t * stride + o] - product[t * out + o]));
    }
  }
  EXPECT_LE(worst, 1e-4);
}

// Autotuning runs the candidates into a scratch output: an accumulating product still adds its
// result to y exactly once, and the products it chooses match the CPU, under either timing load.
TEST(CudaOps, AutotunedProductsMatchCpuAndAccumulateOnce) {
  ENTROPYINFER_REQUIRE_GPU();
  for (const auto load : {cuda::Blas::TuneLoad::kBurst, cuda::Blas::TuneLoad::kSustained}) {
    SCOPED_TRACE(load == cuda::Blas::TuneLoad::kBurst ? "burst" : "sustained");
    cuda::Blas blas;
    blas.set_autotune(8, 1, load);
    for (auto [tokens, in, out] : {std::tuple{300, 512, 1536}, {64, 4096, 1000}}) {
      const auto x = random_bf16_values(static_cast<size_t>(tokens) * in, 41, 1.0f);
      const auto w = random_bf16_values(static_cast<size_t>(out) * in, 42, 1.0f / std::sqrt(in));
      std::vector<float> product(static_cast<size_t>(tokens) * out);
      cpu::linear(x.data(), tokens, in, w.data(), nullptr, out, product.data());
      auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
      cuda::DeviceBuffer<cuda::bf16> y_bf16(product.size());
      gpu_test::poison(y_bf16);
      blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y_bf16.data());
      EXPECT_LE(worst_excess(download_bf16(y_bf16), product, kBf16Relative), 1e-3)
          << tokens << "x" << in << "x" << out;
      const auto initial = gpu_test::random_floats(product.size(), 43);
      std::vector<float> expected = initial;
      for (size_t i = 0; i < expected.size(); ++i) expected[i] += product[i];
      auto y_fp32 = upload_floats(initial);
      blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y_fp32.data(), /*accumulate=*/true);
      EXPECT_LE(worst_excess(download_floats(y_fp32), expected, 1e-5), 1e-3)
          << tokens << "x" << in << "x" << out;
      const int chosen = blas.chosen_candidate(tokens, in, out, /*fp32_out=*/false);
      EXPECT_GE(chosen, 0);
      EXPECT_LT(chosen, 8);
    }
  }
}

// The candidate sweep (bench_gemm's) times each algorithm without touching the plans products run
// and without writing y: a product after it still accumulates exactly once.
TEST(CudaOps, CandidateSweepTimesEachAlgorithmAndLeavesProductsAlone) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas blas;
  const int tokens = 256, in = 1024, out = 2048;
  const auto x = random_bf16_values(static_cast<size_t>(tokens) * in, 61, 1.0f);
  const auto w = random_bf16_values(static_cast<size_t>(out) * in, 62, 1.0f / std::sqrt(in));
  auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
  EXPECT_EQ(blas.chosen_candidate(tokens, in, out, true), -1);  // nothing has run yet
  for (const auto load : {cuda::Blas::TuneLoad::kBurst, cuda::Blas::TuneLoad::kSustained}) {
    const auto times =
        blas.time_candidates(x_gpu.data(), tokens, in, w_gpu.data(), out, true, 4, load);
    ASSERT_GE(times.size(), 1u);
    ASSERT_LE(times.size(), 4u);
    EXPECT_GT(times[0], 0.0f);  // the heuristic's first choice runs these operands
    for (const float ms : times) EXPECT_TRUE(ms == -1.0f || (ms > 0.0f && ms < 100.0f)) << ms;
  }
  EXPECT_EQ(blas.chosen_candidate(tokens, in, out, true), -1);  // the sweep planned apart
  std::vector<float> product(static_cast<size_t>(tokens) * out);
  cpu::linear(x.data(), tokens, in, w.data(), nullptr, out, product.data());
  const auto initial = gpu_test::random_floats(product.size(), 63);
  std::vector<float> expected = initial;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += product[i];
  auto y = upload_floats(initial);
  blas.linear(x_gpu.data(), tokens, in, w_gpu.data(), out, y.data(), /*accumulate=*/true);
  EXPECT_LE(worst_excess(download_floats(y), expected, 1e-5), 1e-3);
  EXPECT_EQ(blas.chosen_candidate(tokens, in, out, true), 0);  // untuned: the heuristic's choice
}

// GEMV tuning times the configurations into a scratch output: the tuned product equals the untuned
// one bit for bit (every configuration sums a row in the same order) and accumulates exactly once.
TEST(CudaOps, TunedGemvEqualsUntunedAndAccumulatesOnce) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas plain, tuned;
  tuned.set_gemv_tuning(true);
  for (auto [in, out] : {std::pair{4096, 1000}, {14336, 4097}}) {
    const auto x = random_bf16_values(in, 51);
    const auto w = random_bf16_values(static_cast<size_t>(out) * in, 52, 1.0f / std::sqrt(in));
    const auto initial = gpu_test::random_floats(out, 53);
    auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
    cuda::DeviceBuffer<cuda::bf16> plain_bf16(out), tuned_bf16(out);
    plain.linear(x_gpu.data(), 1, in, w_gpu.data(), out, plain_bf16.data());
    tuned.linear(x_gpu.data(), 1, in, w_gpu.data(), out, tuned_bf16.data());
    EXPECT_EQ(download_bf16(tuned_bf16), download_bf16(plain_bf16)) << in << "x" << out;
    auto plain_fp32 = upload_floats(initial), tuned_fp32 = upload_floats(initial);
    plain.linear(x_gpu.data(), 1, in, w_gpu.data(), out, plain_fp32.data(), true);
    tuned.linear(x_gpu.data(), 1, in, w_gpu.data(), out, tuned_fp32.data(), true);
    EXPECT_EQ(download_floats(tuned_fp32), download_floats(plain_fp32)) << in << "x" << out;
  }
}

TEST(CudaOps, SingleTokenProductsMatchCpuOnBothPaths) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas blas;
  // in = 100 is not a multiple of 8: that shape takes cuBLASLt even with the GEMV kernel on.
  for (bool gemv : {true, false}) {
    blas.set_gemv(gemv);
    for (auto [in, out] : {std::pair{4096, 1000}, {14336, 4097}, {104, 33}, {100, 7}}) {
      const auto x = random_bf16_values(in, 21);
      const auto w = random_bf16_values(static_cast<size_t>(out) * in, 22, 1.0f / std::sqrt(in));
      const auto initial = gpu_test::random_floats(out, 23);
      std::vector<float> product(out);
      cpu::linear(x.data(), 1, in, w.data(), nullptr, out, product.data());
      auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
      cuda::DeviceBuffer<cuda::bf16> y_bf16(out);
      gpu_test::poison(y_bf16);
      blas.linear(x_gpu.data(), 1, in, w_gpu.data(), out, y_bf16.data());
      EXPECT_LE(worst_excess(download_bf16(y_bf16), product, kBf16Relative), 1e-3)
          << (gemv ? "gemv " : "cuBLASLt ") << in << "x" << out;
      auto y_fp32 = upload_floats(initial);
      blas.linear(x_gpu.data(), 1, in, w_gpu.data(), out, y_fp32.data(), /*accumulate=*/true);
      std::vector<float> expected = initial;
      for (int o = 0; o < out; ++o) expected[o] += product[o];
      EXPECT_LE(worst_excess(download_floats(y_fp32), expected, 1e-5), 1e-4)
          << (gemv ? "gemv " : "cuBLASLt ") << in << "x" << out;
      blas.linear(x_gpu.data(), 1, in, w_gpu.data(), out, y_fp32.data(), /*accumulate=*/false);
      EXPECT_LE(worst_excess(download_floats(y_fp32), product, 1e-5), 1e-4)
          << (gemv ? "gemv " : "cuBLASLt ") << in << "x" << out;
    }
  }
}

// The GEMV configurations the tuning benchmark sweeps (bench/gpu/bench_gemm.cpp) give the same
// products as the CPU, with and without accumulation; anything else is refused.
TEST(CudaOps, GemvConfigurationsMatchCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  for (auto [in, out] : {std::pair{4096, 1000}, {14336, 4097}, {104, 33}}) {
    const auto x = random_bf16_values(in, 31);
    const auto w = random_bf16_values(static_cast<size_t>(out) * in, 32, 1.0f / std::sqrt(in));
    const auto initial = gpu_test::random_floats(out, 33);
    std::vector<float> product(out);
    cpu::linear(x.data(), 1, in, w.data(), nullptr, out, product.data());
    std::vector<float> accumulated = initial;
    for (int o = 0; o < out; ++o) accumulated[o] += product[o];
    auto x_gpu = upload_bf16(x), w_gpu = upload_bf16(w);
    for (int in_flight : {4, 8, 16}) {
      for (int threads : {128, 256, 512}) {
        auto y = upload_floats(initial);
        cuda::gemv_with_config(x_gpu.data(), w_gpu.data(), in, out, y.data(), true, in_flight,
                               threads);
        EXPECT_LE(worst_excess(download_floats(y), accumulated, 1e-5), 1e-4)
            << in << "x" << out << ", " << in_flight << " in flight, " << threads << " threads";
        cuda::gemv_with_config(x_gpu.data(), w_gpu.data(), in, out, y.data(), false, in_flight,
                               threads);
        EXPECT_LE(worst_excess(download_floats(y), product, 1e-5), 1e-4)
            << in << "x" << out << ", " << in_flight << " in flight, " << threads << " threads";
      }
    }
  }
  auto x_gpu = upload_bf16(random_bf16_values(64, 34));
  auto w_gpu = upload_bf16(random_bf16_values(64 * 8, 35));
  cuda::DeviceBuffer<float> y(8);
  EXPECT_THROW(cuda::gemv_with_config(x_gpu.data(), w_gpu.data(), 64, 8, y.data(), false, 5, 256),
               Error);
  EXPECT_THROW(cuda::gemv_with_config(x_gpu.data(), w_gpu.data(), 64, 8, y.data(), false, 8, 100),
               Error);
  EXPECT_THROW(cuda::gemv_with_config(x_gpu.data(), w_gpu.data(), 60, 8, y.data(), false, 8, 256),
               Error);
}

TEST(CudaOps, RmsNormMatchesCpu) {
  ENTROPYINFER_REQUIRE_GPU();
  // Sizes on the fp32 rows' vector kernel (2 to 16 float4s per thread) and off it (8200 is past
  // its widest row, 99 is not a multiple of 4).
  for (auto [rows, size] :
       {std::pair{1, 4096}, {5, 768}, {33, 100}, {3, 5120}, {2, 8200}, {3, 99}}) {
    const auto x = random_bf16_values(static_cast<size_t>(rows) * size, 6, 3.0f);
    const auto weight = gpu_test::random_floats(size, 7, 2.0f);
    std::vector<float> expected(x.size());
    cpu::rms_norm(x.data(), weight.data(), rows, size, 1e-5f, expected.data());
    auto x_fp32 = upload_floats(x), weight_gpu = upload_floats(weight);
    auto x_bf16 = upload_bf16(x);
    cuda::DeviceBuffer<cuda::bf16> out(x.size());
    gpu_test::poison(out);
    cuda::rms_norm(x_fp32.data(), weight_gpu.data(), rows, size, 1e-5f, out.data(), nullptr);
    EXPECT_LE(worst_excess(download_bf16(out), expected, kBf16Relative), 1e-5)
        << rows << "x" << size;
    gpu_test::poison(out);
    cuda::rms_norm(x_bf16.data(), weight_gpu.data(), rows, size, 1e-5f, out.data(), nullptr);
    EXPECT_LE(worst_excess(download_bf16(out), expected, kBf16Relative), 1e-5)
        << rows << "x" << size;
  }
}

TEST(CudaOps, HeadRmsNormNormalisesEachHeadInsideWiderRows) {
  ENTROPYINFER_REQUIRE_GPU();
  const int tokens = 9, heads = 5, head_dim = 128, stride = heads * head_dim + 256;
  const auto x = random_bf16_values(static_cast<size_t>(tokens) * stride, 8, 2.0f);
  const auto weight = gpu_test::random_floats(head_dim, 9, 1.5f);
  std::vector<float> expected = x;
  for (int t = 0; t < tokens; ++t) {
    cpu::rms_norm(x.data() + t * stride, weight.data(), heads, head_dim, 1e-6f,
                  expected.data() + t * stride);
  }
  auto x_gpu = upload_bf16(x);
  auto weight_gpu = upload_floats(weight);
  cuda::head_rms_norm(x_gpu.data(), tokens, heads, head_dim, stride, weight_gpu.data(), 1e-6f,
                      nullptr);
  EXPECT_LE(worst_excess(download_bf16(x_gpu), expected, kBf16Relative), 1e-5);
}

TEST(CudaOps, RopeMatchesCpuForHalvesPairsAndPartialRotation) {
  ENTROPYINFER_REQUIRE_GPU();
  for (auto [adjacent, rotary_dim] :
       {std::pair{false, 128}, {true, 128}, {false, 64}, {true, 32}, {false, 36}, {true, 36}}) {
    const int tokens = 11, heads = 6, head_dim = 128, stride = heads * head_dim + 512;
    const int half = rotary_dim / 2;
    const auto x = random_bf16_values(static_cast<size_t>(tokens) * stride, 10);
    const auto angles = gpu_test::random_floats(static_cast<size_t>(tokens) * half, 11, 3.14159f);
    std::vector<float> cos(angles.size()), sin(angles.size());
    for (size_t i = 0; i < angles.size(); ++i) {
      cos[i] = std::cos(angles[i]);
      sin[i] = std::sin(angles[i]);
    }
    // The CPU op takes contiguous [tokens, heads, head_dim]; rotate a packed copy of each row.
    std::vector<float> packed(static_cast<size_t>(tokens) * heads * head_dim);
    for (int t = 0; t < tokens; ++t) {
      std::copy_n(x.begin() + t * stride, heads * head_dim, packed.begin() + t * heads * head_dim);
    }
    cpu::apply_rope(packed.data(), tokens, heads, head_dim, cos.data(), sin.data(), rotary_dim,
                    adjacent);
    std::vector<float> expected = x;
    for (int t = 0; t < tokens; ++t) {
      std::copy_n(packed.begin() + t * heads * head_dim, heads * head_dim,
                  expected.begin() + t * stride);
    }
    auto x_gpu = upload_bf16(x);
    auto cos_gpu = upload_floats(cos), sin_gpu = upload_floats(sin);
    cuda::apply_rope(x_gpu.data(), tokens, heads, head_dim, stride, cos_gpu.data(), sin_gpu.data(),
                     rotary_dim, adjacent, nullptr);
    EXPECT_LE(worst_excess(download_bf16(x_gpu), expected, kBf16Relative), 1e-5)
        << (adjacent ? "adjacent pairs" : "halves") << ", rotary_dim " << rotary_dim;

    // The first q_heads heads written elsewhere (whole-head rotation straight from the kernel,
    // partial rotation through a copy): the same values, and the rest rotated in place.
    const int q_heads = 4, q_stride = q_heads * head_dim + 64;
    auto fused_gpu = upload_bf16(x);
    cuda::DeviceBuffer<cuda::bf16> q_out(static_cast<size_t>(tokens) * q_stride);
    gpu_test::poison(q_out);
    cuda::apply_rope_queries_out(fused_gpu.data(), tokens, heads, head_dim, stride, cos_gpu.data(),
                                 sin_gpu.data(), rotary_dim, adjacent, q_heads, q_out.data(),
                                 q_stride, nullptr);
    const auto queries = download_bf16(q_out);
    const auto fused = download_bf16(fused_gpu);
    std::vector<float> got_queries, want_queries, got_keys, want_keys;
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < heads * head_dim; ++i) {
        if (i < q_heads * head_dim) {
          got_queries.push_back(queries[static_cast<size_t>(t) * q_stride + i]);
          want_queries.push_back(expected[static_cast<size_t>(t) * stride + i]);
        } else {
          got_keys.push_back(fused[static_cast<size_t>(t) * stride + i]);
          want_keys.push_back(expected[static_cast<size_t>(t) * stride + i]);
        }
      }
    }
    EXPECT_LE(worst_excess(got_queries, want_queries, kBf16Relative), 1e-5)
        << "queries out, rotary_dim " << rotary_dim;
    EXPECT_LE(worst_excess(got_keys, want_keys, kBf16Relative), 1e-5)
        << "keys in place, rotary_dim " << rotary_dim;
  }
}

TEST(CudaOps, SwigluReadsFusedGateUpRows) {
  ENTROPYINFER_REQUIRE_GPU();
  for (const int width : {1000, 1001}) {  // eight columns per thread, and one
    const int rows = 13;
    const auto fused = random_bf16_values(static_cast<size_t>(rows) * 2 * width, 12, 3.0f);
    std::vector<float> gate(static_cast<size_t>(rows) * width), up(gate.size());
    for (int r = 0; r < rows; ++r) {
      std::copy_n(fused.begin() + r * 2 * width, width, gate.begin() + r * width);
      std::copy_n(fused.begin() + r * 2 * width + width, width, up.begin() + r * width);
    }
    cpu::swiglu_inplace(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
    auto fused_gpu = upload_bf16(fused);
    cuda::DeviceBuffer<cuda::bf16> out(gate.size());
    gpu_test::poison(out);
    cuda::swiglu(fused_gpu.data(), fused_gpu.data() + width, rows, width, 2 * width, out.data(),
                 nullptr);
    EXPECT_LE(worst_excess(download_bf16(out), gate, kBf16Relative), 1e-5) << "width " << width;
  }
}

TEST(CudaOps, AddBiasAddAndConversions) {
  ENTROPYINFER_REQUIRE_GPU();
  const auto x = gpu_test::random_floats(10007, 13);
  const auto y = gpu_test::random_floats(10007, 14);
  std::vector<float> expected = x;
  cpu::add_inplace(expected.data(), y.data(), static_cast<int64_t>(x.size()));
  auto x_gpu = upload_floats(x), y_gpu = upload_floats(y);
  cuda::add_inplace(x_gpu.data(), y_gpu.data(), static_cast<int64_t>(x.size()), nullptr);
  EXPECT_EQ(download_floats(x_gpu), expected);  // one fp32 add per element: bit-exact

  const int rows = 7, width = 33, stride = 40;
  const auto values = random_bf16_values(static_cast<size_t>(rows) * stride, 15);
  const auto bias = gpu_test::random_floats(width, 16);
  auto values_gpu = upload_bf16(values);
  auto bias_gpu = upload_floats(bias);
  cuda::add_bias(values_gpu.data(), bias_gpu.data(), rows, width, stride, nullptr);
  const auto biased = download_bf16(values_gpu);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < stride; ++c) {
      const float want = c < width ? values[r * stride + c] + bias[c] : values[r * stride + c];
      ASSERT_NEAR(biased[r * stride + c], want, std::fabs(want) * kBf16Relative + 1e-6)
          << r << "," << c;
    }
  }

  // fp32 -> bf16 rounds to nearest even as core/half.h does; bf16 -> fp32 is exact.
  const auto wide = gpu_test::random_floats(4099, 17, 100.0f);
  auto wide_gpu = upload_floats(wide);
  cuda::DeviceBuffer<cuda::bf16> narrow(wide.size());
  cuda::to_bf16(wide_gpu.data(), static_cast<int64_t>(wide.size()), narrow.data(), nullptr);
  cuda::DeviceBuffer<float> back(wide.size());
  cuda::to_float(narrow.data(), static_cast<int64_t>(wide.size()), back.data(), nullptr);
  const auto round_trip = download_floats(back);
  for (size_t i = 0; i < wide.size(); ++i)
    ASSERT_EQ(round_trip[i], bf16_to_f32(f32_to_bf16(wide[i]))) << i;
}

TEST(CudaOps, EmbeddingAppendKvAndArgmax) {
  ENTROPYINFER_REQUIRE_GPU();
  const int vocab = 50, hidden = 72;
  const auto table = random_bf16_values(static_cast<size_t>(vocab) * hidden, 18);
  const std::vector<int32_t> ids = {3, 49, 0, 3, 17};
  auto table_gpu = upload_bf16(table);
  cuda::DeviceBuffer<int32_t> ids_gpu(ids.size());
  ids_gpu.upload(ids.data(), ids.size());
  cuda::DeviceBuffer<float> rows(ids.size() * hidden);
  cuda::embedding(table_gpu.data(), ids_gpu.data(), static_cast<int64_t>(ids.size()), hidden,
                  rows.data(), nullptr);
  const auto gathered = download_floats(rows);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int i = 0; i < hidden; ++i)
      ASSERT_EQ(gathered[t * hidden + i], table[ids[t] * hidden + i]);
  }

  // Keys/values of 3 tokens ([t][kv_heads][head_dim] rows inside wider fused rows) land at
  // rows 5..7.
  const int tokens = 3, kv_heads = 2, head_dim = 64, token_stride = 400, cache_stride = 16,
            first = 5;
  const auto fused = random_bf16_values(static_cast<size_t>(tokens) * token_stride, 19);
  auto fused_gpu = upload_bf16(fused);
  auto key_cache = upload_bf16(
      std::vector<float>(static_cast<size_t>(kv_heads) * cache_stride * head_dim, 0.5f));
  auto value_cache = upload_bf16(std::vector<float>(key_cache.size(), 0.25f));
  cuda::append_kv(fused_gpu.data(), fused_gpu.data() + 200, tokens, token_stride, kv_heads,
                  head_dim, key_cache.data(), value_cache.data(), cache_stride, first, nullptr);
  const auto keys = download_bf16(key_cache), values = download_bf16(value_cache);
  for (int h = 0; h < kv_heads; ++h) {
    for (int row = 0; row < cache_stride; ++row) {
      for (int i = 0; i < head_dim; ++i) {
        const size_t slot = (static_cast<size_t>(h) * cache_stride + row) * head_dim + i;
        const bool written = row >= first && row < first + tokens;
        const size_t source = static_cast<size_t>(row - first) * token_stride + h * head_dim + i;
        ASSERT_EQ(keys[slot], written ? fused[source] : 0.5f) << h << "," << row << "," << i;
        ASSERT_EQ(values[slot], written ? fused[source + 200] : 0.25f)
            << h << "," << row << "," << i;
      }
    }
  }

  // Argmax: the first of equal maxima wins, as with std::max_element.
  const int argmax_rows = 4, count = 128256;
  auto logits = gpu_test::random_floats(static_cast<size_t>(argmax_rows) * count, 20, 10.0f);
  logits[0 * count + 77] = 50.0f;
  logits[0 * count + 90000] = 50.0f;
  logits[1 * count + count - 1] = 60.0f;
  logits[2 * count + 0] = 70.0f;
  auto logits_gpu = upload_floats(logits);
  // One block per row, then split over blocks with a workspace (three launches in a row: the
  // arrival counters must come back to zero), then more rows than the workspace holds.
  cuda::ArgmaxWorkspace workspace(argmax_rows);
  cuda::ArgmaxWorkspace small_workspace(2);
  for (int variant = 0; variant < 5; ++variant) {
    SCOPED_TRACE("argmax variant " + std::to_string(variant));
    cuda::ArgmaxWorkspace* used =
        variant == 0 ? nullptr : (variant < 4 ? &workspace : &small_workspace);
    cuda::DeviceBuffer<int32_t> best(argmax_rows);
    cuda::argmax_rows(logits_gpu.data(), argmax_rows, count, best.data(), nullptr, used);
    std::vector<int32_t> found(argmax_rows);
    best.download(found.data(), found.size());
    for (int r = 0; r < argmax_rows; ++r) {
      const auto row = logits.begin() + static_cast<int64_t>(r) * count;
      EXPECT_EQ(found[r], std::max_element(row, row + count) - row) << "row " << r;
    }
    EXPECT_EQ(found[0], 77);
  }
  // Ties across slices, and a row shorter than one slice.
  std::vector<float> ties(static_cast<size_t>(count), 1.0f);
  ties[5000] = ties[70000] = ties[128000] = 3.0f;
  auto ties_gpu = upload_floats(ties);
  cuda::DeviceBuffer<int32_t> one(1);
  cuda::argmax_rows(ties_gpu.data(), 1, count, one.data(), nullptr, &workspace);
  int32_t tie_winner = -1;
  one.download(&tie_winner, 1);
  EXPECT_EQ(tie_winner, 5000);
  cuda::argmax_rows(ties_gpu.data() + 4990, 1, 700, one.data(), nullptr, &workspace);
  one.download(&tie_winner, 1);
  EXPECT_EQ(tie_winner, 10);

  // Rows no token can honestly be picked from give -1, in one block and split over slices; -inf
  // entries alone are tokens that are never picked.
  const float nan = std::nanf("");
  std::vector<float> unusable(static_cast<size_t>(4) * count, 0.5f);
  unusable[0 * count + 100000] = nan;
  unusable[1 * count + 3] = INFINITY;
  std::fill(unusable.begin() + 2 * count, unusable.begin() + 3 * count, -INFINITY);
  std::fill(unusable.begin() + 3 * count, unusable.begin() + 4 * count, -INFINITY);
  unusable[3 * count + 64000] = -3.0f;
  auto unusable_gpu = upload_floats(unusable);
  for (cuda::ArgmaxWorkspace* used : {static_cast<cuda::ArgmaxWorkspace*>(nullptr), &workspace}) {
    cuda::DeviceBuffer<int32_t> flagged(4);
    cuda::argmax_rows(unusable_gpu.data(), 4, count, flagged.data(), nullptr, used);
    std::vector<int32_t> found(4);
    flagged.download(found.data(), found.size());
    EXPECT_EQ(found, (std::vector<int32_t>{-1, -1, -1, 64000})) << (used ? "split" : "one block");
  }
}

}  // namespace
}  // namespace entropyinfer

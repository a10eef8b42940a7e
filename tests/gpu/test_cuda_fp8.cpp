// The GPU's FP8 products (backends/cuda/fp8_products.cu) against the definitions in core/fp8.h and
// the CPU reference product (cpu::linear over FP8 weights): input and weight quantization bit for
// bit, products to accumulation order (the quantized operands being identical), and the shipped
// model quantized at load against the CPU running the same FP8 weights and against transformers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>

#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/cuda_ops.h"
#include "core/fp8.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/transformer.h"
#include "fp8_fixture_support.h"
#include "gpu/gpu_test_support.h"
#include "gpu/model_test_support.h"
#include "model/model_weights.h"
#include "model/quantize_weights.h"
#include "shipped_model_support.h"

namespace entropyinfer {
namespace {

using gpu_test::download_bf16;
using gpu_test::download_floats;
using gpu_test::random_bf16_values;
using gpu_test::upload_bf16;
using gpu_test::upload_floats;
using gpu_test::worst_excess;

std::vector<uint8_t> download_codes(const cuda::DeviceBuffer<uint8_t>& buffer) {
  std::vector<uint8_t> codes(buffer.size());
  buffer.download(codes.data(), codes.size());
  return codes;
}

// Weight rows quantized as quantize_weights_fp8 does on the host.
struct HostFp8Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

HostFp8Matrix quantize_on_host(const std::vector<float>& w, int64_t rows, int64_t width) {
  HostFp8Matrix m;
  m.codes.resize(w.size());
  m.scales.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t k = 0; k < width; ++k) amax = std::max(amax, std::fabs(w[r * width + k]));
    const float scale = fp8_weight_scale(amax);
    m.scales[r] = scale;
    for (int64_t k = 0; k < width; ++k)
      m.codes[r * width + k] = f32_to_fp8_e4m3(w[r * width + k] / scale);
  }
  return m;
}

Fp8Activations dynamic_scheme(float upper_bound = 0.0f) {
  Fp8Activations scheme;
  scheme.kind = Fp8Activations::Kind::kDynamicPerToken;
  scheme.upper_bound = upper_bound;
  return scheme;
}

TEST(CudaFp8, QuantizedInputsMatchTheDefinitionBitForBit) {
  ENTROPYINFER_REQUIRE_GPU();
  Fp8Activations static_scheme;
  static_scheme.kind = Fp8Activations::Kind::kStaticPerTensor;
  // A small static scale saturates many values; a bound of 2 clamps most rows' amax.
  const std::vector<std::pair<Fp8Activations, float>> schemes = {
      {dynamic_scheme(), 0.0f}, {dynamic_scheme(2.0f), 0.0f}, {static_scheme, 0.004f}};
  // 16-byte vector path, then an odd stride (scalar path).
  for (auto [rows, width, stride] : {std::tuple{5, 4096, 4096}, {3, 200, 210}, {33, 1024, 1032}}) {
    auto x = random_bf16_values(static_cast<size_t>(rows) * stride, 11, 3.0f);
    std::fill(x.begin() + stride, x.begin() + 2 * stride, 0.0f);  // a row of zeros
    const auto x_gpu = upload_bf16(x);
    for (const auto& [scheme, static_scale] : schemes) {
      SCOPED_TRACE(std::to_string(width) + " wide, " + scheme.describe());
      cuda::DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows) * width);
      cuda::DeviceBuffer<float> scales(static_cast<size_t>(rows));
      cuda::quantize_rows_fp8(x_gpu.data(), rows, width, stride, scheme, static_scale, codes.data(),
                              scales.data(), nullptr);
      const auto gpu_codes = download_codes(codes);
      const auto gpu_scales = download_floats(scales);
      std::vector<float> reference(static_cast<size_t>(width));
      int64_t mismatches = 0, saturated = 0;
      for (int r = 0; r < rows; ++r) {
        const float* row = x.data() + static_cast<size_t>(r) * stride;
        cpu::fp8_quantize_rows(row, 1, width, scheme, static_scale, reference.data());
        float scale = static_scale;
        if (scheme.kind == Fp8Activations::Kind::kDynamicPerToken) {
          float amax = 0.0f;
          for (int k = 0; k < width; ++k) amax = std::max(amax, std::fabs(row[k]));
          scale = fp8_dynamic_scale(amax, scheme.upper_bound);
        }
        ASSERT_EQ(gpu_scales[r], scale) << "row " << r;
        for (int k = 0; k < width; ++k) {
          const uint8_t code = gpu_codes[static_cast<size_t>(r) * width + k];
          mismatches += code != f32_to_fp8_e4m3(row[k] / scale);
          // The CPU reference product sees the same value.
          mismatches += fp8_e4m3_to_f32(code) * scale != reference[k];
          saturated += (code & 0x7f) == 0x7e;
        }
      }
      EXPECT_EQ(mismatches, 0);
      if (scheme.kind == Fp8Activations::Kind::kStaticPerTensor) {
        EXPECT_GT(saturated, 0);
      }
    }
  }
}

TEST(CudaFp8, WeightRowsQuantizeAsTheLoaderDoes) {
  ENTROPYINFER_REQUIRE_GPU();
  const int64_t rows = 97, width = 1000;
  auto w = random_bf16_values(static_cast<size_t>(rows * width), 12, 0.05f);
  std::fill(w.begin() + 3 * width, w.begin() + 4 * width, 0.0f);  // a zero row gets scale 1
  const HostFp8Matrix expected = quantize_on_host(w, rows, width);
  const auto w_gpu = upload_bf16(w);
  cuda::DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows * width));
  cuda::DeviceBuffer<float> scales(static_cast<size_t>(rows));
  cuda::quantize_weight_rows_fp8(w_gpu.data(), rows, width, codes.data(), scales.data(), nullptr);
  EXPECT_EQ(download_floats(scales), expected.scales);
  EXPECT_EQ(download_codes(codes), expected.codes);
  EXPECT_EQ(expected.scales[3], 1.0f);
}

// Both output types, accumulation, the GEMV (one token, one 28672-wide) and cuBLASLt (more) with
// and without fast accumulation, dynamic and static input scales. The quantized operands are
// identical to the CPU's, so the results differ only by how the sums are taken (and the bf16
// rounding of bf16 outputs). The outputs here are about N(0, 1); the bounds, absolute:
// - cuBLASLt, promoting to fp32: Hopper's FP8 tensor cores keep about 14 accumulator bits between
//   promotions: up to 1.1e-3 measured, bound 3e-3;
// - cuBLASLt, fast accumulation (no promotion, the engine's default): up to 1.5e-2 measured,
//   bound 4e-2;
// - the GEMV: fp16 sums of 16 exact products, then fp32: bound 2e-3.
TEST(CudaFp8, ProductsMatchTheCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  cuda::Blas blas;
  Fp8Activations static_scheme;
  static_scheme.kind = Fp8Activations::Kind::kStaticPerTensor;
  // Rows 2-8 take the small-batch kernel where the shape allows (Blas::fp8_small_batch_applies:
  // 7x512x96, 2x4096x1024, 8x14336x512), else cuBLASLt with per-row scales (33x14336x512,
  // 64x1024x208, ...); separate scaling has a test of its own below.
  for (auto [tokens, in, out] : {std::tuple{1, 4096, 1000},
                                 {1, 28672, 64},
                                 {1, 1024, 333},
                                 {7, 512, 96},
                                 {2, 4096, 1024},
                                 {8, 14336, 512},
                                 {33, 14336, 512},
                                 {64, 1024, 208},
                                 {64, 4096, 1000},
                                 {300, 1024, 1536}}) {
    for (const bool fast : {false, true}) {
      for (const Fp8Activations& scheme : {dynamic_scheme(), static_scheme}) {
        if (tokens == 1 && fast) continue;  // the GEMV sums one way
        SCOPED_TRACE(std::to_string(tokens) + "x" + std::to_string(in) + "x" + std::to_string(out) +
                     ", " + scheme.describe() + (fast ? ", fast accumulation" : ""));
        blas.set_fp8_fast_accumulation(fast);
        // The GEMV and the small-batch kernel sum in fp32 whatever the accumulation setting.
        const bool fp32_sums =
            tokens == 1 || cuda::Blas::fp8_small_batch_applies(tokens, in, out) || !fast;
        const double bound = tokens == 1 ? 2e-3 : fp32_sums ? 3e-3 : 4e-2;
        const auto x = random_bf16_values(static_cast<size_t>(tokens) * in, 13, 1.0f);
        const auto w = random_bf16_values(static_cast<size_t>(out) * in, 14, 1.0f / std::sqrt(in));
        const HostFp8Matrix host = quantize_on_host(w, out, in);
        const float static_scale = 3.0f / kFp8E4M3Max;  // inputs past 3 saturate
        cpu::WeightMatrix reference_matrix(host.codes.data(), TensorDtype::kF8E4M3);
        reference_matrix.scales = host.scales.data();
        reference_matrix.scale_count = out;
        reference_matrix.activations = scheme;
        reference_matrix.input_scale = static_scale;
        std::vector<float> expected(static_cast<size_t>(tokens) * out);
        cpu::linear(x.data(), tokens, in, reference_matrix, nullptr, out, expected.data());

        cuda::DeviceBuffer<uint8_t> codes(host.codes.size());
        codes.upload(host.codes.data(), host.codes.size());
        const auto scales = upload_floats(host.scales);
        cuda::DeviceMatrix matrix;
        matrix.codes = codes.data();
        matrix.scales = scales.data();
        matrix.in = in;
        matrix.activations = scheme;
        matrix.input_scale = static_scale;
        const auto x_gpu = upload_bf16(x);

        cuda::DeviceBuffer<cuda::bf16> y_bf16(expected.size());
        gpu_test::poison(y_bf16);
        blas.linear(x_gpu.data(), tokens, in, matrix, out, y_bf16.data());
        EXPECT_LE(worst_excess(download_bf16(y_bf16), expected, 1.0 / 128), bound);

        const auto initial = gpu_test::random_floats(expected.size(), 15);
        auto y_float = upload_floats(initial);
        blas.linear(x_gpu.data(), tokens, in, matrix, out, y_float.data(), /*accumulate=*/true);
        std::vector<float> accumulated = initial;
        for (size_t i = 0; i < accumulated.size(); ++i) accumulated[i] += expected[i];
        EXPECT_LE(worst_excess(download_floats(y_float), accumulated, 1e-5), bound);
      }
    }
  }
}

// A few rows through cuBLASLt both ways, unscaled plus the scaling kernel and with per-row scales
// in its epilogue, into rows of a wider output (a product's share of a fused output, as the
// engine's k and v rows): both stay within fast accumulation's bound of the CPU reference, and
// neither writes past its columns.
TEST(CudaFp8, SeparateScalingMatchesPerRowScalesInStridedOutputs) {
  ENTROPYINFER_REQUIRE_GPU();
  constexpr double kBound = 4e-2;
  const int64_t in = 4096, out = 1024, stride = 1536, offset = 256;
  for (const int64_t tokens : {int64_t{9}, int64_t{16}, cuda::Blas::kFp8SeparateScalingMaxRows}) {
    const auto x = random_bf16_values(static_cast<size_t>(tokens * in), 21, 1.0f);
    // Weight rows [offset, offset + out) of a larger matrix, as DeviceMatrix views take them.
    const auto w = random_bf16_values(static_cast<size_t>((offset + out) * in), 22,
                                      1.0f / std::sqrt(static_cast<float>(in)));
    const HostFp8Matrix host = quantize_on_host(w, offset + out, in);
    cpu::WeightMatrix reference_matrix(host.codes.data() + offset * in, TensorDtype::kF8E4M3);
    reference_matrix.scales = host.scales.data() + offset;
    reference_matrix.scale_count = out;
    reference_matrix.activations = dynamic_scheme();
    std::vector<float> expected(static_cast<size_t>(tokens * out));
    cpu::linear(x.data(), tokens, in, reference_matrix, nullptr, out, expected.data());
    cuda::DeviceBuffer<uint8_t> codes(host.codes.size());
    codes.upload(host.codes.data(), host.codes.size());
    const auto scales = upload_floats(host.scales);
    cuda::DeviceMatrix matrix;
    matrix.codes = codes.data() + offset * in;
    matrix.scales = scales.data() + offset;
    matrix.in = in;
    matrix.activations = dynamic_scheme();
    const auto x_gpu = upload_bf16(x);
    for (const bool separate : {true, false}) {
      SCOPED_TRACE(std::to_string(tokens) + " rows, " +
                   (separate ? "unscaled + scaling kernel" : "per-row scales in cuBLASLt"));
      cuda::Blas blas;
      blas.set_fp8_separate_scaling(separate);
      EXPECT_EQ(blas.fp8_separate_scaling_applies(tokens, matrix, out), separate);
      std::vector<float> untouched(static_cast<size_t>(tokens * stride), -7.0f);
      auto y = upload_floats(untouched);
      blas.linear(x_gpu.data(), tokens, in, matrix, out, y.data(), /*accumulate=*/false, stride);
      const auto got = download_floats(y);
      std::vector<float> rows(expected.size());
      int64_t overwritten = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t o = 0; o < stride; ++o) {
          const float value = got[static_cast<size_t>(t * stride + o)];
          if (o < out) {
            rows[static_cast<size_t>(t * out + o)] = value;
          } else {
            overwritten += value != -7.0f;
          }
        }
      }
      EXPECT_EQ(overwritten, 0);
      EXPECT_LE(worst_excess(rows, expected, 1e-5), kBound);
    }
  }
}

// A decode step's fused launches (RMSNorm or SwiGLU together with the FP8 GEMV's input) give the
// bits of the unfused kernels: the product, and the normed or activation rows they also write. Row
// widths pick each kernel's register counts; two tokens and bf16 weights take the unfused path.
TEST(CudaFp8, FusedGemvInputsGiveTheUnfusedBits) {
  ENTROPYINFER_REQUIRE_GPU();
  Fp8Activations static_scheme;
  static_scheme.kind = Fp8Activations::Kind::kStaticPerTensor;
  const std::vector<std::pair<Fp8Activations, float>> schemes = {
      {dynamic_scheme(), 0.0f}, {dynamic_scheme(0.5f), 0.0f}, {static_scheme, 0.002f}};
  const int64_t out = 272;
  for (const int64_t in : {int64_t{208}, int64_t{1008}, int64_t{4096}, int64_t{14336}}) {
    const auto w = random_bf16_values(static_cast<size_t>(out * in), 31,
                                      1.0f / std::sqrt(static_cast<float>(in)));
    const HostFp8Matrix host = quantize_on_host(w, out, in);
    cuda::DeviceBuffer<uint8_t> codes(host.codes.size());
    codes.upload(host.codes.data(), host.codes.size());
    const auto scales = upload_floats(host.scales);
    const auto w_bf16 = upload_bf16(w);
    for (const auto& [scheme, static_scale] : schemes) {
      for (const bool fp8 : {true, false}) {
        cuda::DeviceMatrix matrix;
        if (fp8) {
          matrix.codes = codes.data();
          matrix.scales = scales.data();
          matrix.activations = scheme;
          matrix.input_scale = static_scale;
        } else {
          matrix.values = w_bf16.data();
        }
        matrix.in = in;
        for (const int64_t tokens : {int64_t{1}, int64_t{2}}) {
          SCOPED_TRACE(std::to_string(in) + " wide, " + std::to_string(tokens) + " token(s), " +
                       (fp8 ? scheme.describe() : std::string("bf16 weights")));
          cuda::Blas blas;
          EXPECT_EQ(blas.fp8_gemv_runs(tokens, in, matrix), fp8 && tokens == 1);
          // RMSNorm of fp32 rows, then the product into bf16.
          const auto residual =
              upload_floats(random_bf16_values(static_cast<size_t>(tokens * in), 32, 4.0f));
          const auto norm_weight =
              upload_floats(random_bf16_values(static_cast<size_t>(in), 33, 1.0f));
          cuda::DeviceBuffer<cuda::bf16> normed_fused(static_cast<size_t>(tokens * in));
          cuda::DeviceBuffer<cuda::bf16> normed_plain(static_cast<size_t>(tokens * in));
          cuda::DeviceBuffer<cuda::bf16> y_fused(static_cast<size_t>(tokens * out));
          cuda::DeviceBuffer<cuda::bf16> y_plain(static_cast<size_t>(tokens * out));
          blas.normed_linear(residual.data(), norm_weight.data(), 1e-5f, normed_fused.data(),
                             tokens, in, matrix, out, y_fused.data());
          cuda::rms_norm(residual.data(), norm_weight.data(), tokens, in, 1e-5f,
                         normed_plain.data(), nullptr);
          blas.linear(normed_plain.data(), tokens, in, matrix, out, y_plain.data());
          EXPECT_EQ(download_bf16(normed_fused), download_bf16(normed_plain));
          EXPECT_EQ(download_bf16(y_fused), download_bf16(y_plain));
          // SwiGLU of a fused gate/up row pair, then the product added to fp32 rows.
          const auto gate_up =
              upload_bf16(random_bf16_values(static_cast<size_t>(tokens * 2 * in), 34, 3.0f));
          cuda::DeviceBuffer<cuda::bf16> activation_fused(static_cast<size_t>(tokens * in));
          cuda::DeviceBuffer<cuda::bf16> activation_plain(static_cast<size_t>(tokens * in));
          const auto start = random_bf16_values(static_cast<size_t>(tokens * out), 35, 1.0f);
          auto sum_fused = upload_floats(start);
          auto sum_plain = upload_floats(start);
          blas.swiglu_linear(gate_up.data(), gate_up.data() + in, tokens, in, 2 * in,
                             activation_fused.data(), matrix, out, sum_fused.data(), true);
          cuda::swiglu(gate_up.data(), gate_up.data() + in, tokens, in, 2 * in,
                       activation_plain.data(), nullptr);
          blas.linear(activation_plain.data(), tokens, in, matrix, out, sum_plain.data(), true);
          EXPECT_EQ(download_bf16(activation_fused), download_bf16(activation_plain));
          const auto fused = download_floats(sum_fused);
          EXPECT_EQ(fused, download_floats(sum_plain));
          EXPECT_NE(fused, start);  // the product was added
        }
      }
    }
  }
}

// The shipped model quantized at load: the GPU runs FP8 products (the plan says so) and agrees
// with the CPU running the same FP8 weights to the bound of the bf16 parity tests (the GPU keeps
// activations in bf16, so an input can fall on the other side of a rounding step), differs from
// the GPU's bf16 model, stays within kFp8Bound of transformers' bf16-weight logits up to 32k
// tokens, and gives the needle's answer token; greedy decoding (the captured FP8 GEMVs) runs.
TEST(CudaFp8, ShippedModelInFp8MatchesTheCpuAndStaysNearTransformers) {
  ENTROPYINFER_REQUIRE_GPU();
  constexpr double kCpuBound = 5e-2, kFp8Bound = 0.1;
  const std::vector<testing::ShippedModelCase> cases = testing::load_shipped_model_cases();
  ASSERT_FALSE(cases.empty()) << "tests/fixtures/shipped_model/expected.json is missing";
  const ModelWeights bf16_weights = load_model(testing::shipped_model_dir());
  ModelWeights weights = load_model(testing::shipped_model_dir());
  quantize_weights_fp8(weights);
  cuda::CudaModelOptions options;
  options.decode_room = 64;
  cuda::CudaTransformer fp8_model(weights, options);
  cuda::CudaTransformer bf16_model(bf16_weights, options);
  EXPECT_TRUE(fp8_model.memory_plan().fp8_weights);
  EXPECT_FALSE(bf16_model.memory_plan().fp8_weights);
  EXPECT_LT(fp8_model.memory_plan().weights, bf16_model.memory_plan().weights);
  for (const testing::ShippedModelCase& c : cases) {
    SCOPED_TRACE(c.name);
    fp8_model.reset();
    const std::vector<float> logits = fp8_model.forward(c.prompt);
    const double to_transformers = testing::relative_max_deviation(logits, c.last_logits);
    bf16_model.reset();
    const double to_bf16 = testing::relative_max_deviation(logits, bf16_model.forward(c.prompt));
    std::cout << c.name << " in FP8 on the GPU: within " << to_transformers
              << " of transformers' logits, " << to_bf16 << " of the GPU's bf16 model's\n";
    EXPECT_LE(to_transformers, kFp8Bound);
    EXPECT_GT(to_bf16, 1e-3) << "the FP8 model computed what the bf16 one did";
    const auto answer =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(answer, c.greedy_continuation.at(0));
    if (c.length <= 2048) {
      // One decode step too: the single-token path (the FP8 GEMVs).
      fp8_model.reset();
      fp8_model.forward(c.prompt);
      const std::vector<float> next = fp8_model.forward(std::vector<int32_t>{answer});
      Transformer cpu_model(weights, static_cast<int>(c.prompt.size()) + 8);
      const double to_cpu = testing::relative_max_deviation(logits, cpu_model.forward(c.prompt));
      const double step_to_cpu =
          testing::relative_max_deviation(next, cpu_model.forward(std::vector<int32_t>{answer}));
      std::cout << "  and within " << to_cpu << " of the CPU's FP8 model (" << step_to_cpu
                << " at the next token)\n";
      EXPECT_LE(to_cpu, kCpuBound);
      EXPECT_LE(step_to_cpu, kCpuBound);
      fp8_model.reset();
      int32_t token = fp8_model.forward_greedy(c.prompt);
      EXPECT_EQ(token, answer);
      for (int step = 0; step < 8; ++step) {
        token = fp8_model.forward_greedy(std::span<const int32_t>(&token, 1));
        ASSERT_GE(token, 0);
        ASSERT_LT(token, weights.config.vocab_size);
      }
    }
  }
}

// The PyTorch-quantized checkpoints of each format (tests/fixtures/fp8) on the GPU: FP8 products
// where the format quantizes inputs (weights-only ones run widened to bf16), within the bound of
// the bf16 parity tests of transformers' logits, since activations are bf16 here.
TEST(CudaFp8, FixturesOfEachFormatMatchTransformers) {
  ENTROPYINFER_REQUIRE_GPU();
  constexpr double kBound = 5e-2;
  const std::vector<testing::Fp8Fixture> fixtures = testing::load_fp8_fixtures();
  ASSERT_EQ(fixtures.size(), 4u);
  for (const testing::Fp8Fixture& fixture : fixtures) {
    SCOPED_TRACE(fixture.name);
    const ModelWeights weights = load_model(fixture.folder);
    cuda::CudaModelOptions options;
    options.decode_room = 16;
    cuda::CudaTransformer model(weights, options);
    EXPECT_EQ(model.memory_plan().fp8_weights,
              weights.layers.at(0).q_proj.activations.kind != Fp8Activations::Kind::kNone);
    for (size_t p = 0; p < fixture.prompts.size(); ++p) {
      model.reset();
      const double deviation = testing::relative_max_deviation(model.forward(fixture.prompts[p]),
                                                               fixture.last_logits[p]);
      std::cout << fixture.name << ", prompt " << p << " on the GPU: logits within " << deviation
                << " of transformers'\n";
      EXPECT_LE(deviation, kBound);
    }
  }
}

// Random FP8 weights (the benchmarks' models) draw bf16 rows and quantize them on the GPU; a
// prompt longer than a chunk and decode steps run through both FP8 product paths.
TEST(CudaFp8, RandomFp8ModelRunsPrefillAndDecode) {
  ENTROPYINFER_REQUIRE_GPU();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    const ModelConfig config = gpu_test::small_config(variant);
    cuda::CudaModelOptions options;
    options.chunk_tokens = 64;
    options.fp8_weights = true;
    options.decode_room = 32;
    cuda::CudaTransformer model(config, 7, options);
    EXPECT_TRUE(model.memory_plan().fp8_weights);
    std::vector<int32_t> prompt(200);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37) % 1000);
    const std::vector<float> logits = model.forward(prompt);
    ASSERT_EQ(logits.size(), 1000u);
    for (const float value : logits) ASSERT_TRUE(std::isfinite(value));
    int32_t token = model.forward_greedy(std::vector<int32_t>{5});
    for (int step = 0; step < 8; ++step) {
      token = model.forward_greedy(std::span<const int32_t>(&token, 1));
      ASSERT_GE(token, 0);
      ASSERT_LT(token, 1000);
    }
  }
}

}  // namespace
}  // namespace entropyinfer

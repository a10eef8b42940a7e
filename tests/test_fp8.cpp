// FP8 E4M3 rounding and scale rules (core/fp8.h) and the CPU's FP8 products, checked against a
// brute-force nearest-code search and against products over explicitly widened operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "core/fp8.h"

namespace entropyinfer {
namespace {

bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// The code nearest to x among all finite codes; ties go to the even code (an even mantissa), and
// magnitudes past 448 saturate.
uint8_t nearest_code(float x) {
  int best = -1;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    if ((code & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;
    const double distance = std::fabs(static_cast<double>(fp8_e4m3_to_f32(code)) - x);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(Fp8, RoundsToTheNearestCodeWithTiesToEven) {
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), f32_to_fp8_e4m3(1.0f));              // between m = 0 and 1
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), f32_to_fp8_e4m3(1.25f));             // between m = 1 and 2
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-10f), 0x00);                              // half the smallest step
  EXPECT_EQ(f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02);                          // between 1 and 2 steps
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(15.5f * 0x1p-10f)), 0x1p-6f);  // up to the normals
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float magnitude = std::exp2(exponent(generator));
    const float x = i % 2 == 0 ? magnitude : -magnitude;
    ASSERT_EQ(f32_to_fp8_e4m3(x), nearest_code(x)) << x;
  }
}

TEST(Fp8, SaturatesAtTheLargestFiniteValueAndKeepsNan) {
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(1e6f)), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(-470.0f)), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity())), 448.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(std::nanf("")))));
}

TEST(Fp8, ScalesMapTheLargestMagnitudeTo448) {
  EXPECT_EQ(fp8_weight_scale(896.0f), 2.0f);
  EXPECT_EQ(fp8_weight_scale(0.0f), 1.0f);
  EXPECT_EQ(fp8_dynamic_scale(44.8f, 0.0f), 0.1f);
  EXPECT_EQ(fp8_dynamic_scale(0.0f, 0.0f), kFp8MinActivationScale);
  EXPECT_EQ(fp8_dynamic_scale(4480.0f, 1200.0f), 1200.0f / 448.0f);  // fbgemm's bound
}

TEST(Fp8, QuantizedRowsKeepTheirLargestValueAndRoundTheRest) {
  const std::vector<float> x = {0.5f, -3.0f, 0.01f, 2.9f, /* row 2 */ 7.0f, 0.0f, -0.3f, 1.0f};
  std::vector<float> out(x.size());
  Fp8Activations dynamic;
  dynamic.kind = Fp8Activations::Kind::kDynamicPerToken;
  cpu::fp8_quantize_rows(x.data(), 2, 4, dynamic, 0.0f, out.data());
  EXPECT_FLOAT_EQ(out[1], -3.0f);
  EXPECT_FLOAT_EQ(out[4], 7.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    const float scale = fp8_dynamic_scale(i < 4 ? 3.0f : 7.0f, 0.0f);
    EXPECT_EQ(out[i], fp8_round_trip(x[i], scale)) << i;
  }
  Fp8Activations fixed;
  fixed.kind = Fp8Activations::Kind::kStaticPerTensor;
  cpu::fp8_quantize_rows(x.data(), 2, 4, fixed, 0.004f, out.data());  // 7 / 0.004 saturates
  EXPECT_FLOAT_EQ(out[4], 448.0f * 0.004f);
  EXPECT_EQ(out[2], fp8_round_trip(0.01f, 0.004f));
}

// The FP8 KV cache's row rule: one scale per row from its own largest magnitude.
TEST(Fp8, KvCacheRowsAreQuantizedEachWithItsOwnScale) {
  const std::vector<float> row = {0.5f, -896.0f, 0.01f, 300.0f, -0.3f, 1.0f, 0.0f, 17.25f};
  const int width = static_cast<int>(row.size());
  EXPECT_EQ(fp8_kv_row_scale(row.data(), width), 2.0f);  // 896 / 448
  std::vector<float> round_tripped = row;
  fp8_kv_round_trip_row(round_tripped.data(), width);
  for (int i = 0; i < width; ++i) {
    EXPECT_EQ(round_tripped[i], fp8_round_trip(row[i], 2.0f)) << i;
  }
  EXPECT_EQ(round_tripped[1], -896.0f);
  EXPECT_EQ(round_tripped[7], 18.0f);  // 17.25 / 2 = 8.625 lies between the codes 8 and 9

  std::vector<uint8_t> codes(row.size());
  EXPECT_EQ(fp8_kv_quantize_row(row.data(), width, codes.data()), 2.0f);
  EXPECT_EQ(codes[1], 0xfe);  // -448, the largest finite magnitude
  for (int i = 0; i < width; ++i) {
    EXPECT_EQ(fp8_e4m3_to_f32(codes[i]) * 2.0f, round_tripped[i]) << i;
  }
}

// The largest element takes the code 448 and reads back as 448 * scale, which is the element
// itself or (for about one amax in nine) one ulp from it, as 448 * (amax / 448) rounds.
TEST(Fp8, KvCacheRowsLargestElementReadsBackAs448TimesTheScale) {
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(64);
    for (float& x : row) x = normal(generator);
    const auto largest = std::max_element(
        row.begin(), row.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
    const float amax = std::fabs(*largest);
    const float scale = fp8_kv_row_scale(row.data(), 64);
    EXPECT_EQ(scale, amax / 448.0f);
    std::vector<uint8_t> codes(64);
    EXPECT_EQ(fp8_kv_quantize_row(row.data(), 64, codes.data()), scale);
    const size_t at = static_cast<size_t>(largest - row.begin());
    EXPECT_EQ(codes[at] & 0x7f, 0x7e);
    std::vector<float> round_tripped = row;
    fp8_kv_round_trip_row(round_tripped.data(), 64);
    EXPECT_EQ(std::fabs(round_tripped[at]), 448.0f * scale);
    EXPECT_LE(std::fabs(std::fabs(round_tripped[at]) - amax),
              std::nextafter(amax, INFINITY) - amax);
    for (size_t i = 0; i < row.size(); ++i) {
      EXPECT_EQ(round_tripped[i], fp8_e4m3_to_f32(codes[i]) * scale) << i;
      EXPECT_EQ(round_tripped[i], fp8_round_trip(row[i], scale)) << i;
    }
  }
}

TEST(Fp8, KvCacheAllZeroRowStaysZeroWithScaleOne) {
  std::vector<float> row(16, 0.0f);
  EXPECT_EQ(fp8_kv_row_scale(row.data(), 16), 1.0f);
  std::vector<uint8_t> codes(16, 0xff);
  EXPECT_EQ(fp8_kv_quantize_row(row.data(), 16, codes.data()), 1.0f);
  fp8_kv_round_trip_row(row.data(), 16);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(codes[i], 0) << i;
    EXPECT_EQ(row[i], 0.0f) << i;
  }
}

// An FP8 product equals the fp32 product of the widened weights and the quantized inputs.
TEST(Fp8, CpuProductsWidenTheWeightsAndQuantizeTheInputs) {
  const int64_t tokens = 5, in = 40, out = 13;
  std::mt19937 generator(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * in)), bias(static_cast<size_t>(out));
  for (float& value : x) value = uniform(generator);
  for (float& value : bias) value = uniform(generator);
  std::vector<uint8_t> codes(static_cast<size_t>(out * in));
  for (uint8_t& code : codes) code = f32_to_fp8_e4m3(uniform(generator) * 300.0f);
  std::vector<float> scales(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) scales[static_cast<size_t>(o)] = 0.001f * (1 + o);
  for (const auto kind : {Fp8Activations::Kind::kNone, Fp8Activations::Kind::kDynamicPerToken}) {
    SCOPED_TRACE(static_cast<int>(kind));
    cpu::WeightMatrix matrix(codes.data(), TensorDtype::kF8E4M3);
    matrix.scales = scales.data();
    matrix.scale_count = out;
    matrix.activations.kind = kind;
    std::vector<float> y(static_cast<size_t>(tokens * out));
    cpu::linear(x.data(), tokens, in, matrix, bias.data(), out, y.data());

    std::vector<float> widened(codes.size()), inputs(x.size());
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < in; ++k) {
        const size_t i = static_cast<size_t>(o * in + k);
        widened[i] = fp8_e4m3_to_f32(codes[i]) * scales[static_cast<size_t>(o)];
      }
    }
    cpu::fp8_quantize_rows(x.data(), tokens, in, matrix.activations, 0.0f, inputs.data());
    if (kind == Fp8Activations::Kind::kDynamicPerToken) {
      EXPECT_NE(inputs, x) << "quantization left every input as it was";
    }
    std::vector<float> expected(y.size());
    cpu::linear(inputs.data(), tokens, in, widened.data(), bias.data(), out, expected.data());
    EXPECT_EQ(y, expected);
  }
}

}  // namespace
}  // namespace entropyinfer

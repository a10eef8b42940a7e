// CPU ops against naive loops written here, on random inputs with awkward sizes (tails that are not
// a multiple of the SIMD width, token counts that are not a multiple of the tile).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_ops.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::random_vector;

TEST(CpuOps, LinearMatchesNaiveProductForAwkwardShapes) {
  for (auto [tokens, in, out] :
       {std::tuple{1, 7, 5}, {3, 17, 13}, {9, 64, 31}, {5, 172, 64}, {13, 300, 97}}) {
    const auto x = random_vector(tokens * in, 1);
    const auto w = random_vector(out * in, 2);
    const auto bias = random_vector(out, 3);
    std::vector<float> y(tokens * out);
    cpu::linear(x.data(), tokens, in, w.data(), bias.data(), out, y.data());
    for (int t = 0; t < tokens; ++t) {
      for (int o = 0; o < out; ++o) {
        double expected = bias[o];
        for (int k = 0; k < in; ++k) expected += static_cast<double>(x[t * in + k]) * w[o * in + k];
        ASSERT_NEAR(y[t * out + o], expected, 1e-4 * (1 + std::fabs(expected)))
            << tokens << "x" << in << "x" << out << " at " << t << "," << o;
      }
    }
  }
}

// 16-bit weights read as stored give the very sums of their fp32 widening: the conversions are
// exact and the kernels sum in the same order. f16 patterns cover its whole finite range
// (subnormals and signed zeros included); bf16 ones keep products within fp32's range.
TEST(CpuOps, SixteenBitWeightsGiveTheSumsOfTheirFp32Widening) {
  for (const TensorDtype dtype : {TensorDtype::kBF16, TensorDtype::kF16}) {
    for (auto [tokens, in, out] : {std::tuple{1, 7, 5}, {4, 64, 31}, {9, 172, 64}, {5, 300, 13}}) {
      SCOPED_TRACE(std::string(dtype == TensorDtype::kBF16 ? "bf16 " : "f16 ") +
                   std::to_string(tokens) + "x" + std::to_string(in) + "x" + std::to_string(out));
      std::mt19937 random(17);
      std::vector<uint16_t> bits(static_cast<size_t>(out) * in);
      std::vector<float> widened(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) {
        uint16_t pattern = static_cast<uint16_t>(random());
        if (dtype == TensorDtype::kF16) {
          if ((pattern & 0x7c00) == 0x7c00) pattern &= 0xbfff;  // no infinity or NaN
          widened[i] = f16_to_f32(pattern);
        } else {
          const uint16_t exponent = static_cast<uint16_t>(112 + random() % 24);
          pattern = static_cast<uint16_t>((pattern & 0x807f) | (exponent << 7));
          widened[i] = bf16_to_f32(pattern);
        }
        bits[i] = pattern;
      }
      const auto x = random_vector(tokens * in, 1);
      const auto bias = random_vector(out, 3);
      std::vector<float> from_bits(tokens * out), from_floats(tokens * out);
      cpu::linear(x.data(), tokens, in, cpu::WeightMatrix{bits.data(), dtype}, bias.data(), out,
                  from_bits.data());
      cpu::linear(x.data(), tokens, in, widened.data(), bias.data(), out, from_floats.data());
      EXPECT_EQ(std::memcmp(from_bits.data(), from_floats.data(), from_bits.size() * 4), 0);
    }
  }
}

TEST(CpuOps, SixteenBitInfinitiesAndNaNsSurviveTheProduct) {
  // f16 +inf, -inf and a NaN, then bf16's; each in lane 0 of an 8-wide row (the vector path) and
  // in a tail lane (the scalar path), read through x = e_k.
  const std::vector<std::pair<TensorDtype, uint16_t>> cases = {
      {TensorDtype::kF16, 0x7c00},  {TensorDtype::kF16, 0xfc00},  {TensorDtype::kF16, 0x7e00},
      {TensorDtype::kBF16, 0x7f80}, {TensorDtype::kBF16, 0xff80}, {TensorDtype::kBF16, 0x7fc0}};
  for (const auto& [dtype, pattern] : cases) {
    for (const int lane : {0, 8}) {
      std::vector<uint16_t> row(9, 0);
      row[lane] = pattern;
      std::vector<float> x(9, 0.0f);
      x[lane] = 1.0f;
      float y = 0.0f;
      cpu::linear(x.data(), 1, 9, cpu::WeightMatrix{row.data(), dtype}, nullptr, 1, &y);
      const float expected =
          dtype == TensorDtype::kF16 ? f16_to_f32(pattern) : bf16_to_f32(pattern);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(y)) << std::hex << pattern << " lane " << lane;
      } else {
        EXPECT_EQ(y, expected) << std::hex << pattern << " lane " << lane;
      }
    }
  }
}

TEST(CpuOps, RmsNormMatchesFormula) {
  const int rows = 3, size = 19;
  const auto x = random_vector(rows * size, 4);
  const auto weight = random_vector(size, 5);
  std::vector<float> out(rows * size);
  cpu::rms_norm(x.data(), weight.data(), rows, size, 1e-6f, out.data());
  for (int r = 0; r < rows; ++r) {
    double squares = 0;
    for (int i = 0; i < size; ++i) squares += x[r * size + i] * x[r * size + i];
    const double inverse = 1.0 / std::sqrt(squares / size + 1e-6);
    for (int i = 0; i < size; ++i) {
      EXPECT_NEAR(out[r * size + i], x[r * size + i] * inverse * weight[i], 1e-5);
    }
  }
}

TEST(CpuOps, RopeRotatesHalvesOrAdjacentPairs) {
  const int tokens = 2, heads = 3, head_dim = 8, half = 4;
  const auto x = random_vector(tokens * heads * head_dim, 6);
  std::vector<float> cos(tokens * half), sin(tokens * half);
  for (int i = 0; i < tokens * half; ++i) {
    cos[i] = std::cos(0.1f * (i + 1));
    sin[i] = std::sin(0.1f * (i + 1));
  }
  for (bool adjacent : {false, true}) {
    std::vector<float> rotated = x;
    cpu::apply_rope(rotated.data(), tokens, heads, head_dim, cos.data(), sin.data(), head_dim,
                    adjacent);
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const float* in = x.data() + (t * heads + h) * head_dim;
        const float* out = rotated.data() + (t * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const int a = adjacent ? 2 * i : i;
          const int b = adjacent ? 2 * i + 1 : i + half;
          const float c = cos[t * half + i], s = sin[t * half + i];
          EXPECT_NEAR(out[a], in[a] * c - in[b] * s, 1e-6);
          EXPECT_NEAR(out[b], in[b] * c + in[a] * s, 1e-6);
        }
      }
    }
  }
}

// Naive causal GQA attention in double, one query at a time.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& keys,
                                    const std::vector<float>& values,
                                    const cpu::AttentionShape& s) {
  std::vector<double> out(s.tokens * s.q_heads * s.head_dim, 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kv = h / (s.q_heads / s.kv_heads);
      const int64_t last = s.first_position + t;
      const int64_t first = s.window > 0 ? std::max<int64_t>(0, last - s.window + 1) : 0;
      std::vector<double> scores;
      double max_score = -1e300;
      for (int64_t j = first; j <= last; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < s.head_dim; ++d) {
          dot += q[(t * s.q_heads + h) * s.head_dim + d] *
                 keys[(kv * s.cache_stride + j) * s.head_dim + d];
        }
        scores.push_back(dot * s.scale);
        max_score = std::max(max_score, scores.back());
      }
      double total = 0;
      for (double& score : scores) total += (score = std::exp(score - max_score));
      for (size_t j = 0; j < scores.size(); ++j) {
        for (int64_t d = 0; d < s.head_dim; ++d) {
          out[(t * s.q_heads + h) * s.head_dim + d] +=
              scores[j] / total * values[(kv * s.cache_stride + first + j) * s.head_dim + d];
        }
      }
    }
  }
  return out;
}

TEST(CpuOps, CausalAttentionMatchesNaiveWithGqaCacheOffsetAndWindow) {
  for (int64_t window : {0, 5}) {
    cpu::AttentionShape shape;
    shape.tokens = 6;
    shape.q_heads = 4;
    shape.kv_heads = 2;
    shape.head_dim = 12;
    shape.first_position = 7;
    shape.cache_stride = 20;
    shape.window = window;
    shape.scale = 1.0f / std::sqrt(12.0f);
    const auto q = random_vector(shape.tokens * shape.q_heads * shape.head_dim, 7);
    const auto keys = random_vector(shape.kv_heads * shape.cache_stride * shape.head_dim, 8);
    const auto values = random_vector(shape.kv_heads * shape.cache_stride * shape.head_dim, 9);
    std::vector<float> out(q.size());
    cpu::causal_attention(q.data(), keys.data(), values.data(), shape, out.data());
    const auto expected = naive_attention(q, keys, values, shape);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], expected[i], 1e-5) << "window " << window;
  }
}

TEST(CpuOps, SwigluAndSoftmax) {
  std::vector<float> gate = {-2.0f, 0.0f, 3.0f};
  const std::vector<float> up = {1.5f, 2.0f, -1.0f};
  cpu::swiglu_inplace(gate.data(), up.data(), 3);
  EXPECT_NEAR(gate[0], -2.0 / (1 + std::exp(2.0)) * 1.5, 1e-6);
  EXPECT_NEAR(gate[1], 0.0, 1e-7);
  EXPECT_NEAR(gate[2], 3.0 / (1 + std::exp(-3.0)) * -1.0, 1e-6);
  std::vector<float> logits = {1000.0f, 1001.0f, 999.0f};  // would overflow without the max shift
  cpu::softmax_inplace(logits.data(), 3);
  const double total = std::exp(0.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(logits[1], std::exp(1.0) / total, 1e-6);
  EXPECT_NEAR(logits[0] + logits[1] + logits[2], 1.0, 1e-6);
}

}  // namespace
}  // namespace entropyinfer

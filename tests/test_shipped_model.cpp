// The shipped model (models/needle-llama-11m) on the CPU engine against transformers' float32
// logits and greedy continuation on evaluation prompts (scripts/shipped_model_parity.py). Only the
// short prompts run here; the 32k-token one runs on the GPU
// (tests/gpu/test_cuda_shipped_model.cpp). Both sides compute in float32 from the same bf16
// weights, so the bound is tight: 1e-4 of the largest logit (summation order only; 8.5e-7 measured
// at 1k tokens).
#include <gtest/gtest.h>

#include "engine/transformer.h"
#include "model/model_weights.h"
#include "model/quantize_weights.h"
#include "shipped_model_support.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

constexpr int kLongestOnCpu = 2048;
constexpr double kMaxRelativeDeviation = 1e-4;

TEST(ShippedModel, LoadsAsTheModelCardSays) {
  const ModelWeights weights = load_model(testing::shipped_model_dir());
  EXPECT_EQ(weights.config.architecture, "LlamaForCausalLM");
  EXPECT_EQ(weights.config.num_layers, 6);
  EXPECT_EQ(weights.config.num_heads, 6);
  EXPECT_EQ(weights.config.num_kv_heads, 2);
  EXPECT_EQ(weights.config.head_dim, 64);
  EXPECT_EQ(weights.config.max_position_embeddings, 32768);
  EXPECT_TRUE(weights.config.tied_embeddings);
  EXPECT_LE(std::filesystem::file_size(testing::shipped_model_dir() + "/model.safetensors"),
            50u * 1000 * 1000);
}

TEST(ShippedModel, MatchesTransformersOnShortEvaluationPrompts) {
  const std::vector<testing::ShippedModelCase> cases = testing::load_shipped_model_cases();
  ASSERT_FALSE(cases.empty()) << "tests/fixtures/shipped_model/expected.json is missing";
  const ModelWeights weights = load_model(testing::shipped_model_dir());
  int checked = 0;
  for (const testing::ShippedModelCase& c : cases) {
    if (c.length > kLongestOnCpu) continue;
    SCOPED_TRACE(c.name);
    Transformer transformer(weights,
                            static_cast<int>(c.prompt.size() + c.greedy_continuation.size()));
    std::vector<float> logits = transformer.forward(c.prompt);
    const double deviation = testing::relative_max_deviation(logits, c.last_logits);
    std::cout << c.name << ": last-position logits within " << deviation
              << " of transformers' (relative to the largest)\n";
    EXPECT_LE(deviation, kMaxRelativeDeviation);
    for (size_t step = 0; step < c.greedy_continuation.size(); ++step) {
      const auto token =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_EQ(token, c.greedy_continuation[step]) << "greedy step " << step;
      if (step + 1 < c.greedy_continuation.size())
        logits = transformer.forward(std::vector<int32_t>{token});
    }
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no prompt of at most " << kLongestOnCpu << " tokens in the fixture";
}

// Quantized at load (--weights fp8: E4M3 weights with one scale per output channel, inputs
// quantized per token) the model stays near transformers' bf16-weight logits: within kFp8Bound of
// the largest logit, and the needle's answer comes out first. The bound is a quality contract,
// set above the 1k prompt's measured deviation; the logits must also move (the FP8 products ran).
TEST(ShippedModel, QuantizedToFp8StaysNearTransformersLogits) {
  constexpr double kFp8Bound = 0.05;
  const std::vector<testing::ShippedModelCase> cases = testing::load_shipped_model_cases();
  ASSERT_FALSE(cases.empty()) << "tests/fixtures/shipped_model/expected.json is missing";
  ModelWeights weights = load_model(testing::shipped_model_dir());
  quantize_weights_fp8(weights);
  ASSERT_TRUE(weights.layers.at(0).down_proj.fp8());
  int checked = 0;
  for (const testing::ShippedModelCase& c : cases) {
    if (c.length > kLongestOnCpu) continue;
    SCOPED_TRACE(c.name);
    Transformer transformer(weights,
                            static_cast<int>(c.prompt.size() + c.greedy_continuation.size()));
    const std::vector<float> logits = transformer.forward(c.prompt);
    const double deviation = testing::relative_max_deviation(logits, c.last_logits);
    std::cout << c.name << " in FP8: last-position logits within " << deviation
              << " of transformers' bf16-weight ones (relative to the largest)\n";
    EXPECT_LE(deviation, kFp8Bound);
    EXPECT_GT(deviation, kMaxRelativeDeviation) << "the FP8 weights changed nothing";
    const auto token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(token, c.greedy_continuation.at(0)) << "the answer's first token";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace entropyinfer

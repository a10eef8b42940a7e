// The shipped model (models/needle-llama-11m) on the CUDA engine against transformers' float32
// logits and greedy continuation (scripts/shipped_model_parity.py), the 32k-token evaluation
// prompt included: the needle answer must come out of the engine, not only out of PyTorch.
// The engine keeps activations in bf16 here, so the bound is the bf16 one of the parity fixtures:
// 5e-2 of the largest logit; the greedy answer token must be transformers'.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "engine/cuda/cuda_transformer.h"
#include "gpu/gpu_test_support.h"
#include "model/model_weights.h"
#include "shipped_model_support.h"

namespace entropyinfer {
namespace {

constexpr double kMaxRelativeDeviation = 5e-2;

TEST(CudaShippedModel, MatchesTransformersUpTo32kTokens) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::vector<testing::ShippedModelCase> cases = testing::load_shipped_model_cases();
  ASSERT_FALSE(cases.empty()) << "tests/fixtures/shipped_model/expected.json is missing";
  const ModelWeights weights = load_model(testing::shipped_model_dir());
  cuda::CudaModelOptions options;
  options.decode_room = 64;
  cuda::CudaTransformer transformer(weights, options);
  for (const testing::ShippedModelCase& c : cases) {
    SCOPED_TRACE(c.name);
    transformer.reset();
    std::vector<float> logits = transformer.forward(c.prompt);
    const double deviation = testing::relative_max_deviation(logits, c.last_logits);
    std::cout << c.name << " (" << c.prompt.size() << " tokens): last-position logits within "
              << deviation << " of transformers' (relative to the largest), top-2 margin "
              << c.top2_margin << "\n";
    EXPECT_LE(deviation, kMaxRelativeDeviation);
    size_t agreeing = 0;
    for (size_t step = 0; step < c.greedy_continuation.size(); ++step) {
      const auto token =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (step == 0) {
        ASSERT_EQ(token, c.greedy_continuation[0]) << "the answer token differs from transformers'";
      }
      if (token != c.greedy_continuation[step]) break;
      ++agreeing;
      if (step + 1 < c.greedy_continuation.size())
        logits = transformer.forward(std::vector<int32_t>{token});
    }
    std::cout << "  greedy continuation: " << agreeing << " of " << c.greedy_continuation.size()
              << " tokens as transformers\n";
  }
}

}  // namespace
}  // namespace entropyinfer

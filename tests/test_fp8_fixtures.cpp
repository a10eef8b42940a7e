// FP8 checkpoints of each format quantized by PyTorch (tests/fixtures/fp8) run on the CPU engine
// as transformers runs them with the format's quantization (scripts/make_fp8_fixtures.py): the
// last-position logits within kBound of the largest (2e-5: up to 3e-6 measured), and the greedy
// continuations transformers chose wherever its top-two margin clears kMinMargin. Both sides
// compute in float32 from the same codes and scales, so what differs is summation order, and now
// and then an activation landing on the other side of an E4M3 rounding step because of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "engine/transformer.h"
#include "fp8_fixture_support.h"
#include "model/model_weights.h"
#include "shipped_model_support.h"

namespace entropyinfer {
namespace {

constexpr double kBound = 2e-5;
constexpr double kMinMargin = 1e-2;

TEST(Fp8Fixtures, EachFormatMatchesTransformersQuantizedModel) {
  const std::vector<testing::Fp8Fixture> fixtures = testing::load_fp8_fixtures();
  ASSERT_EQ(fixtures.size(), 4u) << "tests/fixtures/fp8 should hold the four formats' fixtures";
  for (const testing::Fp8Fixture& fixture : fixtures) {
    SCOPED_TRACE(fixture.name);
    const ModelWeights weights = load_model(fixture.folder);
    EXPECT_FALSE(weights.fp8_scheme.empty());
    EXPECT_TRUE(weights.layers.at(0).q_proj.fp8());
    // Where the format quantizes inputs, leaving that out would move the logits far past kBound.
    if (fixture.name != "ct_weights_only") {
      EXPECT_GT(fixture.activation_effect, 100 * kBound);
    }
    for (size_t p = 0; p < fixture.prompts.size(); ++p) {
      const std::vector<int32_t>& prompt = fixture.prompts[p];
      Transformer model(weights, static_cast<int>(prompt.size() + fixture.greedy[p].size()));
      std::vector<float> logits = model.forward(prompt);
      const double deviation = testing::relative_max_deviation(logits, fixture.last_logits[p]);
      std::cout << fixture.name << ", prompt " << p << ": logits within " << deviation
                << " of transformers' (input quantization alone moves them "
                << fixture.activation_effect << ")\n";
      EXPECT_LE(deviation, kBound);
      for (size_t step = 0; step < fixture.greedy[p].size(); ++step) {
        if (fixture.top2_margins[p][step] < kMinMargin) break;
        const auto token =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        ASSERT_EQ(token, fixture.greedy[p][step]) << "greedy step " << step;
        logits = model.forward(std::vector<int32_t>{token});
      }
    }
  }
}

}  // namespace
}  // namespace entropyinfer

// FP8 checkpoints of each format quantized by PyTorch (tests/fixtures/fp8) run on the CPU engine
// as transformers runs them with the format's quantization (scripts/make_fp8_fixtures.py): the
// last-position logits within kBound of the largest (2e-5: up to 3e-6 measured), and the greedy
// continuations transformers chose wherever its top-two margin clears kMinMargin. Both sides
// compute in float32 from the same codes and scales, so what differs is summation order, and now
// and then an activation landing on the other side of an E4M3 rounding step because of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

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

// The FP8 KV cache (fp8_kv_cache) against transformers with each cached row round-tripped through
// float8_e4m3fn by the same rule (kv_cache_fp8/expected_kv_cache.json, on ct_weights_only's
// checkpoint): the prompt's last logits and those of each token fed after it within kKvCacheBound
// of the largest. Both sides compute in float32, so the rows they quantize differ in their last
// bits only (summation order, as above); but a row element that lands on the other side of an E4M3
// rounding step moves by a whole step (1/16 of itself) and carries that into every later layer
// and step, which can move a logit far more than 2e-5: 2e-4 allows a few such codes and is still
// far below what the FP8 cache itself moves (kv_effect, checked to be over 10x the bound).
TEST(Fp8Fixtures, KvCacheMatchesTransformersWithRowsRoundTripped) {
  constexpr double kKvCacheBound = 2e-4;
  const std::filesystem::path path = std::filesystem::path(ENTROPYINFER_FIXTURES_DIR) / "fp8" /
                                     "kv_cache_fp8" / "expected_kv_cache.json";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path.string()
                 << " is missing: scripts/make_fp8_fixtures.py --only kv_cache_fp8 writes it";
  }
  std::ifstream stream(path);
  const nlohmann::json expected = nlohmann::json::parse(stream);
  const auto prompts = expected.at("prompts").get<std::vector<std::vector<int32_t>>>();
  const auto fed = expected.at("fed").get<std::vector<std::vector<int32_t>>>();
  const auto logits = expected.at("logits").get<std::vector<std::vector<std::vector<float>>>>();
  const double kv_effect = expected.at("kv_effect").get<double>();
  EXPECT_GT(kv_effect, 10 * kKvCacheBound) << "the FP8 cache should move the logits past the bound";
  const ModelWeights weights = load_model(
      (path.parent_path().parent_path() / expected.at("model").get<std::string>()).string());
  ASSERT_EQ(prompts.size(), fed.size());
  ASSERT_EQ(prompts.size(), logits.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(logits[p].size(), fed[p].size() + 1);
    Transformer model(weights, static_cast<int>(prompts[p].size() + fed[p].size()), {}, true);
    std::vector<float> engine = model.forward(prompts[p]);
    double worst = 0.0;
    for (size_t step = 0; step < logits[p].size(); ++step) {
      if (step > 0) engine = model.forward(std::vector<int32_t>{fed[p][step - 1]});
      const double deviation = testing::relative_max_deviation(engine, logits[p][step]);
      EXPECT_LE(deviation, kKvCacheBound) << "prompt " << p << ", step " << step;
      worst = std::max(worst, deviation);
    }
    std::cout << "FP8 KV cache, prompt " << p << ": logits within " << worst
              << " of transformers' (the FP8 cache alone moves them " << kv_effect << ")\n";
  }
}

}  // namespace
}  // namespace entropyinfer

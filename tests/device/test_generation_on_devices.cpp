// generate() through the one engine interface, the same bodies on every device (see
// device_test_support.h), on the shipped model: seeded sampling repeats exactly under each
// attention method while the method visibly changes the work, streamed text is the result's
// text, sampled tokens are the sampler's on the model's own logits, and stop strings and stop
// tokens end the run where they appear.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "device/device_test_support.h"
#include "engine/generation.h"
#include "engine/sampler.h"
#include "model/model_weights.h"
#include "shipped_model_support.h"
#include "small_budgets.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

// About 350 tokens: long enough for the small budgets below to make every method sparse.
std::string long_prompt() {
  std::string text;
  for (int i = 0; i < 20; ++i) {
    text += "Line " + std::to_string(i) + ": the keeper of the lighthouse counted " +
            std::to_string(7 * i + 3) + " ships before dawn. ";
  }
  return text + "The number of ships the keeper counted on line 12 was";
}

class Generation : public testing::OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
    if (IsSkipped()) return;
    weights_ = std::make_unique<ModelWeights>(load_model(testing::shipped_model_dir()));
    tokenizer_ = load_tokenizer(testing::shipped_model_dir() + "/tokenizer.json");
    prompt_ = tokenizer_->encode(long_prompt(), {.add_bos = true});
  }

  GenerationResult run(LanguageModel& model, const GenerationOptions& options,
                       std::string* streamed = nullptr) {
    model.reset();
    return generate(model, *tokenizer_, prompt_, options, [&](std::string_view piece) {
      if (streamed) streamed->append(piece);
    });
  }

  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t> prompt_;
};

TEST_P(Generation, SeededSamplingRepeatsUnderEveryMethod) {
  ASSERT_GT(prompt_.size(), 300u);
  const int context = static_cast<int>(prompt_.size()) + 64;
  GenerationOptions options;
  options.max_tokens = 16;
  options.sampler.temperature = 0.9f;
  options.sampler.top_k = 50;
  options.sampler.top_p = 0.95f;
  options.sampler.seed = 1234;
  for (const char* methods : {"full", "entropy+latent", "critiprefill+snapkv"}) {
    SCOPED_TRACE(methods);
    const AttentionConfig attention = testing::small_budgets(methods);
    const std::unique_ptr<LanguageModel> model = open(*weights_, context, attention);
    std::string streamed;
    const GenerationResult first = run(*model, options, &streamed);
    const AttentionWork work = model->attention_work();
    const GenerationResult second = run(*model, options);
    EXPECT_EQ(first.tokens, second.tokens) << "the same seed sampled different tokens";
    EXPECT_EQ(first.text, second.text);
    EXPECT_EQ(streamed, first.text) << "the streamed pieces are not the result's text";
    EXPECT_EQ(first.tokens.size(), 16u) << first.stop_reason;
    // The method ran: sparse prefills read fewer keys, compressing methods shrank the cache.
    if (attention.prefill == PrefillMethod::kFull) {
      EXPECT_EQ(work.prefill_keys_read, work.prefill_keys_dense);
    } else {
      EXPECT_LT(work.prefill_keys_read, work.prefill_keys_dense);
    }
    EXPECT_EQ(work.compressed, attention.decode != DecodeMethod::kFull);
    if (work.compressed) {
      EXPECT_LT(work.cache_entries_after, work.cache_entries_before);
    }
  }
}

// generate() samples from the model's logits with the configured sampler: replaying the same
// tokens through forward() and a Sampler of the same options and seed gives the same tokens, one
// for one, and at temperature 1.2 they are not the greedy ones.
TEST_P(Generation, SampledTokensAreTheSamplersOnTheModelsLogits) {
  const int context = static_cast<int>(prompt_.size()) + 64;
  const std::unique_ptr<LanguageModel> model = open(*weights_, context);
  GenerationOptions options;
  options.max_tokens = 24;
  const GenerationResult greedy = run(*model, options);
  options.sampler.temperature = 1.2f;
  options.sampler.seed = 77;
  const GenerationResult sampled = run(*model, options);
  ASSERT_EQ(sampled.tokens.size(), 24u) << sampled.stop_reason;
  EXPECT_NE(sampled.tokens, greedy.tokens) << "generate took the argmax instead of sampling";

  model->reset();
  Sampler sampler(options.sampler);
  const size_t sampled_ids =
      std::min<size_t>(weights_->config.vocab_size, std::max(tokenizer_->vocab_size(), 0));
  std::vector<float> logits = model->forward(prompt_);
  std::vector<int32_t> replayed;
  for (size_t step = 0; step < sampled.tokens.size(); ++step) {
    replayed.push_back(sampler.sample(std::span<float>(logits.data(), sampled_ids)));
    logits = model->forward(std::span<const int32_t>(&replayed.back(), 1));
  }
  EXPECT_EQ(replayed, sampled.tokens);
}

// A tokenizer with fewer ids than the model's vocabulary (the model's rows past it are padding).
class FirstIdsTokenizer final : public Tokenizer {
 public:
  explicit FirstIdsTokenizer(int32_t size) : size_(size) {}
  std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
  std::string token_bytes(int32_t id) const override { return "<" + std::to_string(id) + ">"; }
  int32_t vocab_size() const override { return size_; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }

 private:
  int32_t size_;
};

// Ids past the tokenizer's vocabulary are never produced, sampled or greedy (the executor's own
// argmax would see every row, so greedy runs through the sampler then).
TEST_P(Generation, OnlyIdsTheTokenizerHasAreProduced) {
  const FirstIdsTokenizer tokenizer(1000);
  ASSERT_GT(weights_->config.vocab_size, 2 * tokenizer.vocab_size());
  const std::unique_ptr<LanguageModel> model =
      open(*weights_, static_cast<int>(prompt_.size()) + 40);
  for (const float temperature : {0.0f, 1.5f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    GenerationOptions options;
    options.max_tokens = 32;
    options.sampler.temperature = temperature;
    options.sampler.seed = 5;
    model->reset();
    const GenerationResult result = generate(*model, tokenizer, prompt_, options);
    ASSERT_EQ(result.tokens.size(), 32u) << result.stop_reason;
    for (const int32_t id : result.tokens) EXPECT_LT(id, tokenizer.vocab_size());
  }
}

TEST_P(Generation, StopStringsAndStopTokensEndTheRunWhereTheyAppear) {
  const int context = static_cast<int>(prompt_.size()) + 64;
  const std::unique_ptr<LanguageModel> model = open(*weights_, context);
  GenerationOptions options;
  options.max_tokens = 24;
  const GenerationResult greedy = run(*model, options);
  ASSERT_EQ(greedy.tokens.size(), 24u) << greedy.stop_reason;
  ASSERT_GT(greedy.text.size(), 8u);

  // A stop string from the middle of the greedy text: the run ends there, the string unshown.
  const std::string stop = greedy.text.substr(greedy.text.size() / 2, 3);
  GenerationOptions with_stop = options;
  with_stop.stop_strings = {stop};
  std::string streamed;
  const GenerationResult stopped = run(*model, with_stop, &streamed);
  EXPECT_EQ(stopped.stop_reason, "stop string");
  EXPECT_EQ(stopped.text, greedy.text.substr(0, greedy.text.find(stop)));
  EXPECT_EQ(streamed, stopped.text);

  // A stop token: the first generated id after the start that has not appeared before it.
  size_t index = 1;
  while (index < greedy.tokens.size() &&
         std::find(greedy.tokens.begin(), greedy.tokens.begin() + static_cast<long>(index),
                   greedy.tokens[index]) != greedy.tokens.begin() + static_cast<long>(index)) {
    ++index;
  }
  ASSERT_LT(index, greedy.tokens.size()) << "every greedy token repeats the first";
  GenerationOptions with_eos = options;
  with_eos.stop_token_ids = {greedy.tokens[index]};
  const GenerationResult ended = run(*model, with_eos);
  EXPECT_EQ(ended.stop_reason, "stop token");
  EXPECT_EQ(ended.tokens, std::vector<int32_t>(greedy.tokens.begin(),
                                               greedy.tokens.begin() + static_cast<long>(index)));
}

ENTROPYINFER_DEVICE_TESTS(Generation);

}  // namespace
}  // namespace entropyinfer

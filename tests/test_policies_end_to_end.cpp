// Attention policies running inside the real model (stories260K, context 512, so the method's
// parameters are scaled down: segment 64, block 4, threshold 128, budgets of a few dozen tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "attention/attention_config.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "model/model_weights.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::asset_path;

AttentionConfig scaled_config(PrefillMethod prefill, DecodeMethod decode) {
  AttentionConfig config;
  config.prefill = prefill;
  config.decode = decode;
  config.prefill_params.segment_size = 64;
  config.prefill_params.block_size = 4;
  config.prefill_params.sparse_threshold = 128;
  config.prefill_params.base_budget = 32;
  config.prefill_params.critiprefill_budget = 32;
  config.decode_params.budget = 96;
  config.decode_params.window = 16;
  config.decode_params.gap = 8;
  config.decode_params.sink_tokens = 4;
  return config;
}

// A prompt of real model tokens: the first 300 ids of llama2.c's greedy story.
std::vector<int32_t> story_prompt(size_t length) {
  std::ifstream stream(asset_path("stories260K/greedy_token_ids_n256.txt"));
  std::vector<int32_t> ids;
  int32_t id;
  while (stream >> id) ids.push_back(id);
  // Continue the story by greedy decoding until the prompt is long enough.
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  Transformer model(weights);
  std::vector<float> logits = model.forward(ids);
  while (ids.size() < length) {
    ids.push_back(argmax(logits));
    logits = model.forward(std::span(&ids.back(), 1));
  }
  ids.resize(length);
  return ids;
}

std::vector<int32_t> greedy(const ModelWeights& weights, const AttentionConfig& config,
                            const std::vector<int32_t>& prompt, int steps,
                            AttentionWork* work = nullptr) {
  Transformer model(weights, 0, config);
  std::vector<float> logits = model.forward(prompt);
  std::vector<int32_t> generated;
  for (int step = 0; step < steps; ++step) {
    generated.push_back(argmax(logits));
    logits = model.forward(std::span(&generated.back(), 1));
  }
  if (work != nullptr) *work = model.attention_work();
  return generated;
}

class PoliciesOnStories : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(asset_path("stories260K/stories260K.bin"))) {
      GTEST_SKIP() << "asset missing: " << asset_path("stories260K/stories260K.bin");
    }
    weights_ =
        std::make_unique<ModelWeights>(load_model(asset_path("stories260K/stories260K.bin")));
    prompt_ = story_prompt(400);
  }
  std::unique_ptr<ModelWeights> weights_;
  std::vector<int32_t> prompt_;
};

TEST_F(PoliciesOnStories, FullAttentionThroughThePolicyPathGivesTheDenseTokens) {
  Transformer dense(*weights_);
  std::vector<float> logits = dense.forward(prompt_);
  std::vector<int32_t> expected;
  for (int step = 0; step < 48; ++step) {
    expected.push_back(argmax(logits));
    logits = dense.forward(std::span(&expected.back(), 1));
  }
  AttentionWork work;
  EXPECT_EQ(greedy(*weights_, scaled_config(PrefillMethod::kFull, DecodeMethod::kFull), prompt_, 48,
                   &work),
            expected);
  EXPECT_EQ(work.prefill_keys_read, work.prefill_keys_dense);
}

// Without all_logits the last layer runs attention and MLP for the prompt's last row only. Its
// logits are the last row of an all-logits pass (relative 1e-5: the sparse path sums the last row's
// dense attention in another order), the caches it leaves decode the same tokens, and the keys
// counted replace the last layer's triangle with one row.
TEST_F(PoliciesOnStories, PrunedLastLayerGivesTheLastRowsLogitsAndTheSameCache) {
  const int64_t n = static_cast<int64_t>(prompt_.size());
  const int64_t vocab = weights_->config.vocab_size;
  for (PrefillMethod prefill : {PrefillMethod::kFull, PrefillMethod::kEntropy}) {
    SCOPED_TRACE(prefill_method_name(prefill));
    const AttentionConfig config = scaled_config(prefill, DecodeMethod::kLatent);
    Transformer pruned(*weights_, 0, config), whole(*weights_, 0, config);
    std::vector<float> last = pruned.forward(prompt_);
    const std::vector<float> all = whole.forward(prompt_, true);
    ASSERT_EQ(all.size(), static_cast<size_t>(n * vocab));
    double difference = 0, norm = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double expected = all[static_cast<size_t>((n - 1) * vocab + v)];
      difference +=
          (last[static_cast<size_t>(v)] - expected) * (last[static_cast<size_t>(v)] - expected);
      norm += expected * expected;
    }
    EXPECT_LE(std::sqrt(difference / norm), 1e-5);
    const AttentionWork& work = pruned.attention_work();
    const AttentionWork& whole_work = whole.attention_work();
    const int64_t kv_heads = weights_->config.num_kv_heads;
    EXPECT_EQ(work.prefill_keys_dense,
              whole_work.prefill_keys_dense - kv_heads * n * (n + 1) / 2 + kv_heads * n);
    if (prefill == PrefillMethod::kFull) {
      EXPECT_EQ(work.prefill_keys_read, work.prefill_keys_dense);
    }
    // The same tokens through the latent compression (after 8 generated tokens).
    std::vector<float> other(all.end() - vocab, all.end());
    for (int step = 0; step < 24; ++step) {
      const int32_t token = argmax(other);
      ASSERT_EQ(argmax(last), token) << "step " << step;
      last = pruned.forward(std::span(&token, 1));
      other = whole.forward(std::span(&token, 1));
    }
    EXPECT_TRUE(pruned.attention_work().compressed);
  }
}

TEST_F(PoliciesOnStories, EveryPrefillAndDecodeMethodGeneratesAndDoesLessWork) {
  const std::vector<int32_t> dense =
      greedy(*weights_, scaled_config(PrefillMethod::kFull, DecodeMethod::kFull), prompt_, 48);
  for (PrefillMethod prefill :
       {PrefillMethod::kFull, PrefillMethod::kEntropy, PrefillMethod::kCritiPrefill}) {
    for (DecodeMethod decode :
         {DecodeMethod::kFull, DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
          DecodeMethod::kStreamingLLM, DecodeMethod::kPyramidKV}) {
      SCOPED_TRACE(prefill_method_name(prefill) + " + " + decode_method_name(decode));
      AttentionWork work;
      const std::vector<int32_t> tokens =
          greedy(*weights_, scaled_config(prefill, decode), prompt_, 48, &work);
      ASSERT_EQ(tokens.size(), 48u);
      for (int32_t token : tokens) {
        EXPECT_GE(token, 0);
        EXPECT_LT(token, weights_->config.vocab_size);
      }
      if (prefill != PrefillMethod::kFull) {
        EXPECT_LT(work.prefill_keys_read, work.prefill_keys_dense)
            << "a sparse prefill read everything";
      }
      if (decode != DecodeMethod::kFull) {
        ASSERT_TRUE(work.compressed);
        EXPECT_LT(work.cache_entries_after, work.cache_entries_before);
        EXPECT_LT(work.cache_bytes_after, work.cache_bytes_before) << "compression freed no memory";
      }
      if (decode == DecodeMethod::kFull && prefill == PrefillMethod::kFull) {
        EXPECT_EQ(tokens, dense);
      }
    }
  }
}

TEST_F(PoliciesOnStories, BudgetsCoveringTheContextReproduceFullAttention) {
  // With every budget at least the context, sparse prefill reads every block and compression keeps
  // every entry: the tokens must be exactly the dense ones.
  const std::vector<int32_t> dense =
      greedy(*weights_, scaled_config(PrefillMethod::kFull, DecodeMethod::kFull), prompt_, 32);
  for (PrefillMethod prefill : {PrefillMethod::kEntropy, PrefillMethod::kCritiPrefill}) {
    for (DecodeMethod decode : {DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
                                DecodeMethod::kStreamingLLM}) {
      AttentionConfig config = scaled_config(prefill, decode);
      config.prefill_params.base_budget = 512;
      config.prefill_params.critiprefill_budget = 512;
      config.decode_params.budget = 512;
      SCOPED_TRACE(prefill_method_name(prefill) + " + " + decode_method_name(decode));
      EXPECT_EQ(greedy(*weights_, config, prompt_, 32), dense);
    }
  }
}

TEST_F(PoliciesOnStories, PerQueryHeadCompressionCostsGroupTimesTheMemory) {
  AttentionConfig per_kv = scaled_config(PrefillMethod::kFull, DecodeMethod::kSnapKV);
  AttentionConfig per_query = per_kv;
  per_query.decode_params.per_query_head = true;
  AttentionWork kv_work, query_work;
  greedy(*weights_, per_kv, prompt_, 4, &kv_work);
  greedy(*weights_, per_query, prompt_, 4, &query_work);
  const int group = weights_->config.num_heads / weights_->config.num_kv_heads;
  EXPECT_EQ(query_work.cache_entries_after, group * kv_work.cache_entries_after);
}

}  // namespace
}  // namespace entropyinfer

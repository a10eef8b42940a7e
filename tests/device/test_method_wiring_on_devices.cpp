// How each executor applies the decode policies, the same bodies on every device (see
// device_test_support.h), on the shipped model: the cache is compressed exactly once and exactly
// when docs/method.md section 3.1 says, right after prefill for the window methods and after the
// forward pass that processed the G-th generated token for latent; and a compression keeps at most
// the budget per head and leaves the cache smaller.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "attention/pyramidkv.h"
#include "device/device_test_support.h"
#include "model/model_weights.h"
#include "model/random_model.h"

namespace entropyinfer {
namespace {

std::string shipped_model() {
  return std::string(ENTROPYINFER_FIXTURES_DIR) + "/../../models/needle-llama-11m";
}

class MethodWiring : public testing::OnDevice {
 protected:
  void SetUp() override {
    OnDevice::SetUp();
    if (IsSkipped()) return;
    weights_ = std::make_unique<ModelWeights>(load_model(shipped_model()));
  }
  std::unique_ptr<ModelWeights> weights_;
};

TEST_P(MethodWiring, EachDecodeMethodCompressesOnceAtItsStep) {
  constexpr int kPromptTokens = 300, kBudget = 64, kWindow = 16;
  const std::vector<int32_t> prompt = random_prompt(kPromptTokens, weights_->config.vocab_size, 5);
  for (const DecodeMethod method :
       {DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
        DecodeMethod::kPyramidKV, DecodeMethod::kStreamingLLM}) {
    for (const int gap : {0, 1, 6}) {
      if (method != DecodeMethod::kLatent && gap > 0) continue;  // only latent waits
      SCOPED_TRACE(decode_method_name(method) + " G=" + std::to_string(gap));
      AttentionConfig attention;
      attention.decode = method;
      attention.decode_params.budget = kBudget;
      attention.decode_params.window = kWindow;
      attention.decode_params.gap = gap;
      const std::unique_ptr<LanguageModel> model = open(*weights_, kPromptTokens + 32, attention);
      int32_t token = model->forward_greedy(prompt);
      // Generated token 1 came from the prefill; pass k processes generated token k.
      for (int pass = 1; pass <= gap + 3; ++pass) {
        const bool should_be_compressed = pass - 1 >= gap;
        EXPECT_EQ(model->attention_work().compressed, should_be_compressed)
            << "before decode pass " << pass;
        token = model->forward_greedy(std::span<const int32_t>(&token, 1));
      }
      const AttentionWork& work = model->attention_work();
      ASSERT_TRUE(work.compressed);
      const int64_t heads =
          static_cast<int64_t>(weights_->config.num_layers) * weights_->config.num_kv_heads;
      // Before: every layer's heads held the prompt and the G generated tokens processed so far.
      EXPECT_EQ(work.cache_entries_before, heads * (kPromptTokens + gap));
      // At most the budget per head; PyramidKV's per-layer budgets only average it.
      int64_t kept_at_most = heads * kBudget;
      if (method == DecodeMethod::kPyramidKV) {
        kept_at_most = 0;
        const int layers = weights_->config.num_layers;
        for (int layer = 0; layer < layers; ++layer) {
          kept_at_most +=
              weights_->config.num_kv_heads *
              pyramid_layer_budget(attention.decode_params, layer, layers, kPromptTokens + gap);
        }
      }
      EXPECT_LE(work.cache_entries_after, kept_at_most);
      EXPECT_LT(work.cache_bytes_after, work.cache_bytes_before);
    }
  }
}

ENTROPYINFER_DEVICE_TESTS(MethodWiring);

}  // namespace
}  // namespace entropyinfer

// The CUDA executor against the CPU executor through the one engine interface, on the shipped
// model: generate() greedy under full, entropy+latent and critiprefill+snapkv must produce the CPU
// engine's tokens. bf16 near-ties are excepted as the parity tests define them: the GPU is fed the
// CPU's tokens (teacher forcing) and where its argmax differs, the CPU's top-2 gap at that step
// must be within twice the largest difference between the two devices' logits over the row. Exempt
// steps are printed and may not exceed a quarter of all steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/generation.h"
#include "engine/language_model.h"
#include "gpu/gpu_test_support.h"
#include "model/model_weights.h"
#include "shipped_model_support.h"
#include "small_budgets.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

constexpr double kMaxExemptFraction = 0.25;

std::string prompt_text() {
  std::string text;
  for (int i = 0; i < 30; ++i) {
    text += "Entry " + std::to_string(i) + " in the harbour log: the " +
            (i % 2 ? "north" : "south") + " pier took " + std::to_string(5 * i + 2) +
            " barrels of salt. ";
  }
  return text + "The south pier's barrels on entry 14 numbered";
}

int argmax(const std::vector<float>& row) {
  return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
}

double top2_gap(std::vector<float> row) {
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
  return double(row[0]) - double(row[1]);
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, std::fabs(double(a[i]) - b[i]));
  return largest;
}

TEST(CudaGeneration, GreedyTokensAreTheCpuEnginesUnderEachMethod) {
  ENTROPYINFER_REQUIRE_GPU();
  const ModelWeights weights = load_model(testing::shipped_model_dir());
  const std::unique_ptr<Tokenizer> tokenizer =
      load_tokenizer(testing::shipped_model_dir() + "/tokenizer.json");
  const std::vector<int32_t> prompt = tokenizer->encode(prompt_text(), {.add_bos = true});
  constexpr int kTokens = 32;
  for (const char* methods : {"full", "entropy+latent", "critiprefill+snapkv"}) {
    SCOPED_TRACE(methods);
    EngineOptions options;
    options.context_length = static_cast<int>(prompt.size()) + kTokens + 1;
    options.attention = testing::small_budgets(methods);
    options.decode_room = kTokens;
    options.device = Device::kCpu;
    const std::unique_ptr<LanguageModel> cpu = make_language_model(weights, options);
    options.device = Device::kCuda;
    const std::unique_ptr<LanguageModel> gpu = make_language_model(weights, options);

    GenerationOptions greedy;
    greedy.max_tokens = kTokens;
    const GenerationResult on_cpu = generate(*cpu, *tokenizer, prompt, greedy);
    const GenerationResult on_gpu = generate(*gpu, *tokenizer, prompt, greedy);
    ASSERT_EQ(on_cpu.tokens.size(), static_cast<size_t>(kTokens)) << on_cpu.stop_reason;

    // Teacher-forced comparison, step by step.
    cpu->reset();
    gpu->reset();
    std::vector<float> cpu_row = cpu->forward(prompt);
    std::vector<float> gpu_row = gpu->forward(prompt);
    int exempt = 0;
    for (int step = 0; step < kTokens; ++step) {
      const int32_t expected = on_cpu.tokens[static_cast<size_t>(step)];
      ASSERT_EQ(argmax(cpu_row), expected) << "the CPU engine is not deterministic";
      if (argmax(gpu_row) != expected) {
        const double gap = top2_gap(cpu_row);
        const double difference = max_difference(cpu_row, gpu_row);
        std::cout << methods << ": step " << step << " is a near tie (top-2 gap " << gap
                  << ", largest device difference " << difference << ")\n";
        EXPECT_LE(gap, 2 * difference) << "step " << step << " differs without a near tie";
        ++exempt;
      }
      if (step + 1 == kTokens) break;
      const std::vector<int32_t> next = {expected};
      cpu_row = cpu->forward(next);
      gpu_row = gpu->forward(next);
    }
    EXPECT_LE(exempt, kMaxExemptFraction * kTokens);
    if (exempt == 0) {
      EXPECT_EQ(on_gpu.tokens, on_cpu.tokens);
      EXPECT_EQ(on_gpu.text, on_cpu.text);
    }
    const AttentionWork& cpu_work = cpu->attention_work();
    const AttentionWork& gpu_work = gpu->attention_work();
    EXPECT_EQ(gpu_work.compressed, cpu_work.compressed);
    std::cout << methods << ": " << exempt << " near ties in " << kTokens
              << " steps; prefill keys read " << gpu_work.prefill_keys_read << " (cuda) / "
              << cpu_work.prefill_keys_read << " (cpu) of " << cpu_work.prefill_keys_dense << "\n";
  }
}

}  // namespace
}  // namespace entropyinfer

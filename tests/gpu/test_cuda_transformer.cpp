// The CUDA transformer against the CPU Transformer on small random models of three families (Llama
// with llama3 RoPE scaling; Qwen3-like q/k norm with tied embeddings and head size 128; bias on
// q/k/v and o with adjacent-pair dynamic RoPE), through a chunked prefill and single-token
// decoding.
//
// Both run the same weights: the random fp32 weights are first rounded to bf16, the GPU's storage
// type. What remains is the GPU's bf16 activations between ops (normed inputs, q/k/v, attention
// outputs, gate/up, the SwiGLU product; the residual stream stays fp32), each rounding relative
// 2^-9. Logits must match within relative L2 error 3e-2 per token, and the largest logit must agree
// on at least 90% of the tokens (random models have near ties).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "engine/cuda/cuda_transformer.h"
#include "engine/transformer.h"
#include "expect_error.h"
#include "gpu/gpu_test_support.h"
#include "gpu/model_test_support.h"
#include "model/random_model.h"

namespace entropyinfer {
namespace {

using gpu_test::Agreement;
using gpu_test::compare_rows;
using gpu_test::gpu_exact_model;
using gpu_test::kMaxRelativeL2;
using gpu_test::kMinArgmaxAgreement;
using gpu_test::small_config;

TEST(CudaTransformer, LogitsMatchCpuTransformerThroughChunkedPrefillAndDecode) {
  ENTROPYINFER_REQUIRE_GPU();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("model variant " + std::to_string(variant));
    const ModelConfig config = small_config(variant);
    const ModelWeights weights = gpu_exact_model(config, 7 + variant);
    Transformer cpu_model(weights, 1024);
    cuda::CudaModelOptions options;
    options.context_length = 1024;
    options.chunk_tokens = 96;  // the 300-token prompt runs in four chunks
    cuda::CudaTransformer gpu_model(weights, options);

    std::vector<int32_t> prompt(300);
    for (size_t i = 0; i < prompt.size(); ++i)
      prompt[i] = static_cast<int32_t>((i * 7919 + 13) % config.vocab_size);
    Agreement agreement;
    compare_rows(gpu_model.forward(prompt, true), cpu_model.forward(prompt, true),
                 config.vocab_size, agreement);
    int32_t token = 5;
    for (int step = 0; step < 8; ++step) {
      const std::vector<int32_t> one = {token};
      const auto cpu_logits = cpu_model.forward(one);
      compare_rows(gpu_model.forward(one), cpu_logits, config.vocab_size, agreement);
      token = static_cast<int32_t>(std::max_element(cpu_logits.begin(), cpu_logits.end()) -
                                   cpu_logits.begin());
    }
    // A second prompt after reset() reuses the cache from position 0.
    gpu_model.reset();
    cpu_model.reset();
    const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 40);
    compare_rows(gpu_model.forward(short_prompt), cpu_model.forward(short_prompt),
                 config.vocab_size, agreement);

    const double matches = static_cast<double>(agreement.argmax_matches) / agreement.rows;
    std::cout << "variant " << variant << ": worst relative L2 " << agreement.worst_relative_l2
              << ", argmax agrees on " << agreement.argmax_matches << "/" << agreement.rows
              << " tokens\n";
    RecordProperty("variant" + std::to_string(variant) + "_worst_relative_l2",
                   std::to_string(agreement.worst_relative_l2));
    EXPECT_LE(agreement.worst_relative_l2, kMaxRelativeL2);
    EXPECT_GE(matches, kMinArgmaxAgreement);
  }
}

TEST(CudaTransformer, GreedyTokenIsTheLargestLogitAndErrorsAreClear) {
  ENTROPYINFER_REQUIRE_GPU();
  const ModelConfig config = small_config(0);
  const ModelWeights weights = gpu_exact_model(config, 3);
  cuda::CudaModelOptions options;
  options.context_length = 64;
  cuda::CudaTransformer model(weights, options);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const auto logits = model.forward(prompt);
  model.reset();
  EXPECT_EQ(model.forward_greedy(prompt),
            std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(model.position(), 5);
  EXPECT_THROW(model.forward(std::vector<int32_t>{config.vocab_size}), Error);
  EXPECT_THROW(model.forward(std::vector<int32_t>(60, 1)), Error);  // 5 + 60 > 64 positions

  // More than the GPU holds: one error naming what is needed and what is free.
  ModelConfig huge = config;
  huge.max_position_embeddings = 1 << 30;
  cuda::CudaModelOptions huge_options;
  huge_options.context_length = 1 << 30;
  testing::expect_error_naming([&] { cuda::CudaTransformer too_big(huge, 1, huge_options); },
                               {"free"}, "a 2^30-token cache");
}

TEST(CudaTransformer, NanLogitIsAnErrorNamingTheToken) {
  // The greedy argmax runs on the GPU; a NaN in the classifier's row 9 must not become a token.
  ENTROPYINFER_REQUIRE_GPU();
  const ModelConfig config = small_config(0);
  ModelWeights weights = gpu_exact_model(config, 5);
  const int64_t rows = weights.lm_head.shape[0], width = weights.lm_head.shape[1];
  auto head = std::make_unique<float[]>(static_cast<size_t>(rows * width));
  std::copy(weights.lm_head.floats(), weights.lm_head.floats() + rows * width, head.get());
  head[9 * width + 3] = std::nanf("");
  weights.lm_head.data = head.get();
  weights.owned_buffers.push_back(std::move(head));
  weights.config.tied_embeddings = false;
  cuda::CudaModelOptions options;
  options.context_length = 64;
  cuda::CudaTransformer model(weights, options);
  testing::expect_error_naming(
      [&] {
        model.forward_greedy(std::vector<int32_t>{1, 2, 3});
      },
      {"NaN logit for token id 9"}, "a NaN logit on the GPU");
}

}  // namespace
}  // namespace entropyinfer

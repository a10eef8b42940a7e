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
#include <iostream>

#include "backends/cuda/cuda_transformer.h"
#include "engine/transformer.h"
#include "gpu/gpu_test_support.h"
#include "model/random_model.h"

namespace entropyinfer {
namespace {

constexpr double kMaxRelativeL2 = 3e-2;
constexpr double kMinArgmaxAgreement = 0.9;

ModelConfig small_config(int variant) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.num_layers = 3;
  c.vocab_size = 1000;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5f;
  c.rope.theta = 10000.0;
  if (variant == 0) {  // Llama 3 style
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.rope.scaling = RopeScaling::kLlama3;
    c.rope.factor = 8.0;
    c.rope.original_max_position_embeddings = 256;
  } else if (variant == 1) {  // Qwen3 style
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 128;
    c.qk_norm = true;
    c.tied_embeddings = true;
  } else {  // biases, llama2.c-style rotation, dynamic NTK scaling past a short trained context
    c.num_heads = 8;
    c.num_kv_heads = 8;
    c.head_dim = 64;
    c.qkv_bias = true;
    c.o_bias = true;
    c.rope.rotate_adjacent_pairs = true;
    c.rope.scaling = RopeScaling::kDynamic;
    c.rope.factor = 2.0;
    c.rope.original_max_position_embeddings = 128;
  }
  return c;
}

void round_to_bf16(const WeightView& view) {
  if (view.empty()) return;
  float* values = const_cast<float*>(view.data);  // the model's own heap buffers
  for (int64_t i = 0; i < view.numel(); ++i) values[i] = bf16_to_f32(f32_to_bf16(values[i]));
}

// Norm weights away from 1 (make_random_model sets them to 1), so that a norm applied wrongly
// shows.
void perturb(const WeightView& view, uint32_t seed) {
  if (view.empty()) return;
  const auto noise = gpu_test::random_floats(static_cast<size_t>(view.numel()), seed, 0.5f);
  float* values = const_cast<float*>(view.data);
  for (int64_t i = 0; i < view.numel(); ++i) values[i] += noise[i];
}

ModelWeights gpu_exact_model(const ModelConfig& config, uint64_t seed) {
  ModelWeights weights = make_random_model(config, seed);
  uint32_t noise_seed = 50;
  for (LayerWeights& layer : weights.layers) {
    for (const WeightView* view :
         {&layer.attn_norm, &layer.mlp_norm, &layer.q_norm, &layer.k_norm}) {
      perturb(*view, noise_seed++);
    }
    for (const WeightView* view : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                   &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      round_to_bf16(*view);
    }
  }
  perturb(weights.final_norm, noise_seed++);
  round_to_bf16(weights.token_embedding);
  round_to_bf16(weights.lm_head);
  return weights;
}

struct Agreement {
  double worst_relative_l2 = 0;
  int argmax_matches = 0;
  int rows = 0;
};

void compare_rows(const std::vector<float>& gpu, const std::vector<float>& cpu, int vocab,
                  Agreement& agreement) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t row = 0; row < cpu.size() / vocab; ++row) {
    const std::vector<float> a(gpu.begin() + row * vocab, gpu.begin() + (row + 1) * vocab);
    const std::vector<float> b(cpu.begin() + row * vocab, cpu.begin() + (row + 1) * vocab);
    const auto difference = gpu_test::compare(a, b);
    ASSERT_EQ(difference.non_finite, 0) << "row " << row;
    agreement.worst_relative_l2 = std::max(agreement.worst_relative_l2, difference.relative_l2);
    agreement.argmax_matches += (std::max_element(a.begin(), a.end()) - a.begin()) ==
                                (std::max_element(b.begin(), b.end()) - b.begin());
    ++agreement.rows;
  }
}

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
  try {
    cuda::CudaTransformer too_big(huge, 1, huge_options);
    FAIL() << "a 2^30-token cache fitted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("free"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace entropyinfer

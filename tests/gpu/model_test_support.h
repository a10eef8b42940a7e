// Small random models for the GPU transformer tests, with weights the GPU stores exactly (bf16
// values), and the logit comparison they share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/half.h"
#include "gpu/gpu_test_support.h"
#include "model/random_model.h"

namespace entropyinfer::gpu_test {

constexpr double kMaxRelativeL2 = 3e-2;
constexpr double kMinArgmaxAgreement = 0.9;

inline ModelConfig small_config(int variant) {
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

inline void round_to_bf16(const WeightView& view) {
  if (view.empty()) return;
  float* values = const_cast<float*>(view.floats());  // the model's own heap buffers
  for (int64_t i = 0; i < view.numel(); ++i) values[i] = bf16_to_f32(f32_to_bf16(values[i]));
}

// Norm weights away from 1 (make_random_model sets them to 1), so that a norm applied wrongly
// shows.
inline void perturb(const WeightView& view, uint32_t seed) {
  if (view.empty()) return;
  const auto noise = random_floats(static_cast<size_t>(view.numel()), seed, 0.5f);
  float* values = const_cast<float*>(view.floats());
  for (int64_t i = 0; i < view.numel(); ++i) values[i] += noise[i];
}

inline ModelWeights gpu_exact_model(const ModelConfig& config, uint64_t seed) {
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

inline void compare_rows(const std::vector<float>& gpu, const std::vector<float>& cpu, int vocab,
                         Agreement& agreement) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t row = 0; row < cpu.size() / vocab; ++row) {
    const std::vector<float> a(gpu.begin() + row * vocab, gpu.begin() + (row + 1) * vocab);
    const std::vector<float> b(cpu.begin() + row * vocab, cpu.begin() + (row + 1) * vocab);
    const auto difference = compare(a, b);
    ASSERT_EQ(difference.non_finite, 0) << "row " << row;
    agreement.worst_relative_l2 = std::max(agreement.worst_relative_l2, difference.relative_l2);
    agreement.argmax_matches += (std::max_element(a.begin(), a.end()) - a.begin()) ==
                                (std::max_element(b.begin(), b.end()) - b.begin());
    ++agreement.rows;
  }
}

}  // namespace entropyinfer::gpu_test

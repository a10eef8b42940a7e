#include "model/random_model.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace entropyinfer {

namespace {

struct LlamaShape {
  int hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, vocab_size;
  int max_position_embeddings;
  bool tied_embeddings;
};

// A Llama model of this shape in fp32: RoPE theta 500000 over the whole head, RMSNorm eps 1e-5.
ModelConfig llama_config(const LlamaShape& shape) {
  ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.hidden_size = shape.hidden_size;
  config.intermediate_size = shape.intermediate_size;
  config.num_layers = shape.num_layers;
  config.num_heads = shape.num_heads;
  config.num_kv_heads = shape.num_kv_heads;
  config.head_dim = shape.head_dim;
  config.vocab_size = shape.vocab_size;
  config.max_position_embeddings = shape.max_position_embeddings;
  config.tied_embeddings = shape.tied_embeddings;
  config.rope.theta = 500000.0;
  config.rope.rotary_dim = shape.head_dim;
  config.rms_norm_eps = 1e-5f;
  config.torch_dtype = "float32";
  return config;
}

}  // namespace

ModelConfig random_model_config(const std::string& name) {
  // LlamaShape: hidden, MLP, layers, heads, KV heads, head size, vocabulary, positions, tied.
  if (name == "llama-100m") {
    return llama_config({768, 2048, 12, 12, 4, 64, 32000, 32768, true});
  }
  if (name == "heads-32x8x128") {
    // The attention layout of Llama-3-8B (32 query heads, 8 KV heads, head size 128) on a narrow
    // residual stream and two layers, so that a 16k-token prefill fits a CPU benchmark.
    return llama_config({1024, 1024, 2, 32, 8, 128, 1024, 131072, true});
  }
  if (name == "llama-3.1-8b") {
    // Llama-3.1-8B's shape (untied classifier, Llama 3 RoPE scaling): the GPU benchmarks' model.
    ModelConfig config = llama_config({4096, 14336, 32, 32, 8, 128, 128256, 131072, false});
    config.rope.scaling = RopeScaling::kLlama3;
    config.rope.factor = 8.0;
    config.rope.low_freq_factor = 1.0;
    config.rope.high_freq_factor = 4.0;
    config.rope.original_max_position_embeddings = 8192;
    config.torch_dtype = "bfloat16";
    return config;
  }
  throw Error("unknown random model shape '" + name +
              "' (known: llama-100m, heads-32x8x128, llama-3.1-8b)");
}

std::vector<int32_t> random_prompt(int64_t length, int vocab, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  uint64_t state = seed;
  for (int32_t& token : tokens) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    token = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

ModelWeights make_random_model(const ModelConfig& config, uint64_t seed) {
  ModelWeights weights;
  weights.config = config;
  std::mt19937_64 generator(seed);
  auto make = [&](std::vector<int64_t> shape, float scale, bool ones) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    auto buffer = std::make_unique<float[]>(static_cast<size_t>(count));
    // A cheap linear congruential stream per tensor: drawing 100M values through <random>
    // distributions would dominate start-up.
    uint64_t state = generator();
    for (int64_t i = 0; i < count; ++i) {
      if (ones) {
        buffer[i] = 1.0f;
        continue;
      }
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float unit = static_cast<float>(state >> 40) / static_cast<float>(1ull << 24);
      buffer[i] = (2.0f * unit - 1.0f) * scale;
    }
    WeightView view{buffer.get(), std::move(shape)};
    weights.owned_bytes += static_cast<size_t>(count) * sizeof(float);
    weights.owned_buffers.push_back(std::move(buffer));
    return view;
  };
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = static_cast<int64_t>(config.num_heads) * config.head_dim;
  const int64_t kv_width = static_cast<int64_t>(config.num_kv_heads) * config.head_dim;
  const float hidden_scale = 1.0f / std::sqrt(static_cast<float>(hidden));
  weights.token_embedding = make({config.vocab_size, hidden}, 1.0f, false);
  weights.final_norm = make({hidden}, 0.0f, true);
  weights.lm_head = config.tied_embeddings ? weights.token_embedding
                                           : make({config.vocab_size, hidden}, hidden_scale, false);
  weights.layers.resize(config.num_layers);
  for (LayerWeights& layer : weights.layers) {
    layer.attn_norm = make({hidden}, 0.0f, true);
    layer.q_proj = make({q_width, hidden}, hidden_scale, false);
    layer.k_proj = make({kv_width, hidden}, hidden_scale, false);
    layer.v_proj = make({kv_width, hidden}, hidden_scale, false);
    layer.o_proj = make({hidden, q_width}, 1.0f / std::sqrt(static_cast<float>(q_width)), false);
    if (config.qkv_bias) {
      layer.q_bias = make({q_width}, 0.02f, false);
      layer.k_bias = make({kv_width}, 0.02f, false);
      layer.v_bias = make({kv_width}, 0.02f, false);
    }
    if (config.o_bias) layer.o_bias = make({hidden}, 0.02f, false);
    if (config.qk_norm) {
      layer.q_norm = make({config.head_dim}, 0.0f, true);
      layer.k_norm = make({config.head_dim}, 0.0f, true);
    }
    layer.mlp_norm = make({hidden}, 0.0f, true);
    layer.gate_proj = make({config.intermediate_size, hidden}, hidden_scale, false);
    layer.up_proj = make({config.intermediate_size, hidden}, hidden_scale, false);
    layer.down_proj = make({hidden, config.intermediate_size},
                           1.0f / std::sqrt(static_cast<float>(config.intermediate_size)), false);
  }
  return weights;
}

}  // namespace entropyinfer

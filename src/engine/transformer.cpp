#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/rope.h"

namespace entropyinfer {
namespace {

// Tokens processed per pass: bounds activation memory on long prompts while keeping matrix products
// large enough to reuse each weight tile across many tokens.
constexpr int64_t kChunkTokens = 256;

}  // namespace

struct Transformer::State {
  const ModelWeights& weights;
  const ModelConfig& config;
  int context_length = 0;
  int position = 0;

  // KV cache, per layer: kv_heads slabs of [capacity, head_dim], so each head's history is contiguous
  // (the layout later per-head compression keeps).
  int capacity = 0;
  std::vector<std::vector<float>> keys;
  std::vector<std::vector<float>> values;

  // Scratch for one chunk.
  std::vector<float> hidden, normed, q, k, v, attention, projected, gate, up;

  State(const ModelWeights& w, int context) : weights(w), config(w.config), context_length(context) {
    keys.resize(config.num_layers);
    values.resize(config.num_layers);
  }

  void ensure_capacity(int needed) {
    if (needed <= capacity) return;
    int grown = std::max({needed, std::min(context_length, std::max(capacity * 2, 256))});
    grown = std::min(grown, context_length);
    const int64_t head_dim = config.head_dim;
    for (int layer = 0; layer < config.num_layers; ++layer) {
      for (auto* cache : {&keys[layer], &values[layer]}) {
        std::vector<float> resized(static_cast<size_t>(config.num_kv_heads) * grown * head_dim);
        for (int head = 0; head < config.num_kv_heads && capacity > 0; ++head) {
          std::memcpy(resized.data() + head * grown * head_dim, cache->data() + head * capacity * head_dim,
                      sizeof(float) * position * head_dim);
        }
        *cache = std::move(resized);
      }
    }
    capacity = grown;
  }
};

Transformer::Transformer(const ModelWeights& weights, int context_length) {
  const ModelConfig& config = weights.config;
  int limit = config.max_position_embeddings > 0 ? config.max_position_embeddings : context_length;
  if (context_length <= 0) context_length = limit;
  if (context_length <= 0) throw Error("context length must be positive");
  if (limit > 0 && context_length > limit) {
    throw Error("context length " + std::to_string(context_length) +
                " exceeds the model's maximum of " + std::to_string(limit) + " positions");
  }
  state_ = std::make_unique<State>(weights, context_length);
}

Transformer::~Transformer() = default;

void Transformer::reset() { state_->position = 0; }
int Transformer::position() const { return state_->position; }
int Transformer::context_length() const { return state_->context_length; }
const ModelConfig& Transformer::config() const { return state_->config; }
void Transformer::set_progress_callback(ProgressCallback callback) {
  progress_ = std::move(callback);
}

size_t Transformer::kv_cache_bytes() const {
  size_t total = 0;
  for (int layer = 0; layer < state_->config.num_layers; ++layer) {
    total += (state_->keys[layer].size() + state_->values[layer].size()) * sizeof(float);
  }
  return total;
}

std::vector<float> Transformer::forward(std::span<const int32_t> tokens, bool all_logits) {
  State& s = *state_;
  const ModelConfig& c = s.config;
  const ModelWeights& w = s.weights;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw Error("forward() needs at least one token");
  if (s.position + n > s.context_length) {
    throw Error("the sequence needs " + std::to_string(s.position + n) +
                " positions but the context holds " + std::to_string(s.context_length));
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= c.vocab_size) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                  std::to_string(c.vocab_size));
    }
  }
  s.ensure_capacity(s.position + static_cast<int>(n));

  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * head_dim;
  const int64_t vocab = c.vocab_size;
  const int64_t rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : head_dim;
  const int64_t first_position = s.position;
  const int64_t chunk = std::min(kChunkTokens, n);

  // Layer-major: every layer sees the whole new span before the next starts, so a policy can plan a
  // layer's attention from all of its queries and keys. Matrix products run in chunks so that only
  // the residual stream and the queries are held for the whole span.
  s.hidden.resize(n * hidden);
  s.q.resize(n * q_width);
  s.normed.resize(chunk * hidden);
  s.k.resize(chunk * kv_width);
  s.v.resize(chunk * kv_width);
  s.attention.resize(chunk * q_width);
  s.projected.resize(chunk * hidden);
  s.gate.resize(chunk * c.intermediate_size);
  s.up.resize(chunk * c.intermediate_size);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = w.token_embedding.data + static_cast<int64_t>(tokens[t]) * hidden;
    std::copy(row, row + hidden, s.hidden.data() + t * hidden);
  }
  const RopeTables rope = rope_tables(c, first_position, n);
  const int64_t half_rotary = rotary_dim / 2;

  for (int layer_index = 0; layer_index < c.num_layers; ++layer_index) {
    const LayerWeights& layer = w.layers[layer_index];
    float* key_cache = s.keys[layer_index].data();
    float* value_cache = s.values[layer_index].data();
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      float* q = s.q.data() + t0 * q_width;
      cpu::rms_norm(s.hidden.data() + t0 * hidden, layer.attn_norm.data, m, hidden, c.rms_norm_eps,
                    s.normed.data());
      cpu::linear(s.normed.data(), m, hidden, layer.q_proj.data, layer.q_bias.data, q_width, q);
      cpu::linear(s.normed.data(), m, hidden, layer.k_proj.data, layer.k_bias.data, kv_width, s.k.data());
      cpu::linear(s.normed.data(), m, hidden, layer.v_proj.data, layer.v_bias.data, kv_width, s.v.data());
      if (c.qk_norm) {
        cpu::rms_norm(q, layer.q_norm.data, m * c.num_heads, head_dim, c.rms_norm_eps, q);
        cpu::rms_norm(s.k.data(), layer.k_norm.data, m * c.num_kv_heads, head_dim, c.rms_norm_eps,
                      s.k.data());
      }
      const float* cos = rope.cos.data() + t0 * half_rotary;
      const float* sin = rope.sin.data() + t0 * half_rotary;
      cpu::apply_rope(q, m, c.num_heads, head_dim, cos, sin, rotary_dim, c.rope.rotate_adjacent_pairs);
      cpu::apply_rope(s.k.data(), m, c.num_kv_heads, head_dim, cos, sin, rotary_dim,
                      c.rope.rotate_adjacent_pairs);
      // Append keys and values to the cache, head-major.
      for (int64_t t = 0; t < m; ++t) {
        for (int64_t head = 0; head < c.num_kv_heads; ++head) {
          const int64_t slot = (head * s.capacity + first_position + t0 + t) * head_dim;
          std::memcpy(key_cache + slot, s.k.data() + (t * c.num_kv_heads + head) * head_dim,
                      sizeof(float) * head_dim);
          std::memcpy(value_cache + slot, s.v.data() + (t * c.num_kv_heads + head) * head_dim,
                      sizeof(float) * head_dim);
        }
      }
    }

    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      cpu::AttentionShape shape;
      shape.tokens = m;
      shape.q_heads = c.num_heads;
      shape.kv_heads = c.num_kv_heads;
      shape.head_dim = head_dim;
      shape.first_position = first_position + t0;
      shape.cache_stride = s.capacity;
      shape.window = c.sliding_window.value_or(0);
      shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      cpu::causal_attention(s.q.data() + t0 * q_width, key_cache, value_cache, shape,
                            s.attention.data());
      float* residual = s.hidden.data() + t0 * hidden;
      cpu::linear(s.attention.data(), m, q_width, layer.o_proj.data, layer.o_bias.data, hidden,
                  s.projected.data());
      cpu::add_inplace(residual, s.projected.data(), m * hidden);

      cpu::rms_norm(residual, layer.mlp_norm.data, m, hidden, c.rms_norm_eps, s.normed.data());
      cpu::linear(s.normed.data(), m, hidden, layer.gate_proj.data, nullptr, c.intermediate_size,
                  s.gate.data());
      cpu::linear(s.normed.data(), m, hidden, layer.up_proj.data, nullptr, c.intermediate_size,
                  s.up.data());
      cpu::swiglu_inplace(s.gate.data(), s.up.data(), m * c.intermediate_size);
      cpu::linear(s.gate.data(), m, c.intermediate_size, layer.down_proj.data, nullptr, hidden,
                  s.projected.data());
      cpu::add_inplace(residual, s.projected.data(), m * hidden);
    }
    if (progress_ && n > chunk) progress_(static_cast<int64_t>(layer_index + 1) * n / c.num_layers, n);
  }
  s.position += static_cast<int>(n);

  std::vector<float> logits(static_cast<size_t>((all_logits ? n : 1) * vocab));
  const int64_t first_row = all_logits ? 0 : n - 1;
  for (int64_t t0 = first_row; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    cpu::rms_norm(s.hidden.data() + t0 * hidden, w.final_norm.data, m, hidden, c.rms_norm_eps,
                  s.normed.data());
    cpu::linear(s.normed.data(), m, hidden, w.lm_head.data, nullptr, vocab,
                logits.data() + (t0 - first_row) * vocab);
  }
  return logits;
}

}  // namespace entropyinfer

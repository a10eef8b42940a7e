#include "engine/transformer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attention/decode_policy.h"
#include "attention/prefill_policy.h"
#include "backends/cpu/block_sparse_attention.h"
#include "backends/cpu/compressed_decode_attention.h"
#include "backends/cpu/cpu_ops.h"
#include "core/error.h"
#include "engine/rope.h"
#include "engine/sequence_schedule.h"

namespace entropyinfer {
namespace {

// Tokens per matrix-product chunk: bounds scratch memory on long prompts while keeping products
// large enough to reuse each weight tile across many tokens.
constexpr int64_t kChunkTokens = 256;

// Rows added beyond what is needed when a cache grows or is compacted, so that decoding does not
// reallocate at every token.
constexpr int kCacheHeadroom = 256;

cpu::WeightMatrix matrix(const WeightView& view) { return {view.data, view.dtype}; }

// One layer's KV cache: `heads` slabs of [capacity, head_dim] for keys and for values, so that each
// head's history is contiguous and heads can hold different numbers of entries once compressed.
struct LayerCache {
  int heads = 0;
  int capacity = 0;
  std::vector<int> lengths;
  std::vector<float> keys;
  std::vector<float> values;

  int max_length() const {
    return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  }
  size_t bytes() const { return (keys.capacity() + values.capacity()) * sizeof(float); }

  // Moves every head into slabs of `new_capacity` rows, copying the rows `rows_of(head)` lists (or
  // the first lengths[head] rows when empty). Replacing the vectors returns the old memory.
  void reshape(int new_heads, int new_capacity, int64_t head_dim,
               const std::vector<std::vector<int32_t>>* kept, int source_group) {
    std::vector<float> new_keys(static_cast<size_t>(new_heads) * new_capacity * head_dim);
    std::vector<float> new_values(new_keys.size());
    std::vector<int> new_lengths(new_heads, 0);
    for (int head = 0; head < new_heads; ++head) {
      const int source = head / source_group;
      const float* source_keys = keys.data() + static_cast<int64_t>(source) * capacity * head_dim;
      const float* source_values =
          values.data() + static_cast<int64_t>(source) * capacity * head_dim;
      float* target_keys = new_keys.data() + static_cast<int64_t>(head) * new_capacity * head_dim;
      float* target_values =
          new_values.data() + static_cast<int64_t>(head) * new_capacity * head_dim;
      if (kept == nullptr) {
        new_lengths[head] = lengths[source];
        if (lengths[source] == 0) continue;  // nothing to move (and no source buffer yet)
        std::memcpy(target_keys, source_keys, sizeof(float) * lengths[source] * head_dim);
        std::memcpy(target_values, source_values, sizeof(float) * lengths[source] * head_dim);
        continue;
      }
      const std::vector<int32_t>& rows = (*kept)[head];
      new_lengths[head] = static_cast<int>(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(target_keys + i * head_dim, source_keys + rows[i] * head_dim,
                    sizeof(float) * head_dim);
        std::memcpy(target_values + i * head_dim, source_values + rows[i] * head_dim,
                    sizeof(float) * head_dim);
      }
    }
    heads = new_heads;
    capacity = new_capacity;
    lengths = std::move(new_lengths);
    keys = std::move(new_keys);
    values = std::move(new_values);
  }
};

}  // namespace

struct Transformer::State {
  const ModelWeights& weights;
  const ModelConfig& config;
  int context_length = 0;
  SequenceSchedule schedule;

  AttentionConfig attention;
  std::unique_ptr<PrefillPolicy> prefill_policy;
  std::unique_ptr<DecodePolicy> decode_policy;

  std::vector<LayerCache> cache;
  // The last `window` queries of every layer (after RoPE), oldest first: the decode policy's
  // observation window.
  int window = 0;
  std::vector<std::vector<float>> recent_queries;

  AttentionWork work;
  AttentionRecording& recording;  // the model's, kept across set_attention()

  // Scratch.
  std::vector<float> hidden, normed, q, k, v, attention_out, projected, gate, up;

  State(const ModelWeights& w, int context, const AttentionConfig& attention_config,
        AttentionRecording& recording_of_model)
      : weights(w),
        config(w.config),
        context_length(context),
        attention(attention_config),
        recording(recording_of_model) {
    attention.validate();
    prefill_policy = make_prefill_policy(attention);
    decode_policy = make_decode_policy(attention);
    if (decode_policy && decode_policy->needs_window_queries())
      window = attention.decode_params.window;
    schedule.configure(context_length,
                       decode_policy ? decode_policy->compress_after_generated() : -1, window);
    reset();
  }

  void reset() {
    schedule.reset();
    work = AttentionWork{};
    cache.assign(config.num_layers, LayerCache{});
    for (LayerCache& layer : cache) {
      layer.heads = config.num_kv_heads;
      layer.lengths.assign(config.num_kv_heads, 0);
    }
    recent_queries.assign(
        config.num_layers,
        std::vector<float>(static_cast<size_t>(window) * config.num_heads * config.head_dim));
  }

  void ensure_capacity(int needed) {
    for (LayerCache& layer : cache) {
      const int rows = layer.max_length() + needed;
      if (rows <= layer.capacity) continue;
      const int grown =
          std::min(context_length, std::max({rows, layer.capacity * 2, kCacheHeadroom}));
      layer.reshape(layer.heads, std::max(grown, rows), config.head_dim, nullptr, 1);
    }
  }

  void remember_queries(int layer, const float* queries, int64_t count) {
    if (window == 0) return;
    const int64_t width = static_cast<int64_t>(config.num_heads) * config.head_dim;
    std::vector<float>& ring = recent_queries[layer];
    const int64_t incoming = std::min<int64_t>(count, window);
    const int64_t held = schedule.window_tokens();  // before this span's tokens are counted
    const int64_t kept_old = std::min<int64_t>(held, window - incoming);
    // Slide the newest kept_old rows to the front, then append the incoming rows.
    std::memmove(ring.data(), ring.data() + (held - kept_old) * width,
                 sizeof(float) * kept_old * width);
    std::memcpy(ring.data() + kept_old * width, queries + (count - incoming) * width,
                sizeof(float) * incoming * width);
  }

  size_t cache_bytes() const {
    size_t total = 0;
    for (const LayerCache& layer : cache) total += layer.bytes();
    return total;
  }

  void compress() {
    const int group = config.num_heads / config.num_kv_heads;
    work.cache_bytes_before = cache_bytes();
    for (const LayerCache& layer : cache) {
      for (int length : layer.lengths) work.cache_entries_before += length;
    }
    recording.decode_plans.clear();
    for (int layer_index = 0; layer_index < config.num_layers; ++layer_index) {
      LayerCache& layer = cache[layer_index];
      DecodeInputs inputs;
      inputs.window_queries = recent_queries[layer_index].data();
      inputs.window_tokens = schedule.window_tokens();
      inputs.keys = layer.keys.data();
      inputs.key_stride = layer.capacity;
      inputs.cache_length = schedule.position();
      inputs.num_q_heads = config.num_heads;
      inputs.num_kv_heads = config.num_kv_heads;
      inputs.head_dim = config.head_dim;
      inputs.layer = layer_index;
      inputs.num_layers = config.num_layers;
      LayerDecodePlan plan = decode_policy->plan(inputs);
      if (recording.record_plans) recording.decode_plans.push_back(plan);
      if (plan.kept.empty()) continue;  // the cache is within the budget: nothing to drop
      int longest = 0;
      for (const auto& rows : plan.kept)
        longest = std::max<int>(longest, static_cast<int>(rows.size()));
      const int room = std::min(kCacheHeadroom, context_length - schedule.position());
      layer.reshape(static_cast<int>(plan.kept.size()), longest + std::max(room, 1),
                    config.head_dim, &plan.kept, plan.per_query_head ? group : 1);
    }
    for (const LayerCache& layer : cache) {
      for (int length : layer.lengths) work.cache_entries_after += length;
    }
    work.cache_bytes_after = cache_bytes();
    work.compressed = true;
    schedule.mark_compressed();
  }
};

Transformer::Transformer(const ModelWeights& weights, int context_length,
                         const AttentionConfig& attention) {
  state_ = std::make_unique<State>(weights, resolve_context_length(weights.config, context_length),
                                   attention, recording_);
}

Transformer::~Transformer() = default;

void Transformer::reset() { state_->reset(); }
void Transformer::set_attention(const AttentionConfig& attention) {
  state_ = std::make_unique<State>(state_->weights, state_->context_length, attention, recording_);
}
std::string Transformer::device_name() const {
  return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
}
int Transformer::position() const { return state_->schedule.position(); }
int Transformer::context_length() const { return state_->context_length; }
const ModelConfig& Transformer::config() const { return state_->config; }
const AttentionConfig& Transformer::attention_config() const { return state_->attention; }
size_t Transformer::kv_cache_bytes() const { return state_->cache_bytes(); }
const AttentionWork& Transformer::attention_work() const { return state_->work; }
void Transformer::set_progress_callback(ProgressCallback callback) {
  progress_ = std::move(callback);
}

std::vector<float> Transformer::forward(std::span<const int32_t> tokens, bool all_logits) {
  State& s = *state_;
  const ModelConfig& c = s.config;
  const ModelWeights& w = s.weights;
  const int64_t n = static_cast<int64_t>(tokens.size());
  s.schedule.check_span(tokens, c.vocab_size);
  if (s.schedule.compressed() && n > 1) {
    // A compressed cache has heads of different lengths; new tokens go through one at a time.
    const int64_t vocab = c.vocab_size;
    std::vector<float> logits(static_cast<size_t>((all_logits ? n : 1) * vocab));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> step = forward(tokens.subspan(t, 1));
      if (all_logits || t == n - 1)
        std::copy(step.begin(), step.end(), logits.begin() + (all_logits ? t * vocab : 0));
    }
    return logits;
  }
  const bool is_prefill = s.schedule.is_prefill();
  s.ensure_capacity(static_cast<int>(n));

  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * head_dim;
  const int64_t vocab = c.vocab_size;
  const int64_t rotary_dim = c.rope.rotary_dim > 0 ? c.rope.rotary_dim : head_dim;
  const int64_t half_rotary = rotary_dim / 2;
  const int64_t first_position = s.schedule.position();
  const int64_t chunk = std::min(kChunkTokens, n);
  const int group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // A sliding window shorter than the span is its own sparsity; the block plans assume full causal
  // reach, so such spans stay dense.
  const int sliding_window = c.sliding_window.value_or(0);
  const bool plan_this_span = is_prefill && first_position == 0 &&
                              !(sliding_window > 0 && sliding_window < first_position + n);
  if (is_prefill && s.recording.record_plans) s.recording.prefill_plans.clear();

  // Layer-major: every layer sees the whole new span before the next starts, so a policy can plan a
  // layer's attention from all of its queries and keys. Matrix products run in chunks so that only
  // the residual stream, the queries and the attention output are held for the whole span.
  s.hidden.resize(n * hidden);
  s.q.resize(n * q_width);
  s.attention_out.resize(n * q_width);
  s.normed.resize(chunk * hidden);
  s.k.resize(chunk * kv_width);
  s.v.resize(chunk * kv_width);
  s.projected.resize(chunk * hidden);
  s.gate.resize(chunk * c.intermediate_size);
  s.up.resize(chunk * c.intermediate_size);
  for (int64_t t = 0; t < n; ++t) {
    w.token_embedding.widen_row(tokens[t], s.hidden.data() + t * hidden);
  }
  const RopeTables rope = rope_tables(c, first_position, n);

  // What a prefill policy plans from: the span's queries and the layer's cache.
  const auto prefill_inputs = [&](int layer_index) {
    PrefillInputs inputs;
    inputs.queries = s.q.data();
    inputs.keys = s.cache[layer_index].keys.data();
    inputs.key_stride = s.cache[layer_index].capacity;
    inputs.num_tokens = n;
    inputs.num_q_heads = c.num_heads;
    inputs.num_kv_heads = c.num_kv_heads;
    inputs.head_dim = static_cast<int>(head_dim);
    inputs.layer = layer_index;
    return inputs;
  };
  for (int layer_index = 0; layer_index < c.num_layers; ++layer_index) {
    const LayerWeights& layer = w.layers[layer_index];
    LayerCache& cache = s.cache[layer_index];
    // Without all_logits only the span's last row reads anything from the last layer (through the
    // logits): the other rows get its keys, values and window queries but no attention or MLP.
    const bool last_row_only = !all_logits && n > 1 && layer_index == c.num_layers - 1;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      float* q = s.q.data() + t0 * q_width;
      cpu::rms_norm(s.hidden.data() + t0 * hidden, layer.attn_norm.floats(), m, hidden,
                    c.rms_norm_eps, s.normed.data());
      cpu::linear(s.normed.data(), m, hidden, matrix(layer.q_proj), layer.q_bias.floats(), q_width,
                  q);
      cpu::linear(s.normed.data(), m, hidden, matrix(layer.k_proj), layer.k_bias.floats(), kv_width,
                  s.k.data());
      cpu::linear(s.normed.data(), m, hidden, matrix(layer.v_proj), layer.v_bias.floats(), kv_width,
                  s.v.data());
      if (c.qk_norm) {
        cpu::rms_norm(q, layer.q_norm.floats(), m * c.num_heads, head_dim, c.rms_norm_eps, q);
        cpu::rms_norm(s.k.data(), layer.k_norm.floats(), m * c.num_kv_heads, head_dim,
                      c.rms_norm_eps, s.k.data());
      }
      const float* cos = rope.cos.data() + t0 * half_rotary;
      const float* sin = rope.sin.data() + t0 * half_rotary;
      cpu::apply_rope(q, m, c.num_heads, head_dim, cos, sin, rotary_dim,
                      c.rope.rotate_adjacent_pairs);
      cpu::apply_rope(s.k.data(), m, c.num_kv_heads, head_dim, cos, sin, rotary_dim,
                      c.rope.rotate_adjacent_pairs);
      if (s.recording.capture_inputs)
        s.recording.capture(layer_index, q, q_width, s.k.data(), kv_width, m);
      // Append to every cache head; after a per-query-head compression a KV head feeds g caches.
      const int source_group = cache.heads == c.num_kv_heads ? 1 : group;
      for (int64_t t = 0; t < m; ++t) {
        for (int head = 0; head < cache.heads; ++head) {
          const int64_t source = (t * c.num_kv_heads + head / source_group) * head_dim;
          const int64_t slot =
              (static_cast<int64_t>(head) * cache.capacity + cache.lengths[head] + t0 + t) *
              head_dim;
          std::memcpy(cache.keys.data() + slot, s.k.data() + source, sizeof(float) * head_dim);
          std::memcpy(cache.values.data() + slot, s.v.data() + source, sizeof(float) * head_dim);
        }
      }
    }
    for (int& length : cache.lengths) length += static_cast<int>(n);
    s.remember_queries(layer_index, s.q.data(), n);

    if (s.schedule.compressed()) {
      // One token over per-head caches of different lengths.
      std::vector<const float*> key_heads(cache.heads), value_heads(cache.heads);
      std::vector<int64_t> lengths(cache.heads);
      for (int head = 0; head < cache.heads; ++head) {
        key_heads[head] =
            cache.keys.data() + static_cast<int64_t>(head) * cache.capacity * head_dim;
        value_heads[head] =
            cache.values.data() + static_cast<int64_t>(head) * cache.capacity * head_dim;
        lengths[head] = cache.lengths[head];
      }
      cpu::CompressedDecodeShape shape;
      shape.q_heads = c.num_heads;
      shape.kv_heads = c.num_kv_heads;
      shape.head_dim = head_dim;
      shape.scale = scale;
      shape.per_query_head = cache.heads != c.num_kv_heads;
      cpu::compressed_decode_attention(s.q.data(), key_heads.data(), value_heads.data(),
                                       lengths.data(), shape, s.attention_out.data());
    } else {
      // The span's rows, or in the last layer without all_logits its last row alone, which every
      // method reads densely (the last segment is never sparse).
      const int64_t first_row = last_row_only ? n - 1 : 0;
      cpu::AttentionShape shape;
      shape.tokens = n - first_row;
      shape.q_heads = c.num_heads;
      shape.kv_heads = c.num_kv_heads;
      shape.head_dim = head_dim;
      shape.first_position = first_position + first_row;
      shape.cache_stride = cache.capacity;
      shape.window = sliding_window;
      shape.scale = scale;
      bool done = false;
      if (plan_this_span && last_row_only) {
        // A policy still plans the layer when plans are recorded, so that they describe every
        // layer; the keys read are the last row's.
        if (s.recording.record_plans)
          s.recording.prefill_plans.push_back(s.prefill_policy->plan(prefill_inputs(layer_index)));
        const int64_t row_keys = static_cast<int64_t>(c.num_kv_heads) * n;
        s.work.prefill_keys_read += row_keys;
        s.work.prefill_keys_dense += row_keys;
      } else if (plan_this_span) {
        LayerPrefillPlan plan = s.prefill_policy->plan(prefill_inputs(layer_index));
        s.work.prefill_keys_dense += plan.keys_read_dense();
        if (!plan.dense) {
          shape.window = 0;
          s.work.prefill_keys_read +=
              cpu::block_sparse_attention(s.q.data(), cache.keys.data(), cache.values.data(), shape,
                                          plan, s.attention_out.data());
          done = true;
        } else {
          s.work.prefill_keys_read += plan.keys_read_dense();
        }
        if (s.recording.record_plans) s.recording.prefill_plans.push_back(std::move(plan));
      }
      if (!done) {
        cpu::causal_attention(s.q.data() + first_row * q_width, cache.keys.data(),
                              cache.values.data(), shape,
                              s.attention_out.data() + first_row * q_width);
      }
    }

    for (int64_t t0 = last_row_only ? n - 1 : 0; t0 < n; t0 += chunk) {
      const int64_t m = std::min(chunk, n - t0);
      float* residual = s.hidden.data() + t0 * hidden;
      cpu::linear(s.attention_out.data() + t0 * q_width, m, q_width, matrix(layer.o_proj),
                  layer.o_bias.floats(), hidden, s.projected.data());
      cpu::add_inplace(residual, s.projected.data(), m * hidden);
      cpu::rms_norm(residual, layer.mlp_norm.floats(), m, hidden, c.rms_norm_eps, s.normed.data());
      cpu::linear(s.normed.data(), m, hidden, matrix(layer.gate_proj), nullptr, c.intermediate_size,
                  s.gate.data());
      cpu::linear(s.normed.data(), m, hidden, matrix(layer.up_proj), nullptr, c.intermediate_size,
                  s.up.data());
      cpu::swiglu_inplace(s.gate.data(), s.up.data(), m * c.intermediate_size);
      cpu::linear(s.gate.data(), m, c.intermediate_size, matrix(layer.down_proj), nullptr, hidden,
                  s.projected.data());
      cpu::add_inplace(residual, s.projected.data(), m * hidden);
    }
    if (progress_ && n > chunk)
      progress_(static_cast<int64_t>(layer_index + 1) * n / c.num_layers, n);
  }
  if (s.schedule.advance(n)) s.compress();

  std::vector<float> logits(static_cast<size_t>((all_logits ? n : 1) * vocab));
  const int64_t first_row = all_logits ? 0 : n - 1;
  for (int64_t t0 = first_row; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    cpu::rms_norm(s.hidden.data() + t0 * hidden, w.final_norm.floats(), m, hidden, c.rms_norm_eps,
                  s.normed.data());
    cpu::linear(s.normed.data(), m, hidden, matrix(w.lm_head), nullptr, vocab,
                logits.data() + (t0 - first_row) * vocab);
  }
  return logits;
}

}  // namespace entropyinfer

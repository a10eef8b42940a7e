// The generic decoder: one forward pass over new tokens, appending their keys and values to the KV
// cache. Per-family differences (bias, q/k norm, RoPE variant, tied classifier) come from
// ModelConfig flags. Attention policies (src/attention) decide which keys each head reads during
// prefill and which cache entries survive compression; this class runs their plans on the CPU
// backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention/attention_config.h"
#include "attention/prefill_plan.h"
#include "model/model_weights.h"

namespace entropyinfer {

// What the attention policies did, so that every time can be read next to the work behind it.
struct AttentionWork {
  // Prefill: keys read summed over layers, KV heads and queries, and what full causal attention
  // would have read over the same spans.
  int64_t prefill_keys_read = 0;
  int64_t prefill_keys_dense = 0;
  // Decode-cache compression (once per generation).
  bool compressed = false;
  int64_t cache_entries_before = 0;  // summed over layers and cache heads
  int64_t cache_entries_after = 0;
  size_t cache_bytes_before = 0;  // allocated cache memory just before / after compressing
  size_t cache_bytes_after = 0;
};

class Transformer {
 public:
  // context_length 0 means the model's max_position_embeddings. The cache grows on demand up to it.
  explicit Transformer(const ModelWeights& weights, int context_length = 0,
                       const AttentionConfig& attention = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Runs `tokens` at positions [position(), position() + n), appends their keys/values to the cache
  // and returns fp32 logits: [n, vocab] row-major when all_logits, else [vocab] for the last token.
  // The first call after reset() is the prefill, where the prefill policy applies; the decode
  // policy compresses the cache once, after the prefill or after its number of generated tokens.
  // Throws Error if the tokens do not fit in the context or an id is out of the vocabulary.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false);

  void reset();  // forget the cache (and the compression)
  int position() const;
  int context_length() const;
  const ModelConfig& config() const;
  const AttentionConfig& attention_config() const;
  size_t kv_cache_bytes() const;  // allocated
  const AttentionWork& attention_work() const;

  // Keep every layer's prefill plan of the next prefill, for inspection.
  void set_record_plans(bool record);
  const std::vector<LayerPrefillPlan>& recorded_plans() const;

  // Called during a forward pass with (tokens done, tokens total), for progress display.
  using ProgressCallback = std::function<void(int64_t done, int64_t total)>;
  void set_progress_callback(ProgressCallback callback);

 private:
  struct State;
  std::unique_ptr<State> state_;
  ProgressCallback progress_;
};

}  // namespace entropyinfer

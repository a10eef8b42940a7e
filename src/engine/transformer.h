// The generic decoder: one forward pass over new tokens, appending their keys and values to the KV cache.
// Per-family differences (bias, q/k norm, RoPE variant, tied classifier) come from ModelConfig flags.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/model_weights.h"

namespace entropyinfer {

class Transformer {
 public:
  // context_length 0 means the model's max_position_embeddings. The cache is allocated up front.
  Transformer(const ModelWeights& weights, int context_length = 0);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Runs `tokens` at positions [position(), position() + n), appends their keys/values to the cache and
  // returns fp32 logits: [n, vocab] row-major when all_logits, else [vocab] for the last token.
  // Throws Error if the tokens do not fit in the context or an id is out of the vocabulary.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false);

  void reset();  // forget the cache
  int position() const;
  int context_length() const;
  const ModelConfig& config() const;
  size_t kv_cache_bytes() const;

  // Called after each chunk of a forward pass with (tokens done, tokens total), for progress display.
  using ProgressCallback = std::function<void(int64_t done, int64_t total)>;
  void set_progress_callback(ProgressCallback callback);

 private:
  struct State;
  std::unique_ptr<State> state_;
  ProgressCallback progress_;
};

}  // namespace entropyinfer

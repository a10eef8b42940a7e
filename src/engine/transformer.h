// The generic decoder: one forward pass over new tokens, appending their keys and values to the KV
// cache. Per-family differences (bias, q/k norm, RoPE variant, tied classifier) come from
// ModelConfig flags. Attention policies (src/attention) decide which keys each head reads during
// prefill and which cache entries survive compression; this class runs their plans on the CPU
// backend. It is the CPU executor of LanguageModel.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention/attention_config.h"
#include "attention/prefill_plan.h"
#include "engine/language_model.h"
#include "model/model_weights.h"

namespace entropyinfer {

class Transformer : public LanguageModel {
 public:
  // context_length 0 means the model's max_position_embeddings. The cache grows on demand up to it.
  // fp8_kv_cache: cached rows as an FP8 cache reads them back (EngineOptions::fp8_kv_cache).
  explicit Transformer(const ModelWeights& weights, int context_length = 0,
                       const AttentionConfig& attention = {}, bool fp8_kv_cache = false);
  ~Transformer() override;
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // Runs `tokens` at positions [position(), position() + n), appends their keys/values to the cache
  // and returns fp32 logits: [n, vocab] row-major when all_logits, else [vocab] for the last token.
  // The first call after reset() is the prefill, where the prefill policy applies; the decode
  // policy compresses the cache once, after the prefill or after its number of generated tokens.
  // Throws Error if the tokens do not fit in the context or an id is out of the vocabulary.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false) override;

  void reset() override;  // forget the cache (and the compression)
  void set_attention(const AttentionConfig& attention) override;
  int position() const override;
  int context_length() const override;
  const ModelConfig& config() const override;
  const AttentionConfig& attention_config() const override;
  size_t kv_cache_bytes() const override;  // allocated
  const AttentionWork& attention_work() const override;

  // Reports once per layer of a prompt longer than one chunk of matrix products.
  void set_progress_callback(ProgressCallback callback) override;
  std::string device_name() const override;  // "cpu (N threads)"

 private:
  struct State;
  std::unique_ptr<State> state_;
  ProgressCallback progress_;
};

}  // namespace entropyinfer

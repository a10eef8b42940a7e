// Picks the next token from logits: greedy, temperature, top-k, top-p, seeded, after OpenAI's
// logit bias and presence and frequency penalties. A second mode
// reproduces llama2.c's run.c exactly (its xorshift generator and its top-p cut), so its published
// samples can be checked token for token.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

namespace entropyinfer {

enum class SamplerMode { kStandard, kLlama2c };

struct SamplerOptions {
  float temperature = 0.0f;  // 0 means greedy
  int top_k = 0;             // 0 means no limit
  float top_p = 1.0f;        // 1 means no limit
  uint64_t seed = 0;
  SamplerMode mode = SamplerMode::kStandard;
  // Added to a token's logit before anything else (OpenAI's logit_bias: -100 to 100).
  std::map<int32_t, float> logit_bias = {};
  // Subtracted from the logit of each token this sampler has already picked: the presence
  // penalty once, the frequency penalty once per time picked (OpenAI's definition, over the
  // generated tokens as vLLM applies it; -2 to 2).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
};

inline constexpr float kMaxLogitBias = 100.0f;
inline constexpr float kMaxPenalty = 2.0f;

// Whether the options change logits before the choice (bias or penalties): then greedy decoding is
// no longer the model's own argmax.
bool adjusts_logits(const SamplerOptions& options);

// Throws Error for nonsense values (negative temperature, top_p outside (0, 1], negative top_k,
// biases or penalties outside their ranges, negative token ids).
void validate_sampler_options(const SamplerOptions& options);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // logits may be modified (scaled and normalised in place). Throws Error, naming the token id,
  // when a logit is NaN or +inf, or when every logit is -inf: no sampler can pick from those
  // honestly, and the usual cause is a corrupt or overflowing checkpoint. A -inf logit alone is
  // a token that cannot be chosen. A biased token id beyond the logits is an Error too.
  int32_t sample(std::span<float> logits);

 private:
  int32_t sample_standard(std::span<float> logits);
  int32_t sample_llama2c(std::span<float> logits);
  float llama2c_random_float();
  void apply_bias_and_penalties(std::span<float> logits) const;

  SamplerOptions options_;
  std::mt19937_64 generator_;
  uint64_t xorshift_state_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::map<int32_t, int> picked_;  // how often each token was picked, for the penalties
};

int32_t argmax(std::span<const float> logits);

// The check sample() makes, for callers that pick a token another way (a GPU argmax).
void check_logits_usable(std::span<const float> logits);

}  // namespace entropyinfer

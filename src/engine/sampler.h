// Picks the next token from logits: greedy, temperature, top-k, top-p, seeded. A second mode
// reproduces llama2.c's run.c exactly (its xorshift generator and its top-p cut), so its published
// samples can be checked token for token.
#pragma once

#include <cstdint>
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
};

// Throws Error for nonsense values (negative temperature, top_p outside (0, 1], negative top_k).
void validate_sampler_options(const SamplerOptions& options);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);
  // logits may be modified (scaled and normalised in place). Throws Error, naming the token id,
  // when a logit is NaN or +inf, or when every logit is -inf: no sampler can pick from those
  // honestly, and the usual cause is a corrupt or overflowing checkpoint. A -inf logit alone is
  // a token that cannot be chosen.
  int32_t sample(std::span<float> logits);

 private:
  int32_t sample_standard(std::span<float> logits);
  int32_t sample_llama2c(std::span<float> logits);
  float llama2c_random_float();

  SamplerOptions options_;
  std::mt19937_64 generator_;
  uint64_t xorshift_state_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t argmax(std::span<const float> logits);

// The check sample() makes, for callers that pick a token another way (a GPU argmax).
void check_logits_usable(std::span<const float> logits);

}  // namespace entropyinfer

// The log-probability of a chosen token under the model's own distribution (log-softmax of its
// logits, before any logit bias, penalty or temperature), and the most likely alternatives: what
// OpenAI's `logprobs` report. Runs on the host over logits the executor already returned.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace entropyinfer {

// OpenAI's largest `top_logprobs`.
inline constexpr int kMaxTopLogprobs = 20;

struct TokenAlternative {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenAlternative> top;  // most likely first; equal ones by lower id
};

// Throws Error when `token` is outside the logits, `top` is outside 0..kMaxTopLogprobs or no logit
// is finite. A -inf logit gives a -inf logprob.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

}  // namespace entropyinfer

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

// A prompt's scores: row r of `rows` ([next_tokens.size()][row_width]) holds the logits after
// some token, and next_tokens[r] is the token that actually followed; each gets token_logprob over
// the row's first `scored_ids` logits (a tokenizer's ids, where the model pads its vocabulary past
// them; row_width for all), appended to `out` in row order. Rows run in parallel.
void append_next_token_logprobs(std::span<const float> rows, int64_t row_width, int64_t scored_ids,
                                std::span<const int32_t> next_tokens, int top,
                                std::vector<TokenLogprob>& out);

}  // namespace entropyinfer

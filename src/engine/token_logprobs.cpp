#include "engine/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>

#include "core/error.h"

namespace entropyinfer {

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) {
    throw Error("logprobs: token id " + std::to_string(token) + " is outside the " +
                std::to_string(logits.size()) + " logits");
  }
  if (top < 0 || top > kMaxTopLogprobs) {
    throw Error("logprobs: " + std::to_string(top) + " alternatives asked, at most " +
                std::to_string(kMaxTopLogprobs) + " are given");
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float logit : logits) {
    if (std::isfinite(logit)) max_logit = std::max(max_logit, logit);
  }
  if (!std::isfinite(max_logit)) throw Error("logprobs: no logit is finite");
  // Terms in float (a vocabulary's pass stays well under a millisecond), summed in double: a
  // 150k-token vocabulary adds many small terms.
  double sum = 0.0;
  for (float logit : logits) {
    if (std::isfinite(logit)) sum += std::exp(logit - max_logit);
  }
  const double log_normaliser = max_logit + std::log(sum);
  const auto logprob_of = [&](float logit) {
    return std::isfinite(logit) ? static_cast<float>(logit - log_normaliser)
                                : -std::numeric_limits<float>::infinity();
  };

  TokenLogprob result;
  result.token = token;
  result.logprob = logprob_of(logits[static_cast<size_t>(token)]);
  if (top == 0) return result;
  // Keeps the `top` best seen so far, worst first, so that one pass over the vocabulary suffices.
  const auto better = [](const TokenAlternative& a, const TokenAlternative& b) {
    return a.logprob != b.logprob ? a.logprob > b.logprob : a.token < b.token;
  };
  std::vector<TokenAlternative> best;
  best.reserve(static_cast<size_t>(top) + 1);
  for (size_t id = 0; id < logits.size(); ++id) {
    const TokenAlternative candidate{static_cast<int32_t>(id), logprob_of(logits[id])};
    if (best.size() == static_cast<size_t>(top) && !better(candidate, best.front())) continue;
    best.push_back(candidate);
    std::push_heap(best.begin(), best.end(), better);
    if (best.size() > static_cast<size_t>(top)) {
      std::pop_heap(best.begin(), best.end(), better);
      best.pop_back();
    }
  }
  std::sort(best.begin(), best.end(), better);
  result.top = std::move(best);
  return result;
}

void append_next_token_logprobs(std::span<const float> rows, int64_t row_width, int64_t scored_ids,
                                std::span<const int32_t> next_tokens, int top,
                                std::vector<TokenLogprob>& out) {
  const auto count = static_cast<int64_t>(next_tokens.size());
  if (row_width <= 0 || scored_ids <= 0 || scored_ids > row_width ||
      static_cast<int64_t>(rows.size()) != count * row_width) {
    throw Error("logprobs: " + std::to_string(rows.size()) + " logits are not " +
                std::to_string(count) + " rows of " + std::to_string(row_width) + " with " +
                std::to_string(scored_ids) + " scored");
  }
  const size_t first = out.size();
  out.resize(first + next_tokens.size());
  // A row is a whole vocabulary pass; errors leave the loop as text, since exceptions may not.
  std::vector<std::string> errors(next_tokens.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t r = 0; r < count; ++r) {
    try {
      out[first + static_cast<size_t>(r)] = token_logprob(
          rows.subspan(static_cast<size_t>(r * row_width), static_cast<size_t>(scored_ids)),
          next_tokens[static_cast<size_t>(r)], top);
    } catch (const std::exception& error) {
      errors[static_cast<size_t>(r)] = error.what();
    }
  }
  for (const std::string& error : errors) {
    if (!error.empty()) {
      out.resize(first);
      throw Error(error);
    }
  }
}

}  // namespace entropyinfer

#include "engine/token_logprobs.h"

#include <algorithm>
#include <cmath>
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

}  // namespace entropyinfer

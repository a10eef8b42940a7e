#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cpu/cpu_ops.h"
#include "core/error.h"

namespace entropyinfer {

bool adjusts_logits(const SamplerOptions& options) {
  return !options.logit_bias.empty() || options.presence_penalty != 0.0f ||
         options.frequency_penalty != 0.0f;
}

void validate_sampler_options(const SamplerOptions& options) {
  if (!(options.temperature >= 0.0f) || !std::isfinite(options.temperature)) {
    throw Error("temperature must be a finite number >= 0, got " +
                std::to_string(options.temperature));
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
    throw Error("top-p must be in (0, 1], got " + std::to_string(options.top_p));
  }
  if (options.top_k < 0) throw Error("top-k must be >= 0, got " + std::to_string(options.top_k));
  if (options.mode == SamplerMode::kLlama2c && options.top_k != 0) {
    throw Error("llama2.c sampling has no top-k; leave top-k at 0");
  }
  for (const auto& [name, penalty] : {std::pair{"presence penalty", options.presence_penalty},
                                      std::pair{"frequency penalty", options.frequency_penalty}}) {
    if (!(std::abs(penalty) <= kMaxPenalty)) {
      throw Error(std::string(name) + " must be between -2 and 2, got " + std::to_string(penalty));
    }
  }
  for (const auto& [id, bias] : options.logit_bias) {
    if (id < 0) throw Error("logit bias: token id " + std::to_string(id) + " is negative");
    if (!(std::abs(bias) <= kMaxLogitBias)) {
      throw Error("logit bias of token " + std::to_string(id) +
                  " must be between -100 and 100, got " + std::to_string(bias));
    }
  }
  if (options.mode == SamplerMode::kLlama2c && adjusts_logits(options)) {
    throw Error("llama2.c sampling has no logit bias or penalties; leave them at 0");
  }
}

int32_t argmax(std::span<const float> logits) {
  // The first of equal maxima, as llama2.c and torch.argmax choose.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void check_logits_usable(std::span<const float> logits) {
  if (logits.empty()) throw Error("there are no logits to sample from");
  bool any_finite = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    const float logit = logits[id];
    if (std::isnan(logit) || logit == INFINITY) {
      throw Error("the model produced a " + std::string(std::isnan(logit) ? "NaN" : "+inf") +
                  " logit for token id " + std::to_string(id) +
                  " (corrupt weights, or activations that overflow)");
    }
    any_finite = any_finite || logit != -INFINITY;
  }
  if (!any_finite) throw Error("the model produced -inf for every logit: no token can be chosen");
}

Sampler::Sampler(const SamplerOptions& options)
    : options_(options), generator_(options.seed), xorshift_state_(options.seed) {
  validate_sampler_options(options);
}

int32_t Sampler::sample(std::span<float> logits) {
  check_logits_usable(logits);
  apply_bias_and_penalties(logits);
  int32_t token;
  if (options_.temperature == 0.0f) {
    token = argmax(logits);
  } else {
    token =
        options_.mode == SamplerMode::kLlama2c ? sample_llama2c(logits) : sample_standard(logits);
  }
  if (options_.presence_penalty != 0.0f || options_.frequency_penalty != 0.0f) ++picked_[token];
  return token;
}

void Sampler::apply_bias_and_penalties(std::span<float> logits) const {
  for (const auto& [id, bias] : options_.logit_bias) {
    if (static_cast<size_t>(id) >= logits.size()) {
      throw Error("logit bias names token id " + std::to_string(id) + ", beyond the " +
                  std::to_string(logits.size()) + " tokens of the vocabulary");
    }
    logits[static_cast<size_t>(id)] += bias;
  }
  for (const auto& [id, count] : picked_) {
    logits[static_cast<size_t>(id)] -=
        options_.presence_penalty + options_.frequency_penalty * static_cast<float>(count);
  }
}

// run.c's xorshift* generator and its float in [0, 1).
float Sampler::llama2c_random_float() {
  uint64_t& state = xorshift_state_;
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  const uint32_t bits = static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(bits >> 8) / 16777216.0f;
}

int32_t Sampler::sample_llama2c(std::span<float> logits) {
  const int64_t n = static_cast<int64_t>(logits.size());
  for (float& logit : logits) logit /= options_.temperature;
  cpu::softmax_inplace(logits.data(), n);
  const float coin = llama2c_random_float();
  const float top_p = options_.top_p;
  if (top_p <= 0.0f || top_p >= 1.0f) {
    float cdf = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      cdf += logits[i];
      if (coin < cdf) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(n - 1);
  }
  // Tokens below this cut cannot be part of the nucleus; dropping them first keeps the sort short.
  const float cutoff = (1.0f - top_p) / static_cast<float>(n - 1);
  candidates_.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (logits[i] >= cutoff) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  // glibc's qsort is a merge sort, hence stable: equal probabilities keep index order.
  std::stable_sort(candidates_.begin(), candidates_.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  float cumulative = 0.0f;
  size_t last = candidates_.size() - 1;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    cumulative += candidates_[i].first;
    if (cumulative > top_p) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (size_t i = 0; i <= last; ++i) {
    cdf += candidates_[i].first;
    if (r < cdf) return candidates_[i].second;
  }
  return candidates_[last].second;
}

int32_t Sampler::sample_standard(std::span<float> logits) {
  const int64_t n = static_cast<int64_t>(logits.size());
  candidates_.clear();
  candidates_.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    candidates_.emplace_back(logits[i] / options_.temperature, static_cast<int32_t>(i));
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the survivors, in double so long tails do not lose mass.
  const double max_logit = candidates_.front().first;
  std::vector<double> probabilities(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probabilities[i] = std::exp(static_cast<double>(candidates_[i].first) - max_logit);
    total += probabilities[i];
  }
  // Nucleus: the smallest prefix whose mass reaches top_p (always at least one token).
  if (options_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t nucleus = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probabilities[i] / total;
      if (cumulative >= options_.top_p) {
        nucleus = i + 1;
        break;
      }
    }
    keep = nucleus;
    total = 0.0;
    for (size_t i = 0; i < keep; ++i) total += probabilities[i];
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double target = uniform(generator_);
  double cdf = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cdf += probabilities[i];
    if (target < cdf) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace entropyinfer

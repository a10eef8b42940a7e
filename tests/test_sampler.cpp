// Samplers and stop-string handling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/generation.h"
#include "engine/sampler.h"
#include "expect_error.h"

namespace entropyinfer {
namespace {

TEST(Sampler, GreedyPicksFirstMaximum) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler sampler(SamplerOptions{});
  EXPECT_EQ(sampler.sample(logits), 1);
}

TEST(Sampler, SameSeedSameSamplesDifferentSeedDifferentSamples) {
  auto draw = [](uint64_t seed) {
    SamplerOptions options;
    options.temperature = 1.0f;
    options.seed = seed;
    Sampler sampler(options);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> logits(50, 0.0f);
      ids.push_back(sampler.sample(logits));
    }
    return ids;
  };
  EXPECT_EQ(draw(3), draw(3));
  EXPECT_NE(draw(3), draw(4));
}

TEST(Sampler, FrequenciesFollowSoftmaxAtTemperatureOne) {
  for (SamplerMode mode : {SamplerMode::kStandard, SamplerMode::kLlama2c}) {
    SamplerOptions options;
    options.temperature = 1.0f;
    options.seed = 11;
    options.mode = mode;
    Sampler sampler(options);
    const std::vector<double> probabilities = {0.5, 0.3, 0.2};
    std::vector<int> counts(3, 0);
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) {
      std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
      ++counts[sampler.sample(logits)];
    }
    // Five standard deviations of a binomial count: fails only if the sampler is biased.
    for (int k = 0; k < 3; ++k) {
      const double sigma = std::sqrt(draws * probabilities[k] * (1 - probabilities[k]));
      EXPECT_NEAR(counts[k], draws * probabilities[k], 5 * sigma) << "token " << k;
    }
  }
}

// The distribution a sampler must draw from, computed here in double from the definitions: softmax
// of logits / T, cut to the k largest, then to the nucleus (the smallest prefix, by probability,
// whose mass reaches top_p; llama2.c's run.c needs the mass to exceed it), renormalised.
std::vector<double> exact_distribution(const std::vector<float>& logits, double temperature,
                                       int top_k, double top_p, bool strictly_above) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  std::vector<double> weight(n, 0.0);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += weight[i] = std::exp(logits[i] / temperature);
  const size_t kept_by_k = top_k > 0 ? std::min<size_t>(top_k, n) : n;
  double kept_total = 0.0;
  for (size_t r = 0; r < kept_by_k; ++r) kept_total += weight[order[r]];
  size_t kept = kept_by_k;
  if (top_p < 1.0) {
    double mass = 0.0;
    for (size_t r = 0; r < kept_by_k; ++r) {
      mass += weight[order[r]] / kept_total;
      if (strictly_above ? mass > top_p : mass >= top_p) {
        kept = r + 1;
        break;
      }
    }
  }
  std::vector<double> distribution(n, 0.0);
  double nucleus_total = 0.0;
  for (size_t r = 0; r < kept; ++r) nucleus_total += weight[order[r]];
  for (size_t r = 0; r < kept; ++r) distribution[order[r]] = weight[order[r]] / nucleus_total;
  return distribution;
}

// Frequencies of 40,000 seeded draws against the exact distribution at several temperatures,
// top-k and top-p values, by Pearson's chi-square: the statistic must stay under its 0.999 quantile
// (Wilson-Hilferty), and tokens outside the support must never be drawn.
TEST(Sampler, FrequenciesFollowTheExactDistributionAtEveryTemperatureAndCut) {
  const std::vector<float> logits = {1.3f, -0.4f, 0.9f, 2.1f, 0.2f, -1.5f};
  struct Case {
    SamplerMode mode;
    float temperature;
    int top_k;
    float top_p;
  };
  const std::vector<Case> cases = {
      {SamplerMode::kStandard, 0.5f, 0, 1.0f},
      {SamplerMode::kStandard, 1.0f, 0, 1.0f},
      {SamplerMode::kStandard, 2.0f, 0, 1.0f},
      {SamplerMode::kStandard, 1.5f, 3, 1.0f},
      {SamplerMode::kStandard, 1.0f, 0, 0.8f},
      {SamplerMode::kStandard, 2.0f, 4, 0.7f},
      // The two largest probabilities sum to 0.7213: the nucleus is exactly those two, and one
      // reaching past top_p by even 0.03 would take the third.
      {SamplerMode::kStandard, 1.0f, 0, 0.7f},
      {SamplerMode::kLlama2c, 0.5f, 0, 1.0f},
      {SamplerMode::kLlama2c, 2.0f, 0, 1.0f},
      {SamplerMode::kLlama2c, 1.0f, 0, 0.8f},
      {SamplerMode::kLlama2c, 2.0f, 0, 0.6f},
  };
  const int draws = 40000;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.mode == SamplerMode::kLlama2c ? "llama2c" : "standard") +
                 " T=" + std::to_string(c.temperature) + " top_k=" + std::to_string(c.top_k) +
                 " top_p=" + std::to_string(c.top_p));
    const std::vector<double> expected = exact_distribution(logits, c.temperature, c.top_k, c.top_p,
                                                            c.mode == SamplerMode::kLlama2c);
    SamplerOptions options;
    options.mode = c.mode;
    options.temperature = c.temperature;
    options.top_k = c.top_k;
    options.top_p = c.top_p;
    options.seed = 29;
    Sampler sampler(options);
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) {
      std::vector<float> copy = logits;
      ++counts[sampler.sample(copy)];
    }
    double chi_square = 0.0;
    int support = 0;
    for (size_t k = 0; k < logits.size(); ++k) {
      if (expected[k] == 0.0) {
        EXPECT_EQ(counts[k], 0) << "token " << k << " is outside the support";
        continue;
      }
      ++support;
      const double mean = draws * expected[k];
      chi_square += (counts[k] - mean) * (counts[k] - mean) / mean;
    }
    ASSERT_GE(support, 2) << "a case must leave a choice";
    const double df = support - 1;
    const double z = 3.090;  // the standard normal's 0.999 quantile
    const double bound = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3);
    EXPECT_LT(chi_square, bound) << "over " << support << " tokens";
  }
}

TEST(Sampler, TopKAndTopPCutTheTail) {
  SamplerOptions top_k;
  top_k.temperature = 5.0f;  // flat enough that the tail would be drawn often
  top_k.top_k = 2;
  top_k.seed = 1;
  Sampler k_sampler(top_k);
  SamplerOptions top_p = top_k;
  top_p.top_k = 0;
  top_p.top_p = 0.5f;
  Sampler p_sampler(top_p);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f};
    EXPECT_LT(k_sampler.sample(logits), 2);
    std::vector<float> peaked = {10.0f, 0.0f, 0.0f, 0.0f};  // token 0 holds > 50% even at T = 5
    EXPECT_EQ(p_sampler.sample(peaked), 0);
  }
}

TEST(Sampler, NonsenseOptionsAreErrors) {
  auto rejects = [](SamplerOptions options, const char* fragment) {
    try {
      Sampler sampler(options);
      ADD_FAILURE() << "accepted options that should fail with '" << fragment << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  SamplerOptions options;
  options.temperature = -1.0f;
  rejects(options, "temperature");
  options = {};
  options.top_p = 0.0f;
  rejects(options, "top-p");
  options.top_p = 1.5f;
  rejects(options, "top-p");
  options = {};
  options.top_k = -3;
  rejects(options, "top-k");
  options = {};
  options.presence_penalty = 2.5f;
  rejects(options, "presence penalty");
  options = {};
  options.frequency_penalty = NAN;
  rejects(options, "frequency penalty");
  options = {};
  options.logit_bias = {{-1, 1.0f}};
  rejects(options, "negative");
  options.logit_bias = {{3, 150.0f}};
  rejects(options, "between -100 and 100");
  options = {};
  options.mode = SamplerMode::kLlama2c;
  options.presence_penalty = 0.5f;
  rejects(options, "llama2.c");
}

// Greedy picks, each from a fresh copy of `logits`, under the options' bias and penalties.
std::vector<int32_t> greedy_picks(const SamplerOptions& options, const std::vector<float>& logits,
                                  int count) {
  Sampler sampler(options);
  std::vector<int32_t> picks;
  for (int i = 0; i < count; ++i) {
    std::vector<float> row = logits;
    picks.push_back(sampler.sample(row));
  }
  return picks;
}

TEST(Sampler, LogitBiasIsAddedBeforeTheChoice) {
  SamplerOptions options;
  options.logit_bias = {{2, -100.0f}};
  EXPECT_EQ(greedy_picks(options, {1.0f, 2.0f, 3.0f}, 1), std::vector<int32_t>{1});
  options.logit_bias = {{0, 2.5f}};  // 1 + 2.5 beats 3
  EXPECT_EQ(greedy_picks(options, {1.0f, 2.0f, 3.0f}, 1), std::vector<int32_t>{0});
  options.logit_bias = {{0, 1.5f}};  // 2.5 does not
  EXPECT_EQ(greedy_picks(options, {1.0f, 2.0f, 3.0f}, 1), std::vector<int32_t>{2});
  // At temperature 1 a bias of ln 3 makes a token three times as likely as its equal.
  options.logit_bias = {{1, std::log(3.0f)}};
  options.temperature = 1.0f;
  options.seed = 7;
  const std::vector<int32_t> picks = greedy_picks(options, {0.0f, 0.0f}, 20000);
  const double share = static_cast<double>(std::count(picks.begin(), picks.end(), 1)) / 20000.0;
  EXPECT_NEAR(share, 0.75, 0.015);  // binomial sd 0.003
  options.logit_bias = {{5, 1.0f}};
  testing::expect_error_naming(
      [&] {
        greedy_picks(options, {0.0f, 0.0f}, 1);
      },
      {"token id 5", "2 tokens"}, "a bias beyond the vocabulary");
}

TEST(Sampler, PenaltiesFollowOpenAiDefinitionOverPickedTokens) {
  SamplerOptions options;
  // Presence: once per token already picked, however often.
  options.presence_penalty = 1.5f;
  EXPECT_EQ(greedy_picks(options, {2.0f, 1.0f, 0.0f}, 4), (std::vector<int32_t>{0, 1, 0, 0}));
  // Frequency: once per time picked. Logits of 0, 1, 2 before each pick: 2,1,0 / 1.25,1,0 /
  // 0.5,1,0 / 0.5,0.25,0 / -0.25,0.25,0 / -0.25,-0.5,0.
  options = {};
  options.frequency_penalty = 0.75f;
  EXPECT_EQ(greedy_picks(options, {2.0f, 1.0f, 0.0f}, 6), (std::vector<int32_t>{0, 0, 1, 0, 1, 2}));
  // A negative penalty favours repeats.
  options = {};
  options.presence_penalty = -1.0f;
  EXPECT_EQ(greedy_picks(options, {1.0f, 1.5f, 0.0f}, 3), (std::vector<int32_t>{1, 1, 1}));
  options.presence_penalty = 0.0f;
  options.frequency_penalty = 0.0f;
  EXPECT_EQ(greedy_picks(options, {2.0f, 1.0f, 0.0f}, 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(StopStringFilter, HoldsBackPrefixesAndCutsAtTheStop) {
  StopStringFilter filter({"<|eot_id|>"});
  bool stopped = false;
  EXPECT_EQ(filter.push("Hello <|eo", stopped), "Hello ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(filter.push("t_id|> trailing", stopped), "");
  EXPECT_TRUE(stopped);

  StopStringFilter released({"STOP"});
  stopped = false;
  EXPECT_EQ(released.push("ST", stopped), "");
  EXPECT_EQ(released.push("ART", stopped), "START");
  EXPECT_EQ(released.push(" S", stopped), " ");
  EXPECT_EQ(released.flush(), "S");
  EXPECT_FALSE(stopped);
}

TEST(Sampler, NonFiniteLogitsAreErrorsNamingTheToken) {
  for (SamplerMode mode : {SamplerMode::kStandard, SamplerMode::kLlama2c}) {
    for (float temperature : {0.0f, 1.0f}) {
      for (float top_p : {1.0f, 0.5f}) {
        Sampler sampler({.temperature = temperature, .top_p = top_p, .seed = 3, .mode = mode});
        std::vector<float> with_nan = {0.5f, std::nanf(""), 1.0f};
        testing::expect_error_naming([&] { sampler.sample(with_nan); },
                                     {"NaN logit for token id 1"}, "a NaN logit");
        std::vector<float> with_inf = {0.5f, 1.0f, INFINITY};
        testing::expect_error_naming([&] { sampler.sample(with_inf); },
                                     {"+inf logit for token id 2"}, "a +inf logit");
        std::vector<float> all_minus_inf = {-INFINITY, -INFINITY};
        testing::expect_error_naming([&] { sampler.sample(all_minus_inf); }, {"every logit"},
                                     "only -inf logits");
      }
    }
  }
}

TEST(Sampler, MinusInfinityMarksATokenThatIsNeverChosen) {
  for (SamplerMode mode : {SamplerMode::kStandard, SamplerMode::kLlama2c}) {
    Sampler sampler({.temperature = 1.0f, .top_p = 0.95f, .seed = 5, .mode = mode});
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> logits = {-INFINITY, 0.0f, 0.1f, -INFINITY};
      const int32_t id = sampler.sample(logits);
      EXPECT_TRUE(id == 1 || id == 2) << id;
    }
  }
}

}  // namespace
}  // namespace entropyinfer

// Token logprobs: log-softmax of the raw logits and the most likely alternatives.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/token_logprobs.h"
#include "expect_error.h"

namespace entropyinfer {
namespace {

TEST(TokenLogprob, MatchesLogSoftmaxInLongDouble) {
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(50000);
  for (float& logit : logits) logit = normal(generator);
  long double sum = 0.0L;
  for (float logit : logits) sum += std::exp(static_cast<long double>(logit));
  for (int32_t token : {0, 123, 49999}) {
    const TokenLogprob result = token_logprob(logits, token, 0);
    const double expected = static_cast<double>(logits[token] - std::log(sum));
    EXPECT_NEAR(result.logprob, expected, 1e-5) << token;
    EXPECT_EQ(result.token, token);
    EXPECT_TRUE(result.top.empty());
  }
}

TEST(TokenLogprob, TopAlternativesAreTheBestInOrderWithTiesByLowerId) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
  const TokenLogprob result = token_logprob(logits, 4, 4);
  ASSERT_EQ(result.top.size(), 4u);
  const std::vector<int32_t> expected_order = {1, 3, 5, 0};
  double probability_sum = 0.0;
  for (size_t i = 0; i < result.top.size(); ++i) {
    EXPECT_EQ(result.top[i].token, expected_order[i]) << i;
    probability_sum += std::exp(result.top[i].logprob);
  }
  EXPECT_FLOAT_EQ(result.top[0].logprob, result.top[1].logprob);
  EXPECT_NEAR(result.top[0].logprob - result.logprob, 2.5, 1e-6);  // 3.0 - 0.5
  // The two left out (0.5 and -2.0) hold the rest of the mass.
  EXPECT_NEAR(probability_sum + std::exp(result.logprob) +
                  std::exp(static_cast<double>(result.top[0].logprob) - 5.0),
              1.0, 1e-6);
  // More alternatives than tokens: every token, once.
  EXPECT_EQ(token_logprob(std::vector<float>{0.0f, 1.0f}, 0, 20).top.size(), 2u);
}

TEST(TokenLogprob, MinusInfinityIsAnImpossibleTokenAndBadArgumentsAreErrors) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, 0.0f};
  const TokenLogprob result = token_logprob(logits, 0, 3);
  EXPECT_EQ(result.logprob, -inf);
  EXPECT_NEAR(result.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(result.top[2].token, 0);
  testing::expect_error_naming([&] { token_logprob(logits, 3, 0); }, {"token id 3", "3 logits"},
                               "a token past the logits");
  testing::expect_error_naming([&] { token_logprob(logits, 1, 21); }, {"21", "at most 20"},
                               "21 alternatives");
  const std::vector<float> all_impossible = {-inf, -inf};
  testing::expect_error_naming([&] { token_logprob(all_impossible, 1, 0); }, {"no logit is finite"},
                               "logits that are all -inf");
}

// Each row scored as token_logprob scores it alone, over the row's first scored_ids logits only.
TEST(NextTokenLogprobs, EachRowIsTokenLogprobOfItsPrefixInRowOrder) {
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr int64_t kWidth = 40, kScored = 32, kRows = 9;
  std::vector<float> rows(kRows * kWidth);
  for (float& logit : rows) logit = normal(generator);
  // Padding logits past the scored ids are large: counting them would change every logprob.
  for (int64_t r = 0; r < kRows; ++r) rows[r * kWidth + kScored] = 50.0f;
  const std::vector<int32_t> next = {0, 5, 31, 7, 7, 2, 30, 1, 12};
  std::vector<TokenLogprob> out(1);  // appended after what is there
  append_next_token_logprobs(rows, kWidth, kScored, next, 3, out);
  ASSERT_EQ(out.size(), 1u + kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    const std::span<const float> row(rows.data() + r * kWidth, kScored);
    const TokenLogprob alone = token_logprob(row, next[r], 3);
    const TokenLogprob& got = out[1 + r];
    EXPECT_EQ(got.token, next[r]);
    EXPECT_EQ(got.logprob, alone.logprob) << r;
    ASSERT_EQ(got.top.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(got.top[i].token, alone.top[i].token) << r;
      EXPECT_EQ(got.top[i].logprob, alone.top[i].logprob) << r;
      EXPECT_LT(got.top[i].token, kScored) << "a padding id among the alternatives";
    }
  }
}

TEST(NextTokenLogprobs, BadShapesAndTokensAreErrorsThatAppendNothing) {
  const std::vector<float> rows(2 * 4, 0.0f);
  std::vector<TokenLogprob> out;
  testing::expect_error_naming(
      [&] {
        append_next_token_logprobs(rows, 4, 4, std::vector<int32_t>{1, 2, 3}, 0, out);
      },
      {"8 logits", "3 rows of 4"}, "fewer logits than rows");
  testing::expect_error_naming(
      [&] {
        append_next_token_logprobs(rows, 4, 5, std::vector<int32_t>{1, 2}, 0, out);
      },
      {"5 scored"}, "more scored ids than the row holds");
  testing::expect_error_naming(
      [&] {
        append_next_token_logprobs(rows, 4, 3, std::vector<int32_t>{1, 3}, 0, out);
      },
      {"token id 3", "3 logits"}, "a next token past the scored ids");
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace entropyinfer

// The batch executor against the single-sequence one, on the shipped model: sequences of
// different lengths and methods decoding together get the logits each gets alone (the batch only
// shares the passes over the weights), a prefill run a layer at a time between decode steps
// gives the prefill's own logits, and the page pool holds exactly what the sequences reserve:
// never more than kv_pages_needed, less once a compression returns pages, nothing after close.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch_model.h"
#include "engine/cpu_executor.h"
#include "engine/prefill_work.h"
#include "engine/sampler.h"
#include "engine/token_logprobs.h"
#include "engine/transformer.h"
#include "expect_error.h"
#include "model/model_weights.h"
#include "model/random_model.h"
#include "shipped_model_support.h"
#include "small_budgets.h"

// The action (last, so that it may hold commas) must throw Error naming `part`.
#define EXPECT_ERROR(part, ...) \
  ::entropyinfer::testing::expect_error_naming([&] { __VA_ARGS__; }, {part}, #__VA_ARGS__)

namespace entropyinfer {
namespace {

struct Case {
  std::string methods;
  int prompt_tokens = 0;
  AttentionConfig attention;
  std::vector<int32_t> prompt;
  std::vector<int32_t> continuation;             // what the sequence is fed after its prompt
  std::vector<std::vector<float>> alone_logits;  // prompt's last token, then each fed token
};

class BatchModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new ModelWeights(load_model(testing::shipped_model_dir()));
  }
  static void TearDownTestSuite() {
    delete weights_;
    weights_ = nullptr;
  }

  // Runs the case alone through the single-sequence executor, greedy, recording its logits.
  static void run_alone(Case& c, int steps) {
    Transformer model(*weights_, 0, c.attention);
    std::vector<float> logits = model.forward(c.prompt);
    c.alone_logits.push_back(logits);
    for (int i = 0; i < steps; ++i) {
      const int32_t next = argmax(logits);
      c.continuation.push_back(next);
      logits = model.forward(std::vector<int32_t>{next});
      c.alone_logits.push_back(logits);
    }
  }

  static ModelWeights* weights_;
};
ModelWeights* BatchModelTest::weights_ = nullptr;

double max_abs_difference(const std::vector<float>& a, const float* b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst;
}

TEST_F(BatchModelTest, SequencesDecodingTogetherGetTheLogitsEachGetsAlone) {
  constexpr int kSteps = 12;
  std::vector<Case> cases;
  for (const auto& [methods, tokens] :
       std::vector<std::pair<std::string, int>>{{"full", 300},
                                                {"entropy+snapkv", 520},
                                                {"full+latent", 410},
                                                {"critiprefill+streaming", 260},
                                                {"entropy+adakv", 380}}) {
    Case c;
    c.methods = methods;
    c.prompt_tokens = tokens;
    cases.push_back(c);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    c.attention = testing::small_budgets(c.methods);
    c.prompt = random_prompt(c.prompt_tokens, weights_->config.vocab_size, 17 + i);
    run_alone(c, kSteps);
  }
  BatchModelOptions options;
  options.pool_bytes = int64_t{64} << 20;
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  std::vector<BatchModel::SequenceId> ids;
  for (const Case& c : cases) ids.push_back(batch->open(c.attention, c.prompt, kSteps + 1));

  // Prefills start one after another, a layer per step, while the earlier sequences decode: every
  // step mixes a partial prefill with a batch of decode rows at different positions.
  std::vector<int> fed(cases.size(), -1);  // -1: prefill not done; else tokens fed after it
  size_t prefilling = 0;
  double worst = 0.0;
  int decode_rows = 0;
  while (true) {
    BatchModel::StepInput input;
    std::vector<size_t> decoding;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (fed[i] >= 0 && fed[i] < kSteps) {
        input.decode.push_back(ids[i]);
        input.decode_tokens.push_back(cases[i].continuation[fed[i]]);
        decoding.push_back(i);
      }
    }
    if (prefilling < cases.size()) input.prefill = ids[prefilling];
    if (input.decode.empty() && input.prefill < 0) break;
    const BatchModel::StepOutput output = batch->step(input);
    const int64_t vocab = weights_->config.vocab_size;
    ASSERT_EQ(output.decode_logits.size(), decoding.size() * vocab);
    for (size_t row = 0; row < decoding.size(); ++row) {
      const size_t i = decoding[row];
      ++fed[i];
      worst = std::max(worst, max_abs_difference(cases[i].alone_logits[fed[i]],
                                                 output.decode_logits.data() + row * vocab));
      decode_rows += 1;
    }
    if (output.prefill_done) {
      worst = std::max(worst, max_abs_difference(cases[prefilling].alone_logits[0],
                                                 output.prefill_logits.data()));
      fed[prefilling] = 0;
      ++prefilling;
    }
  }
  EXPECT_EQ(decode_rows, kSteps * static_cast<int>(cases.size()));
  // The batch shares the matrix products' passes over the weights; each row's arithmetic is its
  // own, so the logits agree to float rounding (they are O(10)).
  EXPECT_LT(worst, 1e-3) << "largest logit difference between a batched and a lone sequence";
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool compresses = cases[i].attention.decode != DecodeMethod::kFull;
    EXPECT_EQ(batch->compressed(ids[i]), compresses) << cases[i].methods;
    EXPECT_EQ(batch->position(ids[i]), cases[i].prompt_tokens + kSteps) << cases[i].methods;
  }
  for (BatchModel::SequenceId id : ids) batch->close(id);
  EXPECT_EQ(batch->pool_usage().pages_used, 0);
}

TEST_F(BatchModelTest, PagesHeldStayWithinTheReservationAndCompressionReturnsThem) {
  constexpr int kSteps = 10;
  BatchModelOptions options;
  options.pool_bytes = int64_t{64} << 20;
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  const int64_t vocab = weights_->config.vocab_size;
  for (const char* methods : {"full", "entropy+snapkv", "full+latent", "full+adakv",
                              "full+pyramidkv", "full+streaming"}) {
    SCOPED_TRACE(methods);
    const AttentionConfig attention = testing::small_budgets(methods);
    const std::vector<int32_t> prompt = random_prompt(600, weights_->config.vocab_size, 5);
    const BatchModel::PageNeed need = batch->pages_needed(attention, 600, kSteps);
    const BatchModel::SequenceId id = batch->open(attention, prompt, kSteps);
    EXPECT_EQ(batch->pool_usage().pages_used, 0) << "an open sequence holds nothing yet";
    BatchModel::StepInput prefill;
    prefill.prefill = id;
    prefill.prefill_budget = std::numeric_limits<double>::infinity();
    BatchModel::StepOutput output = batch->step(prefill);
    ASSERT_TRUE(output.prefill_done);
    int64_t most = batch->pages_held(id);
    int64_t before_compression = batch->compressed(id) ? -1 : most;
    int32_t next = argmax(output.prefill_logits);
    for (int step = 0; step + 1 < kSteps; ++step) {
      if (!batch->compressed(id)) before_compression = batch->pages_held(id);
      BatchModel::StepInput input;
      input.decode = {id};
      input.decode_tokens = {next};
      output = batch->step(input);
      next = argmax(
          std::vector<float>(output.decode_logits.begin(), output.decode_logits.begin() + vocab));
      most = std::max<int64_t>(most, batch->pages_held(id));
      EXPECT_EQ(batch->pool_usage().pages_used, batch->pages_held(id));
    }
    EXPECT_LE(most, need.peak);
    if (attention.decode == DecodeMethod::kFull) {
      EXPECT_FALSE(batch->compressed(id));
      EXPECT_EQ(need.steady, need.peak);
      // Without compression the whole prompt and answer are reserved at the prefill.
      EXPECT_EQ(batch->pages_held(id), need.peak);
    } else {
      ASSERT_TRUE(batch->compressed(id));
      EXPECT_LT(need.steady, need.peak / 2) << "600 rows per head compressed to about 64";
      EXPECT_LE(batch->pages_held(id), need.steady);
      if (before_compression >= 0) {
        EXPECT_LT(batch->pages_held(id), before_compression);
      }
    }
    batch->close(id);
    EXPECT_EQ(batch->pool_usage().pages_used, 0);
  }
}

TEST_F(BatchModelTest, RefusesWhatDoesNotFitAndMisuse) {
  BatchModelOptions options;
  options.pool_bytes = int64_t{1} << 20;  // 1 MiB: a few hundred rows per head of 6 layers
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  const AttentionConfig full;
  const int context = batch->context_length();
  EXPECT_ERROR("the prompt is empty", batch->open(full, {}, 4));
  EXPECT_ERROR("outside the vocabulary", batch->open(full, {1, weights_->config.vocab_size}, 4));
  EXPECT_ERROR("exceed the", batch->open(full, std::vector<int32_t>(context, 1), 1));
  AttentionConfig bad;
  bad.decode_params.budget = -3;
  bad.decode = DecodeMethod::kSnapKV;
  EXPECT_ERROR("budget", batch->open(bad, {1, 2, 3}, 4));

  // A prompt bigger than the pool fails at its prefill with the pool's message, and holds
  // nothing afterwards.
  const BatchModel::SequenceId big = batch->open(full, random_prompt(4000, 100, 1), 4);
  EXPECT_GT(batch->pages_needed(full, 4000, 4).peak, batch->pool_usage().pages_total);
  BatchModel::StepInput prefill;
  prefill.prefill = big;
  EXPECT_ERROR("the KV pool has", batch->step(prefill));
  batch->close(big);
  EXPECT_EQ(batch->pool_usage().pages_used, 0);

  const BatchModel::SequenceId id = batch->open(full, {1, 2, 3}, 1);
  BatchModel::StepInput early;
  early.decode = {id};
  early.decode_tokens = {4};
  EXPECT_ERROR("is prefilling", batch->step(early));
  prefill.prefill = id;
  prefill.prefill_budget = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(batch->step(prefill).prefill_done);
  BatchModel::StepInput twice;
  twice.decode = {id, id};
  twice.decode_tokens = {4, 5};
  EXPECT_ERROR("once per step", batch->step(twice));
  BatchModel::StepInput once;
  once.decode = {id};
  once.decode_tokens = {4};
  batch->step(once);
  EXPECT_ERROR("past the 4 rows", batch->step(once));
  EXPECT_ERROR("has finished its prefill", batch->step(prefill));
  once.decode = {999};
  EXPECT_ERROR("no sequence 999", batch->step(once));
  batch->close(id);
  EXPECT_EQ(batch->pool_usage().pages_used, 0);
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

// A step runs whole layers on the CPU while its budget lasts, and at least one: the steps a prompt
// takes follow from PrefillWork's layer cost, and the logits do not depend on the budget.
TEST_F(BatchModelTest, PrefillRunsLayersWhileTheStepBudgetLasts) {
  BatchModelOptions options;
  options.pool_bytes = int64_t{64} << 20;
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  const int layers = batch->num_layers();
  ASSERT_GE(layers, 3);
  const std::vector<int32_t> prompt = random_prompt(300, weights_->config.vocab_size, 9);
  const double layer_cost = PrefillWork(weights_->config).layer(300);
  std::vector<float> reference;
  for (const auto& [budget, expected_steps] :
       std::vector<std::pair<double, int>>{{std::numeric_limits<double>::infinity(), 1},
                                           {0.0, layers},
                                           {1.5 * layer_cost, (layers + 1) / 2},
                                           {2.0 * layer_cost, (layers + 1) / 2}}) {
    SCOPED_TRACE(budget);
    const BatchModel::SequenceId id = batch->open(AttentionConfig{}, prompt, 1);
    BatchModel::StepInput input;
    input.prefill = id;
    input.prefill_budget = budget;
    BatchModel::StepOutput output;
    int steps = 0;
    do {
      output = batch->step(input);
      ++steps;
    } while (!output.prefill_done && steps <= layers);
    EXPECT_EQ(steps, expected_steps);
    if (reference.empty()) {
      reference = output.prefill_logits;
    } else {
      EXPECT_EQ(max_abs_difference(reference, output.prefill_logits.data()), 0.0);
    }
    batch->close(id);
  }
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

// Prompt scores asked of a sequence that prefills a layer per step beside a decoding one are
// token_logprob of the single-sequence executor's all_logits rows, for prompts longer than a
// chunk of rows (the CPU projects 256 at a time) under a dense and a sparse prefill; asking
// changes neither the last row's logits nor the decoding sequence's.
TEST_F(BatchModelTest, PromptLogprobsAreTheAllLogitsRowsScoredAgainstTheNextToken) {
  constexpr int kTop = 3;
  const int vocab = weights_->config.vocab_size;
  BatchModelOptions options;
  options.pool_bytes = int64_t{64} << 20;
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  const PrefillWork work(weights_->config);
  for (const auto& [methods, tokens] :
       std::vector<std::pair<std::string, int>>{{"full", 600}, {"entropy+snapkv", 530}}) {
    SCOPED_TRACE(methods);
    const AttentionConfig attention = testing::small_budgets(methods);
    const std::vector<int32_t> prompt = random_prompt(tokens, vocab, 23);
    Transformer alone(*weights_, 0, attention);
    const std::vector<float> rows = alone.forward(prompt, /*all_logits=*/true);
    ASSERT_EQ(rows.size(), prompt.size() * static_cast<size_t>(vocab));

    // A neighbour decoding, so that the prefill runs in slices between decode steps.
    const BatchModel::SequenceId neighbour = batch->open(AttentionConfig{}, {1, 2, 3}, 16);
    BatchModel::StepInput input;
    input.prefill = neighbour;
    input.prefill_budget = std::numeric_limits<double>::infinity();
    const BatchModel::StepOutput neighbour_prefill = batch->step(input);
    ASSERT_TRUE(neighbour_prefill.prefill_done);
    EXPECT_TRUE(neighbour_prefill.prompt_logprobs.empty()) << "not asked";

    const BatchModel::SequenceId id = batch->open(attention, prompt, 2);
    batch->ask_prompt_logprobs(id, kTop, 0);
    input.prefill = id;
    input.prefill_budget = 0;  // a layer per step
    input.decode = {neighbour};
    input.decode_tokens = {4};
    BatchModel::StepOutput output;
    int steps = 0;
    do {
      output = batch->step(input);
      ++steps;
      if (!output.prefill_done) {
        EXPECT_TRUE(output.prompt_logprobs.empty());
      }
    } while (!output.prefill_done && steps <= batch->num_layers());
    ASSERT_TRUE(output.prefill_done);
    EXPECT_EQ(steps, batch->num_layers());
    EXPECT_EQ(max_abs_difference(output.prefill_logits, rows.data() + (tokens - 1) * vocab), 0.0);

    ASSERT_EQ(output.prompt_logprobs.size(), prompt.size() - 1);
    double worst = 0.0;
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const std::span<const float> row(rows.data() + i * vocab, static_cast<size_t>(vocab));
      const TokenLogprob expected = token_logprob(row, prompt[i + 1], kTop);
      const TokenLogprob& got = output.prompt_logprobs[i];
      ASSERT_EQ(got.token, prompt[i + 1]) << i;
      worst = std::max(worst, std::fabs(double(got.logprob) - expected.logprob));
      ASSERT_EQ(got.top.size(), static_cast<size_t>(kTop)) << i;
      for (int k = 0; k < kTop; ++k) {
        EXPECT_EQ(got.top[k].token, expected.top[k].token) << i;
        worst = std::max(worst, std::fabs(double(got.top[k].logprob) - expected.top[k].logprob));
      }
    }
    // The same executor and rows: identical, not merely close.
    EXPECT_EQ(worst, 0.0);
    batch->close(id);
    batch->close(neighbour);
    EXPECT_EQ(batch->pool_usage().pages_used, 0);
  }
}

TEST_F(BatchModelTest, PromptLogprobsScoreOnlyTheGivenIdsAndAreRefusedOnceThePrefillBegan) {
  BatchModelOptions options;
  options.pool_bytes = int64_t{16} << 20;
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options);
  const int vocab = weights_->config.vocab_size;
  const std::vector<int32_t> prompt = {1, 40, 7, 99, 12};
  const BatchModel::SequenceId id = batch->open(AttentionConfig{}, prompt, 1);
  EXPECT_ERROR("21 alternatives", batch->ask_prompt_logprobs(id, 21, 0));
  EXPECT_ERROR("scored ids", batch->ask_prompt_logprobs(id, 2, vocab + 1));
  EXPECT_ERROR("no sequence 77", batch->ask_prompt_logprobs(77, 2, 0));
  constexpr int kScored = 100;  // every prompt id is below it
  batch->ask_prompt_logprobs(id, 20, kScored);
  BatchModel::StepInput input;
  input.prefill = id;
  input.prefill_budget = 0;
  BatchModel::StepOutput output = batch->step(input);
  ASSERT_FALSE(output.prefill_done);
  EXPECT_ERROR("has begun its prefill", batch->ask_prompt_logprobs(id, 2, 0));
  while (!output.prefill_done) output = batch->step(input);
  ASSERT_EQ(output.prompt_logprobs.size(), prompt.size() - 1);
  for (const TokenLogprob& scored : output.prompt_logprobs) {
    ASSERT_EQ(scored.top.size(), 20u);
    double mass = 0.0;
    for (const TokenAlternative& alternative : scored.top) {
      EXPECT_LT(alternative.token, kScored);
      mass += std::exp(double(alternative.logprob));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_LE(scored.logprob, scored.top.front().logprob);
  }
  batch->close(id);
}

}  // namespace
}  // namespace entropyinfer

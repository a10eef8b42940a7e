// The serving scheduler on the shipped model, against generate() on the single-sequence
// executor: concurrent requests of different methods, lengths and samplers, batched and
// interleaved with each other's prefills, stream the text each gets alone; a pool too small for
// all of them at once queues them and still answers each; cancelling returns every page; a
// request that can never fit is refused with the reason; stopping finishes what is in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/batch_model.h"
#include "engine/generation.h"
#include "engine/transformer.h"
#include "expect_error.h"
#include "model/model_weights.h"
#include "serve/scheduler.h"
#include "shipped_model_support.h"
#include "small_budgets.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::serve {
namespace {

std::string document(int lines) {
  std::string text;
  for (int i = 0; i < lines; ++i) {
    text += "Line " + std::to_string(i) + ": the keeper of the lighthouse counted " +
            std::to_string(7 * i + 3) + " ships before dawn. ";
  }
  return text + "The number of ships the keeper counted on line 3 was";
}

struct Answer {
  std::string text;  // the streamed pieces, joined
  StreamEvent finished;
  std::vector<TokenLogprob> logprobs;  // of every event, in order
  std::vector<TokenLogprob> prompt_logprobs;
  int events_with_prompt_logprobs = 0;
};

// Reads a stream to its end. The limit only catches a hang: under ASan, with other tests beside
// it on two cores, six concurrent streams take over a minute.
Answer read_all(RequestStream& stream) {
  Answer answer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  StreamEvent event;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!stream.next(event, std::chrono::milliseconds(100))) continue;
    answer.logprobs.insert(answer.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    if (!event.prompt_logprobs.empty()) {
      ++answer.events_with_prompt_logprobs;
      answer.prompt_logprobs = event.prompt_logprobs;
    }
    if (event.kind == StreamEvent::Kind::kText) {
      answer.text += event.text;
      continue;
    }
    answer.finished = event;
    return answer;
  }
  ADD_FAILURE() << "the stream did not finish within five minutes";
  return answer;
}

// The batch model, with every step's prefill budget and decode rows written down (the scheduler
// calls it from its one thread; read after wait_idle).
class RecordingBatchModel : public BatchModel {
 public:
  struct Step {
    bool prefills = false;
    size_t decoding = 0;
    double budget = 0;
  };
  RecordingBatchModel(std::unique_ptr<BatchModel> model, std::vector<Step>* steps)
      : model_(std::move(model)), steps_(steps) {}
  SequenceId open(const AttentionConfig& attention, std::vector<int32_t> prompt,
                  int max_new_tokens) override {
    return model_->open(attention, std::move(prompt), max_new_tokens);
  }
  void close(SequenceId sequence) override { model_->close(sequence); }
  void ask_prompt_logprobs(SequenceId sequence, int top, int scored_ids) override {
    model_->ask_prompt_logprobs(sequence, top, scored_ids);
  }
  StepOutput step(const StepInput& input) override {
    steps_->push_back({input.prefill >= 0, input.decode.size(), input.prefill_budget});
    return model_->step(input);
  }
  PageNeed pages_needed(const AttentionConfig& attention, int prompt_tokens,
                        int max_new_tokens) const override {
    return model_->pages_needed(attention, prompt_tokens, max_new_tokens);
  }
  bool prefill_slot_free() const override { return model_->prefill_slot_free(); }
  KvPoolUsage pool_usage() const override { return model_->pool_usage(); }
  int pages_held(SequenceId sequence) const override { return model_->pages_held(sequence); }
  int position(SequenceId sequence) const override { return model_->position(sequence); }
  bool prefilled(SequenceId sequence) const override { return model_->prefilled(sequence); }
  bool compressed(SequenceId sequence) const override { return model_->compressed(sequence); }
  const AttentionWork& attention_work(SequenceId sequence) const override {
    return model_->attention_work(sequence);
  }
  int context_length() const override { return model_->context_length(); }
  int num_layers() const override { return model_->num_layers(); }
  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return model_->device_name(); }

 private:
  std::unique_ptr<BatchModel> model_;
  std::vector<Step>* steps_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = new ModelWeights(load_model(testing::shipped_model_dir()));
    tokenizer_ = load_tokenizer(testing::shipped_model_dir() + "/tokenizer.json").release();
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete tokenizer_;
  }

  static std::unique_ptr<Scheduler> make_scheduler(int64_t pool_bytes,
                                                   SchedulerOptions options = {}) {
    BatchModelOptions model_options;
    model_options.pool_bytes = pool_bytes;
    return std::make_unique<Scheduler>(make_batch_model(*weights_, model_options), *tokenizer_,
                                       options);
  }

  static SequenceRequest request(const std::string& methods, int lines, int max_tokens,
                                 float temperature = 0.0f, uint64_t seed = 0) {
    SequenceRequest r;
    r.prompt = tokenizer_->encode(document(lines), {.add_bos = true});
    r.generation.max_tokens = max_tokens;
    r.generation.sampler.temperature = temperature;
    r.generation.sampler.top_p = temperature > 0 ? 0.9f : 1.0f;
    r.generation.sampler.seed = seed;
    r.attention = testing::small_budgets(methods);
    return r;
  }

  // The same request through generate() on its own executor.
  static GenerationResult alone(const SequenceRequest& r) {
    Transformer model(*weights_, 0, r.attention);
    return generate(model, *tokenizer_, r.prompt, r.generation);
  }

  // A prompt prefilled alone in one step, and a layer per step while others decode; decode
  // batches smaller than `wait_batch` sit out up to `wait_steps` of those steps.
  static SchedulerOptions layer_per_step_options(
      int wait_steps, int wait_batch = SchedulerOptions{}.decode_wait_batch) {
    SchedulerOptions options;
    options.prefill_token_layers_per_step = int64_t{1} << 30;
    options.prefill_token_layers_while_decoding = 1;
    options.decode_wait_steps = wait_steps;
    options.decode_wait_batch = wait_batch;
    return options;
  }

  // `first` and `second`, submitted together, on a model that writes down every step; each must
  // stream the text it gets alone.
  static std::vector<RecordingBatchModel::Step> recorded_steps(const SchedulerOptions& options,
                                                               const SequenceRequest& first,
                                                               const SequenceRequest& second) {
    std::vector<RecordingBatchModel::Step> steps;
    BatchModelOptions model_options;
    model_options.pool_bytes = int64_t{64} << 20;
    Scheduler scheduler(
        std::make_unique<RecordingBatchModel>(make_batch_model(*weights_, model_options), &steps),
        *tokenizer_, options);
    auto first_stream = scheduler.submit(first);
    auto second_stream = scheduler.submit(second);
    const Answer first_answer = read_all(*first_stream);
    const Answer second_answer = read_all(*second_stream);
    scheduler.wait_idle();
    EXPECT_EQ(first_answer.text, alone(first).text);
    EXPECT_EQ(second_answer.text, alone(second).text);
    return steps;
  }

  static ModelWeights* weights_;
  static Tokenizer* tokenizer_;
};
ModelWeights* SchedulerTest::weights_ = nullptr;
Tokenizer* SchedulerTest::tokenizer_ = nullptr;

TEST_F(SchedulerTest, ConcurrentRequestsStreamWhatEachGetsAlone) {
  std::vector<SequenceRequest> requests = {
      request("full", 12, 20),
      request("entropy+snapkv", 30, 24),
      request("full+latent", 22, 18, 0.8f, 7),
      request("critiprefill+streaming", 8, 16),
      request("entropy+adakv", 26, 22, 1.1f, 99),
      request("full+pyramidkv", 18, 20),
  };
  requests[0].generation.stop_strings = {" ships"};
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const SequenceRequest& r : requests) streams.push_back(scheduler->submit(r));
  std::vector<std::future<Answer>> answers;
  for (auto& stream : streams) {
    answers.push_back(std::async(std::launch::async, [stream] { return read_all(*stream); }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    const Answer answer = answers[i].get();
    const GenerationResult expected = alone(requests[i]);
    EXPECT_EQ(answer.text, expected.text);
    ASSERT_EQ(answer.finished.kind, StreamEvent::Kind::kFinished);
    EXPECT_EQ(answer.finished.error, "");
    const RequestStats& stats = answer.finished.stats;
    EXPECT_EQ(stats.prompt_tokens, static_cast<int>(requests[i].prompt.size()));
    EXPECT_EQ(stats.completion_tokens, static_cast<int>(expected.tokens.size()));
    EXPECT_EQ(answer.finished.finish_reason,
              expected.stop_reason == "max tokens" ? FinishReason::kLength : FinishReason::kStop);
    const bool sparse = requests[i].attention.prefill != PrefillMethod::kFull;
    EXPECT_EQ(stats.prefill_keys_fraction() < 1.0, sparse) << stats.methods;
    EXPECT_EQ(stats.compressed,
              requests[i].attention.decode != DecodeMethod::kFull && stats.completion_tokens >= 4);
    EXPECT_GT(stats.time_to_first_token, 0.0);
  }
  EXPECT_EQ(requests.size(), 6u);
  scheduler->wait_idle();
  const SchedulerSnapshot snapshot = scheduler->snapshot();
  EXPECT_EQ(snapshot.pool.pages_used, 0);
  EXPECT_EQ(snapshot.running, 0);
  EXPECT_EQ(snapshot.queued, 0);
}

// Logprobs against the single-sequence executor's logits, normalised here in double: one entry per
// generated token, stop-string tokens included, each the greedy pick's own.
TEST_F(SchedulerTest, LogprobsFollowTheModelsLogitsForEveryGeneratedToken) {
  SequenceRequest r = request("full", 12, 16);
  r.top_logprobs = 3;
  r.generation.stop_strings = {" the"};
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20);
  const Answer answer = read_all(*scheduler->submit(r));
  const GenerationResult expected = alone(r);
  EXPECT_EQ(answer.text, expected.text);
  ASSERT_EQ(answer.finished.stats.completion_tokens, static_cast<int>(expected.tokens.size()));
  ASSERT_EQ(answer.logprobs.size(), expected.tokens.size());
  ASSERT_EQ(answer.finished.finish_reason, FinishReason::kStop)
      << "the stop string never came: " << expected.text;
  // The stop string's tokens come with the last event, as their text is never shown.
  EXPECT_FALSE(answer.finished.logprobs.empty());

  Transformer model(*weights_, 0, r.attention);
  std::vector<float> logits = model.forward(r.prompt);
  for (size_t i = 0; i < expected.tokens.size(); ++i) {
    SCOPED_TRACE(i);
    const TokenLogprob& reported = answer.logprobs[i];
    EXPECT_EQ(reported.token, expected.tokens[i]);
    double max_logit = logits[0];
    for (float logit : logits) max_logit = std::max<double>(max_logit, logit);
    double sum = 0.0;
    for (float logit : logits) sum += std::exp(logit - max_logit);
    const double log_normaliser = max_logit + std::log(sum);
    EXPECT_NEAR(reported.logprob, logits[static_cast<size_t>(reported.token)] - log_normaliser,
                1e-3);
    ASSERT_EQ(reported.top.size(), 3u);
    EXPECT_EQ(reported.top[0].token, reported.token);  // greedy: the most likely
    EXPECT_GE(reported.top[1].logprob, reported.top[2].logprob);
    EXPECT_NEAR(reported.top[2].logprob,
                logits[static_cast<size_t>(reported.top[2].token)] - log_normaliser, 1e-3);
    const std::vector<int32_t> next = {reported.token};
    logits = model.forward(next);
  }
}

// Echo with logprobs: the prompt's scores come once, on the first event after the prefill, and
// are the single-sequence executor's all_logits rows scored against the next prompt token; the
// answer is the one the request gets unscored. With max_tokens 0 the scores are all there is.
TEST_F(SchedulerTest, PromptLogprobsComeOnceAndScoreEachPromptTokenUnderTheRowBefore) {
  SequenceRequest r = request("full", 6, 5);
  r.top_logprobs = 2;
  r.prompt_logprobs = 2;
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20);
  const Answer answer = read_all(*scheduler->submit(r));
  SequenceRequest plain = r;
  plain.top_logprobs = -1;
  plain.prompt_logprobs = -1;
  const Answer plain_answer = read_all(*scheduler->submit(plain));
  EXPECT_EQ(answer.text, plain_answer.text);
  EXPECT_EQ(answer.logprobs.size(), 5u);
  EXPECT_EQ(plain_answer.events_with_prompt_logprobs, 0);
  EXPECT_EQ(answer.events_with_prompt_logprobs, 1);
  ASSERT_EQ(answer.prompt_logprobs.size(), r.prompt.size() - 1);

  Transformer model(*weights_, 0, r.attention);
  const std::vector<float> rows = model.forward(r.prompt, /*all_logits=*/true);
  const size_t vocab = static_cast<size_t>(weights_->config.vocab_size);
  for (size_t i = 0; i + 1 < r.prompt.size(); ++i) {
    SCOPED_TRACE(i);
    const TokenLogprob expected =
        token_logprob(std::span<const float>(rows.data() + i * vocab, vocab), r.prompt[i + 1], 2);
    const TokenLogprob& reported = answer.prompt_logprobs[i];
    EXPECT_EQ(reported.token, r.prompt[i + 1]);
    EXPECT_NEAR(reported.logprob, expected.logprob, 1e-5);
    ASSERT_EQ(reported.top.size(), 2u);
    EXPECT_EQ(reported.top[0].token, expected.top[0].token);
  }

  SequenceRequest scores_only = r;
  scores_only.generation.max_tokens = 0;
  const Answer scored = read_all(*scheduler->submit(scores_only));
  EXPECT_EQ(scored.text, "");
  EXPECT_TRUE(scored.logprobs.empty());
  EXPECT_EQ(scored.finished.finish_reason, FinishReason::kLength);
  EXPECT_EQ(scored.finished.stats.completion_tokens, 0);
  ASSERT_EQ(scored.prompt_logprobs.size(), r.prompt.size() - 1);
  EXPECT_EQ(scored.prompt_logprobs.back().logprob, answer.prompt_logprobs.back().logprob);

  SequenceRequest bad = r;
  bad.prompt_logprobs = kMaxTopLogprobs + 1;
  testing::expect_error_naming([&] { scheduler->submit(bad); }, {"prompt_logprobs", "21"},
                               "21 prompt alternatives");
  scheduler->wait_idle();
  EXPECT_EQ(scheduler->snapshot().pool.pages_used, 0);
}

// A token-id prompt (the server's /v1/completions with an array of ids) runs exactly as given:
// without BOS, its own first token unscored and every later one scored and counted.
TEST_F(SchedulerTest, APromptWithoutBosIsScoredAndCountedAsGiven) {
  SequenceRequest r = request("full", 2, 0);
  r.prompt = tokenizer_->encode(" the keeper counted ships", {.add_bos = false});
  ASSERT_GE(r.prompt.size(), 3u);
  ASSERT_NE(tokenizer_->bos_id(), r.prompt.front());
  r.top_logprobs = 1;
  r.prompt_logprobs = 1;
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20);
  const Answer scored = read_all(*scheduler->submit(r));
  EXPECT_EQ(scored.finished.stats.prompt_tokens, static_cast<int>(r.prompt.size()));
  ASSERT_EQ(scored.prompt_logprobs.size(), r.prompt.size() - 1);
  Transformer model(*weights_, 0, r.attention);
  const std::vector<float> rows = model.forward(r.prompt, /*all_logits=*/true);
  const size_t vocab = static_cast<size_t>(weights_->config.vocab_size);
  for (size_t i = 0; i + 1 < r.prompt.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(scored.prompt_logprobs[i].token, r.prompt[i + 1]);
    EXPECT_NEAR(
        scored.prompt_logprobs[i].logprob,
        token_logprob(std::span<const float>(rows.data() + i * vocab, vocab), r.prompt[i + 1], 1)
            .logprob,
        1e-5);
  }
  scheduler->wait_idle();
  EXPECT_EQ(scheduler->snapshot().pool.pages_used, 0);
}

TEST_F(SchedulerTest, APoolForOneFullRequestQueuesTheRestAndAnswersEach) {
  const SequenceRequest first = request("full", 20, 12);
  BatchModelOptions model_options;
  std::unique_ptr<BatchModel> probe = make_batch_model(*weights_, model_options);
  const int64_t page_bytes = probe->pool_usage().page_bytes;
  const int64_t pages =
      probe->pages_needed(first.attention, static_cast<int>(first.prompt.size()), 12).peak;
  std::unique_ptr<Scheduler> scheduler = make_scheduler((pages + pages / 2) * page_bytes);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(scheduler->submit(first));
  int most_running = 0;
  std::vector<Answer> answers;
  for (auto& stream : streams) {
    most_running = std::max(most_running, scheduler->snapshot().running);
    answers.push_back(read_all(*stream));
  }
  const GenerationResult expected = alone(first);
  for (const Answer& answer : answers) EXPECT_EQ(answer.text, expected.text);
  EXPECT_LE(most_running, 1) << "two full requests ran in a pool that holds one";
  scheduler->wait_idle();
  EXPECT_EQ(scheduler->snapshot().pool.pages_used, 0);
}

TEST_F(SchedulerTest, CancellingReturnsEveryPage) {
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20);
  SequenceRequest long_answer = request("full", 20, 400);
  std::shared_ptr<RequestStream> cancelled = scheduler->submit(long_answer);
  std::shared_ptr<RequestStream> kept = scheduler->submit(request("entropy+snapkv", 24, 8));
  StreamEvent event;
  ASSERT_TRUE(cancelled->next(event, std::chrono::seconds(30)));
  EXPECT_GT(scheduler->snapshot().pool.pages_used, 0);
  cancelled->cancel();
  const Answer rest = read_all(*cancelled);
  EXPECT_EQ(rest.finished.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(rest.finished.stats.completion_tokens, 400);
  const Answer other = read_all(*kept);
  EXPECT_EQ(other.finished.finish_reason, FinishReason::kLength);
  scheduler->wait_idle();
  EXPECT_EQ(scheduler->snapshot().pool.pages_used, 0);
}

TEST_F(SchedulerTest, RefusesWhatCanNeverRunAndStopsGracefully) {
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{4} << 20);
  testing::expect_error_naming([&] { scheduler->submit(request("full", 200, 16)); },
                               {"KV pages", "of the whole pool"}, "a request bigger than the pool");
  SequenceRequest too_long = request("full", 4, 16);
  too_long.generation.max_tokens = scheduler->context_length();
  testing::expect_error_naming([&] { scheduler->submit(too_long); }, {"-token context"},
                               "a request past the context");
  SequenceRequest empty = request("full", 4, 16);
  empty.prompt.clear();
  testing::expect_error_naming([&] { scheduler->submit(empty); }, {"the prompt is empty"},
                               "an empty prompt");
  SequenceRequest bad_budget = request("full+snapkv", 4, 16);
  bad_budget.attention.decode_params.window = -1;
  testing::expect_error_naming([&] { scheduler->submit(bad_budget); }, {"window"},
                               "a negative window");
  EXPECT_THROW(scheduler->submit(request("full", 200, 16)), AdmissionError);

  std::vector<std::shared_ptr<RequestStream>> in_flight;
  for (int i = 0; i < 3; ++i) in_flight.push_back(scheduler->submit(request("full", 6, 10)));
  scheduler->stop_accepting();
  testing::expect_error_naming([&] { scheduler->submit(request("full", 6, 10)); },
                               {"shutting down"}, "a request after stop_accepting");
  scheduler->wait_idle();
  for (auto& stream : in_flight) {
    const Answer answer = read_all(*stream);
    EXPECT_NE(answer.finished.finish_reason, FinishReason::kCancelled);
    EXPECT_FALSE(answer.text.empty());
  }
  EXPECT_FALSE(scheduler->snapshot().accepting);
}

TEST_F(SchedulerTest, AFullQueueRefusesWithItsOwnError) {
  SchedulerOptions options;
  options.max_queued = 2;
  options.max_running = 1;
  std::unique_ptr<Scheduler> scheduler = make_scheduler(int64_t{64} << 20, options);
  std::vector<std::shared_ptr<RequestStream>> streams;
  bool refused = false;
  for (int i = 0; i < 12 && !refused; ++i) {
    try {
      streams.push_back(scheduler->submit(request("full", 30, 60)));
    } catch (const QueueFullError& error) {
      refused = true;
      EXPECT_NE(std::string(error.what()).find("queue is full"), std::string::npos);
    }
  }
  EXPECT_TRUE(refused);
  for (auto& stream : streams) stream->cancel();
  scheduler->wait_idle();
  EXPECT_EQ(scheduler->snapshot().pool.pages_used, 0);
}

// A prefill gets the large budget while nothing decodes and the small one while others do, and
// the text is the same either way.
TEST_F(SchedulerTest, APrefillBesideDecodingStreamsTakesTheSmallBudget) {
  const SchedulerOptions options = layer_per_step_options(0);
  const std::vector<RecordingBatchModel::Step> steps =
      recorded_steps(options, request("full", 20, 24), request("entropy+snapkv", 30, 4));
  int alone_prefill_steps = 0, beside_prefill_steps = 0;
  for (const RecordingBatchModel::Step& step : steps) {
    if (!step.prefills) continue;
    if (step.decoding == 0) {
      ++alone_prefill_steps;
      EXPECT_EQ(step.budget, static_cast<double>(options.prefill_token_layers_per_step));
    } else {
      ++beside_prefill_steps;
      EXPECT_EQ(step.budget, static_cast<double>(options.prefill_token_layers_while_decoding));
    }
  }
  EXPECT_EQ(alone_prefill_steps, 1) << "the first prompt, alone, in one step";
  // The second prompt, beside the first's decoding, a layer per step.
  EXPECT_EQ(beside_prefill_steps, weights_->config.num_layers);
}

// While a prompt prefills, a lone answer sits out prefill steps instead of decoding beside each,
// then decodes together with the prompt's answer; neither text changes.
TEST_F(SchedulerTest, ALoneAnswerWaitsForAPrefillAndThenDecodesBesideIt) {
  const SchedulerOptions options = layer_per_step_options(1000, 2);
  const std::vector<RecordingBatchModel::Step> steps =
      recorded_steps(options, request("full", 20, 24), request("entropy+snapkv", 30, 4));
  int waiting_prefill_steps = 0, pair_steps = 0;
  for (const RecordingBatchModel::Step& step : steps) {
    if (step.prefills) {
      EXPECT_EQ(step.decoding, 0u) << "a lone answer decoded beside the prefill";
      if (step.budget == static_cast<double>(options.prefill_token_layers_while_decoding)) {
        ++waiting_prefill_steps;
      }
    }
    if (step.decoding == 2) ++pair_steps;
  }
  // The second prompt, a layer per step while the first answer waits; then both decode together.
  EXPECT_EQ(waiting_prefill_steps, weights_->config.num_layers);
  EXPECT_EQ(pair_steps, 3) << "the second answer's 3 tokens after its first";
}

// The wait has a limit: after sitting out that many prefill steps the lone answer decodes beside
// the next one, and then waits again.
TEST_F(SchedulerTest, AWaitingAnswerDecodesAfterItsStepsOfWaiting) {
  const SchedulerOptions options = layer_per_step_options(2, 2);
  const std::vector<RecordingBatchModel::Step> steps =
      recorded_steps(options, request("full", 20, 40), request("entropy+snapkv", 30, 4));
  // The second prompt's prefill, a layer per step, beside the first answer: two steps without
  // it, one with it, over and over.
  std::string pattern;
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].prefills) pattern += steps[i].decoding == 0 ? 'w' : 'd';
  }
  const std::string expected = std::string("wwdwwdwwdwwd").substr(0, weights_->config.num_layers);
  EXPECT_EQ(pattern, expected);
}

// A decode batch as large as `decode_wait_batch` never waits: it decodes beside every prefill step,
// as many decoding streams do while a long prompt arrives.
TEST_F(SchedulerTest, ADecodeBatchAtTheWaitBatchDecodesBesideEveryPrefillStep) {
  const SchedulerOptions options = layer_per_step_options(1000, 1);
  const std::vector<RecordingBatchModel::Step> steps =
      recorded_steps(options, request("full", 20, 24), request("entropy+snapkv", 30, 4));
  int beside_prefill_steps = 0;
  for (size_t i = 1; i < steps.size(); ++i) {
    if (!steps[i].prefills) continue;
    EXPECT_EQ(steps[i].decoding, 1u) << "step " << i << ": the answer sat out a prefill step";
    ++beside_prefill_steps;
  }
  EXPECT_EQ(beside_prefill_steps, weights_->config.num_layers);
}

}  // namespace
}  // namespace entropyinfer::serve

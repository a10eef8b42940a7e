// The CUDA batch executor against the CUDA single-sequence one, on the shipped model: sequences of
// different methods and lengths decoding together in one batched step over pool pages, while
// later prompts prefill about a layer per step between those steps, get the logits each gets alone
// (teacher-forced with the lone run's greedy tokens, so that no difference compounds). Both run
// bf16 products; the batch's have more rows (cuBLASLt may pick other algorithms) and its attention
// is paged_decode over pages instead of flash_decode or ragged_decode over slabs, so the bound is
// kLogitBound of the largest logit (the bf16 parity bound is 5e-2). The pool holds what
// pages_needed reserved, compressed sequences far less than full ones, and nothing after close.
// The scheduler on the CUDA executor answers concurrent requests and returns every page.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/ragged_decode.h"
#include "engine/batch_model.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/prefill_work.h"
#include "engine/sampler.h"
#include "engine/token_logprobs.h"
#include "engine/transformer.h"
#include "expect_error.h"
#include "gpu/gpu_test_support.h"
#include "model/model_weights.h"
#include "model/quantize_weights.h"
#include "model/random_model.h"
#include "serve/scheduler.h"
#include "shipped_model_support.h"
#include "small_budgets.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

constexpr double kLogitBound = 2e-2;
// FP8 products of several rows (cuBLASLt, fast accumulation) against the single-row FP8 GEMV.
constexpr double kFp8ProductLogitBound = 0.1;

struct Case {
  std::string methods;
  int prompt_tokens = 0;
  AttentionConfig attention;
  std::vector<int32_t> prompt;
  std::vector<int32_t> continuation;
  std::vector<std::vector<float>> alone_logits;  // prompt's last token, then each fed token
};

class CudaBatchModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda::device_count() == 0) return;
    weights_ = new ModelWeights(load_model(testing::shipped_model_dir()));
  }
  static void TearDownTestSuite() {
    delete weights_;
    weights_ = nullptr;
  }

  static BatchModelOptions options(int64_t pool_mib, bool fp8_kv_cache = false) {
    BatchModelOptions o;
    o.device = Device::kCuda;
    o.pool_bytes = pool_mib << 20;
    o.fp8_kv_cache = fp8_kv_cache;
    return o;
  }

  static void expect_batched_logits_equal_alone(
      const ModelWeights& weights,
      const std::vector<std::pair<std::string, int>>& methods_and_lengths, bool fp8_kv_cache,
      double bound = kLogitBound);

  static ModelWeights* weights_;
};
ModelWeights* CudaBatchModelTest::weights_ = nullptr;

// With fp8_kv_cache both executors hold FP8 caches: the lone one decodes its codes through
// ragged_decode, the batch its FP8 pages through paged_decode.
void CudaBatchModelTest::expect_batched_logits_equal_alone(
    const ModelWeights& weights,
    const std::vector<std::pair<std::string, int>>& methods_and_lengths, bool fp8_kv_cache,
    double bound) {
  constexpr int kSteps = 12;
  std::vector<Case> cases;
  for (const auto& [methods, tokens] : methods_and_lengths) {
    Case c;
    c.methods = methods;
    c.prompt_tokens = tokens;
    c.attention = testing::small_budgets(methods);
    c.prompt = random_prompt(tokens, weights.config.vocab_size, 17 + cases.size());
    cases.push_back(c);
  }
  {
    cuda::CudaModelOptions alone_options;
    alone_options.layer_major_prefill = true;
    alone_options.decode_room = 64;
    alone_options.fp8_kv_cache = fp8_kv_cache;
    cuda::CudaTransformer alone(weights, alone_options);
    for (Case& c : cases) {
      alone.set_attention(c.attention, true);
      std::vector<float> logits = alone.forward(c.prompt);
      c.alone_logits.push_back(logits);
      for (int i = 0; i < kSteps; ++i) {
        c.continuation.push_back(argmax(logits));
        logits = alone.forward(std::vector<int32_t>{c.continuation.back()});
        c.alone_logits.push_back(logits);
      }
    }
  }
  std::unique_ptr<BatchModel> batch = make_batch_model(weights, options(256, fp8_kv_cache));
  const PrefillWork work(weights.config);
  std::vector<BatchModel::SequenceId> ids;
  for (const Case& c : cases) ids.push_back(batch->open(c.attention, c.prompt, kSteps + 1));

  std::vector<int> fed(cases.size(), -1);
  size_t prefilling = 0;
  double worst = 0.0, worst_prefill = 0.0;
  int decode_rows = 0, largest_batch = 0;
  bool waited_for_slot = false;
  bool started = false;  // ids[prefilling] has begun its prefill
  while (true) {
    BatchModel::StepInput input;
    std::vector<size_t> decoding;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (fed[i] >= 0 && fed[i] < kSteps) {
        input.decode.push_back(ids[i]);
        input.decode_tokens.push_back(cases[i].continuation[static_cast<size_t>(fed[i])]);
        decoding.push_back(i);
      }
    }
    // A latent sequence keeps the prefill cache through its gap: the next prefill waits.
    if (prefilling < cases.size()) {
      if (started || batch->prefill_slot_free()) {
        input.prefill = ids[prefilling];
        // About a layer per step: a prefill spans a few of the others' decode steps.
        input.prefill_budget = work.layer(cases[prefilling].prompt_tokens);
        started = true;
      } else {
        waited_for_slot = true;
      }
    }
    if (input.decode.empty() && input.prefill < 0) break;
    const BatchModel::StepOutput output = batch->step(input);
    const size_t vocab = static_cast<size_t>(weights.config.vocab_size);
    ASSERT_EQ(output.decode_logits.size(), decoding.size() * vocab);
    largest_batch = std::max(largest_batch, static_cast<int>(decoding.size()));
    for (size_t row = 0; row < decoding.size(); ++row) {
      const size_t i = decoding[row];
      ++fed[i];
      const std::vector<float> logits(output.decode_logits.begin() + row * vocab,
                                      output.decode_logits.begin() + (row + 1) * vocab);
      worst = std::max(worst, testing::relative_max_deviation(
                                  logits, cases[i].alone_logits[static_cast<size_t>(fed[i])]));
      ++decode_rows;
    }
    if (output.prefill_done) {
      worst_prefill =
          std::max(worst_prefill, testing::relative_max_deviation(
                                      output.prefill_logits, cases[prefilling].alone_logits[0]));
      fed[prefilling] = 0;
      ++prefilling;
      started = false;
    }
    const KvPoolUsage pool = batch->pool_usage();
    int64_t held = 0;
    for (BatchModel::SequenceId id : ids) held += batch->pages_held(id);
    ASSERT_EQ(pool.pages_used, held);
  }
  std::cout << "largest logit deviation batched vs alone: prefill " << worst_prefill << ", decode "
            << worst << " of the largest logit (" << decode_rows << " decode rows, batches up to "
            << largest_batch << ")\n";
  EXPECT_EQ(decode_rows, kSteps * static_cast<int>(cases.size()));
  EXPECT_GE(largest_batch, 2);
  EXPECT_TRUE(waited_for_slot) << "the latent sequences should have held the prefill slot";
  EXPECT_LT(worst, bound);
  EXPECT_LT(worst_prefill, bound);
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool compresses = cases[i].attention.decode != DecodeMethod::kFull;
    EXPECT_EQ(batch->compressed(ids[i]), compresses) << cases[i].methods;
    EXPECT_EQ(batch->position(ids[i]), cases[i].prompt_tokens + kSteps) << cases[i].methods;
    const BatchModel::PageNeed need =
        batch->pages_needed(cases[i].attention, cases[i].prompt_tokens, kSteps + 1);
    EXPECT_LE(batch->pages_held(ids[i]), need.steady) << cases[i].methods;
    if (compresses) {
      const BatchModel::PageNeed full =
          batch->pages_needed(AttentionConfig{}, cases[i].prompt_tokens, kSteps + 1);
      EXPECT_LT(batch->pages_held(ids[i]), full.steady) << cases[i].methods;
    }
  }
  for (BatchModel::SequenceId id : ids) batch->close(id);
  EXPECT_EQ(batch->pool_usage().pages_used, 0);
}

TEST_F(CudaBatchModelTest, SequencesDecodingTogetherGetTheLogitsEachGetsAlone) {
  ENTROPYINFER_REQUIRE_GPU();
  expect_batched_logits_equal_alone(*weights_,
                                    {{"full", 300},
                                     {"entropy+snapkv", 520},
                                     {"full+latent", 410},
                                     {"critiprefill+streaming", 260},
                                     {"entropy+adakv", 380},
                                     {"entropy+latent", 700}},
                                    false);
}

// FP8 pages hold about twice the rows of bf16 pages in the same bytes (a byte per element and a
// float per row, against two bytes per element).
TEST_F(CudaBatchModelTest, Fp8PagesGetTheLogitsOfTheLoneFp8Cache) {
  ENTROPYINFER_REQUIRE_GPU();
  expect_batched_logits_equal_alone(
      *weights_,
      {{"full", 300}, {"entropy+snapkv", 520}, {"full+latent", 410}, {"entropy+latent", 700}},
      true);
  const int64_t head_dim = weights_->config.head_dim;
  const KvPoolUsage bf16_pool = make_batch_model(*weights_, options(64))->pool_usage();
  const KvPoolUsage fp8_pool = make_batch_model(*weights_, options(64, true))->pool_usage();
  EXPECT_EQ(bf16_pool.page_bytes, 2 * cuda::kPagedRows * head_dim * 2);
  EXPECT_EQ(fp8_pool.page_bytes, 2 * cuda::kPagedRows * (head_dim + 4));
  EXPECT_GT(fp8_pool.pages_total, bf16_pool.pages_total * 3 / 2);
}

// `serve --weights fp8 --kv-cache fp8`: the batch's products run several rows through cuBLASLt's
// FP8 matmul (fast accumulation) where the lone model's single row takes the FP8 GEMV. The sums
// differ in order and precision, and a last-bit difference can move an input or a cached row to
// the next E4M3 code (a step of 6-12%), so the two differ as FP8 differs from bf16: held to the
// bound the FP8 model meets against transformers' bf16 logits (test_cuda_fp8.cpp).
TEST_F(CudaBatchModelTest, Fp8WeightsAndPagesGetTheLogitsOfTheLoneFp8Model) {
  ENTROPYINFER_REQUIRE_GPU();
  ModelWeights fp8_weights = load_model(testing::shipped_model_dir());
  quantize_weights_fp8(fp8_weights);
  expect_batched_logits_equal_alone(
      fp8_weights, {{"full", 300}, {"entropy+latent", 700}, {"entropy+snapkv", 520}}, true,
      kFp8ProductLogitBound);
}

TEST_F(CudaBatchModelTest, RefusesWhatDoesNotFit) {
  ENTROPYINFER_REQUIRE_GPU();
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options(1));
  const AttentionConfig full;
  const BatchModel::SequenceId big = batch->open(full, random_prompt(4000, 100, 1), 4);
  EXPECT_GT(batch->pages_needed(full, 4000, 4).steady, batch->pool_usage().pages_total);
  BatchModel::StepInput prefill;
  prefill.prefill = big;
  prefill.prefill_budget = std::numeric_limits<double>::infinity();
  try {
    batch->step(prefill);
    ADD_FAILURE() << "a prompt larger than the pool was stored";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the KV pool has no room"), std::string::npos)
        << error.what();
  }
  batch->close(big);
  EXPECT_EQ(batch->pool_usage().pages_used, 0);
  EXPECT_TRUE(batch->prefill_slot_free());
  AttentionConfig per_query_head = testing::small_budgets("full+snapkv");
  per_query_head.decode_params.per_query_head = true;
  try {
    batch->open(per_query_head, {1, 2, 3}, 4);
    ADD_FAILURE() << "per_query_head was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("per_query_head"), std::string::npos);
  }
}

TEST_F(CudaBatchModelTest, SchedulerAnswersConcurrentRequestsAndReturnsEveryPage) {
  ENTROPYINFER_REQUIRE_GPU();
  const std::unique_ptr<Tokenizer> tokenizer =
      load_tokenizer(testing::shipped_model_dir() + "/tokenizer.json");
  serve::Scheduler scheduler(make_batch_model(*weights_, options(256)), *tokenizer, {});
  std::vector<std::shared_ptr<serve::RequestStream>> streams;
  const std::vector<std::string> methods = {"full",          "entropy+snapkv", "full+latent",
                                            "entropy+adakv", "entropy+latent", "full+streaming"};
  for (size_t i = 0; i < methods.size(); ++i) {
    serve::SequenceRequest request;
    std::string text;
    for (size_t line = 0; line < 10 + 6 * i; ++line)
      text += "Line " + std::to_string(line) + ": the keeper counted ships before dawn. ";
    request.prompt = tokenizer->encode(text, {.add_bos = true});
    request.generation.max_tokens = 16;
    request.attention = testing::small_budgets(methods[i]);
    streams.push_back(scheduler.submit(request));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    SCOPED_TRACE(methods[i]);
    serve::StreamEvent event;
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    bool finished = false;
    while (!finished && std::chrono::steady_clock::now() < deadline) {
      if (!streams[i]->next(event, std::chrono::milliseconds(100))) continue;
      if (event.kind == serve::StreamEvent::Kind::kText) text += event.text;
      finished = event.kind == serve::StreamEvent::Kind::kFinished;
    }
    ASSERT_TRUE(finished);
    EXPECT_EQ(event.error, "");
    EXPECT_GT(event.stats.completion_tokens, 0);
    EXPECT_LE(event.stats.completion_tokens, 16);
    EXPECT_FALSE(text.empty());
    EXPECT_EQ(event.stats.compressed,
              methods[i].find('+') != std::string::npos && event.stats.completion_tokens >= 4);
  }
  scheduler.wait_idle();
  EXPECT_EQ(scheduler.snapshot().pool.pages_used, 0);
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

// A served prompt runs in slices below a layer (product chunks, attention query ranges), as many
// per step as the budget allows: with no budget every slice is its own step, so a layer takes at
// least three steps; and the logits are the same whatever the budget, since the slices are.
TEST_F(CudaBatchModelTest, PrefillSlicesBelowALayerGiveTheSameLogitsForAnyBudget) {
  ENTROPYINFER_REQUIRE_GPU();
  std::unique_ptr<BatchModel> batch = make_batch_model(*weights_, options(256));
  const int layers = batch->num_layers();
  for (const char* methods : {"full", "entropy+snapkv"}) {
    SCOPED_TRACE(methods);
    const AttentionConfig attention = testing::small_budgets(methods);
    const std::vector<int32_t> prompt = random_prompt(3000, weights_->config.vocab_size, 23);
    std::vector<float> whole;
    for (const double budget : {std::numeric_limits<double>::infinity(), 0.0}) {
      const BatchModel::SequenceId id = batch->open(attention, prompt, 2);
      BatchModel::StepInput input;
      input.prefill = id;
      input.prefill_budget = budget;
      BatchModel::StepOutput output;
      int steps = 0;
      do {
        output = batch->step(input);
        ++steps;
      } while (!output.prefill_done && steps < 100000);
      if (std::isinf(budget)) {
        EXPECT_EQ(steps, 1);
        whole = output.prefill_logits;
      } else {
        EXPECT_GE(steps, 3 * layers) << "slices below a layer";
        const double deviation = testing::relative_max_deviation(output.prefill_logits, whole);
        std::cout << methods << ": " << steps << " steps, deviation from one step " << deviation
                  << "\n";
        EXPECT_EQ(deviation, 0.0);
      }
      batch->close(id);
    }
  }
  EXPECT_EQ(batch->pool_usage().pages_used, 0);
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

// The largest |a - b| over the largest |b|.
double relative_deviation(std::span<const float> a, std::span<const float> b) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return worst / std::max(scale, 1e-30);
}

BatchModel::StepOutput prefill_alone(BatchModel& batch, BatchModel::SequenceId id) {
  BatchModel::StepInput input;
  input.prefill = id;
  input.prefill_budget = std::numeric_limits<double>::infinity();
  BatchModel::StepOutput output = batch.step(input);
  EXPECT_TRUE(output.prefill_done);
  return output;
}

// Prompt scores (echo with logprobs) on the GPU, bf16 products with the output head over
// kScoredPromptRows rows at a time, against the CPU executor's fp32 rows: every prompt row within
// the bf16 parity bound of the largest logit, and each score within twice that (a logprob moves by
// at most twice the largest logit difference). Prompts of several slices of rows and of one token,
// under a dense and a sparse prefill.
TEST_F(CudaBatchModelTest, PromptLogprobsMatchTheCpuExecutorsRows) {
  ENTROPYINFER_REQUIRE_GPU();
  constexpr double kRowBound = 5e-2;
  constexpr int kTop = 5;
  const ModelWeights& weights = *weights_;
  const int vocab = weights.config.vocab_size;
  BatchModelOptions cpu_options;
  cpu_options.pool_bytes = int64_t{256} << 20;
  std::unique_ptr<BatchModel> cpu_batch = make_cpu_batch_model(weights, cpu_options);
  std::unique_ptr<BatchModel> gpu_batch = make_batch_model(weights, options(256));
  cuda::CudaModelOptions alone_options;
  alone_options.layer_major_prefill = true;
  alone_options.decode_room = 16;
  cuda::CudaTransformer alone(weights, alone_options);
  double worst_rows = 0.0, worst_scores = 0.0;
  for (const auto& [methods, tokens] : std::vector<std::pair<std::string, int>>{
           {"full", 300}, {"entropy+snapkv", 700}, {"full", 1}}) {
    SCOPED_TRACE(methods + ", " + std::to_string(tokens) + " tokens");
    const AttentionConfig attention = testing::small_budgets(methods);
    const std::vector<int32_t> prompt = random_prompt(tokens, vocab, 31);
    Transformer cpu(weights, 0, attention);
    const std::vector<float> cpu_rows = cpu.forward(prompt, /*all_logits=*/true);

    alone.set_attention(attention, true);
    alone.begin_prompt(prompt, /*every_row=*/true);
    while (!alone.prompt_layers_done()) {
      alone.run_prompt_work(std::numeric_limits<double>::infinity());
    }
    int64_t next_row = 0;
    double rows_deviation = 0.0;
    const std::vector<float> last =
        alone.finish_prompt([&](int64_t first_row, std::span<const float> rows) {
          EXPECT_EQ(first_row, next_row) << "rows out of order";
          const size_t count = rows.size() / static_cast<size_t>(vocab);
          EXPECT_LE(count, static_cast<size_t>(cuda::CudaTransformer::kScoredPromptRows));
          rows_deviation = std::max(
              rows_deviation,
              relative_deviation(rows, std::span<const float>(cpu_rows).subspan(
                                           static_cast<size_t>(first_row * vocab), rows.size())));
          next_row = first_row + static_cast<int64_t>(count);
        });
    EXPECT_EQ(next_row, tokens) << "every prompt row, once";
    EXPECT_LE(rows_deviation, kRowBound);
    EXPECT_LE(relative_deviation(last, std::span<const float>(cpu_rows).last(vocab)), kRowBound);
    worst_rows = std::max(worst_rows, rows_deviation);
    alone.reset();

    const BatchModel::SequenceId cpu_id = cpu_batch->open(attention, prompt, 1);
    const BatchModel::SequenceId gpu_id = gpu_batch->open(attention, prompt, 1);
    cpu_batch->ask_prompt_logprobs(cpu_id, kTop, 0);
    gpu_batch->ask_prompt_logprobs(gpu_id, kTop, 0);
    const BatchModel::StepOutput want = prefill_alone(*cpu_batch, cpu_id);
    const BatchModel::StepOutput got = prefill_alone(*gpu_batch, gpu_id);
    testing::expect_error_naming([&] { gpu_batch->ask_prompt_logprobs(gpu_id, kTop, 0); },
                                 {"has begun its prefill"}, "asked after the prefill");
    cpu_batch->close(cpu_id);
    gpu_batch->close(gpu_id);
    ASSERT_EQ(want.prompt_logprobs.size(), prompt.size() - 1);
    ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
    double scale = 0.0;
    for (float logit : cpu_rows) scale = std::max(scale, std::fabs(double(logit)));
    double scores_deviation = 0.0;
    for (size_t i = 0; i < got.prompt_logprobs.size(); ++i) {
      const TokenLogprob& g = got.prompt_logprobs[i];
      const TokenLogprob& c = want.prompt_logprobs[i];
      ASSERT_EQ(g.token, prompt[i + 1]);
      ASSERT_EQ(g.top.size(), static_cast<size_t>(kTop));
      scores_deviation = std::max(scores_deviation, std::fabs(double(g.logprob) - c.logprob));
      // Values in rank order: near-ties may swap ids between bf16 and fp32.
      for (int k = 0; k < kTop; ++k) {
        scores_deviation =
            std::max(scores_deviation, std::fabs(double(g.top[k].logprob) - c.top[k].logprob));
      }
    }
    EXPECT_LE(scores_deviation, 2 * kRowBound * scale);
    worst_scores = std::max(worst_scores, scores_deviation / std::max(scale, 1e-30));
  }
  EXPECT_EQ(gpu_batch->pool_usage().pages_used, 0);
  std::cout << "prompt logprobs on the GPU: rows within " << worst_rows
            << " of the CPU's largest logit (bound " << kRowBound << "), scores within "
            << worst_scores << " of it (bound " << 2 * kRowBound << ")\n";
}

}  // namespace
}  // namespace entropyinfer

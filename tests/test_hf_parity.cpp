// Parity with Hugging Face transformers: every folder under tests/fixtures/parity/ is a tiny
// random-weight checkpoint that transformers saved, with the logits and greedy continuations
// transformers computed for fixed prompts (scripts/make_parity_fixtures.py;
// tests/fixtures/parity/README.md describes the files). The engine loads each folder like any
// downloaded model and must reproduce those numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/token_logprobs.h"
#include "engine/transformer.h"
#include "model/model_weights.h"
#include "parity_fixture_support.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

// fp32 checkpoints computed in fp32 by both sides: only summation order differs.
constexpr double kFp32RelativeTolerance = 1e-4;

using parity::compare_rows;
using parity::context_needed;
using parity::describe;
using parity::Deviation;
using parity::first_argmax;
using parity::load_fixture;
using parity::parity_case_names;
using parity::parity_root;
using parity::ParityFixture;

// The file's fp32 values, expecting `expected_count` of them.
std::vector<float> read_f32(const std::string& path, size_t expected_count) {
  const std::string raw = testing::read_file_bytes(path);
  EXPECT_EQ(raw.size(), expected_count * sizeof(float)) << path;
  return parity::floats_from_bytes(raw);
}

// The engine sized for the fixture's longest prompt plus its continuation. llama_dynamic runs past
// max_position_embeddings on purpose: transformers' dynamic NTK only changes anything beyond it.
std::unique_ptr<Transformer> make_transformer(const ModelWeights& weights,
                                              const ParityFixture& fixture) {
  const int needed = context_needed(fixture);
  try {
    return std::make_unique<Transformer>(weights, needed);
  } catch (const Error& error) {
    ADD_FAILURE() << fixture.expected.at("case").get<std::string>() << " needs " << needed
                  << " positions (max_position_embeddings "
                  << weights.config.max_position_embeddings << "), refused: " << error.what();
    return nullptr;
  }
}

// The fixtures this suite is meant to cover; a missing one is a failure, not a silent skip.
TEST(HfParityFixtures, EveryFamilyAndVariantIsPresent) {
  const std::vector<std::string> names = parity_case_names();
  const std::set<std::string> present(names.begin(), names.end());
  for (const char* required :
       {"llama", "llama3_scaling", "llama_linear", "llama_dynamic", "llama_yarn", "qwen2", "qwen3",
        "mistral", "pangu", "llama_bf16", "qwen2_bf16", "sharded", "tiny_chat_llama"}) {
    EXPECT_TRUE(present.count(required)) << "missing fixture " << parity_root() << "/" << required;
  }
}

class HfParity : public ::testing::TestWithParam<std::string> {};

TEST_P(HfParity, ConfigIsReadAsTransformersWroteIt) {
  const ParityFixture fixture = load_fixture(GetParam());
  const ModelWeights weights = load_hf_model(fixture.folder);
  EXPECT_EQ(weights.config.architecture, fixture.expected.at("architecture").get<std::string>());
  EXPECT_EQ(weights.config.vocab_size, fixture.vocab);
  EXPECT_EQ(weights.config.tied_embeddings, fixture.expected.at("tied_embeddings").get<bool>());
  const std::string rope_type = fixture.expected.at("rope").at("rope_type").get<std::string>();
  const RopeScaling expected_scaling = rope_type == "linear"    ? RopeScaling::kLinear
                                       : rope_type == "dynamic" ? RopeScaling::kDynamic
                                       : rope_type == "llama3"  ? RopeScaling::kLlama3
                                       : rope_type == "yarn"    ? RopeScaling::kYarn
                                                                : RopeScaling::kDefault;
  EXPECT_EQ(weights.config.rope.scaling, expected_scaling) << "rope_type " << rope_type;
  EXPECT_DOUBLE_EQ(weights.config.rope.theta,
                   fixture.expected.at("rope").at("rope_theta").get<double>());
}

TEST_P(HfParity, LogitsMatchTransformersAtEveryPromptPosition) {
  const ParityFixture fixture = load_fixture(GetParam());
  const ModelWeights weights = load_hf_model(fixture.folder);
  ASSERT_EQ(weights.config.vocab_size, fixture.vocab);

  const size_t count = static_cast<size_t>(fixture.rows) * fixture.vocab;
  const std::vector<float> reference =
      read_f32(fixture.folder + "/" + fixture.expected.at("logits_file").get<std::string>(), count);
  ASSERT_EQ(reference.size(), count);

  // bf16 checkpoints: transformers computed in bf16, the engine in fp32 from the same bf16 weights.
  // The fixture records the spread between transformers' own bf16 and fp32 runs; the engine may
  // differ from the bf16 logits by twice that plus 1e-3, and from the fp32 run of the same weights
  // by 1e-4.
  const bool is_bf16 = fixture.expected.at("dtype").get<std::string>() == "bfloat16";
  double tolerance = kFp32RelativeTolerance;
  std::vector<float> fp32_reference;
  if (is_bf16) {
    tolerance = fixture.expected.at("bf16_engine_relative_bound").get<double>();
    const double spread = fixture.expected.at("bf16_vs_fp32_relative_spread").get<double>();
    EXPECT_GT(spread, 0.0) << "a bf16 run identical to fp32 means the reference was not bf16";
    EXPECT_LT(tolerance, 0.1) << "bound too loose to mean anything";
    fp32_reference = read_f32(
        fixture.folder + "/" + fixture.expected.at("fp32_logits_file").get<std::string>(), count);
    ASSERT_EQ(fp32_reference.size(), count);
  }

  const std::unique_ptr<Transformer> engine = make_transformer(weights, fixture);
  if (!engine) return;
  Transformer& transformer = *engine;
  size_t offset = 0;
  for (size_t p = 0; p < fixture.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = fixture.prompts[p];
    const int rows = static_cast<int>(prompt.size());
    transformer.reset();
    const std::vector<float> logits = transformer.forward(prompt, /*all_logits=*/true);
    ASSERT_EQ(logits.size(), static_cast<size_t>(rows) * fixture.vocab) << "prompt " << p;
    ASSERT_LE(offset + logits.size(), count);
    const Deviation deviation =
        compare_rows(logits.data(), reference.data() + offset, rows, fixture.vocab);
    EXPECT_LE(deviation.relative, tolerance)
        << GetParam() << " prompt " << p << " (" << rows << " tokens): " << describe(deviation);
    if (is_bf16) {
      const Deviation fp32_deviation =
          compare_rows(logits.data(), fp32_reference.data() + offset, rows, fixture.vocab);
      EXPECT_LE(fp32_deviation.relative, kFp32RelativeTolerance)
          << GetParam() << " prompt " << p
          << " against the fp32 run of the bf16 weights: " << describe(fp32_deviation);
    }
    offset += logits.size();
  }
  EXPECT_EQ(offset, count) << "prompts do not cover logits_shape";
}

TEST_P(HfParity, GreedyContinuationMatchesTransformers) {
  const ParityFixture fixture = load_fixture(GetParam());
  const ModelWeights weights = load_hf_model(fixture.folder);
  // For bf16 fixtures the engine's fp32 arithmetic is held to transformers' fp32 run of the same
  // bf16 weights: bf16 arithmetic rounds differently enough to change an argmax now and then.
  const char* key = fixture.expected.contains("greedy_continuations_fp32")
                        ? "greedy_continuations_fp32"
                        : "greedy_continuations";
  const auto& continuations = fixture.expected.at(key);
  ASSERT_EQ(continuations.size(), fixture.prompts.size());

  const std::unique_ptr<Transformer> engine = make_transformer(weights, fixture);
  if (!engine) return;
  Transformer& transformer = *engine;
  for (size_t p = 0; p < fixture.prompts.size(); ++p) {
    const std::vector<int32_t> expected = continuations[p].get<std::vector<int32_t>>();
    ASSERT_FALSE(expected.empty());
    transformer.reset();
    std::vector<float> logits = transformer.forward(fixture.prompts[p]);
    ASSERT_EQ(logits.size(), static_cast<size_t>(fixture.vocab));
    std::vector<int32_t> generated;
    for (size_t step = 0; step < expected.size(); ++step) {
      const int32_t token = first_argmax(logits.data(), fixture.vocab);
      generated.push_back(token);
      if (token != expected[step]) break;  // the rest would only repeat the divergence
      if (step + 1 < expected.size()) logits = transformer.forward(std::vector<int32_t>{token});
    }
    EXPECT_EQ(generated,
              std::vector<int32_t>(expected.begin(), expected.begin() + generated.size()))
        << GetParam() << " prompt " << p << ": greedy path diverges at step "
        << generated.size() - 1 << " of " << expected.size();
    EXPECT_EQ(generated.size(), expected.size()) << GetParam() << " prompt " << p;
  }
}

// The prompt scores of echo with logprobs (BatchModel::ask_prompt_logprobs) against
// log_softmax of transformers' logits, in double: token i is scored by row i - 1. A logprob
// differs from the reference by at most twice the largest logit difference (the logit's own and
// the log-normaliser's), so the bound is twice the logits' tolerance. bf16 fixtures are held to
// transformers' fp32 run of the same weights, as the logits are.
TEST_P(HfParity, PromptLogprobsAreTransformersLogSoftmaxAtEveryPosition) {
  constexpr int kTop = 5;
  const ParityFixture fixture = load_fixture(GetParam());
  const ModelWeights weights = load_hf_model(fixture.folder);
  const bool is_bf16 = fixture.expected.at("dtype").get<std::string>() == "bfloat16";
  const size_t count = static_cast<size_t>(fixture.rows) * fixture.vocab;
  const std::vector<float> reference = read_f32(
      fixture.folder + "/" +
          fixture.expected.at(is_bf16 ? "fp32_logits_file" : "logits_file").get<std::string>(),
      count);
  ASSERT_EQ(reference.size(), count);
  BatchModelOptions options;
  options.context_length = context_needed(fixture);
  std::unique_ptr<BatchModel> batch;
  try {
    batch = make_cpu_batch_model(weights, options);
  } catch (const Error& error) {
    FAIL() << GetParam() << ": " << error.what();
  }
  size_t offset = 0;
  double worst_relative = 0.0, worst_absolute = 0.0;
  for (size_t p = 0; p < fixture.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = fixture.prompts[p];
    const float* rows = reference.data() + offset;
    offset += prompt.size() * static_cast<size_t>(fixture.vocab);
    ASSERT_LE(offset, count);
    const BatchModel::SequenceId id = batch->open(AttentionConfig{}, prompt, 0);
    batch->ask_prompt_logprobs(id, kTop, 0);
    BatchModel::StepInput input;
    input.prefill = id;
    input.prefill_budget = std::numeric_limits<double>::infinity();
    const BatchModel::StepOutput output = batch->step(input);
    batch->close(id);
    ASSERT_TRUE(output.prefill_done);
    ASSERT_EQ(output.prompt_logprobs.size(), prompt.size() - 1);
    double scale = 0.0, worst = 0.0;
    size_t worst_position = 0;
    for (size_t i = 1; i < prompt.size(); ++i) {
      const float* row = rows + (i - 1) * fixture.vocab;
      double max_logit = -INFINITY;
      for (int v = 0; v < fixture.vocab; ++v) {
        max_logit = std::max(max_logit, double(row[v]));
        scale = std::max(scale, std::fabs(double(row[v])));
      }
      double sum = 0.0;
      for (int v = 0; v < fixture.vocab; ++v) sum += std::exp(double(row[v]) - max_logit);
      const double log_normaliser = max_logit + std::log(sum);
      std::vector<double> expected_top;
      for (int v = 0; v < fixture.vocab; ++v) expected_top.push_back(row[v] - log_normaliser);
      std::sort(expected_top.begin(), expected_top.end(), std::greater<>());
      const TokenLogprob& got = output.prompt_logprobs[i - 1];
      ASSERT_EQ(got.token, prompt[i]);
      double deviation = std::fabs(got.logprob - (row[prompt[i]] - log_normaliser));
      // Values, not ids: ties among the alternatives may order either way.
      ASSERT_EQ(got.top.size(), static_cast<size_t>(kTop));
      for (int k = 0; k < kTop; ++k) {
        deviation = std::max(deviation, std::fabs(got.top[k].logprob - expected_top[k]));
      }
      if (deviation > worst) {
        worst = deviation;
        worst_position = i;
      }
    }
    const double bound = 2.0 * kFp32RelativeTolerance * scale;
    EXPECT_LE(worst, bound) << GetParam() << " prompt " << p << ": logprob deviation " << worst
                            << " at position " << worst_position << ", bound " << bound;
    worst_relative = std::max(worst_relative, worst / scale);
    worst_absolute = std::max(worst_absolute, worst);
  }
  EXPECT_EQ(offset, count) << "prompts do not cover logits_shape";
  std::cout << "[ parity  ] " << GetParam() << ": prompt logprobs max|diff| " << worst_absolute
            << ", " << worst_relative << " of max|logit| (bound " << 2.0 * kFp32RelativeTolerance
            << ")\n";
}

std::string case_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

INSTANTIATE_TEST_SUITE_P(Fixtures, HfParity, ::testing::ValuesIn(parity_case_names()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HfParity);

// The demo model's tokenizer.json against what transformers' tokenizer gave for the same strings.
TEST(HfParityTokenizer, TinyChatLlamaEncodesLikeTransformers) {
  const ParityFixture fixture = load_fixture("tiny_chat_llama");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(fixture.folder);
  ASSERT_TRUE(tokenizer);
  const auto& cases = fixture.expected.at("tokenizer_cases");
  ASSERT_GE(cases.size(), 5u);
  for (const auto& item : cases) {
    const std::string text = item.at("text").get<std::string>();
    const auto ids = item.at("ids").get<std::vector<int32_t>>();
    const auto ids_with_bos = item.at("ids_with_bos").get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->encode(text, {.add_bos = false, .parse_special = true}), ids)
        << "text: " << text;
    EXPECT_EQ(tokenizer->encode(text, {.add_bos = true, .parse_special = true}), ids_with_bos)
        << "text with the beginning-of-text token: " << text;
    EXPECT_EQ(tokenizer->decode(ids), item.at("decoded").get<std::string>()) << "text: " << text;
  }
  for (const auto& chat : fixture.expected.at("chat_cases")) {
    const std::string text = chat.at("text").get<std::string>();
    EXPECT_EQ(tokenizer->encode(text, {.add_bos = false, .parse_special = true}),
              chat.at("ids").get<std::vector<int32_t>>())
        << "rendered chat: " << text;
  }
  const int expected_vocab = fixture.expected.at("tokenizer_vocab_size").get<int>();
  EXPECT_EQ(tokenizer->vocab_size(), expected_vocab);
  const std::optional<int32_t> bos = tokenizer->token_id("<|begin_of_text|>");
  ASSERT_TRUE(bos.has_value());
  EXPECT_EQ(tokenizer->bos_id(), bos);
  const std::vector<int32_t> eos = tokenizer->eos_ids();
  const std::optional<int32_t> eot = tokenizer->token_id("<|eot_id|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_NE(std::find(eos.begin(), eos.end(), *eot), eos.end()) << "<|eot_id|> is not an end token";
}

}  // namespace
}  // namespace entropyinfer

// The real stories260K model against llama2.c's own outputs: logits at the first positions, the
// greedy token path, and (with the llama2.c tokenizer) the exact texts run.c printed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/generation.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "expect_error.h"
#include "model/model_weights.h"
#include "test_support.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

using testing::asset_path;

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream stream(path);
  std::vector<int32_t> ids;
  int32_t id;
  while (stream >> id) ids.push_back(id);
  return ids;
}

TEST(Stories260K, LogitsMatchLlama2cAtFirstEightPositions) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  ENTROPYINFER_REQUIRE_ASSET("stories260K/greedy_logits_pos0-7.f32");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  ASSERT_EQ(weights.config.vocab_size, 512);
  const std::vector<int32_t> ids = read_ids(asset_path("stories260K/greedy_token_ids_n256.txt"));
  ASSERT_GE(ids.size(), 8u);
  const std::string raw =
      testing::read_file_bytes(asset_path("stories260K/greedy_logits_pos0-7.f32"));
  ASSERT_EQ(raw.size(), 8u * 512u * sizeof(float));
  std::vector<float> expected(8 * 512);
  std::memcpy(expected.data(), raw.data(), raw.size());

  // Once as one prefill of eight tokens, once token by token through the cache: both must agree
  // with llama2.c, which always runs one token at a time.
  Transformer batch(weights);
  const std::vector<float> all = batch.forward(std::span(ids.data(), 8), /*all_logits=*/true);
  Transformer stepwise(weights);
  for (int position = 0; position < 8; ++position) {
    const std::vector<float> step = stepwise.forward(std::span(ids.data() + position, 1));
    for (int v = 0; v < 512; ++v) {
      ASSERT_NEAR(all[position * 512 + v], expected[position * 512 + v], 1e-4)
          << "prefill position " << position << " token " << v;
      ASSERT_NEAR(step[v], expected[position * 512 + v], 1e-4)
          << "stepwise position " << position << " token " << v;
    }
  }
}

TEST(Stories260K, GreedyTokenPathMatchesLlama2c) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  const std::vector<int32_t> expected =
      read_ids(asset_path("stories260K/greedy_token_ids_n256.txt"));
  ASSERT_EQ(expected.size(), 257u);
  Transformer model(weights);
  std::vector<int32_t> path = {expected[0]};
  while (path.size() < expected.size()) {
    std::vector<float> logits = model.forward(std::span(&path.back(), 1));
    path.push_back(argmax(logits));
  }
  EXPECT_EQ(path, expected);
}

// Runs llama2.c's generation from an empty prompt (BOS only) for `steps` positions, as run.c does,
// and returns what run.c prints (the text plus its final newline).
std::string llama2c_run(int steps, float temperature, float top_p, uint64_t seed) {
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(asset_path("stories260K/tok512.bin"));
  Transformer model(weights);
  GenerationOptions options;
  options.max_tokens = steps;
  options.sampler.temperature = temperature;
  options.sampler.top_p = top_p;
  options.sampler.seed = seed;
  options.sampler.mode = SamplerMode::kLlama2c;
  options.stop_token_ids = weights.config.eos_token_ids;
  const std::vector<int32_t> prompt = {1};
  return generate(model, *tokenizer, prompt, options).text + "\n";
}

TEST(Stories260K, GreedyTextMatchesLlama2cFor200And256Steps) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  EXPECT_EQ(llama2c_run(200, 0.0f, 0.9f, 0),
            testing::read_file_bytes(asset_path("stories260K/expected_greedy_n200.txt")));
  EXPECT_EQ(llama2c_run(256, 0.0f, 0.9f, 0),
            testing::read_file_bytes(asset_path("stories260K/expected_greedy_n256.txt")));
}

TEST(Stories260K, SeededTopPSampleMatchesLlama2c) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  EXPECT_EQ(llama2c_run(256, 1.0f, 0.9f, 133742),
            testing::read_file_bytes(asset_path("stories260K/expected_t1.0_p0.9_s133742.txt")));
}

TEST(Stories260K, ContinuationKeepsTheSpaceBeforeItsFirstWord) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(asset_path("stories260K/tok512.bin"));
  EncodeOptions encode;
  encode.add_bos = true;
  const std::vector<int32_t> prompt = tokenizer->encode("Once upon a time there", encode);
  Transformer model(weights);
  GenerationOptions options;
  options.max_tokens = 8;
  const std::string text = generate(model, *tokenizer, prompt, options).text;
  // The SentencePiece-style leading space is dropped only at the start of a sequence, and a
  // continuation is not one: printed after the prompt, it must read as separate words.
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text[0], ' ') << "'" << text << "'";
}

TEST(Stories260K, PromptLongerThanContextIsAnError) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  Transformer model(weights);
  std::vector<int32_t> too_long(513, 1);
  testing::expect_error_naming([&] { model.forward(too_long); }, {"513"},
                               "a 513-token prompt in a 512-token context");
  EXPECT_EQ(model.position(), 0);
}

TEST(Stories260K, TruncatedCheckpointIsAnError) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const std::string full = testing::read_file_bytes(asset_path("stories260K/stories260K.bin"));
  const std::string path =
      ::testing::TempDir() + "/truncated_stories." + std::to_string(getpid()) + ".bin";
  std::ofstream(path, std::ios::binary)
      .write(full.data(), static_cast<std::streamsize>(full.size() / 2));
  testing::expect_error_naming([&] { load_model(path); }, {"truncated"}, "a half checkpoint");
}

// stories260K with one weight replaced: the checkpoint's bytes stay alive beside the views into
// them.
struct EditedCheckpoint {
  std::string bytes;
  ModelWeights weights;
};

EditedCheckpoint stories_with_nan_in_embedding_row(int32_t token) {
  EditedCheckpoint edited;
  edited.bytes = testing::read_file_bytes(asset_path("stories260K/stories260K.bin"));
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  constexpr size_t kDim = 64;
  const float nan = std::nanf("");
  std::memcpy(edited.bytes.data() + kHeaderBytes + token * kDim * sizeof(float), &nan, sizeof nan);
  edited.weights = parse_llama2c_checkpoint(reinterpret_cast<const uint8_t*>(edited.bytes.data()),
                                            edited.bytes.size(), "stories260K with a NaN");
  return edited;
}

TEST(Stories260K, NanWeightIsAClearErrorWithEverySampler) {
  // The classifier is tied to the embedding, so a NaN in row 400 makes token 400's logit NaN.
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const EditedCheckpoint model_with_nan = stories_with_nan_in_embedding_row(400);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(asset_path("stories260K/tok512.bin"));
  EncodeOptions encode;
  encode.add_bos = true;
  const std::vector<int32_t> prompt = tokenizer->encode("Once upon a time", encode);
  ASSERT_EQ(std::count(prompt.begin(), prompt.end(), 400), 0);
  struct Case {
    const char* name;
    SamplerOptions sampler;
  };
  const Case cases[] = {
      {"greedy", {}},
      {"top-p", {.temperature = 1.0f, .top_p = 0.9f, .seed = 7}},
      {"top-k", {.temperature = 0.8f, .top_k = 40, .seed = 7}},
      {"llama2.c top-p",
       {.temperature = 1.0f, .top_p = 0.9f, .seed = 7, .mode = SamplerMode::kLlama2c}},
      {"llama2.c", {.temperature = 1.0f, .seed = 7, .mode = SamplerMode::kLlama2c}},
  };
  for (const Case& each : cases) {
    Transformer model(model_with_nan.weights);
    GenerationOptions options;
    options.max_tokens = 8;
    options.sampler = each.sampler;
    testing::expect_error_naming([&] { generate(model, *tokenizer, prompt, options); },
                                 {"NaN logit for token id 400", "at generated token 1"}, each.name);
  }
}

TEST(Stories260K, GreedyGenerationAppliesThePenalties) {
  // Greedy decoding with a penalty cannot take the executor's argmax: it must pick what a sampler
  // with the penalty picks from the logits, step by step, and differ from plain greedy.
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(asset_path("stories260K/tok512.bin"));
  const std::vector<int32_t> prompt = {1};
  GenerationOptions options;
  options.max_tokens = 48;
  options.sampler.frequency_penalty = 1.0f;
  Transformer model(weights);
  const GenerationResult penalized = generate(model, *tokenizer, prompt, options);

  Transformer reference_model(weights);
  Sampler reference(options.sampler);
  std::vector<int32_t> expected;
  std::vector<float> logits = reference_model.forward(prompt);
  for (int step = 0; step < options.max_tokens; ++step) {
    expected.push_back(reference.sample(logits));
    logits = reference_model.forward(std::span<const int32_t>(&expected.back(), 1));
  }
  EXPECT_EQ(penalized.tokens, expected);

  options.sampler.frequency_penalty = 0.0f;
  Transformer plain_model(weights);
  const GenerationResult plain = generate(plain_model, *tokenizer, prompt, options);
  EXPECT_NE(plain.tokens, penalized.tokens);
}

TEST(Stories260K, IdsBeyondTheTokenizersVocabularyAreNeverSampled) {
  // A tokenizer of 300 tokens for a model of 512: the other 212 rows have no text.
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const ModelWeights weights = load_model(asset_path("stories260K/stories260K.bin"));
  const std::unique_ptr<Tokenizer> small_tokenizer = parse_llama2c_tokenizer(
      testing::read_file_bytes(asset_path("stories260K/tok512.bin")), 300, "tok300");
  ASSERT_EQ(small_tokenizer->vocab_size(), 300);
  Transformer model(weights);
  GenerationOptions options;
  options.max_tokens = 64;
  options.sampler = {.temperature = 1.5f, .seed = 11};
  const std::vector<int32_t> prompt = {1};
  const GenerationResult result = generate(model, *small_tokenizer, prompt, options);
  ASSERT_FALSE(result.tokens.empty());
  for (int32_t id : result.tokens) EXPECT_LT(id, 300);
  // The unrestricted model does sample ids past 300 with this seed, so the restriction is real.
  Transformer unrestricted(weights);
  const std::unique_ptr<Tokenizer> full_tokenizer =
      load_tokenizer(asset_path("stories260K/tok512.bin"));
  const GenerationResult full = generate(unrestricted, *full_tokenizer, prompt, options);
  EXPECT_TRUE(
      std::any_of(full.tokens.begin(), full.tokens.end(), [](int32_t id) { return id >= 300; }));
}

}  // namespace
}  // namespace entropyinfer

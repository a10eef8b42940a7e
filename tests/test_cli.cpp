// The command-line tool end to end: real output on stories260K, and one clear error (exit status 1,
// no crash) for each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "shipped_model_support.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::CommandResult;
using testing::expect_error;
using testing::run_cli;
using testing::test_temp_path;

std::string stories_model() { return testing::asset_path("stories260K/stories260K.bin"); }
std::string stories_tokenizer() { return testing::asset_path("stories260K/tok512.bin"); }

TEST(Cli, GeneratesLlama2cGreedyTextExactly) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const CommandResult result =
      run_cli("generate -m " + stories_model() + " --tokenizer " + stories_tokenizer() +
              " -p '' -n 200 --sampler llama2c -t 0");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out,
            testing::read_file_bytes(testing::asset_path("stories260K/expected_greedy_n200.txt")));
  EXPECT_NE(result.err.find("prefill"), std::string::npos)
      << "timing summary missing: " << result.err;
  EXPECT_NE(result.err.find("decode"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("peak memory"), std::string::npos) << result.err;
}

TEST(Cli, MissingModelFolderIsOneClearError) {
  expect_error(run_cli("generate -m /nonexistent/model -p hi"), "/nonexistent/model");
}

TEST(Cli, NonsenseSamplerOptionsAreErrors) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  expect_error(run_cli("generate -m " + stories_model() + " -p hi -t -1"), "temperature");
  expect_error(run_cli("generate -m " + stories_model() + " -p hi --top-p 2"), "top-p");
  const CommandResult unknown =
      run_cli("generate -m " + stories_model() + " -p hi --sampler bogus");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.exit_code, -1);
}

TEST(Cli, PromptLongerThanContextIsAnError) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const std::string prompt_path = test_temp_path("long_prompt.txt");
  std::ofstream prompt(prompt_path);
  for (int i = 0; i < 400; ++i) prompt << "Once upon a time there was a girl. ";
  prompt.close();
  expect_error(run_cli("generate -m " + stories_model() + " --tokenizer " + stories_tokenizer() +
                       " -f " + prompt_path),
               "context");
}

TEST(Cli, MissingPromptFileAndMissingTokenizerAreErrors) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  expect_error(run_cli("generate -m " + stories_model() + " -f /nonexistent/prompt.txt"),
               "/nonexistent/prompt.txt");
  expect_error(run_cli("tokenize --tokenizer /nonexistent/tokenizer.json -p hi"),
               "/nonexistent/tokenizer.json");
}

TEST(Cli, BenchDeviceAndMethodErrorsAreClear) {
  // This build may or may not have the CUDA backend; either way the CPU test machine has no GPU.
  const CommandResult cuda =
      run_cli("bench --device cuda --random-model llama-100m -p 64 --methods full");
  EXPECT_EQ(cuda.exit_code, 1) << cuda.err;
  EXPECT_TRUE(cuda.err.find("no CUDA backend") != std::string::npos ||
              cuda.err.find("no CUDA device") != std::string::npos)
      << cuda.err;
  expect_error(run_cli("bench --device tpu --random-model llama-100m -p 64"), "--device");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --methods entropy"), "--methods");
  expect_error(run_cli("bench --random-model no-such-shape -p 64"), "no-such-shape");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --stage-times"), "--stage-times");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --gemm-tuning burst"),
               "--gemm-tuning");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --profile-decode-step 3"),
               "--profile-decode-step");
  // The device flags are the other model commands' (DeviceFlags).
  expect_error(run_cli("bench --random-model llama-100m -p 64 --prompt-attention fp8"),
               "--prompt-attention fp8 needs --device cuda");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --prompt-attention fp16"),
               "--prompt-attention: fp16 not in {auto,bf16,fp8}");
  expect_error(run_cli("bench --random-model llama-100m -p 64 --threads 0"), "--threads");
  // Nonsense values of the GPU-only options are refused on any device.
  expect_error(run_cli("bench --device cuda --random-model llama-100m -p 64 --gemm-tuning fast"),
               "--gemm-tuning");
  expect_error(
      run_cli("bench --device cuda --random-model llama-100m -p 64 -n 8 --profile-decode-step 8"),
      "not 8");
  // Nonsense lengths are refused before any model is built, on either device.
  for (const char* device : {"cpu", "cuda"}) {
    const std::string base = std::string("bench --device ") + device + " --random-model llama-100m";
    expect_error(run_cli(base + " -p 0"), "--prompt-tokens: expects a whole number from 1");
    expect_error(run_cli(base + " -p 64,-5"), "got '-5'");
    expect_error(run_cli(base + " -p 64 --chunk 0"), "--chunk");
  }
}

// --kv-cache takes auto or fp8 in every command that runs a model; generate names an FP8 cache in
// its ready line.
TEST(Cli, KvCacheFlagIsAutoOrFp8) {
  for (const char* command :
       {"generate -p hi", "inspect -p hi -o /tmp/unused", "eval", "needle", "serve"}) {
    SCOPED_TRACE(command);
    expect_error(run_cli(std::string(command) + " -m /nonexistent --kv-cache bogus"),
                 "--kv-cache: bogus not in {auto,fp8}");
  }
  expect_error(run_cli("bench --random-model llama-100m -p 64 --kv-cache fp16"),
               "--kv-cache: fp16 not in {auto,fp8}");

  const std::string model =
      std::filesystem::path(testing::shipped_model_dir()).lexically_normal().string();
  if (!std::filesystem::exists(model + "/model.safetensors")) {
    GTEST_SKIP() << "the shipped model is missing: " << model;
  }
  const std::string generate = "generate -m " + model + " -p 'The secret of cut is oil.' -n 4";
  const CommandResult fp8 = run_cli(generate + " --kv-cache fp8");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.err.find("KV cache fp8 (E4M3, one scale per row)"), std::string::npos) << fp8.err;
  EXPECT_NE(fp8.out.find("The secret of cut is oil."), std::string::npos) << fp8.out;
  const CommandResult automatic = run_cli(generate + " --kv-cache auto");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  EXPECT_EQ(automatic.err.find("KV cache fp8"), std::string::npos) << automatic.err;
}

// --prompt-attention takes auto, bf16 or fp8 in every command that runs a model, and only auto on
// the CPU, which attends in fp32.
TEST(Cli, PromptAttentionFlagIsCheckedAndCudaOnly) {
  for (const char* command :
       {"generate -p hi", "inspect -p hi -o /tmp/unused", "eval", "needle", "serve"}) {
    SCOPED_TRACE(command);
    expect_error(run_cli(std::string(command) + " -m /nonexistent --prompt-attention fp4"),
                 "--prompt-attention: fp4 not in {auto,bf16,fp8}");
  }
  const std::string model =
      std::filesystem::path(testing::shipped_model_dir()).lexically_normal().string();
  if (!std::filesystem::exists(model + "/model.safetensors")) {
    GTEST_SKIP() << "the shipped model is missing: " << model;
  }
  const std::string generate = "generate -m " + model + " -p 'The secret of cut is oil.' -n 4";
  expect_error(run_cli(generate + " --prompt-attention fp8"),
               "--prompt-attention fp8 needs --device cuda");
  const CommandResult automatic = run_cli(generate + " --prompt-attention auto");
  EXPECT_EQ(automatic.exit_code, 0) << automatic.err;
}

TEST(Cli, TokenizePrintsIds) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  const CommandResult result =
      run_cli("tokenize --tokenizer " + stories_tokenizer() + " -p 'Once upon a time' --ids --bos");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("1 ", 0), 0u) << result.out;
}

std::string write_story_prompt() {
  const std::string path = test_temp_path("story_prompt.txt");
  std::ofstream prompt(path);
  for (int i = 0; i < 20; ++i)
    prompt << "Lily went to the park with her mom and saw a big red ball. ";
  return path;
}

const char* kScaledEntropy =
    " --prefill entropy --segment-size 64 --block-size 4 --sparse-threshold 128 --base-budget 32";

TEST(Cli, InspectWritesPlansAndHeatmaps) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const std::string out = test_temp_path("inspect");
  const CommandResult result =
      run_cli("inspect -m " + stories_model() + " --tokenizer " + stories_tokenizer() + " -f " +
              write_story_prompt() + kScaledEntropy + " -o " + out);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("of full attention's keys"), std::string::npos) << result.out;
  const nlohmann::json plans = nlohmann::json::parse(testing::read_file_bytes(out + "/plans.json"));
  ASSERT_EQ(plans["layers"].size(), 5u);
  EXPECT_TRUE(plans["layers"][0]["dense"].get<bool>());  // the first layer is dense by default
  const nlohmann::json& head = plans["layers"][1]["heads"][0];
  EXPECT_TRUE(head["class"] == "rigid" || head["class"] == "dynamic");
  bool saw_sparse_segment = false;
  for (const nlohmann::json& segment : head["segments"]) {
    if (!segment["sparse"].get<bool>()) continue;
    saw_sparse_segment = true;
    EXPECT_TRUE(segment.contains("entropy"));
    EXPECT_EQ(segment["blocks"].size(), segment["blocks_read"].get<size_t>());
    // Causality: every block ends before the segment starts (segment 64 tokens, block 4).
    for (int block : segment["blocks"])
      EXPECT_LE((block + 1) * 4, segment["segment"].get<int>() * 64);
  }
  EXPECT_TRUE(saw_sparse_segment);
  // The summary counts agree with the segments written: estimates below e_t after each head's
  // first segment, and the budgets summed.
  const double threshold = plans["attention"]["prefill_params"]["entropy_threshold"].get<double>();
  int64_t examined = 0, below = 0, budget = 0;
  for (const nlohmann::json& layer : plans["layers"]) {
    for (const nlohmann::json& layer_head : layer["heads"]) {
      for (const nlohmann::json& segment : layer_head["segments"]) {
        if (segment.contains("entropy") && segment["segment"].get<int>() >= 1) {
          ++examined;
          below += segment["entropy"].get<double>() < threshold ? 1 : 0;
        }
        if (segment.contains("budget_tokens")) budget += segment["budget_tokens"].get<int64_t>();
      }
    }
  }
  EXPECT_GT(examined, 0);
  EXPECT_EQ(plans["segments_examined"].get<int64_t>(), examined);
  EXPECT_EQ(plans["segments_below_threshold"].get<int64_t>(), below);
  EXPECT_EQ(plans["budget_tokens"].get<int64_t>(), budget);
  EXPECT_NE(result.out.find("segment estimates below e_t: " + std::to_string(below) + " of " +
                            std::to_string(examined)),
            std::string::npos)
      << result.out;
  for (const char* name : {"/entropy.svg", "/budget.svg"}) {
    EXPECT_EQ(testing::read_file_bytes(out + name).rfind("<svg", 0), 0u) << name;
  }
}

TEST(Cli, SparseGeneratePrintsItsWorkAndBadParametersAreErrors) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const std::string base = "generate -m " + stories_model() + " --tokenizer " +
                           stories_tokenizer() + " -f " + write_story_prompt() + " -n 24";
  const CommandResult sparse = run_cli(
      base + kScaledEntropy + " --decode latent --decode-budget 96 --window 16 --decode-gap 8");
  ASSERT_EQ(sparse.exit_code, 0) << sparse.err;
  EXPECT_NE(sparse.err.find("of full attention's keys"), std::string::npos) << sparse.err;
  EXPECT_NE(sparse.err.find("MiB ->"), std::string::npos)
      << "cache before/after missing: " << sparse.err;
  expect_error(run_cli(base + " --prefill entropy --segment-size 60 --block-size 8"), "segment");
  expect_error(run_cli(base + " --decode snapkv --decode-budget 16 --window 32"), "window");
  expect_error(run_cli(base + " --prefill entropy --base-budget -5"), "base_budget");
  expect_error(run_cli(base + " --prefill sometimes"), "sometimes");
  expect_error(run_cli(base + " --alpha lots"), "--alpha");
}

}  // namespace
}  // namespace entropyinfer

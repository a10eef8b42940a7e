// `entropyinfer eval` end to end on the tiny random-weight fixture (it scores about nothing; the
// pipeline, the matched budgets and the outputs are what is checked), and one clear error for each
// kind of bad flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_support.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;

using testing::CommandResult;
using testing::expect_error;
using testing::run_cli;
using testing::test_temp_path;

int count_of(const std::string& text, const std::string& piece) {
  int count = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) {
    ++count;
  }
  return count;
}

// The committed tiny Llama (real byte-level BPE tokenizer, random weights, 2048-token context) in a
// folder of its own, with the task word pools that training writes beside a model.
class EvalFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = test_temp_path("model");
    fs::create_directories(folder_);
    const fs::path source = fs::path(testing::fixtures_dir()) / "parity" / "tiny_chat_llama";
    for (const char* name :
         {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json", "special_tokens_map.json"}) {
      fs::copy_file(source / name, fs::path(folder_) / name, fs::copy_options::overwrite_existing);
    }
    nlohmann::json words = {
        {"format", 1},
        {"heldout_every", 10},
        {"keys", {"apple",  "bread",  "chair", "door",   "field",  "garden", "horse",
                  "island", "letter", "money", "night",  "ocean",  "paper",  "river",
                  "stone",  "table",  "water", "window", "winter", "year"}},
        {"values",
         {"blue", "brave", "calm", "dark", "early", "fair",  "glad",  "great",  "happy", "kind",
          "late", "light", "long", "new",  "old",   "proud", "quiet", "little", "small", "young"}},
        {"numbers", {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"}}};
    std::ofstream(fs::path(folder_) / "task_words.json") << words.dump(2);
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string model() const { return folder_; }
  std::string text_dir() const { return testing::asset_path("text"); }

  std::string folder_;
};

// Context-first compresses before the question arrives (so SnapKV's "before" is the context
// alone, and it keeps a larger share of it than of the whole prompt); multi-turn asks each sample's
// follow-up questions in turn and scores those, on the tasks that have them.
TEST_F(EvalFixture, ProtocolsFeedTheQuestionAfterTheContextAndAskTheFollowUps) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt");
  const std::string json_path = test_temp_path("eval-protocols.json");
  const CommandResult result = run_cli(
      "eval -m " + model() + " --text-dir " + text_dir() +
      " --tasks niah_single,niah_multikey,niah_multiquery --samples 2 --lengths 1024"
      " --methods full,full+snapkv --budgets 64 --protocols query-aware,context-first,multi-turn"
      " --threads 2 --json " +
      json_path);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const std::string protocol : {"query-aware", "context-first", "multi-turn"})
    EXPECT_NE(result.out.find("\n# Protocol " + protocol + "\n"), std::string::npos) << protocol;
  const nlohmann::json json = nlohmann::json::parse(testing::read_file_bytes(json_path));
  ASSERT_EQ(json["runs"].size(), 6u);
  std::map<std::string, double> snapkv_kept;  // protocol -> mean kept fraction
  for (const nlohmann::json& run : json["runs"]) {
    const std::string protocol = run["protocol"];
    const std::string method = run["method"];
    SCOPED_TRACE(method + " " + protocol);
    if (protocol == "multi-turn") {
      ASSERT_EQ(run["samples"].size(), 4u) << "niah_single has no follow-up";
      for (const nlohmann::json& sample : run["samples"]) {
        const std::string task = sample["task"];
        const size_t turns = task == "niah_multikey" ? 3 : 4;
        EXPECT_EQ(sample["answers"].size(), turns) << task;
        const std::string prediction = sample["prediction"];
        size_t separators = 0;
        for (size_t at = prediction.find(" | "); at != std::string::npos;
             at = prediction.find(" | ", at + 1)) {
          ++separators;
        }
        EXPECT_GE(separators, turns) << prediction;
      }
    } else {
      EXPECT_EQ(run["samples"].size(), 6u);
    }
    if (method == "full+snapkv") {
      double kept = 0;
      for (const nlohmann::json& sample : run["samples"])
        kept += sample["cache_kept_fraction"].get<double>();
      snapkv_kept[protocol] = kept / static_cast<double>(run["samples"].size());
      EXPECT_LT(snapkv_kept[protocol], 0.2);
    }
  }
  EXPECT_GT(snapkv_kept["context-first"], snapkv_kept["query-aware"])
      << "context-first compresses the context before its question is appended";
  fs::remove(json_path);
  expect_error(run_cli("eval -m " + model() + " --protocols query-aware,bogus"), "bogus");
  expect_error(run_cli("eval -m " + model() + " --protocols context-first,context-first"), "twice");
}

TEST_F(EvalFixture, RunsEveryMethodAtEveryLevelAndWritesTheReports) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt");
  const std::string json_path = test_temp_path("eval.json");
  const std::string markdown_path = test_temp_path("eval.md");
  const std::string plots = test_temp_path("plots");
  // Segments of 64 so that 1024-token prompts have sparse segments at both levels. The fixture has
  // two layers: the last runs its last row alone, so the first must not be dense for a sparse
  // prefill to read fewer keys.
  const CommandResult result =
      run_cli("eval -m " + model() + " --text-dir " + text_dir() +
              " --samples 1 --lengths 1024 --budgets 64,128 --segment-size 64 --dense-layers 0"
              " --threads 2"
              " --json " +
              json_path + " --markdown " + markdown_path + " --plots " + plots);
  ASSERT_EQ(result.exit_code, 0) << result.err;

  // 1 full run + 5 budgeted methods x 2 levels, 7 tasks x 1 length x 1 sample each.
  EXPECT_NE(result.err.find("eval: 77/77 samples"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("entropy+latent @ 64: prefill entropy (S 64, b 8, sparse from 64"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("decode snapkv (K 128, W 32"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("ETA"), std::string::npos);

  EXPECT_NE(result.out.find("| method | budget | 1024 | mean |"), std::string::npos) << result.out;
  // Full attention at both levels in the two accuracy tables, and once in the work table.
  EXPECT_EQ(count_of(result.out, "\n| full | none (dense) | "), 2 * 2 + 1) << result.out;
  for (const std::string method :
       {"entropy+latent", "critiprefill+full", "full+snapkv", "full+adakv", "full+streaming"}) {
    for (const std::string budget : {"64", "128"}) {
      EXPECT_NE(result.out.find("\n| " + method + " | " + budget + " | "), std::string::npos)
          << method << " at " << budget;
    }
  }
  EXPECT_NE(result.out.find("| niah_single | niah_multikey | niah_multivalue | niah_multiquery "
                            "| vt | cwe | fwe |"),
            std::string::npos)
      << result.out;
  EXPECT_EQ(testing::read_file_bytes(markdown_path), result.out);

  const nlohmann::json json = nlohmann::json::parse(testing::read_file_bytes(json_path));
  EXPECT_EQ(json["lengths"], nlohmann::json::array({1024}));
  EXPECT_EQ(json["budgets"], nlohmann::json::array({64, 128}));
  EXPECT_EQ(json["tasks"].size(), 7u);
  ASSERT_EQ(json["runs"].size(), 11u);
  EXPECT_NE(json["command"].get<std::string>().find("eval -m"), std::string::npos);
  for (const nlohmann::json& run : json["runs"]) {
    const std::string method = run["method"];
    const int budget = run["budget"];
    ASSERT_EQ(run["samples"].size(), 7u) << method;
    EXPECT_EQ(budget == 0, method == "full") << method;
    if (budget > 0) {
      // Matched budgets: every budget parameter is the level.
      EXPECT_EQ(run["attention"]["prefill_params"]["base_budget"], budget);
      EXPECT_EQ(run["attention"]["prefill_params"]["critiprefill_budget"], budget);
      EXPECT_EQ(run["attention"]["decode_params"]["budget"], budget);
      EXPECT_EQ(run["attention"]["prefill_params"]["sparse_threshold"], budget);
    }
    double fewest_keys = 1.0, least_kept = 1.0;
    for (const nlohmann::json& sample : run["samples"]) {
      EXPECT_LE(sample["prompt_tokens"].get<int>(), 1024);
      EXPECT_GE(sample["score"].get<double>(), 0.0);
      EXPECT_LE(sample["score"].get<double>(), 1.0);
      EXPECT_FALSE(sample["answers"].empty());
      fewest_keys = std::min(fewest_keys, sample["prefill_keys_fraction"].get<double>());
      least_kept = std::min(least_kept, sample["cache_kept_fraction"].get<double>());
    }
    // The policies did their work: sparse prefills read fewer keys, SnapKV kept fewer entries.
    if (method == "entropy+latent" || method == "critiprefill+full") {
      EXPECT_LT(fewest_keys, 1.0) << method << " at " << budget;
    } else {
      EXPECT_EQ(fewest_keys, 1.0) << method;
    }
    if (method == "full+snapkv" || method == "full+adakv" || method == "full+streaming") {
      EXPECT_LT(least_kept, 0.2) << method << " at " << budget;
    }
  }
  int accuracy_entries = 0;
  for (const nlohmann::json& entry : json["accuracy"]) {
    if (entry["length"] == 1024) ++accuracy_entries;
  }
  EXPECT_EQ(accuracy_entries, 11 * 7);

  for (const std::string name : {"accuracy_vs_length_budget64.svg",
                                 "accuracy_vs_length_budget128.svg", "accuracy_vs_budget.svg"}) {
    const std::string svg = testing::read_file_bytes(plots + "/" + name);
    EXPECT_EQ(count_of(svg, "<polyline"), 6) << name;
  }
  fs::remove(json_path);
  fs::remove(markdown_path);
  fs::remove_all(plots);
}

TEST_F(EvalFixture, BadFlagsAreOneClearError) {
  expect_error(run_cli("eval -m " + model() + " --tasks niah_single,bogus"), "bogus");
  expect_error(run_cli("eval -m " + model() + " --methods full,entropy+sparsely"), "sparsely");
  expect_error(run_cli("eval -m " + model() + " --methods full,full"), "twice");
  expect_error(run_cli("eval -m " + model() + " --lengths 0"), "--lengths");
  expect_error(run_cli("eval -m " + model() + " --lengths 4096,abc"), "'abc'");
  expect_error(run_cli("eval -m " + model() + " --budgets 0"), "--budgets");
  expect_error(run_cli("eval -m " + model() + " --samples 0"), "--samples");
  expect_error(run_cli("eval -m " + model() + " --device tpu"), "--device");
  // The levels are the budgets; a second budget flag would contradict them.
  expect_error(run_cli("eval -m " + model() + " --decode-budget 256"), "--budgets");
  expect_error(run_cli("eval -m " + model() + " --prefill entropy"), "--methods");
  // A level below SnapKV's observation window cannot hold it.
  expect_error(run_cli("eval -m " + model() + " --budgets 16"), "--budgets 16");
  expect_error(run_cli("eval -m /nonexistent/model"), "/nonexistent/model");
  expect_error(run_cli("eval -m " + model() + " --text-dir /nonexistent/text"),
               "/nonexistent/text");
  // No model at all: CLI11's own message.
  const CommandResult no_model = run_cli("eval --lengths 1024");
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_NE(no_model.err.find("--model"), std::string::npos) << no_model.err;
}

TEST_F(EvalFixture, LengthsTheTaskOrModelCannotTakeAreErrors) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt");
  // The fixture's context is 2048 tokens.
  expect_error(run_cli("eval -m " + model() + " --text-dir " + text_dir() + " --lengths 4096"),
               "2048");
  // 300 list words do not fit in 64 tokens.
  expect_error(run_cli("eval -m " + model() + " --text-dir " + text_dir() +
                       " --tasks cwe --lengths 64 --methods full"),
               "cwe");
}

TEST_F(EvalFixture, MissingTaskWordsIsAnError) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt");
  fs::remove(fs::path(folder_) / "task_words.json");
  expect_error(run_cli("eval -m " + model() + " --text-dir " + text_dir() + " --lengths 1024"),
               "task_words.json");
}

}  // namespace
}  // namespace entropyinfer

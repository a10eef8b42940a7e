// `entropyinfer eval` end to end on the tiny random-weight fixture (it scores about nothing; the
// pipeline, the matched budgets and the outputs are what is checked), and one clear error for each
// kind of bad flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

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

  // eval-report draws the same report again from the JSON alone.
  const std::string again_json = test_temp_path("again.json");
  const std::string again_markdown = test_temp_path("again.md");
  const std::string again_plots = test_temp_path("again-plots");
  const CommandResult again = run_cli("eval-report " + json_path + " --json " + again_json +
                                      " --markdown " + again_markdown + " --plots " + again_plots);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, result.out);
  EXPECT_EQ(testing::read_file_bytes(again_markdown), result.out);
  EXPECT_EQ(nlohmann::json::parse(testing::read_file_bytes(again_json)), json);
  for (const fs::directory_entry& entry : fs::directory_iterator(plots)) {
    EXPECT_EQ(testing::read_file_bytes((fs::path(again_plots) / entry.path().filename()).string()),
              testing::read_file_bytes(entry.path().string()))
        << entry.path();
  }
  for (const std::string& path : {json_path, markdown_path, again_json, again_markdown}) {
    fs::remove(path);
  }
  fs::remove_all(plots);
  fs::remove_all(again_plots);
}

// Shards of one evaluation (--first-sample) merged by eval-report give the scores, intervals and
// rankings one evaluation of all their samples gives; a sample in two shards, or shards of
// different evaluations, are errors.
TEST_F(EvalFixture, ShardsMergeIntoTheReportOfOneEvaluation) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt");
  const std::string common = "eval -m " + model() + " --text-dir " + text_dir() +
                             " --tasks niah_single,niah_multikey --lengths 512,1024 --budgets 64"
                             " --methods full,entropy+latent --segment-size 64"
                             " --dense-layers 0 --threads 2";
  const std::string whole = test_temp_path("whole.json");
  const std::string first = test_temp_path("first.json");
  const std::string second = test_temp_path("second.json");
  const std::string merged = test_temp_path("merged.json");
  ASSERT_EQ(run_cli(common + " --samples 3 --json " + whole).exit_code, 0);
  ASSERT_EQ(run_cli(common + " --samples 2 --json " + first).exit_code, 0);
  const CommandResult second_run =
      run_cli(common + " --samples 1 --first-sample 2 --json " + second);
  ASSERT_EQ(second_run.exit_code, 0) << second_run.err;
  const CommandResult merge = run_cli("eval-report " + second + " " + first + " --json " + merged);
  ASSERT_EQ(merge.exit_code, 0) << merge.err;

  const nlohmann::json expected = nlohmann::json::parse(testing::read_file_bytes(whole));
  const nlohmann::json actual = nlohmann::json::parse(testing::read_file_bytes(merged));
  EXPECT_EQ(actual["samples_per_cell"], 3);
  EXPECT_EQ(actual["accuracy"], expected["accuracy"]);
  EXPECT_EQ(actual["averages"], expected["averages"]);
  ASSERT_EQ(actual["runs"].size(), expected["runs"].size());
  for (size_t r = 0; r < actual["runs"].size(); ++r) {
    nlohmann::json a = actual["runs"][r]["samples"], b = expected["runs"][r]["samples"];
    ASSERT_EQ(a.size(), 12u);
    for (nlohmann::json* samples : {&a, &b}) {
      for (nlohmann::json& sample : *samples) sample.erase("seconds");
    }
    EXPECT_EQ(a, b) << actual["runs"][r]["method"];
  }
  const auto ranking = [](const std::string& markdown) {
    return markdown.substr(markdown.find("## Ranking per budget"),
                           markdown.find("## Work") - markdown.find("## Ranking per budget"));
  };
  EXPECT_EQ(ranking(merge.out),
            ranking(nlohmann::json::parse(testing::read_file_bytes(whole))["markdown"]));

  expect_error(run_cli("eval-report " + first + " " + first), "in two shards");
  const std::string other = test_temp_path("other.json");
  ASSERT_EQ(run_cli(common + " --samples 1 --seed 5 --json " + other).exit_code, 0);
  expect_error(run_cli("eval-report " + first + " " + other), "'seed'");
  for (const std::string& path : {whole, first, second, merged, other}) fs::remove(path);
}

// A report file that is missing, not a file, not JSON, or holds values no eval writes is one
// error naming the problem, and nothing is written.
TEST(EvalReportCommand, BadReportFilesAreOneClearError) {
  expect_error(run_cli("eval-report /nonexistent/eval.json"), "/nonexistent/eval.json");
  expect_error(run_cli("eval-report " + fs::temp_directory_path().string()), "eval report");
  const nlohmann::json sample = {{"task", "niah_single"},
                                 {"length", 1024},
                                 {"index", 0},
                                 {"prompt_tokens", 1000},
                                 {"answers", {"plum"}},
                                 {"prediction", " plum."},
                                 {"score", 1.0},
                                 {"seconds", 0.5},
                                 {"prefill_keys_fraction", 0.5},
                                 {"cache_kept_fraction", 1.0}};
  const nlohmann::json good = {{"date", "2026-12-03T00:00:00Z"},
                               {"command", "entropyinfer eval"},
                               {"model", "m"},
                               {"device", "cpu"},
                               {"seed", 0},
                               {"samples_per_cell", 1},
                               {"tasks", {"niah_single"}},
                               {"lengths", {1024}},
                               {"budgets", {512}},
                               {"methods", {"full"}},
                               {"protocols", {"context-first"}},
                               {"notes", ""},
                               {"runs",
                                {{{"method", "full"},
                                  {"budget", 0},
                                  {"protocol", "context-first"},
                                  {"attention", nlohmann::json::object()},
                                  {"seconds", 0.5},
                                  {"samples", {sample}}}}}};
  const std::string path = test_temp_path("report.json");
  const auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(good.dump());
  const CommandResult ok = run_cli("eval-report " + path);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("| full | none (dense) | 100.0 | 100.0 |"), std::string::npos) << ok.out;

  write("{\"date\": ");
  expect_error(run_cli("eval-report " + path), "report.json");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> bad = {
      {[](nlohmann::json& j) { j["runs"][0]["samples"][0]["score"] = 5; }, "'score' is 5"},
      {[](nlohmann::json& j) { j["samples_per_cell"] = 1e10; },
       "'samples_per_cell' must be a whole"},
      {[](nlohmann::json& j) { j["samples_per_cell"] = 10000000000LL; }, "in range"},
      {[](nlohmann::json& j) { j["samples_per_cell"] = 0; }, "at least 1"},
      {[](nlohmann::json& j) { j["lengths"] = {1.5}; }, "'lengths' (an element) must be a whole"},
      {[](nlohmann::json& j) { j["lengths"] = {-4}; }, "'lengths' must be positive"},
      {[](nlohmann::json& j) { j["seed"] = -1; }, "'seed' must be in range"},
      {[](nlohmann::json& j) { j["tasks"] = "niah_single"; }, "'tasks' must be an array"},
      {[](nlohmann::json& j) { j["model"] = 7; }, "'model' must be a string"},
      {[](nlohmann::json& j) { j["runs"][0]["samples"][0].erase("prediction"); }, "'prediction'"},
  };
  for (const auto& [spoil, message] : bad) {
    nlohmann::json spoilt = good;
    spoil(spoilt);
    write(spoilt.dump());
    expect_error(run_cli("eval-report " + path), message);
  }
  fs::remove(path);
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

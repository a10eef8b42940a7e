// `entropyinfer needle` on the shipped model at short lengths (the answer of the default sample,
// the work a sparse prefill saves, the noise haystack when no text is found) and one clear error
// for each kind of bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
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

std::string shipped_model() {
  return (fs::path(testing::fixtures_dir()) / ".." / ".." / "models" / "needle-llama-11m")
      .lexically_normal()
      .string();
}

#define REQUIRE_SHIPPED_MODEL()                                            \
  do {                                                                     \
    if (!fs::exists(shipped_model() + "/model.safetensors")) {             \
      GTEST_SKIP() << "the shipped model is missing: " << shipped_model(); \
    }                                                                      \
  } while (0)

// The stdout line of `method`'s result ("<method> <padding> \"answer\" right | ...").
std::string line_of(const std::string& out, const std::string& method) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with(method + " ") && line.find(" | first token ") != std::string::npos) {
      return line;
    }
  }
  return "";
}

// Sample 0 of niah_single at 1024 tokens asks for the secret of "want" (" die"), with Persuasion
// or the noise haystack alike (the draws do not depend on the haystack). Segments of 128 and
// --budget 256 (sparse from token 256 on) give the entropy prefill sparse segments to skip.
TEST(CliNeedle, AnswersWithBothMethodsAndReportsTheirWork) {
  REQUIRE_SHIPPED_MODEL();
  const std::string json_path = test_temp_path("needle.json");
  const CommandResult result =
      run_cli("needle -m " + shipped_model() +
              " --length 1024 --budget 256 --segment-size 128 --threads 2 --json " + json_path);
  ASSERT_EQ(result.exit_code, 0) << result.err;

  EXPECT_NE(result.out.find("needle    \"The secret of want is die.\" at token "),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("question  \"What is the secret of want? It is\" -> expected \" die\""),
            std::string::npos)
      << result.out;
  const std::string full = line_of(result.out, "full");
  const std::string entropy = line_of(result.out, "entropy+latent");
  ASSERT_FALSE(full.empty()) << result.out;
  ASSERT_FALSE(entropy.empty()) << result.out;
  EXPECT_NE(full.find("\" die.\" right"), std::string::npos) << full;
  EXPECT_NE(full.find("prefill attention work 100.0%"), std::string::npos) << full;
  // The answer ends before latent compression's G = 16 decode steps, and the line says so.
  EXPECT_NE(entropy.find("not compressed (latent compresses after G = 16"), std::string::npos)
      << entropy;
  const size_t summary_at = result.out.find("\ntime to first token: full ");
  EXPECT_NE(summary_at, std::string::npos) << result.out;
  EXPECT_TRUE(result.out.find(" than full)", summary_at) != std::string::npos ||
              result.out.find("(as fast as full)", summary_at) != std::string::npos)
      << result.out;
  EXPECT_NE(result.err.find("prefilling "), std::string::npos) << result.err;

  const nlohmann::json json = nlohmann::json::parse(testing::read_file_bytes(json_path));
  EXPECT_LE(json["prompt_tokens"].get<int>(), 1024 - 4);
  EXPECT_EQ(json["answers"], nlohmann::json::array({"die"}));
  ASSERT_EQ(json["methods"].size(), 2u);
  const nlohmann::json& full_run = json["methods"][0];
  const nlohmann::json& entropy_run = json["methods"][1];
  EXPECT_EQ(full_run["method"], "full");
  EXPECT_TRUE(full_run["correct"].get<bool>()) << full_run.dump();
  EXPECT_DOUBLE_EQ(full_run["prefill_keys_fraction"].get<double>(), 1.0);
  EXPECT_GT(full_run["first_token_seconds"].get<double>(), 0.0);
  EXPECT_EQ(entropy_run["method"], "entropy+latent");
  EXPECT_LT(entropy_run["prefill_keys_fraction"].get<double>(), 1.0) << entropy_run.dump();
  EXPECT_GT(entropy_run["prefill_keys_fraction"].get<double>(), 0.0);
  EXPECT_FALSE(entropy_run["compressed"].get<bool>());
  // --budget sets the level as eval does: sparse_threshold follows it.
  EXPECT_EQ(entropy_run["attention"]["prefill_params"]["base_budget"], 256);
  EXPECT_EQ(entropy_run["attention"]["prefill_params"]["sparse_threshold"], 256);
  EXPECT_EQ(entropy_run["attention"]["decode_params"]["budget"], 256);
  fs::remove(json_path);
}

// Run from a folder with no shared assets above it, the demo still runs, on RULER's noise
// haystack, and says so.
TEST(CliNeedle, FallsBackToTheNoiseHaystackWithoutText) {
  REQUIRE_SHIPPED_MODEL();
  const fs::path folder = test_temp_path("alone");
  fs::create_directories(folder);
  const fs::path copy = folder / "entropyinfer";
  fs::copy_file(testing::cli_path(), copy, fs::copy_options::overwrite_existing);
  const std::string err_path = (folder / "stderr.txt").string();
  const std::string command = "cd " + folder.string() + " && ./entropyinfer needle -m " +
                              shipped_model() + " --length 256 --methods full --threads 2 2>" +
                              err_path;
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  size_t count;
  while ((count = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, count);
  const int status = pclose(pipe);
  const std::string err = testing::read_file_bytes(err_path);
  fs::remove_all(folder);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  EXPECT_NE(out.find("of RULER's noise haystack"), std::string::npos) << out;
  EXPECT_NE(err.find("note: janeausten/persuasion.txt was not found"), std::string::npos) << err;
  EXPECT_FALSE(line_of(out, "full").empty()) << out;
}

TEST(CliNeedle, BadInputIsOneClearError) {
  REQUIRE_SHIPPED_MODEL();
  const std::string model = " -m " + shipped_model();
  expect_error(run_cli("needle -m /nonexistent/model"), "/nonexistent/model");
  expect_error(run_cli("needle" + model + " --length 40000"), "32768-token context");
  expect_error(run_cli("needle" + model + " --length 16"), "--length 16 is too short");
  expect_error(run_cli("needle" + model + " --length 4x"), "'4x'");
  expect_error(run_cli("needle" + model + " --methods full,entropy+sparsely"), "sparsely");
  expect_error(run_cli("needle" + model + " --methods full,full"), "twice");
  expect_error(run_cli("needle" + model + " --device tpu"), "--device");
  expect_error(run_cli("needle" + model + " --index -1"), "--index");
  expect_error(run_cli("needle" + model + " --budget 0"), "--budget");
  // A budget below the latent observation window cannot hold it.
  expect_error(run_cli("needle" + model + " --budget 16"), "--budget 16");
  expect_error(run_cli("needle" + model + " --budget 512 --decode-budget 128"), "--decode-budget");
  expect_error(run_cli("needle" + model + " --prefill entropy"), "--methods");
  expect_error(run_cli("needle" + model + " --text-dir /nonexistent/text"), "/nonexistent/text");
  // A CPU build has no CUDA backend; a CUDA build without a GPU says so; one with a GPU gets as far
  // as the length check.
  const CommandResult cuda = run_cli("needle" + model + " --device cuda --length 40000");
  EXPECT_EQ(cuda.exit_code, 1) << cuda.err;
  EXPECT_TRUE(
      cuda.err.find("error: --device cuda: this build has no CUDA backend") != std::string::npos ||
      cuda.err.find("error: --device cuda: no CUDA device is present") != std::string::npos ||
      cuda.err.find("error: --length 40000") != std::string::npos)
      << cuda.err;

  // A model folder without the task word pools.
  const fs::path folder = test_temp_path("no_words");
  fs::create_directories(folder);
  for (const char* name :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::create_symlink(fs::path(shipped_model()) / name, folder / name);
  }
  expect_error(run_cli("needle -m " + folder.string() + " --length 1024"), "task_words.json");
  fs::remove_all(folder);
}

// Without -m the shipped model is found above the executable (the build folder is in the
// checkout); the length check that follows shows it was.
TEST(CliNeedle, FindsTheShippedModelByDefault) {
  REQUIRE_SHIPPED_MODEL();
  bool reachable = false;
  for (fs::path folder : {fs::current_path(), fs::path(testing::cli_path()).parent_path()}) {
    for (; !reachable && !folder.empty(); folder = folder.parent_path()) {
      reachable = fs::is_directory(folder / "models" / "needle-llama-11m");
      if (folder == folder.parent_path()) break;
    }
  }
  if (!reachable) GTEST_SKIP() << "the build folder is outside the checkout";
  expect_error(run_cli("needle --length 16"), "--length 16 is too short");
}

}  // namespace
}  // namespace entropyinfer

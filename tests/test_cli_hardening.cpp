// Hostile and careless input through the command line: each class ends in exit status 1 and one
// "error: " line naming the problem, never a crash, a hang or a silent success.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "cli_test_support.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::CommandResult;
using testing::expect_error;
using testing::run_cli;
using testing::TempFolder;
using testing::write_file_bytes;

std::string stories_model() { return testing::asset_path("stories260K/stories260K.bin"); }
std::string stories_tokenizer() { return testing::asset_path("stories260K/tok512.bin"); }

TEST(CliHardening, NanWeightIsAnErrorWithEverySampler) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  TempFolder folder("cli-nan");
  std::string bytes = testing::read_file_bytes(stories_model());
  const float nan = std::nanf("");
  // Row 400 of the (tied) embedding: token 400's logit becomes NaN.
  std::memcpy(bytes.data() + 7 * sizeof(int32_t) + 400 * 64 * sizeof(float), &nan, sizeof nan);
  write_file_bytes(folder.file("nan.bin"), bytes);
  const std::string base = "generate -m " + folder.file("nan.bin") + " --tokenizer " +
                           stories_tokenizer() + " -p 'Once upon a time' -n 4 ";
  for (const char* sampler :
       {"-t 0", "-t 1 --top-p 0.9 -s 3", "-t 1 --top-k 5 -s 3",
        "--sampler llama2c -t 1 --top-p 0.9 -s 3", "--sampler llama2c -t 1 -s 3"}) {
    SCOPED_TRACE(sampler);
    expect_error(run_cli(base + sampler), "NaN logit for token id 400");
  }
}

TEST(CliHardening, HostileConfigJsonIsAnError) {
  TempFolder folder("cli-config");
  write_file_bytes(folder.file("config.json"), R"({"model_type": "llama", "x": 1e400})");
  expect_error(run_cli("generate -m " + folder.path() + " -p hi"), "not valid JSON");
  write_file_bytes(folder.file("config.json"),
                   "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error(run_cli("generate -m " + folder.path() + " -p hi"), "nests deeper than");
}

TEST(CliHardening, PathsThatAreNotFilesAreRefusedByKind) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  TempFolder folder("cli-paths");
  const std::string model = " -m " + stories_model() + " --tokenizer " + stories_tokenizer();
  expect_error(run_cli("tokenize -m " + folder.file("missing/x.bin") + " -p hi"), "does not exist");
  expect_error(run_cli("generate" + model + " -f " + folder.path()), "is a folder");
  expect_error(run_cli("generate" + model + " -p hi --attention-config " + folder.path()),
               "is a folder");
  expect_error(run_cli("generate -m " + stories_model() + " --tokenizer /dev/zero -p hi"),
               "character device");
  ASSERT_EQ(::mkfifo(folder.file("pipe").c_str(), 0600), 0);
  expect_error(run_cli("generate" + model + " -f " + folder.file("pipe")), "a FIFO");
  expect_error(run_cli("generate -m " + folder.file("pipe") + " -p hi"),
               "neither a Hugging Face model folder nor a checkpoint file");
}

TEST(CliHardening, OutputPathsAreCheckedBeforeTheWork) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  TempFolder folder("cli-out");
  write_file_bytes(folder.file("existing"), "keep me");
  const CommandResult inspect =
      run_cli("inspect -m " + stories_model() + " --tokenizer " + stories_tokenizer() +
              " -p 'Once upon a time' --prefill entropy -o " + folder.file("existing"));
  expect_error(inspect, "is a file, not a folder");
  EXPECT_EQ(inspect.err.find("prefill:"), std::string::npos) << "refused only after the prefill";
  EXPECT_EQ(testing::read_file_bytes(folder.file("existing")), "keep me");
  expect_error(run_cli("bench --random-model llama-100m -p 16 -n 1 -r 1 --json " + folder.path()),
               "is a folder");
  expect_error(run_cli("bench-work --random-model llama-100m --tokens 64 --json " +
                       folder.file("existing") + "/x.json"),
               "is not a folder");
  expect_error(run_cli("eval -m " + folder.path() + " --plots " + folder.file("existing")),
               "is a file, not a folder");
  expect_error(run_cli("needle -m " + folder.path() + " --json " + folder.file("no/x.json")),
               "does not exist");
}

TEST(CliHardening, NumericFlagsAreCheckedInOnePlace) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  const std::string generate =
      "generate -m " + stories_model() + " --tokenizer " + stories_tokenizer() + " -p hi ";
  struct Case {
    const char* flags;
    const char* named;
  };
  const Case cases[] = {
      {"-c -5", "--context: expects a whole number from 0"},
      {"-c ''", "--context: expects a whole number from 0 to 1073741824, got an empty value"},
      {"-n ''", "--max-tokens"},
      {"-n 12abc", "got '12abc'"},
      {"-t ''", "--temperature"},
      {"-t nan", "--temperature"},
      {"--top-k ''", "--top-k"},
      {"--top-k -1", "--top-k"},
      {"-s -1", "--seed: expects a seed from 0 to 18446744073709551615"},
      {"-s 18446744073709551616", "--seed"},
      {"--segment-size 64x", "--segment-size: expects a whole number"},
  };
  for (const Case& each : cases) {
    SCOPED_TRACE(each.flags);
    expect_error(run_cli(generate + each.flags), each.named);
  }
  const CommandResult largest_seed = run_cli(generate + "-n 1 -t 1 -s 18446744073709551615");
  EXPECT_EQ(largest_seed.exit_code, 0) << largest_seed.err;
}

TEST(CliHardening, ThreadCountsAreBounded) {
  TempFolder folder("cli-threads");
  for (const char* threads : {"100000", "0", "-3"}) {
    SCOPED_TRACE(threads);
    expect_error(run_cli("eval -m " + folder.path() + " --threads " + threads),
                 "--threads: expects a whole number from 1 to 1024");
  }
}

TEST(CliHardening, CommandLineParserErrorsHaveTheToolsShape) {
  expect_error(run_cli("generate --no-such-flag 1 -m x"), "no-such-flag");
  expect_error(run_cli("no-such-command"), "unknown command 'no-such-command'");
  expect_error(run_cli("tokenize -p"), "-p");
  const CommandResult help = run_cli("generate --help");
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("--temperature"), std::string::npos);
}

TEST(CliHardening, UnknownTokenizerDecoderIsAnError) {
  TempFolder folder("cli-decoder");
  write_file_bytes(folder.file("tokenizer.json"),
                   R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                       "pre_tokenizer": {"type": "ByteLevel"},
                       "decoder": {"type": "Sequence", "decoders": [{"type": "ByteLevel"},
                                   {"type": "Replace"}]}})");
  expect_error(run_cli("tokenize --tokenizer " + folder.file("tokenizer.json") + " -p hi"),
               "unsupported decoder type \"Replace\"");
}

TEST(CliHardening, CheckpointsTheFormatForbidsAreRefused) {
  TempFolder folder("cli-checkpoints");
  testing::TinyModelSpec spec;
  spec.num_shards = 2;
  testing::write_tiny_model(folder.path(), spec);
  // A number beyond a double in the index.
  std::string index = testing::read_file_bytes(folder.file("model.safetensors.index.json"));
  const size_t brace = index.find('{');
  index.insert(brace + 1, "\"total\": 1e400, ");
  write_file_bytes(folder.file("model.safetensors.index.json"), index);
  expect_error(run_cli("generate -m " + folder.path() + " -p hi"), "not valid JSON");

  // A shard with two bytes after its last tensor.
  TempFolder single("cli-checkpoint-tail");
  testing::write_tiny_model(single.path(), testing::TinyModelSpec{});
  std::string bytes = testing::read_file_bytes(single.file("model.safetensors"));
  write_file_bytes(single.file("model.safetensors"), bytes + "PP");
  expect_error(run_cli("generate -m " + single.path() + " -p hi"), "belong to no tensor");
}

TEST(CliHardening, ModelLargerThanItsTokenizerSamplesOnlyKnownIds) {
  // The first 300 tokens of stories260K's 512-token vocabulary, as a tokenizer.bin of its own: the
  // model's other 212 rows have no text and must never be sampled (they would stop decoding).
  ENTROPYINFER_REQUIRE_ASSET("stories260K/stories260K.bin");
  TempFolder folder("cli-vocab");
  const std::string full = testing::read_file_bytes(stories_tokenizer());
  size_t end = 4;
  for (int token = 0; token < 300; ++token) {
    int32_t length = 0;
    std::memcpy(&length, full.data() + end + 4, sizeof length);
    end += 8 + static_cast<size_t>(length);
  }
  write_file_bytes(folder.file("tok300.bin"), full.substr(0, end));
  const CommandResult result =
      run_cli("generate -m " + stories_model() + " --tokenizer " + folder.file("tok300.bin") +
              " -p 'Once upon a time' -n 64 -t 1.5 -s 11 -q");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_FALSE(result.out.empty());
}

}  // namespace
}  // namespace entropyinfer

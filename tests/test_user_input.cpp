// The two doors user input comes through: files named on the command line (read_user_file and
// friends) and JSON text (parse_json). Each hostile class seen in the wild has a case here.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"
#include "model/model_config.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using testing::error_message_of;
using testing::mentions_all;
using testing::TempFolder;
using testing::write_file_bytes;

TEST(UserFile, ReadsARegularFileWhole) {
  TempFolder folder("uf-read");
  write_file_bytes(folder.file("p.txt"), std::string("a\0b", 3));
  EXPECT_EQ(read_user_file(folder.file("p.txt"), "prompt file"), std::string("a\0b", 3));
}

TEST(UserFile, RefusesAFolderByKind) {
  TempFolder folder("uf-folder");
  EXPECT_TRUE(mentions_all(error_message_of([&] { read_user_file(folder.path(), "prompt file"); }),
                           {"prompt file", folder.path(), "is a folder"}));
}

TEST(UserFile, RefusesAFifoWithoutBlocking) {
  TempFolder folder("uf-fifo");
  ASSERT_EQ(::mkfifo(folder.file("pipe").c_str(), 0600), 0);
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { read_user_file(folder.file("pipe"), "tokenizer"); }), {"a FIFO"}));
}

TEST(UserFile, RefusesADevice) {
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero on this system";
  EXPECT_TRUE(mentions_all(error_message_of([&] { read_user_file("/dev/zero", "tokenizer"); }),
                           {"'/dev/zero'", "character device"}));
}

TEST(UserFile, BoundsWhatItReads) {
  TempFolder folder("uf-bound");
  write_file_bytes(folder.file("big"), std::string(100, 'x'));
  EXPECT_TRUE(mentions_all(error_message_of([&] { read_user_file(folder.file("big"), "f", 99); }),
                           {"100 bytes", "99"}));
  EXPECT_EQ(read_user_file(folder.file("big"), "f", 100).size(), 100u);
}

TEST(UserFile, MissingFileAndEmptyPathAreErrors) {
  TempFolder folder("uf-missing");
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { read_user_file(folder.file("nope/x.bin"), "tokenizer"); }),
      {"tokenizer", "No such file"}));
  EXPECT_TRUE(mentions_all(error_message_of([&] { read_user_file("", "prompt file"); }),
                           {"prompt file", "empty"}));
}

TEST(UserFile, WritesAtomicallyAndRefusesBadTargets) {
  TempFolder folder("uf-write");
  write_user_file(folder.file("r.json"), "results", "one");
  write_user_file(folder.file("r.json"), "results", "two");
  EXPECT_EQ(testing::read_file_bytes(folder.file("r.json")), "two");
  EXPECT_FALSE(std::filesystem::exists(folder.file("r.json.partial")));
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { write_user_file(folder.path(), "results", "x"); }), {"a folder"}));
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { check_output_file(folder.file("r.json/x.json"), "results"); }),
      {"not a folder"}));
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { check_output_file(folder.file("missing/x.json"), "results"); }),
      {"does not exist"}));
}

TEST(UserFile, OutputFolderIsCreatedButAFileIsRefused) {
  TempFolder folder("uf-outdir");
  prepare_output_folder(folder.file("a/b"), "heatmap folder");
  EXPECT_TRUE(std::filesystem::is_directory(folder.file("a/b")));
  write_file_bytes(folder.file("f"), "x");
  EXPECT_TRUE(mentions_all(
      error_message_of([&] { prepare_output_folder(folder.file("f"), "heatmap folder"); }),
      {"heatmap folder", "not a folder"}));
}

TEST(JsonReader, NumberBeyondADoubleIsAnErrorNotAnAbort) {
  EXPECT_TRUE(mentions_all(error_message_of([] { parse_json(R"({"x": 1e400})", "cfg"); }),
                           {"cfg", "not valid JSON"}));
  EXPECT_TRUE(mentions_all(error_message_of([] { parse_json("-1e400", "cfg"); }), {"cfg"}));
}

TEST(JsonReader, NestingIsBounded) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_TRUE(mentions_all(error_message_of([&] { parse_json(deep, "cfg"); }),
                           {"cfg", "nests deeper than"}));
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_TRUE(
      mentions_all(error_message_of([&] { parse_json(objects, "cfg"); }), {"nests deeper than"}));
  // Just inside the bound parses.
  const int inside = kMaxJsonDepth;
  EXPECT_NO_THROW(parse_json(std::string(inside, '[') + std::string(inside, ']'), "cfg"));
  EXPECT_ANY_THROW(parse_json(std::string(inside + 1, '[') + std::string(inside + 1, ']'), "cfg"));
}

TEST(JsonReader, DuplicateKeysAreRefusedOnlyWhereAsked) {
  const std::string text = R"({"a": {"k": 1, "k": 2}, "b": {"k": 3}, "c": {"k": 4}})";
  EXPECT_EQ(parse_json(text, "x").at("a").at("k"), 2);
  EXPECT_NO_THROW(parse_json(text, "x", {.unique_keys_at_depth = 1}));
  EXPECT_TRUE(
      mentions_all(error_message_of([&] { parse_json(text, "x", {.unique_keys_at_depth = 2}); }),
                   {"'k'", "twice"}));
  // The same key in two sibling objects is not a duplicate.
  EXPECT_NO_THROW(
      parse_json(R"({"a": {"k": 1}, "b": {"k": 2}})", "x", {.unique_keys_at_depth = 2}));
}

TEST(JsonReader, SyntaxErrorsAndFoldersNameTheSource) {
  EXPECT_TRUE(mentions_all(error_message_of([] { parse_json("{", "cfg"); }), {"cfg"}));
  TempFolder folder("json-folder");
  EXPECT_TRUE(
      mentions_all(error_message_of([&] { read_json_file(folder.path(), "attention config"); }),
                   {"attention config", "a folder"}));
}

TEST(ModelConfigFile, HostileJsonEndsInAnError) {
  TempFolder folder("cfg-hostile");
  write_file_bytes(folder.file("config.json"), R"({"model_type": "llama", "unknown_key": 1e400})");
  EXPECT_TRUE(mentions_all(error_message_of([&] { load_hf_config(folder.file("config.json")); }),
                           {"config.json", "not valid JSON"}));
  write_file_bytes(folder.file("config.json"),
                   "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}");
  EXPECT_TRUE(mentions_all(error_message_of([&] { load_hf_config(folder.file("config.json")); }),
                           {"nests deeper than"}));
  EXPECT_TRUE(mentions_all(error_message_of([&] { load_hf_config(folder.path()); }), {"a folder"}));
}

}  // namespace
}  // namespace entropyinfer

// The RULER task generator must build the same prompts as training/tasks.py, byte for byte. The
// golden data is a subset of the manifest train.py wrote with the trained model's tokenizer
// (tests/fixtures/ruler): answers, prompt token count and the SHA-256 of every prompt. Set
// ENTROPYINFER_RULER_MANIFEST (and ENTROPYINFER_RULER_MODEL, the folder with tokenizer.json and
// task_words.json) to check a whole manifest instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/ruler_tasks.h"
#include "expect_error.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::eval {
namespace {

using ::entropyinfer::testing::asset_path;
using ::entropyinfer::testing::fixtures_dir;

// SHA-256 (FIPS 180-4), only to compare prompts with the manifest's hashes.
std::string sha256_hex(const std::string& message) {
  static constexpr std::array<uint32_t, 64> kRound = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
      0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
      0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
      0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
      0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
      0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
      0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
      0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
      0xc67178f2};
  std::array<uint32_t, 8> state = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotate = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  std::string padded = message;
  padded += static_cast<char>(0x80);
  while (padded.size() % 64 != 56) padded += '\0';
  const uint64_t bits = static_cast<uint64_t>(message.size()) * 8;
  for (int shift = 56; shift >= 0; shift -= 8) padded += static_cast<char>((bits >> shift) & 0xff);
  for (size_t block = 0; block < padded.size(); block += 64) {
    std::array<uint32_t, 64> w{};
    for (int t = 0; t < 16; ++t) {
      for (int b = 0; b < 4; ++b) {
        w[t] = (w[t] << 8) | static_cast<unsigned char>(padded[block + 4 * t + b]);
      }
    }
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = rotate(w[t - 15], 7) ^ rotate(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = rotate(w[t - 2], 17) ^ rotate(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = state;
    for (int t = 0; t < 64; ++t) {
      const uint32_t sum1 = rotate(e, 6) ^ rotate(e, 11) ^ rotate(e, 25);
      const uint32_t choose = (e & f) ^ (~e & g);
      const uint32_t t1 = h + sum1 + choose + kRound[t] + w[t];
      const uint32_t sum0 = rotate(a, 2) ^ rotate(a, 13) ^ rotate(a, 22);
      const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = sum0 + majority;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const std::array<uint32_t, 8> add = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) state[i] += add[i];
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint32_t word : state) {
    for (int shift = 28; shift >= 0; shift -= 4) hex += kHex[(word >> shift) & 0xf];
  }
  return hex;
}

std::string fixture_model_dir() { return fixtures_dir() + "/ruler"; }
std::string text_dir() { return asset_path("text"); }

#define REQUIRE_HAYSTACK() ENTROPYINFER_REQUIRE_ASSET("text/janeausten/persuasion.txt")

const Tokenizer& fixture_tokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(fixture_model_dir());
  return *tokenizer;
}

const RulerSources& fixture_sources(RulerWordSet words = RulerWordSet::kAll) {
  static const RulerSources all = load_ruler_sources(fixture_model_dir(), text_dir());
  static const RulerSources heldout =
      load_ruler_sources(fixture_model_dir(), text_dir(), RulerWordSet::kHeldout);
  return words == RulerWordSet::kAll ? all : heldout;
}

// Compares the samples a manifest lists with what the generator builds; returns the count checked.
int check_manifest(const std::string& manifest_path, const Tokenizer& tokenizer,
                   const RulerSources& all, const RulerSources& heldout) {
  std::ifstream stream(manifest_path);
  EXPECT_TRUE(stream.good()) << "cannot read " << manifest_path;
  int checked = 0;
  std::string line;
  while (std::getline(stream, line)) {
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line);
    const RulerTask task = parse_ruler_task(entry.at("task").get<std::string>());
    const RulerWordSet words = parse_ruler_word_set(entry.at("words").get<std::string>());
    const int length = entry.at("length").get<int>();
    const int index = entry.at("index").get<int>();
    const RulerSample sample = make_ruler_sample(task, length, index, 0, tokenizer,
                                                 words == RulerWordSet::kAll ? all : heldout);
    const std::string where = line.substr(0, 120);
    EXPECT_EQ(sample.seed, entry.at("seed").get<uint64_t>()) << where;
    EXPECT_EQ(sample.answers, entry.at("answers").get<std::vector<std::string>>()) << where;
    EXPECT_EQ(sample.prompt_tokens, entry.at("prompt_tokens").get<int>()) << where;
    EXPECT_EQ(sha256_hex(sample.prompt), entry.at("prompt_sha256").get<std::string>())
        << where << "\nprompt starts: " << sample.prompt.substr(0, 300)
        << "\nprompt ends: " << sample.prompt.substr(sample.prompt.size() - 300);
    EXPECT_LE(sample.prompt_tokens + sample.max_new_tokens, length) << where;
    ++checked;
  }
  return checked;
}

TEST(RulerTasks, Sha256KnownValues) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(RulerTasks, RandomNumbersAndSeedsMatchTheSpecification) {
  EXPECT_EQ(SplitMix64(0).next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(SplitMix64(1).next(), 0x910A2DEC89025CC1ULL);
  EXPECT_EQ(fnv1a64(""), 0xCBF29CE484222325ULL);
  EXPECT_EQ(fnv1a64("a"), 0xAF63DC4C8601EC8CULL);
  // The manifest's first entry: niah_single/16384/0 with base seed 0.
  EXPECT_EQ(ruler_sample_seed(0, RulerTask::kNiahSingle, 16384, 0), 5840307424409579782ULL);
  EXPECT_EQ(ruler_sample_seed(5, RulerTask::kNiahSingle, 16384, 0), 5840307424409579782ULL ^ 5);
}

TEST(RulerTasks, NamesRoundTripAndBadNamesAreErrors) {
  const std::vector<std::string> names = {
      "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"};
  ASSERT_EQ(all_ruler_tasks().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(ruler_task_name(all_ruler_tasks()[i]), names[i]);
    EXPECT_EQ(parse_ruler_task(names[i]), all_ruler_tasks()[i]);
  }
  testing::expect_error_naming([] { parse_ruler_task("niah_double"); },
                               {"niah_double", "niah_multiquery", "fwe"}, "an unknown task");
  EXPECT_EQ(parse_ruler_word_set("heldout"), RulerWordSet::kHeldout);
  EXPECT_THROW(parse_ruler_word_set("train"), Error);
  EXPECT_EQ(ruler_generation_tokens(RulerTask::kNiahSingle), 4);
  EXPECT_EQ(ruler_generation_tokens(RulerTask::kVariableTracking), 12);
  EXPECT_EQ(ruler_generation_tokens(RulerTask::kCommonWords), 24);
  EXPECT_EQ(ruler_generation_tokens(RulerTask::kFrequentWords), 8);
}

TEST(RulerTasks, WordListForm) {
  EXPECT_EQ(ruler_word_list({"a"}), " a");
  EXPECT_EQ(ruler_word_list({"a", "b"}), " a and b");
  EXPECT_EQ(ruler_word_list({"a", "b", "c"}), " a, b and c");
  EXPECT_EQ(ruler_word_list({"a", "b", "c", "d"}), " a, b, c and d");
}

TEST(RulerTasks, ScoringOnWholeWords) {
  const RulerTask task = RulerTask::kNiahMultivalue;
  EXPECT_DOUBLE_EQ(ruler_score(task, " apple, pear and plum.", {"apple", "plum"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(task, " pineapple", {"apple"}), 0.0);  // not a substring match
  EXPECT_DOUBLE_EQ(ruler_score(task, " Apple and PEAR", {"apple", "pear", "fig", "plum"}), 0.5);
  EXPECT_DOUBLE_EQ(ruler_score(RulerTask::kNiahSingle, " house.", {"house"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(RulerTask::kNiahSingle, "", {"house"}), 0.0);
  EXPECT_DOUBLE_EQ(ruler_score(RulerTask::kVariableTracking, " 42 x_y", {"42", "x", "y"}), 1.0);
  EXPECT_DOUBLE_EQ(ruler_score(task, " anything", {}), 0.0);
}

TEST(RulerTasks, MissingFilesAreErrors) {
  EXPECT_THROW(load_ruler_sources("/nonexistent/model", text_dir()), Error);
  testing::expect_error_naming([] { load_ruler_sources(fixture_model_dir(), "/nonexistent/text"); },
                               {"persuasion.txt"}, "a missing haystack");
}

TEST(RulerTasks, HeldoutPoolsAreEveryTenthWord) {
  REQUIRE_HAYSTACK();
  const RulerSources& all = fixture_sources();
  const RulerSources& heldout = fixture_sources(RulerWordSet::kHeldout);
  ASSERT_EQ(heldout.keys.size(), all.keys.size() / 10);
  for (size_t i = 0; i < heldout.keys.size(); ++i) EXPECT_EQ(heldout.keys[i], all.keys[10 * i + 9]);
  EXPECT_TRUE(std::is_sorted(all.list_words.begin(), all.list_words.end()));
  EXPECT_EQ(all.haystack_lines.front(), "Persuasion");
}

TEST(RulerTasks, MatchesTheManifestOfTasksPy) {
  REQUIRE_HAYSTACK();
  const int checked =
      check_manifest(fixture_model_dir() + "/eval_manifest_subset.jsonl", fixture_tokenizer(),
                     fixture_sources(), fixture_sources(RulerWordSet::kHeldout));
  EXPECT_EQ(checked, 24);
}

// The whole manifest of a trained model, when pointed at one (slow: every sample of every cell).
TEST(RulerTasks, MatchesAFullManifest) {
  const char* manifest = std::getenv("ENTROPYINFER_RULER_MANIFEST");
  const char* model = std::getenv("ENTROPYINFER_RULER_MODEL");
  if (manifest == nullptr || model == nullptr) {
    GTEST_SKIP() << "set ENTROPYINFER_RULER_MANIFEST and ENTROPYINFER_RULER_MODEL to check one";
  }
  REQUIRE_HAYSTACK();
  const auto tokenizer = load_tokenizer(model);
  const int checked = check_manifest(manifest, *tokenizer, load_ruler_sources(model, text_dir()),
                                     load_ruler_sources(model, text_dir(), RulerWordSet::kHeldout));
  std::cout << "[ measure ] " << checked << " manifest samples checked\n";
  EXPECT_GT(checked, 0);
}

TEST(RulerTasks, DeterministicAndSeedDependent) {
  REQUIRE_HAYSTACK();
  for (RulerTask task : all_ruler_tasks()) {
    SCOPED_TRACE(ruler_task_name(task));
    const auto first = make_ruler_samples(task, 1024, 2, 0, fixture_tokenizer(), fixture_sources());
    const auto again = make_ruler_samples(task, 1024, 2, 0, fixture_tokenizer(), fixture_sources());
    const auto other = make_ruler_samples(task, 1024, 2, 7, fixture_tokenizer(), fixture_sources());
    ASSERT_EQ(first.size(), 2u);
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(first[i].index, static_cast<int>(i));
      EXPECT_EQ(first[i].prompt, again[i].prompt);
      EXPECT_EQ(first[i].answers, again[i].answers);
      EXPECT_NE(first[i].prompt, other[i].prompt);
    }
    EXPECT_NE(first[0].prompt, first[1].prompt);
  }
}

// Every answer word is in the prompt where the task says, every prompt fits its budget and ends
// with the question, and the reference answer scores 1.
TEST(RulerTasks, AnswersAreInThePromptAndPromptsFit) {
  REQUIRE_HAYSTACK();
  for (RulerTask task : all_ruler_tasks()) {
    SCOPED_TRACE(ruler_task_name(task));
    for (const RulerSample& sample :
         make_ruler_samples(task, 2048, 3, 11, fixture_tokenizer(), fixture_sources())) {
      const std::string& prompt = sample.prompt;
      EXPECT_LE(sample.prompt_tokens + sample.max_new_tokens, 2048);
      EXPECT_GE(sample.prompt_tokens + sample.max_new_tokens, 2048 * 95 / 100);
      EXPECT_EQ(sample.prompt_tokens,
                1 + static_cast<int>(fixture_tokenizer().encode(prompt, EncodeOptions{}).size()));
      const bool plural = prompt.ends_with("They are");
      EXPECT_TRUE(plural || prompt.ends_with("It is")) << prompt.substr(prompt.size() - 80);
      ASSERT_FALSE(sample.answers.empty());
      // The sample names its question (the last line) and the needle lines of its haystack.
      EXPECT_EQ(sample.question, prompt.substr(prompt.rfind('\n') + 1));
      const bool list_task = task == RulerTask::kCommonWords || task == RulerTask::kFrequentWords;
      const size_t expected_needles = list_task                              ? 0
                                      : task == RulerTask::kNiahSingle       ? 1
                                      : task == RulerTask::kVariableTracking ? 5
                                                                             : 4;
      EXPECT_EQ(sample.needles.size(), expected_needles);
      for (const std::string& needle : sample.needles) {
        EXPECT_TRUE(prompt.starts_with(needle + "\n") ||
                    prompt.find("\n" + needle + "\n") != std::string::npos)
            << needle;
      }
      switch (task) {
        case RulerTask::kNiahSingle:
        case RulerTask::kNiahMultikey:
        case RulerTask::kNiahMultivalue:
          for (const std::string& value : sample.answers) {
            EXPECT_NE(prompt.find(" is " + value + ".\n"), std::string::npos) << value;
          }
          break;
        case RulerTask::kNiahMultiquery:
          EXPECT_EQ(sample.answers.size(), 4u);
          for (const std::string& value : sample.answers) {
            EXPECT_NE(prompt.find(" is " + value + ".\n"), std::string::npos) << value;
          }
          break;
        case RulerTask::kVariableTracking: {
          ASSERT_EQ(sample.answers.size(), 5u);
          size_t previous = 0;
          for (size_t i = 1; i < sample.answers.size(); ++i) {
            const size_t at =
                prompt.find("VAR " + sample.answers[i] + " = VAR " + sample.answers[i - 1] + "\n");
            ASSERT_NE(at, std::string::npos) << sample.answers[i];
            EXPECT_GT(at, previous);
            previous = at;
          }
          break;
        }
        case RulerTask::kCommonWords:
        case RulerTask::kFrequentWords: {
          EXPECT_EQ(sample.answers.size(), task == RulerTask::kCommonWords ? 10u : 3u);
          std::map<std::string, int> counts;
          std::string word;
          const std::string list = prompt.substr(0, prompt.rfind('\n'));
          for (char c : list + " ") {
            if (c == ' ' || c == '\n') {
              if (!word.empty()) ++counts[word];
              word.clear();
            } else {
              word += c;
            }
          }
          int least_answer_count = 1 << 30;
          for (const std::string& answer : sample.answers) {
            least_answer_count = std::min(least_answer_count, counts[answer]);
          }
          for (const auto& [other, count] : counts) {
            if (std::find(sample.answers.begin(), sample.answers.end(), other) ==
                sample.answers.end()) {
              EXPECT_LT(count, least_answer_count) << other;
            }
          }
          break;
        }
      }
      EXPECT_DOUBLE_EQ(ruler_score(task, ruler_word_list(sample.answers) + ".", sample.answers),
                       1.0);
    }
  }
}

// The noise haystack, for when no text is at hand: the same draws as with text (the same needles
// and questions), the noise line repeated around them, prompts that fit as any other; vt, which
// always uses it, does not change.
TEST(RulerTasks, NoiseHaystackKeepsTheDrawsAndFits) {
  REQUIRE_HAYSTACK();
  const RulerSources noise = load_ruler_noise_sources(fixture_model_dir());
  EXPECT_TRUE(noise.noise_haystack);
  EXPECT_FALSE(fixture_sources().noise_haystack);
  EXPECT_EQ(noise.keys, fixture_sources().keys);
  const std::string noise_line =
      "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
  for (RulerTask task : {RulerTask::kNiahSingle, RulerTask::kNiahMultikey,
                         RulerTask::kNiahMultivalue, RulerTask::kNiahMultiquery}) {
    SCOPED_TRACE(ruler_task_name(task));
    const auto text = make_ruler_samples(task, 2048, 2, 3, fixture_tokenizer(), fixture_sources());
    const auto plain = make_ruler_samples(task, 2048, 2, 3, fixture_tokenizer(), noise);
    for (size_t i = 0; i < text.size(); ++i) {
      const RulerSample& sample = plain[i];
      EXPECT_EQ(sample.answers, text[i].answers);
      EXPECT_EQ(sample.seed, text[i].seed);
      const size_t question_at = sample.prompt.rfind('\n') + 1;
      EXPECT_EQ(sample.prompt.substr(question_at),
                text[i].prompt.substr(text[i].prompt.rfind('\n') + 1));
      EXPECT_LE(sample.prompt_tokens + sample.max_new_tokens, 2048);
      EXPECT_GE(sample.prompt_tokens + sample.max_new_tokens, 2048 * 95 / 100);
      int needles = 0;
      int noise_lines = 0;
      std::istringstream lines(sample.prompt.substr(0, question_at - 1));
      std::string line;
      while (std::getline(lines, line)) {
        if (line.starts_with("The secret of ")) {
          ++needles;
        } else {
          EXPECT_EQ(line, noise_line);
          ++noise_lines;
        }
      }
      EXPECT_EQ(needles, task == RulerTask::kNiahSingle ? 1 : 4);
      EXPECT_GT(noise_lines, 40);
    }
  }
  const auto vt_text = make_ruler_samples(RulerTask::kVariableTracking, 1024, 1, 0,
                                          fixture_tokenizer(), fixture_sources());
  const auto vt_noise =
      make_ruler_samples(RulerTask::kVariableTracking, 1024, 1, 0, fixture_tokenizer(), noise);
  EXPECT_EQ(vt_noise[0].prompt, vt_text[0].prompt);
}

TEST(RulerTasks, TooShortALengthIsAnError) {
  REQUIRE_HAYSTACK();
  EXPECT_THROW(
      make_ruler_samples(RulerTask::kCommonWords, 64, 1, 0, fixture_tokenizer(), fixture_sources()),
      Error);
  EXPECT_THROW(
      make_ruler_samples(RulerTask::kNiahSingle, 0, 1, 0, fixture_tokenizer(), fixture_sources()),
      Error);
}

}  // namespace
}  // namespace entropyinfer::eval

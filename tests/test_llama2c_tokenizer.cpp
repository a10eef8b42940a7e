// llama2.c's tokenizer.bin: run.c's encode/decode rules on stories260K's tok512.bin and on Llama
// 2's tokenizer.bin, checked against run.c's own greedy output, against a direct transcription of
// run.c's quadratic merge loop, and against the SentencePiece encoder of the same vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace entropyinfer {
namespace {

using ::entropyinfer::testing::asset_path;
using ::entropyinfer::testing::read_file_bytes;

constexpr const char* kTok512 = "stories260K/tok512.bin";
constexpr const char* kLlama2Bin = "tokenizers/llama2/tokenizer.bin";
constexpr const char* kLlama2Model = "tokenizers/llama2/tokenizer.model";

const Llama2cTokenizer& as_llama2c(const Tokenizer& tokenizer) {
  return dynamic_cast<const Llama2cTokenizer&>(tokenizer);
}

// run.c's encode, transcribed as literally as C++ allows: the quadratic rescan of every pair after
// each merge. The fast encoder must agree with it token for token.
std::vector<int32_t> reference_encode(const Llama2cTokenizer& tokenizer, const std::string& text,
                                      bool bos) {
  const auto lookup = [&](const std::string& piece) -> int32_t {
    return tokenizer.find_text(piece).value_or(-1);
  };
  const auto stored_text = [&](int32_t id) { return tokenizer.entry(id).text; };
  std::vector<int32_t> tokens;
  if (bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(lookup(" "));
  std::string buffer;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buffer.clear();
    buffer += static_cast<char>(c);
    const unsigned char next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((next & 0xC0) == 0x80 && buffer.size() < 4) continue;
    const int32_t id = lookup(buffer);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (const char byte : buffer) tokens.push_back(static_cast<unsigned char>(byte) + 3);
    }
    buffer.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    int best_index = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int32_t id = lookup(stored_text(tokens[i]) + stored_text(tokens[i + 1]));
      if (id != -1 && tokenizer.score(id) > best_score) {
        best_score = tokenizer.score(id);
        best_id = id;
        best_index = static_cast<int>(i);
      }
    }
    if (best_index == -1) break;
    tokens[static_cast<size_t>(best_index)] = best_id;
    tokens.erase(tokens.begin() + best_index + 1);
  }
  return tokens;
}

std::vector<int32_t> read_ids(const std::string& path) {
  std::istringstream stream(read_file_bytes(path));
  std::vector<int32_t> ids;
  int32_t id = 0;
  while (stream >> id) ids.push_back(id);
  return ids;
}

class Tok512 : public ::testing::Test {
 protected:
  void SetUp() override {
    ENTROPYINFER_REQUIRE_ASSET(kTok512);
    tokenizer_ = load_llama2c_tokenizer(asset_path(kTok512), 512);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(Tok512, ReadsHeaderAndSpecialTokens) {
  EXPECT_EQ(tokenizer_->vocab_size(), 512);
  EXPECT_EQ(as_llama2c(*tokenizer_).max_token_length(), 7);
  EXPECT_TRUE(as_llama2c(*tokenizer_).words_are_independent());
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tokenizer_->token_id("<s>"), 1);
  EXPECT_EQ(tokenizer_->token_id("</s>"), 2);
  EXPECT_EQ(tokenizer_->token_bytes(3 + 'A'), "A");  // byte token <0x41>
  EXPECT_EQ(tokenizer_->token_bytes(13), "\n");
  EXPECT_THROW(tokenizer_->token_bytes(512), Error);
}

TEST_F(Tok512, ReadingToEndOfFileFindsTheSameVocabulary) {
  const auto whole = load_llama2c_tokenizer(asset_path(kTok512), -1);
  EXPECT_EQ(whole->vocab_size(), 512);
}

TEST_F(Tok512, GreedyIdsDecodeToRunCOutput) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/greedy_token_ids_n256.txt");
  const auto ids = read_ids(asset_path("stories260K/greedy_token_ids_n256.txt"));
  ASSERT_EQ(ids.size(), 257u);
  ASSERT_EQ(ids.front(), 1);
  std::string expected = read_file_bytes(asset_path("stories260K/expected_greedy_n256.txt"));
  // run.c ends its output with a newline of its own.
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(expected.back(), '\n');
  expected.pop_back();
  // run.c printed every id after BOS; BOS itself is not text.
  EXPECT_EQ(tokenizer_->decode(ids), expected);
  // The first words, token by token.
  EXPECT_EQ(tokenizer_->decode({1, 403, 407, 261, 378}), expected.substr(0, 16));
}

TEST_F(Tok512, ExpectedTextRoundTrips) {
  for (const char* file :
       {"stories260K/expected_greedy_n256.txt", "stories260K/expected_t1.0_p0.9_s133742.txt"}) {
    ENTROPYINFER_REQUIRE_ASSET(file);
    const std::string text = read_file_bytes(asset_path(file));
    const auto ids = tokenizer_->encode(text, {.add_bos = true});
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), 1);
    EXPECT_EQ(tokenizer_->decode(ids), text);
    EXPECT_EQ(ids, reference_encode(as_llama2c(*tokenizer_), text, true));
  }
}

TEST_F(Tok512, GreedyPrefixEncodesToTheGeneratedIds) {
  // The model generated "Once upon a time, there was a little girl named Lily." with the canonical
  // tokenization, so encoding that text gives the same ids.
  const auto ids = read_ids(asset_path("stories260K/greedy_token_ids_n256.txt"));
  const std::string expected = read_file_bytes(asset_path("stories260K/expected_greedy_n256.txt"));
  const std::string first_sentence = expected.substr(0, expected.find('.') + 1);
  const auto encoded = tokenizer_->encode(first_sentence, {.add_bos = true});
  ASSERT_LE(encoded.size(), ids.size());
  EXPECT_EQ(encoded, std::vector<int32_t>(ids.begin(), ids.begin() + encoded.size()));
  EXPECT_EQ(tokenizer_->decode(encoded), first_sentence);
}

TEST_F(Tok512, BytesFallBackForCharactersOutsideTheVocabulary) {
  // "中" is not a token of this 512-entry vocabulary: its three bytes become tokens byte + 3 after
  // the dummy-prefix space.
  ASSERT_FALSE(tokenizer_->token_id("\xE4\xB8\xAD"));
  const auto ids = tokenizer_->encode("\xE4\xB8\xAD", {});
  EXPECT_EQ(ids, (std::vector<int32_t>{*tokenizer_->token_id(" "), 0xE4 + 3, 0xB8 + 3, 0xAD + 3}));
  EXPECT_EQ(tokenizer_->decode(ids), "\xE4\xB8\xAD");
}

TEST_F(Tok512, EncodeOptionsAndEos) {
  EXPECT_TRUE(tokenizer_->encode("", {}).empty());
  EXPECT_EQ(tokenizer_->encode("", {.add_bos = true}), std::vector<int32_t>{1});
  const auto with_eos = as_llama2c(*tokenizer_).encode("Hi", true, true);
  EXPECT_EQ(with_eos.front(), 1);
  EXPECT_EQ(with_eos.back(), 2);
  // Decoding: a leading space is dropped right after BOS only.
  const auto ids = tokenizer_->encode("Hi there", {});
  std::vector<int32_t> twice = {1};
  twice.insert(twice.end(), ids.begin(), ids.end());
  twice.push_back(1);
  twice.insert(twice.end(), ids.begin(), ids.end());
  EXPECT_EQ(tokenizer_->decode(twice), "Hi thereHi there");
}

TEST_F(Tok512, FastMergeMatchesRunCOnRandomText) {
  // Random mixes of common fragments, spaces, newlines, multi-byte and invalid UTF-8.
  const std::vector<std::string> fragments = {
      "the",  " ",        "  ",           "a",
      "e",    "Lily",     "\n",           "ing",
      ".",    "\xC3\xA9", "\xE2\x80\x8A", "\xF0\x9F\xA6\x99",
      "\x80", "\xC3",     "tt",           "ed",
      "!"};
  std::mt19937 generator(42);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int length = static_cast<int>(generator() % 40);
    for (int i = 0; i < length; ++i) text += fragments[generator() % fragments.size()];
    const bool bos = (trial % 2) == 0;
    ASSERT_EQ(as_llama2c(*tokenizer_).encode(text, bos, false),
              reference_encode(as_llama2c(*tokenizer_), text, bos))
        << "text: '" << text << "'";
  }
}

class Llama2Bin : public ::testing::Test {
 protected:
  void SetUp() override {
    ENTROPYINFER_REQUIRE_ASSET(kLlama2Bin);
    tokenizer_ = load_llama2c_tokenizer(asset_path(kLlama2Bin), 32000);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(Llama2Bin, EncodesSentencesLikeRunC) {
  // Prompts from Meta's Llama 2 examples.
  EXPECT_EQ(tokenizer_->encode("I believe the meaning of life is", {.add_bos = true}),
            (std::vector<int32_t>{1, 306, 4658, 278, 6593, 310, 2834, 338}));
  EXPECT_EQ(tokenizer_->encode("Hello world", {.add_bos = true}),
            (std::vector<int32_t>{1, 15043, 3186}));
  const std::string text =
      "Simply put, the theory of relativity states that \nA brief message:\n\n        Hi "
      "everyone, peppermint => menthe poivr\xC3\xA9"
      "e \xF0\x9F\xA6\x99";
  const auto ids = tokenizer_->encode(text, {.add_bos = true});
  EXPECT_EQ(ids, reference_encode(as_llama2c(*tokenizer_), text, true));
  EXPECT_EQ(tokenizer_->decode(ids), text);
}

TEST_F(Llama2Bin, LongTextMatchesRunCAndSentencePiece) {
  ENTROPYINFER_REQUIRE_ASSET("text/kjv/kjv_bible.txt");
  ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
  EXPECT_TRUE(as_llama2c(*tokenizer_).words_are_independent());
  const std::string bible = read_file_bytes(asset_path("text/kjv/kjv_bible.txt"));
  // run.c's quadratic loop is affordable on a short stretch only.
  const std::string excerpt = bible.substr(100000, 1500);
  EXPECT_EQ(tokenizer_->encode(excerpt, {.add_bos = true}),
            reference_encode(as_llama2c(*tokenizer_), excerpt, true));
  const std::string long_text = bible.substr(0, 300000);
  const auto sentencepiece = load_sentencepiece_tokenizer(asset_path(kLlama2Model));
  const auto ids = tokenizer_->encode(long_text, {});
  EXPECT_EQ(ids, sentencepiece->encode(long_text, {}));
  EXPECT_EQ(tokenizer_->decode(ids), long_text);
}

TEST(Llama2cSynthetic, TokenAcrossASpaceIsStillFound) {
  // A vocabulary where "a b" is a token: words cannot be merged one at a time.
  std::vector<Llama2cTokenizer::Entry> vocab = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(byte));
    vocab.push_back({name, 0});
  }
  const int32_t space = static_cast<int32_t>(vocab.size());
  vocab.push_back({" ", -1});
  vocab.push_back({"a", -1});
  vocab.push_back({"b", -1});
  vocab.push_back({"a ", -2});
  const int32_t joined = static_cast<int32_t>(vocab.size());
  vocab.push_back({"a b", -3});
  vocab.push_back({" a", -9});
  const Llama2cTokenizer tokenizer(vocab, 3, "synthetic");
  EXPECT_FALSE(tokenizer.words_are_independent());
  EXPECT_EQ(tokenizer.encode("a b", false, false), (std::vector<int32_t>{space, joined}));
  EXPECT_EQ(tokenizer.encode("a b", false, false), reference_encode(tokenizer, "a b", false));
}

TEST_F(Llama2Bin, AgreesWithSentencePieceOnTheVectorCases) {
  // run.c's algorithm is SentencePiece BPE over the same vocabulary, so on the llama-spm vectors it
  // gives Hugging Face's ids too.
  ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
  const auto sentencepiece = load_sentencepiece_tokenizer(asset_path(kLlama2Model));
  const std::string input =
      read_file_bytes(asset_path("tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp"));
  const std::string separator = "\n__ggml_vocab_test__\n";
  int checked = 0;
  for (size_t start = 0, end; (end = input.find(separator, start)) != std::string::npos;
       start = end + separator.size()) {
    const std::string text = input.substr(start, end - start);
    EXPECT_EQ(tokenizer_->encode(text, {}), sentencepiece->encode(text, {})) << text;
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(text, {})), text);
    ++checked;
  }
  EXPECT_EQ(checked, 46);
}

// --- bad input ---

void expect_error_mentioning(const std::string& path, int vocab_size, const std::string& fragment) {
  try {
    load_llama2c_tokenizer(path, vocab_size);
    ADD_FAILURE() << "no Error for " << path;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message: " << error.what();
  }
}

TEST(Llama2cErrors, MissingFile) {
  expect_error_mentioning("/nonexistent/tokenizer.bin", 512, "/nonexistent/tokenizer.bin");
}

TEST(Llama2cErrors, TruncatedFile) {
  ENTROPYINFER_REQUIRE_ASSET(kTok512);
  const std::string bytes = read_file_bytes(asset_path(kTok512));
  for (const size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{6}, size_t{2}, size_t{0}}) {
    const std::string path = testing::temp_file("l2c", "cut.bin", bytes.substr(0, cut));
    expect_error_mentioning(path, 512, path);
    expect_error_mentioning(path, -1, path);
  }
  // Whole entries missing: the model expects more tokens than the file holds.
  const std::string path = testing::temp_file("l2c", "short.bin", bytes);
  expect_error_mentioning(path, 1000, "holds only 512 tokens");
}

TEST(Llama2cErrors, CorruptLengths) {
  ENTROPYINFER_REQUIRE_ASSET(kTok512);
  std::string bytes = read_file_bytes(asset_path(kTok512));
  // The first entry's length field (after the 4-byte header and 4-byte score) becomes -5.
  const int32_t negative = -5;
  std::memcpy(&bytes[8], &negative, 4);
  const std::string path = testing::temp_file("l2c", "negative.bin", bytes);
  expect_error_mentioning(path, 512, "invalid length -5");
}

TEST(Llama2cErrors, RandomBytesAndWrongFiles) {
  std::mt19937 generator(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(2048, '\0');
    for (char& byte : bytes) byte = static_cast<char>(generator() & 0xFF);
    const std::string path = testing::temp_file("l2c", "random.bin", bytes);
    expect_error_mentioning(path, 512, path);
  }
  ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
  expect_error_mentioning(asset_path(kLlama2Model), 32000, asset_path(kLlama2Model));
}

TEST(Llama2cErrors, InvalidVocabularySizeArgument) {
  // Refused before the file is read, so it needs no file that exists.
  expect_error_mentioning(asset_path(kTok512), 0, "invalid vocabulary size");
  ENTROPYINFER_REQUIRE_ASSET(kTok512);
  expect_error_mentioning(asset_path(kTok512), 100, "at least 259");
}

}  // namespace
}  // namespace entropyinfer

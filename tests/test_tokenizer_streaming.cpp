// StreamingDecoder: ids pushed one at a time give exactly the whole-sequence decode, and every
// piece it returns is valid UTF-8 even when a character's bytes are spread over several tokens.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "test_support.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;
using ::entropyinfer::testing::asset_path;

// Strict UTF-8 validation, written independently of the decoder under test.
bool is_valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    char32_t value = 0;
    if (lead < 0x80) {
      length = 1;
      value = lead;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2;
      value = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      value = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      value = lead & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const auto byte = static_cast<unsigned char>(text[i + k]);
      if ((byte & 0xC0) != 0x80) return false;
      value = (value << 6) | (byte & 0x3F);
    }
    const char32_t minimum[] = {0, 0, 0x80, 0x800, 0x10000};
    if (value < minimum[length] || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF))
      return false;
    i += length;
  }
  return true;
}

// Streams `ids` through a fresh decoder; every piece must be valid UTF-8.
std::string stream_all(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                       std::vector<std::string>* pieces = nullptr) {
  StreamingDecoder decoder(tokenizer);
  std::string text;
  for (int32_t id : ids) {
    const std::string piece = decoder.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "invalid UTF-8 after id " << id;
    if (pieces) pieces->push_back(piece);
    text += piece;
  }
  const std::string tail = decoder.flush();
  EXPECT_TRUE(is_valid_utf8(tail));
  return text + tail;
}

// A byte-level tokenizer of the 256 single bytes plus a few multi-byte tokens that end in the
// middle of a character, with no assets needed.
std::unique_ptr<Tokenizer> byte_tokenizer() {
  BpeTokenizer::Definition definition;
  for (int byte = 0; byte < 256; ++byte)
    definition.token_bytes.emplace_back(1, static_cast<char>(byte));
  definition.token_bytes.push_back("a\xE4");             // 256: 'a' + first byte of 中
  definition.token_bytes.push_back("\xB8\xAD\xF0\x9F");  // 257: rest of 中 + half of 😀
  definition.merges = {{'a', 0xE4, 256, 0}};
  definition.source_name = "synthetic";
  return std::make_unique<BpeTokenizer>(std::move(definition));
}

std::vector<int32_t> byte_ids(std::string_view text) {
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

TEST(StreamingDecoder, HoldsBackPartialCharacters) {
  const auto tokenizer = byte_tokenizer();
  StreamingDecoder decoder(*tokenizer);
  // 😀 is F0 9F 98 80: nothing comes out until its last byte.
  EXPECT_EQ(decoder.push(0xF0), "");
  EXPECT_EQ(decoder.push(0x9F), "");
  EXPECT_EQ(decoder.push(0x98), "");
  EXPECT_EQ(decoder.push(0x80), "\xF0\x9F\x98\x80");
  // A token ending inside a character releases only the complete part.
  EXPECT_EQ(decoder.push(256), "a");
  EXPECT_EQ(decoder.push(257), "\xE4\xB8\xAD");
  EXPECT_EQ(decoder.push(0x98), "");
  EXPECT_EQ(decoder.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StreamingDecoder, ByteByByteEqualsDecode) {
  const auto tokenizer = byte_tokenizer();
  const std::string text =
      "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\xE2\x9D\xA4\xEF\xB8\x8F end";
  const std::vector<int32_t> ids = byte_ids(text);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(*tokenizer, ids, &pieces), tokenizer->decode(ids));
  EXPECT_EQ(tokenizer->decode(ids), text);
  // Some pushes had to hold everything back.
  EXPECT_GT(std::count(pieces.begin(), pieces.end(), std::string()), 5);
}

TEST(StreamingDecoder, InvalidBytesBecomeReplacementCharacters) {
  const auto tokenizer = byte_tokenizer();
  StreamingDecoder decoder(*tokenizer);
  EXPECT_EQ(decoder.push(0xFF), "\xEF\xBF\xBD");  // can never start a character: out at once
  EXPECT_EQ(decoder.push(0xE4), "");
  EXPECT_EQ(decoder.push(0xB8), "");
  EXPECT_EQ(decoder.push('a'),
            "\xEF\xBF\xBD"
            "a");                                 // the broken E4 B8 is one U+FFFD, then 'a'
  EXPECT_EQ(decoder.push(0x80), "\xEF\xBF\xBD");  // stray continuation byte
  EXPECT_EQ(decoder.push(0xF0), "");
  EXPECT_EQ(decoder.push(0x9F), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");  // truncated at the end of the stream
  EXPECT_EQ(decoder.push('b'), "b");           // and the decoder is usable again
}

// A tokenizer whose decode() drops the leading space of the first token, as SentencePiece's does.
class LeadingSpaceTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
  std::string token_bytes(int32_t id) const override {
    return pieces_.at(static_cast<std::size_t>(id));
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_id() const override { return 0; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    bool first_text = true;
    for (int32_t id : ids) {
      std::string piece = token_bytes(id);
      if (id == 0) continue;  // BOS decodes to nothing
      if (first_text && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      first_text = false;
      text += piece;
    }
    return text;
  }

 private:
  std::vector<std::string> pieces_ = {"<s>", " Hello", " world", "!", " \xE4\xB8", "\xAD"};
};

TEST(StreamingDecoder, FollowsTheTokenizersOwnDecodeRules) {
  const LeadingSpaceTokenizer tokenizer;
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 1};
  EXPECT_EQ(tokenizer.decode(ids), "Hello world! \xE4\xB8\xAD Hello");
  EXPECT_EQ(stream_all(tokenizer, ids), tokenizer.decode(ids));
  // Long streams keep only a short context, and stay exact.
  std::vector<int32_t> long_ids = {0};
  for (int i = 0; i < 100; ++i) long_ids.insert(long_ids.end(), {1, 2, 4, 5, 3});
  EXPECT_EQ(stream_all(tokenizer, long_ids), tokenizer.decode(long_ids));
}

// Texts whose characters the real vocabularies split over several tokens.
const std::string kHardText =
    "Emoji \xF0\x9F\xAB\xA0\xF0\x9F\xA6\x99 "
    "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D"
    "\xF0\x9F\x91\xA7 \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5, CJK \xE9\xBE\x98\xE7\xBA\x9B\xE9\xBD\x89"
    "\xE7\x88\xA8 \xEA\xB0\x81\xEB\x98\xA0, \xE1\x9E\x80\xE1\x9E\xB6 and "
    "\xF0\x90\x8C\xB0\xF0\x90\x8C\xB1.";

void expect_streaming_matches(const Tokenizer& tokenizer) {
  const std::vector<int32_t> ids = tokenizer.encode(kHardText, EncodeOptions{});
  // The test only means something if some token is not a whole character on its own.
  bool split_character = false;
  for (int32_t id : ids)
    split_character = split_character || !is_valid_utf8(tokenizer.token_bytes(id));
  EXPECT_TRUE(split_character);
  EXPECT_EQ(tokenizer.decode(ids), kHardText);
  EXPECT_EQ(stream_all(tokenizer, ids), kHardText);
}

TEST(StreamingDecoder, Llama3SplitsEmojiAndCjkAcrossTokens) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  const auto tokenizer = load_tokenizer(asset_path("tokenizers/llama3/tokenizer.model"));
  expect_streaming_matches(*tokenizer);
}

TEST(StreamingDecoder, QwenSplitsEmojiAndCjkAcrossTokens) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/qwen/qwen.tiktoken");
  const auto tokenizer = load_tokenizer(asset_path("tokenizers/qwen/qwen.tiktoken"));
  expect_streaming_matches(*tokenizer);
}

TEST(StreamingDecoder, Llama2cTokenizerMatchesItsDecode) {
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  const auto tokenizer = load_llama2c_tokenizer(asset_path("stories260K/tok512.bin"), 512);
  const std::vector<int32_t> ids = tokenizer->encode(
      "Once upon a time, Lily saw a \xE4\xB8\xAD bird.", {.add_bos = true, .parse_special = false});
  ASSERT_GT(ids.size(), 5u);
  EXPECT_EQ(stream_all(*tokenizer, ids), tokenizer->decode(ids));
}

}  // namespace
}  // namespace entropyinfer

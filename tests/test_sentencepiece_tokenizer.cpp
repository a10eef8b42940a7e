// SentencePiece BPE: the llama-spm vectors (ids produced by Hugging Face's LlamaTokenizer),
// Mistral's reference tokenizations of chat requests, a synthetic model for the merge rules, and
// corrupt files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace entropyinfer {
namespace {

using ::entropyinfer::testing::asset_path;
using ::entropyinfer::testing::read_file_bytes;

constexpr const char* kLlama2Model = "tokenizers/llama2/tokenizer.model";
constexpr const char* kSpmVectorsInput = "tokenizer-vectors/ggml-vocab-llama-spm.gguf.inp";
constexpr const char* kSpmVectorsOutput = "tokenizer-vectors/ggml-vocab-llama-spm.gguf.out";

struct VectorCase {
  std::string text;
  std::vector<int32_t> ids;
};

// The .inp file is "text\n__ggml_vocab_test__\n" repeated: the newline before each separator line
// belongs to the separator (the first case, "ied 4 ½ months", has no newline token in the .out
// file, and the case holding one "\n" encodes to "▁" + <0x0A>). The .out file has one line of ids
// per case.
std::vector<VectorCase> load_vector_cases(const std::string& input_path,
                                          const std::string& output_path) {
  const std::string input = read_file_bytes(input_path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<VectorCase> cases;
  size_t start = 0;
  while (start < input.size()) {
    const size_t end = input.find(separator, start);
    if (end == std::string::npos) break;
    cases.push_back({input.substr(start, end - start), {}});
    start = end + separator.size();
  }
  std::istringstream output(read_file_bytes(output_path));
  std::string line;
  size_t index = 0;
  while (std::getline(output, line)) {
    if (index >= cases.size()) {
      ADD_FAILURE() << "more id lines than cases";
      break;
    }
    std::istringstream numbers(line);
    int32_t id = 0;
    while (numbers >> id) cases[index].ids.push_back(id);
    ++index;
  }
  EXPECT_EQ(index, cases.size()) << "the .out file should have one line per case";
  return cases;
}

std::vector<int32_t> load_token_list(const std::string& path) {
  const nlohmann::json document = nlohmann::json::parse(read_file_bytes(path));
  return document.at("tokens").get<std::vector<int32_t>>();
}

// Renders a reference tokenization written as pieces back to text: ▁ is a space and <0xNN> a byte.
// The ▁ that opens a text run after a control token is the encoder's dummy prefix, not text, so it
// is dropped there.
std::string pieces_to_text(const std::string& pieces) {
  static const char* const kControlTokens[] = {"<s>",
                                               "</s>",
                                               "[INST]",
                                               "[/INST]",
                                               "[TOOL_CALLS]",
                                               "[AVAILABLE_TOOLS]",
                                               "[/AVAILABLE_TOOLS]",
                                               "[TOOL_RESULTS]",
                                               "[/TOOL_RESULTS]"};
  const std::string space_marker = "\xE2\x96\x81";
  std::string text;
  for (size_t i = 0; i < pieces.size();) {
    bool control = false;
    for (const char* token : kControlTokens) {
      const size_t length = std::strlen(token);
      if (pieces.compare(i, length, token) == 0) {
        text.append(token, length);
        i += length;
        if (pieces.compare(i, 3, space_marker) == 0) i += 3;
        control = true;
        break;
      }
    }
    if (control) continue;
    if (pieces.compare(i, 3, space_marker) == 0) {
      text += ' ';
      i += 3;
    } else if (pieces.compare(i, 3, "<0x") == 0 && i + 6 <= pieces.size() && pieces[i + 5] == '>') {
      text += static_cast<char>(std::stoi(pieces.substr(i + 3, 2), nullptr, 16));
      i += 6;
    } else {
      text += pieces[i++];
    }
  }
  return text;
}

// --- a tiny protobuf writer for synthetic models ---

std::string varint(uint64_t value) {
  std::string out;
  do {
    uint8_t byte = value & 0x7F;
    value >>= 7;
    if (value != 0) byte |= 0x80;
    out += static_cast<char>(byte);
  } while (value != 0);
  return out;
}
std::string field_bytes(uint32_t field, const std::string& bytes) {
  return varint((field << 3) | 2) + varint(bytes.size()) + bytes;
}
std::string field_varint(uint32_t field, int64_t value) {
  return varint(field << 3) + varint(static_cast<uint64_t>(value));
}
std::string field_float(uint32_t field, float value) {
  std::string out = varint((field << 3) | 5);
  char raw[4];
  std::memcpy(raw, &value, 4);
  return out + std::string(raw, 4);
}
std::string piece_message(const std::string& text, float score, int type) {
  return field_bytes(1, field_bytes(1, text) + field_float(2, score) + field_varint(3, type));
}
// pieces: <unk>, <s>, </s>, then the given normal pieces; BPE, byte fallback off.
std::string synthetic_model(const std::vector<std::pair<std::string, float>>& normal_pieces,
                            int model_type = 2, const std::string& extra_pieces = "") {
  std::string model =
      piece_message("<unk>", 0, 2) + piece_message("<s>", 0, 3) + piece_message("</s>", 0, 3);
  for (const auto& [text, score] : normal_pieces) model += piece_message(text, score, 1);
  model += extra_pieces;
  model += field_bytes(2, field_varint(3, model_type));
  model += field_bytes(3, field_varint(3, 1) + field_varint(4, 0) + field_varint(5, 1));
  return model;
}

class LlamaSentencePiece : public ::testing::Test {
 protected:
  void SetUp() override {
    ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
    tokenizer_ = load_sentencepiece_tokenizer(asset_path(kLlama2Model));
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(LlamaSentencePiece, ReadsVocabularyAndSpecialIds) {
  EXPECT_EQ(tokenizer_->vocab_size(), 32000);
  // Llama 2's pieces never join a character to a following space: words are segmented separately.
  EXPECT_TRUE(dynamic_cast<const SentencePieceTokenizer&>(*tokenizer_).words_are_independent());
  EXPECT_EQ(tokenizer_->bos_id(), 1);
  EXPECT_EQ(tokenizer_->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tokenizer_->token_id("<s>"), 1);
  EXPECT_EQ(tokenizer_->token_id("<0x0A>"), 13);
  EXPECT_EQ(tokenizer_->token_id("\xE2\x96\x81Hello"), 15043);
  EXPECT_FALSE(tokenizer_->token_id("no such piece at all"));
  EXPECT_EQ(tokenizer_->token_bytes(13), "\n");
  EXPECT_EQ(tokenizer_->token_bytes(15043), " Hello");
  EXPECT_EQ(tokenizer_->token_bytes(2), "</s>");
  EXPECT_THROW(tokenizer_->token_bytes(32000), Error);
  EXPECT_THROW(tokenizer_->token_bytes(-1), Error);
}

TEST_F(LlamaSentencePiece, MatchesHuggingFaceOnAllVectorCases) {
  ENTROPYINFER_REQUIRE_ASSET(kSpmVectorsInput);
  const auto cases = load_vector_cases(asset_path(kSpmVectorsInput), asset_path(kSpmVectorsOutput));
  ASSERT_EQ(cases.size(), 46u);
  for (const VectorCase& test_case : cases) {
    EXPECT_EQ(tokenizer_->encode(test_case.text, {}), test_case.ids)
        << "text: '" << test_case.text << "'";
  }
}

TEST_F(LlamaSentencePiece, DecodeInvertsEncodeOnAllVectorCases) {
  ENTROPYINFER_REQUIRE_ASSET(kSpmVectorsInput);
  const auto cases = load_vector_cases(asset_path(kSpmVectorsInput), asset_path(kSpmVectorsOutput));
  for (const VectorCase& test_case : cases) {
    EXPECT_EQ(tokenizer_->decode(test_case.ids), test_case.text);
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(test_case.text, {})), test_case.text);
  }
}

TEST_F(LlamaSentencePiece, BosAndSpecialTokens) {
  EXPECT_EQ(tokenizer_->encode("Hello world", {.add_bos = true}),
            (std::vector<int32_t>{1, 15043, 3186}));
  // Control pieces are matched in the text only with parse_special; each text run after one gets
  // its own dummy prefix.
  EXPECT_EQ(tokenizer_->encode("<s>Hello world</s>", {.parse_special = true}),
            (std::vector<int32_t>{1, 15043, 3186, 2}));
  const auto literal = tokenizer_->encode("<s>Hello", {});
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 1), 0);
  EXPECT_EQ(tokenizer_->decode(literal), "<s>Hello");
  // Decoding drops the dummy-prefix space of the first text token after leading control tokens.
  EXPECT_EQ(tokenizer_->decode({1, 15043, 3186, 2}), "<s>Hello world</s>");
}

TEST_F(LlamaSentencePiece, InvalidUtf8BecomesReplacementCharacter) {
  // SentencePiece's normaliser maps each invalid byte to U+FFFD before segmenting.
  EXPECT_EQ(tokenizer_->encode("a\xFF"
                               "b",
                               {}),
            tokenizer_->encode("a\xEF\xBF\xBD"
                               "b",
                               {}));
  EXPECT_EQ(tokenizer_->encode("\xE2\x96", {}), tokenizer_->encode("\xEF\xBF\xBD\xEF\xBF\xBD", {}));
}

TEST_F(LlamaSentencePiece, ArbitraryBytesEncodeToValidIds) {
  std::mt19937 generator(99);
  const std::string alphabet[] = {"<s>",      "</s>",
                                  " ",        "  ",
                                  "\n",       "a",
                                  "\xFF",     "\xE2\x96\x81",
                                  "\xE2\x96", "\xF0\x9F\xA6\x99",
                                  "\x80",     "<0x0A>",
                                  "\0"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int i = static_cast<int>(generator() % 30); i > 0; --i) {
      text += alphabet[generator() % std::size(alphabet)];
    }
    for (const bool parse_special : {false, true}) {
      const auto ids = tokenizer_->encode(text, {.parse_special = parse_special});
      for (const int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 32000);
      EXPECT_NO_THROW(tokenizer_->decode(ids));
    }
  }
}

TEST_F(LlamaSentencePiece, EmptyAndWhitespaceOnlyText) {
  EXPECT_TRUE(tokenizer_->encode("", {}).empty());
  EXPECT_EQ(tokenizer_->encode("", {.add_bos = true}), std::vector<int32_t>{1});
  EXPECT_EQ(tokenizer_->decode({}), "");
}

TEST_F(LlamaSentencePiece, LongTextEncodesAndRoundTrips) {
  ENTROPYINFER_REQUIRE_ASSET("text/janeausten");
  std::string text;
  for (const auto& entry : std::filesystem::directory_iterator(asset_path("text/janeausten"))) {
    text = read_file_bytes(entry.path().string()).substr(0, 200000);
    break;
  }
  ASSERT_FALSE(text.empty());
  const auto ids = tokenizer_->encode(text, {});
  EXPECT_GT(ids.size(), text.size() / 8);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tokenizer_->decode(ids), text);
}

struct MistralVersion {
  const char* suffix;  // tokens_<suffix>.json / text_<suffix>.txt
  const char* model;   // tokenizer file
  ChatFormat chat_format;
};

const MistralVersion kMistralVersions[] = {
    {"v1", "tokenizers/mistral/tokenizer.model.v1", ChatFormat::kMistralV1},
    {"v2", "tokenizers/mistral/mistral_instruct_tokenizer_240216.model.v2", ChatFormat::kMistral},
    {"v3", "tokenizers/mistral/mistral_instruct_tokenizer_240323.model.v3", ChatFormat::kMistral},
};

TEST(MistralSentencePiece, ChatRequestWithoutToolsMatchesReferenceIds) {
  const std::string sample_dir = "tokenizers/mistral/samples/no_tools/";
  for (const MistralVersion& version : kMistralVersions) {
    SCOPED_TRACE(version.suffix);
    ENTROPYINFER_REQUIRE_ASSET(version.model);
    const auto tokenizer = load_sentencepiece_tokenizer(asset_path(version.model));
    const nlohmann::json sample =
        nlohmann::json::parse(read_file_bytes(asset_path(sample_dir + "sample.json")));
    std::vector<ChatMessage> messages;
    for (const auto& message : sample.at("messages")) {
      messages.push_back({message.at("role"), message.at("content")});
    }
    // The style picked from the tokenizer is the one the test expects.
    const ChatStyle style =
        adapt_chat_style_to_tokenizer(chat_style_from_name("mistral"), *tokenizer);
    EXPECT_EQ(style.format, version.chat_format);
    const std::string prompt = format_chat(style, messages);
    const auto expected =
        load_token_list(asset_path(sample_dir + "tokens_" + version.suffix + ".json"));
    EXPECT_EQ(tokenizer->encode(prompt, {.parse_special = true}), expected) << prompt;

    // Each plain-text message on its own, as the reference encodes it, appears in the ids.
    for (const ChatMessage& message : messages) {
      const auto part = tokenizer->encode(message.content, {});
      EXPECT_NE(std::search(expected.begin(), expected.end(), part.begin(), part.end()),
                expected.end())
          << message.content;
    }
  }
}

TEST(MistralSentencePiece, WholeToolRequestFromReferencePieces) {
  // text_vN.txt shows the reference tokenization as pieces. Turned back into text, with control
  // tokens such as [AVAILABLE_TOOLS] and [TOOL_CALLS] parsed as specials, it must encode to the
  // reference ids: this covers the tool-call JSON, newlines and control tokens of v2 and v3.
  for (const MistralVersion& version : kMistralVersions) {
    SCOPED_TRACE(version.suffix);
    const std::string dir = "tokenizers/mistral/samples/get_weather_full/";
    const std::string text_file = dir + "text_" + version.suffix + ".txt";
    if (!std::filesystem::exists(asset_path(text_file))) continue;  // no tool request for v1
    ENTROPYINFER_REQUIRE_ASSET(version.model);
    const auto tokenizer = load_sentencepiece_tokenizer(asset_path(version.model));
    const std::string text = pieces_to_text(read_file_bytes(asset_path(text_file)));
    const auto expected = load_token_list(asset_path(dir + "tokens_" + version.suffix + ".json"));
    EXPECT_EQ(tokenizer->encode(text, {.parse_special = true}), expected);
  }
}

TEST(MistralSentencePiece, V3ControlTokens) {
  const char* model = "tokenizers/mistral/mistral_instruct_tokenizer_240323.model.v3";
  ENTROPYINFER_REQUIRE_ASSET(model);
  const auto tokenizer = load_sentencepiece_tokenizer(asset_path(model));
  EXPECT_EQ(tokenizer->vocab_size(), 32768);
  EXPECT_EQ(tokenizer->token_id("[INST]"), 3);
  EXPECT_EQ(tokenizer->token_id("[/INST]"), 4);
  EXPECT_EQ(tokenizer->encode("[INST]", {.parse_special = true}), std::vector<int32_t>{3});
  const auto literal = tokenizer->encode("[INST]", {});
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 3), 0);
}

TEST(SentencePieceDetection, RecognisesModelFilesOnly) {
  ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
  EXPECT_TRUE(looks_like_sentencepiece_model(asset_path(kLlama2Model)));
  EXPECT_TRUE(looks_like_sentencepiece_model(asset_path("tokenizers/mistral/tokenizer.model.v1")));
  EXPECT_FALSE(looks_like_sentencepiece_model(asset_path("tokenizers/llama3/tokenizer.model")));
  EXPECT_FALSE(looks_like_sentencepiece_model(asset_path("tokenizers/llama2/tokenizer.bin")));
  EXPECT_FALSE(looks_like_sentencepiece_model(asset_path("no/such/file.model")));
}

// --- merge rules on a synthetic model ---

TEST(SyntheticSentencePiece, MergesHighestScoreFirst) {
  const std::string sp = "\xE2\x96\x81";
  const auto tokenizer = load_sentencepiece_tokenizer(testing::temp_file(
      "spm", "scores.model",
      synthetic_model({{sp, -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}})));
  // Pieces: <unk>=0 <s>=1 </s>=2 ▁=3 a=4 b=5 c=6 ab=7 bc=8. "bc" outscores "ab".
  EXPECT_EQ(tokenizer->encode("abc", {}), (std::vector<int32_t>{3, 4, 8}));
  // Without byte fallback an unknown character is <unk>.
  EXPECT_EQ(tokenizer->encode("ax", {}), (std::vector<int32_t>{3, 4, 0}));
}

TEST(SyntheticSentencePiece, EqualScoresMergeLeftmostFirst) {
  const std::string sp = "\xE2\x96\x81";
  const auto tokenizer = load_sentencepiece_tokenizer(testing::temp_file(
      "spm", "ties.model",
      synthetic_model({{sp, -1}, {"a", -1}, {"b", -1}, {"c", -1}, {"ab", -2}, {"bc", -2}})));
  EXPECT_EQ(tokenizer->encode("abc", {}), (std::vector<int32_t>{3, 7, 6}));
}

TEST(SyntheticSentencePiece, UserDefinedPiecesStayWhole) {
  const std::string sp = "\xE2\x96\x81";
  // "xy" is user-defined (type 4): matched whole in the text and never merged with neighbours.
  const auto tokenizer = load_sentencepiece_tokenizer(
      testing::temp_file("spm", "user.model",
                         synthetic_model({{sp, -1}, {"x", -1}, {"y", -1}, {"yx", -1}},
                                         /*model_type=*/2, piece_message("xy", 0, 4))));
  // Ids: ▁=3 x=4 y=5 yx=6 xy=7.
  EXPECT_EQ(tokenizer->encode("yxy", {}), (std::vector<int32_t>{3, 5, 7}));
}

TEST(SyntheticSentencePiece, PieceAcrossASpaceIsStillFound) {
  const std::string sp = "\xE2\x96\x81";
  // "a▁b" joins a character to a following space, so words cannot be segmented one at a time.
  const auto tokenizer = load_sentencepiece_tokenizer(testing::temp_file(
      "spm", "across.model",
      synthetic_model(
          {{sp, -1}, {"a", -1}, {"b", -1}, {"a" + sp, -2}, {"a" + sp + "b", -3}, {sp + "a", -9}})));
  EXPECT_FALSE(dynamic_cast<const SentencePieceTokenizer&>(*tokenizer).words_are_independent());
  // Ids: ▁=3 a=4 b=5 a▁=6 a▁b=7 ▁a=8. "a▁" outscores "▁a", then "a▁b" forms.
  EXPECT_EQ(tokenizer->encode("a b", {}), (std::vector<int32_t>{3, 7}));
}

TEST(SyntheticSentencePiece, UnusedPiecesAreSplitBack) {
  const std::string sp = "\xE2\x96\x81";
  // "ab" is unused (type 5): merges may pass through it, but it is never output.
  const auto tokenizer = load_sentencepiece_tokenizer(testing::temp_file(
      "spm", "unused.model",
      synthetic_model({{sp, -1}, {"a", -1}, {"b", -1}}, 2, piece_message("ab", -1, 5))));
  EXPECT_EQ(tokenizer->encode("ab", {}), (std::vector<int32_t>{3, 4, 5}));
}

// --- bad input ---

void expect_error_mentioning(const std::string& path, const std::string& fragment) {
  try {
    load_sentencepiece_tokenizer(path);
    ADD_FAILURE() << "no Error for " << path;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message: " << error.what();
  }
}

TEST(SentencePieceErrors, MissingFile) {
  expect_error_mentioning("/nonexistent/dir/tokenizer.model", "/nonexistent/dir/tokenizer.model");
}

TEST(SentencePieceErrors, EmptyFile) {
  const std::string path = testing::temp_file("spm", "empty.model", "");
  expect_error_mentioning(path, path);
}

TEST(SentencePieceErrors, RandomBytes) {
  std::mt19937 generator(1234);
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(4096, '\0');
    for (char& byte : bytes) byte = static_cast<char>(generator() & 0xFF);
    const std::string path = testing::temp_file("spm", "random.model", bytes);
    expect_error_mentioning(path, path);
  }
}

TEST(SentencePieceErrors, TruncatedModel) {
  ENTROPYINFER_REQUIRE_ASSET(kLlama2Model);
  const std::string bytes = read_file_bytes(asset_path(kLlama2Model));
  for (const size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{3}, size_t{1}}) {
    const std::string path = testing::temp_file("spm", "cut.model", bytes.substr(0, cut));
    expect_error_mentioning(path, path);
  }
}

TEST(SentencePieceErrors, TiktokenFileIsNotAModel) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  const std::string path = asset_path("tokenizers/llama3/tokenizer.model");
  expect_error_mentioning(path, path);
}

TEST(SentencePieceErrors, UnigramModelIsRejectedClearly) {
  const std::string path =
      testing::temp_file("spm", "unigram.model", synthetic_model({{"a", -1}}, /*model_type=*/1));
  expect_error_mentioning(path, "unigram");
}

TEST(SentencePieceErrors, DuplicatePiece) {
  const std::string path =
      testing::temp_file("spm", "dup.model", synthetic_model({{"a", -1}, {"a", -2}}));
  expect_error_mentioning(path, "appears twice");
}

TEST(SentencePieceErrors, ByteFallbackWithoutBytePieces) {
  std::string model = piece_message("<unk>", 0, 2) + piece_message("a", -1, 1);
  model += field_bytes(2, field_varint(3, 2) + field_varint(35, 1));
  const std::string path = testing::temp_file("spm", "nobytes.model", model);
  expect_error_mentioning(path, "<0x00>");
}

}  // namespace
}  // namespace entropyinfer

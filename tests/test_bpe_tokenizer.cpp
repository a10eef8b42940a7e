// Byte-level BPE: the pre-tokenizer matchers, NFC, tokenizer.json and tiktoken loading, llama.cpp's
// reference vectors, and id-for-id agreement of the two file forms of Llama 3 and Qwen3.
//
// The real tokenizer.json files come from scripts/fetch_tokenizers.sh (into
// <repo>/.cache/tokenizers, or $ENTROPYINFER_TOKENIZERS_DIR); tests that need them skip with a
// message when they are absent.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;
using ::entropyinfer::testing::asset_path;
using ::entropyinfer::testing::fixtures_dir;
using ::entropyinfer::testing::read_file_bytes;

std::string tokenizers_cache_dir() {
  if (const char* dir = std::getenv("ENTROPYINFER_TOKENIZERS_DIR")) return dir;
  return (fs::path(fixtures_dir()) / ".." / ".." / ".cache" / "tokenizers")
      .lexically_normal()
      .string();
}

std::string cached_tokenizer_json(const std::string& name) {
  return tokenizers_cache_dir() + "/" + name + "/tokenizer.json";
}

#define REQUIRE_TOKENIZER_JSON(name)                                                            \
  do {                                                                                          \
    if (!fs::exists(cached_tokenizer_json(name))) {                                             \
      GTEST_SKIP() << "missing " << cached_tokenizer_json(name)                                 \
                   << " (run scripts/fetch_tokenizers.sh, or set ENTROPYINFER_TOKENIZERS_DIR)"; \
    }                                                                                           \
  } while (0)

// Loading a 10 MB tokenizer.json takes a while (much longer under sanitizers): each real tokenizer
// is loaded once per test process.
const Tokenizer& shared_tokenizer(const std::string& key) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto it = loaded.find(key);
  if (it != loaded.end()) return *it->second;
  std::unique_ptr<Tokenizer> tokenizer;
  if (key == "llama3-json") tokenizer = load_tokenizer(tokenizers_cache_dir() + "/llama3");
  if (key == "qwen3-json") tokenizer = load_tokenizer(tokenizers_cache_dir() + "/qwen3");
  if (key == "llama3-tiktoken")
    tokenizer = load_tokenizer(asset_path("tokenizers/llama3/tokenizer.model"));
  if (key == "qwen-tiktoken")
    tokenizer = load_tokenizer(asset_path("tokenizers/qwen/qwen.tiktoken"));
  if (!tokenizer) throw std::logic_error("unknown tokenizer key " + key);
  return *loaded.emplace(key, std::move(tokenizer)).first->second;
}

std::vector<int32_t> encode_plain(const Tokenizer& tokenizer, std::string_view text) {
  return tokenizer.encode(text, EncodeOptions{});
}

std::vector<std::string> pieces_of(std::string_view text, PretokenizerPattern pattern) {
  std::vector<std::string_view> views;
  pretokenize(text, pattern, views);
  return {views.begin(), views.end()};
}

// A unique scratch folder per test.
fs::path scratch_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) /
                 (std::string("bpe_") + info->test_suite_name() + "_" + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream stream(path, std::ios::binary);
  stream << content;
}

std::string error_message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no Error thrown)";
}

// ------------------------------------------------------------------------------------------------
// Pre-tokenizer

TEST(Pretokenizer, RecognisesTheRegexesOfRealTokenizerFiles) {
  EXPECT_EQ(
      pretokenizer_from_regex(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      PretokenizerPattern::kLlama3);
  EXPECT_EQ(
      pretokenizer_from_regex(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      PretokenizerPattern::kQwen2);
  EXPECT_EQ(pretokenizer_from_regex(R"(\w+|[^\w\s]+)"), std::nullopt);
  EXPECT_EQ(pretokenizer_from_name("qwen2"), PretokenizerPattern::kQwen2);
  EXPECT_EQ(pretokenizer_from_name("bert"), std::nullopt);
}

TEST(Pretokenizer, Llama3SplitsLikeItsRegex) {
  using V = std::vector<std::string>;
  const auto split = [](std::string_view text) {
    return pieces_of(text, PretokenizerPattern::kLlama3);
  };
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("   Hello"), (V{"  ", " Hello"}));  // \s+(?!\S) gives back one space
  EXPECT_EQ(split("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split("I'LL don'T"), (V{"I", "'LL", " don", "'T"}));  // contractions ignore case
  EXPECT_EQ(split("'lx"), (V{"'lx"}));  // not a contraction: punct + letters
  EXPECT_EQ(split("a  \n\n  b"),
            (V{"a", "  \n\n", " ", " b"}));                   // \s*[\r\n]+ stops at the last break
  EXPECT_EQ(split("x !!!\n\ny"), (V{"x", " !!!\n\n", "y"}));  // punctuation swallows line breaks
  EXPECT_EQ(split("(hello)"), (V{"(hello", ")"}));
  EXPECT_EQ(split("\thello"), (V{"\thello"}));
  EXPECT_EQ(split("\n hello"), (V{"\n", " hello"}));
  EXPECT_EQ(split("end  "), (V{"end", "  "}));
  EXPECT_EQ(split("\xC3\xA9t\xC3\xA9 42\xE4\xB8\xAD"),
            (V{"\xC3\xA9t\xC3\xA9", " ", "42", "\xE4\xB8\xAD"}));
  // U+3000 IDEOGRAPHIC SPACE is \s but not \r\n, so it may lead a word.
  EXPECT_EQ(split("\xE3\x80\x80word"), (V{"\xE3\x80\x80word"}));
}

TEST(Pretokenizer, QwenSplitsDigitsSingly) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces_of("x 2024!", PretokenizerPattern::kQwen2),
            (V{"x", " ", "2", "0", "2", "4", "!"}));
}

TEST(Pretokenizer, Gpt2SplitsLikeItsRegex) {
  using V = std::vector<std::string>;
  const auto split = [](std::string_view text) {
    return pieces_of(text, PretokenizerPattern::kGpt2);
  };
  EXPECT_EQ(split("Hello, world 12345!"), (V{"Hello", ",", " world", " 12345", "!"}));
  EXPECT_EQ(split("I'LL it's"), (V{"I", "'", "LL", " it", "'s"}));  // case-sensitive contractions
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n", "\n", "b"}));
}

TEST(Pretokenizer, PiecesCoverInvalidUtf8) {
  const std::string text = "ab\xFF\xC3 cd\xE4\xB8";
  for (PretokenizerPattern pattern :
       {PretokenizerPattern::kGpt2, PretokenizerPattern::kLlama3, PretokenizerPattern::kQwen2}) {
    std::string joined;
    for (const std::string& piece : pieces_of(text, pattern)) {
      EXPECT_FALSE(piece.empty());
      joined += piece;
    }
    EXPECT_EQ(joined, text);
  }
}

// ------------------------------------------------------------------------------------------------
// Unicode

TEST(UnicodeNfc, ComposesReordersAndKeepsExclusions) {
  EXPECT_EQ(unicode::to_nfc("e\xCC\x81"), "\xC3\xA9");  // e + acute -> é
  EXPECT_EQ(unicode::to_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(unicode::to_nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM -> Å
  // U+1E0A (D dot above) + U+0323 (dot below): reordered, then D + dot below composes.
  EXPECT_EQ(unicode::to_nfc("\xE1\xB8\x8A\xCC\xA3"), "\xE1\xB8\x8C\xCC\x87");
  // U+0958 is a composition exclusion: it stays decomposed as U+0915 U+093C.
  EXPECT_EQ(unicode::to_nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  // A starter in between blocks composition; invalid bytes pass through and block too.
  EXPECT_EQ(unicode::to_nfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_TRUE(unicode::is_nfc_quick("plain ASCII and caf\xC3\xA9 and \xE4\xB8\xAD\xE6\x96\x87"));
  EXPECT_FALSE(unicode::is_nfc_quick("e\xCC\x81"));
}

TEST(UnicodeCategories, LettersNumbersAndSpaces) {
  EXPECT_TRUE(unicode::is_letter(U'\u00E9'));
  EXPECT_TRUE(unicode::is_letter(U'\u4E2D'));
  EXPECT_FALSE(unicode::is_letter(U'\u0301'));  // a mark, not a letter
  EXPECT_TRUE(unicode::is_number(U'\u0663'));   // ARABIC-INDIC DIGIT THREE
  EXPECT_TRUE(unicode::is_number(U'\u00BD'));   // VULGAR FRACTION ONE HALF (No)
  EXPECT_TRUE(unicode::is_whitespace(U'\u00A0'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u3000'));
  EXPECT_FALSE(unicode::is_whitespace(U'\u200B'));  // ZERO WIDTH SPACE is not White_Space
}

// ------------------------------------------------------------------------------------------------
// Synthetic tokenizer.json files (no assets needed)

// A byte-level vocabulary of the 256 single bytes plus the given extra tokens (byte-level strings).
nlohmann::json tiny_tokenizer_json(const std::vector<std::string>& extra_tokens,
                                   const nlohmann::json& merges) {
  // GPT-2's byte-to-unicode alphabet, written out independently of the implementation.
  std::vector<char32_t> alphabet(256);
  char32_t moved = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable =
        (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
    alphabet[static_cast<std::size_t>(byte)] = printable ? static_cast<char32_t>(byte) : moved++;
  }
  nlohmann::json vocab = nlohmann::json::object();
  for (int byte = 0; byte < 256; ++byte) {
    std::string key;
    unicode::append_utf8(key, alphabet[static_cast<std::size_t>(byte)]);
    vocab[key] = byte;
  }
  int next_id = 256;
  for (const std::string& token : extra_tokens) vocab[token] = next_id++;
  nlohmann::json root = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", std::string(pretokenizer_regex(PretokenizerPattern::kLlama3))}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}}};
  return root;
}

std::unique_ptr<Tokenizer> load_json_tokenizer(const fs::path& dir, const nlohmann::json& root) {
  write_file(dir / "tokenizer.json", root.dump());
  return load_tokenizer(dir.string());
}

TEST(BpeTokenizerJson, MergesAsStringsOrPairsGiveTheSameIds) {
  const fs::path dir = scratch_dir();
  // ids: ab=256, abc=257, "Ġab"... merges in priority order.
  const std::vector<std::string> extra = {"ab", "abc", "bc"};
  const auto with_strings =
      load_json_tokenizer(dir, tiny_tokenizer_json(extra, {"a b", "ab c", "b c"}));
  EXPECT_EQ(encode_plain(*with_strings, "abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(encode_plain(*with_strings, "abcbc"), (std::vector<int32_t>{257, 258}));
  const auto with_pairs = load_json_tokenizer(
      dir,
      tiny_tokenizer_json(extra, nlohmann::json::array({{"a", "b"}, {"ab", "c"}, {"b", "c"}})));
  EXPECT_EQ(encode_plain(*with_pairs, "abcbc"), encode_plain(*with_strings, "abcbc"));
  // Priority decides, not position: with "b c" first, "abc" becomes a + bc (no "a bc" merge).
  const auto reordered =
      load_json_tokenizer(dir, tiny_tokenizer_json(extra, {"b c", "a b", "ab c"}));
  EXPECT_EQ(encode_plain(*reordered, "abc"), (std::vector<int32_t>{'a', 258}));
  EXPECT_EQ(reordered->decode(encode_plain(*reordered, "abc abc")), "abc abc");
}

TEST(BpeTokenizerJson, IgnoreMergesEmitsWholeWords) {
  const fs::path dir = scratch_dir();
  // "abc" is a token, but the merges alone only reach a + bc.
  nlohmann::json root = tiny_tokenizer_json({"abc", "bc"}, {"b c"});
  const auto merging = load_json_tokenizer(dir, root);
  EXPECT_EQ(encode_plain(*merging, "abc"), (std::vector<int32_t>{'a', 257}));
  root["model"]["ignore_merges"] = true;
  const auto ignoring = load_json_tokenizer(dir, root);
  EXPECT_EQ(encode_plain(*ignoring, "abc"), (std::vector<int32_t>{256}));
}

TEST(BpeTokenizerJson, AddedTokensBosAndEos) {
  const fs::path dir = scratch_dir();
  nlohmann::json root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["added_tokens"] = {
      {{"id", 300}, {"content", "<s>"}, {"special", true}},
      {{"id", 301}, {"content", "</s>"}, {"special", true}},
      {{"id", 302}, {"content", "<tool>"}, {"special", false}},
      {{"id", 303}, {"content", "<tool_long>"}, {"special", false}},
  };
  write_file(dir / "tokenizer_config.json",
             R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  write_file(dir / "generation_config.json", R"({"eos_token_id": [301, 302]})");
  const auto tokenizer = load_json_tokenizer(dir, root);
  EXPECT_EQ(tokenizer->bos_id(), 300);
  EXPECT_EQ(tokenizer->eos_ids(), (std::vector<int32_t>{301, 302}));
  EXPECT_EQ(tokenizer->token_id("<tool>"), 302);
  EXPECT_EQ(tokenizer->vocab_size(), 304);
  // Non-special added tokens are always cut out (longest match first); special ones only with
  // parse_special.
  EXPECT_EQ(encode_plain(*tokenizer, "a<tool_long>b"), (std::vector<int32_t>{'a', 303, 'b'}));
  EXPECT_EQ(encode_plain(*tokenizer, "<s>").size(), 3u);
  EXPECT_EQ(tokenizer->encode("<s>x</s>", {.add_bos = true, .parse_special = true}),
            (std::vector<int32_t>{300, 300, 'x', 301}));
  EXPECT_EQ(tokenizer->decode({300, 'x', 302}), "<s>x<tool>");
}

TEST(BpeTokenizerErrors, MissingFileCorruptJsonAndUnknownPattern) {
  const fs::path dir = scratch_dir();
  EXPECT_NE(error_message_of([&] { load_tokenizer((dir / "absent").string()); }).find("not found"),
            std::string::npos);
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir.string()); }).find("no tokenizer in"),
            std::string::npos);

  write_file(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  const std::string corrupt = error_message_of([&] { load_tokenizer(dir.string()); });
  EXPECT_NE(corrupt.find("not valid JSON"), std::string::npos) << corrupt;
  EXPECT_NE(corrupt.find("tokenizer.json"), std::string::npos) << corrupt;

  nlohmann::json root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\w+|[^\w\s]+)";
  write_file(dir / "tokenizer.json", root.dump());
  const std::string unknown = error_message_of([&] { load_tokenizer(dir.string()); });
  EXPECT_NE(unknown.find("unknown pre-tokenizer pattern"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find(R"(\w+|[^\w\s]+)"), std::string::npos) << unknown;

  root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["model"]["type"] = "WordPiece";
  write_file(dir / "tokenizer.json", root.dump());
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir.string()); }).find("WordPiece"),
            std::string::npos);

  root = tiny_tokenizer_json({}, {"a zz"});
  write_file(dir / "tokenizer.json", root.dump());
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir.string()); }).find("model.merges[0]"),
            std::string::npos);

  root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["model"]["vocab"]["huge"] = 2000000000;  // would need a 2-billion-entry table
  write_file(dir / "tokenizer.json", root.dump());
  EXPECT_NE(
      error_message_of([&] { load_tokenizer(dir.string()); }).find("\"huge\" has no valid id"),
      std::string::npos);

  root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["normalizer"] = {{"type", "Lowercase"}};
  write_file(dir / "tokenizer.json", root.dump());
  EXPECT_NE(error_message_of([&] { load_tokenizer(dir.string()); }).find("Lowercase"),
            std::string::npos);
}

TEST(BpeTokenizerErrors, UnknownDecoderTypeIsRefused) {
  const fs::path dir = scratch_dir();
  nlohmann::json root = tiny_tokenizer_json({}, nlohmann::json::array());
  root["decoder"] = {
      {"type", "Sequence"},
      {"decoders", {{{"type", "ByteLevel"}}, {{"type", "Strip"}, {"content", " "}}}}};
  write_file(dir / "tokenizer.json", root.dump());
  const std::string message = error_message_of([&] { load_tokenizer(dir.string()); });
  EXPECT_NE(message.find("unsupported decoder type \"Strip\""), std::string::npos) << message;
  EXPECT_NE(message.find("decoder.decoders[1]"), std::string::npos) << message;
}

TEST(BpeTokenizerJson, ParsesFromTextWithoutTheFilesBesideIt) {
  const nlohmann::json root = tiny_tokenizer_json({"ab"}, {"a b"});
  const auto tokenizer = parse_hf_bpe_tokenizer(root.dump(), "inline tokenizer.json");
  EXPECT_EQ(encode_plain(*tokenizer, "ab"), (std::vector<int32_t>{256}));
  const std::string hostile = error_message_of(
      [] { parse_hf_bpe_tokenizer(R"({"model": {"vocab": {"a": 1e400}}})", "inline"); });
  EXPECT_NE(hostile.find("not valid JSON"), std::string::npos) << hostile;
}

TEST(TokenizerFiles, DevicesAndFifosAreRefusedByKind) {
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero on this system";
  const std::string message = error_message_of([] { load_tokenizer("/dev/zero"); });
  EXPECT_NE(message.find("character device"), std::string::npos) << message;
}

TEST(BpeTokenizerErrors, BadTiktokenFiles) {
  const fs::path dir = scratch_dir();
  std::string ranks;
  for (int byte = 0; byte < 256; ++byte) {
    static const char* const kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    ranks += std::string{kAlphabet[byte >> 2], kAlphabet[(byte & 3) << 4], '=', '='} + " " +
             std::to_string(byte) + "\n";
  }
  write_file(dir / "good.tiktoken", ranks);
  // 256 ranks is no known vocabulary: it needs the pre-tokenizer named.
  EXPECT_NE(error_message_of([&] {
              load_tokenizer((dir / "good.tiktoken").string());
            }).find("unrecognised tiktoken vocabulary"),
            std::string::npos);
  TiktokenOptions options;
  options.pretokenizer = PretokenizerPattern::kGpt2;
  const auto plain = load_tiktoken_tokenizer((dir / "good.tiktoken").string(), options);
  EXPECT_EQ(encode_plain(*plain, "hi"), (std::vector<int32_t>{'h', 'i'}));

  write_file(dir / "bad.tiktoken", ranks + "!!!! 256\n");
  const std::string bad_base64 =
      error_message_of([&] { load_tokenizer((dir / "bad.tiktoken").string()); });
  EXPECT_NE(bad_base64.find("bad.tiktoken:257: invalid base64"), std::string::npos) << bad_base64;

  write_file(dir / "gap.tiktoken", ranks + "YWI= 300\n");
  EXPECT_NE(error_message_of([&] {
              load_tokenizer((dir / "gap.tiktoken").string());
            }).find("out of order"),
            std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// load_tokenizer dispatch (assets are linked into a scratch folder, never copied)

TEST(LoadTokenizer, PicksTheFormatByFolderContentAndFileKind) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama2/tokenizer.model");
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  ENTROPYINFER_REQUIRE_ASSET("stories260K/tok512.bin");
  const fs::path root = scratch_dir();

  // tokenizer.model holding a SentencePiece ModelProto.
  fs::create_directories(root / "sentencepiece");
  fs::create_symlink(asset_path("tokenizers/llama2/tokenizer.model"),
                     root / "sentencepiece/tokenizer.model");
  EXPECT_EQ(load_tokenizer((root / "sentencepiece").string())->vocab_size(), 32000);

  // A tokenizer.json that is not byte-level BPE (Llama 2's Metaspace form) next to it: the loader
  // falls back to tokenizer.model.
  nlohmann::json metaspace = tiny_tokenizer_json({}, nlohmann::json::array());
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  metaspace["decoder"] = {{"type", "Sequence"}, {"decoders", nlohmann::json::array()}};
  write_file(root / "sentencepiece/tokenizer.json", metaspace.dump());
  EXPECT_EQ(load_tokenizer((root / "sentencepiece").string())->vocab_size(), 32000);
  // On its own, that tokenizer.json is refused with a reason.
  EXPECT_NE(error_message_of([&] {
              load_tokenizer((root / "sentencepiece/tokenizer.json").string());
            }).find("not a byte-level BPE tokenizer"),
            std::string::npos);

  // tokenizer.model holding tiktoken ranks (Llama 3).
  fs::create_directories(root / "tiktoken");
  fs::create_symlink(asset_path("tokenizers/llama3/tokenizer.model"),
                     root / "tiktoken/tokenizer.model");
  const auto llama3 = load_tokenizer((root / "tiktoken").string());
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_EQ(llama3->bos_id(), 128000);

  // llama2.c's tokenizer.bin, as a file and in a folder.
  EXPECT_EQ(load_tokenizer(asset_path("stories260K/tok512.bin"))->vocab_size(), 512);
  fs::create_directories(root / "llama2c");
  fs::create_symlink(asset_path("stories260K/tok512.bin"), root / "llama2c/tokenizer.bin");
  EXPECT_EQ(load_tokenizer((root / "llama2c").string())->vocab_size(), 512);

  // A file of no known kind.
  write_file(root / "notes.txt", "just some text\n");
  EXPECT_NE(error_message_of([&] {
              load_tokenizer((root / "notes.txt").string());
            }).find("not a recognised tokenizer file"),
            std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// llama.cpp's reference vectors

struct VectorCase {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp holds the texts, each followed by "\n__ggml_vocab_test__\n"; .out one line of ids per text.
std::vector<VectorCase> read_vectors(const std::string& name) {
  const std::string input =
      read_file_bytes(asset_path("tokenizer-vectors/ggml-vocab-" + name + ".gguf.inp"));
  const std::string output =
      read_file_bytes(asset_path("tokenizer-vectors/ggml-vocab-" + name + ".gguf.out"));
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<VectorCase> cases;
  for (std::size_t start = 0; start < input.size();) {
    const std::size_t end = input.find(separator, start);
    if (end == std::string::npos) break;
    cases.push_back({input.substr(start, end - start), {}});
    start = end + separator.size();
  }
  std::size_t index = 0;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (index >= cases.size()) {
      ADD_FAILURE() << name << ": more id lines than texts";
      break;
    }
    std::istringstream numbers(line);
    int32_t id = 0;
    while (numbers >> id) cases[index].ids.push_back(id);
    ++index;
  }
  EXPECT_EQ(index, cases.size()) << name << ": id lines and texts differ in number";
  return cases;
}

void expect_vectors(const Tokenizer& tokenizer, const std::string& name) {
  const std::vector<VectorCase> cases = read_vectors(name);
  ASSERT_EQ(cases.size(), 46u) << name;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(encode_plain(tokenizer, cases[i].text), cases[i].ids)
        << name << " case " << i << ": \"" << cases[i].text << "\"";
    EXPECT_EQ(tokenizer.decode(cases[i].ids), cases[i].text) << name << " case " << i;
  }
}

TEST(BpeTokenizerVectors, Llama3TokenizerJson) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizer-vectors/ggml-vocab-llama-bpe.gguf.inp");
  REQUIRE_TOKENIZER_JSON("llama3");
  expect_vectors(shared_tokenizer("llama3-json"), "llama-bpe");
}

TEST(BpeTokenizerVectors, Llama3Tiktoken) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizer-vectors/ggml-vocab-llama-bpe.gguf.inp");
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  expect_vectors(shared_tokenizer("llama3-tiktoken"), "llama-bpe");
}

TEST(BpeTokenizerVectors, Qwen3TokenizerJson) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizer-vectors/ggml-vocab-qwen2.gguf.inp");
  REQUIRE_TOKENIZER_JSON("qwen3");
  expect_vectors(shared_tokenizer("qwen3-json"), "qwen2");
  expect_vectors(shared_tokenizer("qwen3-json"), "deepseek-r1-qwen");
}

TEST(BpeTokenizerVectors, QwenTiktoken) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizer-vectors/ggml-vocab-qwen2.gguf.inp");
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/qwen/qwen.tiktoken");
  expect_vectors(shared_tokenizer("qwen-tiktoken"), "qwen2");
  expect_vectors(shared_tokenizer("qwen-tiktoken"), "deepseek-r1-qwen");
}

// ------------------------------------------------------------------------------------------------
// Real vocabularies: metadata and agreement of the two file forms

TEST(BpeTokenizerReal, Llama3SpecialTokensBosAndEos) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  REQUIRE_TOKENIZER_JSON("llama3");
  const Tokenizer& json = shared_tokenizer("llama3-json");
  const Tokenizer& tiktoken = shared_tokenizer("llama3-tiktoken");
  EXPECT_EQ(json.vocab_size(), 128256);
  EXPECT_EQ(tiktoken.vocab_size(), 128256);
  for (int32_t id = 0; id < 128256; ++id) {
    ASSERT_EQ(json.token_bytes(id), tiktoken.token_bytes(id)) << "id " << id;
  }
  EXPECT_EQ(tiktoken.token_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tiktoken.token_id("<|start_header_id|>"), 128006);
  EXPECT_EQ(json.bos_id(), 128000);
  EXPECT_EQ(tiktoken.bos_id(), 128000);
  for (const Tokenizer* tokenizer : {&json, &tiktoken}) {
    const std::vector<int32_t> eos = tokenizer->eos_ids();
    EXPECT_NE(std::find(eos.begin(), eos.end(), 128001), eos.end());
    EXPECT_NE(std::find(eos.begin(), eos.end(), 128009), eos.end());
    EXPECT_EQ(tokenizer->encode("<|start_header_id|>user<|end_header_id|>",
                                {.add_bos = true, .parse_special = true}),
              (std::vector<int32_t>{128000, 128006, 882, 128007}));
    // Without parse_special the markup is plain text.
    EXPECT_GT(encode_plain(*tokenizer, "<|eot_id|>").size(), 1u);
  }
}

TEST(BpeTokenizerReal, QwenSpecialTokensBosAndEos) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/qwen/qwen.tiktoken");
  REQUIRE_TOKENIZER_JSON("qwen3");
  const Tokenizer& json = shared_tokenizer("qwen3-json");
  const Tokenizer& tiktoken = shared_tokenizer("qwen-tiktoken");
  EXPECT_EQ(json.vocab_size(), 151669);
  EXPECT_EQ(tiktoken.vocab_size(), 151669);
  for (int32_t id = 0; id < 151669; ++id) {
    ASSERT_EQ(json.token_bytes(id), tiktoken.token_bytes(id)) << "id " << id;
  }
  for (const Tokenizer* tokenizer : {&json, &tiktoken}) {
    EXPECT_EQ(tokenizer->bos_id(), std::nullopt);
    const std::vector<int32_t> eos = tokenizer->eos_ids();
    EXPECT_NE(std::find(eos.begin(), eos.end(), 151645), eos.end());  // <|im_end|>
    EXPECT_EQ(tokenizer->encode("<|im_start|>user", {.add_bos = true, .parse_special = true}),
              (std::vector<int32_t>{151644, 872}));
    // <think> is a non-special added token: cut out even without parse_special.
    EXPECT_EQ(encode_plain(*tokenizer, "<think>"), (std::vector<int32_t>{151667}));
  }
}

// Deterministic pseudo-random numbers (the corpus must be the same on every run).
struct Lcg {
  uint64_t state;
  uint32_t next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  }
  uint32_t below(uint32_t bound) { return next() % bound; }
};

std::string read_slice(const std::string& relative, std::size_t offset, std::size_t length) {
  const std::string text = read_file_bytes(asset_path(relative));
  return offset < text.size() ? text.substr(offset, length) : std::string();
}

// About 1.2 MB of prose, code, CJK, emoji, long whitespace and digit runs, mixed scripts and
// contractions in mixed case. All of it is in NFC, so that decoding gives it back byte for byte for
// Qwen too.
std::string build_mixed_corpus() {
  std::string corpus;
  corpus += read_slice("text/janeausten/pride_and_prejudice.txt", 0, 250000);
  corpus += read_slice("text/janeausten/emma.txt", 100000, 100000);
  corpus += read_slice("text/kjv/kjv_bible.txt", 1000000, 200000);

  // The repository's own C++ sources (sorted, so the order is fixed), up to 200 KB.
  const fs::path repo_root = fs::path(fixtures_dir()) / ".." / "..";
  std::vector<fs::path> sources;
  for (const char* folder : {"src", "tests"}) {
    if (!fs::exists(repo_root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(repo_root / folder)) {
      const std::string extension = entry.path().extension().string();
      if (entry.is_regular_file() && (extension == ".cpp" || extension == ".h")) {
        sources.push_back(entry.path());
      }
    }
  }
  std::sort(sources.begin(), sources.end());
  std::string code;
  for (const fs::path& source : sources) {
    if (code.size() > 200000) break;
    code += read_file_bytes(source.string());
  }
  corpus += code.substr(0, 200000);

  Lcg random{20240613};
  // CJK ideographs, kana and Hangul syllables (all NFC-stable starters) with CJK punctuation.
  const std::pair<char32_t, char32_t> cjk_ranges[] = {
      {0x4E00, 0x9FFF}, {0x3041, 0x3096}, {0x30A1, 0x30FA}, {0xAC00, 0xD7A3}};
  std::string cjk;
  while (cjk.size() < 120000) {
    const auto& range = cjk_ranges[random.below(4)];
    const uint32_t run = 1 + random.below(12);
    for (uint32_t i = 0; i < run; ++i) {
      unicode::append_utf8(
          cjk, range.first + random.below(static_cast<uint32_t>(range.second - range.first + 1)));
    }
    static const char* const kSeparators[] = {"\xE3\x80\x82", "\xE3\x80\x81", " ",
                                              "\n",           "\xEF\xBC\x8C", ""};
    cjk += kSeparators[random.below(6)];
  }
  corpus += cjk;

  // Emoji: plain, with skin tones, ZWJ families, flags, keycaps, variation selectors.
  static const char* const kEmoji[] = {
      "\xF0\x9F\x98\x80",
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5",
      "1\xEF\xB8\x8F\xE2\x83\xA3",
      "\xE2\x9D\xA4\xEF\xB8\x8F",
      "\xF0\x9F\xA6\x99",
      "\xF0\x9F\xAB\xA0",
      "\xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88",
      "\xE2\x9C\x85"};
  std::string emoji;
  while (emoji.size() < 50000) {
    emoji += kEmoji[random.below(10)];
    if (random.below(3) == 0) emoji += random.below(2) ? " " : " ok ";
  }
  corpus += emoji;

  // Long whitespace runs of every kind, between words.
  static const char* const kSpaces[] = {" ",        "\t",           "\n",           "\r\n",
                                        "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\x83", "\x0B"};
  std::string spaces;
  while (spaces.size() < 60000) {
    const uint32_t run = 1 + random.below(random.below(4) == 0 ? 400 : 8);
    const char* kind = kSpaces[random.below(8)];
    const bool mixed = random.below(3) == 0;
    for (uint32_t i = 0; i < run; ++i) spaces += mixed ? kSpaces[random.below(8)] : kind;
    static const char* const kWords[] = {"word", "x", "!", "42", "(", "Zebra", "\xC3\xA9t\xC3\xA9",
                                         "'s"};
    spaces += kWords[random.below(8)];
  }
  corpus += spaces;

  // Long digit runs, alone and glued to letters and punctuation; other number kinds.
  std::string digits;
  while (digits.size() < 60000) {
    const uint32_t run = 1 + random.below(random.below(5) == 0 ? 300 : 12);
    for (uint32_t i = 0; i < run; ++i) digits.push_back(static_cast<char>('0' + random.below(10)));
    static const char* const kGlue[] = {" ",        ",", ".", "px", "\n", "$", " \xD9\xA3\xD9\xA4",
                                        "\xC2\xBD", "x"};
    digits += kGlue[random.below(9)];
  }
  corpus += digits;

  // Mixed scripts, in NFC, and contractions in every case.
  static const char* const kPhrases[] = {
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80! ",  // Привет,
                                                                                       // мир!
      "\xCE\x9A\xCE\xB1\xCE\xBB\xCE\xB7\xCE\xBC\xCE\xAD\xCF\x81\xCE\xB1 ",  // Καλημέρα
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 "
      "\xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85 ",  // مرحبا بالعالم
      "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D ",                          // שלום
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 ",  // नमस्ते
      "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5 ",  // สวัสดี
      "na\xC3\xAFve caf\xC3\xA9 \xC3\x9C"
      "ber F\xC3\xBChrer ",
      "I'LL ",
      "WE'RE ",
      "you'Ve ",
      "SHE'S ",
      "'S ",
      "'ll ",
      "'D ",
      "'m ",
      "don'T ",
      "'\xC5\xBF ",
      "it's ",
      "O'Neil ",
      "''' ",
      "Hello\xE4\xB8\x96\xE7\x95\x8C ",
      "abc\xD0\xB0\xD0\xB1\xD0\xB2 ",
      "x=>y; ",
      "<|endoftext|> ",
      "\xE2\x80\x94 ",
      "\xE2\x80\x9Cquoted\xE2\x80\x9D ",
      "\n\n",
  };
  std::string mixed;
  while (mixed.size() < 70000)
    mixed += kPhrases[random.below(sizeof(kPhrases) / sizeof(kPhrases[0]))];
  corpus += mixed;
  return corpus;
}

const std::string& mixed_corpus() {
  static const std::string corpus = build_mixed_corpus();
  return corpus;
}

void expect_agreement_and_round_trip(const Tokenizer& json, const Tokenizer& tiktoken) {
  const std::string& corpus = mixed_corpus();
  ASSERT_GE(corpus.size(), std::size_t{1} << 20);
  ASSERT_EQ(unicode::to_nfc(corpus), corpus) << "the corpus must be NFC for an exact round trip";
  const std::vector<int32_t> from_json = encode_plain(json, corpus);
  const std::vector<int32_t> from_tiktoken = encode_plain(tiktoken, corpus);
  ASSERT_GT(from_json.size(), corpus.size() / 10);
  if (from_json != from_tiktoken) {
    const auto mismatch = std::mismatch(from_json.begin(), from_json.end(), from_tiktoken.begin(),
                                        from_tiktoken.end());
    const std::size_t at = static_cast<std::size_t>(mismatch.first - from_json.begin());
    const std::vector<int32_t> before(from_json.begin(),
                                      from_json.begin() + static_cast<std::ptrdiff_t>(at));
    FAIL() << "tokenizer.json and tiktoken disagree at token " << at << " of " << from_json.size()
           << " / " << from_tiktoken.size() << ", after text ending \""
           << json.decode(before).substr(
                  json.decode(before).size() > 60 ? json.decode(before).size() - 60 : 0)
           << "\"";
  }
  EXPECT_EQ(json.decode(from_json), corpus);
  EXPECT_EQ(tiktoken.decode(from_tiktoken), corpus);
}

TEST(BpeTokenizerReal, Llama3JsonAndTiktokenAgreeOnMixedCorpus) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  ENTROPYINFER_REQUIRE_ASSET("text/kjv/kjv_bible.txt");
  REQUIRE_TOKENIZER_JSON("llama3");
  expect_agreement_and_round_trip(shared_tokenizer("llama3-json"),
                                  shared_tokenizer("llama3-tiktoken"));
}

TEST(BpeTokenizerReal, Qwen3JsonAndTiktokenAgreeOnMixedCorpus) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/qwen/qwen.tiktoken");
  ENTROPYINFER_REQUIRE_ASSET("text/kjv/kjv_bible.txt");
  REQUIRE_TOKENIZER_JSON("qwen3");
  expect_agreement_and_round_trip(shared_tokenizer("qwen3-json"),
                                  shared_tokenizer("qwen-tiktoken"));
}

TEST(BpeTokenizerReal, QwenNormalisesToNfcAndLlama3KeepsBytes) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/qwen/qwen.tiktoken");
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  const std::string decomposed = "Cafe\xCC\x81 \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB \xE2\x84\xAB";
  const std::string composed = "Caf\xC3\xA9 \xED\x95\x9C \xC3\x85";
  const Tokenizer& qwen = shared_tokenizer("qwen-tiktoken");
  EXPECT_EQ(encode_plain(qwen, decomposed), encode_plain(qwen, composed));
  EXPECT_EQ(qwen.decode(encode_plain(qwen, decomposed)), composed);
  const Tokenizer& llama = shared_tokenizer("llama3-tiktoken");
  EXPECT_NE(encode_plain(llama, decomposed), encode_plain(llama, composed));
  EXPECT_EQ(llama.decode(encode_plain(llama, decomposed)), decomposed);
  if (fs::exists(cached_tokenizer_json("qwen3"))) {
    const Tokenizer& qwen_json = shared_tokenizer("qwen3-json");
    EXPECT_EQ(encode_plain(qwen_json, decomposed), encode_plain(qwen, decomposed));
  }
}

TEST(BpeTokenizerReal, PreTokenizerIsSettableForTiktoken) {
  ENTROPYINFER_REQUIRE_ASSET("tokenizers/llama3/tokenizer.model");
  const std::string path = asset_path("tokenizers/llama3/tokenizer.model");
  TiktokenOptions options;
  options.pretokenizer = PretokenizerPattern::kQwen2;
  const auto as_qwen = load_tiktoken_tokenizer(path, options);
  const Tokenizer& as_llama = shared_tokenizer("llama3-tiktoken");
  EXPECT_EQ(encode_plain(as_llama, "123456").size(), 2u);  // digits in threes
  EXPECT_EQ(encode_plain(*as_qwen, "123456").size(), 6u);  // digits one by one
  EXPECT_EQ(as_qwen->bos_id(), 128000);                    // still Llama 3's special tokens
}

}  // namespace
}  // namespace entropyinfer

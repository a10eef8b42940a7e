#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"
#include "tokenizer/unicode_text.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A word cache that grows past this is cleared: one call over adversarial text (every word
// distinct) must not hold the whole text twice.
constexpr std::size_t kMaxCachedWords = 1 << 16;

// GPT-2's reversible byte -> code point mapping: printable Latin-1 bytes stand for themselves, the
// rest (controls, space, soft hyphen) are moved to U+0100 and up, so that every byte has a visible
// character and vocabularies can be stored as JSON strings.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> code_point_of_byte{};
  std::array<int16_t, 324> byte_of_code_point{};  // -1 where the code point stands for no byte

  ByteLevelAlphabet() {
    byte_of_code_point.fill(-1);
    char32_t next_moved = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable =
          (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
      const char32_t code_point = printable ? static_cast<char32_t>(byte) : next_moved++;
      code_point_of_byte[byte] = code_point;
      byte_of_code_point[code_point] = static_cast<int16_t>(byte);
    }
  }

  // The bytes a byte-level vocabulary string stands for, or nullopt when it holds a character
  // outside the alphabet.
  std::optional<std::string> to_bytes(std::string_view text) const {
    std::string bytes;
    bytes.reserve(text.size());
    for (std::size_t position = 0; position < text.size();) {
      const unicode::DecodedCodePoint decoded = unicode::decode_utf8(text, position);
      if (!decoded.valid || decoded.code_point >= byte_of_code_point.size() ||
          byte_of_code_point[decoded.code_point] < 0) {
        return std::nullopt;
      }
      bytes.push_back(static_cast<char>(byte_of_code_point[decoded.code_point]));
      position += decoded.length;
    }
    return bytes;
  }
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

std::string read_text_file(const std::string& path, const char* what) {
  return read_user_file(path, what);
}

json parse_json_file(const std::string& path, const char* what) {
  return read_json_file(path, what);
}

// A JSON value that a config file gives as a token: a string, or an object with "content".
std::optional<std::string> token_text_of(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

// An id, or a list of ids, as config.json and generation_config.json give eos_token_id.
std::vector<int32_t> ids_of(const json& value) {
  std::vector<int32_t> ids;
  if (value.is_number_integer()) ids.push_back(value.get<int32_t>());
  if (value.is_array()) {
    for (const json& item : value) {
      if (item.is_number_integer()) ids.push_back(item.get<int32_t>());
    }
  }
  return ids;
}

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

// Turn terminators of chat models whose generation_config.json lists them beside the tokenizer's
// own EOS (and is often not shipped with the tokenizer): generation must stop at them either way.
constexpr std::array<std::string_view, 5> kKnownStopTokens = {
    "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|im_end|>"};

// ----------------------------------------------------------------------------------------------------
// tokenizer.json

struct PreTokenizerSettings {
  std::optional<PretokenizerPattern> pattern;
  bool add_prefix_space = false;
};

void read_pre_tokenizer(const json& node, const std::string& where, const std::string& path,
                        PreTokenizerSettings& settings) {
  if (node.is_null()) return;
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    throw Error(path + ": " + where + " has no \"type\"");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "Sequence") {
    const json& items = node.value("pretokenizers", json::array());
    if (!items.is_array()) throw Error(path + ": " + where + ".pretokenizers is not a list");
    for (std::size_t i = 0; i < items.size(); ++i) {
      read_pre_tokenizer(items[i], where + ".pretokenizers[" + std::to_string(i) + "]", path,
                         settings);
    }
    return;
  }
  if (type == "Split") {
    const json& pattern = node.value("pattern", json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      throw Error(
          path + ": " + where +
          " splits on a literal string, not a regex; only the GPT-2, Llama 3 and Qwen2 split "
          "regexes are supported");
    }
    const std::string regex = pattern["Regex"].get<std::string>();
    const std::optional<PretokenizerPattern> recognised = pretokenizer_from_regex(regex);
    if (!recognised) {
      throw Error(path + ": unknown pre-tokenizer pattern in " + where + ": " + regex +
                  " (supported: the GPT-2, Llama 3 and Qwen2 split regexes)");
    }
    if (node.value("behavior", std::string("Isolated")) != "Isolated" ||
        node.value("invert", false)) {
      throw Error(path + ": " + where + " must use behavior \"Isolated\" without invert");
    }
    if (settings.pattern && *settings.pattern != *recognised) {
      throw Error(path + ": " + where + " adds a second, different split pattern");
    }
    settings.pattern = recognised;
    return;
  }
  if (type == "ByteLevel") {
    const bool add_prefix_space = node.value("add_prefix_space", false);
    if (add_prefix_space && settings.pattern) {
      // Hugging Face would then prefix every piece of the preceding split, which no supported model
      // does; refuse rather than tokenize differently.
      throw Error(path + ": " + where + ": add_prefix_space after a Split is not supported");
    }
    settings.add_prefix_space = settings.add_prefix_space || add_prefix_space;
    if (node.value("use_regex", true)) {
      if (settings.pattern && *settings.pattern != PretokenizerPattern::kGpt2) {
        throw Error(path + ": " + where + " applies GPT-2's regex after another split pattern");
      }
      settings.pattern = PretokenizerPattern::kGpt2;
    }
    return;
  }
  throw Error(path + ": unsupported pre-tokenizer type \"" + type + "\" in " + where +
              " (supported: Split with a known regex, ByteLevel, Sequence of those)");
}

// Returns whether the normaliser asks for NFC; throws for anything else.
bool read_normalizer(const json& node, const std::string& where, const std::string& path) {
  if (node.is_null()) return false;
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    throw Error(path + ": " + where + " has no \"type\"");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json& items = node.value("normalizers", json::array());
    bool nfc = false;
    for (std::size_t i = 0; i < items.size(); ++i) {
      nfc =
          read_normalizer(items[i], where + ".normalizers[" + std::to_string(i) + "]", path) || nfc;
    }
    return nfc;
  }
  throw Error(path + ": unsupported normalizer type \"" + type + "\" in " + where +
              " (supported: NFC)");
}

// The decoder must undo byte-level encoding and nothing else: that is all decode() does, so any
// other step (Replace, Strip, ByteFallback, ...) would decode differently from Hugging Face.
void check_decoder(const json& node, const std::string& where, const std::string& path) {
  if (node.is_null()) return;
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    throw Error(path + ": " + where + " has no \"type\"");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& items = node.value("decoders", json::array());
    if (!items.is_array()) throw Error(path + ": " + where + ".decoders is not a list");
    for (std::size_t i = 0; i < items.size(); ++i) {
      check_decoder(items[i], where + ".decoders[" + std::to_string(i) + "]", path);
    }
    return;
  }
  throw Error(path + ": unsupported decoder type \"" + type + "\" in " + where +
              " (supported: ByteLevel, Sequence of ByteLevel)");
}

// The token a TemplateProcessing post-processor puts in front of a single sequence, if any.
std::optional<std::string> template_bos_token(const json& node) {
  if (!node.is_object()) return std::nullopt;
  const std::string type = node.value("type", std::string());
  if (type == "Sequence") {
    for (const json& item : node.value("processors", json::array())) {
      if (std::optional<std::string> token = template_bos_token(item)) return token;
    }
    return std::nullopt;
  }
  if (type != "TemplateProcessing") return std::nullopt;
  const json& single = node.value("single", json::array());
  if (!single.is_array() || single.empty()) return std::nullopt;
  const json& first = single[0];
  if (first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object()) {
    const json& special = first["SpecialToken"];
    if (special.contains("id") && special["id"].is_string())
      return special["id"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<json> read_optional_json(const fs::path& path, const char* what,
                                       bool read_sidecar_files) {
  if (!read_sidecar_files) return std::nullopt;
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return std::nullopt;
  return parse_json_file(path.string(), what);
}

// Whether a pre-tokenizer or decoder (or a Sequence of them) includes a ByteLevel step.
bool has_byte_level(const json& node) {
  if (!node.is_object()) return false;
  if (node.value("type", std::string()) == "ByteLevel") return true;
  for (const char* list : {"pretokenizers", "decoders"}) {
    if (node.contains(list) && node[list].is_array()) {
      for (const json& item : node[list]) {
        if (has_byte_level(item)) return true;
      }
    }
  }
  return false;
}

// `read_sidecar_files`: whether tokenizer_config.json, generation_config.json and config.json
// beside `path` are read for BOS and EOS.
std::unique_ptr<Tokenizer> build_from_tokenizer_json(const json& root, const std::string& path,
                                                     bool read_sidecar_files) {
  if (!root.is_object()) throw Error(path + ": not a tokenizer.json (top level is not an object)");
  if (!root.contains("model") || !root["model"].is_object()) {
    throw Error(path + ": missing \"model\" object");
  }
  const json& model = root["model"];
  const std::string model_type = model.value("type", std::string("BPE"));
  if (model_type != "BPE") {
    throw UnsupportedTokenizerFormat(path + ": model.type is \"" + model_type +
                                     "\"; only byte-level BPE tokenizer.json files are supported");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && model[field].is_string() &&
        !model[field].get<std::string>().empty()) {
      throw Error(path + ": model." + field + " is not supported");
    }
  }

  // Whether the file is byte-level at all is decided first, so that a SentencePiece-style BPE file
  // is reported as such (and a loader can fall back) rather than for its first unsupported
  // component.
  if (!has_byte_level(root.value("pre_tokenizer", json())) &&
      !has_byte_level(root.value("decoder", json()))) {
    throw UnsupportedTokenizerFormat(
        path + ": not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer or decoder)");
  }
  check_decoder(root.value("decoder", json()), "decoder", path);
  PreTokenizerSettings pre_tokenizer;
  read_pre_tokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer", path, pre_tokenizer);
  if (!pre_tokenizer.pattern) {
    throw Error(path +
                ": pre_tokenizer has no split pattern (expected a Split regex or a ByteLevel "
                "pre-tokenizer with use_regex)");
  }

  BpeTokenizer::Definition definition;
  definition.source_name = path;
  definition.pretokenizer = *pre_tokenizer.pattern;
  definition.add_prefix_space = pre_tokenizer.add_prefix_space;
  definition.nfc = read_normalizer(root.value("normalizer", json()), "normalizer", path);
  definition.whole_piece_lookup = model.value("ignore_merges", false);

  // Vocabulary: byte-level strings -> ids.
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    throw Error(path + ": missing model.vocab object");
  }
  const json& vocab = model["vocab"];
  const json& added = root.value("added_tokens", json::array());
  if (!added.is_array()) throw Error(path + ": added_tokens is not a list");
  // Ids index a table, so they must be dense-ish: a stray huge id would allocate gigabytes.
  const auto max_id = static_cast<int64_t>(2 * (vocab.size() + added.size()) + 1024);
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  std::unordered_map<std::string, int32_t> id_of_vocab_string;
  id_of_vocab_string.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > max_id) {
      throw Error(path + ": model.vocab entry \"" + it.key() + "\" has no valid id");
    }
    const auto id = it.value().get<int32_t>();
    id_of_vocab_string.emplace(it.key(), id);
    if (static_cast<std::size_t>(id) >= definition.token_bytes.size()) {
      definition.token_bytes.resize(static_cast<std::size_t>(id) + 1);
    }
    // A string outside the byte-level alphabet cannot come out of BPE; keep its UTF-8 so that it
    // can still be looked up and decoded.
    std::optional<std::string> bytes = alphabet.to_bytes(it.key());
    definition.token_bytes[static_cast<std::size_t>(id)] = bytes ? std::move(*bytes) : it.key();
  }

  // Merges: "left right" strings or [left, right] pairs, highest priority first.
  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) throw Error(path + ": model.merges is not a list");
  definition.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    std::string left;
    std::string right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw Error(path + ": model.merges[" + std::to_string(i) + "] \"" + text +
                    "\" is not two tokens separated by one space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw Error(path + ": model.merges[" + std::to_string(i) + "] is not a pair of tokens");
    }
    const auto left_it = id_of_vocab_string.find(left);
    const auto right_it = id_of_vocab_string.find(right);
    const auto merged_it = id_of_vocab_string.find(left + right);
    if (left_it == id_of_vocab_string.end() || right_it == id_of_vocab_string.end() ||
        merged_it == id_of_vocab_string.end()) {
      throw Error(path + ": model.merges[" + std::to_string(i) + "] (\"" + left + "\", \"" + right +
                  "\") names a token missing from model.vocab");
    }
    definition.merges.push_back(
        {left_it->second, right_it->second, merged_it->second, static_cast<int32_t>(i)});
  }

  // Added tokens.
  for (std::size_t i = 0; i < added.size(); ++i) {
    const json& token = added[i];
    if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
        !token.contains("content") || !token["content"].is_string() ||
        token["id"].get<int64_t>() < 0 || token["id"].get<int64_t>() > max_id) {
      throw Error(path + ": added_tokens[" + std::to_string(i) + "] lacks a valid id or content");
    }
    AddedToken added_token;
    added_token.id = token["id"].get<int32_t>();
    added_token.content = token["content"].get<std::string>();
    added_token.special = token.value("special", false);
    if (added_token.content.empty()) {
      throw Error(path + ": added_tokens[" + std::to_string(i) + "] has empty content");
    }
    definition.added_tokens.push_back(std::move(added_token));
  }

  const auto find_token = [&](const std::string& text) -> std::optional<int32_t> {
    for (const AddedToken& token : definition.added_tokens) {
      if (token.content == text) return token.id;
    }
    const std::optional<std::string> bytes = alphabet.to_bytes(text);
    if (bytes) {
      if (auto it = id_of_vocab_string.find(text); it != id_of_vocab_string.end())
        return it->second;
    }
    return std::nullopt;
  };

  // BOS and EOS come from the files beside tokenizer.json, when there are any.
  const fs::path folder = fs::path(path).parent_path();
  const std::optional<json> tokenizer_config = read_optional_json(
      folder / "tokenizer_config.json", "tokenizer_config.json", read_sidecar_files);
  const std::optional<json> generation_config = read_optional_json(
      folder / "generation_config.json", "generation_config.json", read_sidecar_files);
  const std::optional<json> model_config =
      read_optional_json(folder / "config.json", "config.json", read_sidecar_files);

  std::optional<std::string> bos_text = template_bos_token(root.value("post_processor", json()));
  if (!bos_text && tokenizer_config && tokenizer_config->is_object() &&
      tokenizer_config->value("add_bos_token", true)) {
    bos_text = token_text_of(tokenizer_config->value("bos_token", json()));
  }
  if (bos_text) {
    definition.bos_id = find_token(*bos_text);
    if (!definition.bos_id) {
      throw Error(path + ": the BOS token \"" + *bos_text + "\" is not in the vocabulary");
    }
  }

  if (tokenizer_config && tokenizer_config->is_object()) {
    if (std::optional<std::string> eos_text =
            token_text_of(tokenizer_config->value("eos_token", json()))) {
      const std::optional<int32_t> eos = find_token(*eos_text);
      if (!eos)
        throw Error(path + ": the EOS token \"" + *eos_text + "\" is not in the vocabulary");
      add_unique(definition.eos_ids, *eos);
    }
  }
  for (const std::optional<json>& config : {generation_config, model_config}) {
    if (config && config->is_object()) {
      for (int32_t id : ids_of(config->value("eos_token_id", json())))
        add_unique(definition.eos_ids, id);
    }
  }
  for (std::string_view stop : kKnownStopTokens) {
    for (const AddedToken& token : definition.added_tokens) {
      if (token.content == stop) add_unique(definition.eos_ids, token.id);
    }
  }
  return std::make_unique<BpeTokenizer>(std::move(definition));
}

// ----------------------------------------------------------------------------------------------------
// tiktoken

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt when malformed.
std::optional<std::string> decode_base64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int values[4];
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + static_cast<std::size_t>(k)];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        values[k] = 0;
        ++padding;
        continue;
      }
      if (padding > 0) return std::nullopt;  // data after padding
      values[k] = base64_value(c);
      if (values[k] < 0) return std::nullopt;
    }
    const uint32_t group =
        (static_cast<uint32_t>(values[0]) << 18) | (static_cast<uint32_t>(values[1]) << 12) |
        (static_cast<uint32_t>(values[2]) << 6) | static_cast<uint32_t>(values[3]);
    out.push_back(static_cast<char>((group >> 16) & 0xFF));
    if (padding < 2) out.push_back(static_cast<char>((group >> 8) & 0xFF));
    if (padding < 1) out.push_back(static_cast<char>(group & 0xFF));
  }
  return out;
}

constexpr int32_t kLlama3RankCount = 128000;
constexpr int32_t kQwenRankCount = 151643;

std::vector<AddedToken> llama3_special_tokens(int32_t first_id) {
  // Meta's reference tokenizer: 256 special tokens after the ranks, most of them reserved.
  std::vector<std::string> names = {"<|begin_of_text|>",
                                    "<|end_of_text|>",
                                    "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>",
                                    "<|reserved_special_token_2|>",
                                    "<|reserved_special_token_3|>",
                                    "<|start_header_id|>",
                                    "<|end_header_id|>",
                                    "<|reserved_special_token_4|>",
                                    "<|eot_id|>"};
  for (int i = 5; names.size() < 256; ++i) {
    names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  }
  std::vector<AddedToken> tokens;
  for (std::size_t i = 0; i < names.size(); ++i) {
    tokens.push_back({first_id + static_cast<int32_t>(i), names[i], true});
  }
  return tokens;
}

std::vector<AddedToken> qwen_special_tokens(int32_t first_id) {
  // Qwen3's added tokens; the first 22 are Qwen2/2.5's. The special flags follow Qwen3's
  // tokenizer.json, where tool-call, FIM and think markers are plain added tokens.
  const std::pair<const char*, bool> tokens_and_special[] = {
      {"<|endoftext|>", true},      {"<|im_start|>", true},
      {"<|im_end|>", true},         {"<|object_ref_start|>", true},
      {"<|object_ref_end|>", true}, {"<|box_start|>", true},
      {"<|box_end|>", true},        {"<|quad_start|>", true},
      {"<|quad_end|>", true},       {"<|vision_start|>", true},
      {"<|vision_end|>", true},     {"<|vision_pad|>", true},
      {"<|image_pad|>", true},      {"<|video_pad|>", true},
      {"<tool_call>", false},       {"</tool_call>", false},
      {"<|fim_prefix|>", false},    {"<|fim_middle|>", false},
      {"<|fim_suffix|>", false},    {"<|fim_pad|>", false},
      {"<|repo_name|>", false},     {"<|file_sep|>", false},
      {"<tool_response>", false},   {"</tool_response>", false},
      {"<think>", false},           {"</think>", false}};
  std::vector<AddedToken> tokens;
  int32_t id = first_id;
  for (const auto& [content, special] : tokens_and_special)
    tokens.push_back({id++, content, special});
  return tokens;
}

bool is_rank_line(std::string_view line) {
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 >= line.size()) return false;
  for (std::size_t i = 0; i < space; ++i) {
    if (base64_value(line[i]) < 0 && line[i] != '=') return false;
  }
  for (std::size_t i = space + 1; i < line.size(); ++i) {
    if (line[i] < '0' || line[i] > '9') return false;
  }
  return true;
}

std::unique_ptr<Tokenizer> build_checked(const json& root, const std::string& path,
                                         bool read_sidecar_files) {
  try {
    return build_from_tokenizer_json(root, path, read_sidecar_files);
  } catch (const json::exception& json_error) {
    // A field of the wrong JSON type that the checks above did not anticipate.
    throw Error(path + ": unexpected structure (" + json_error.what() + ")");
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> load_hf_bpe_tokenizer(const std::string& path) {
  std::error_code error;
  const std::string file =
      fs::is_directory(path, error) ? (fs::path(path) / "tokenizer.json").string() : path;
  return build_checked(parse_json_file(file, "tokenizer.json"), file, true);
}

std::unique_ptr<Tokenizer> parse_hf_bpe_tokenizer(std::string_view text,
                                                  const std::string& source) {
  return build_checked(parse_json(text, source), source, false);
}

bool looks_like_tiktoken_file(const std::string& path) {
  if (!is_regular_file(path)) return false;  // a FIFO or device would block or never end
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return false;
  std::string line;
  if (!std::getline(stream, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return is_rank_line(line);
}

std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path,
                                                   const TiktokenOptions& options) {
  return parse_tiktoken_tokenizer(read_text_file(path, "tiktoken rank file"), path, options);
}

std::unique_ptr<Tokenizer> parse_tiktoken_tokenizer(std::string_view text, const std::string& path,
                                                    const TiktokenOptions& options) {
  BpeTokenizer::Definition definition;
  definition.source_name = path;
  definition.whole_piece_lookup = true;  // tiktoken emits a piece that is a token as it is

  std::vector<std::size_t> line_of_rank;
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos) {
      throw Error(where + ": expected \"<base64 token> <rank>\", got no space");
    }
    const std::optional<std::string> token = decode_base64(line.substr(0, space));
    if (!token || token->empty()) throw Error(where + ": invalid base64 token");
    const std::string_view rank_text = line.substr(space + 1);
    int64_t rank = -1;
    const auto [rank_end, rank_error] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (rank_error != std::errc() || rank_end != rank_text.data() + rank_text.size() || rank < 0 ||
        rank > INT32_MAX / 2) {
      throw Error(where + ": invalid rank \"" + std::string(rank_text) + "\"");
    }
    if (rank != static_cast<int64_t>(definition.token_bytes.size())) {
      throw Error(where + ": rank " + std::to_string(rank) + " out of order (expected " +
                  std::to_string(definition.token_bytes.size()) + ")");
    }
    definition.token_bytes.push_back(*token);
    line_of_rank.push_back(line_number);
  }
  const auto rank_count = static_cast<int32_t>(definition.token_bytes.size());
  if (rank_count == 0) throw Error(path + ": empty tiktoken rank file");
  // Keyed by views into token_bytes, which no longer moves.
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(definition.token_bytes.size());
  for (int32_t rank = 0; rank < rank_count; ++rank) {
    const auto [it, inserted] =
        rank_of.emplace(definition.token_bytes[static_cast<std::size_t>(rank)], rank);
    if (!inserted) {
      throw Error(path + ":" + std::to_string(line_of_rank[static_cast<std::size_t>(rank)]) +
                  ": duplicate token (already rank " + std::to_string(it->second) + ")");
    }
  }

  TiktokenVocabulary vocabulary = TiktokenVocabulary::kPlain;
  if (options.vocabulary) {
    vocabulary = *options.vocabulary;
  } else if (rank_count == kLlama3RankCount) {
    vocabulary = TiktokenVocabulary::kLlama3;
  } else if (rank_count == kQwenRankCount) {
    vocabulary = TiktokenVocabulary::kQwen;
  } else if (!options.pretokenizer) {
    throw Error(path + ": unrecognised tiktoken vocabulary of " + std::to_string(rank_count) +
                " ranks (known: Llama 3 with 128000, Qwen with 151643); say which pre-tokenizer it "
                "needs");
  }
  // The special tokens are numbered from the end of the ranks.
  switch (vocabulary) {
    case TiktokenVocabulary::kLlama3:
      definition.pretokenizer = PretokenizerPattern::kLlama3;
      definition.added_tokens = llama3_special_tokens(rank_count);
      definition.bos_id = rank_count;  // <|begin_of_text|>
      break;
    case TiktokenVocabulary::kQwen:
      definition.pretokenizer = PretokenizerPattern::kQwen2;
      definition.added_tokens = qwen_special_tokens(rank_count);
      definition.nfc = true;  // Qwen normalises its input to NFC in both of its tokenizer forms
      break;
    case TiktokenVocabulary::kPlain:
      break;
  }
  for (const AddedToken& token : definition.added_tokens) {
    for (std::string_view stop : kKnownStopTokens) {
      if (token.content == stop) add_unique(definition.eos_ids, token.id);
    }
  }
  if (options.pretokenizer) definition.pretokenizer = *options.pretokenizer;

  // tiktoken merges any adjacent pair whose concatenation is a token, lowest rank first: every
  // split of every token into two tokens is a merge whose priority is the token's rank. A half can
  // only be a token if some token has its length; checking that before hashing the half keeps one
  // very long token from costing time quadratic in its length.
  std::vector<bool> is_token_length;
  for (const std::string& token : definition.token_bytes) {
    if (token.size() >= is_token_length.size()) is_token_length.resize(token.size() + 1);
    is_token_length[token.size()] = true;
  }
  for (int32_t id = 0; id < rank_count; ++id) {
    const std::string_view token = definition.token_bytes[static_cast<std::size_t>(id)];
    for (std::size_t split = 1; split < token.size(); ++split) {
      if (!is_token_length[split] || !is_token_length[token.size() - split]) continue;
      const auto left = rank_of.find(token.substr(0, split));
      if (left == rank_of.end()) continue;
      const auto right = rank_of.find(token.substr(split));
      if (right == rank_of.end()) continue;
      definition.merges.push_back({left->second, right->second, id, id});
    }
  }
  return std::make_unique<BpeTokenizer>(std::move(definition));
}

// ------------------------------------------------------------------------------------------------------
// BpeTokenizer

BpeTokenizer::BpeTokenizer(Definition definition)
    : token_bytes_(std::move(definition.token_bytes)),
      whole_piece_lookup_(definition.whole_piece_lookup),
      pretokenizer_(definition.pretokenizer),
      add_prefix_space_(definition.add_prefix_space),
      nfc_(definition.nfc),
      added_tokens_(std::move(definition.added_tokens)),
      bos_id_(definition.bos_id),
      eos_ids_(std::move(definition.eos_ids)),
      source_name_(std::move(definition.source_name)) {
  const std::size_t model_vocab_size = token_bytes_.size();
  for (const AddedToken& token : added_tokens_) {
    if (static_cast<std::size_t>(token.id) >= token_bytes_.size()) {
      token_bytes_.resize(static_cast<std::size_t>(token.id) + 1);
    }
  }
  is_added_.assign(token_bytes_.size(), false);
  bytes_to_id_.reserve(model_vocab_size);
  for (std::size_t id = 0; id < model_vocab_size; ++id) {
    if (!token_bytes_[id].empty()) bytes_to_id_.emplace(token_bytes_[id], static_cast<int32_t>(id));
  }
  for (const AddedToken& token : added_tokens_) {
    token_bytes_[static_cast<std::size_t>(token.id)] = token.content;
    is_added_[static_cast<std::size_t>(token.id)] = true;
  }
  for (int byte = 0; byte < 256; ++byte) {
    const auto it = bytes_to_id_.find(std::string_view(reinterpret_cast<const char*>(&byte), 1));
    if (it == bytes_to_id_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      throw Error(source_name_ + ": the vocabulary has no token for the single byte " + hex +
                  ", which byte-level BPE needs");
    }
    byte_ids_[byte] = it->second;
  }

  merges_.reserve(definition.merges.size());
  for (const Definition::Merge& merge : definition.merges) {
    const auto in_range = [&](int32_t id) {
      return id >= 0 && static_cast<std::size_t>(id) < model_vocab_size;
    };
    if (!in_range(merge.left) || !in_range(merge.right) || !in_range(merge.merged)) {
      throw Error(source_name_ + ": a merge refers to a token id outside the vocabulary");
    }
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(merge.left)) << 32) |
                         static_cast<uint32_t>(merge.right);
    merges_.emplace(key, MergeResult{merge.priority, merge.merged});  // the first listing wins
  }

  for (std::size_t index = 0; index < added_tokens_.size(); ++index) {
    const AddedToken& token = added_tokens_[index];
    const auto first_byte = static_cast<unsigned char>(token.content[0]);
    special_matcher_.by_first_byte[first_byte].push_back(static_cast<int32_t>(index));
    if (!token.special)
      always_matcher_.by_first_byte[first_byte].push_back(static_cast<int32_t>(index));
  }
  for (AddedTokenMatcher* matcher : {&special_matcher_, &always_matcher_}) {
    for (std::vector<int32_t>& candidates : matcher->by_first_byte) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
        return added_tokens_[static_cast<std::size_t>(a)].content.size() >
               added_tokens_[static_cast<std::size_t>(b)].content.size();
      });
    }
  }
}

int32_t BpeTokenizer::AddedTokenMatcher::find(const std::vector<AddedToken>& tokens,
                                              std::string_view text, size_t from,
                                              size_t& position) const {
  for (size_t at = from; at < text.size(); ++at) {
    const std::vector<int32_t>& candidates = by_first_byte[static_cast<unsigned char>(text[at])];
    for (int32_t index : candidates) {
      if (text.substr(at).starts_with(tokens[static_cast<std::size_t>(index)].content)) {
        position = at;
        return index;
      }
    }
  }
  return -1;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text,
                                          const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_bos && bos_id_) ids.push_back(*bos_id_);
  const AddedTokenMatcher& matcher = options.parse_special ? special_matcher_ : always_matcher_;
  WordCache cache;
  for (size_t position = 0; position < text.size();) {
    size_t found = text.size();
    const int32_t index = matcher.find(added_tokens_, text, position, found);
    encode_text_run(text.substr(position, found - position), cache, ids);
    if (index < 0) break;
    const AddedToken& token = added_tokens_[static_cast<std::size_t>(index)];
    ids.push_back(token.id);
    position = found + token.content.size();
  }
  return ids;
}

void BpeTokenizer::encode_text_run(std::string_view text, WordCache& cache,
                                   std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string rewritten;
  if (nfc_ && !unicode::is_nfc_quick(text)) {
    rewritten = unicode::to_nfc(text);
    text = rewritten;
  }
  if (add_prefix_space_ && text.front() != ' ') {
    std::string prefixed;  // a new string: `text` may view `rewritten`
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    rewritten = std::move(prefixed);
    text = rewritten;
  }
  std::vector<std::string_view> pieces;
  pretokenize(text, pretokenizer_, pieces);
  for (std::string_view piece : pieces) {
    if (piece.size() == 1) {
      ids.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (whole_piece_lookup_) {
      if (const auto it = bytes_to_id_.find(piece); it != bytes_to_id_.end()) {
        ids.push_back(it->second);
        continue;
      }
    }
    if (const auto it = cache.find(piece); it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      continue;
    }
    const std::size_t first = ids.size();
    encode_piece(piece, ids);
    if (cache.size() >= kMaxCachedWords) cache.clear();
    cache.emplace(
        std::string(piece),
        std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
  }
}

const BpeTokenizer::MergeResult* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const auto it = merges_.find(key);
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  // Symbols form a linked list over byte positions; a merge keeps the left symbol and unlinks the
  // right one. Candidate merges sit in a min-heap by (priority, position) and are checked for
  // staleness when popped, which gives the lowest-priority, leftmost merge at every step in
  // O(n log n) even for very long pieces.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // -1 at the end
  };
  struct Candidate {
    int32_t priority;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
    bool operator>(const Candidate& other) const {
      return priority != other.priority ? priority > other.priority : left > other.left;
    }
  };
  const auto size = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(static_cast<std::size_t>(size));
  for (int32_t i = 0; i < size; ++i) {
    symbols[static_cast<std::size_t>(i)] = {
        byte_ids_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])], i - 1,
        i + 1 < size ? i + 1 : -1};
  }
  std::vector<Candidate> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const Symbol& left_symbol = symbols[static_cast<std::size_t>(left)];
    if (left_symbol.next < 0) return;
    const int32_t right_id = symbols[static_cast<std::size_t>(left_symbol.next)].id;
    if (const MergeResult* merge = find_merge(left_symbol.id, right_id)) {
      heap.push_back(
          {merge->priority, left, left_symbol.next, left_symbol.id, right_id, merge->merged});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i + 1 < size; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate candidate = heap.back();
    heap.pop_back();
    Symbol& left = symbols[static_cast<std::size_t>(candidate.left)];
    // Stale when either side has merged since: ids only ever grow into longer tokens, so equal ids
    // and the same neighbour mean the pair is still there.
    if (left.id != candidate.left_id || left.next != candidate.right ||
        symbols[static_cast<std::size_t>(candidate.right)].id != candidate.right_id) {
      continue;
    }
    Symbol& right = symbols[static_cast<std::size_t>(candidate.right)];
    left.id = candidate.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = candidate.left;
    right.id = -1;
    consider(left.prev);
    consider(candidate.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
    ids.push_back(symbols[static_cast<std::size_t>(i)].id);
  }
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " + source_name_ +
                " (" + std::to_string(vocab_size()) + " tokens)");
  }
  return token_bytes_[static_cast<std::size_t>(id)];
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view text) const {
  for (const AddedToken& token : added_tokens_) {
    if (token.content == text) return token.id;
  }
  if (const auto it = bytes_to_id_.find(text); it != bytes_to_id_.end()) return it->second;
  return std::nullopt;
}

}  // namespace entropyinfer

#include "tokenizer/llama2c_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <queue>
#include <utility>

#include "core/error.h"
#include "core/user_file.h"

namespace entropyinfer {
namespace {

// run.c starts its search for the best pair at this score and only accepts strictly better ones.
constexpr float kNoMergeScore = -1e10f;

int32_t read_int32_le(std::string_view bytes, size_t offset) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
  }
  return static_cast<int32_t>(value);
}

float read_float_le(std::string_view bytes, size_t offset) {
  const auto bits = static_cast<uint32_t>(read_int32_le(bytes, offset));
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// run.c recognises byte tokens with sscanf(piece, "<0x%02hhX>", ...): "<0x" then one or two hex
// digits. Returns the byte, or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() < 4 || text.substr(0, 3) != "<0x") return -1;
  int value = hex_digit(text[3]);
  if (value < 0) return -1;
  if (text.size() > 4 && hex_digit(text[4]) >= 0) value = value * 16 + hex_digit(text[4]);
  return value;
}

}  // namespace

namespace {

// A vocabulary size no file can satisfy is the caller's mistake: refused before any file is read.
void check_vocab_size_argument(int vocab_size, const std::string& path) {
  if (vocab_size < -1 || vocab_size == 0) {
    throw Error("llama2.c tokenizer '" + path + "': invalid vocabulary size " +
                std::to_string(vocab_size) + " (the model's vocab_size, or -1 to read to the end)");
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int vocab_size) {
  check_vocab_size_argument(vocab_size, path);
  return parse_llama2c_tokenizer(read_user_file(path, "llama2.c tokenizer"), vocab_size, path);
}

std::unique_ptr<Tokenizer> parse_llama2c_tokenizer(std::string_view bytes, int vocab_size,
                                                   const std::string& path) {
  check_vocab_size_argument(vocab_size, path);
  if (bytes.size() < 4) {
    throw Error("llama2.c tokenizer '" + path + "' is too short to hold its header (" +
                std::to_string(bytes.size()) + " bytes)");
  }
  const int32_t max_token_length = read_int32_le(bytes, 0);
  if (max_token_length <= 0 || max_token_length > (1 << 20)) {
    throw Error("llama2.c tokenizer '" + path + "' has an implausible max_token_length " +
                std::to_string(max_token_length) + " (not a tokenizer.bin?)");
  }

  std::vector<Llama2cTokenizer::Entry> vocab;
  // Each token takes at least 8 bytes, so a vocabulary size the bytes cannot hold (a corrupt
  // checkpoint header) reserves no more than the file's worth and then fails as truncated.
  if (vocab_size > 0) vocab.reserve(std::min(static_cast<size_t>(vocab_size), bytes.size() / 8));
  size_t offset = 4;
  while (vocab_size < 0 ? offset < bytes.size() : vocab.size() < static_cast<size_t>(vocab_size)) {
    const std::string where =
        "token " + std::to_string(vocab.size()) + " at byte " + std::to_string(offset);
    if (bytes.size() - offset < 8) {
      if (offset == bytes.size()) {
        throw Error("llama2.c tokenizer '" + path + "' holds only " + std::to_string(vocab.size()) +
                    " tokens but the model's vocabulary has " + std::to_string(vocab_size) +
                    " (wrong file, or truncated)");
      }
      throw Error("llama2.c tokenizer '" + path + "' is truncated inside the header of " + where);
    }
    Llama2cTokenizer::Entry entry;
    entry.score = read_float_le(bytes, offset);
    const int32_t length = read_int32_le(bytes, offset + 4);
    offset += 8;
    if (length < 0 || length > (1 << 20)) {
      throw Error("llama2.c tokenizer '" + path + "' has an invalid length " +
                  std::to_string(length) + " for " + where + " (corrupt file)");
    }
    if (bytes.size() - offset < static_cast<size_t>(length)) {
      throw Error("llama2.c tokenizer '" + path + "' is truncated inside the text of " + where);
    }
    entry.text = std::string(bytes.substr(offset, static_cast<size_t>(length)));
    offset += static_cast<size_t>(length);
    vocab.push_back(std::move(entry));
  }
  return std::make_unique<Llama2cTokenizer>(std::move(vocab), max_token_length, path);
}

Llama2cTokenizer::Llama2cTokenizer(std::vector<Entry> vocab, int32_t max_token_length,
                                   const std::string& source_name)
    : vocab_(std::move(vocab)), max_token_length_(max_token_length), source_name_(source_name) {
  // run.c spells unknown characters with byte tokens 3..258, so they must exist.
  constexpr size_t kMinimumVocab = kFirstByteId + 256;
  if (vocab_.size() < kMinimumVocab) {
    throw Error("llama2.c tokenizer '" + source_name_ + "' has " + std::to_string(vocab_.size()) +
                " tokens; at least " + std::to_string(kMinimumVocab) +
                " are needed (unk, BOS, EOS and 256 byte tokens)");
  }
  for (size_t id = 0; id < vocab_.size(); ++id) {
    // run.c holds tokens as C strings: anything after a NUL byte is invisible to it.
    std::string& text = vocab_[id].text;
    const size_t nul = text.find('\0');
    if (nul != std::string::npos) text.resize(nul);
    // run.c finds tokens by binary search, which picks an arbitrary one among duplicates; the
    // lowest id is the deterministic choice.
    ids_by_text_.emplace(text, static_cast<int32_t>(id));
    for (size_t at = text.find(' ', 1); at != std::string::npos; at = text.find(' ', at + 1)) {
      if (text[at - 1] != ' ') words_are_independent_ = false;
    }
  }
  // BOS takes part in merges too; it stays apart from the first word only if its text ends in a
  // non-space byte.
  const std::string& bos_text = vocab_[kBosId].text;
  if (bos_text.empty() || bos_text.back() == ' ') words_are_independent_ = false;
}

void Llama2cTokenizer::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_.size()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(vocab_.size()) + " tokens of " + source_name_);
  }
}

float Llama2cTokenizer::score(int32_t id) const { return entry(id).score; }

const Llama2cTokenizer::Entry& Llama2cTokenizer::entry(int32_t id) const {
  check_id(id);
  return vocab_[static_cast<size_t>(id)];
}

std::optional<int32_t> Llama2cTokenizer::find_text(std::string_view text) const {
  const auto it = ids_by_text_.find(text);
  if (it == ids_by_text_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> Llama2cTokenizer::token_id(std::string_view text) const {
  if (const auto id = find_text(text)) return id;
  if (text == "<unk>") return kUnkId;
  if (text == "<s>") return kBosId;
  if (text == "</s>") return kEosId;
  return std::nullopt;
}

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view text,
                                              const EncodeOptions& options) const {
  return encode(text, options.add_bos, false);
}

// Splits into "characters" exactly as run.c does: a byte that is not a continuation byte starts a
// new character; continuation bytes are appended while the character is shorter than 4 bytes. Each
// character becomes its token, or its byte tokens when it is not in the vocabulary.
void Llama2cTokenizer::append_character_tokens(std::string_view text,
                                               std::vector<int32_t>& tokens) const {
  std::string character;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    if ((byte & 0xC0) != 0x80) character.clear();
    character += static_cast<char>(byte);
    const bool next_is_continuation =
        i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_continuation && character.size() < 4) continue;
    // A NUL byte ends a C string, so run.c never sees one; it is spelt as its byte token here.
    const auto id = character.find('\0') == std::string::npos ? find_text(character) : std::nullopt;
    if (id) {
      tokens.push_back(*id);
    } else {
      for (const char c : character) {
        tokens.push_back(kFirstByteId + static_cast<int32_t>(static_cast<uint8_t>(c)));
      }
    }
    character.clear();
  }
}

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view text, bool add_bos,
                                              bool add_eos) const {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() / 2 + 3);
  if (add_bos) tokens.push_back(kBosId);
  // run.c would push -1 when " " is missing; leaving the prefix out is the sane reading.
  const std::optional<int32_t> dummy_prefix = text.empty() ? std::nullopt : find_text(" ");

  if (!words_are_independent_ || !dummy_prefix) {
    if (dummy_prefix) tokens.push_back(*dummy_prefix);
    append_character_tokens(text, tokens);
    merge_pairs(tokens);  // run.c lets even BOS take part in merges
    if (add_eos) tokens.push_back(kEosId);
    return tokens;
  }

  // No token joins a non-space byte to a following space, so no merge crosses the start of a word
  // (a space after a non-space byte), not even one with BOS: each word is merged on its own with
  // the same result, and repeated words are looked up instead of merged again.
  std::unordered_map<std::string_view, std::vector<int32_t>> merged_words;
  std::vector<int32_t> word_tokens;
  const auto add_word = [&](std::string_view word, bool first) {
    if (!first) {
      const auto it = merged_words.find(word);
      if (it != merged_words.end()) {
        tokens.insert(tokens.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    word_tokens.clear();
    if (first) word_tokens.push_back(*dummy_prefix);
    append_character_tokens(word, word_tokens);
    merge_pairs(word_tokens);
    tokens.insert(tokens.end(), word_tokens.begin(), word_tokens.end());
    if (!first) merged_words.emplace(word, word_tokens);
  };
  size_t word_start = 0;
  bool first = true;
  for (size_t at = text.find(' ', 1); at != std::string_view::npos; at = text.find(' ', at + 1)) {
    if (text[at - 1] == ' ') continue;
    add_word(text.substr(word_start, at - word_start), first);
    first = false;
    word_start = at;
  }
  add_word(text.substr(word_start), first);
  if (add_eos) tokens.push_back(kEosId);
  return tokens;
}

// run.c rescans every adjacent pair after each merge and takes the best score, the leftmost among
// equals. A priority queue over a linked list gives the same merges in O(n log n).
void Llama2cTokenizer::merge_pairs(std::vector<int32_t>& tokens) const {
  const size_t count = tokens.size();
  if (count < 2) return;
  struct Node {
    int32_t id;
    int prev;
    int next;
    uint32_t version;  // bumped whenever the node changes, so queued pairs can detect staleness
  };
  std::vector<Node> nodes(count);
  for (size_t i = 0; i < count; ++i) {
    nodes[i] = {tokens[i], static_cast<int>(i) - 1, i + 1 < count ? static_cast<int>(i) + 1 : -1,
                0};
  }
  struct Candidate {
    float score;
    int left;
    int right;
    uint32_t left_version;
    uint32_t right_version;
    int32_t merged_id;
  };
  const auto lower_priority = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> queue(
      lower_priority);
  std::string joined;
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    joined = vocab_[static_cast<size_t>(nodes[static_cast<size_t>(left)].id)].text;
    joined += vocab_[static_cast<size_t>(nodes[static_cast<size_t>(right)].id)].text;
    const auto merged = find_text(joined);
    if (!merged) return;
    const float merged_score = vocab_[static_cast<size_t>(*merged)].score;
    if (!(merged_score > kNoMergeScore)) return;  // also rejects NaN, as run.c's comparison does
    queue.push({merged_score, left, right, nodes[static_cast<size_t>(left)].version,
                nodes[static_cast<size_t>(right)].version, *merged});
  };
  for (size_t i = 0; i + 1 < count; ++i) consider(static_cast<int>(i), static_cast<int>(i) + 1);

  std::vector<bool> removed(count, false);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Node& left = nodes[static_cast<size_t>(top.left)];
    Node& right = nodes[static_cast<size_t>(top.right)];
    if (removed[static_cast<size_t>(top.left)] || removed[static_cast<size_t>(top.right)] ||
        left.next != top.right || left.version != top.left_version ||
        right.version != top.right_version) {
      continue;
    }
    left.id = top.merged_id;
    ++left.version;
    removed[static_cast<size_t>(top.right)] = true;
    left.next = right.next;
    if (right.next >= 0) nodes[static_cast<size_t>(right.next)].prev = top.left;
    consider(left.prev, top.left);
    consider(top.left, left.next);
  }

  tokens.clear();
  for (int index = 0; index >= 0; index = nodes[static_cast<size_t>(index)].next) {
    tokens.push_back(nodes[static_cast<size_t>(index)].id);
  }
}

std::string Llama2cTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  const std::string& text = vocab_[static_cast<size_t>(id)].text;
  const int byte = parse_byte_token(text);
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  return text;
}

std::string Llama2cTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  bool after_bos = true;  // the encoder's dummy prefix stands at the very start
  for (const int32_t id : ids) {
    check_id(id);
    if (id == kBosId) {
      after_bos = true;
      continue;
    }
    const std::string& piece = vocab_[static_cast<size_t>(id)].text;
    // run.c strips the space from the piece text before recognising byte tokens.
    std::string_view visible = piece;
    if (after_bos && !visible.empty() && visible[0] == ' ') visible.remove_prefix(1);
    after_bos = false;
    const int byte = parse_byte_token(visible);
    if (byte >= 0) {
      text += static_cast<char>(byte);
    } else {
      text += visible;
    }
  }
  return text;
}

}  // namespace entropyinfer

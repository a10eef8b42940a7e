#include "tokenizer/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <queue>
#include <utility>

#include "core/error.h"
#include "core/user_file.h"
#include "tokenizer/protobuf_reader.h"

namespace entropyinfer {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space
constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Field numbers of sentencepiece_model.proto.
namespace model_proto {
constexpr uint32_t kPieces = 1;
constexpr uint32_t kTrainerSpec = 2;
constexpr uint32_t kNormalizerSpec = 3;
}  // namespace model_proto
namespace piece_proto {
constexpr uint32_t kPiece = 1;
constexpr uint32_t kScore = 2;
constexpr uint32_t kType = 3;
}  // namespace piece_proto
namespace trainer_proto {
constexpr uint32_t kModelType = 3;
constexpr uint32_t kTreatWhitespaceAsSuffix = 24;
constexpr uint32_t kByteFallback = 35;
constexpr uint32_t kUnkId = 40;
constexpr uint32_t kBosId = 41;
constexpr uint32_t kEosId = 42;
constexpr int32_t kModelTypeUnigram = 1;
constexpr int32_t kModelTypeBpe = 2;
constexpr int32_t kModelTypeWord = 3;
constexpr int32_t kModelTypeChar = 4;
}  // namespace trainer_proto
namespace normalizer_proto {
constexpr uint32_t kName = 1;
constexpr uint32_t kPrecompiledCharsmap = 2;
constexpr uint32_t kAddDummyPrefix = 3;
constexpr uint32_t kRemoveExtraWhitespaces = 4;
constexpr uint32_t kEscapeWhitespaces = 5;
constexpr uint32_t kNormalizationRuleTsv = 6;
}  // namespace normalizer_proto

const char* model_type_name(int32_t type) {
  switch (type) {
    case trainer_proto::kModelTypeUnigram:
      return "unigram";
    case trainer_proto::kModelTypeWord:
      return "word";
    case trainer_proto::kModelTypeChar:
      return "char";
    default:
      return "unknown";
  }
}

SentencePieceTokenizer::Piece parse_piece(ProtobufReader reader, size_t index) {
  SentencePieceTokenizer::Piece piece;
  bool has_text = false;
  while (reader.next_field()) {
    switch (reader.field_number()) {
      case piece_proto::kPiece:
        piece.text = std::string(reader.read_bytes());
        has_text = true;
        break;
      case piece_proto::kScore:
        piece.score = reader.read_float();
        break;
      case piece_proto::kType: {
        const int32_t type = reader.read_int32();
        if (type < 1 || type > 6) {
          throw Error(reader.source_name() + ": piece " + std::to_string(index) +
                      " has an invalid type " + std::to_string(type));
        }
        piece.type = static_cast<SentencePieceTokenizer::PieceType>(type);
        break;
      }
      default:
        reader.skip();
    }
  }
  if (!has_text || piece.text.empty()) {
    throw Error(reader.source_name() + ": piece " + std::to_string(index) + " has no text");
  }
  return piece;
}

// Length of one UTF-8 character at the start of `text`, or 0 when the bytes there are not a valid,
// complete, shortest-form UTF-8 character.
size_t valid_utf8_length(std::string_view text) {
  const auto lead = static_cast<uint8_t>(text[0]);
  size_t length = 0;
  uint32_t codepoint = 0;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    codepoint = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    codepoint = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    codepoint = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    if ((byte & 0xC0) != 0x80) return 0;
    codepoint = (codepoint << 6) | (byte & 0x3F);
  }
  if ((length == 3 && codepoint < 0x800) || (length == 4 && codepoint < 0x10000) ||
      codepoint > 0x10FFFF || (codepoint >= 0xD800 && codepoint <= 0xDFFF)) {
    return 0;
  }
  return length;
}

// Parses "<0xNN>" (two upper- or lower-case hex digits); -1 when `text` is not of that form.
int parse_byte_piece(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

bool looks_like_sentencepiece_model(const std::string& path) {
  if (!is_regular_file(path)) return false;  // a FIFO or device would block or never end
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return false;
  unsigned char head[16] = {};
  stream.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(stream.gcount());
  // Field 1 (pieces), length-delimited (tag byte 0x0A), then the piece message's length as a
  // varint, then the piece's first field: its text (0x0A) or, rarely, its score (0x15).
  if (got < 3 || head[0] != 0x0A) return false;
  size_t position = 1;
  uint64_t piece_length = 0;
  for (int shift = 0; position < got && shift < 35; shift += 7) {
    const unsigned char byte = head[position++];
    piece_length |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) break;
  }
  if (position >= got || piece_length == 0 || piece_length > 4096) return false;
  return head[position] == 0x0A || head[position] == 0x15;
}

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path) {
  return parse_sentencepiece_tokenizer(read_user_file(model_path, "SentencePiece model"),
                                       model_path);
}

std::unique_ptr<Tokenizer> parse_sentencepiece_tokenizer(std::string_view bytes,
                                                         const std::string& model_path) {
  if (bytes.empty()) throw Error("SentencePiece model '" + model_path + "' is empty");

  std::vector<SentencePieceTokenizer::Piece> pieces;
  SentencePieceTokenizer::Settings settings;
  int32_t model_type = trainer_proto::kModelTypeUnigram;  // the proto's default
  bool treat_whitespace_as_suffix = false;
  std::string normalizer_name;
  bool has_charsmap = false;
  bool has_rule_tsv = false;

  ProtobufReader reader(bytes, model_path);
  while (reader.next_field()) {
    switch (reader.field_number()) {
      case model_proto::kPieces:
        pieces.push_back(parse_piece(reader.read_message(), pieces.size()));
        break;
      case model_proto::kTrainerSpec: {
        ProtobufReader trainer = reader.read_message();
        while (trainer.next_field()) {
          switch (trainer.field_number()) {
            case trainer_proto::kModelType:
              model_type = trainer.read_int32();
              break;
            case trainer_proto::kTreatWhitespaceAsSuffix:
              treat_whitespace_as_suffix = trainer.read_bool();
              break;
            case trainer_proto::kByteFallback:
              settings.byte_fallback = trainer.read_bool();
              break;
            case trainer_proto::kUnkId:
              settings.unk_id = trainer.read_int32();
              break;
            case trainer_proto::kBosId:
              settings.bos_id = trainer.read_int32();
              break;
            case trainer_proto::kEosId:
              settings.eos_id = trainer.read_int32();
              break;
            default:
              trainer.skip();
          }
        }
        break;
      }
      case model_proto::kNormalizerSpec: {
        ProtobufReader normalizer = reader.read_message();
        while (normalizer.next_field()) {
          switch (normalizer.field_number()) {
            case normalizer_proto::kName:
              normalizer_name = std::string(normalizer.read_bytes());
              break;
            case normalizer_proto::kPrecompiledCharsmap:
              has_charsmap = !normalizer.read_bytes().empty();
              break;
            case normalizer_proto::kAddDummyPrefix:
              settings.add_dummy_prefix = normalizer.read_bool();
              break;
            case normalizer_proto::kRemoveExtraWhitespaces:
              settings.remove_extra_whitespaces = normalizer.read_bool();
              break;
            case normalizer_proto::kEscapeWhitespaces:
              settings.escape_whitespaces = normalizer.read_bool();
              break;
            case normalizer_proto::kNormalizationRuleTsv:
              has_rule_tsv = !normalizer.read_bytes().empty();
              break;
            default:
              normalizer.skip();
          }
        }
        break;
      }
      default:
        reader.skip();
    }
  }

  if (pieces.empty()) {
    throw Error("SentencePiece model '" + model_path + "' holds no pieces (not a model file?)");
  }
  if (model_type != trainer_proto::kModelTypeBpe) {
    throw Error("SentencePiece model '" + model_path + "' is a " + model_type_name(model_type) +
                " model (type " + std::to_string(model_type) +
                "); only BPE models (Llama 2, Mistral) are supported");
  }
  if (treat_whitespace_as_suffix) {
    throw Error("SentencePiece model '" + model_path +
                "' sets treat_whitespace_as_suffix, which is not supported");
  }
  if (has_charsmap || has_rule_tsv) {
    throw Error("SentencePiece model '" + model_path + "' uses the normalization rules '" +
                normalizer_name + "', which are not supported (only identity normalization)");
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(pieces), settings, model_path);
}

size_t SentencePieceTokenizer::LiteralMatcher::match(const std::vector<Piece>& pieces,
                                                     std::string_view text, int32_t& id) const {
  if (empty || text.empty()) return 0;
  for (const int32_t candidate : candidates_by_first_byte[static_cast<uint8_t>(text[0])]) {
    const std::string& piece_text = pieces[static_cast<size_t>(candidate)].text;
    if (text.substr(0, piece_text.size()) == piece_text) {
      id = candidate;
      return piece_text.size();
    }
  }
  return 0;
}

SentencePieceTokenizer::SentencePieceTokenizer(std::vector<Piece> pieces, const Settings& settings,
                                               const std::string& source_name)
    : pieces_(std::move(pieces)), settings_(settings), source_name_(source_name) {
  byte_piece_ids_.fill(-1);
  const auto size = static_cast<int32_t>(pieces_.size());
  for (int32_t id = 0; id < size; ++id) {
    const Piece& piece = pieces_[static_cast<size_t>(id)];
    if (piece.text.empty()) {
      throw Error(source_name_ + ": piece " + std::to_string(id) + " has no text");
    }
    const auto [existing, inserted] = all_pieces_.emplace(piece.text, id);
    if (!inserted) {
      throw Error(source_name_ + ": piece '" + piece.text + "' appears twice (ids " +
                  std::to_string(existing->second) + " and " + std::to_string(id) + ")");
    }
    switch (piece.type) {
      case PieceType::kNormal:
      case PieceType::kUnused:
        mergeable_pieces_.emplace(piece.text, id);
        break;
      case PieceType::kUserDefined:
        mergeable_pieces_.emplace(piece.text, id);
        user_defined_matcher_.candidates_by_first_byte[static_cast<uint8_t>(piece.text[0])]
            .push_back(id);
        user_defined_matcher_.empty = false;
        break;
      case PieceType::kControl:
      case PieceType::kUnknown:
        special_matcher_.candidates_by_first_byte[static_cast<uint8_t>(piece.text[0])].push_back(
            id);
        special_matcher_.empty = false;
        break;
      case PieceType::kByte: {
        const int byte = parse_byte_piece(piece.text);
        if (byte < 0) {
          throw Error(source_name_ + ": byte piece " + std::to_string(id) + " is '" + piece.text +
                      "', not of the form <0xNN>");
        }
        byte_piece_ids_[static_cast<size_t>(byte)] = id;
        break;
      }
    }
  }
  for (LiteralMatcher* matcher : {&user_defined_matcher_, &special_matcher_}) {
    for (auto& candidates : matcher->candidates_by_first_byte) {
      std::stable_sort(candidates.begin(), candidates.end(), [this](int32_t a, int32_t b) {
        return pieces_[static_cast<size_t>(a)].text.size() >
               pieces_[static_cast<size_t>(b)].text.size();
      });
    }
  }
  words_are_independent_ = true;
  const std::string_view space = space_marker();
  for (const auto& [text, id] : mergeable_pieces_) {
    for (size_t at = text.find(space, 1); at != std::string::npos; at = text.find(space, at + 1)) {
      if (at < space.size() || text.compare(at - space.size(), space.size(), space) != 0) {
        words_are_independent_ = false;
      }
    }
  }
  if (settings_.unk_id < 0 || settings_.unk_id >= size) {
    throw Error(source_name_ + ": unknown-token id " + std::to_string(settings_.unk_id) +
                " is outside the vocabulary of " + std::to_string(size) + " pieces");
  }
  if (settings_.byte_fallback) {
    for (size_t byte = 0; byte < 256; ++byte) {
      if (byte_piece_ids_[byte] < 0) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned>(byte));
        throw Error(source_name_ + ": byte fallback is on but the byte piece " + name +
                    " is missing");
      }
    }
  }
}

std::string_view SentencePieceTokenizer::space_marker() const {
  return settings_.escape_whitespaces ? kSpaceMarker : std::string_view(" ");
}

void SentencePieceTokenizer::check_id(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) {
    throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                std::to_string(pieces_.size()) + " pieces of " + source_name_);
  }
}

const SentencePieceTokenizer::Piece& SentencePieceTokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[static_cast<size_t>(id)];
}

std::optional<int32_t> SentencePieceTokenizer::bos_id() const {
  if (settings_.bos_id < 0 || settings_.bos_id >= vocab_size()) return std::nullopt;
  return settings_.bos_id;
}

std::vector<int32_t> SentencePieceTokenizer::eos_ids() const {
  if (settings_.eos_id < 0 || settings_.eos_id >= vocab_size()) return {};
  return {settings_.eos_id};
}

std::optional<int32_t> SentencePieceTokenizer::token_id(std::string_view text) const {
  const auto it = all_pieces_.find(text);
  if (it == all_pieces_.end()) return std::nullopt;
  return it->second;
}

std::string SentencePieceTokenizer::token_bytes(int32_t id) const {
  const Piece& entry = piece(id);
  switch (entry.type) {
    case PieceType::kByte:
      return std::string(1, static_cast<char>(parse_byte_piece(entry.text)));
    case PieceType::kControl:
    case PieceType::kUnknown:
      return entry.text;
    default:
      break;
  }
  std::string bytes;
  bytes.reserve(entry.text.size());
  for (size_t i = 0; i < entry.text.size();) {
    if (entry.text.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
      bytes += ' ';
      i += kSpaceMarker.size();
    } else {
      bytes += entry.text[i++];
    }
  }
  return bytes;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  bool at_start = true;  // nothing but control tokens so far
  for (const int32_t id : ids) {
    std::string bytes = token_bytes(id);
    const PieceType type = piece(id).type;
    if (at_start && type != PieceType::kControl) {
      at_start = false;
      if (settings_.add_dummy_prefix && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
    }
    text += bytes;
  }
  return text;
}

std::string SentencePieceTokenizer::normalize(std::string_view text) const {
  // Replace invalid UTF-8 with U+FFFD one byte at a time, as SentencePiece's normalizer does.
  std::string cleaned;
  cleaned.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = valid_utf8_length(text.substr(i));
    if (length == 0) {
      cleaned += kReplacementCharacter;
      ++i;
    } else {
      cleaned.append(text.substr(i, length));
      i += length;
    }
  }
  if (settings_.remove_extra_whitespaces) {
    std::string collapsed;
    collapsed.reserve(cleaned.size());
    for (const char c : cleaned) {
      if (c == ' ' && (collapsed.empty() || collapsed.back() == ' ')) continue;
      collapsed += c;
    }
    while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
    cleaned = std::move(collapsed);
  }
  if (cleaned.empty()) return {};

  std::string normalized;
  normalized.reserve(cleaned.size() + cleaned.size() / 2 + kSpaceMarker.size());
  const std::string_view space =
      settings_.escape_whitespaces ? kSpaceMarker : std::string_view(" ");
  if (settings_.add_dummy_prefix) normalized += space;
  for (const char c : cleaned) {
    if (c == ' ') {
      normalized += space;
    } else {
      normalized += c;
    }
  }
  return normalized;
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text,
                                                    const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  if (options.add_bos && bos_id()) ids.push_back(*bos_id());
  if (!options.parse_special || special_matcher_.empty) {
    encode_text_run(text, ids);
    return ids;
  }
  size_t run_start = 0;
  size_t position = 0;
  while (position < text.size()) {
    int32_t special_id = -1;
    const size_t length = special_matcher_.match(pieces_, text.substr(position), special_id);
    if (length == 0) {
      ++position;
      continue;
    }
    encode_text_run(text.substr(run_start, position - run_start), ids);
    ids.push_back(special_id);
    position += length;
    run_start = position;
  }
  encode_text_run(text.substr(run_start), ids);
  return ids;
}

void SentencePieceTokenizer::encode_text_run(std::string_view text,
                                             std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  const std::string normalized = normalize(text);
  if (normalized.empty()) return;
  if (!words_are_independent_) {
    encode_normalized(normalized, ids);
    return;
  }
  // No piece joins a character to a following space, so no merge crosses the start of a word
  // (a space after a non-space character) and each word can be segmented on its own, with the same
  // result as segmenting the whole run. Short words keep the merge queue small, and repeated words
  // are looked up instead of segmented again.
  const std::string_view run(normalized);
  const std::string_view space = space_marker();
  std::unordered_map<std::string_view, std::vector<int32_t>> segmented_words;
  std::vector<int32_t> word_ids;
  const auto add_word = [&](std::string_view word) {
    const auto it = segmented_words.find(word);
    if (it != segmented_words.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
    word_ids.clear();
    encode_normalized(word, word_ids);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    segmented_words.emplace(word, word_ids);
  };
  size_t word_start = 0;
  for (size_t at = run.find(space, 1); at != std::string_view::npos; at = run.find(space, at + 1)) {
    const bool after_space =
        at >= space.size() && run.compare(at - space.size(), space.size(), space) == 0;
    if (after_space) continue;
    add_word(run.substr(word_start, at - word_start));
    word_start = at;
  }
  add_word(run.substr(word_start));
}

void SentencePieceTokenizer::emit_piece(std::string_view piece_text,
                                        std::vector<int32_t>& ids) const {
  const auto it = all_pieces_.find(piece_text);
  if (it != all_pieces_.end() &&
      pieces_[static_cast<size_t>(it->second)].type != PieceType::kUnknown) {
    ids.push_back(it->second);
    return;
  }
  if (settings_.byte_fallback) {
    for (const char byte : piece_text) ids.push_back(byte_piece_ids_[static_cast<uint8_t>(byte)]);
    return;
  }
  ids.push_back(settings_.unk_id);
}

void SentencePieceTokenizer::encode_normalized(std::string_view normalized,
                                               std::vector<int32_t>& ids) const {
  // A doubly linked list of symbols over `normalized`; merging grows the left symbol and unlinks
  // the right one.
  struct Symbol {
    int prev;
    int next;
    size_t start;
    size_t length;
    bool frozen;  // a user-defined piece: never merged with a neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(normalized.size());
  const std::string_view text = normalized;
  for (size_t position = 0; position < text.size();) {
    int32_t user_defined_id = -1;
    size_t length = user_defined_matcher_.match(pieces_, text.substr(position), user_defined_id);
    const bool frozen = length > 0;
    if (!frozen) {
      // The text was normalised to valid UTF-8, so the lead byte gives the length.
      length = std::max<size_t>(valid_utf8_length(text.substr(position)), 1);
    }
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, -1, position, length, frozen});
    if (index > 0) symbols[static_cast<size_t>(index - 1)].next = index;
    position += length;
  }

  struct Candidate {
    float score;
    int left;
    int right;
    size_t length;  // combined length when queued; a mismatch later means the entry is stale
  };
  // Highest score first; among equal scores the leftmost pair, as SentencePiece orders its agenda.
  const auto lower_priority = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> agenda(
      lower_priority);
  // Pieces formed by merging into an unused piece are split back into their halves afterwards.
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> unused_merges;

  const auto symbol_text = [&](int index) {
    const Symbol& symbol = symbols[static_cast<size_t>(index)];
    return text.substr(symbol.start, symbol.length);
  };
  const auto consider_pair = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[static_cast<size_t>(left)];
    const Symbol& b = symbols[static_cast<size_t>(right)];
    if (a.frozen || b.frozen) return;
    const std::string_view joined = text.substr(a.start, a.length + b.length);
    const auto it = mergeable_pieces_.find(joined);
    if (it == mergeable_pieces_.end()) return;
    const Piece& merged = pieces_[static_cast<size_t>(it->second)];
    agenda.push({merged.score, left, right, joined.size()});
    if (merged.type == PieceType::kUnused) {
      unused_merges[joined] = {symbol_text(left), symbol_text(right)};
    }
  };

  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider_pair(i, i + 1);
  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& left = symbols[static_cast<size_t>(top.left)];
    Symbol& right = symbols[static_cast<size_t>(top.right)];
    if (left.length == 0 || right.length == 0 || left.next != top.right ||
        left.length + right.length != top.length) {
      continue;  // one side has changed since this pair was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.left;
    consider_pair(left.prev, top.left);
    consider_pair(top.left, left.next);
  }

  // Emits a symbol, splitting pieces that only exist as unused intermediate merges.
  const auto emit = [&](const auto& self, std::string_view piece_text) -> void {
    const auto it = mergeable_pieces_.find(piece_text);
    if (it != mergeable_pieces_.end() &&
        pieces_[static_cast<size_t>(it->second)].type == PieceType::kUnused) {
      const auto halves = unused_merges.find(piece_text);
      if (halves != unused_merges.end()) {
        self(self, halves->second.first);
        self(self, halves->second.second);
        return;
      }
    }
    emit_piece(piece_text, ids);
  };
  for (int index = symbols.empty() ? -1 : 0; index >= 0;
       index = symbols[static_cast<size_t>(index)].next) {
    emit(emit, symbol_text(index));
  }
}

}  // namespace entropyinfer

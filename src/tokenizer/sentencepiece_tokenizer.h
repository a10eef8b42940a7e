// SentencePiece `.model` files (a serialized sentencepiece.ModelProto) for BPE-type models, as used
// by Llama 2, Mistral and Mixtral. The file is read with an in-house protobuf wire-format reader;
// encoding reproduces SentencePiece's BPE segmentation (and so Hugging Face's LlamaTokenizer):
//   1. the text is split around special tokens (control pieces such as <s>, </s>, [INST]) when
//      EncodeOptions::parse_special is set; each text run is encoded on its own;
//   2. each run is normalised: invalid UTF-8 bytes become U+FFFD, extra whitespace is removed if
//   the
//      model asks for it, a dummy-prefix space is prepended, and spaces become U+2581 ("▁");
//   3. the run is split into characters (user-defined pieces stay whole) and the adjacent pair
//   whose
//      concatenation is the highest-scoring piece is merged until no pair forms a piece (ties go to
//      the leftmost pair);
//   4. a result that is not a piece is spelt with <0xNN> byte pieces (byte fallback) or <unk>.
// The dummy prefix goes in front of every text run, including runs that follow a special token:
// this is what SentencePiece itself does when each segment is encoded separately, what Hugging
// Face's "legacy" Llama tokenizer and llama.cpp do, and what Mistral's reference tokenizer
// produces. Unigram models are rejected with an Error (no asset needs them).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace entropyinfer {

// True when the file starts like a serialized SentencePiece ModelProto (its first field is a
// piece). Cheap: reads only the first bytes. Used to tell a SentencePiece tokenizer.model from a
// tiktoken one.
bool looks_like_sentencepiece_model(const std::string& path);

// Loads a SentencePiece BPE model. Throws Error naming the file and the problem when it is missing,
// truncated, corrupt, or of an unsupported kind (unigram, custom normalisation rules).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path);

// The same from the bytes of a serialized model; `model_path` names it in messages.
std::unique_ptr<Tokenizer> parse_sentencepiece_tokenizer(std::string_view bytes,
                                                         const std::string& model_path);

class SentencePieceTokenizer : public Tokenizer {
 public:
  enum class PieceType : uint8_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  struct Piece {
    std::string text;  // as stored: spaces appear as U+2581
    float score = 0.0f;
    PieceType type = PieceType::kNormal;
  };
  struct Settings {
    bool add_dummy_prefix = true;
    bool remove_extra_whitespaces = true;
    bool escape_whitespaces = true;
    bool byte_fallback = false;
    int32_t unk_id = 0;
    int32_t bos_id = 1;  // -1: none
    int32_t eos_id = 2;  // -1: none
  };

  // Throws Error (naming `source_name`) when the pieces and settings are inconsistent: duplicate
  // pieces, unknown id out of range, malformed or missing byte pieces with byte fallback on.
  SentencePieceTokenizer(std::vector<Piece> pieces, const Settings& settings,
                         const std::string& source_name);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  std::optional<int32_t> bos_id() const override;
  std::vector<int32_t> eos_ids() const override;
  std::optional<int32_t> token_id(std::string_view text) const override;
  // Concatenated token bytes (control tokens as their text), without the dummy-prefix space of the
  // first text token when nothing but control tokens precede it.
  std::string decode(const std::vector<int32_t>& ids) const override;

  const Piece& piece(int32_t id) const;
  const Settings& settings() const { return settings_; }
  // True when no piece that merges can form joins a character to a following space, so words are
  // segmented one at a time (faster, same result).
  bool words_are_independent() const { return words_are_independent_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  // Pieces whose text can be matched literally in the input, grouped by first byte and sorted
  // longest first so the first hit is the longest match.
  struct LiteralMatcher {
    std::array<std::vector<int32_t>, 256> candidates_by_first_byte;
    // Length of the longest piece that matches at the start of `text`, or 0; its id in `id`.
    size_t match(const std::vector<Piece>& pieces, std::string_view text, int32_t& id) const;
    bool empty = true;
  };

  void check_id(int32_t id) const;
  std::string normalize(std::string_view text) const;
  void encode_text_run(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_normalized(std::string_view normalized, std::vector<int32_t>& ids) const;
  std::string_view space_marker() const;
  void emit_piece(std::string_view piece_text, std::vector<int32_t>& ids) const;

  std::vector<Piece> pieces_;
  Settings settings_;
  std::string source_name_;
  PieceMap all_pieces_;        // every piece, for token_id() and final id lookup
  PieceMap mergeable_pieces_;  // normal, user-defined and unused pieces: what BPE merges may form
  std::array<int32_t, 256> byte_piece_ids_{};
  LiteralMatcher user_defined_matcher_;  // always matched whole inside text
  LiteralMatcher special_matcher_;       // control and unknown pieces, with parse_special
  bool words_are_independent_ = false;
};

}  // namespace entropyinfer

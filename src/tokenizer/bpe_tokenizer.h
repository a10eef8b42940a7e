// Byte-level BPE tokenizers (GPT-2 lineage: Llama 3, Qwen2/Qwen3, DeepSeek-R1 distills) from either
// of their two on-disk forms:
//   - Hugging Face tokenizer.json with model.type "BPE", a vocabulary of byte-level strings
//   (GPT-2's
//     byte-to-unicode mapping) and a merge list; tokenizer_config.json, generation_config.json and
//     config.json beside it supply the BOS and EOS tokens;
//   - tiktoken rank files ("base64-token rank" lines), where the rank is the token id and any
//   adjacent
//     pair whose concatenation is a token may merge, the lowest-ranked first.
// Both become one representation: token byte strings plus a pair table (left id, right id) ->
// (priority, merged id), so encoding is the same code for both and the two forms of one vocabulary
// give identical ids.
//
// Encoding: added tokens are cut out of the text first (non-special added tokens always, special
// ones when EncodeOptions::parse_special), the rest is NFC-normalised if the file asks for it,
// split by the pre-tokenizer pattern, and each piece is merged lowest priority first (leftmost on
// ties).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {

// Thrown for a tokenizer.json that is well-formed but not byte-level BPE (e.g. a
// SentencePiece-style Metaspace BPE or a Unigram model), so that a loader can fall back to a
// tokenizer.model beside it.
class UnsupportedTokenizerFormat : public Error {
 public:
  using Error::Error;
};

// A token matched literally in the text before BPE (tokenizer.json's added_tokens).
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = true;  // special ones are only recognised with EncodeOptions::parse_special
};

// Loads tokenizer.json (the file itself, or a folder holding it). Throws Error naming the file and
// the field when it is missing, not JSON, not byte-level BPE, or uses a pre-tokenizer or normaliser
// this implementation does not reproduce exactly.
std::unique_ptr<Tokenizer> load_hf_bpe_tokenizer(const std::string& path);

// The same from the text of a tokenizer.json, without the files beside it (so without BOS/EOS from
// tokenizer_config.json); `source` names it in messages.
std::unique_ptr<Tokenizer> parse_hf_bpe_tokenizer(std::string_view text, const std::string& source);

// Which known vocabulary a tiktoken rank file holds: it decides the special tokens appended after
// the ranks, the EOS ids, and the default pre-tokenizer.
enum class TiktokenVocabulary {
  kLlama3,  // 128,000 ranks; 256 special tokens from 128000 (<|begin_of_text|>, ... <|eot_id|>)
  kQwen,    // 151,643 ranks; Qwen3's 26 added tokens from 151643 (<|endoftext|>, <|im_start|>, ...)
  kPlain,   // any other: no special tokens, no BOS/EOS; needs an explicit pre-tokenizer
};

struct TiktokenOptions {
  std::optional<TiktokenVocabulary> vocabulary;     // default: recognised from the number of ranks
  std::optional<PretokenizerPattern> pretokenizer;  // default: the vocabulary's own pattern
};

// Loads a tiktoken rank file. Throws Error naming the file and line for a malformed line, bad
// base64, a duplicate token or a rank gap, and for an unrecognised vocabulary without explicit
// options.
std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(const std::string& path,
                                                   const TiktokenOptions& options = {});

// The same from the rank file's text; `path` names it in messages.
std::unique_ptr<Tokenizer> parse_tiktoken_tokenizer(std::string_view text, const std::string& path,
                                                    const TiktokenOptions& options = {});

// True when the file's first line looks like a tiktoken rank line ("base64 integer").
bool looks_like_tiktoken_file(const std::string& path);

class BpeTokenizer final : public Tokenizer {
 public:
  struct Definition {
    std::vector<std::string> token_bytes;  // by id; an id that is not used holds an empty string
    // Merge rules: the pair (left, right) becomes `merged`; of the pairs present in a piece, the
    // one with the lowest priority merges first, the leftmost on ties.
    struct Merge {
      int32_t left;
      int32_t right;
      int32_t merged;
      int32_t priority;
    };
    std::vector<Merge> merges;
    // A piece that is itself a token is emitted whole without merging (tiktoken always; Hugging
    // Face when model.ignore_merges is set).
    bool whole_piece_lookup = false;
    PretokenizerPattern pretokenizer = PretokenizerPattern::kLlama3;
    bool add_prefix_space = false;  // prepend ' ' to each text run that does not start with one
    bool nfc = false;
    std::vector<AddedToken> added_tokens;
    std::optional<int32_t> bos_id;
    std::vector<int32_t> eos_ids;
    std::string source_name;  // for error messages
  };

  // Throws Error (naming source_name) when the definition is inconsistent: ids out of range, a byte
  // without a single-byte token.
  explicit BpeTokenizer(Definition definition);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const override;
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::vector<int32_t> eos_ids() const override { return eos_ids_; }
  std::optional<int32_t> token_id(std::string_view text) const override;

  PretokenizerPattern pretokenizer() const { return pretokenizer_; }
  bool normalizes_nfc() const { return nfc_; }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct MergeResult {
    int32_t priority;
    int32_t merged;
  };
  // Literal matching of added tokens, leftmost then longest, as Hugging Face's added vocabulary
  // does.
  struct AddedTokenMatcher {
    std::vector<std::vector<int32_t>> by_first_byte = std::vector<std::vector<int32_t>>(256);
    // Finds the first added token at or after `from`; returns its index in added_tokens_ or -1.
    int32_t find(const std::vector<AddedToken>& tokens, std::string_view text, size_t from,
                 size_t& position) const;
  };
  using WordCache =
      std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>>;

  void encode_text_run(std::string_view text, WordCache& cache, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  const MergeResult* find_merge(int32_t left, int32_t right) const;

  std::vector<std::string> token_bytes_;
  std::vector<bool> is_added_;
  TokenMap bytes_to_id_;  // mergeable (non-added) tokens by their bytes
  std::unordered_map<uint64_t, MergeResult> merges_;
  int32_t byte_ids_[256] = {};
  bool whole_piece_lookup_;
  PretokenizerPattern pretokenizer_;
  bool add_prefix_space_;
  bool nfc_;
  std::vector<AddedToken> added_tokens_;
  AddedTokenMatcher special_matcher_;  // every added token, for parse_special
  AddedTokenMatcher always_matcher_;   // non-special added tokens only
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  std::string source_name_;
};

}  // namespace entropyinfer

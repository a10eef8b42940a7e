// llama2.c's tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length and
// that many bytes (little-endian). The file does not store the token count: llama2.c takes it from
// the model checkpoint's header, and so does the loader here.
//
// Encoding and decoding follow llama2.c's run.c exactly:
//   encode: optional BOS (id 1); when the text is non-empty the token " " is prepended (dummy
//   prefix);
//           the text is split into UTF-8 characters (a lead byte plus up to three continuation
//           bytes), each looked up as a token, or spelt as byte tokens (id = byte + 3) when absent;
//           then the adjacent pair whose concatenation is the best-scoring token is merged,
//           repeatedly (ties go to the leftmost pair; a pair scoring -1e10 or lower never merges).
//   decode: a token's leading space is dropped right after BOS; "<0xNN>" tokens are the raw byte.
// Tokens are compared as C strings, as run.c does (nothing in the shipped files contains a NUL).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace entropyinfer {

// Loads a llama2.c tokenizer.bin. `vocab_size` is the model's vocabulary size (the checkpoint
// header's vocab_size, sign dropped): exactly that many tokens are read, and a file holding fewer
// is an Error. Pass -1 to read tokens until the end of the file. Throws Error naming the file and
// the problem when it is missing, truncated or corrupt.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int vocab_size);

// The same from the file's bytes; `path` names it in messages.
std::unique_ptr<Tokenizer> parse_llama2c_tokenizer(std::string_view bytes, int vocab_size,
                                                   const std::string& path);

class Llama2cTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kUnkId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;
  static constexpr int32_t kFirstByteId = 3;  // byte b is token b + 3

  struct Entry {
    std::string text;  // spaces are plain ' ' in this format
    float score = 0.0f;
  };

  // Throws Error (naming `source_name`) when the vocabulary is too small to hold the byte tokens.
  Llama2cTokenizer(std::vector<Entry> vocab, int32_t max_token_length,
                   const std::string& source_name);

  // run.c's encode(text, bos, eos). parse_special is ignored: llama2.c has no special-token syntax.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const override;
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const;

  // The token's text, or the raw byte for "<0xNN>" tokens; BOS and EOS give their stored text
  // ("\n<s>\n" and "\n</s>\n" in llama2.c's files).
  std::string token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
  std::optional<int32_t> bos_id() const override { return kBosId; }
  std::vector<int32_t> eos_ids() const override { return {kEosId}; }
  // Exact token text; additionally "<unk>", "<s>" and "</s>" name ids 0, 1 and 2 whatever their
  // stored text.
  std::optional<int32_t> token_id(std::string_view text) const override;
  // run.c's decode applied along the sequence: BOS tokens are not printed, and the token after a
  // BOS (or the first token, where the encoder put its dummy prefix) loses a leading space.
  std::string decode(const std::vector<int32_t>& ids) const override;

  int32_t max_token_length() const { return max_token_length_; }
  float score(int32_t id) const;
  const Entry& entry(int32_t id) const;
  // True when no token joins a non-space byte to a following space, so words are merged one at a
  // time (faster, same result).
  bool words_are_independent() const { return words_are_independent_; }
  // The id whose stored text is exactly `text` (run.c's str_lookup), or nullopt.
  std::optional<int32_t> find_text(std::string_view text) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  void check_id(int32_t id) const;
  void append_character_tokens(std::string_view text, std::vector<int32_t>& tokens) const;
  void merge_pairs(std::vector<int32_t>& tokens) const;

  std::vector<Entry> vocab_;
  int32_t max_token_length_ = 0;
  std::string source_name_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_by_text_;
  bool words_are_independent_ = true;
};

}  // namespace entropyinfer

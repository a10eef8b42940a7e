// Text <-> token ids. Every supported format (Hugging Face tokenizer.json byte-level BPE, tiktoken
// rank files, SentencePiece models, llama2.c's tokenizer.bin) implements this one interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace entropyinfer {

struct EncodeOptions {
  // Prepend the beginning-of-sequence token if the tokenizer has one.
  bool add_bos = false;
  // Recognise special/added tokens written in the text (e.g. chat markup).
  bool parse_special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text,
                                      const EncodeOptions& options) const = 0;
  // The exact bytes a token stands for (byte tokens give their single byte; may be a partial UTF-8
  // character). Special tokens give their text.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;

  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;
  // Looks up a token by its literal text (special tokens included); nullopt if absent.
  virtual std::optional<int32_t> token_id(std::string_view text) const = 0;

  // Whole-sequence decoding. Default: concatenated token_bytes (exact for byte-level BPE);
  // tokenizers that insert a leading space themselves (SentencePiece-style) override it to drop
  // that space.
  virtual std::string decode(const std::vector<int32_t>& ids) const;
};

// Turns a stream of token ids into text that never splits a UTF-8 character: bytes of an incomplete
// character are held back until the character completes. Everything it returns is valid UTF-8; a
// byte sequence that can never become a character is emitted as U+FFFD as soon as that is certain,
// so nothing is held forever. For valid text, the concatenated output equals decode() of the whole
// id sequence, including the tokenizer's own leading-space rules (each token's text is taken as
// what decode() adds for it after the few tokens before it).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // The ids before the stream (the prompt), so that the first pushed token is decoded as a
  // continuation: SentencePiece-style tokenizers drop a leading space only at the very start.
  void prime(const std::vector<int32_t>& context);
  std::string push(int32_t id);
  std::string flush();  // whatever is held back (invalid trailing bytes, as U+FFFD) at the end

 private:
  std::string take_complete_characters();

  const Tokenizer& tokenizer_;
  std::string pending_;
  std::vector<int32_t> recent_ids_;  // the last few ids, the context decode() rules depend on
};

// Loads the tokenizer that belongs to a model: tokenizer.json, tokenizer.model (SentencePiece or
// tiktoken) in a folder, or a llama2.c tokenizer.bin. Throws Error naming what is missing or
// corrupt.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace entropyinfer

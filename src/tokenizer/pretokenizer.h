// Pre-tokenization: splitting text into the pieces that byte-level BPE then encodes one by one.
// Each supported split regex is implemented as a hand-written matcher over code points that
// reproduces the regex's leftmost-first, backtracking semantics exactly, so the core needs no regex
// library.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace entropyinfer {

enum class PretokenizerPattern {
  kGpt2,    // GPT-2's: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // Llama 3's: case-insensitive contractions, digits in runs of up to three
  kQwen2,   // Qwen2/Qwen3's: Llama 3's with single digits
};

// The regex each pattern implements, as tokenizer.json writes it (after JSON unescaping).
std::string_view pretokenizer_regex(PretokenizerPattern pattern);
std::string_view pretokenizer_name(PretokenizerPattern pattern);
// Recognises a split regex from tokenizer.json; nullopt when it is none of the supported ones.
std::optional<PretokenizerPattern> pretokenizer_from_regex(std::string_view regex);
// Parses "gpt2", "llama3" or "qwen2" (as a user would name it in an option); nullopt otherwise.
std::optional<PretokenizerPattern> pretokenizer_from_name(std::string_view name);

// Splits `text` into consecutive pieces (views into `text`, together covering all of it) exactly as
// the pattern's regex would with find-all plus keeping the gaps. Bytes that are not valid UTF-8 are
// treated as punctuation (neither letter, number nor space), one byte each.
void pretokenize(std::string_view text, PretokenizerPattern pattern,
                 std::vector<std::string_view>& pieces);

}  // namespace entropyinfer

// The few Unicode operations the tokenizers need, written against generated tables rather than a
// regex or ICU dependency: UTF-8 decoding that tolerates invalid bytes, the general categories the
// pre-tokenizers test (letters, numbers, white space) and NFC normalisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace entropyinfer::unicode {

// One step of UTF-8 decoding. An invalid sequence (stray continuation byte, overlong form,
// surrogate, value past U+10FFFF, truncated sequence) yields valid == false and covers exactly one
// byte, so that callers can carry the raw byte along instead of losing it.
struct DecodedCodePoint {
  char32_t code_point;   // U+FFFD when !valid
  std::uint32_t length;  // bytes consumed, >= 1
  bool valid;
};
DecodedCodePoint decode_utf8(std::string_view text, std::size_t position);

void append_utf8(std::string& out, char32_t code_point);

// How the bytes at the start of `bytes` stand as a UTF-8 character, for a decoder that sees text
// arrive in pieces.
enum class Utf8Status {
  kComplete,    // a whole valid character of `length` bytes
  kIncomplete,  // a valid beginning that more bytes may complete
  kInvalid,     // `length` bytes (the maximal valid-looking prefix, >= 1) that can never be valid
};
struct Utf8Prefix {
  Utf8Status status;
  std::size_t length;
};
Utf8Prefix classify_utf8_prefix(std::string_view bytes);

bool is_letter(char32_t code_point);                // general category L (\p{L})
bool is_number(char32_t code_point);                // general category N (\p{N})
bool is_whitespace(char32_t code_point);            // the White_Space property (regex \s)
std::uint8_t combining_class(char32_t code_point);  // canonical combining class, 0 for starters

// True when NFC would leave `text` unchanged for certain (the common case; cheap). False means it
// may change, not that it will.
bool is_nfc_quick(std::string_view text);
// Unicode Normalization Form C. Bytes that are not valid UTF-8 pass through unchanged and block
// composition across them.
std::string to_nfc(std::string_view text);

const char* unicode_version();  // of the generated tables

}  // namespace entropyinfer::unicode

#include "tokenizer/unicode_text.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace entropyinfer::unicode {
namespace {

namespace tables = ::entropyinfer::unicode_tables;

constexpr char32_t kReplacementCharacter = 0xFFFD;

// Hangul syllables compose and decompose arithmetically (Unicode chapter 3.12).
constexpr char32_t kHangulSyllableBase = 0xAC00;
constexpr char32_t kHangulLeadBase = 0x1100;
constexpr char32_t kHangulVowelBase = 0x1161;
constexpr char32_t kHangulTrailBase = 0x11A7;
constexpr char32_t kHangulLeadCount = 19;
constexpr char32_t kHangulVowelCount = 21;
constexpr char32_t kHangulTrailCount = 28;
constexpr char32_t kHangulSyllableCount = kHangulLeadCount * kHangulVowelCount * kHangulTrailCount;

// Invalid input bytes travel through NFC as values past the Unicode range, so they are written back
// verbatim; they have no decomposition, combining class 0 and compose with nothing.
constexpr char32_t kRawByteBase = 0x110000;

bool in_ranges(const tables::CodePointRange* ranges, std::size_t count, char32_t code_point) {
  const tables::CodePointRange* end = ranges + count;
  const tables::CodePointRange* it = std::upper_bound(
      ranges, end, code_point,
      [](char32_t value, const tables::CodePointRange& range) { return value < range.first; });
  return it != ranges && code_point <= (it - 1)->last;
}

// Valid second-byte range of a multi-byte lead byte (excludes overlongs, surrogates, > U+10FFFF).
void second_byte_range(unsigned char lead, unsigned char& low, unsigned char& high) {
  low = 0x80;
  high = 0xBF;
  if (lead == 0xE0) low = 0xA0;
  if (lead == 0xED) high = 0x9F;
  if (lead == 0xF0) low = 0x90;
  if (lead == 0xF4) high = 0x8F;
}

std::size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte, C0/C1 (always overlong) or F5..FF
}

const tables::Decomposition* find_decomposition(char32_t code_point) {
  const tables::Decomposition* begin = tables::kDecompositions;
  const tables::Decomposition* end = begin + tables::kDecompositionsCount;
  const tables::Decomposition* it = std::lower_bound(
      begin, end, code_point,
      [](const tables::Decomposition& entry, char32_t value) { return entry.code_point < value; });
  return it != end && it->code_point == code_point ? it : nullptr;
}

void decompose(char32_t code_point, std::vector<char32_t>& out) {
  if (code_point >= kHangulSyllableBase &&
      code_point < kHangulSyllableBase + kHangulSyllableCount) {
    const char32_t index = code_point - kHangulSyllableBase;
    out.push_back(kHangulLeadBase + index / (kHangulVowelCount * kHangulTrailCount));
    out.push_back(kHangulVowelBase +
                  (index % (kHangulVowelCount * kHangulTrailCount)) / kHangulTrailCount);
    if (index % kHangulTrailCount != 0) out.push_back(kHangulTrailBase + index % kHangulTrailCount);
    return;
  }
  if (const tables::Decomposition* entry = find_decomposition(code_point)) {
    out.insert(out.end(), tables::kDecompositionData + entry->offset,
               tables::kDecompositionData + entry->offset + entry->length);
    return;
  }
  out.push_back(code_point);
}

// The primary composite of first + second, or 0 when they do not compose.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kHangulLeadBase && first < kHangulLeadBase + kHangulLeadCount &&
      second >= kHangulVowelBase && second < kHangulVowelBase + kHangulVowelCount) {
    return kHangulSyllableBase +
           ((first - kHangulLeadBase) * kHangulVowelCount + (second - kHangulVowelBase)) *
               kHangulTrailCount;
  }
  if (first >= kHangulSyllableBase && first < kHangulSyllableBase + kHangulSyllableCount &&
      (first - kHangulSyllableBase) % kHangulTrailCount == 0 && second > kHangulTrailBase &&
      second < kHangulTrailBase + kHangulTrailCount) {
    return first + (second - kHangulTrailBase);
  }
  const tables::Composition* begin = tables::kCompositions;
  const tables::Composition* end = begin + tables::kCompositionsCount;
  const tables::Composition* it = std::lower_bound(
      begin, end, std::pair{first, second}, [](const tables::Composition& entry, const auto& key) {
        return entry.first != key.first ? entry.first < key.first : entry.second < key.second;
      });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

}  // namespace

DecodedCodePoint decode_utf8(std::string_view text, std::size_t position) {
  const Utf8Prefix prefix = classify_utf8_prefix(text.substr(position));
  if (prefix.status != Utf8Status::kComplete) return {kReplacementCharacter, 1, false};
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[position + i]); };
  switch (prefix.length) {
    case 1:
      return {byte(0), 1, true};
    case 2:
      return {static_cast<char32_t>(((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F)), 2, true};
    case 3:
      return {static_cast<char32_t>(((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) |
                                    (byte(2) & 0x3F)),
              3, true};
    default:
      return {static_cast<char32_t>(((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) |
                                    ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F)),
              4, true};
  }
}

Utf8Prefix classify_utf8_prefix(std::string_view bytes) {
  if (bytes.empty()) return {Utf8Status::kIncomplete, 0};
  const auto lead = static_cast<unsigned char>(bytes[0]);
  const std::size_t length = sequence_length(lead);
  if (length == 0) return {Utf8Status::kInvalid, 1};
  if (length == 1) return {Utf8Status::kComplete, 1};
  for (std::size_t i = 1; i < length; ++i) {
    if (i >= bytes.size()) return {Utf8Status::kIncomplete, i};
    const auto byte = static_cast<unsigned char>(bytes[i]);
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (i == 1) second_byte_range(lead, low, high);
    if (byte < low || byte > high) return {Utf8Status::kInvalid, i};
  }
  return {Utf8Status::kComplete, length};
}

void append_utf8(std::string& out, char32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool is_letter(char32_t code_point) {
  if (code_point < 0x80) {
    return (code_point >= 'a' && code_point <= 'z') || (code_point >= 'A' && code_point <= 'Z');
  }
  return in_ranges(tables::kLetterRanges, tables::kLetterRangesCount, code_point);
}

bool is_number(char32_t code_point) {
  if (code_point < 0x80) return code_point >= '0' && code_point <= '9';
  return in_ranges(tables::kNumberRanges, tables::kNumberRangesCount, code_point);
}

bool is_whitespace(char32_t code_point) {
  // The White_Space property, which is what both Oniguruma and Rust's regex mean by \s.
  if (code_point < 0x80) return code_point == ' ' || (code_point >= 0x09 && code_point <= 0x0D);
  switch (code_point) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return code_point >= 0x2000 && code_point <= 0x200A;
  }
}

std::uint8_t combining_class(char32_t code_point) {
  if (code_point < 0x300) return 0;
  const tables::CombiningClassRange* begin = tables::kCombiningClassRanges;
  const tables::CombiningClassRange* end = begin + tables::kCombiningClassRangesCount;
  const tables::CombiningClassRange* it = std::upper_bound(
      begin, end, code_point,
      [](char32_t value, const tables::CombiningClassRange& range) { return value < range.first; });
  if (it == begin || code_point > (it - 1)->last) return 0;
  return (it - 1)->combining_class;
}

bool is_nfc_quick(std::string_view text) {
  for (std::size_t position = 0; position < text.size();) {
    if (static_cast<unsigned char>(text[position]) < 0x80) {
      ++position;
      continue;
    }
    const DecodedCodePoint decoded = decode_utf8(text, position);
    // Invalid bytes pass through to_nfc untouched, and everything below U+0300 is a starter that
    // neither decomposes nor composes with what precedes it.
    if (decoded.valid && decoded.code_point >= 0x300 &&
        in_ranges(tables::kNfcUnstableRanges, tables::kNfcUnstableRangesCount,
                  decoded.code_point)) {
      return false;
    }
    position += decoded.length;
  }
  return true;
}

std::string to_nfc(std::string_view text) {
  // 1. Full canonical decomposition.
  std::vector<char32_t> decomposed;
  decomposed.reserve(text.size());
  for (std::size_t position = 0; position < text.size();) {
    const DecodedCodePoint decoded = decode_utf8(text, position);
    if (decoded.valid) {
      decompose(decoded.code_point, decomposed);
    } else {
      decomposed.push_back(kRawByteBase + static_cast<unsigned char>(text[position]));
    }
    position += decoded.length;
  }
  const auto class_of = [](char32_t value) {
    return value >= kRawByteBase ? std::uint8_t{0} : combining_class(value);
  };

  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  for (std::size_t start = 0; start < decomposed.size();) {
    if (class_of(decomposed[start]) == 0) {
      ++start;
      continue;
    }
    std::size_t end = start;
    while (end < decomposed.size() && class_of(decomposed[end]) != 0) ++end;
    std::stable_sort(decomposed.begin() + static_cast<std::ptrdiff_t>(start),
                     decomposed.begin() + static_cast<std::ptrdiff_t>(end),
                     [&](char32_t a, char32_t b) { return class_of(a) < class_of(b); });
    start = end;
  }

  // 3. Canonical composition: each character joins the last starter unless something between them
  // blocks it (a starter, or a mark of the same or higher class).
  std::vector<char32_t> composed;
  composed.reserve(decomposed.size());
  std::size_t starter = SIZE_MAX;
  std::uint8_t last_class = 0;
  for (const char32_t value : decomposed) {
    const std::uint8_t value_class = class_of(value);
    if (starter != SIZE_MAX && value < kRawByteBase) {
      const bool adjacent = starter + 1 == composed.size();
      const bool blocked = !adjacent && (last_class == 0 || last_class >= value_class);
      if (!blocked && composed[starter] < kRawByteBase) {
        if (const char32_t composite = compose(composed[starter], value)) {
          composed[starter] = composite;
          continue;
        }
      }
    }
    if (value_class == 0) starter = composed.size();
    composed.push_back(value);
    last_class = value_class;
  }

  std::string out;
  out.reserve(text.size());
  for (const char32_t value : composed) {
    if (value >= kRawByteBase) {
      out.push_back(static_cast<char>(value - kRawByteBase));
    } else {
      append_utf8(out, value);
    }
  }
  return out;
}

const char* unicode_version() { return tables::kUnicodeVersion; }

}  // namespace entropyinfer::unicode

#include "tokenizer/pretokenizer.h"

#include <cstdint>

#include "tokenizer/unicode_text.h"

namespace entropyinfer {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// What the regexes ask of one code point. kOther is [^\s\p{L}\p{N}].
enum CharClass : std::uint8_t { kLetter, kNumber, kSpace, kNewline, kOther };

struct CodePoints {
  std::vector<char32_t> values;  // U+FFFD for an invalid byte
  std::vector<CharClass> classes;
  std::vector<std::size_t> offsets;  // byte offset of each code point, plus one past the end
};

void decode(std::string_view text, CodePoints& out) {
  out.values.clear();
  out.classes.clear();
  out.offsets.clear();
  for (std::size_t position = 0; position < text.size();) {
    const unicode::DecodedCodePoint decoded = unicode::decode_utf8(text, position);
    const char32_t value = decoded.code_point;
    CharClass char_class = kOther;
    if (!decoded.valid) {
      char_class = kOther;
    } else if (value == '\r' || value == '\n') {
      char_class = kNewline;
    } else if (unicode::is_letter(value)) {
      char_class = kLetter;
    } else if (unicode::is_number(value)) {
      char_class = kNumber;
    } else if (unicode::is_whitespace(value)) {
      char_class = kSpace;
    }
    out.values.push_back(decoded.valid ? value : 0xFFFD);
    out.classes.push_back(char_class);
    out.offsets.push_back(position);
    position += decoded.length;
  }
  out.offsets.push_back(text.size());
}

// The matchers work on code point indices; each returns the end index of the match starting at `i`,
// or `i` when its alternative does not match.
class Matcher {
 public:
  explicit Matcher(const CodePoints& code_points)
      : values_(code_points.values), classes_(code_points.classes), size_(values_.size()) {}

  std::size_t match(std::size_t i, PretokenizerPattern pattern) const {
    switch (pattern) {
      case PretokenizerPattern::kGpt2:
        return match_gpt2(i);
      case PretokenizerPattern::kLlama3:
        return match_llama3_family(i, /*max_digits=*/3);
      case PretokenizerPattern::kQwen2:
        return match_llama3_family(i, /*max_digits=*/1);
    }
    return i + 1;
  }

 private:
  bool is(std::size_t i, CharClass char_class) const {
    return i < size_ && classes_[i] == char_class;
  }
  bool is_space(std::size_t i) const { return is(i, kSpace) || is(i, kNewline); }
  bool is_char(std::size_t i, char32_t value) const { return i < size_ && values_[i] == value; }

  std::size_t run_of(std::size_t i, CharClass char_class) const {
    while (is(i, char_class)) ++i;
    return i;
  }
  std::size_t space_run(std::size_t i) const {
    while (is_space(i)) ++i;
    return i;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally ignoring case. Under (?i) Unicode simple case folding also
  // lets U+017F LATIN SMALL LETTER LONG S stand for s.
  std::size_t match_contraction(std::size_t i, bool ignore_case) const {
    if (!is_char(i, '\'') || i + 1 >= size_) return i;
    const auto folded = [&](std::size_t k) -> char32_t {
      if (k >= size_) return 0;
      const char32_t value = values_[k];
      if (!ignore_case) return value;
      if (value >= 'A' && value <= 'Z') return value - 'A' + 'a';
      if (value == 0x17F) return 's';
      return value;
    };
    const char32_t first = folded(i + 1);
    if (first == 's' || first == 't' || first == 'm' || first == 'd') return i + 2;
    const char32_t second = folded(i + 2);
    if ((first == 'r' || first == 'v') && second == 'e') return i + 3;
    if (first == 'l' && second == 'l') return i + 3;
    return i;
  }

  std::size_t match_gpt2(std::size_t i) const {
    if (std::size_t end = match_contraction(i, /*ignore_case=*/false); end != i) return end;
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    const std::size_t body = is_char(i, ' ') && i + 1 < size_ && !is_space(i + 1) ? i + 1 : i;
    if (!is_space(body)) return run_of(body, classes_[body]);
    return match_trailing_space(i);
  }

  std::size_t match_llama3_family(std::size_t i, std::size_t max_digits) const {
    if (std::size_t end = match_contraction(i, /*ignore_case=*/true); end != i) return end;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if ((is(i, kSpace) || is(i, kOther)) && is(i + 1, kLetter)) return run_of(i + 1, kLetter);
    if (is(i, kLetter)) return run_of(i, kLetter);
    // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
    if (is(i, kNumber)) {
      std::size_t end = i;
      while (end - i < max_digits && is(end, kNumber)) ++end;
      return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    const std::size_t body = is_char(i, ' ') && is(i + 1, kOther) ? i + 1 : i;
    if (is(body, kOther)) return run_of(run_of(body, kOther), kNewline);
    // \s*[\r\n]+ : the greedy \s* backs off to the last line break inside the run of spaces.
    const std::size_t space_end = space_run(i);
    for (std::size_t k = space_end; k > i; --k) {
      if (is(k - 1, kNewline)) return k;
    }
    return match_trailing_space(i);
  }

  // \s+(?!\S)|\s+ : a run of spaces gives back its last one when a non-space follows, so that the
  // space joins the next word; a lone space before a non-space is matched by \s+.
  std::size_t match_trailing_space(std::size_t i) const {
    const std::size_t space_end = space_run(i);
    if (space_end == i) return i + 1;  // unreachable: every class is covered by an alternative
    if (space_end == size_ || space_end - i == 1) return space_end;
    return space_end - 1;
  }

  const std::vector<char32_t>& values_;
  const std::vector<CharClass>& classes_;
  std::size_t size_;
};

}  // namespace

std::string_view pretokenizer_regex(PretokenizerPattern pattern) {
  switch (pattern) {
    case PretokenizerPattern::kGpt2:
      return kGpt2Regex;
    case PretokenizerPattern::kLlama3:
      return kLlama3Regex;
    case PretokenizerPattern::kQwen2:
      return kQwen2Regex;
  }
  return {};
}

std::string_view pretokenizer_name(PretokenizerPattern pattern) {
  switch (pattern) {
    case PretokenizerPattern::kGpt2:
      return "gpt2";
    case PretokenizerPattern::kLlama3:
      return "llama3";
    case PretokenizerPattern::kQwen2:
      return "qwen2";
  }
  return {};
}

std::optional<PretokenizerPattern> pretokenizer_from_regex(std::string_view regex) {
  for (PretokenizerPattern pattern :
       {PretokenizerPattern::kGpt2, PretokenizerPattern::kLlama3, PretokenizerPattern::kQwen2}) {
    if (regex == pretokenizer_regex(pattern)) return pattern;
  }
  return std::nullopt;
}

std::optional<PretokenizerPattern> pretokenizer_from_name(std::string_view name) {
  for (PretokenizerPattern pattern :
       {PretokenizerPattern::kGpt2, PretokenizerPattern::kLlama3, PretokenizerPattern::kQwen2}) {
    if (name == pretokenizer_name(pattern)) return pattern;
  }
  return std::nullopt;
}

void pretokenize(std::string_view text, PretokenizerPattern pattern,
                 std::vector<std::string_view>& pieces) {
  pieces.clear();
  CodePoints code_points;
  decode(text, code_points);
  const Matcher matcher(code_points);
  const std::size_t count = code_points.values.size();
  for (std::size_t i = 0; i < count;) {
    std::size_t end = matcher.match(i, pattern);
    if (end <= i) end = i + 1;
    pieces.push_back(
        text.substr(code_points.offsets[i], code_points.offsets[end] - code_points.offsets[i]));
    i = end;
  }
}

}  // namespace entropyinfer

#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/user_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/llama2c_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/unicode_text.h"

namespace entropyinfer {
namespace {

namespace fs = std::filesystem;

// How many preceding ids the streaming decoder hands to decode() as context. Decoding rules look at
// most at the previous token (llama2.c: no space after BOS) or at the start of the text
// (SentencePiece: no dummy-prefix space on the first text token after leading control tokens); a
// short window covers both while keeping each push O(1).
constexpr std::size_t kStreamingContext = 8;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

bool has_extension(const fs::path& path, std::string_view extension) {
  return path.extension().string() == extension;
}

std::unique_ptr<Tokenizer> load_model_file(const fs::path& path) {
  if (looks_like_sentencepiece_model(path.string()))
    return load_sentencepiece_tokenizer(path.string());
  if (looks_like_tiktoken_file(path.string())) return load_tiktoken_tokenizer(path.string());
  throw Error(path.string() + ": neither a SentencePiece model nor a tiktoken rank file");
}

std::unique_ptr<Tokenizer> load_from_folder(const fs::path& folder) {
  std::error_code error;
  const fs::path json_path = folder / "tokenizer.json";
  const fs::path model_path = folder / "tokenizer.model";
  if (fs::is_regular_file(json_path, error)) {
    try {
      return load_hf_bpe_tokenizer(json_path.string());
    } catch (const UnsupportedTokenizerFormat&) {
      // e.g. Llama 2's or Mistral's tokenizer.json (Metaspace BPE): its tokenizer.model says the
      // same.
      if (!fs::is_regular_file(model_path, error)) throw;
    }
  }
  if (fs::is_regular_file(model_path, error)) return load_model_file(model_path);
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    if (entry.is_regular_file(error) && has_extension(entry.path(), ".tiktoken")) {
      return load_tiktoken_tokenizer(entry.path().string());
    }
  }
  if (fs::is_regular_file(folder / "tokenizer.bin", error)) {
    return load_llama2c_tokenizer((folder / "tokenizer.bin").string(), -1);
  }
  throw Error("no tokenizer in " + folder.string() +
              " (looked for tokenizer.json, tokenizer.model, *.tiktoken and tokenizer.bin)");
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

void StreamingDecoder::prime(const std::vector<int32_t>& context) {
  const std::size_t keep = std::min<std::size_t>(context.size(), kStreamingContext);
  recent_ids_.assign(context.end() - static_cast<std::ptrdiff_t>(keep), context.end());
}

std::string StreamingDecoder::push(int32_t id) {
  // What decode() adds for this id after the ids before it.
  const std::string before = tokenizer_.decode(recent_ids_);
  recent_ids_.push_back(id);
  const std::string after = tokenizer_.decode(recent_ids_);
  if (after.size() >= before.size() && after.compare(0, before.size(), before) == 0) {
    pending_.append(after, before.size());
  } else {
    pending_ += tokenizer_.token_bytes(id);  // decode() is not incremental here; take the token
  }
  if (recent_ids_.size() > kStreamingContext) recent_ids_.erase(recent_ids_.begin());
  return take_complete_characters();
}

std::string StreamingDecoder::take_complete_characters() {
  std::string out;
  std::size_t position = 0;
  while (position < pending_.size()) {
    const unicode::Utf8Prefix prefix =
        unicode::classify_utf8_prefix(std::string_view(pending_).substr(position));
    if (prefix.status == unicode::Utf8Status::kIncomplete) break;  // wait for the rest
    if (prefix.status == unicode::Utf8Status::kComplete) {
      out.append(pending_, position, prefix.length);
    } else {
      out += kReplacementCharacter;
    }
    position += prefix.length;
  }
  pending_.erase(0, position);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out;
  // An incomplete character at the very end can no longer complete: each maximal invalid subpart
  // becomes one U+FFFD, as decoders conventionally do.
  while (!pending_.empty()) {
    const unicode::Utf8Prefix prefix = unicode::classify_utf8_prefix(pending_);
    if (prefix.status == unicode::Utf8Status::kComplete) {
      out.append(pending_, 0, prefix.length);
    } else {
      out += kReplacementCharacter;
    }
    pending_.erase(0, std::max<std::size_t>(prefix.length, 1));
  }
  recent_ids_.clear();
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code error;
  const fs::path file(path);
  if (!fs::exists(file, error)) throw Error("tokenizer not found: " + path);
  if (fs::is_directory(file, error)) return load_from_folder(file);
  check_regular_file(path, "tokenizer");
  if (has_extension(file, ".json")) return load_hf_bpe_tokenizer(path);
  if (has_extension(file, ".tiktoken")) return load_tiktoken_tokenizer(path);
  if (has_extension(file, ".bin")) return load_llama2c_tokenizer(path, -1);
  if (looks_like_sentencepiece_model(path)) return load_sentencepiece_tokenizer(path);
  if (looks_like_tiktoken_file(path)) return load_tiktoken_tokenizer(path);
  throw Error(path +
              ": not a recognised tokenizer file (tokenizer.json, SentencePiece model, tiktoken "
              "ranks or llama2.c tokenizer.bin)");
}

}  // namespace entropyinfer

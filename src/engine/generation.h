// The generation loop: prefill the prompt, then sample one token at a time until a stop token, a
// stop string or the token limit, streaming text that never splits a UTF-8 character or shows a
// partial stop string. Only ids the tokenizer has are sampled: the extra rows of a model whose
// vocabulary is padded past its tokenizer's can never be chosen. NaN or +inf logits end the run
// with an Error naming the token id and the step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/language_model.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer {

struct GenerationOptions {
  int max_tokens = 256;
  SamplerOptions sampler;
  std::vector<int32_t> stop_token_ids;    // e.g. the model's EOS ids
  std::vector<std::string> stop_strings;  // text that ends generation (not printed)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, stop token excluded
  std::string text;
  int prompt_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;  // from the end of prefill to the last token
  int decode_steps = 0;         // single-token forward passes within decode_seconds
  std::string stop_reason;      // "stop token", "stop string", "max tokens", "context full"
};

using TextCallback = std::function<void(std::string_view text)>;

GenerationResult generate(LanguageModel& model, const Tokenizer& tokenizer,
                          std::span<const int32_t> prompt, const GenerationOptions& options,
                          const TextCallback& on_text = {});

// Holds back text that could still turn into a stop string, so that none is ever printed.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stop_strings)
      : stop_strings_(std::move(stop_strings)) {}
  // Returns the text that is safe to show; sets `stopped` once a stop string appeared.
  std::string push(std::string_view text, bool& stopped);
  std::string flush();

 private:
  std::vector<std::string> stop_strings_;
  std::string pending_;
};

}  // namespace entropyinfer

#include "engine/generation.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"

namespace entropyinfer {

std::string StopStringFilter::push(std::string_view text, bool& stopped) {
  pending_.append(text);
  size_t earliest = std::string::npos;
  for (const std::string& stop : stop_strings_) {
    if (stop.empty()) continue;
    earliest = std::min(earliest, pending_.find(stop));
  }
  if (earliest != std::string::npos) {
    stopped = true;
    std::string shown = pending_.substr(0, earliest);
    pending_.clear();
    return shown;
  }
  // Keep the longest tail that is the beginning of some stop string.
  size_t held = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t length = std::min(stop.size() - 1, pending_.size()); length > held; --length) {
      if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
        held = length;
        break;
      }
    }
  }
  std::string shown = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return shown;
}

std::string StopStringFilter::flush() { return std::exchange(pending_, std::string()); }

GenerationResult generate(LanguageModel& model, const Tokenizer& tokenizer,
                          std::span<const int32_t> prompt, const GenerationOptions& options,
                          const TextCallback& on_text) {
  if (prompt.empty()) throw Error("the prompt is empty: at least one token is needed");
  if (options.max_tokens < 0) throw Error("max tokens must be >= 0");
  if (model.position() + static_cast<int64_t>(prompt.size()) > model.context_length()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens but the model's context holds " + std::to_string(model.context_length()));
  }
  using Clock = std::chrono::steady_clock;
  GenerationResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  Sampler sampler(options.sampler);
  StreamingDecoder decoder(tokenizer);
  decoder.prime(std::vector<int32_t>(prompt.begin(), prompt.end()));
  StopStringFilter filter(options.stop_strings);
  auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    result.text += text;
    if (on_text) on_text(text);
  };

  // A model may have more rows than its tokenizer has tokens (vocabularies padded to a multiple of
  // 64 or 128); those ids have no text, so they are never sampled. Greedy decoding over a
  // vocabulary the tokenizer covers, with no bias or penalty, takes the executor's own argmax, so
  // that one id per step crosses to the host instead of every logit.
  const int tokenizer_vocab = std::max(tokenizer.vocab_size(), 0);
  const bool executor_argmax = options.sampler.temperature == 0.0f &&
                               !adjusts_logits(options.sampler) &&
                               tokenizer_vocab >= model.config().vocab_size;
  // Runs `tokens` and picks the next token; errors name the generated token they stopped at.
  const auto run_and_pick = [&](std::span<const int32_t> tokens, int step) -> int32_t {
    try {
      if (executor_argmax) return model.forward_greedy(tokens);
      std::vector<float> logits = model.forward(tokens);
      const size_t sampled_ids = std::min(logits.size(), static_cast<size_t>(tokenizer_vocab));
      return sampler.sample(std::span<float>(logits.data(), sampled_ids));
    } catch (const Error& error) {
      throw Error(std::string(error.what()) + ", at generated token " + std::to_string(step + 1));
    }
  };

  result.stop_reason = "max tokens";
  bool stopped = false;
  if (options.max_tokens == 0) {
    const auto prefill_start = Clock::now();
    model.forward(prompt);
    result.prefill_seconds = std::chrono::duration<double>(Clock::now() - prefill_start).count();
    return result;
  }
  const auto prefill_start = Clock::now();
  int32_t next = run_and_pick(prompt, 0);
  const auto prefill_end = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(prefill_end - prefill_start).count();
  for (int step = 0;; ++step) {
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), next) !=
        options.stop_token_ids.end()) {
      result.stop_reason = "stop token";
      break;
    }
    result.tokens.push_back(next);
    emit(filter.push(decoder.push(next), stopped));
    if (stopped) {
      result.stop_reason = "stop string";
      break;
    }
    if (step + 1 == options.max_tokens) break;
    if (model.position() >= model.context_length()) {
      result.stop_reason = "context full";
      break;
    }
    next = run_and_pick(std::span(&result.tokens.back(), 1), step + 1);
    ++result.decode_steps;
  }
  if (!stopped) emit(filter.push(decoder.flush(), stopped));
  if (!stopped) emit(filter.flush());
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - prefill_end).count();
  return result;
}

}  // namespace entropyinfer

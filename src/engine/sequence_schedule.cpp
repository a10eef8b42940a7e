#include "engine/sequence_schedule.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace entropyinfer {

int resolve_context_length(const ModelConfig& config, int requested) {
  const int limit = config.max_position_embeddings;
  const int context = requested > 0 ? requested : limit;
  if (context <= 0) throw Error("context length must be positive");
  if (limit > 0 && context > limit && config.rope.scaling != RopeScaling::kDynamic) {
    throw Error("context length " + std::to_string(context) + " exceeds the model's maximum of " +
                std::to_string(limit) + " positions");
  }
  return context;
}

void SequenceSchedule::configure(int context_length, int compress_after, int window) {
  context_length_ = context_length;
  compress_after_ = compress_after;
  window_ = compress_after < 0 ? 0 : window;
  reset();
}

void SequenceSchedule::reset() {
  position_ = 0;
  prefilled_ = false;
  tokens_since_prefill_ = 0;
  compressed_ = false;
}

void SequenceSchedule::check_span(std::span<const int32_t> tokens, int vocab_size) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) throw Error("forward() needs at least one token");
  if (position_ + n > context_length_) {
    throw Error("the sequence needs " + std::to_string(position_ + n) +
                " positions but the context holds " + std::to_string(context_length_));
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= vocab_size) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                  std::to_string(vocab_size));
    }
  }
}

int SequenceSchedule::window_tokens() const { return std::min(window_, position_); }

bool SequenceSchedule::advance(int64_t n) {
  position_ += static_cast<int>(n);
  if (prefilled_) {
    tokens_since_prefill_ += static_cast<int>(n);
  } else {
    prefilled_ = true;
  }
  return compress_after_ >= 0 && !compressed_ && tokens_since_prefill_ >= compress_after_;
}

}  // namespace entropyinfer

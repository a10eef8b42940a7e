// Where one sequence stands, as every executor tracks it: the context it may fill, which call is
// the prefill, when the decode cache is compressed (docs/method.md section 3.1) and which queries
// make up the observation window. Both executors keep one of these, so these rules exist once.
#pragma once

#include <cstdint>
#include <span>

#include "model/model_config.h"

namespace entropyinfer {

// The context a model runs with: `requested`, or the model's max_position_embeddings when 0.
// Error when it is not positive, or longer than the model's maximum (dynamic NTK scaling excepted:
// it exists to run past the trained context, its base growing with the sequence).
int resolve_context_length(const ModelConfig& config, int requested);

class SequenceSchedule {
 public:
  // compress_after: generated tokens the decode policy waits for (its compress_after_generated()),
  // or -1 when nothing is ever compressed. window: the observation window's length (0 when the
  // policy reads no queries).
  void configure(int context_length, int compress_after, int window);
  void reset();  // a new sequence: nothing seen, nothing compressed

  // Error naming the problem when `tokens` is empty, would run past the context or holds an id
  // outside [0, vocab_size).
  void check_span(std::span<const int32_t> tokens, int vocab_size) const;

  int position() const { return position_; }
  int context_length() const { return context_length_; }
  bool is_prefill() const { return !prefilled_; }  // the next call is the prompt
  bool compressed() const { return compressed_; }

  // The observation window now: the queries of the last window_tokens() positions, ending at
  // position() - 1, oldest first.
  int window_tokens() const;
  int window_first_position() const { return position_ - window_tokens(); }

  // Records a forward pass over n tokens; returns whether the cache must be compressed now, after
  // that pass: right after the prefill when compress_after is 0, else after the pass that
  // processed the compress_after-th generated token (the prefill yields generated token 1).
  bool advance(int64_t n);
  void mark_compressed() { compressed_ = true; }

 private:
  int context_length_ = 0;
  int compress_after_ = -1;
  int window_ = 0;
  int position_ = 0;
  bool prefilled_ = false;
  int tokens_since_prefill_ = 0;
  bool compressed_ = false;
};

}  // namespace entropyinfer

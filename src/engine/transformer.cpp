#include "engine/transformer.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "engine/cpu_executor.h"
#include "engine/sequence_schedule.h"

namespace entropyinfer {

struct Transformer::State {
  const ModelWeights& weights;
  CpuExecutor executor;
  CpuExecutor::SequencePtr sequence;

  State(const ModelWeights& w, int context, bool fp8_kv_cache, const AttentionConfig& attention,
        AttentionRecording& recording)
      : weights(w),
        executor(w, context, fp8_kv_cache),
        sequence(executor.new_sequence(attention, recording)) {}
};

Transformer::Transformer(const ModelWeights& weights, int context_length,
                         const AttentionConfig& attention, bool fp8_kv_cache) {
  state_ = std::make_unique<State>(weights, resolve_context_length(weights.config, context_length),
                                   fp8_kv_cache, attention, recording_);
}

Transformer::~Transformer() = default;

void Transformer::reset() { state_->executor.reset(*state_->sequence); }
void Transformer::set_attention(const AttentionConfig& attention) {
  auto next = std::make_unique<State>(state_->weights, state_->executor.context_length(),
                                      state_->executor.fp8_kv_cache(), attention, recording_);
  next->executor.set_progress_callback(progress_);
  state_ = std::move(next);
}
std::string Transformer::device_name() const {
  return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
}
int Transformer::position() const { return CpuExecutor::schedule(*state_->sequence).position(); }
int Transformer::context_length() const { return state_->executor.context_length(); }
const ModelConfig& Transformer::config() const { return state_->weights.config; }
const AttentionConfig& Transformer::attention_config() const {
  return CpuExecutor::attention(*state_->sequence);
}
size_t Transformer::kv_cache_bytes() const { return CpuExecutor::cache_bytes(*state_->sequence); }
const AttentionWork& Transformer::attention_work() const {
  return CpuExecutor::work(*state_->sequence);
}
void Transformer::set_progress_callback(ProgressCallback callback) {
  progress_ = callback;
  state_->executor.set_progress_callback(std::move(callback));
}

std::vector<float> Transformer::forward(std::span<const int32_t> tokens, bool all_logits) {
  CpuExecutor& executor = state_->executor;
  CpuExecutor::Sequence& sequence = *state_->sequence;
  const SequenceSchedule& schedule = CpuExecutor::schedule(sequence);
  const int64_t n = static_cast<int64_t>(tokens.size());
  schedule.check_span(tokens, config().vocab_size);
  CpuExecutor::Sequence* const one[] = {&sequence};
  if (!schedule.is_prefill() && (n == 1 || schedule.compressed())) {
    // Single tokens take the decode path; a compressed cache (heads of different lengths) takes a
    // longer span through it one token at a time.
    const int64_t vocab = config().vocab_size;
    std::vector<float> logits(static_cast<size_t>((all_logits ? n : 1) * vocab));
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> step = executor.decode(one, tokens.subspan(t, 1));
      if (all_logits || t == n - 1)
        std::copy(step.begin(), step.end(), logits.begin() + (all_logits ? t * vocab : 0));
    }
    return logits;
  }
  CpuExecutor::SpanJobPtr job = executor.begin_span(sequence, tokens, all_logits);
  while (!executor.span_layers_done(*job)) executor.run_span_layer(*job);
  return executor.finish_span(*job);
}

}  // namespace entropyinfer

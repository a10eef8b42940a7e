// The CPU executor's forward pass, written once for both of its users: the single-sequence
// Transformer (LanguageModel) and the CPU BatchModel, which serves many sequences at once. A
// sequence holds its attention policies, schedule, per-head KV cache and observation window; a
// span of several tokens (a prompt) runs layer-major as a resumable job, so that a server can run
// it a few layers at a time; single tokens of many sequences decode together, one pass over each
// weight matrix for all of them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "attention/attention_config.h"
#include "engine/language_model.h"
#include "engine/sequence_schedule.h"
#include "model/model_weights.h"

namespace entropyinfer {

// Cache memory counted in pages of `page_rows` rows of one (layer, cache head): every cache
// allocation takes whole pages from it and returns them when it is freed. Sequences that share
// one pool compete for its pages; Error when an allocation finds too few.
class KvPagePool {
 public:
  KvPagePool(int64_t pages_total, int page_rows, int64_t page_bytes)
      : pages_total_(pages_total), page_rows_(page_rows), page_bytes_(page_bytes) {}
  void acquire(int64_t pages);  // Error naming the shortfall when fewer are free
  void release(int64_t pages);
  int64_t pages_total() const { return pages_total_; }
  int64_t pages_used() const { return pages_used_; }
  int page_rows() const { return page_rows_; }
  int64_t page_bytes() const { return page_bytes_; }

 private:
  int64_t pages_total_ = 0;
  int64_t pages_used_ = 0;
  int page_rows_ = 1;
  int64_t page_bytes_ = 0;
};

// The cache length at which `attention`'s decode policy compresses a sequence of this prompt, or
// -1 when it never does within row_limit rows.
int64_t compression_length(const AttentionConfig& attention, int prompt_tokens, int row_limit);

// Rows per head a layer's cache holds from the prefill until its compression: the cache length at
// which the decode policy compresses it, or row_limit when it never does (the method keeps
// everything, the prompt is within the layer's budget, or the answer ends first).
int kv_rows_before_compression(const ModelConfig& config, const AttentionConfig& attention,
                               int layer, int prompt_tokens, int row_limit);

// The pages a pooled sequence of this prompt and row limit holds: `peak` until its compression
// (and during it), `steady` after it. These are the executor's own allocation rules, so a
// sequence never holds more than this.
struct KvPageNeed {
  int64_t peak = 0;
  int64_t steady = 0;
};
KvPageNeed kv_pages_needed(const ModelConfig& config, const AttentionConfig& attention,
                           int page_rows, int prompt_tokens, int row_limit);

class CpuExecutor {
 public:
  // context_length: already resolved (resolve_context_length). fp8_kv_cache: every row entering
  // the cache is stored as it reads back from FP8 (fp8_kv_round_trip_row), still in fp32: the
  // numerical reference of an FP8 cache, not a memory saving.
  CpuExecutor(const ModelWeights& weights, int context_length, bool fp8_kv_cache = false);
  ~CpuExecutor();

  struct Sequence;
  struct SpanJob;
  // Owners of the executor's opaque state, destroyed where it is defined.
  struct StateDeleter {
    void operator()(Sequence* sequence) const;
    void operator()(SpanJob* job) const;
  };
  using SequencePtr = std::unique_ptr<Sequence, StateDeleter>;
  using SpanJobPtr = std::unique_ptr<SpanJob, StateDeleter>;

  // A sequence under `attention` (validated). `recording` receives its plans and captured inputs
  // while asked to; `pool`, when given, is charged for every cache allocation, whose rows are then
  // whole pages and never more than row_limit per head (the prompt plus the answer it may have).
  SequencePtr new_sequence(const AttentionConfig& attention, AttentionRecording& recording,
                           KvPagePool* pool = nullptr, int row_limit = 0);
  void reset(Sequence& sequence);  // forgets the tokens and any compression, frees the cache

  // Several tokens of one sequence (its prompt, or a continuation), layer by layer.
  SpanJobPtr begin_span(Sequence& sequence, std::span<const int32_t> tokens, bool all_logits);
  void run_span_layer(SpanJob& job);  // the next layer
  bool span_layers_done(const SpanJob& job) const;
  // After every layer: fp32 logits, [n, vocab] when all_logits, else [vocab] for the last token.
  std::vector<float> finish_span(SpanJob& job);
  // Rows [first_row, first_row + rows.size() / vocab) of a span's logits, valid during the call.
  using LogitRowsCallback = std::function<void(int64_t first_row, std::span<const float> rows)>;
  // The same for an all_logits span, but its rows go to `each_chunk` in order, a few hundred at a
  // time, so that no [n, vocab] array exists (a 128k-token prompt of a 128k vocabulary would take
  // 64 GB); returns the last row's [vocab].
  std::vector<float> finish_span(SpanJob& job, const LogitRowsCallback& each_chunk);

  // One token for each of `sequences` (each past its prefill, none twice): [count, vocab] logits.
  std::vector<float> decode(std::span<Sequence* const> sequences, std::span<const int32_t> tokens);

  // Called during long spans with (tokens done, tokens total).
  void set_progress_callback(LanguageModel::ProgressCallback callback);

  const ModelConfig& config() const;
  int context_length() const { return context_length_; }
  bool fp8_kv_cache() const { return fp8_kv_cache_; }

  // Per-sequence state, read by both users.
  static const SequenceSchedule& schedule(const Sequence& sequence);
  static const AttentionConfig& attention(const Sequence& sequence);
  static const AttentionWork& work(const Sequence& sequence);
  static size_t cache_bytes(const Sequence& sequence);
  static int64_t cache_pages(const Sequence& sequence);  // held from its pool (0 without one)

 private:
  // The last row's logits, and every row's through each_chunk when it is given.
  std::vector<float> finish_span_rows(SpanJob& job, const LogitRowsCallback& each_chunk);

  const ModelWeights& weights_;
  int context_length_ = 0;
  bool fp8_kv_cache_ = false;
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
  LanguageModel::ProgressCallback progress_;
};

}  // namespace entropyinfer

// Many sequences in one model, for serving: each sequence has its own attention policies, schedule
// and cache, and one step runs the next token of every decoding sequence through the weights
// together (one pass over each weight matrix for the whole batch), while at most one prompt
// advances its prefill by a budget of work (engine/prefill_work.h). A long prefill thus runs in
// slices between decode steps instead of freezing the other streams, and it is the same
// layer-major prefill the single-sequence executor runs, so the prefill policies plan exactly as
// they do there.
//
// Cache memory is counted in pages of kv_page_rows rows of one (layer, cache head), drawn from one
// pool of a fixed number of pages shared by all sequences: a head's cache holds whole pages, and a
// compression returns the pages it no longer needs to the pool at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "engine/language_model.h"
#include "engine/token_logprobs.h"
#include "model/model_config.h"
#include "model/model_weights.h"

namespace entropyinfer {

// Rows of one (layer, cache head) per page: small enough that a compressed head wastes little,
// large enough that page bookkeeping is negligible next to attention.
constexpr int kKvPageRows = 16;

// Pages in use and free, and what one page holds.
struct KvPoolUsage {
  int64_t pages_total = 0;
  int64_t pages_used = 0;
  // Keys and values of one page's rows of one head (kKvPageRows on the CPU, cuda::kPagedRows
  // on the GPU).
  int64_t page_bytes = 0;
  int64_t pages_free() const { return pages_total - pages_used; }
};

struct BatchModelOptions {
  Device device = Device::kCpu;
  int context_length = 0;  // per sequence; 0 means the model's max_position_embeddings
  // The KV pool; 0 means enough for one full-context sequence on the CPU, the memory left after
  // the model on CUDA.
  int64_t pool_bytes = 0;
  bool fp8_kv_cache = false;                                  // as EngineOptions::fp8_kv_cache
  PromptAttention prompt_attention = PromptAttention::kAuto;  // as EngineOptions's, cuda only
  // CUDA: FP8 products of 9-64 rows unscaled, then scaled (CudaModelOptions::fp8_separate_scaling).
  bool fp8_separate_scaling = true;
};

class BatchModel {
 public:
  using SequenceId = int64_t;
  virtual ~BatchModel() = default;

  // A new sequence that will prefill `prompt` under `attention` (validated: Error naming the
  // problem) and then decode at most max_new_tokens tokens. Error when the prompt is empty, holds
  // an id outside the vocabulary or does not fit in the context with them. Takes no cache memory
  // until its prefill starts.
  virtual SequenceId open(const AttentionConfig& attention, std::vector<int32_t> prompt,
                          int max_new_tokens) = 0;
  // Forgets the sequence and returns its pages to the pool.
  virtual void close(SequenceId sequence) = 0;
  // Asks for the prompt's own scores (OpenAI's echo with logprobs): the step that ends the
  // sequence's prefill returns them in StepOutput::prompt_logprobs. Every prompt row then runs
  // through the last layer and the output head (in chunks of rows, never all at once). `top`
  // alternatives (0 to kMaxTopLogprobs) over the first `scored_ids` logits of each row (0: all).
  // Error once its prefill has begun.
  virtual void ask_prompt_logprobs(SequenceId sequence, int top, int scored_ids) = 0;

  struct StepInput {
    std::vector<SequenceId> decode;      // sequences past their prefill, one new token each
    std::vector<int32_t> decode_tokens;  // the token each feeds
    SequenceId prefill = -1;             // a sequence whose prefill advances, or -1
    // Work of that prefill this step runs, in token-layers (PrefillWork): slices run while the
    // budget lasts, and at least one runs.
    double prefill_budget = 0;
  };
  struct StepOutput {
    // [decode.size()][vocab], in the model's memory: valid until its next step or close.
    std::span<float> decode_logits;
    bool prefill_done = false;          // the prefill ran its last layer in this step
    std::vector<float> prefill_logits;  // [vocab], the prompt's last token, when prefill_done
    // When prefill_done and asked (ask_prompt_logprobs): prompt tokens 1 .. n-1, each scored under
    // the logits of the position before it (the first token has nothing before it).
    std::vector<TokenLogprob> prompt_logprobs;
  };
  // Error when a sequence is unknown, appears twice, decodes before its prefill is done or past
  // its context, or when the pool has no page left for a new row (callers admit by
  // pages_needed, so that this does not happen).
  virtual StepOutput step(const StepInput& input) = 0;

  // The most pages a sequence of this prompt and answer length holds under `attention`: `peak`
  // until its cache is compressed (the whole prompt is cached while it prefills), `steady` from
  // then on (equal to peak for a method that never compresses). What admission reserves.
  struct PageNeed {
    int64_t peak = 0;
    int64_t steady = 0;
  };
  virtual PageNeed pages_needed(const AttentionConfig& attention, int prompt_tokens,
                                int max_new_tokens) const = 0;
  // Whether a new sequence may start its prefill: an executor that holds one sequence's cache
  // outside the pool until it is final (the CUDA one, through the latent gap) says no meanwhile.
  virtual bool prefill_slot_free() const { return true; }
  virtual KvPoolUsage pool_usage() const = 0;
  virtual int pages_held(SequenceId sequence) const = 0;

  virtual int position(SequenceId sequence) const = 0;
  virtual bool prefilled(SequenceId sequence) const = 0;
  virtual bool compressed(SequenceId sequence) const = 0;
  virtual const AttentionWork& attention_work(SequenceId sequence) const = 0;

  virtual int context_length() const = 0;
  virtual int num_layers() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual std::string device_name() const = 0;
};

// What BatchModel::open checks of a request on every executor: a non-empty prompt of ids inside
// the vocabulary that fits in `context` with max_new_tokens more. Throws Error naming the problem;
// returns the rows the sequence may hold (prompt plus answer).
int check_batch_request(const ModelConfig& config, int context, std::span<const int32_t> prompt,
                        int max_new_tokens);

// What ask_prompt_logprobs reports, a chunk of rows at a time: `rows` are the logits of prompt
// positions [first_row, first_row + rows.size() / vocab); row r scores prompt[r + 1] and the
// prompt's last row scores nothing. Appends to `out` in order. Throws Error for a bad shape.
void append_prompt_logprobs(std::span<const int32_t> prompt, int64_t first_row,
                            std::span<const float> rows, int64_t vocab, int top, int scored_ids,
                            std::vector<TokenLogprob>& out);
// ask_prompt_logprobs' check of its arguments, on every executor.
void check_prompt_logprobs_request(const ModelConfig& config, int top, int scored_ids);

// The batch executor on `options.device` (engine/make_language_model.cpp). Error for a device this
// build or machine lacks.
std::unique_ptr<BatchModel> make_batch_model(const ModelWeights& weights,
                                             const BatchModelOptions& options);
// The CPU one (engine/cpu_batch_model.cpp).
std::unique_ptr<BatchModel> make_cpu_batch_model(const ModelWeights& weights,
                                                 const BatchModelOptions& options);

}  // namespace entropyinfer

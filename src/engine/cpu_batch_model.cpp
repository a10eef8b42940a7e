// The CPU BatchModel: sequences of one CpuExecutor, their caches charged to one KvPagePool.
#include <omp.h>

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/cpu_executor.h"
#include "engine/prefill_work.h"
#include "engine/sequence_schedule.h"

namespace entropyinfer {
namespace {

class CpuBatchModel : public BatchModel {
 public:
  CpuBatchModel(const ModelWeights& weights, const BatchModelOptions& options)
      : weights_(weights),
        executor_(weights, resolve_context_length(weights.config, options.context_length),
                  options.fp8_kv_cache),
        pool_(pool_pages(weights.config, executor_.context_length(), options.pool_bytes),
              kKvPageRows, page_bytes(weights.config)),
        work_(weights.config) {}

  SequenceId open(const AttentionConfig& attention, std::vector<int32_t> prompt,
                  int max_new_tokens) override {
    const int rows =
        check_batch_request(weights_.config, executor_.context_length(), prompt, max_new_tokens);
    auto entry = std::make_unique<Entry>();
    entry->prompt = std::move(prompt);
    entry->row_limit = static_cast<int>(rows);
    entry->sequence = executor_.new_sequence(attention, entry->recording, &pool_, entry->row_limit);
    const SequenceId id = next_id_++;
    sequences_.emplace(id, std::move(entry));
    return id;
  }

  void close(SequenceId sequence) override { sequences_.erase(sequence); }

  void ask_prompt_logprobs(SequenceId sequence, int top, int scored_ids) override {
    check_prompt_logprobs_request(weights_.config, top, scored_ids);
    Entry& entry = find(sequence);
    if (entry.job || !CpuExecutor::schedule(*entry.sequence).is_prefill())
      throw Error("sequence " + std::to_string(sequence) + " has begun its prefill");
    entry.prompt_logprobs_top = top;
    entry.scored_ids = scored_ids;
  }

  StepOutput step(const StepInput& input) override {
    StepOutput output;
    if (input.decode.size() != input.decode_tokens.size())
      throw Error("step: one decode token per decoding sequence");
    std::vector<CpuExecutor::Sequence*> decoding;
    decoding.reserve(input.decode.size());
    for (SequenceId id : input.decode) {
      Entry& entry = find(id);
      const SequenceSchedule& schedule = CpuExecutor::schedule(*entry.sequence);
      if (schedule.is_prefill()) throw Error("sequence " + std::to_string(id) + " is prefilling");
      if (schedule.position() + 1 > entry.row_limit) {
        throw Error("sequence " + std::to_string(id) + " decodes past the " +
                    std::to_string(entry.row_limit) + " rows it was opened for");
      }
      decoding.push_back(entry.sequence.get());
    }
    decode_logits_ = executor_.decode(decoding, input.decode_tokens);
    output.decode_logits = decode_logits_;
    if (input.prefill >= 0) {
      Entry& entry = find(input.prefill);
      if (!CpuExecutor::schedule(*entry.sequence).is_prefill())
        throw Error("sequence " + std::to_string(input.prefill) + " has finished its prefill");
      const bool scores_prompt = entry.prompt_logprobs_top >= 0;
      if (!entry.job)
        entry.job = executor_.begin_span(*entry.sequence, entry.prompt, scores_prompt);
      // The CPU's slice is a whole layer.
      const double layer_cost = work_.layer(static_cast<int64_t>(entry.prompt.size()));
      double spent = 0;
      do {
        executor_.run_span_layer(*entry.job);
        spent += layer_cost;
      } while (spent < input.prefill_budget && !executor_.span_layers_done(*entry.job));
      if (executor_.span_layers_done(*entry.job)) {
        if (scores_prompt) {
          const int64_t vocab = weights_.config.vocab_size;
          output.prompt_logprobs.reserve(entry.prompt.size() - 1);
          output.prefill_logits = executor_.finish_span(
              *entry.job, [&](int64_t first_row, std::span<const float> rows) {
                append_prompt_logprobs(entry.prompt, first_row, rows, vocab,
                                       entry.prompt_logprobs_top, entry.scored_ids,
                                       output.prompt_logprobs);
              });
        } else {
          output.prefill_logits = executor_.finish_span(*entry.job);
        }
        output.prefill_done = true;
        entry.job.reset();
      }
    }
    return output;
  }

  PageNeed pages_needed(const AttentionConfig& attention, int prompt_tokens,
                        int max_new_tokens) const override {
    const int rows = std::min(prompt_tokens + max_new_tokens, executor_.context_length());
    const KvPageNeed need =
        kv_pages_needed(weights_.config, attention, kKvPageRows, prompt_tokens, rows);
    return {need.peak, need.steady};
  }

  KvPoolUsage pool_usage() const override {
    KvPoolUsage usage;
    usage.pages_total = pool_.pages_total();
    usage.pages_used = pool_.pages_used();
    usage.page_bytes = pool_.page_bytes();
    return usage;
  }
  int pages_held(SequenceId sequence) const override {
    return static_cast<int>(CpuExecutor::cache_pages(*find(sequence).sequence));
  }
  int position(SequenceId sequence) const override {
    return CpuExecutor::schedule(*find(sequence).sequence).position();
  }
  bool prefilled(SequenceId sequence) const override {
    return !CpuExecutor::schedule(*find(sequence).sequence).is_prefill();
  }
  bool compressed(SequenceId sequence) const override {
    return CpuExecutor::schedule(*find(sequence).sequence).compressed();
  }
  const AttentionWork& attention_work(SequenceId sequence) const override {
    return CpuExecutor::work(*find(sequence).sequence);
  }
  int context_length() const override { return executor_.context_length(); }
  int num_layers() const override { return weights_.config.num_layers; }
  const ModelConfig& config() const override { return weights_.config; }
  std::string device_name() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)";
  }

 private:
  struct Entry {
    std::vector<int32_t> prompt;
    int row_limit = 0;
    AttentionRecording recording;  // never asked to record; the executor needs one
    CpuExecutor::SequencePtr sequence;
    CpuExecutor::SpanJobPtr job;   // the prefill while it runs
    int prompt_logprobs_top = -1;  // -1: the prompt is not scored
    int scored_ids = 0;
  };

  static int64_t page_bytes(const ModelConfig& c) {
    return 2 * static_cast<int64_t>(kKvPageRows) * c.head_dim * static_cast<int64_t>(sizeof(float));
  }
  static int64_t pool_pages(const ModelConfig& c, int context, int64_t pool_bytes) {
    if (pool_bytes > 0) {
      const int64_t pages = pool_bytes / page_bytes(c);
      if (pages < 1)
        throw Error("the KV pool of " + std::to_string(pool_bytes) +
                    " bytes holds not one page of " + std::to_string(page_bytes(c)));
      return pages;
    }
    return kv_pages_needed(c, AttentionConfig{}, kKvPageRows, context, context).peak;
  }

  Entry& find(SequenceId id) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) throw Error("no sequence " + std::to_string(id));
    return *it->second;
  }
  const Entry& find(SequenceId id) const {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) throw Error("no sequence " + std::to_string(id));
    return *it->second;
  }

  const ModelWeights& weights_;
  CpuExecutor executor_;
  std::vector<float> decode_logits_;  // the last step's
  KvPagePool pool_;
  PrefillWork work_;
  // Entries hold caches charged to pool_, so they are destroyed first.
  std::map<SequenceId, std::unique_ptr<Entry>> sequences_;
  SequenceId next_id_ = 0;
};

}  // namespace

int check_batch_request(const ModelConfig& config, int context, std::span<const int32_t> prompt,
                        int max_new_tokens) {
  if (prompt.empty()) throw Error("the prompt is empty: at least one token is needed");
  if (max_new_tokens < 0) throw Error("max_new_tokens must be >= 0");
  const int64_t rows = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  if (rows > context) {
    throw Error("the prompt's " + std::to_string(prompt.size()) + " tokens and " +
                std::to_string(max_new_tokens) + " new ones exceed the " + std::to_string(context) +
                "-token context");
  }
  for (int32_t token : prompt) {
    if (token < 0 || token >= config.vocab_size) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                  std::to_string(config.vocab_size));
    }
  }
  return static_cast<int>(rows);
}

void check_prompt_logprobs_request(const ModelConfig& config, int top, int scored_ids) {
  if (top < 0 || top > kMaxTopLogprobs) {
    throw Error("prompt logprobs: " + std::to_string(top) + " alternatives asked, 0 to " +
                std::to_string(kMaxTopLogprobs) + " are given");
  }
  if (scored_ids < 0 || scored_ids > config.vocab_size) {
    throw Error("prompt logprobs: " + std::to_string(scored_ids) + " scored ids of a " +
                std::to_string(config.vocab_size) + "-token vocabulary");
  }
}

void append_prompt_logprobs(std::span<const int32_t> prompt, int64_t first_row,
                            std::span<const float> rows, int64_t vocab, int top, int scored_ids,
                            std::vector<TokenLogprob>& out) {
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t count = vocab > 0 ? static_cast<int64_t>(rows.size()) / vocab : 0;
  if (vocab <= 0 || count * vocab != static_cast<int64_t>(rows.size()) || first_row < 0 ||
      first_row + count > n) {
    throw Error("prompt logprobs: rows " + std::to_string(first_row) + " + " +
                std::to_string(count) + " of a " + std::to_string(n) + "-token prompt");
  }
  // The last prompt row is followed by no prompt token.
  const int64_t scoring = std::min(count, n - 1 - first_row);
  if (scoring <= 0) return;
  append_next_token_logprobs(
      rows.subspan(0, static_cast<size_t>(scoring * vocab)), vocab,
      scored_ids > 0 ? scored_ids : vocab,
      prompt.subspan(static_cast<size_t>(first_row + 1), static_cast<size_t>(scoring)), top, out);
}

std::unique_ptr<BatchModel> make_cpu_batch_model(const ModelWeights& weights,
                                                 const BatchModelOptions& options) {
  return std::make_unique<CpuBatchModel>(weights, options);
}

}  // namespace entropyinfer

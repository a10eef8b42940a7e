// The serving loop: a queue of requests, admission by the KV pool's worst case, and continuous
// batching over a BatchModel (engine/batch_model.h). One thread owns the model; each step decodes
// one token of every running sequence together (a small batch may wait while a prompt prefills:
// SchedulerOptions) and advances at most one prefill by a few layers, so that a long prompt does
// not freeze the other streams. Requests talk to it through a
// RequestStream: text as it is generated, then one final event.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention_config.h"
#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/generation.h"
#include "engine/token_logprobs.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::serve {

// What a finished request did, for its response, the chat page and the metrics.
struct RequestStats {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  double queue_seconds = 0.0;        // submitted -> prefill started
  double time_to_first_token = 0.0;  // submitted -> first token sampled
  double decode_seconds = 0.0;       // first token -> last token
  int64_t prefill_keys_read = 0;     // keys the prefill read, summed over layers and heads
  int64_t prefill_keys_dense = 0;    // what full causal attention would have read
  int64_t cache_entries_before = 0;  // decode cache before / after compression
  int64_t cache_entries_after = 0;
  bool compressed = false;
  std::string methods;  // "prefill+decode", e.g. "entropy+latent"
  double cache_kept_fraction() const {
    return cache_entries_before > 0
               ? static_cast<double>(cache_entries_after) / cache_entries_before
               : 1.0;
  }
  double prefill_keys_fraction() const {
    return prefill_keys_dense > 0 ? static_cast<double>(prefill_keys_read) / prefill_keys_dense
                                  : 1.0;
  }
};

// "stop": a stop token or string; "length": max_tokens or the context; "cancelled": the client
// went away or the server is stopping; "error": the engine failed (message in StreamEvent::error).
enum class FinishReason { kStop, kLength, kCancelled, kError };

struct StreamEvent {
  enum class Kind { kText, kFinished };
  Kind kind = Kind::kText;
  std::string text;  // kText: the next piece of the answer (never a split UTF-8 character)
  FinishReason finish_reason = FinishReason::kStop;  // kFinished
  std::string error;                                 // kFinished with kError
  RequestStats stats;                                // kFinished
  // With logprobs asked: the tokens this event's text came from; on kFinished, those whose text
  // was held back or cut by a stop string. Each generated token appears once, in order.
  std::vector<TokenLogprob> logprobs;
  // With prompt_logprobs asked, on the first event after the prefill: prompt tokens 1 .. n-1,
  // each scored under the position before it.
  std::vector<TokenLogprob> prompt_logprobs;
};

struct SequenceRequest {
  std::vector<int32_t> prompt;
  GenerationOptions generation;  // max_tokens, sampler, stop ids and strings
  AttentionConfig attention;
  // -1: no logprobs; else each generated token's logprob with this many alternatives (0 to
  // kMaxTopLogprobs).
  int top_logprobs = -1;
  // -1: the prompt is not scored; else its tokens' logprobs (echo with logprobs) with this many
  // alternatives, over the tokenizer's ids as the generated tokens' are.
  int prompt_logprobs = -1;
};

// One request's side of the conversation with the scheduler; shared by both.
class RequestStream {
 public:
  // Waits up to `timeout` for the next event; false when none came. After the kFinished event
  // there are no more.
  bool next(StreamEvent& event, std::chrono::milliseconds timeout);
  // The client is gone: the scheduler drops the sequence at its next step and frees its pages.
  void cancel();
  bool cancelled() const;

  // Scheduler side.
  void push(StreamEvent event);

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  bool cancelled_ = false;
};

// A request that can never run here (it would not fit in the pool even alone, or not in the
// context): the server answers 400 with this message.
class AdmissionError : public Error {
 public:
  using Error::Error;
};

struct SchedulerOptions {
  int max_running = 256;  // sequences decoding at once
  int max_queued = 1024;  // waiting requests; beyond it submit() throws QueueFullError
  // Prefill work per step, in token-layers (engine/prefill_work.h: one prompt token through one
  // layer's products; attention counted in the same unit). While other sequences decode, a step's
  // prefill is kept to about a decode step's time, so that their inter-token latency at most
  // about doubles while a long prompt runs; with nothing decoding, prompts take larger steps.
  int64_t prefill_token_layers_per_step = 65536;
  int64_t prefill_token_layers_while_decoding = 8192;
  // While a prompt prefills, a decode batch of fewer than `decode_wait_batch` sequences sits out
  // up to `decode_wait_steps` prefill steps between tokens. A decode step reads every weight for
  // one row as for many, so a lone answer decoded beside every prefill slice costs a whole weight
  // read per token; waiting lets the answers of consecutive long prompts overlap and share those
  // reads. Counted in steps, not time: a step without decode rows returns before the GPU has run
  // it. Larger batches, and every batch while nothing prefills, decode at every step; 0 steps
  // turns it off.
  int decode_wait_batch = 4;
  int decode_wait_steps = 4;
};

class QueueFullError : public Error {
 public:
  using Error::Error;
};

// What /metrics and /health read.
struct SchedulerSnapshot {
  int queued = 0;
  int running = 0;  // admitted: prefilling or decoding
  KvPoolUsage pool;
  int64_t steps = 0;
  bool accepting = true;
};

class Scheduler {
 public:
  // Starts the serving thread. `tokenizer` must outlive the scheduler.
  Scheduler(std::unique_ptr<BatchModel> model, const Tokenizer& tokenizer,
            const SchedulerOptions& options);
  ~Scheduler();  // stops: cancels what is queued or running, joins the thread
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Error for an invalid attention config, an empty prompt or ids outside the
  // vocabulary; AdmissionError when it can never fit; QueueFullError when the queue is full;
  // Error "the server is shutting down" once stop_accepting() was called.
  std::shared_ptr<RequestStream> submit(SequenceRequest request);

  // SIGTERM: refuse new requests, finish those queued or running. wait_idle() returns when none is
  // left.
  void stop_accepting();
  void wait_idle();

  SchedulerSnapshot snapshot() const;
  int context_length() const;
  const ModelConfig& model_config() const;
  std::string device_name() const;

 private:
  struct Active;
  void serve_loop();

  std::unique_ptr<BatchModel> model_;
  const Tokenizer& tokenizer_;
  SchedulerOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  struct Queued {
    SequenceRequest request;
    std::shared_ptr<RequestStream> stream;
    int64_t pages = 0;
    std::chrono::steady_clock::time_point submitted;
  };
  std::deque<Queued> queue_;
  int running_ = 0;
  int64_t steps_ = 0;
  KvPoolUsage pool_usage_;  // as of the last step
  KvPoolUsage pool_shape_;  // its size and page bytes, fixed: read without the lock
  bool accepting_ = true;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace entropyinfer::serve

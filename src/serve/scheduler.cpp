#include "serve/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <utility>

#include "engine/sampler.h"

namespace entropyinfer::serve {

using Clock = std::chrono::steady_clock;

namespace {

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return text;
}

}  // namespace

bool RequestStream::next(StreamEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestStream::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
}

bool RequestStream::cancelled() const {
  std::lock_guard lock(mutex_);
  return cancelled_;
}

void RequestStream::push(StreamEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

// A request the serving thread owns from its admission to its last event.
struct Scheduler::Active {
  BatchModel::SequenceId sequence = -1;
  SequenceRequest request;
  std::shared_ptr<RequestStream> stream;
  BatchModel::PageNeed pages;
  Clock::time_point submitted, prefill_started, first_token;
  int steps_waited = 0;  // prefill steps sat out since its last token
  std::optional<Sampler> sampler;
  std::optional<StreamingDecoder> decoder;
  std::optional<StopStringFilter> filter;
  int32_t next_token = -1;                     // sampled, to be fed at the next step
  std::vector<float> raw_logits;               // the logits before sampling changed them
  TokenLogprob sampled_logprob;                // of the token sample() just picked
  std::vector<TokenLogprob> pending_logprobs;  // accepted tokens whose text is not shown yet
  std::vector<TokenLogprob> prompt_logprobs;   // the prompt's scores, until an event takes them
  int generated = 0;
  bool prefilled = false;
  bool finished = false;
};

Scheduler::Scheduler(std::unique_ptr<BatchModel> model, const Tokenizer& tokenizer,
                     const SchedulerOptions& options)
    : model_(std::move(model)), tokenizer_(tokenizer), options_(options) {
  pool_usage_ = model_->pool_usage();
  pool_shape_ = pool_usage_;
  thread_ = std::thread([this] { serve_loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    accepting_ = false;
  }
  wake_.notify_all();
  thread_.join();
}

int Scheduler::context_length() const { return model_->context_length(); }
const ModelConfig& Scheduler::model_config() const { return model_->config(); }
std::string Scheduler::device_name() const { return model_->device_name(); }

std::shared_ptr<RequestStream> Scheduler::submit(SequenceRequest request) {
  request.attention.validate();
  validate_sampler_options(request.generation.sampler);
  for (const auto& [name, count] : {std::pair{"top_logprobs", request.top_logprobs},
                                    std::pair{"prompt_logprobs", request.prompt_logprobs}}) {
    if (count < -1 || count > kMaxTopLogprobs) {
      throw Error(std::string(name) + " must be from 0 to " + std::to_string(kMaxTopLogprobs) +
                  ", got " + std::to_string(count));
    }
  }
  const ModelConfig& config = model_->config();
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens == 0) throw Error("the prompt is empty: at least one token is needed");
  for (int32_t token : request.prompt) {
    if (token < 0 || token >= config.vocab_size) {
      throw Error("token id " + std::to_string(token) + " is outside the vocabulary of " +
                  std::to_string(config.vocab_size));
    }
  }
  if (request.generation.max_tokens < 0) throw Error("max_tokens must be >= 0");
  const int context = model_->context_length();
  if (prompt_tokens + request.generation.max_tokens > context) {
    throw AdmissionError("the prompt's " + std::to_string(prompt_tokens) + " tokens and " +
                         std::to_string(request.generation.max_tokens) +
                         " tokens to generate exceed the " + std::to_string(context) +
                         "-token context");
  }
  Queued queued;
  queued.pages = model_
                     ->pages_needed(request.attention, static_cast<int>(prompt_tokens),
                                    request.generation.max_tokens)
                     .peak;
  const KvPoolUsage& pool = pool_shape_;
  if (queued.pages > pool.pages_total) {
    throw AdmissionError(
        "the request needs " + std::to_string(queued.pages) + " KV pages (" +
        mib(queued.pages * pool.page_bytes) + ") at its peak, more than the " +
        std::to_string(pool.pages_total) + " pages (" + mib(pool.pages_total * pool.page_bytes) +
        ") of the whole pool; shorten the prompt or max_tokens, or use a method that "
        "compresses the cache");
  }
  queued.request = std::move(request);
  queued.stream = std::make_shared<RequestStream>();
  queued.submitted = Clock::now();
  std::shared_ptr<RequestStream> stream = queued.stream;
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) throw Error("the server is shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_queued) {
      throw QueueFullError("the queue is full (" + std::to_string(options_.max_queued) +
                           " requests waiting); retry later");
    }
    queue_.push_back(std::move(queued));
  }
  wake_.notify_all();
  return stream;
}

void Scheduler::stop_accepting() {
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

void Scheduler::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
}

SchedulerSnapshot Scheduler::snapshot() const {
  std::lock_guard lock(mutex_);
  SchedulerSnapshot snapshot;
  snapshot.queued = static_cast<int>(queue_.size());
  snapshot.running = running_;
  snapshot.pool = pool_usage_;
  snapshot.steps = steps_;
  snapshot.accepting = accepting_;
  return snapshot;
}

void Scheduler::serve_loop() {
  std::vector<std::unique_ptr<Active>> active;
  const auto seconds = [](Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  };
  const int tokenizer_vocab = std::max(tokenizer_.vocab_size(), 0);
  // The first event after the prefill carries the prompt's scores, whatever its kind.
  const auto push = [](Active& a, StreamEvent event) {
    event.prompt_logprobs = std::exchange(a.prompt_logprobs, {});
    a.stream->push(std::move(event));
  };

  // Ends a request: its last event, its pages back to the pool.
  const auto finish = [&](Active& a, FinishReason reason, const std::string& error) {
    if (a.finished) return;
    a.finished = true;
    StreamEvent event;
    if (a.decoder && (reason == FinishReason::kStop || reason == FinishReason::kLength)) {
      // Text held back for a split character or a possible stop string is the answer's end.
      bool stopped = false;
      std::string tail = a.filter->push(a.decoder->flush(), stopped);
      if (!stopped) tail += a.filter->flush();
      if (!tail.empty()) {
        StreamEvent text;
        text.text = std::move(tail);
        text.logprobs = std::exchange(a.pending_logprobs, {});
        push(a, std::move(text));
      }
    }
    event.logprobs = std::exchange(a.pending_logprobs, {});
    event.kind = StreamEvent::Kind::kFinished;
    event.finish_reason = reason;
    event.error = error;
    RequestStats& stats = event.stats;
    stats.prompt_tokens = static_cast<int>(a.request.prompt.size());
    stats.completion_tokens = a.generated;
    const Clock::time_point now = Clock::now();
    if (a.prefilled) {
      stats.queue_seconds = seconds(a.submitted, a.prefill_started);
      stats.time_to_first_token = seconds(a.submitted, a.first_token);
      stats.decode_seconds = seconds(a.first_token, now);
    } else {
      stats.queue_seconds = seconds(a.submitted, now);
    }
    stats.methods = prefill_method_name(a.request.attention.prefill) + "+" +
                    decode_method_name(a.request.attention.decode);
    if (a.sequence >= 0) {
      const AttentionWork& work = model_->attention_work(a.sequence);
      stats.prefill_keys_read = work.prefill_keys_read;
      stats.prefill_keys_dense = work.prefill_keys_dense;
      stats.compressed = work.compressed;
      stats.cache_entries_before = work.cache_entries_before;
      stats.cache_entries_after = work.cache_entries_after;
      model_->close(a.sequence);
      a.sequence = -1;
    }
    push(a, std::move(event));
  };

  // Takes a sampled token: ends the request at a stop token, a stop string or its length, else
  // streams its text and keeps it to feed at the next step.
  const auto accept = [&](Active& a, int32_t token) {
    const GenerationOptions& options = a.request.generation;
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
        options.stop_token_ids.end()) {
      finish(a, FinishReason::kStop, {});
      return;
    }
    ++a.generated;
    if (a.request.top_logprobs >= 0) a.pending_logprobs.push_back(std::move(a.sampled_logprob));
    bool stopped = false;
    std::string text = a.filter->push(a.decoder->push(token), stopped);
    if (!text.empty()) {
      StreamEvent event;
      event.text = std::move(text);
      event.logprobs = std::exchange(a.pending_logprobs, {});
      push(a, std::move(event));
    }
    if (stopped) {
      a.decoder.reset();  // what followed the stop string is not shown
      finish(a, FinishReason::kStop, {});
      return;
    }
    if (a.generated >= options.max_tokens) {
      finish(a, FinishReason::kLength, {});
      return;
    }
    a.next_token = token;
  };

  const auto sample = [&](Active& a, std::span<float> logits) {
    const size_t ids = std::min(logits.size(), static_cast<size_t>(tokenizer_vocab));
    if (a.request.top_logprobs < 0) return a.sampler->sample(logits.subspan(0, ids));
    a.raw_logits.assign(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(ids));
    const int32_t token = a.sampler->sample(logits.subspan(0, ids));
    a.sampled_logprob = token_logprob(a.raw_logits, token, a.request.top_logprobs);
    return token;
  };

  for (;;) {
    // Admission: the queue's head starts when its peak fits beside what the running requests
    // reserve; one prefill at a time, so that at most one uncompressed prompt is held while
    // waiting.
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) {
        for (Queued& q : queue_) {
          StreamEvent event;
          event.kind = StreamEvent::Kind::kFinished;
          event.finish_reason = FinishReason::kCancelled;
          event.error = "the server is stopping";
          q.stream->push(std::move(event));
        }
        queue_.clear();
        lock.unlock();
        for (auto& a : active) finish(*a, FinishReason::kCancelled, "the server is stopping");
        active.clear();
        lock.lock();
        running_ = 0;
        pool_usage_ = model_->pool_usage();
        idle_.notify_all();
        return;
      }
      // Requests whose client left while queued go without running.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->stream->cancelled()) {
          StreamEvent event;
          event.kind = StreamEvent::Kind::kFinished;
          event.finish_reason = FinishReason::kCancelled;
          it->stream->push(std::move(event));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      const bool prefilling =
          std::any_of(active.begin(), active.end(), [](const auto& a) { return !a->prefilled; });
      int64_t reserved = 0;
      for (const auto& a : active) {
        reserved += model_->compressed(a->sequence) ? a->pages.steady : a->pages.peak;
      }
      if (!prefilling && model_->prefill_slot_free() && !queue_.empty() &&
          static_cast<int>(active.size()) < options_.max_running &&
          reserved + queue_.front().pages <= pool_shape_.pages_total) {
        Queued q = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        auto a = std::make_unique<Active>();
        a->request = std::move(q.request);
        a->stream = std::move(q.stream);
        a->submitted = q.submitted;
        a->prefill_started = Clock::now();
        try {
          a->pages =
              model_->pages_needed(a->request.attention, static_cast<int>(a->request.prompt.size()),
                                   a->request.generation.max_tokens);
          a->sequence = model_->open(a->request.attention, a->request.prompt,
                                     a->request.generation.max_tokens);
          if (a->request.prompt_logprobs >= 0) {
            model_->ask_prompt_logprobs(a->sequence, a->request.prompt_logprobs,
                                        std::min(tokenizer_vocab, model_->config().vocab_size));
          }
          a->sampler.emplace(a->request.generation.sampler);
          a->decoder.emplace(tokenizer_);
          a->decoder->prime(a->request.prompt);
          a->filter.emplace(a->request.generation.stop_strings);
          active.push_back(std::move(a));
        } catch (const std::exception& error) {
          finish(*a, FinishReason::kError, error.what());
        }
        lock.lock();
      }
      running_ = static_cast<int>(active.size());
    }

    // Cancelled requests leave before the step, returning their pages.
    for (auto& a : active) {
      if (a->stream->cancelled()) finish(*a, FinishReason::kCancelled, {});
    }
    std::erase_if(active, [](const auto& a) { return a->finished; });

    BatchModel::StepInput input;
    Active* prefill = nullptr;
    std::vector<Active*> decoding;
    for (auto& a : active) {
      if (a->prefilled) {
        decoding.push_back(a.get());
      } else if (prefill == nullptr) {
        prefill = a.get();
        input.prefill = a->sequence;
      }
    }
    // The prefill keeps the small budget while answers wait, so that the steps they sit out stay
    // short.
    input.prefill_budget =
        static_cast<double>(decoding.empty() ? options_.prefill_token_layers_per_step
                                             : options_.prefill_token_layers_while_decoding);
    if (prefill != nullptr && !decoding.empty() &&
        static_cast<int>(decoding.size()) < options_.decode_wait_batch) {
      const int waited = std::ranges::max(decoding, {}, [](const Active* a) {
                           return a->steps_waited;
                         })->steps_waited;
      if (waited < options_.decode_wait_steps) {
        for (Active* a : decoding) ++a->steps_waited;
        decoding.clear();
      }
    }
    for (Active* a : decoding) {
      a->steps_waited = 0;
      input.decode.push_back(a->sequence);
      input.decode_tokens.push_back(a->next_token);
    }
    if (prefill != nullptr || !decoding.empty()) {
      try {
        BatchModel::StepOutput output = model_->step(input);
        {
          // Before any token of this step reaches a client, so that what they read next agrees.
          std::lock_guard lock(mutex_);
          pool_usage_ = model_->pool_usage();
        }
        const int64_t vocab = model_->config().vocab_size;
        // Sampling reads a whole vocabulary per row: the rows are sampled in parallel (each
        // request has its own sampler), then accepted in order.
        const int64_t rows = static_cast<int64_t>(decoding.size());
        std::vector<int32_t> sampled(decoding.size(), -1);
        std::vector<std::string> sample_errors(decoding.size());
#pragma omp parallel for schedule(dynamic) if (rows > 1)
        for (int64_t i = 0; i < rows; ++i) {
          try {
            std::span<float> logits(output.decode_logits.data() + i * vocab,
                                    static_cast<size_t>(vocab));
            sampled[static_cast<size_t>(i)] = sample(*decoding[static_cast<size_t>(i)], logits);
          } catch (const std::exception& error) {
            sample_errors[static_cast<size_t>(i)] = error.what();
          }
        }
        for (size_t i = 0; i < decoding.size(); ++i) {
          Active& a = *decoding[i];
          if (!sample_errors[i].empty()) {
            finish(a, FinishReason::kError, sample_errors[i]);
            continue;
          }
          try {
            accept(a, sampled[i]);
          } catch (const std::exception& error) {
            finish(a, FinishReason::kError, error.what());
          }
        }
        if (prefill != nullptr && output.prefill_done) {
          Active& a = *prefill;
          a.prefilled = true;
          a.first_token = Clock::now();
          a.prompt_logprobs = std::move(output.prompt_logprobs);
          try {
            if (a.request.generation.max_tokens == 0) {
              finish(a, FinishReason::kLength, {});
            } else {
              accept(a, sample(a, output.prefill_logits));
            }
          } catch (const std::exception& error) {
            finish(a, FinishReason::kError, error.what());
          }
        }
      } catch (const std::exception& error) {
        // A step failure cannot be pinned on one sequence: every request in it ends.
        for (Active* a : decoding) finish(*a, FinishReason::kError, error.what());
        if (prefill != nullptr) finish(*prefill, FinishReason::kError, error.what());
      }
    }
    std::erase_if(active, [](const auto& a) { return a->finished; });
    {
      std::lock_guard lock(mutex_);
      ++steps_;
      running_ = static_cast<int>(active.size());
      pool_usage_ = model_->pool_usage();
      if (queue_.empty() && active.empty()) idle_.notify_all();
    }
  }
}

}  // namespace entropyinfer::serve

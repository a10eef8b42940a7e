// Serving under load: the scheduler of `entropyinfer serve` on the CUDA batch executor, driven in
// process by client threads (no HTTP: the GPU machine has no cpp-httplib; on the CPU
// scripts/bench_serve.mjs measures the same scheduler over loopback). A model of a real shape with
// random weights, one server for every method of the call: requests carry their own methods.
//
// Scenarios (--scenario, comma-separated, run in this order):
//   long      --clients requests of --prompt tokens and --output tokens per method, arriving
//             together: wall time to the last answer per method, and each against full attention's.
//   streams   the same with --stream-clients requests of --stream-prompt / --stream-output tokens,
//             batched, against the same requests served one at a time (--alone of them, timed
//             back to back; the rate of one is the rate of all).
//   capacity  --capacity-clients requests of --prompt tokens per method, with answers long
//             enough (--capacity-output) that the first still decodes when the last is admitted:
//             the most sequences held at once, and whether all were answered.
//   floor     --floor-sequences sequences of --floor-prompt tokens (the first compressing
//             method), prefilled, then batched decode steps timed against their floor: the weights
//             once plus every kept key and value, at the copy bandwidth measured in the run.
//   interference  --stream-clients streams decoding, then one request of --prompt tokens arrives:
//             the streams' inter-token p50/p99 before and while it prefills.
// --kv-cache fp8 holds the pool's pages as E4M3 codes with a scale per row (default auto: bf16);
// --weights fp8 quantizes every projection per output row (default bf16); with it,
// --fp8-separate-scaling on runs products of 9-64 rows unscaled, then scaled (default on).
// Output like vLLM's benchmark_serving: throughput, TTFT and TPOT p50/p99, concurrency, pool use.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention_config.h"
#include "backends/cuda/ragged_decode.h"
#include "bench_common.h"
#include "core/error.h"
#include "engine/batch_model.h"
#include "engine/cuda/cuda_batch_model.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/sampler.h"
#include "model/random_model.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(rank);
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (rank - static_cast<double>(low)) * (values[high] - values[low]);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// What one client saw.
struct ClientRecord {
  Clock::time_point submitted, first_token, finished;
  std::vector<Clock::time_point> token_times;  // each text event
  serve::StreamEvent end;
};

// Reads one stream to its end, timing every piece.
ClientRecord read_stream(serve::RequestStream& stream, Clock::time_point submitted) {
  ClientRecord record;
  record.submitted = submitted;
  serve::StreamEvent event;
  for (;;) {
    if (!stream.next(event, std::chrono::milliseconds(1000))) continue;
    const Clock::time_point now = Clock::now();
    if (event.kind == serve::StreamEvent::Kind::kText) {
      if (record.token_times.empty()) record.first_token = now;
      record.token_times.push_back(now);
      continue;
    }
    record.finished = now;
    record.end = event;
    if (record.token_times.empty()) record.first_token = now;
    return record;
  }
}

// Samples the scheduler's concurrency and pool while a wave runs.
class Monitor {
 public:
  explicit Monitor(const serve::Scheduler& scheduler) : scheduler_(scheduler) {
    thread_ = std::thread([this] {
      while (!stop_) {
        const serve::SchedulerSnapshot snapshot = scheduler_.snapshot();
        {
          std::lock_guard lock(mutex_);
          most_running_ = std::max(most_running_, snapshot.running);
          most_pages_ = std::max(most_pages_, snapshot.pool.pages_used);
          pages_total_ = snapshot.pool.pages_total;
          page_bytes_ = snapshot.pool.page_bytes;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~Monitor() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  nlohmann::json json() {
    std::lock_guard lock(mutex_);
    return {{"most_running", most_running_},
            {"most_pool_pages", most_pages_},
            {"pool_pages", pages_total_},
            {"most_pool_gib", static_cast<double>(most_pages_) * page_bytes_ / (1 << 30)},
            {"pool_gib", static_cast<double>(pages_total_) * page_bytes_ / (1 << 30)}};
  }

 private:
  const serve::Scheduler& scheduler_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  int most_running_ = 0;
  int64_t most_pages_ = 0, pages_total_ = 0, page_bytes_ = 0;
};

struct Wave {
  std::vector<ClientRecord> records;
  double wall = 0;
  nlohmann::json monitor;
};

// Submits every request at once (or, with one_at_a_time, each after the previous one finished)
// and waits for all answers.
Wave run_wave(serve::Scheduler& scheduler, const std::vector<serve::SequenceRequest>& requests,
              bool one_at_a_time = false) {
  Wave wave;
  Monitor monitor(scheduler);
  const Clock::time_point start = Clock::now();
  if (one_at_a_time) {
    for (const serve::SequenceRequest& request : requests) {
      const Clock::time_point submitted = Clock::now();
      auto stream = scheduler.submit(request);
      wave.records.push_back(read_stream(*stream, submitted));
    }
  } else {
    std::vector<std::shared_ptr<serve::RequestStream>> streams;
    std::vector<Clock::time_point> submitted;
    for (const serve::SequenceRequest& request : requests) {
      submitted.push_back(Clock::now());
      streams.push_back(scheduler.submit(request));
    }
    wave.records.resize(requests.size());
    std::vector<std::thread> readers;
    for (size_t i = 0; i < streams.size(); ++i) {
      readers.emplace_back([&, i] { wave.records[i] = read_stream(*streams[i], submitted[i]); });
    }
    for (std::thread& reader : readers) reader.join();
  }
  wave.wall = seconds(start, Clock::now());
  monitor.stop();
  wave.monitor = monitor.json();
  return wave;
}

nlohmann::json summarize(const Wave& wave) {
  std::vector<double> ttft, tpot, itl;
  int64_t output = 0, prompt = 0;
  int errors = 0;
  std::string first_error;
  for (const ClientRecord& r : wave.records) {
    if (!r.end.error.empty()) {
      if (errors++ == 0) first_error = r.end.error;
      continue;
    }
    output += r.end.stats.completion_tokens;
    prompt += r.end.stats.prompt_tokens;
    ttft.push_back(seconds(r.submitted, r.first_token));
    if (r.end.stats.completion_tokens > 1) {
      tpot.push_back(seconds(r.first_token, r.finished) / (r.end.stats.completion_tokens - 1));
    }
    for (size_t i = 1; i < r.token_times.size(); ++i)
      itl.push_back(seconds(r.token_times[i - 1], r.token_times[i]));
  }
  nlohmann::json j = {{"requests", wave.records.size()},
                      {"errors", errors},
                      {"wall_s", wave.wall},
                      {"prompt_tokens", prompt},
                      {"output_tokens", output},
                      {"output_tok_s", output / wave.wall},
                      {"ttft_p50_s", percentile(ttft, 50)},
                      {"ttft_p99_s", percentile(ttft, 99)},
                      {"tpot_p50_ms", 1e3 * percentile(tpot, 50)},
                      {"tpot_p99_ms", 1e3 * percentile(tpot, 99)},
                      {"itl_p50_ms", 1e3 * percentile(itl, 50)},
                      {"itl_p99_ms", 1e3 * percentile(itl, 99)}};
  if (errors > 0) j["first_error"] = first_error;
  j.update(wave.monitor);
  return j;
}

void print_summary(const std::string& title, const nlohmann::json& j) {
  std::printf(
      "%-34s %4d req (%d err) wall %8.2f s | out %9.1f tok/s | TTFT p50 %7.2f p99 %7.2f s | "
      "TPOT p50 %7.2f p99 %7.2f ms | ITL p99 %7.1f ms | running <= %d | pool <= %.2f of %.2f "
      "GiB\n",
      title.c_str(), j["requests"].get<int>(), j["errors"].get<int>(), j["wall_s"].get<double>(),
      j["output_tok_s"].get<double>(), j["ttft_p50_s"].get<double>(), j["ttft_p99_s"].get<double>(),
      j["tpot_p50_ms"].get<double>(), j["tpot_p99_ms"].get<double>(), j["itl_p99_ms"].get<double>(),
      j["most_running"].get<int>(), j["most_pool_gib"].get<double>(), j["pool_gib"].get<double>());
  if (j.contains("first_error"))
    std::printf("  first error: %s\n", j["first_error"].get<std::string>().c_str());
  std::fflush(stdout);
}

serve::SequenceRequest make_request(const std::string& methods, int prompt_tokens, int output,
                                    int vocab, uint64_t seed) {
  serve::SequenceRequest request;
  // Ids from the ordinary part of the vocabulary: random weights make any text equally likely.
  request.prompt = random_prompt(prompt_tokens, std::min(vocab, 120000), seed);
  request.generation.max_tokens = output;
  request.attention = with_methods(methods, AttentionConfig{});
  return request;
}

}  // namespace

int run_serve_bench(int argc, char** argv) {
  std::string shape_name = "llama-3.1-8b",
              tokenizer_path = ".cache/tokenizers/llama3/tokenizer.json", json_path,
              scenarios_text = "long,streams,floor,interference,capacity";
  std::vector<std::string> methods = {"full", "entropy+snapkv", "entropy+latent"};
  int clients = 16, prompt = 130816, output = 256;
  int stream_clients = 64, stream_prompt = 4096, stream_output = 512, alone = 8;
  int capacity_clients = 110, capacity_output = 4096, capacity_full_clients = 9,
      capacity_full_output = 512, interference_output = 4096;
  int floor_sequences = 32, floor_prompt = 32768, floor_steps = 32;
  int context = 0;
  std::string kv_cache = "auto";        // as the CLI: bf16 pages, or fp8
  std::string weights = "bf16";         // or fp8: projections quantized per row
  std::string separate_scaling = "on";  // on: FP8 products of 9-64 rows unscaled, then scaled
  int64_t prefill_budget = serve::SchedulerOptions{}.prefill_token_layers_per_step;
  int64_t prefill_budget_decoding = serve::SchedulerOptions{}.prefill_token_layers_while_decoding;
  int decode_wait_steps = serve::SchedulerOptions{}.decode_wait_steps;
  int decode_wait_batch = serve::SchedulerOptions{}.decode_wait_batch;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape")
      shape_name = value;
    else if (flag == "--tokenizer")
      tokenizer_path = value;
    else if (flag == "--json")
      json_path = value;
    else if (flag == "--scenario")
      scenarios_text = value;
    else if (flag == "--methods")
      methods = split(value);
    else if (flag == "--clients")
      clients = std::stoi(value);
    else if (flag == "--prompt")
      prompt = std::stoi(value);
    else if (flag == "--output")
      output = std::stoi(value);
    else if (flag == "--stream-clients")
      stream_clients = std::stoi(value);
    else if (flag == "--stream-prompt")
      stream_prompt = std::stoi(value);
    else if (flag == "--stream-output")
      stream_output = std::stoi(value);
    else if (flag == "--alone")
      alone = std::stoi(value);
    else if (flag == "--capacity-clients")
      capacity_clients = std::stoi(value);
    else if (flag == "--capacity-output")
      capacity_output = std::stoi(value);
    else if (flag == "--capacity-full-clients")
      capacity_full_clients = std::stoi(value);
    else if (flag == "--capacity-full-output")
      capacity_full_output = std::stoi(value);
    else if (flag == "--interference-output")
      interference_output = std::stoi(value);
    else if (flag == "--floor-sequences")
      floor_sequences = std::stoi(value);
    else if (flag == "--floor-prompt")
      floor_prompt = std::stoi(value);
    else if (flag == "--floor-steps")
      floor_steps = std::stoi(value);
    else if (flag == "--context")
      context = std::stoi(value);
    else if (flag == "--kv-cache")
      kv_cache = value;
    else if (flag == "--weights")
      weights = value;
    else if (flag == "--fp8-separate-scaling")
      separate_scaling = value;
    else if (flag == "--prefill-budget")
      prefill_budget = std::stoll(value);
    else if (flag == "--prefill-budget-decoding")
      prefill_budget_decoding = std::stoll(value);
    else if (flag == "--decode-wait-steps")
      decode_wait_steps = std::stoi(value);
    else if (flag == "--decode-wait-batch")
      decode_wait_batch = std::stoi(value);
    else
      return false;
    return true;
  });
  if (kv_cache != "auto" && kv_cache != "fp8") {
    throw Error("--kv-cache must be auto or fp8, not '" + kv_cache + "'");
  }
  const bool fp8_pages = kv_cache == "fp8";
  const char* page_format = fp8_pages ? "fp8" : "bf16";
  if (weights != "bf16" && weights != "fp8") {
    throw Error("--weights must be bf16 or fp8, not '" + weights + "'");
  }
  const bool fp8_weights = weights == "fp8";
  if (separate_scaling != "on" && separate_scaling != "off") {
    throw Error("--fp8-separate-scaling must be on or off, not '" + separate_scaling + "'");
  }
  const std::vector<std::string> scenarios = split(scenarios_text);
  const auto wants = [&](const char* name) {
    return std::find(scenarios.begin(), scenarios.end(), name) != scenarios.end();
  };
  ModelConfig config = random_model_config(shape_name);
  if (wants("capacity")) context = std::max(context, prompt + capacity_output);
  if (context > config.max_position_embeddings) config.max_position_embeddings = context;
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_path);
  const cuda::CopyBandwidth bandwidth = cuda::measure_copy_bandwidth();
  std::printf("copy bandwidth %.0f GB/s\n", (bandwidth.median_bytes_per_second / 1e9));

  BatchModelOptions options;
  options.device = Device::kCuda;
  options.context_length = context;
  options.fp8_kv_cache = fp8_pages;
  options.fp8_separate_scaling = separate_scaling == "on";
  const Clock::time_point built = Clock::now();
  std::unique_ptr<BatchModel> owned =
      cuda::make_cuda_batch_model(config, 1234, options, fp8_weights);
  BatchModel* model = owned.get();
  const KvPoolUsage pool = model->pool_usage();
  std::printf(
      "%s, %s weights: context %d, KV pool %lld %s pages of %lld KiB (%.1f GiB), ready in %.1f s "
      "on %s\n",
      shape_name.c_str(), weights.c_str(), model->context_length(),
      static_cast<long long>(pool.pages_total), page_format,
      static_cast<long long>(pool.page_bytes >> 10),
      static_cast<double>(pool.pages_total) * pool.page_bytes / (1 << 30),
      seconds(built, Clock::now()), model->device_name().c_str());
  nlohmann::json report = {{"shape", shape_name},
                           {"device", model->device_name()},
                           {"copy_gb_s", (bandwidth.median_bytes_per_second / 1e9)},
                           {"context", model->context_length()},
                           {"kv_cache", page_format},
                           {"weights", weights},
                           {"fp8_separate_scaling", separate_scaling == "on"},
                           {"pool_pages", pool.pages_total},
                           {"page_bytes", pool.page_bytes},
                           {"prefill_budget", prefill_budget},
                           {"prefill_budget_decoding", prefill_budget_decoding},
                           {"decode_wait_steps", decode_wait_steps},
                           {"decode_wait_batch", decode_wait_batch}};
  const int vocab = config.vocab_size;

  // The floor scenario drives the batch model directly, before the scheduler owns it.
  if (wants("floor")) {
    std::string method = "entropy+snapkv";
    for (const std::string& m : methods) {
      if (m.find("snapkv") != std::string::npos || m.find("adakv") != std::string::npos) {
        method = m;
        break;
      }
    }
    const AttentionConfig attention = with_methods(method, AttentionConfig{});
    std::vector<BatchModel::SequenceId> ids;
    std::vector<int32_t> tokens;
    for (int i = 0; i < floor_sequences; ++i) {
      ids.push_back(
          model->open(attention, random_prompt(floor_prompt, 120000, 100 + i), floor_steps + 2));
      BatchModel::StepInput input;
      input.prefill = ids.back();
      input.prefill_budget = std::numeric_limits<double>::infinity();
      const BatchModel::StepOutput out = model->step(input);
      tokens.push_back(argmax(out.prefill_logits));
    }
    BatchModel::StepInput input;
    input.decode = ids;
    input.decode_tokens = tokens;
    model->step(input);  // warm: tables go up once
    std::vector<double> step_ms;
    for (int s = 0; s < floor_steps; ++s) {
      const Clock::time_point t0 = Clock::now();
      model->step(input);
      step_ms.push_back(1e3 * seconds(t0, Clock::now()));
    }
    int64_t pages = 0;
    for (BatchModel::SequenceId id : ids) pages += model->pages_held(id);
    int64_t kept_rows = 0;
    for (BatchModel::SequenceId id : ids) {
      kept_rows += model->attention_work(id).cache_entries_after;
    }
    cuda::CudaModelOptions plan_options;
    plan_options.fp8_weights = fp8_weights;
    const double weight_bytes =
        static_cast<double>(cuda::CudaTransformer::plan(config, plan_options).weights);
    // A kept row's key and value, as the pool's pages hold them (bf16, or E4M3 codes with a
    // float scale each).
    const double kv_bytes =
        static_cast<double>(kept_rows) * static_cast<double>(pool.page_bytes) / cuda::kPagedRows;
    const double floor_ms = (weight_bytes + kv_bytes) / (bandwidth.median_bytes_per_second) * 1e3;
    const double median = percentile(step_ms, 50);
    std::printf(
        "floor: %d x %d-token %s sequences, batched step %.3f ms median (p99 %.3f); floor %.3f "
        "ms (weights %.2f GB + kept K/V %.3f GB at %.0f GB/s): %.2fx\n",
        floor_sequences, floor_prompt, method.c_str(), median, percentile(step_ms, 99), floor_ms,
        weight_bytes / 1e9, kv_bytes / 1e9, (bandwidth.median_bytes_per_second / 1e9),
        median / floor_ms);
    report["floor"] = {{"method", method},
                       {"sequences", floor_sequences},
                       {"prompt", floor_prompt},
                       {"step_ms_median", median},
                       {"step_ms_p99", percentile(step_ms, 99)},
                       {"floor_ms", floor_ms},
                       {"weight_bytes", weight_bytes},
                       {"kv_bytes", kv_bytes},
                       {"pages_held", pages},
                       {"ratio", median / floor_ms}};
    for (BatchModel::SequenceId id : ids) model->close(id);
  }

  serve::SchedulerOptions scheduler_options;
  scheduler_options.prefill_token_layers_per_step = prefill_budget;
  scheduler_options.prefill_token_layers_while_decoding = prefill_budget_decoding;
  scheduler_options.decode_wait_steps = decode_wait_steps;
  scheduler_options.decode_wait_batch = decode_wait_batch;
  serve::Scheduler scheduler(std::move(owned), *tokenizer, scheduler_options);

  if (wants("long")) {
    nlohmann::json rows = nlohmann::json::array();
    double full_wall = 0;
    for (const std::string& method : methods) {
      std::vector<serve::SequenceRequest> requests;
      for (int i = 0; i < clients; ++i)
        requests.push_back(make_request(method, prompt, output, vocab, 1000 + i));
      nlohmann::json j = summarize(run_wave(scheduler, requests));
      if (method == "full") full_wall = j["wall_s"].get<double>();
      j["method"] = method;
      if (full_wall > 0) j["x_full"] = full_wall / j["wall_s"].get<double>();
      print_summary("long " + method, j);
      if (j.contains("x_full"))
        std::printf("  %.2fx sooner than full\n", j["x_full"].get<double>());
      rows.push_back(j);
    }
    report["long"] = rows;
  }

  if (wants("streams")) {
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& method : methods) {
      std::vector<serve::SequenceRequest> requests;
      for (int i = 0; i < stream_clients; ++i)
        requests.push_back(make_request(method, stream_prompt, stream_output, vocab, 2000 + i));
      nlohmann::json batched = summarize(run_wave(scheduler, requests));
      print_summary("streams " + method + " batched", batched);
      requests.resize(static_cast<size_t>(std::min(alone, stream_clients)));
      nlohmann::json lone = summarize(run_wave(scheduler, requests, true));
      print_summary("streams " + method + " one at a time", lone);
      const double ratio =
          batched["output_tok_s"].get<double>() / lone["output_tok_s"].get<double>();
      std::printf("  batched / one at a time: %.2fx output tokens/s\n", ratio);
      rows.push_back(
          {{"method", method}, {"batched", batched}, {"one_at_a_time", lone}, {"ratio", ratio}});
    }
    report["streams"] = rows;
  }

  if (wants("interference")) {
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& method : methods) {
      std::vector<serve::SequenceRequest> requests;
      for (int i = 0; i < 16; ++i)
        requests.push_back(
            make_request(method, stream_prompt, interference_output, vocab, 3000 + i));
      std::vector<std::shared_ptr<serve::RequestStream>> streams;
      std::vector<ClientRecord> records(requests.size());
      const Clock::time_point start = Clock::now();
      for (const auto& request : requests) streams.push_back(scheduler.submit(request));
      std::vector<std::thread> readers;
      for (size_t i = 0; i < streams.size(); ++i)
        readers.emplace_back([&, i] { records[i] = read_stream(*streams[i], start); });
      // Once every stream has been admitted (their short prefills take a few seconds at most)
      // and decodes, a long prompt arrives.
      while (scheduler.snapshot().queued > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::seconds(2));
      const Clock::time_point long_submitted = Clock::now();
      auto long_stream = scheduler.submit(make_request(method, prompt, 4, vocab, 4000));
      const ClientRecord long_record = read_stream(*long_stream, long_submitted);
      for (std::thread& reader : readers) reader.join();
      std::vector<double> before, during;
      for (const ClientRecord& r : records) {
        for (size_t i = 1; i < r.token_times.size(); ++i) {
          const double gap = seconds(r.token_times[i - 1], r.token_times[i]);
          if (r.token_times[i] < long_submitted)
            before.push_back(gap);
          else if (r.token_times[i - 1] >= long_submitted &&
                   r.token_times[i] <= long_record.first_token)
            during.push_back(gap);
        }
      }
      const double p50_before = 1e3 * percentile(before, 50);
      const double p99_during = 1e3 * percentile(during, 99);
      std::printf(
          "interference %s: streams' inter-token p50 %.2f ms before, while a %d-token prefill "
          "runs (%.2f s) p50 %.2f p99 %.2f ms: p99 / p50 before %.2fx\n",
          method.c_str(), p50_before, prompt, seconds(long_submitted, long_record.first_token),
          1e3 * percentile(during, 50), p99_during, p99_during / p50_before);
      rows.push_back({{"method", method},
                      {"itl_p50_before_ms", p50_before},
                      {"itl_p50_during_ms", 1e3 * percentile(during, 50)},
                      {"itl_p99_during_ms", p99_during},
                      {"prefill_s", seconds(long_submitted, long_record.first_token)},
                      {"ratio", p99_during / p50_before}});
    }
    report["interference"] = rows;
  }

  if (wants("capacity")) {
    nlohmann::json rows = nlohmann::json::array();
    for (const std::string& method : methods) {
      // Full attention's few sequences need shorter answers to overlap.
      const bool full = method == "full";
      const int count = full ? capacity_full_clients : capacity_clients;
      std::vector<serve::SequenceRequest> requests;
      for (int i = 0; i < count; ++i) {
        requests.push_back(make_request(
            method, prompt, full ? capacity_full_output : capacity_output, vocab, 5000 + i));
      }
      nlohmann::json j = summarize(run_wave(scheduler, requests));
      j["method"] = method;
      print_summary("capacity " + method, j);
      rows.push_back(j);
    }
    report["capacity"] = rows;
  }

  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

#include "serve/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace entropyinfer::serve {
namespace {

// Seconds from a fast token on a GPU to a 128k-token prefill on two CPU cores.
const std::vector<double> kFirstTokenBuckets = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,  0.5,  1.0,
                                                2.5,   5.0,  10.0,  30.0, 60.0, 120.0, 300.0};
const std::vector<double> kPerTokenBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1,   0.25,   0.5,   1.0,  2.5};
const std::vector<double> kLatencyBuckets = {0.01, 0.05, 0.1,  0.25, 0.5,   1.0,   2.5,
                                             5.0,  10.0, 30.0, 60.0, 120.0, 300.0, 600.0};

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, double value) {
  out += name;
  out += ' ';
  out += prometheus_number(value);
  out += '\n';
}

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  header(out, name, type, help);
  sample(out, name, value);
}

}  // namespace

std::string prometheus_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

std::string prometheus_label(std::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '"') {
      escaped += "\\\"";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  // A NaN would poison the sum forever; it says nothing about latency.
  if (std::isnan(value)) return;
  size_t bucket = 0;
  while (bucket < upper_bounds_.size() && value > upper_bounds_[bucket]) ++bucket;
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t bucket = 0; bucket < bucket_counts_.size(); ++bucket) {
    cumulative += bucket_counts_[bucket];
    const std::string bound = bucket < upper_bounds_.size()
                                  ? prometheus_number(upper_bounds_[bucket])
                                  : std::string("+Inf");
    out += name + "_bucket{le=\"" + bound + "\"} " + std::to_string(cumulative) + "\n";
  }
  sample(out, name + "_sum", sum_);
  out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : time_to_first_token_(kFirstTokenBuckets),
      time_per_output_token_(kPerTokenBuckets),
      request_latency_(kLatencyBuckets) {}

void ServerMetrics::count_request(std::string_view endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(endpoint), status}];
}

void ServerMetrics::observe_generation(const RequestStats& stats, double latency_seconds) {
  std::lock_guard lock(mutex_);
  ++generations_by_outcome_["finished"];
  prompt_tokens_ += static_cast<uint64_t>(std::max(stats.prompt_tokens, 0));
  completion_tokens_ += static_cast<uint64_t>(std::max(stats.completion_tokens, 0));
  prefill_keys_read_ += stats.prefill_keys_read;
  prefill_keys_dense_ += stats.prefill_keys_dense;
  if (stats.completion_tokens > 0) time_to_first_token_.observe(stats.time_to_first_token);
  if (stats.completion_tokens > 1) {
    time_per_output_token_.observe(stats.decode_seconds / (stats.completion_tokens - 1));
  }
  request_latency_.observe(latency_seconds);
}

void ServerMetrics::count_unfinished(std::string_view reason) {
  std::lock_guard lock(mutex_);
  ++generations_by_outcome_[std::string(reason)];
}

std::string ServerMetrics::render(const SchedulerSnapshot& snapshot) const {
  std::string out;
  std::lock_guard lock(mutex_);

  header(out, "entropyinfer_http_requests_total", "counter",
         "HTTP requests answered, by endpoint and status code.");
  for (const auto& [key, count] : requests_) {
    out += "entropyinfer_http_requests_total{endpoint=\"" + prometheus_label(key.first) +
           "\",status=\"" + std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
  }
  header(out, "entropyinfer_generations_total", "counter",
         "Generations by outcome: finished (stop or length), cancelled or error.");
  for (const auto& [outcome, count] : generations_by_outcome_) {
    out += "entropyinfer_generations_total{outcome=\"" + prometheus_label(outcome) + "\"} " +
           std::to_string(count) + "\n";
  }
  metric(out, "entropyinfer_prompt_tokens_total", "counter",
         "Prompt tokens of finished generations.", static_cast<double>(prompt_tokens_));
  metric(out, "entropyinfer_completion_tokens_total", "counter",
         "Tokens generated by finished generations.", static_cast<double>(completion_tokens_));

  header(out, "entropyinfer_time_to_first_token_seconds", "histogram",
         "Seconds from a request's submission to its first token.");
  time_to_first_token_.render(out, "entropyinfer_time_to_first_token_seconds");
  header(out, "entropyinfer_time_per_output_token_seconds", "histogram",
         "Seconds per generated token after the first, per request.");
  time_per_output_token_.render(out, "entropyinfer_time_per_output_token_seconds");
  header(out, "entropyinfer_request_duration_seconds", "histogram",
         "Seconds from a generation request's arrival to its last token.");
  request_latency_.render(out, "entropyinfer_request_duration_seconds");

  metric(out, "entropyinfer_prefill_keys_read_total", "counter",
         "Keys the prefills read, summed over layers and heads.",
         static_cast<double>(prefill_keys_read_));
  metric(out, "entropyinfer_prefill_keys_dense_total", "counter",
         "Keys full causal attention would have read for the same prefills.",
         static_cast<double>(prefill_keys_dense_));
  metric(out, "entropyinfer_prefill_keys_read_fraction", "gauge",
         "Keys read over keys full attention reads, over all prefills (NaN before the first).",
         prefill_keys_dense_ > 0
             ? static_cast<double>(prefill_keys_read_) / static_cast<double>(prefill_keys_dense_)
             : std::numeric_limits<double>::quiet_NaN());

  metric(out, "entropyinfer_queue_length", "gauge", "Requests waiting for admission.",
         snapshot.queued);
  metric(out, "entropyinfer_running_sequences", "gauge",
         "Sequences admitted: prefilling or decoding.", snapshot.running);
  metric(out, "entropyinfer_kv_pool_pages_total", "gauge", "Pages in the KV cache pool.",
         static_cast<double>(snapshot.pool.pages_total));
  metric(out, "entropyinfer_kv_pool_pages_used", "gauge", "KV cache pages held by sequences.",
         static_cast<double>(snapshot.pool.pages_used));
  metric(out, "entropyinfer_kv_pool_pages_free", "gauge", "KV cache pages free.",
         static_cast<double>(snapshot.pool.pages_free()));
  metric(out, "entropyinfer_kv_pool_page_bytes", "gauge",
         "Bytes of one page: keys and values of its rows of one head.",
         static_cast<double>(snapshot.pool.page_bytes));
  metric(out, "entropyinfer_scheduler_steps_total", "counter", "Batched model steps run.",
         static_cast<double>(snapshot.steps));
  metric(out, "entropyinfer_accepting_requests", "gauge",
         "1 while the server accepts requests, 0 while it drains for shutdown.",
         snapshot.accepting ? 1.0 : 0.0);
  return out;
}

}  // namespace entropyinfer::serve

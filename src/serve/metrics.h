// What GET /metrics reports, in Prometheus' text exposition format (version 0.0.4): HTTP requests
// by endpoint and status, tokens, latency histograms, the fraction of full attention's keys the
// prefills read, and the scheduler's queue, running sequences and KV pool at the moment of the
// scrape. Every method is thread-safe: the HTTP threads record, the scrape renders.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serve/scheduler.h"

namespace entropyinfer::serve {

// Cumulative-bucket histogram as Prometheus defines it: observations at or below each upper
// bound, plus the +Inf bucket, the sum and the count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending
  void observe(double value);
  // Appends `name`_bucket{le=...}, _sum and _count lines.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<uint64_t> bucket_counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One HTTP response. `endpoint` is the route ("/v1/completions", "other" for paths the server
  // does not serve, so that hostile paths cannot grow the label set).
  void count_request(std::string_view endpoint, int status);
  // A generation that ran to its end (stop or length), with the request's end-to-end latency.
  void observe_generation(const RequestStats& stats, double latency_seconds);
  // A generation that ended otherwise ("cancelled", "error").
  void count_unfinished(std::string_view reason);

  std::string render(const SchedulerSnapshot& snapshot) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> generations_by_outcome_;
  uint64_t prompt_tokens_ = 0;
  uint64_t completion_tokens_ = 0;
  int64_t prefill_keys_read_ = 0;
  int64_t prefill_keys_dense_ = 0;
  Histogram time_to_first_token_;
  Histogram time_per_output_token_;
  Histogram request_latency_;
};

// A Prometheus sample value: shortest round-trip decimal, NaN, +Inf or -Inf.
std::string prometheus_number(double value);
// A label value with backslash, double quote and newline escaped.
std::string prometheus_label(std::string_view value);

}  // namespace entropyinfer::serve

// /metrics of `entropyinfer serve`: the rendered text parses as Prometheus' text exposition
// format, histogram buckets are cumulative and end in _count, counters add up under concurrent
// recording, and the scheduler's snapshot appears as gauges.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve/metrics.h"

namespace entropyinfer::serve {
namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // metric family -> counter, gauge, histogram
};

double parse_value(const std::string& text) {
  if (text == "NaN") return std::nan("");
  if (text == "+Inf") return HUGE_VAL;
  if (text == "-Inf") return -HUGE_VAL;
  size_t used = 0;
  const double value = std::stod(text, &used);
  EXPECT_EQ(used, text.size()) << "not a number: " << text;
  return value;
}

// A strict reader of the text format: every line is a HELP or TYPE comment or a sample of a
// family whose TYPE came first.
Exposition parse_exposition(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+)");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex kSample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+))");
  static const std::regex kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?)re");
  Exposition exposition;
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::istringstream lines(text);
  std::string line;
  std::set<std::string> helped;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (std::regex_match(line, match, kHelp)) {
      EXPECT_TRUE(helped.insert(match[1]).second) << "HELP twice: " << line;
    } else if (std::regex_match(line, match, kType)) {
      EXPECT_TRUE(helped.count(match[1])) << "TYPE before HELP: " << line;
      EXPECT_TRUE(exposition.types.emplace(match[1], match[2]).second) << "TYPE twice: " << line;
    } else if (std::regex_match(line, match, kSample)) {
      Sample sample;
      sample.name = match[1];
      sample.value = parse_value(match[4]);
      std::string labels = match[3];
      for (std::sregex_iterator it(labels.begin(), labels.end(), kLabel), end; it != end; ++it) {
        sample.labels[(*it)[1]] = (*it)[2];
      }
      std::string family = sample.name;
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (family.size() > s.size() &&
            family.compare(family.size() - s.size(), s.size(), s) == 0 &&
            exposition.types.count(family.substr(0, family.size() - s.size())) &&
            exposition.types[family.substr(0, family.size() - s.size())] == "histogram") {
          family = family.substr(0, family.size() - s.size());
        }
      }
      EXPECT_TRUE(exposition.types.count(family)) << "sample without TYPE: " << line;
      EXPECT_EQ(sample.name.rfind("entropyinfer_", 0), 0u) << line;
      exposition.samples.push_back(sample);
    } else {
      ADD_FAILURE() << "not exposition format: '" << line << "'";
    }
  }
  return exposition;
}

const Sample* find_sample(const Exposition& exposition, const std::string& name,
                          const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& sample : exposition.samples) {
    if (sample.name == name && sample.labels == labels) return &sample;
  }
  return nullptr;
}

double value_of(const Exposition& exposition, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  const Sample* sample = find_sample(exposition, name, labels);
  EXPECT_NE(sample, nullptr) << name;
  return sample != nullptr ? sample->value : std::nan("");
}

// Buckets in order of their bounds, each at least the one before; the +Inf bucket is _count.
void expect_histogram(const Exposition& exposition, const std::string& name, uint64_t observations,
                      double sum) {
  double previous_bound = -HUGE_VAL;
  double previous_count = 0;
  bool saw_infinity = false;
  for (const Sample& sample : exposition.samples) {
    if (sample.name != name + "_bucket") continue;
    ASSERT_EQ(sample.labels.count("le"), 1u);
    const double bound = parse_value(sample.labels.at("le"));
    EXPECT_GT(bound, previous_bound) << name << " buckets out of order";
    EXPECT_GE(sample.value, previous_count) << name << " le=" << sample.labels.at("le");
    previous_bound = bound;
    previous_count = sample.value;
    saw_infinity = std::isinf(bound);
  }
  EXPECT_TRUE(saw_infinity) << name << " has no +Inf bucket last";
  EXPECT_EQ(previous_count, static_cast<double>(observations)) << name;
  EXPECT_EQ(value_of(exposition, name + "_count"), static_cast<double>(observations)) << name;
  EXPECT_NEAR(value_of(exposition, name + "_sum"), sum, 1e-9) << name;
}

RequestStats stats_of(int prompt, int completion, double first_token, double decode,
                      int64_t keys_read, int64_t keys_dense) {
  RequestStats stats;
  stats.prompt_tokens = prompt;
  stats.completion_tokens = completion;
  stats.time_to_first_token = first_token;
  stats.decode_seconds = decode;
  stats.prefill_keys_read = keys_read;
  stats.prefill_keys_dense = keys_dense;
  return stats;
}

TEST(ServerMetrics, EmptyRenderIsValidAndReportsTheSnapshot) {
  ServerMetrics metrics;
  SchedulerSnapshot snapshot;
  snapshot.queued = 3;
  snapshot.running = 2;
  snapshot.pool.pages_total = 1000;
  snapshot.pool.pages_used = 250;
  snapshot.pool.page_bytes = 8192;
  snapshot.steps = 77;
  snapshot.accepting = false;
  const Exposition exposition = parse_exposition(metrics.render(snapshot));
  EXPECT_EQ(value_of(exposition, "entropyinfer_queue_length"), 3);
  EXPECT_EQ(value_of(exposition, "entropyinfer_running_sequences"), 2);
  EXPECT_EQ(value_of(exposition, "entropyinfer_kv_pool_pages_total"), 1000);
  EXPECT_EQ(value_of(exposition, "entropyinfer_kv_pool_pages_used"), 250);
  EXPECT_EQ(value_of(exposition, "entropyinfer_kv_pool_pages_free"), 750);
  EXPECT_EQ(value_of(exposition, "entropyinfer_kv_pool_page_bytes"), 8192);
  EXPECT_EQ(value_of(exposition, "entropyinfer_scheduler_steps_total"), 77);
  EXPECT_EQ(value_of(exposition, "entropyinfer_accepting_requests"), 0);
  EXPECT_TRUE(std::isnan(value_of(exposition, "entropyinfer_prefill_keys_read_fraction")));
  expect_histogram(exposition, "entropyinfer_time_to_first_token_seconds", 0, 0.0);
  EXPECT_EQ(exposition.types.at("entropyinfer_http_requests_total"), "counter");
  EXPECT_EQ(exposition.types.at("entropyinfer_kv_pool_pages_used"), "gauge");
  EXPECT_EQ(exposition.types.at("entropyinfer_request_duration_seconds"), "histogram");
}

TEST(ServerMetrics, GenerationsFillTokensHistogramsAndTheKeyFraction) {
  ServerMetrics metrics;
  metrics.observe_generation(stats_of(100, 11, 0.02, 0.5, 300, 1000), 0.6);
  metrics.observe_generation(stats_of(50, 1, 3.0, 0.0, 100, 100), 3.1);
  metrics.observe_generation(stats_of(10, 0, 0.0, 0.0, 100, 100), 0.004);  // stopped at once
  metrics.count_unfinished("cancelled");
  metrics.count_unfinished("cancelled");
  metrics.count_unfinished("error");
  const Exposition exposition = parse_exposition(metrics.render({}));
  EXPECT_EQ(value_of(exposition, "entropyinfer_prompt_tokens_total"), 160);
  EXPECT_EQ(value_of(exposition, "entropyinfer_completion_tokens_total"), 12);
  EXPECT_EQ(value_of(exposition, "entropyinfer_generations_total", {{"outcome", "finished"}}), 3);
  EXPECT_EQ(value_of(exposition, "entropyinfer_generations_total", {{"outcome", "cancelled"}}), 2);
  EXPECT_EQ(value_of(exposition, "entropyinfer_generations_total", {{"outcome", "error"}}), 1);
  EXPECT_EQ(value_of(exposition, "entropyinfer_prefill_keys_read_total"), 500);
  EXPECT_EQ(value_of(exposition, "entropyinfer_prefill_keys_dense_total"), 1200);
  EXPECT_NEAR(value_of(exposition, "entropyinfer_prefill_keys_read_fraction"), 500.0 / 1200.0,
              1e-12);
  // A first token only where one was generated; a per-token time only past the first.
  expect_histogram(exposition, "entropyinfer_time_to_first_token_seconds", 2, 3.02);
  expect_histogram(exposition, "entropyinfer_time_per_output_token_seconds", 1, 0.05);
  expect_histogram(exposition, "entropyinfer_request_duration_seconds", 3, 3.704);
  // 0.02 s lies in the le="0.025" bucket, not in le="0.01".
  EXPECT_EQ(
      value_of(exposition, "entropyinfer_time_to_first_token_seconds_bucket", {{"le", "0.01"}}), 0);
  EXPECT_EQ(
      value_of(exposition, "entropyinfer_time_to_first_token_seconds_bucket", {{"le", "0.025"}}),
      1);
  EXPECT_EQ(
      value_of(exposition, "entropyinfer_time_to_first_token_seconds_bucket", {{"le", "2.5"}}), 1);
  EXPECT_EQ(value_of(exposition, "entropyinfer_time_to_first_token_seconds_bucket", {{"le", "5"}}),
            2);
}

TEST(ServerMetrics, ObservationsOnABucketBoundCountInThatBucket) {
  Histogram histogram({1.0, 2.0});
  histogram.observe(1.0);
  histogram.observe(2.0);
  histogram.observe(2.5);
  histogram.observe(std::nan(""));  // ignored
  std::string out = "# HELP entropyinfer_x x\n# TYPE entropyinfer_x histogram\n";
  histogram.render(out, "entropyinfer_x");
  const Exposition exposition = parse_exposition(out);
  EXPECT_EQ(value_of(exposition, "entropyinfer_x_bucket", {{"le", "1"}}), 1);
  EXPECT_EQ(value_of(exposition, "entropyinfer_x_bucket", {{"le", "2"}}), 2);
  EXPECT_EQ(value_of(exposition, "entropyinfer_x_bucket", {{"le", "+Inf"}}), 3);
  expect_histogram(exposition, "entropyinfer_x", 3, 5.5);
}

TEST(ServerMetrics, RequestCountersAddUpAcrossThreadsAndLabelsAreEscaped) {
  ServerMetrics metrics;
  constexpr int kThreads = 8;
  constexpr int kEach = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < kEach; ++i) {
        metrics.count_request("/v1/completions", i % 2 == 0 ? 200 : 400);
        if (t == 0 && i % 50 == 0) metrics.render({});  // scrapes while recording
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  metrics.count_request("we\"ird\\path\n", 404);
  const Exposition exposition = parse_exposition(metrics.render({}));
  EXPECT_EQ(value_of(exposition, "entropyinfer_http_requests_total",
                     {{"endpoint", "/v1/completions"}, {"status", "200"}}),
            kThreads * kEach / 2);
  EXPECT_EQ(value_of(exposition, "entropyinfer_http_requests_total",
                     {{"endpoint", "/v1/completions"}, {"status", "400"}}),
            kThreads * kEach / 2);
  EXPECT_EQ(value_of(exposition, "entropyinfer_http_requests_total",
                     {{"endpoint", "we\\\"ird\\\\path\\n"}, {"status", "404"}}),
            1);
}

TEST(ServerMetrics, NumbersAreWrittenAsPrometheusReadsThem) {
  EXPECT_EQ(prometheus_number(0.0), "0");
  EXPECT_EQ(prometheus_number(0.005), "0.005");
  EXPECT_EQ(prometheus_number(300.0), "300");
  EXPECT_EQ(prometheus_number(1e20), "1e+20");
  EXPECT_EQ(prometheus_number(std::nan("")), "NaN");
  EXPECT_EQ(prometheus_number(HUGE_VAL), "+Inf");
  EXPECT_EQ(prometheus_number(-HUGE_VAL), "-Inf");
  EXPECT_EQ(prometheus_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

}  // namespace
}  // namespace entropyinfer::serve

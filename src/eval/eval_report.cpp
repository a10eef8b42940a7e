#include "eval/eval_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "core/error.h"
#include "core/svg_heatmap.h"
#include "core/user_file.h"
#include "eval/ruler_tasks.h"

namespace entropyinfer::eval {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double mean_skipping_nan(const std::vector<double>& values) {
  double sum = 0.0;
  int count = 0;
  for (double value : values) {
    if (std::isnan(value)) continue;
    sum += value;
    ++count;
  }
  return count > 0 ? sum / count : kNaN;
}

nlohmann::json number_or_null(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

std::string format_accuracy(double value) {
  if (std::isnan(value)) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

// 4096 -> "4k": lengths and budgets are usually multiples of 1024.
std::string short_count(int value) {
  if (value >= 1024 && value % 1024 == 0) return std::to_string(value / 1024) + "k";
  return std::to_string(value);
}

std::string count_of(size_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

std::string budget_label(const EvalRun& run) {
  return run.budget > 0 ? std::to_string(run.budget) : "none (dense)";
}

// Markdown table cells must not contain a bar.
std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

// --- JSON reading with errors that name the field ---------------------------------------------

const nlohmann::json& field(const nlohmann::json& object, const char* key, const char* where) {
  if (!object.is_object() || !object.contains(key)) {
    throw Error(std::string("eval report: ") + where + " has no field '" + key + "'");
  }
  return object.at(key);
}

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

// A JSON value as T, refusing what nlohmann's get<T>() would convert silently or with undefined
// behaviour: a fraction or an out-of-range number read as an integer, a number read as a string.
template <typename T>
T typed_value(const nlohmann::json& value, const std::string& name) {
  const auto wrong = [&](const char* expected) {
    return Error("eval report: " + name + " must be " + expected);
  };
  if constexpr (IsVector<T>::value) {
    if (!value.is_array()) throw wrong("an array");
    T items;
    for (const nlohmann::json& item : value) {
      items.push_back(typed_value<typename T::value_type>(item, name + " (an element)"));
    }
    return items;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) throw wrong("a string");
    return value.get<std::string>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!value.is_number()) throw wrong("a number");
    return value.get<double>();
  } else {
    static_assert(std::is_integral_v<T>);
    if (!value.is_number_integer()) throw wrong("a whole number");
    if (value.is_number_unsigned()) {
      const uint64_t number = value.get<uint64_t>();
      if (number > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw wrong("in range");
      return static_cast<T>(number);
    }
    const int64_t number = value.get<int64_t>();
    if (number < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (number > 0 && static_cast<uint64_t>(number) > std::numeric_limits<T>::max())) {
      throw wrong("in range");
    }
    return static_cast<T>(number);
  }
}

template <typename T>
T read(const nlohmann::json& object, const char* key, const char* where) {
  return typed_value<T>(field(object, key, where), std::string(where) + " field '" + key + "'");
}

// A number read from a report that must lie in [low, high].
double read_in_range(const nlohmann::json& object, const char* key, const char* where, double low,
                     double high) {
  const double value = read<double>(object, key, where);
  if (!(value >= low && value <= high)) {
    throw Error("eval report: " + std::string(where) + " field '" + key + "' is " +
                std::to_string(value) + ", outside [" + std::to_string(low) + ", " +
                std::to_string(high) + "]");
  }
  return value;
}

// --- The line chart --------------------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<double> values;  // one per x position, NaN where there is no point
  bool dashed = false;
  // With LineChart::percent_x, each point's own x (0-100), one per value, instead of x_values.
  std::vector<double> xs;
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<int> x_values;  // positive; drawn on a log2 scale (lengths and budgets double)
  bool percent_x = false;     // x is a share in percent, linear from 0 to 100, per point
  std::vector<Series> series;
};

const char* series_colour(size_t index) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
  return colours[index % (sizeof(colours) / sizeof(colours[0]))];
}

std::string coordinate(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

std::string render_line_chart(const LineChart& chart) {
  const double left = 70, top = 50, plot_width = 520, plot_height = 340, legend_width = 200;
  const double width = left + plot_width + legend_width, height = top + plot_height + 60;
  const double inset = 24;  // keeps the first and last points off the axes
  double low = INFINITY, high = -INFINITY;
  for (int x : chart.x_values) {
    if (chart.percent_x) continue;  // ticks of a linear scale from 0
    if (x <= 0) throw Error("line chart '" + chart.title + "': x values must be positive");
    low = std::min(low, std::log2(static_cast<double>(x)));
    high = std::max(high, std::log2(static_cast<double>(x)));
  }
  const auto percent_position = [&](double percent) {
    return left + inset + (plot_width - 2 * inset) * std::clamp(percent, 0.0, 100.0) / 100.0;
  };
  auto tick_position = [&](size_t index) {
    if (chart.percent_x) return percent_position(chart.x_values[index]);
    const double value = std::log2(static_cast<double>(chart.x_values[index]));
    if (!(high > low)) return left + plot_width / 2;
    return left + inset + (plot_width - 2 * inset) * (value - low) / (high - low);
  };
  // Where point i of a series sits: its own x, or the i-th x value.
  auto point_position = [&](const Series& series, size_t i) {
    return chart.percent_x ? percent_position(series.xs[i]) : tick_position(i);
  };
  const auto point_count = [&](const Series& series) {
    return chart.percent_x ? std::min(series.values.size(), series.xs.size())
                           : std::min(series.values.size(), chart.x_values.size());
  };
  // What a point's tooltip names it by.
  const auto point_label = [&](const Series& series, size_t i) {
    return chart.percent_x ? format_accuracy(series.xs[i]) + "%"
                           : std::to_string(chart.x_values[i]);
  };
  auto y_position = [&](double accuracy) {
    return top + plot_height * (1.0 - std::clamp(accuracy, 0.0, 100.0) / 100.0);
  };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text class=\"title\" x=\"" << left << "\" y=\"28\" font-size=\"15\">"
      << escape_xml(chart.title) << "</text>\n";
  // Horizontal grid with the accuracy scale.
  for (int tick = 0; tick <= 100; tick += 20) {
    const std::string y = coordinate(y_position(tick));
    svg << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << left + plot_width << "\" y2=\""
        << y << "\" stroke=\"#dddddd\"/>\n";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << coordinate(y_position(tick) + 4)
        << "\" text-anchor=\"end\">" << tick << "</text>\n";
  }
  // Axes.
  svg << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
      << top + plot_height << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << left << "\" y1=\"" << top + plot_height << "\" x2=\"" << left + plot_width
      << "\" y2=\"" << top + plot_height << "\" stroke=\"black\"/>\n";
  for (size_t i = 0; i < chart.x_values.size(); ++i) {
    const std::string x = coordinate(tick_position(i));
    svg << "<line x1=\"" << x << "\" y1=\"" << top + plot_height << "\" x2=\"" << x << "\" y2=\""
        << top + plot_height + 5 << "\" stroke=\"black\"/>\n";
    svg << "<text x=\"" << x << "\" y=\"" << top + plot_height + 19 << "\" text-anchor=\"middle\">"
        << short_count(chart.x_values[i]) << "</text>\n";
  }
  svg << "<text class=\"x-label\" x=\"" << left + plot_width / 2 << "\" y=\""
      << top + plot_height + 44 << "\" text-anchor=\"middle\">" << escape_xml(chart.x_label)
      << "</text>\n";
  svg << "<text class=\"y-label\" transform=\"translate(22," << top + plot_height / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape_xml(chart.y_label) << "</text>\n";

  // Dashed reference lines go on top, where lines that coincide with them cannot hide them.
  std::vector<size_t> order(chart.series.size());
  for (size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t s) { return !chart.series[s].dashed; });
  for (const size_t s : order) {
    const Series& series = chart.series[s];
    const char* colour = series_colour(s);
    const std::string dash = series.dashed ? " stroke-dasharray=\"7 4\"" : "";
    // One polyline per series; x positions without a value are skipped (the line joins the
    // points on either side), and a series with no value at all has an empty polyline.
    std::ostringstream points;
    for (size_t i = 0; i < point_count(series); ++i) {
      if (std::isnan(series.values[i])) continue;
      points << (points.tellp() > 0 ? " " : "") << coordinate(point_position(series, i)) << ","
             << coordinate(y_position(series.values[i]));
    }
    svg << "<polyline class=\"series\" data-name=\"" << escape_xml(series.name)
        << "\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\"" << dash << " points=\""
        << points.str() << "\"><title>" << escape_xml(series.name) << "</title></polyline>\n";
    for (size_t i = 0; i < point_count(series); ++i) {
      if (std::isnan(series.values[i])) continue;
      svg << "<circle cx=\"" << coordinate(point_position(series, i)) << "\" cy=\""
          << coordinate(y_position(series.values[i])) << "\" r=\"3.5\" fill=\"" << colour
          << "\"><title>" << escape_xml(series.name) << " at " << point_label(series, i) << ": "
          << format_accuracy(series.values[i]) << "</title></circle>\n";
    }
    // Legend entry.
    const double legend_x = left + plot_width + 20, legend_y = top + 10 + 20 * s;
    svg << "<line x1=\"" << legend_x << "\" y1=\"" << legend_y << "\" x2=\"" << legend_x + 24
        << "\" y2=\"" << legend_y << "\" stroke=\"" << colour << "\" stroke-width=\"2\"" << dash
        << "/>\n";
    svg << "<text class=\"legend\" x=\"" << legend_x + 30 << "\" y=\"" << legend_y + 4 << "\">"
        << escape_xml(series.name) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  write_user_file(path, "plot", text);
}

}  // namespace

double cell_accuracy(const EvalRun& run, const std::string& task, int length) {
  double sum = 0.0;
  int count = 0;
  for (const EvalSampleResult& sample : run.samples) {
    if (sample.task != task || sample.length != length) continue;
    sum += sample.score;
    ++count;
  }
  return count > 0 ? 100.0 * sum / count : kNaN;
}

double length_accuracy(const EvalReport& report, const EvalRun& run, int length) {
  std::vector<double> values;
  for (const std::string& task : report.tasks) values.push_back(cell_accuracy(run, task, length));
  return mean_skipping_nan(values);
}

double run_accuracy(const EvalReport& report, const EvalRun& run) {
  std::vector<double> values;
  for (int length : report.lengths) values.push_back(length_accuracy(report, run, length));
  return mean_skipping_nan(values);
}

double task_accuracy(const EvalReport& report, const EvalRun& run, const std::string& task) {
  std::vector<double> values;
  for (int length : report.lengths) values.push_back(cell_accuracy(run, task, length));
  return mean_skipping_nan(values);
}

std::string eval_protocol_description(const std::string& protocol) {
  if (protocol == "query-aware") {
    return "query-aware: the whole prompt, context and question, is prefilled at once; decode "
           "caches compress after it, so their window holds the question's queries";
  }
  if (protocol == "context-first") {
    return "context-first: the context alone is prefilled (a method that compresses right after "
           "the prompt compresses it then, from the context's last queries), then the question "
           "is appended and answered; latent compression counts every token after the context, "
           "the question's too, and compresses G of them later";
  }
  if (protocol == "multi-turn") {
    return "multi-turn: the context is prefilled, then each of the sample's questions is "
           "appended and answered greedily before the next is asked; the cell scores the "
           "follow-up questions (the first is context-first's), which meet a cache compressed "
           "during an earlier turn; niah_multikey and niah_multiquery have four keys to ask "
           "about, other tasks have no follow-up and are not run";
  }
  throw Error("unknown eval protocol '" + protocol +
              "' (known: query-aware, context-first, multi-turn)");
}

EvalReport protocol_report(const EvalReport& report, const std::string& protocol) {
  EvalReport only = report;
  only.protocols = {protocol};
  std::erase_if(only.runs, [&](const EvalRun& run) { return run.protocol != protocol; });
  return only;
}

AccuracyInterval cell_interval(const EvalRun& run, const std::string& task, int length) {
  std::vector<double> scores;
  for (const EvalSampleResult& sample : run.samples) {
    if (sample.task == task && sample.length == length) scores.push_back(sample.score);
  }
  if (scores.empty()) return {kNaN, kNaN};
  std::mt19937_64 generator(fnv1a64(run.protocol + "/" + run.method + "/" +
                                    std::to_string(run.budget) + "/" + task + "/" +
                                    std::to_string(length)));
  std::uniform_int_distribution<size_t> pick(0, scores.size() - 1);
  std::vector<double> means(kBootstrapResamples);
  for (double& mean : means) {
    double sum = 0.0;
    for (size_t i = 0; i < scores.size(); ++i) sum += scores[pick(generator)];
    mean = 100.0 * sum / static_cast<double>(scores.size());
  }
  std::sort(means.begin(), means.end());
  const auto at = [&](double fraction) {
    const size_t index = static_cast<size_t>(fraction * static_cast<double>(means.size() - 1));
    return means[index];
  };
  return {at(0.025), at(0.975)};
}

AccuracyInterval run_interval(const EvalReport& report, const EvalRun& run) {
  // Cells in the report's task and length order, each with its scores.
  std::vector<std::vector<std::vector<double>>> cells(
      report.lengths.size(), std::vector<std::vector<double>>(report.tasks.size()));
  bool any = false;
  for (const EvalSampleResult& sample : run.samples) {
    const auto length = std::find(report.lengths.begin(), report.lengths.end(), sample.length);
    const auto task = std::find(report.tasks.begin(), report.tasks.end(), sample.task);
    if (length == report.lengths.end() || task == report.tasks.end()) continue;
    cells[static_cast<size_t>(length - report.lengths.begin())]
         [static_cast<size_t>(task - report.tasks.begin())]
             .push_back(sample.score);
    any = true;
  }
  if (!any) return {kNaN, kNaN};
  std::mt19937_64 generator(
      fnv1a64(run.protocol + "/" + run.method + "/" + std::to_string(run.budget) + "/run"));
  std::vector<double> means(kBootstrapResamples);
  for (double& mean : means) {
    // run_accuracy: the mean over lengths of the mean over tasks, cells without samples left out.
    double length_sum = 0.0;
    int lengths = 0;
    for (const auto& row : cells) {
      double task_sum = 0.0;
      int tasks = 0;
      for (const std::vector<double>& scores : row) {
        if (scores.empty()) continue;
        std::uniform_int_distribution<size_t> pick(0, scores.size() - 1);
        double sum = 0.0;
        for (size_t i = 0; i < scores.size(); ++i) sum += scores[pick(generator)];
        task_sum += 100.0 * sum / static_cast<double>(scores.size());
        ++tasks;
      }
      if (tasks == 0) continue;
      length_sum += task_sum / tasks;
      ++lengths;
    }
    mean = length_sum / lengths;
  }
  std::sort(means.begin(), means.end());
  const auto at = [&](double fraction) {
    return means[static_cast<size_t>(fraction * static_cast<double>(means.size() - 1))];
  };
  return {at(0.025), at(0.975)};
}

namespace {
// The mean of one fraction over a run's samples, in percent; NaN without samples.
double mean_percent(const EvalRun& run, double EvalSampleResult::*fraction) {
  if (run.samples.empty()) return kNaN;
  double sum = 0.0;
  for (const EvalSampleResult& sample : run.samples) sum += sample.*fraction;
  return 100.0 * sum / static_cast<double>(run.samples.size());
}
}  // namespace

double run_prefill_keys_percent(const EvalRun& run) {
  return mean_percent(run, &EvalSampleResult::prefill_keys_fraction);
}

double run_cache_kept_percent(const EvalRun& run) {
  return mean_percent(run, &EvalSampleResult::cache_kept_fraction);
}

std::vector<RankedRun> rank_runs(const EvalReport& report, int budget) {
  std::vector<RankedRun> ranked;
  for (const std::string& method : report.methods) {
    const EvalRun* run = find_run(report, method, budget);
    if (run == nullptr) continue;
    const double accuracy = run_accuracy(report, *run);
    if (std::isnan(accuracy)) continue;
    ranked.push_back({run, 0, accuracy, run_interval(report, *run)});
  }
  for (RankedRun& entry : ranked) {
    entry.rank = 1;
    for (const RankedRun& other : ranked) {
      if (other.interval.low > entry.interval.high) ++entry.rank;
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const RankedRun& a, const RankedRun& b) { return a.accuracy > b.accuracy; });
  return ranked;
}

int samples_to_resolve(double p, double half_width_points) {
  const double half = half_width_points / 100.0;
  return static_cast<int>(std::ceil(1.96 * 1.96 * p * (1.0 - p) / (half * half)));
}

int compare_cells(const EvalRun& a, const EvalRun& b, const std::string& task, int length) {
  const AccuracyInterval x = cell_interval(a, task, length);
  const AccuracyInterval y = cell_interval(b, task, length);
  if (std::isnan(x.low) || std::isnan(y.low)) return 0;
  if (x.low > y.high) return 1;
  if (x.high < y.low) return -1;
  return 0;
}

double interval_half_width(double p, int n) {
  if (n <= 0) return kNaN;
  return 196.0 * std::sqrt(std::max(0.0, p * (1.0 - p)) / n);
}

const EvalRun* find_run(const EvalReport& report, const std::string& method, int budget) {
  const EvalRun* budget_free = nullptr;
  for (const EvalRun& run : report.runs) {
    if (run.method != method) continue;
    if (run.budget == budget) return &run;
    if (run.budget == 0) budget_free = &run;
  }
  return budget_free;
}

nlohmann::json eval_report_to_json(const EvalReport& report) {
  nlohmann::json runs = nlohmann::json::array();
  nlohmann::json accuracy = nlohmann::json::array();
  nlohmann::json averages = nlohmann::json::array();
  for (const EvalRun& run : report.runs) {
    nlohmann::json samples = nlohmann::json::array();
    for (const EvalSampleResult& sample : run.samples) {
      samples.push_back({{"task", sample.task},
                         {"length", sample.length},
                         {"index", sample.index},
                         {"prompt_tokens", sample.prompt_tokens},
                         {"answers", sample.answers},
                         {"prediction", sample.prediction},
                         {"score", sample.score},
                         {"seconds", sample.seconds},
                         {"prefill_keys_fraction", sample.prefill_keys_fraction},
                         {"cache_kept_fraction", sample.cache_kept_fraction}});
    }
    runs.push_back({{"method", run.method},
                    {"budget", run.budget},
                    {"protocol", run.protocol},
                    {"attention", run.attention},
                    {"seconds", run.seconds},
                    {"samples", samples}});
    for (const std::string& task : report.tasks) {
      for (int length : report.lengths) {
        accuracy.push_back({{"method", run.method},
                            {"budget", run.budget},
                            {"protocol", run.protocol},
                            {"task", task},
                            {"length", length},
                            {"accuracy", number_or_null(cell_accuracy(run, task, length))},
                            {"interval",
                             {number_or_null(cell_interval(run, task, length).low),
                              number_or_null(cell_interval(run, task, length).high)}}});
      }
    }
    for (int length : report.lengths) {
      averages.push_back({{"method", run.method},
                          {"budget", run.budget},
                          {"protocol", run.protocol},
                          {"length", length},
                          {"accuracy", number_or_null(length_accuracy(report, run, length))}});
    }
    averages.push_back({{"method", run.method},
                        {"budget", run.budget},
                        {"protocol", run.protocol},
                        {"length", "all"},
                        {"accuracy", number_or_null(run_accuracy(report, run))}});
  }
  return {{"date", report.date},
          {"command", report.command},
          {"model", report.model},
          {"device", report.device},
          {"seed", report.seed},
          {"samples_per_cell", report.samples_per_cell},
          {"tasks", report.tasks},
          {"lengths", report.lengths},
          {"budgets", report.budgets},
          {"methods", report.methods},
          {"protocols", report.protocols},
          {"notes", report.notes},
          {"runs", runs},
          {"accuracy", accuracy},
          {"averages", averages},
          {"markdown", eval_report_markdown(report)}};
}

EvalReport eval_report_from_json(const nlohmann::json& json) {
  if (!json.is_object()) throw Error("eval report: the top level must be a JSON object");
  EvalReport report;
  report.date = read<std::string>(json, "date", "the report");
  report.command = read<std::string>(json, "command", "the report");
  report.model = read<std::string>(json, "model", "the report");
  report.device = read<std::string>(json, "device", "the report");
  report.seed = read<uint64_t>(json, "seed", "the report");
  report.samples_per_cell = read<int>(json, "samples_per_cell", "the report");
  if (report.samples_per_cell < 1)
    throw Error("eval report: 'samples_per_cell' must be at least 1");
  report.tasks = read<std::vector<std::string>>(json, "tasks", "the report");
  report.lengths = read<std::vector<int>>(json, "lengths", "the report");
  report.budgets = read<std::vector<int>>(json, "budgets", "the report");
  for (int length : report.lengths) {
    if (length < 1) throw Error("eval report: 'lengths' must be positive");
  }
  for (int budget : report.budgets) {
    if (budget < 0) throw Error("eval report: 'budgets' must not be negative");
  }
  report.methods = read<std::vector<std::string>>(json, "methods", "the report");
  // Reports older than the protocols were all query-aware.
  if (json.contains("protocols"))
    report.protocols = read<std::vector<std::string>>(json, "protocols", "the report");
  report.notes = read<std::string>(json, "notes", "the report");
  const nlohmann::json& runs = field(json, "runs", "the report");
  if (!runs.is_array()) throw Error("eval report: 'runs' must be an array");
  for (const nlohmann::json& run_json : runs) {
    EvalRun run;
    run.method = read<std::string>(run_json, "method", "a run");
    run.budget = read<int>(run_json, "budget", "a run");
    if (run_json.contains("protocol"))
      run.protocol = read<std::string>(run_json, "protocol", "a run");
    run.attention = field(run_json, "attention", "a run");
    run.seconds = read_in_range(run_json, "seconds", "a run", 0.0, 1e12);
    const nlohmann::json& samples = field(run_json, "samples", "a run");
    if (!samples.is_array()) throw Error("eval report: a run's 'samples' must be an array");
    for (const nlohmann::json& sample_json : samples) {
      EvalSampleResult sample;
      sample.task = read<std::string>(sample_json, "task", "a sample");
      sample.length = read<int>(sample_json, "length", "a sample");
      sample.index = read<int>(sample_json, "index", "a sample");
      sample.prompt_tokens = read<int>(sample_json, "prompt_tokens", "a sample");
      sample.answers = read<std::vector<std::string>>(sample_json, "answers", "a sample");
      sample.prediction = read<std::string>(sample_json, "prediction", "a sample");
      sample.score = read_in_range(sample_json, "score", "a sample", 0.0, 1.0);
      sample.seconds = read_in_range(sample_json, "seconds", "a sample", 0.0, 1e12);
      sample.prefill_keys_fraction =
          read_in_range(sample_json, "prefill_keys_fraction", "a sample", 0.0, 1.0);
      sample.cache_kept_fraction =
          read_in_range(sample_json, "cache_kept_fraction", "a sample", 0.0, 1.0);
      run.samples.push_back(std::move(sample));
    }
    report.runs.push_back(std::move(run));
  }
  return report;
}

EvalReport merge_eval_reports(const std::vector<EvalReport>& shards) {
  if (shards.empty()) throw Error("eval report: no report to merge");
  EvalReport merged = shards.front();
  const auto join_new = [](std::string& list, const std::string& item) {
    if (list.empty() || ("; " + list + "; ").find("; " + item + "; ") == std::string::npos) {
      list += (list.empty() ? "" : "; ") + item;
    }
  };
  const auto run_key = [](const EvalRun& run) {
    return run.method + "@" + std::to_string(run.budget) + "/" + run.protocol;
  };
  for (size_t shard = 1; shard < shards.size(); ++shard) {
    const EvalReport& other = shards[shard];
    const auto differ = [&](const char* what) {
      return Error("eval report: shard " + std::to_string(shard + 1) +
                   " differs from the first in '" + what +
                   "'; only shards of one evaluation can be merged");
    };
    if (other.model != merged.model) throw differ("model");
    if (other.seed != merged.seed) throw differ("seed");
    if (other.tasks != merged.tasks) throw differ("tasks");
    if (other.lengths != merged.lengths) throw differ("lengths");
    if (other.budgets != merged.budgets) throw differ("budgets");
    if (other.methods != merged.methods) throw differ("methods");
    if (other.protocols != merged.protocols) throw differ("protocols");
    if (other.notes != merged.notes) throw differ("notes");
    if (other.runs.size() != merged.runs.size()) throw differ("runs");
    merged.date = std::max(merged.date, other.date);
    join_new(merged.command, other.command);
    join_new(merged.device, other.device);
    merged.samples_per_cell += other.samples_per_cell;
    for (const EvalRun& run : other.runs) {
      auto into = std::find_if(merged.runs.begin(), merged.runs.end(),
                               [&](const EvalRun& r) { return run_key(r) == run_key(run); });
      if (into == merged.runs.end()) throw differ("runs");
      if (into->attention != run.attention) throw differ("attention");
      into->seconds += run.seconds;
      into->samples.insert(into->samples.end(), run.samples.begin(), run.samples.end());
    }
  }
  // The order one evaluation of every sample gives: tasks, then lengths, as the report lists
  // them, then the sample index. The bootstrap intervals draw in this order.
  const auto position = [](const auto& list, const auto& item) {
    return std::find(list.begin(), list.end(), item) - list.begin();
  };
  for (EvalRun& run : merged.runs) {
    std::stable_sort(run.samples.begin(), run.samples.end(),
                     [&](const EvalSampleResult& a, const EvalSampleResult& b) {
                       const auto key = [&](const EvalSampleResult& s) {
                         return std::make_tuple(position(merged.tasks, s.task),
                                                position(merged.lengths, s.length), s.index);
                       };
                       return key(a) < key(b);
                     });
    for (size_t i = 1; i < run.samples.size(); ++i) {
      const EvalSampleResult& a = run.samples[i - 1];
      const EvalSampleResult& b = run.samples[i];
      if (a.task == b.task && a.length == b.length && a.index == b.index) {
        throw Error("eval report: sample " + std::to_string(a.index) + " of " + a.task + " at " +
                    std::to_string(a.length) + " tokens is in two shards of " + run_key(run));
      }
    }
  }
  return merged;
}

namespace {
std::string markdown_tables(const EvalReport& report);
}  // namespace

std::string eval_report_markdown(const EvalReport& report) {
  std::ostringstream text;
  text << "# entropyinfer eval: RULER-style accuracy at matched budgets\n\n";
  text << report.date << " | model `" << report.model << "` | device " << report.device
       << " | seed " << report.seed << " | " << report.samples_per_cell
       << " samples per task and length\n\n";
  if (!report.command.empty()) text << "`" << report.command << "`\n\n";
  if (!report.notes.empty()) text << report.notes << "\n\n";
  if (report.protocols.size() <= 1) {
    if (report.protocols.size() == 1 && report.protocols[0] != "query-aware")
      text << "Protocol " << eval_protocol_description(report.protocols[0]) << ".\n\n";
    text << markdown_tables(report);
    return text.str();
  }
  for (const std::string& protocol : report.protocols) {
    text << "\n# Protocol " << protocol << "\n\n"
         << "Protocol " << eval_protocol_description(protocol) << ".\n\n"
         << markdown_tables(protocol_report(report, protocol));
  }
  return text.str();
}

namespace {

// One line per cell where a method's 95% interval separates from `reference`'s at the same budget
// level ("- budget B, task at L: method better|worse (x against y)"); only the better ones when
// `better_only`.
std::vector<std::string> differences_against(const EvalReport& report, const std::string& reference,
                                             bool better_only) {
  std::vector<std::string> lines;
  for (int budget : report.budgets) {
    const EvalRun* base = find_run(report, reference, budget);
    if (base == nullptr) continue;
    for (const std::string& method : report.methods) {
      if (method == reference) continue;
      const EvalRun* run = find_run(report, method, budget);
      if (run == nullptr || run == base) continue;
      for (const std::string& task : report.tasks) {
        for (int length : report.lengths) {
          const int order = compare_cells(*run, *base, task, length);
          if (order == 0 || (better_only && order < 0)) continue;
          lines.push_back("- budget " + std::to_string(budget) + ", " + escape_cell(task) + " at " +
                          std::to_string(length) + ": " + escape_cell(method) + " " +
                          (order > 0 ? "better" : "worse") + " (" +
                          format_accuracy(cell_accuracy(*run, task, length)) + " against " +
                          format_accuracy(cell_accuracy(*base, task, length)) + ")");
        }
      }
    }
  }
  return lines;
}

// EntropyInfer as the report names it: the first method whose prefill is `entropy` (its
// per-segment variant, entropy-segment, is one of the methods it is compared with); empty when
// the report has none.
std::string entropyinfer_method(const EvalReport& report) {
  for (const std::string& method : report.methods) {
    if (method == "entropy" || method.rfind("entropy+", 0) == 0) return method;
  }
  return "";
}

std::string markdown_tables(const EvalReport& report) {
  std::ostringstream text;

  // Runs in table order: every budget level, every method, the budget-free ones repeated.
  std::vector<const EvalRun*> rows;
  for (int budget : report.budgets) {
    for (const std::string& method : report.methods) {
      if (const EvalRun* run = find_run(report, method, budget)) rows.push_back(run);
    }
  }

  text << "## Accuracy (%) per length, mean over tasks\n\n| method | budget |";
  for (int length : report.lengths) text << " " << length << " |";
  text << " mean |\n|---|---:|";
  for (size_t i = 0; i <= report.lengths.size(); ++i) text << "---:|";
  text << "\n";
  for (const EvalRun* run : rows) {
    text << "| " << escape_cell(run->method) << " | " << budget_label(*run) << " |";
    for (int length : report.lengths) {
      text << " " << format_accuracy(length_accuracy(report, *run, length)) << " |";
    }
    text << " " << format_accuracy(run_accuracy(report, *run)) << " |\n";
  }

  text << "\n## Accuracy (%) per task, mean over lengths\n\n| method | budget |";
  for (const std::string& task : report.tasks) text << " " << escape_cell(task) << " |";
  text << "\n|---|---:|";
  for (size_t i = 0; i < report.tasks.size(); ++i) text << "---:|";
  text << "\n";
  for (const EvalRun* run : rows) {
    text << "| " << escape_cell(run->method) << " | " << budget_label(*run) << " |";
    for (const std::string& task : report.tasks) {
      text << " " << format_accuracy(task_accuracy(report, *run, task)) << " |";
    }
    text << "\n";
  }

  text << "\n## Accuracy (%) of every task and length\n";
  for (int budget : report.budgets) {
    text << "\n### Budget " << budget << "\n\n| method | task |";
    for (int length : report.lengths) text << " " << length << " |";
    text << "\n|---|---|";
    for (size_t i = 0; i < report.lengths.size(); ++i) text << "---:|";
    text << "\n";
    for (const std::string& method : report.methods) {
      const EvalRun* run = find_run(report, method, budget);
      if (run == nullptr) continue;
      for (const std::string& task : report.tasks) {
        text << "| " << escape_cell(method) << (run->budget == 0 ? " (dense)" : "") << " | "
             << escape_cell(task) << " |";
        for (int length : report.lengths) {
          const AccuracyInterval interval = cell_interval(*run, task, length);
          text << " " << format_accuracy(cell_accuracy(*run, task, length));
          if (!std::isnan(interval.low)) {
            text << " [" << format_accuracy(interval.low) << ", " << format_accuracy(interval.high)
                 << "]";
          }
          text << " |";
        }
        text << "\n";
      }
    }
  }

  // Against the first method (the reference, full attention by default), only where the 95%
  // intervals separate.
  if (!report.methods.empty()) {
    const std::string& reference = report.methods.front();
    text << "\n## Differences beyond the 95% intervals, against " << escape_cell(reference)
         << "\n\nCells in brackets above are 95% bootstrap intervals (" << kBootstrapResamples
         << " resamples of the cell's samples). A method is better or worse than "
         << escape_cell(reference)
         << " on a cell only where the two intervals do not overlap; everything else is not "
            "told apart by "
         << report.samples_per_cell << " samples (at 90% accuracy a cell of that many resolves +-"
         << format_accuracy(interval_half_width(0.9, report.samples_per_cell))
         << " points; telling 90% from 85% there takes " << samples_to_resolve(0.9, 2.5)
         << " samples per cell).\n\n";
    const std::vector<std::string> lines = differences_against(report, reference, false);
    if (lines.empty()) text << "None: every cell's intervals overlap.\n";
    for (const std::string& line : lines) text << line << "\n";
  }
  // The method's claim is better answers than its baselines at the same budget: every cell where
  // another method's interval lies wholly above EntropyInfer's is listed, for the reader to
  // explain.
  const std::string method_under_test = entropyinfer_method(report);
  if (!method_under_test.empty()) {
    text << "\n## Where another method beats " << escape_cell(method_under_test)
         << " beyond the 95% intervals\n\n";
    const std::vector<std::string> lines = differences_against(report, method_under_test, true);
    if (lines.empty()) {
      text << "None: no method's interval lies wholly above " << escape_cell(method_under_test)
           << "'s on any cell.\n";
    }
    for (const std::string& line : lines) text << line << "\n";
  }

  text << "\n## Ranking per budget\n\nEvery method at each budget level, best first: accuracy "
          "over all tasks and lengths with its 95% interval (a bootstrap over each cell's "
          "samples), the prefill's keys read and the cache kept (percent of full attention's), "
          "so that what each method spent stands beside what it scored. rank: 1 + the methods "
          "whose interval lies wholly above; equal ranks are not told apart.\n";
  for (int budget : report.budgets) {
    text << "\n### Budget " << budget
         << "\n\n| rank | method | accuracy (%) | 95% interval | prefill keys (%) | cache kept (%) "
            "|\n|---:|---|---:|---|---:|---:|\n";
    for (const RankedRun& entry : rank_runs(report, budget)) {
      text << "| " << entry.rank << " | " << escape_cell(entry.run->method)
           << (entry.run->budget == 0 ? " (dense)" : "") << " | " << format_accuracy(entry.accuracy)
           << " | [" << format_accuracy(entry.interval.low) << ", "
           << format_accuracy(entry.interval.high) << "] | "
           << format_accuracy(run_prefill_keys_percent(*entry.run)) << " | "
           << format_accuracy(run_cache_kept_percent(*entry.run)) << " |\n";
    }
  }

  text << "\n## Work\n\nprefill keys: keys the prefill read, as a share of full causal "
          "attention's; cache kept: decode-cache entries kept by the compression (100 when it "
          "did not run); both averaged over the samples.\n\n"
          "| method | budget | samples | prefill keys (%) | cache kept (%) | seconds | "
          "s/sample |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const EvalRun& run : report.runs) {
    // A run without samples shows zeros.
    const bool none = run.samples.empty();
    const double count = static_cast<double>(std::max<size_t>(run.samples.size(), 1));
    char row[512];
    std::snprintf(row, sizeof(row), "| %s | %s | %zu | %.1f | %.1f | %.1f | %.2f |\n",
                  escape_cell(run.method).c_str(), budget_label(run).c_str(), run.samples.size(),
                  none ? 0.0 : run_prefill_keys_percent(run),
                  none ? 0.0 : run_cache_kept_percent(run), run.seconds, run.seconds / count);
    text << row;
  }
  return text.str();
}

}  // namespace

std::string accuracy_vs_length_svg(const EvalReport& report, int budget) {
  LineChart chart;
  chart.title = "Accuracy against prompt length, budget " + std::to_string(budget) + " (mean of " +
                count_of(report.tasks.size(), "task") + ")";
  chart.x_label = "prompt length (tokens)";
  chart.y_label = "accuracy (%)";
  chart.x_values = report.lengths;
  for (const std::string& method : report.methods) {
    const EvalRun* run = find_run(report, method, budget);
    if (run == nullptr) continue;
    Series series;
    series.name = method;
    series.dashed = run->budget == 0;
    for (int length : report.lengths)
      series.values.push_back(length_accuracy(report, *run, length));
    chart.series.push_back(std::move(series));
  }
  return render_line_chart(chart);
}

std::string accuracy_vs_budget_svg(const EvalReport& report) {
  LineChart chart;
  chart.title = "Accuracy against budget (mean of " + count_of(report.tasks.size(), "task") +
                " and " + count_of(report.lengths.size(), "length") + ")";
  chart.x_label = "budget (tokens per KV head)";
  chart.y_label = "accuracy (%)";
  chart.x_values = report.budgets;
  for (const std::string& method : report.methods) {
    Series series;
    series.name = method;
    bool any = false;
    for (int budget : report.budgets) {
      const EvalRun* run = find_run(report, method, budget);
      series.values.push_back(run ? run_accuracy(report, *run) : kNaN);
      if (run != nullptr) {
        any = true;
        series.dashed = run->budget == 0;
      }
    }
    if (any) chart.series.push_back(std::move(series));
  }
  return render_line_chart(chart);
}

std::string accuracy_vs_keys_read_svg(const EvalReport& report) {
  LineChart chart;
  chart.title = "Accuracy against keys read (mean of " + count_of(report.tasks.size(), "task") +
                " and " + count_of(report.lengths.size(), "length") + ")";
  chart.x_label = "prefill keys read (% of full attention's)";
  chart.y_label = "accuracy (%)";
  chart.percent_x = true;
  chart.x_values = {0, 20, 40, 60, 80, 100};
  for (const std::string& method : report.methods) {
    std::vector<std::pair<double, double>> points;  // (keys, accuracy), one per run shown
    std::vector<const EvalRun*> seen;
    bool dashed = false;
    for (int budget : report.budgets) {
      const EvalRun* run = find_run(report, method, budget);
      if (run == nullptr || std::find(seen.begin(), seen.end(), run) != seen.end()) continue;
      seen.push_back(run);
      dashed = run->budget == 0;
      points.emplace_back(run_prefill_keys_percent(*run), run_accuracy(report, *run));
    }
    if (points.empty()) continue;
    std::stable_sort(points.begin(), points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    Series series;
    series.name = method;
    series.dashed = dashed;
    for (const auto& [keys, accuracy] : points) {
      series.xs.push_back(keys);
      series.values.push_back(accuracy);
    }
    chart.series.push_back(std::move(series));
  }
  return render_line_chart(chart);
}

std::vector<std::string> write_eval_plots(const EvalReport& report, const std::string& directory) {
  namespace fs = std::filesystem;
  prepare_output_folder(directory, "plot folder");
  std::vector<std::string> paths;
  for (const std::string& protocol : report.protocols) {
    const EvalReport only = protocol_report(report, protocol);
    const std::string prefix = report.protocols.size() > 1 ? protocol + "_" : "";
    for (int budget : only.budgets) {
      const std::string path = (fs::path(directory) / (prefix + "accuracy_vs_length_budget" +
                                                       std::to_string(budget) + ".svg"))
                                   .string();
      write_text_file(path, accuracy_vs_length_svg(only, budget));
      paths.push_back(path);
    }
    const std::string path = (fs::path(directory) / (prefix + "accuracy_vs_budget.svg")).string();
    write_text_file(path, accuracy_vs_budget_svg(only));
    paths.push_back(path);
    const std::string keys_path =
        (fs::path(directory) / (prefix + "accuracy_vs_keys_read.svg")).string();
    write_text_file(keys_path, accuracy_vs_keys_read_svg(only));
    paths.push_back(keys_path);
  }
  return paths;
}

}  // namespace entropyinfer::eval

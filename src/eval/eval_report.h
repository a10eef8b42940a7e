// The results of `entropyinfer eval` (RULER-style accuracy of every attention method at matched
// budgets) and what is written from them: JSON, a markdown report and two SVG line charts
// (accuracy against prompt length per method; accuracy against budget per method). Nothing here
// runs a model: the command fills an EvalReport, and tests can build one by hand.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace entropyinfer::eval {

// One scored generation.
struct EvalSampleResult {
  std::string task;  // ruler_task_name()
  int length = 0;    // the cell's nominal length (the prompt is at most this long)
  int index = 0;
  int prompt_tokens = 0;  // BOS included
  std::vector<std::string> answers;
  std::string prediction;  // the generated text, EOS dropped
  double score = 0.0;      // ruler_score(): fraction of the answers found, in [0, 1]
  double seconds = 0.0;    // prefill and decode
  // What the attention policies did: keys the prefill read over what full causal attention reads,
  // and cache entries kept over the entries before compression (1 when nothing was compressed).
  double prefill_keys_fraction = 1.0;
  double cache_kept_fraction = 1.0;
};

// One method at one budget level.
struct EvalRun {
  std::string method;  // as given to --methods: "prefill[+decode]", e.g. "entropy+latent"
  // The matched budget level of this run; 0 for a method that has no budget (full attention),
  // which runs once and stands for itself at every level.
  int budget = 0;
  nlohmann::json attention;  // the effective AttentionConfig (attention_config_to_json)
  // How the prompt met the cache (eval_protocol_description): query-aware, context-first or
  // multi-turn.
  std::string protocol = "query-aware";
  double seconds = 0.0;
  std::vector<EvalSampleResult> samples;
};

struct EvalReport {
  std::string date;  // ISO 8601, UTC
  std::string command;
  std::string model;
  std::string device;
  uint64_t seed = 0;
  int samples_per_cell = 0;
  std::vector<std::string> tasks;                        // column order of the tables
  std::vector<int> lengths;                              // ascending
  std::vector<int> budgets;                              // the levels, ascending
  std::vector<std::string> methods;                      // row and legend order
  std::vector<std::string> protocols = {"query-aware"};  // section order
  std::string notes;  // how budgets are matched and which parameters were scaled
  std::vector<EvalRun> runs;
};

// What each protocol of `entropyinfer eval --protocols` does, in a sentence; Error for an unknown
// name.
std::string eval_protocol_description(const std::string& protocol);
// The report restricted to one protocol's runs (its tables and plots are drawn from this).
EvalReport protocol_report(const EvalReport& report, const std::string& protocol);

// RULER's score of a (task, length) cell: the mean sample score times 100. NaN when the run has no
// sample of that cell.
double cell_accuracy(const EvalRun& run, const std::string& task, int length);
// The mean of cell_accuracy over the report's tasks (as RULER averages a length over its tasks);
// cells without samples are left out; NaN when no cell has any.
double length_accuracy(const EvalReport& report, const EvalRun& run, int length);
// The mean of length_accuracy over the report's lengths (NaN ones left out).
double run_accuracy(const EvalReport& report, const EvalRun& run);
// The mean of cell_accuracy over the report's lengths for one task.
double task_accuracy(const EvalReport& report, const EvalRun& run, const std::string& task);

// A 95% confidence interval of a cell's accuracy (percent): the 2.5th and 97.5th percentiles of
// kBootstrapResamples means of the cell's sample scores drawn with replacement (the percentile
// bootstrap), from a generator seeded by the run and cell, so a report is reproducible. NaN bounds
// without samples. A cell whose samples all score alike has an interval of width 0: the bootstrap
// cannot see beyond the samples, which is why cells need enough of them.
constexpr int kBootstrapResamples = 2000;
struct AccuracyInterval {
  double low = 0.0;
  double high = 0.0;
};
AccuracyInterval cell_interval(const EvalRun& run, const std::string& task, int length);
// +1 when run a's interval lies wholly above b's on the cell, -1 when wholly below, 0 when they
// overlap (or a cell has no samples): a method is called better or worse only where the
// intervals separate.
int compare_cells(const EvalRun& a, const EvalRun& b, const std::string& task, int length);
// The half-width of the normal-approximation 95% interval of an accuracy p (0-1) from n samples,
// in points: what a cell of n samples can resolve (1.96 * sqrt(p (1 - p) / n) * 100).
double interval_half_width(double p, int n);
// The samples per cell that bring interval_half_width(p, n) down to half_width_points.
int samples_to_resolve(double p, double half_width_points);

// A 95% interval of run_accuracy: the percentile bootstrap again, each resample drawing every
// cell's samples with replacement from that cell (so each cell keeps its weight in the mean).
AccuracyInterval run_interval(const EvalReport& report, const EvalRun& run);
// The mean over the run's samples of the keys its prefill read (share of full causal attention's)
// and of the cache entries its compression kept, in percent.
double run_prefill_keys_percent(const EvalRun& run);
double run_cache_kept_percent(const EvalRun& run);
// The runs shown at budget level `budget`, best first: each with its rank, 1 + the number of
// runs whose run_interval lies wholly above its own (so runs the intervals cannot tell apart
// share ranks), ties in accuracy kept in the report's method order.
struct RankedRun {
  const EvalRun* run = nullptr;
  int rank = 0;
  double accuracy = 0.0;
  AccuracyInterval interval;
};
std::vector<RankedRun> rank_runs(const EvalReport& report, int budget);

// The run that shows `method` at budget level `budget`: the method's run at that level, else its
// budget-free run (budget 0); nullptr when there is neither.
const EvalRun* find_run(const EvalReport& report, const std::string& method, int budget);

// Every field above, plus the derived accuracies ("accuracy": one entry per (method, budget, task,
// length); "averages": per (method, budget, length)) and the markdown text, for readers that do
// not recompute them. NaN accuracies are written as null.
nlohmann::json eval_report_to_json(const EvalReport& report);
// Reads what eval_report_to_json wrote (derived fields are ignored); throws Error naming the
// missing or mistyped field.
EvalReport eval_report_from_json(const nlohmann::json& json);

// One report from shards of the same evaluation that ran different samples (`eval --first-sample`):
// every field but the samples must agree; the runs (method, budget, protocol) must be the same
// in each; a run's samples are the union of its shards', in the order one evaluation of them all
// would have produced (task, length, index), and a sample found in two shards is an error. The
// date is the latest, the commands and devices are listed, seconds and samples per cell add up.
EvalReport merge_eval_reports(const std::vector<EvalReport>& shards);

// A markdown document: header (date, command, model, notes), the average accuracy of every method
// at every budget level per length, the per-task breakdown, and the work each run did.
std::string eval_report_markdown(const EvalReport& report);

// Line chart of the average accuracy (over tasks) against prompt length, one polyline per method,
// at one budget level (budget-free methods appear in every chart, dashed).
std::string accuracy_vs_length_svg(const EvalReport& report, int budget);
// Line chart of the average accuracy (over tasks and lengths) against the budget level, one
// polyline per method (a budget-free method is a flat dashed line).
std::string accuracy_vs_budget_svg(const EvalReport& report);

// Accuracy (mean over tasks and lengths) against the keys the prefill read (percent of full
// causal attention's), one point per budget level of each method, joined in order of keys read.
std::string accuracy_vs_keys_read_svg(const EvalReport& report);

// Writes accuracy_vs_length_budget<B>.svg for every level, accuracy_vs_budget.svg and
// accuracy_vs_keys_read.svg into
// `directory` (created when missing), each name prefixed with "<protocol>_" when the report has
// more than one protocol; returns the paths written. Throws Error when a file cannot be
// written.
std::vector<std::string> write_eval_plots(const EvalReport& report, const std::string& directory);

}  // namespace entropyinfer::eval

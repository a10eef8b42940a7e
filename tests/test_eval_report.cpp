// The evaluation report from a hand-made result set: accuracies as RULER computes them, the
// budget-free method standing at every level, the markdown tables, one polyline per method in the
// SVG charts with their axis labels, and a lossless JSON round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "eval/eval_report.h"
#include "expect_error.h"
#include "test_support.h"

namespace entropyinfer::eval {
namespace {

int count_of(const std::string& text, const std::string& piece) {
  int count = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) {
    ++count;
  }
  return count;
}

EvalSampleResult sample(const std::string& task, int length, int index, double score) {
  EvalSampleResult result;
  result.task = task;
  result.length = length;
  result.index = index;
  result.prompt_tokens = length - 10;
  result.answers = {"plum"};
  result.prediction = score > 0 ? " plum." : " pear.";
  result.score = score;
  result.seconds = 0.25;
  result.prefill_keys_fraction = 0.5;
  result.cache_kept_fraction = 0.25;
  return result;
}

// Two samples per cell; `scores` lists (niah 1024, niah 2048, vt 1024, vt 2048) pairs.
EvalRun make_run(const std::string& method, int budget, const std::vector<double>& scores) {
  EvalRun run;
  run.method = method;
  run.budget = budget;
  run.attention = {{"prefill", "full"}, {"decode", "full"}, {"budget", budget}};
  run.seconds = 2.0;
  size_t next = 0;
  for (const std::string task : {"niah_single", "vt"}) {
    for (int length : {1024, 2048}) {
      for (int index = 0; index < 2; ++index) {
        run.samples.push_back(sample(task, length, index, scores[next++]));
      }
    }
  }
  return run;
}

EvalReport fake_report() {
  EvalReport report;
  report.date = "2026-11-29T12:00:00Z";
  report.command = "entropyinfer eval -m model --lengths 1024,2048";
  report.model = "model";
  report.device = "cpu (2 threads)";
  report.seed = 0xFFFFFFFFFFFFFFF1ull;  // beyond int64: the seed must survive JSON exactly
  report.samples_per_cell = 2;
  report.tasks = {"niah_single", "vt"};
  report.lengths = {1024, 2048};
  report.budgets = {128, 256};
  report.methods = {"full", "entropy+latent", "full+snapkv"};
  report.notes = "Budgets are matched.";
  report.runs.push_back(make_run("full", 0, {1, 1, 1, 0, 0.5, 0.5, 0, 0}));
  report.runs.push_back(make_run("entropy+latent", 128, {1, 0, 0, 0, 0.25, 0.25, 0, 0}));
  report.runs.push_back(make_run("entropy+latent", 256, {1, 1, 0, 0, 0.5, 0.5, 0, 0}));
  // SnapKV ran at the first level only: the second shows no line and no row for it.
  report.runs.push_back(make_run("full+snapkv", 128, {0, 0, 0, 0, 0, 0, 0, 0}));
  return report;
}

TEST(EvalReport, AccuraciesAreRulersMeanTimesHundred) {
  const EvalReport report = fake_report();
  const EvalRun& full = report.runs[0];
  EXPECT_DOUBLE_EQ(cell_accuracy(full, "niah_single", 1024), 100.0);
  EXPECT_DOUBLE_EQ(cell_accuracy(full, "niah_single", 2048), 50.0);
  EXPECT_DOUBLE_EQ(cell_accuracy(full, "vt", 1024), 50.0);
  EXPECT_DOUBLE_EQ(cell_accuracy(full, "vt", 2048), 0.0);
  EXPECT_TRUE(std::isnan(cell_accuracy(full, "cwe", 1024)));
  EXPECT_DOUBLE_EQ(length_accuracy(report, full, 1024), 75.0);
  EXPECT_DOUBLE_EQ(length_accuracy(report, full, 2048), 25.0);
  EXPECT_DOUBLE_EQ(run_accuracy(report, full), 50.0);
  EXPECT_DOUBLE_EQ(task_accuracy(report, full, "niah_single"), 75.0);
  EXPECT_DOUBLE_EQ(run_accuracy(report, report.runs[1]), 100.0 * (0.5 + 0.25) / 4);
}

TEST(EvalReport, BudgetFreeMethodStandsAtEveryLevel) {
  const EvalReport report = fake_report();
  EXPECT_EQ(find_run(report, "full", 128), &report.runs[0]);
  EXPECT_EQ(find_run(report, "full", 256), &report.runs[0]);
  EXPECT_EQ(find_run(report, "entropy+latent", 256), &report.runs[2]);
  EXPECT_EQ(find_run(report, "full+snapkv", 256), nullptr);
  EXPECT_EQ(find_run(report, "critiprefill", 128), nullptr);
}

TEST(EvalReport, MarkdownHasTheTablesAndValues) {
  const std::string markdown = eval_report_markdown(fake_report());
  EXPECT_NE(markdown.find("`entropyinfer eval -m model --lengths 1024,2048`"), std::string::npos);
  EXPECT_NE(markdown.find("Budgets are matched."), std::string::npos);
  EXPECT_NE(markdown.find("| method | budget | 1024 | 2048 | mean |"), std::string::npos)
      << markdown;
  // full at both levels, entropy+latent at both, snapkv at one.
  EXPECT_NE(markdown.find("| full | none (dense) | 75.0 | 25.0 | 50.0 |"), std::string::npos)
      << markdown;
  EXPECT_EQ(count_of(markdown, "| full | none (dense) | 75.0 | 25.0 | 50.0 |"), 2);
  EXPECT_NE(markdown.find("| entropy+latent | 128 | 37.5 | 0.0 | 18.8 |"), std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| entropy+latent | 256 | 75.0 | 0.0 | 37.5 |"), std::string::npos);
  EXPECT_EQ(count_of(markdown, "| full+snapkv | 128 | 0.0 | 0.0 | 0.0 |"), 1);
  // Per-task table and every cell.
  EXPECT_NE(markdown.find("| method | budget | niah_single | vt |"), std::string::npos);
  EXPECT_NE(markdown.find("| full | none (dense) | 75.0 | 25.0 |"), std::string::npos);
  EXPECT_NE(markdown.find("### Budget 128"), std::string::npos);
  EXPECT_NE(markdown.find("### Budget 256"), std::string::npos);
  EXPECT_NE(markdown.find("| full (dense) | vt | 50.0 [50.0, 50.0] | 0.0 [0.0, 0.0] |"),
            std::string::npos)
      << markdown;
  // Work: the budget-free run once, with its averaged fractions and time per sample.
  EXPECT_NE(markdown.find("| full | none (dense) | 8 | 50.0 | 25.0 | 2.0 | 0.25 |"),
            std::string::npos)
      << markdown;
}

TEST(EvalReport, LengthChartHasOnePolylinePerMethodAndAxisLabels) {
  const EvalReport report = fake_report();
  const std::string svg = accuracy_vs_length_svg(report, 128);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count_of(svg, "<polyline"), 3) << svg;
  for (const std::string& method : report.methods) {
    EXPECT_NE(svg.find("data-name=\"" + method + "\""), std::string::npos) << method;
    EXPECT_NE(svg.find(">" + method + "</text>"), std::string::npos) << "legend: " << method;
  }
  EXPECT_NE(svg.find("prompt length (tokens)"), std::string::npos);
  EXPECT_NE(svg.find("accuracy (%)"), std::string::npos);
  EXPECT_NE(svg.find(">1k</text>"), std::string::npos);  // x ticks
  EXPECT_NE(svg.find(">2k</text>"), std::string::npos);
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);  // y ticks
  EXPECT_NE(svg.find("budget 128"), std::string::npos);
  // full attention is the dashed reference (once as a line, once in the legend).
  EXPECT_EQ(count_of(svg, "stroke-dasharray"), 2);
  // Two points per line: full at 75 % and 25 % of a 340-pixel-high plot starting at y = 50.
  EXPECT_NE(svg.find("cy=\"135.0\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("cy=\"305.0\""), std::string::npos);
  // SnapKV did not run at 256: two lines there.
  EXPECT_EQ(count_of(accuracy_vs_length_svg(report, 256), "<polyline"), 2);
}

TEST(EvalReport, BudgetChartHasOnePolylinePerMethod) {
  const std::string svg = accuracy_vs_budget_svg(fake_report());
  EXPECT_EQ(count_of(svg, "<polyline"), 3);
  EXPECT_NE(svg.find("budget (tokens per KV head)"), std::string::npos);
  EXPECT_NE(svg.find("accuracy (%)"), std::string::npos);
  EXPECT_NE(svg.find(">128</text>"), std::string::npos);
  EXPECT_NE(svg.find(">256</text>"), std::string::npos);
  // entropy+latent has a point at both levels, snapkv at one, full at both (flat, 50 %).
  EXPECT_EQ(count_of(svg, "<circle"), 5);
  EXPECT_EQ(count_of(svg, "cy=\"220.0\""), 2) << svg;
}

TEST(EvalReport, SingleLengthAndEscapedNamesStillDraw) {
  EvalReport report = fake_report();
  report.lengths = {1024};
  report.methods = {"a<b&c"};
  report.runs = {make_run("a<b&c", 0, {1, 1, 0, 0, 1, 1, 0, 0})};
  const std::string svg = accuracy_vs_length_svg(report, 128);
  EXPECT_EQ(count_of(svg, "<polyline"), 1);
  EXPECT_NE(svg.find("a&lt;b&amp;c"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(EvalReport, JsonRoundTripKeepsEveryField) {
  const EvalReport report = fake_report();
  const nlohmann::json json = eval_report_to_json(report);
  const EvalReport back = eval_report_from_json(nlohmann::json::parse(json.dump()));
  EXPECT_EQ(back.date, report.date);
  EXPECT_EQ(back.command, report.command);
  EXPECT_EQ(back.seed, report.seed);
  EXPECT_EQ(back.tasks, report.tasks);
  EXPECT_EQ(back.lengths, report.lengths);
  EXPECT_EQ(back.budgets, report.budgets);
  EXPECT_EQ(back.methods, report.methods);
  ASSERT_EQ(back.runs.size(), report.runs.size());
  for (size_t r = 0; r < report.runs.size(); ++r) {
    EXPECT_EQ(back.runs[r].method, report.runs[r].method);
    EXPECT_EQ(back.runs[r].budget, report.runs[r].budget);
    EXPECT_EQ(back.runs[r].attention, report.runs[r].attention);
    ASSERT_EQ(back.runs[r].samples.size(), report.runs[r].samples.size());
    for (size_t s = 0; s < report.runs[r].samples.size(); ++s) {
      const EvalSampleResult& a = report.runs[r].samples[s];
      const EvalSampleResult& b = back.runs[r].samples[s];
      EXPECT_EQ(a.task, b.task);
      EXPECT_EQ(a.length, b.length);
      EXPECT_EQ(a.index, b.index);
      EXPECT_EQ(a.answers, b.answers);
      EXPECT_EQ(a.prediction, b.prediction);
      EXPECT_EQ(a.score, b.score);
      EXPECT_EQ(a.cache_kept_fraction, b.cache_kept_fraction);
    }
  }
  // Writing it again gives the same document, derived fields and markdown included.
  EXPECT_EQ(eval_report_to_json(back), json);
  // The derived accuracies are there for readers that do not recompute them.
  bool found = false;
  for (const nlohmann::json& entry : json["averages"]) {
    if (entry["method"] == "full" && entry["length"] == 1024) {
      EXPECT_DOUBLE_EQ(entry["accuracy"].get<double>(), 75.0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(json["accuracy"].size(), 4u * 2 * 2);
}

TEST(EvalReport, JsonMissingFieldIsOneClearError) {
  nlohmann::json json = eval_report_to_json(fake_report());
  json["runs"][1]["samples"][0].erase("score");
  testing::expect_error_naming([&] { eval_report_from_json(json); }, {"'score'"},
                               "a sample without its score");
  json = eval_report_to_json(fake_report());
  json["lengths"] = "1024";
  EXPECT_THROW(eval_report_from_json(json), Error);
}

TEST(EvalReport, WritesOnePlotPerLevelTheBudgetPlotAndTheKeysPlot) {
  const std::filesystem::path folder = std::filesystem::temp_directory_path() /
                                       ("entropyinfer_eval_plots_" + std::to_string(::getpid())) /
                                       "nested";
  const std::vector<std::string> paths = write_eval_plots(fake_report(), folder.string());
  ASSERT_EQ(paths.size(), 4u);
  EXPECT_EQ(std::filesystem::path(paths[0]).filename(), "accuracy_vs_length_budget128.svg");
  EXPECT_EQ(std::filesystem::path(paths[1]).filename(), "accuracy_vs_length_budget256.svg");
  EXPECT_EQ(std::filesystem::path(paths[2]).filename(), "accuracy_vs_budget.svg");
  EXPECT_EQ(std::filesystem::path(paths[3]).filename(), "accuracy_vs_keys_read.svg");
  for (const std::string& path : paths) {
    EXPECT_EQ(testing::read_file_bytes(path).rfind("<svg", 0), 0u) << path;
  }
  std::filesystem::remove_all(folder.parent_path());
}

}  // namespace
}  // namespace entropyinfer::eval

namespace entropyinfer::eval {
namespace {

// n samples of one cell, `correct` of them scoring 1.
EvalRun binary_run(const std::string& method, int n, int correct) {
  EvalRun run;
  run.method = method;
  run.budget = 512;
  for (int i = 0; i < n; ++i) run.samples.push_back(sample("niah_single", 4096, i, i < correct));
  return run;
}

// One niah_single cell at 4k, 40 samples each: full at 90% (budget-free), entropy+latent at 85%,
// full+streaming at 30%.
EvalReport three_method_report() {
  EvalReport report;
  report.tasks = {"niah_single"};
  report.lengths = {4096};
  report.budgets = {512};
  report.methods = {"full", "entropy+latent", "full+streaming"};
  report.samples_per_cell = 40;
  report.runs = {binary_run("full", 40, 36), binary_run("entropy+latent", 40, 34),
                 binary_run("full+streaming", 40, 12)};
  report.runs[0].budget = 0;
  return report;
}

TEST(EvalIntervals, BootstrapIntervalsMatchTheBinomialAndAreReproducible) {
  // 360 of 400 right: the normal approximation's 95% half-width is 1.96 * sqrt(.9 * .1 / 400) =
  // 2.94 points; the percentile bootstrap of the same scores lands within half a point of it.
  const EvalRun run = binary_run("full", 400, 360);
  const AccuracyInterval interval = cell_interval(run, "niah_single", 4096);
  EXPECT_NEAR(interval_half_width(0.9, 400), 2.94, 0.01);
  EXPECT_NEAR(90.0 - interval.low, 2.94, 0.5);
  EXPECT_NEAR(interval.high - 90.0, 2.94, 0.5);
  const AccuracyInterval again = cell_interval(run, "niah_single", 4096);
  EXPECT_EQ(interval.low, again.low);
  EXPECT_EQ(interval.high, again.high);
  // Fewer samples, wider; a cell where every sample agrees has no spread to resample.
  const AccuracyInterval small = cell_interval(binary_run("full", 20, 18), "niah_single", 4096);
  EXPECT_GT(small.high - small.low, 2 * (interval.high - interval.low));
  const AccuracyInterval flat = cell_interval(binary_run("full", 20, 20), "niah_single", 4096);
  EXPECT_EQ(flat.low, 100.0);
  EXPECT_EQ(flat.high, 100.0);
  EXPECT_TRUE(std::isnan(cell_interval(run, "vt", 4096).low));
  // Telling 90% from 85% needs half-widths of 2.5 points: 554 samples per cell.
  EXPECT_EQ(samples_to_resolve(0.9, 2.5), 554);
}

TEST(EvalIntervals, MethodsDifferOnlyWhereTheIntervalsSeparate) {
  const EvalRun full = binary_run("full", 40, 36);
  const EvalRun close = binary_run("entropy+latent", 40, 34);
  const EvalRun far = binary_run("full+streaming", 40, 12);
  EXPECT_EQ(compare_cells(close, full, "niah_single", 4096), 0);
  EXPECT_EQ(compare_cells(far, full, "niah_single", 4096), -1);
  EXPECT_EQ(compare_cells(full, far, "niah_single", 4096), 1);
  EXPECT_EQ(compare_cells(full, far, "vt", 4096), 0) << "no samples, no verdict";

  const EvalReport report = three_method_report();
  const std::string markdown = eval_report_markdown(report);
  EXPECT_NE(markdown.find("90.0 ["), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("full+streaming worse (30.0 against 90.0)"), std::string::npos)
      << markdown;
  EXPECT_EQ(markdown.find("entropy+latent worse"), std::string::npos) << markdown;
  EXPECT_EQ(markdown.find("entropy+latent better"), std::string::npos) << markdown;
  const nlohmann::json json = eval_report_to_json(report);
  bool has_interval = false;
  for (const auto& cell : json["accuracy"]) {
    if (cell["method"] == "full+streaming") {
      has_interval =
          cell["interval"][0].get<double>() < 30.0 && cell["interval"][1].get<double>() > 30.0;
    }
  }
  EXPECT_TRUE(has_interval);
}

// The report lists every cell where another method's interval lies wholly above EntropyInfer's
// (the first entropy method), and says so when there is none.
TEST(EvalIntervals, CellsWhereABaselineBeatsEntropyInferAreListed) {
  EvalReport report = three_method_report();
  std::string markdown = eval_report_markdown(report);
  EXPECT_NE(
      markdown.find("## Where another method beats entropy+latent beyond the 95% intervals\n\n"
                    "None: no method's interval lies wholly above entropy+latent's"),
      std::string::npos)
      << markdown;

  // A baseline at 100% against entropy+latent at 50%: listed as better, and full (90%) too;
  // full+streaming (30%) is worse, which this section leaves out.
  report.methods = {"full", "entropy-segment+latent", "entropy+latent", "critiprefill+full",
                    "full+streaming"};
  report.runs[1] = binary_run("entropy+latent", 40, 20);
  report.runs.push_back(binary_run("critiprefill+full", 40, 40));
  report.runs.push_back(binary_run("entropy-segment+latent", 40, 20));
  markdown = eval_report_markdown(report);
  const size_t section = markdown.find("## Where another method beats entropy+latent");
  ASSERT_NE(section, std::string::npos) << markdown;
  const std::string listed =
      markdown.substr(section, markdown.find("\n## ", section + 1) - section);
  EXPECT_NE(listed.find(
                "- budget 512, niah_single at 4096: critiprefill+full better (100.0 against 50.0)"),
            std::string::npos)
      << listed;
  EXPECT_NE(listed.find("- budget 512, niah_single at 4096: full better (90.0 against 50.0)"),
            std::string::npos)
      << listed;
  EXPECT_EQ(listed.find("full+streaming"), std::string::npos) << listed;
  EXPECT_EQ(listed.find("entropy-segment+latent"), std::string::npos) << listed;
  EXPECT_EQ(count_of(listed, "\n- "), 2) << listed;
}

}  // namespace
}  // namespace entropyinfer::eval

namespace entropyinfer::eval {
namespace {

// Ranks follow the run intervals: a run is outranked only by runs whose interval lies wholly above
// its own, so two the samples cannot tell apart share a rank.
TEST(EvalRanking, RanksCountOnlyRunsBeyondTheIntervals) {
  EvalReport report = three_method_report();
  for (EvalSampleResult& s : report.runs[2].samples) s.prefill_keys_fraction = 0.125;
  const std::vector<RankedRun> ranked = rank_runs(report, 512);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].run->method, "full");
  EXPECT_EQ(ranked[0].rank, 1);
  EXPECT_EQ(ranked[1].run->method, "entropy+latent");
  EXPECT_EQ(ranked[1].rank, 1) << "85% is not told from 90% by 40 samples";
  EXPECT_EQ(ranked[2].run->method, "full+streaming");
  EXPECT_EQ(ranked[2].rank, 3);
  EXPECT_DOUBLE_EQ(ranked[2].accuracy, 30.0);
  // One cell: the run's interval is the cell's.
  const AccuracyInterval cell = cell_interval(report.runs[2], "niah_single", 4096);
  EXPECT_NEAR(ranked[2].interval.low, cell.low, 2.5);
  EXPECT_NEAR(ranked[2].interval.high, cell.high, 2.5);
  EXPECT_DOUBLE_EQ(run_prefill_keys_percent(report.runs[2]), 12.5);
  const std::string markdown = eval_report_markdown(report);
  EXPECT_NE(markdown.find("| 3 | full+streaming | 30.0 | ["), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| 12.5 | 25.0 |"), std::string::npos) << markdown;
}

// Over several cells the run interval resamples each cell on its own: a run right everywhere but
// one cell still has width, and the interval holds the run's accuracy.
TEST(EvalRanking, RunIntervalsCoverTheMeanOverCells) {
  const EvalReport report = fake_report();
  const EvalRun& run = report.runs[0];  // full: 1 1 | 1 0 | .5 .5 | 0 0
  const AccuracyInterval interval = run_interval(report, run);
  const double accuracy = run_accuracy(report, run);
  EXPECT_LE(interval.low, accuracy);
  EXPECT_GE(interval.high, accuracy);
  EXPECT_GT(interval.high - interval.low, 0.0);
  const AccuracyInterval again = run_interval(report, run);
  EXPECT_EQ(interval.low, again.low);
  EXPECT_EQ(interval.high, again.high);
}

TEST(EvalRanking, KeysReadChartPlacesEachRunAtItsShareOfKeys) {
  EvalReport report = fake_report();
  for (EvalSampleResult& s : report.runs[1].samples) s.prefill_keys_fraction = 0.25;
  const std::string svg = accuracy_vs_keys_read_svg(report);
  EXPECT_EQ(count_of(svg, "<polyline"), 3);
  EXPECT_NE(svg.find("prefill keys read (% of full attention"), std::string::npos);
  // entropy+latent at 25% of the keys (budget 128) and at 50% (256): two points, in that order.
  EXPECT_NE(svg.find("entropy+latent at 25.0%: "), std::string::npos) << svg;
  EXPECT_NE(svg.find("entropy+latent at 50.0%: "), std::string::npos) << svg;
  EXPECT_NE(svg.find("full at 50.0%: "), std::string::npos) << svg;
}

}  // namespace
}  // namespace entropyinfer::eval

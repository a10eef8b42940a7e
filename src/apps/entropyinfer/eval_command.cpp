// `entropyinfer eval`: RULER-style accuracy of every attention method at matched budgets. Builds
// the synthetic tasks of training/TASKS.md from a seed (src/eval/ruler_tasks.h), generates greedily
// under each method and budget level, scores as RULER does, and writes a markdown report (stdout
// and --markdown), JSON and SVG plots (src/eval/eval_report.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "apps/entropyinfer/model_commands.h"
#include "attention/entropy_prefill.h"
#include "core/error.h"
#include "core/json_reader.h"
#include "core/stopwatch.h"
#include "core/user_file.h"
#include "engine/transformer.h"
#include "eval/eval_report.h"
#include "eval/ruler_tasks.h"

namespace entropyinfer::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Where a report goes: stdout always, and the files asked for.
struct ReportOutputs {
  std::string json_path;
  std::string markdown_path;
  std::string plots_dir;

  // Checked before any work, so a bad path costs nothing.
  void check() const {
    if (!markdown_path.empty()) check_output_file(markdown_path, "--markdown file");
    if (!json_path.empty()) check_output_file(json_path, "--json file");
    if (!plots_dir.empty()) prepare_output_folder(plots_dir, "--plots folder");
  }

  void write(const eval::EvalReport& report) const {
    const std::string markdown = eval::eval_report_markdown(report);
    std::printf("%s", markdown.c_str());
    std::fflush(stdout);
    if (!markdown_path.empty()) write_user_file(markdown_path, "--markdown file", markdown);
    if (!json_path.empty()) {
      // A model can generate bytes that are not UTF-8 (a token that ends mid-character).
      write_user_file(json_path, "--json file",
                      eval::eval_report_to_json(report).dump(
                          2, ' ', false, nlohmann::json::error_handler_t::replace) +
                          "\n");
    }
    if (!plots_dir.empty()) {
      for (const std::string& path : eval::write_eval_plots(report, plots_dir)) {
        std::fprintf(stderr, "wrote %s\n", path.c_str());
      }
    }
  }
};

void add_report_outputs(CLI::App* command, ReportOutputs* outputs) {
  command->add_option("--json", outputs->json_path, "Write every score and the configs as JSON");
  command->add_option("--markdown", outputs->markdown_path,
                      "Write the markdown report to this file");
  command->add_option("--plots", outputs->plots_dir,
                      "Write SVG plots into this folder: accuracy against length (one per budget "
                      "level), against budget and against keys read");
}

struct EvalArgs {
  std::string model;
  std::vector<std::string> tasks = {"all"};
  std::vector<std::string> lengths = {"4096", "8192", "16384", "32768"};
  int samples = 20;
  int first_sample = 0;
  uint64_t seed = 0;
  std::vector<std::string> methods = {"full",        "entropy+latent", "critiprefill+full",
                                      "full+snapkv", "full+adakv",     "full+streaming"};
  std::vector<std::string> budgets = {"512", "1024", "2048"};
  std::vector<std::string> protocols = {"query-aware"};
  std::string words = "all";
  std::string text_dir;
  DeviceFlags run;
  AttentionOptions attention;
  ReportOutputs outputs;
};

std::string format_duration(double seconds) {
  const long long total = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", total / 3600, total % 3600 / 60);
  } else if (total >= 60) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%llds", total);
  }
  return text;
}

std::vector<int> parse_token_counts(const std::string& flag, const std::vector<std::string>& list) {
  if (list.empty()) throw Error(flag + ": give at least one value");
  std::vector<int> values;
  for (const std::string& text : list) values.push_back(parse_token_count(flag, text));
  std::sort(values.begin(), values.end());
  if (std::adjacent_find(values.begin(), values.end()) != values.end()) {
    throw Error(flag + ": a value is given twice");
  }
  return values;
}

std::vector<eval::RulerTask> parse_tasks(const std::vector<std::string>& names) {
  if (names.empty()) throw Error("--tasks: give at least one task (or all)");
  if (names.size() == 1 && names[0] == "all") return eval::all_ruler_tasks();
  std::vector<eval::RulerTask> tasks;
  for (const std::string& name : names) {
    if (name == "all") throw Error("--tasks: 'all' cannot be combined with named tasks");
    const eval::RulerTask task = eval::parse_ruler_task(name);
    if (std::find(tasks.begin(), tasks.end(), task) != tasks.end()) {
      throw Error("--tasks: '" + name + "' is given twice");
    }
    tasks.push_back(task);
  }
  return tasks;
}

std::string budget_notes(bool scale_threshold, int fixed_threshold) {
  std::ostringstream text;
  text << "Budgets are matched: at level B every method is given B tokens per KV head. "
          "EntropyInfer's prefill base_budget is B (its per-head, per-segment budgets then range "
          "over [B, budget_cap_factor x B] as the method allocates them), CritiPrefill's fixed "
          "critiprefill_budget is B, and the decode cache budget K (latent, SnapKV, AdaKV, "
          "StreamingLLM, PyramidKV) is B. ";
  if (scale_threshold) {
    text << "Sparse prefill segments start at sparse_threshold = B (the released 4096 with base "
            "budget 2048 would leave every 4k prompt dense, and a segment starting before B holds "
            "about B keys anyway). ";
  } else {
    text << "sparse_threshold is fixed at " << fixed_threshold << " as given. ";
  }
  text << "Decode-cache methods compress after the prefill, so the first generated token always "
          "comes from the full cache: on niah_single and niah_multikey, whose answer is that "
          "token, they score as their prefill does. ";
  text
      << "Full attention has no budget: it runs once and stands at every level. Generation is "
         "greedy, at most the task's G tokens, stopping at EOS only (training/TASKS.md section 7); "
         "a sample scores the fraction of its answer words found (RULER's string_match_all on "
         "whole words) and a cell is the mean times 100.";
  return text.str();
}

// The parameters a method actually uses, on one line.
std::string describe_config(const AttentionConfig& config) {
  const PrefillParams& p = config.prefill_params;
  const DecodeParams& d = config.decode_params;
  std::ostringstream text;
  text << "prefill " << prefill_method_name(config.prefill);
  if (config.prefill != PrefillMethod::kFull) {
    text << " (S " << p.segment_size << ", b " << p.block_size << ", sparse from "
         << p.sparse_threshold << ", dense layers " << p.dense_layers;
    if (config.prefill == PrefillMethod::kEntropy) {
      text << ", base budget " << p.base_budget << " cap " << p.budget_cap_factor << "x, e_t "
           << p.entropy_threshold << ", delta " << p.delta << ", alpha " << p.alpha
           << (p.share_segment_budget ? ", shared segment budget" : "")
           << (p.per_segment_rigid ? ", per-segment rigid" : "");
    } else {
      text << ", budget " << p.critiprefill_budget;
    }
    text << ")";
  }
  text << " | decode " << decode_method_name(config.decode);
  switch (config.decode) {
    case DecodeMethod::kFull:
      break;
    case DecodeMethod::kStreamingLLM:
      text << " (K " << d.budget << ", sinks " << d.sink_tokens << ")";
      break;
    default:
      text << " (K " << d.budget << ", W " << d.window;
      if (config.decode == DecodeMethod::kLatent) text << ", G " << d.gap;
      if (config.decode == DecodeMethod::kAdaKV) text << ", floor " << d.adakv_floor;
      if (config.decode == DecodeMethod::kPyramidKV) text << ", beta " << d.pyramid_beta;
      text << ", pool " << d.pool_kernel << ", "
           << (d.aggregation == GroupAggregation::kMax ? "max" : "mean") << " over the group"
           << (d.per_query_head ? ", per query head" : "") << ")";
      break;
  }
  return text.str();
}

struct PlannedRun {
  std::string method;
  int budget = 0;  // 0: no budget (full attention)
  AttentionConfig config;
};

// Where a method as configured does not differ from full attention on these tasks, said up front
// so that equal scores are not read as a tie: a sparse prefill has no sparse segment in a short
// prompt, and latent compression waits for G decode steps, more than short answers take.
std::vector<std::string> where_methods_stay_dense(const std::vector<PlannedRun>& runs,
                                                  const std::vector<eval::RulerTask>& tasks,
                                                  const std::vector<int>& lengths) {
  std::vector<std::string> notes;
  auto join = [](const auto& items) {
    std::ostringstream text;
    for (size_t i = 0; i < items.size(); ++i) text << (i ? ", " : "") << items[i];
    return text.str();
  };
  // Per method: budget level -> lengths with no sparse prefill segment.
  std::vector<std::string> methods;
  std::vector<std::vector<std::pair<int, std::vector<int>>>> dense_lengths;
  for (const PlannedRun& run : runs) {
    if (methods.empty() || methods.back() != run.method) {
      methods.push_back(run.method);
      dense_lengths.emplace_back();
    }
    const PrefillParams& p = run.config.prefill_params;
    if (run.config.prefill != PrefillMethod::kFull) {
      std::vector<int> dense;
      for (int length : lengths) {
        const int64_t segments = (length + p.segment_size - 1) / p.segment_size;
        bool any_sparse = false;
        for (int64_t s = 0; s < segments; ++s) {
          any_sparse =
              any_sparse || segment_is_sparse(s, segments, p.segment_size, p.sparse_threshold);
        }
        if (!any_sparse) dense.push_back(length);
      }
      if (!dense.empty()) dense_lengths.back().emplace_back(run.budget, dense);
    }
  }
  for (size_t m = 0; m < methods.size(); ++m) {
    const auto& levels = dense_lengths[m];
    if (levels.empty()) continue;
    const PlannedRun& run = *std::find_if(
        runs.begin(), runs.end(), [&](const PlannedRun& r) { return r.method == methods[m]; });
    const bool same = std::all_of(levels.begin(), levels.end(), [&](const auto& level) {
      return level.second == levels[0].second;
    });
    std::ostringstream text;
    text << methods[m] << " prefills densely (segments of "
         << run.config.prefill_params.segment_size
         << ", sparse from the threshold on, the last segment always dense) at ";
    if (same) {
      std::vector<int> budgets;
      for (const auto& level : levels) budgets.push_back(level.first);
      text << join(levels[0].second) << " tokens at budget" << (budgets.size() > 1 ? "s " : " ")
           << join(budgets) << ".";
    } else {
      for (size_t i = 0; i < levels.size(); ++i) {
        text << (i ? "; " : "") << join(levels[i].second) << " tokens at budget "
             << levels[i].first;
      }
      text << ".";
    }
    notes.push_back(text.str());
  }
  std::set<std::string> said;
  for (const PlannedRun& run : runs) {
    if (run.config.decode != DecodeMethod::kLatent || said.count(run.method)) continue;
    said.insert(run.method);
    const int gap = run.config.decode_params.gap;
    std::vector<std::string> short_tasks;
    for (eval::RulerTask task : tasks) {
      // The G-th decode step compresses after its own attention, so the tokens after it are the
      // first to see the compressed cache; the last generated token is never fed back.
      if (eval::ruler_generation_tokens(task) <= gap + 1) {
        short_tasks.push_back(eval::ruler_task_name(task));
      }
    }
    if (short_tasks.empty()) continue;
    notes.push_back(run.method + ": latent compression comes after G = " + std::to_string(gap) +
                    " decode steps, later than the last token of " + join(short_tasks) +
                    ", which therefore decode over the full cache (--decode-gap sets G).");
  }
  return notes;
}

std::string command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::ostringstream bytes;
  bytes << file.rdbuf();
  std::string text;
  std::string argument;
  std::istringstream stream(bytes.str());
  bool first = true;
  while (std::getline(stream, argument, '\0')) {
    if (first) {
      argument = "entropyinfer";
      first = false;
    }
    const bool plain =
        !argument.empty() && argument.find_first_of(" \t'\"$\\*?;&|<>()") == std::string::npos;
    text += (text.empty() ? "" : " ") + (plain ? argument : "'" + argument + "'");
  }
  return text.empty() ? "entropyinfer eval" : text;
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return date;
}

// --- Progress on stderr ------------------------------------------------------------------------

// N/M samples with the time spent and left. A terminal gets one line updated in place after every
// sample; a log gets one line per finished (run, task, length) cell. The estimate weighs samples
// by their prompt tokens, since long prompts dominate.
class EvalProgress {
 public:
  EvalProgress(int64_t total_samples, int64_t total_tokens)
      : total_samples_(total_samples),
        total_tokens_(total_tokens),
        terminal_(isatty(STDERR_FILENO) != 0),
        start_(Clock::now()) {}

  void sample_done(int64_t tokens, const std::string& where) {
    ++done_samples_;
    done_tokens_ += tokens;
    if (terminal_) {
      std::fprintf(stderr, "\r\033[K%s", status(where).c_str());
      std::fflush(stderr);
      in_place_ = true;
    }
  }
  void cell_done(const std::string& where) {
    if (!terminal_) std::fprintf(stderr, "%s\n", status(where).c_str());
  }
  // A line of its own (the in-place line is cleared first).
  void message(const std::string& text) {
    if (in_place_) std::fprintf(stderr, "\r\033[K");
    in_place_ = false;
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (in_place_) std::fprintf(stderr, "\n");
    in_place_ = false;
  }
  double elapsed() const { return seconds_since(start_); }

 private:
  std::string status(const std::string& where) const {
    const double seconds = elapsed();
    const double left = done_tokens_ > 0
                            ? seconds * static_cast<double>(total_tokens_ - done_tokens_) /
                                  static_cast<double>(done_tokens_)
                            : 0.0;
    char text[512];
    std::snprintf(text, sizeof(text), "eval: %lld/%lld samples | %s | %s elapsed, ETA %s",
                  static_cast<long long>(done_samples_), static_cast<long long>(total_samples_),
                  where.c_str(), format_duration(seconds).c_str(), format_duration(left).c_str());
    return text;
  }

  int64_t total_samples_, total_tokens_;
  int64_t done_samples_ = 0, done_tokens_ = 0;
  bool terminal_;
  bool in_place_ = false;
  Clock::time_point start_;
};

struct PreparedSample {
  eval::RulerSample sample;
  std::vector<int32_t> ids;          // BOS + the prompt
  std::vector<int32_t> context_ids;  // BOS + the prompt without its question
  std::vector<int32_t> question_ids;
  std::vector<std::vector<int32_t>> follow_up_ids;  // "\n" + each follow-up question
};

// The most tokens multi-turn adds past the prompt: each follow-up question and its answer.
int64_t multi_turn_extra_tokens(const PreparedSample& prepared) {
  int64_t extra = 0;
  for (const std::vector<int32_t>& ids : prepared.follow_up_ids)
    extra += static_cast<int64_t>(ids.size()) + 1 + prepared.sample.max_new_tokens;
  return extra;
}

struct SampleOutcome {
  std::string prediction;
  double score = 0.0;
  WorkFractions after_prefill;
};

// One sample under one protocol (eval_protocol_description says what each does): greedy answers
// of at most the task's G tokens, stopping at EOS.
SampleOutcome run_sample(LanguageModel& model, const PreparedSample& prepared,
                         const std::string& protocol, const std::vector<int32_t>& stop_ids,
                         const Tokenizer& tokenizer) {
  const eval::RulerSample& sample = prepared.sample;
  SampleOutcome outcome;
  model.reset();
  int32_t token = 0;
  if (protocol == "query-aware") {
    token = model.forward_greedy(prepared.ids);
    outcome.after_prefill = work_fractions(model.attention_work());
  } else {
    model.forward_greedy(prepared.context_ids);
    outcome.after_prefill = work_fractions(model.attention_work());
    token = model.forward_greedy(prepared.question_ids);
  }
  // Generates one answer from `token` (already sampled); leaves in `token` the last sampled one,
  // which is not yet in the cache.
  const auto answer = [&] {
    std::vector<int32_t> generated;
    for (int step = 0; step < sample.max_new_tokens; ++step) {
      if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) break;
      generated.push_back(token);
      if (step + 1 == sample.max_new_tokens) break;
      token = model.forward_greedy(std::span<const int32_t>(&token, 1));
    }
    // Ids past the tokenizer's vocabulary (a classifier padded beyond it) have no text.
    std::erase_if(generated, [&](int32_t id) { return id < 0 || id >= tokenizer.vocab_size(); });
    return tokenizer.decode(generated);
  };
  const std::string first = answer();
  if (protocol != "multi-turn") {
    outcome.prediction = first;
    outcome.score = eval::ruler_score(sample.task, first, sample.answers);
    return outcome;
  }
  outcome.prediction = first;
  double total = 0.0;
  for (size_t turn = 0; turn < sample.follow_ups.size(); ++turn) {
    std::vector<int32_t> span = {token};
    span.insert(span.end(), prepared.follow_up_ids[turn].begin(),
                prepared.follow_up_ids[turn].end());
    token = model.forward_greedy(span);
    const std::string text = answer();
    outcome.prediction += " | " + text;
    total += eval::ruler_score(sample.task, text, sample.follow_ups[turn].answers);
  }
  outcome.score = sample.follow_ups.empty() ? 0.0 : total / sample.follow_ups.size();
  return outcome;
}

void run_eval(const EvalArgs& args, CLI::App* command) {
  const auto eval_start = Clock::now();
  // Everything the flags can get wrong is checked before the model loads.
  args.run.check();
  args.outputs.check();
  const std::vector<eval::RulerTask> tasks = parse_tasks(args.tasks);
  const std::vector<int> lengths = parse_token_counts("--lengths", args.lengths);
  const std::vector<int> budgets = parse_token_counts("--budgets", args.budgets);
  if (args.protocols.empty()) throw Error("--protocols: give at least one protocol");
  for (size_t i = 0; i < args.protocols.size(); ++i) {
    eval::eval_protocol_description(args.protocols[i]);  // Error for an unknown name
    if (std::find(args.protocols.begin(), args.protocols.begin() + static_cast<int64_t>(i),
                  args.protocols[i]) != args.protocols.begin() + static_cast<int64_t>(i)) {
      throw Error("--protocols: '" + args.protocols[i] + "' is given twice");
    }
  }
  const bool multi_turn =
      std::find(args.protocols.begin(), args.protocols.end(), "multi-turn") != args.protocols.end();
  const eval::RulerWordSet words = eval::parse_ruler_word_set(args.words);
  reject_flags(command, {"--base-budget", "--critiprefill-budget", "--decode-budget"},
               "eval gives every method the same budget; set the levels with --budgets");
  reject_flags(command, {"--prefill", "--decode"},
               "eval runs the methods named by --methods (prefill[+decode])");
  const AttentionConfig base = args.attention.resolve();
  // sparse_threshold follows the budget level unless the user set it.
  const bool threshold_given = sparse_threshold_given(command);
  const std::vector<AttentionConfig> method_configs = parse_methods_flag(args.methods, base);
  std::vector<PlannedRun> runs;
  for (size_t m = 0; m < args.methods.size(); ++m) {
    const std::string& method = args.methods[m];
    const AttentionConfig& config = method_configs[m];
    if (!has_budget(config)) {
      runs.push_back({method, 0, config});
      continue;
    }
    for (int budget : budgets) {
      runs.push_back({method, budget,
                      checked_budget_level(config, budget, !threshold_given, "--budgets", method)});
    }
  }
  if (args.model.empty()) throw Error("--model: give the model folder");
  if (!fs::is_directory(args.model)) {
    throw Error("model folder '" + args.model +
                "' does not exist (eval needs a Hugging Face folder with task_words.json)");
  }
  const std::string text_dir = find_text_dir(args.text_dir);
  args.run.apply_threads();

  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(args.model);
  const eval::RulerSources sources = eval::load_ruler_sources(args.model, text_dir, words);
  ModelWeights weights = args.run.load(args.model);
  const int longest = lengths.back();
  if (longest > weights.config.max_position_embeddings) {
    throw Error("--lengths: " + std::to_string(longest) + " tokens exceed the model's " +
                std::to_string(weights.config.max_position_embeddings) + "-token context");
  }
  const std::vector<int32_t> stop_ids = stop_token_ids(weights.config, *tokenizer);

  // The samples, made once and fed to every run.
  std::vector<PreparedSample> samples;
  int64_t tokens_per_run = 0;
  {
    const auto start = Clock::now();
    for (eval::RulerTask task : tasks) {
      for (int length : lengths) {
        std::fprintf(stderr, "\rpreparing samples: %s at %d tokens%s",
                     eval::ruler_task_name(task).c_str(), length,
                     isatty(STDERR_FILENO) ? "\033[K" : "\n");
        std::fflush(stderr);
        for (int i = 0; i < args.samples; ++i) {
          eval::RulerSample sample = eval::make_ruler_sample(task, length, args.first_sample + i,
                                                             args.seed, *tokenizer, sources);
          PreparedSample prepared;
          prepared.ids = prompt_token_ids(*tokenizer, sample.prompt);
          // The prompt is the context, a newline and the question (ruler_tasks.h).
          const std::string context =
              sample.prompt.substr(0, sample.prompt.size() - sample.question.size());
          prepared.context_ids = prompt_token_ids(*tokenizer, context);
          prepared.question_ids = tokenizer->encode(sample.question, EncodeOptions{});
          for (const eval::RulerSample::Turn& turn : sample.follow_ups) {
            prepared.follow_up_ids.push_back(
                tokenizer->encode("\n" + turn.question, EncodeOptions{}));
          }
          tokens_per_run += static_cast<int64_t>(prepared.ids.size());
          prepared.sample = std::move(sample);
          samples.push_back(std::move(prepared));
        }
      }
    }
    std::fprintf(stderr, "\rprepared %zu samples in %.1f s%s\n", samples.size(),
                 seconds_since(start), isatty(STDERR_FILENO) ? "\033[K" : "");
  }

  // Answers are at most a few dozen tokens; multi-turn adds its follow-ups past the prompt.
  int64_t extra = 0;
  if (multi_turn) {
    for (const PreparedSample& prepared : samples)
      extra = std::max(extra, multi_turn_extra_tokens(prepared));
  }
  const int64_t context = static_cast<int64_t>(longest) + extra;
  if (context > weights.config.max_position_embeddings) {
    throw Error("--protocols multi-turn: the follow-up questions need " + std::to_string(extra) +
                " tokens past the longest length, beyond the model's " +
                std::to_string(weights.config.max_position_embeddings) +
                "-token context; give shorter --lengths");
  }
  const std::unique_ptr<LanguageModel> model =
      open_language_model(args.run, weights, static_cast<int>(context), runs.front().config,
                          /*decode_room=*/static_cast<int>(64 + extra));
  const std::string device_name = model->device_name();

  eval::EvalReport report;
  report.date = utc_date();
  report.command = command_line();
  report.model = args.model;
  report.device = device_name;
  report.seed = args.seed;
  report.samples_per_cell = args.samples;
  for (eval::RulerTask task : tasks) report.tasks.push_back(eval::ruler_task_name(task));
  report.lengths = lengths;
  report.budgets = budgets;
  report.methods = args.methods;
  report.protocols = args.protocols;
  report.notes = budget_notes(!threshold_given, base.prefill_params.sparse_threshold);
  for (const std::string& note : where_methods_stay_dense(runs, tasks, lengths)) {
    report.notes += "\n\nNote: " + note;
    std::fprintf(stderr, "note: %s\n", note.c_str());
  }

  std::fprintf(stderr, "%zu runs of %zu samples each (%d per task and length):\n", runs.size(),
               samples.size(), args.samples);
  for (const PlannedRun& run : runs) {
    std::fprintf(stderr, "  %s%s: %s\n", run.method.c_str(),
                 run.budget > 0 ? (" @ " + std::to_string(run.budget)).c_str() : " (no budget)",
                 describe_config(run.config).c_str());
  }

  // Multi-turn runs only the samples that have follow-up questions.
  const auto runs_sample = [](const std::string& protocol, const PreparedSample& prepared) {
    return protocol != "multi-turn" || !prepared.sample.follow_ups.empty();
  };
  int64_t total_samples = 0, total_tokens = 0;
  for (const std::string& protocol : args.protocols) {
    for (const PreparedSample& prepared : samples) {
      if (!runs_sample(protocol, prepared)) continue;
      total_samples += static_cast<int64_t>(runs.size());
      total_tokens += static_cast<int64_t>(runs.size() * prepared.ids.size());
    }
  }
  (void)tokens_per_run;
  EvalProgress progress(total_samples, total_tokens);
  for (const std::string& protocol : args.protocols) {
    for (const PlannedRun& planned : runs) {
      const std::string run_label =
          planned.method + (planned.budget > 0 ? " @" + std::to_string(planned.budget) : "") +
          (args.protocols.size() > 1 ? " [" + protocol + "]" : "");
      model->set_attention(planned.config);
      eval::EvalRun run;
      run.method = planned.method;
      run.budget = planned.budget;
      run.protocol = protocol;
      run.attention = attention_config_to_json(planned.config);
      const auto run_start = Clock::now();
      for (size_t i = 0; i < samples.size(); ++i) {
        const PreparedSample& prepared = samples[i];
        const eval::RulerSample& sample = prepared.sample;
        if (!runs_sample(protocol, prepared)) continue;
        const auto start = Clock::now();
        const SampleOutcome outcome = run_sample(*model, prepared, protocol, stop_ids, *tokenizer);
        eval::EvalSampleResult result;
        result.task = eval::ruler_task_name(sample.task);
        result.length = sample.length;
        result.index = sample.index;
        result.prompt_tokens = static_cast<int>(prepared.ids.size());
        result.answers = sample.answers;
        if (protocol == "multi-turn") {
          result.answers.clear();
          for (const eval::RulerSample::Turn& turn : sample.follow_ups)
            result.answers.insert(result.answers.end(), turn.answers.begin(), turn.answers.end());
        }
        result.prediction = outcome.prediction;
        result.score = outcome.score;
        result.seconds = seconds_since(start);
        result.prefill_keys_fraction = outcome.after_prefill.prefill_keys;
        result.cache_kept_fraction = work_fractions(model->attention_work()).cache_kept;
        const std::string cell = result.task + " " + std::to_string(sample.length);
        run.samples.push_back(std::move(result));

        progress.sample_done(static_cast<int64_t>(prepared.ids.size()), run_label + " | " + cell);
        const bool cell_ends = i + 1 == samples.size() ||
                               samples[i + 1].sample.task != sample.task ||
                               samples[i + 1].sample.length != sample.length;
        if (cell_ends) {
          char accuracy[64];
          std::snprintf(accuracy, sizeof(accuracy), ": %.1f%%",
                        eval::cell_accuracy(run, run.samples.back().task, sample.length));
          progress.cell_done(run_label + " | " + cell + accuracy);
        }
      }
      run.seconds = seconds_since(run_start);
      char line[256];
      std::snprintf(line, sizeof(line), "%s: mean accuracy %.1f%% in %s", run_label.c_str(),
                    eval::run_accuracy(report, run), format_duration(run.seconds).c_str());
      report.runs.push_back(std::move(run));
      progress.message(line);
    }
  }
  progress.finish();

  args.outputs.write(report);
  std::fprintf(stderr, "eval finished in %s; peak memory %.0f MiB\n",
               format_duration(seconds_since(eval_start)).c_str(), peak_resident_mib());
}

}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* command = app.add_subcommand(
      "eval",
      "RULER-style accuracy of the attention methods at matched budgets (tasks of "
      "training/TASKS.md)");
  command
      ->add_option("-m,--model", args->model,
                   "Hugging Face model folder (with task_words.json, the tasks' word pools)")
      ->required();
  command
      ->add_option("--tasks", args->tasks,
                   "Tasks, or all: niah_single, niah_multikey, niah_multivalue, niah_multiquery, "
                   "vt, cwe, fwe")
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--lengths", args->lengths, "Prompt lengths in tokens (4096 or 4k)")
      ->check(token_count())
      ->delimiter(',')
      ->capture_default_str();
  command->add_option("--samples", args->samples, "Samples per task and length")
      ->check(integer_in(1, 1000000))
      ->capture_default_str();
  command
      ->add_option("--first-sample", args->first_sample,
                   "Index of the first sample of each task and length: shards of one evaluation "
                   "run different indices, and `eval-report` merges their --json files")
      ->check(integer_in(0, 1000000))
      ->capture_default_str();
  command->add_option("--seed", args->seed, "Base seed of the samples (TASKS.md section 2)")
      ->check(seed_value())
      ->capture_default_str();
  add_methods_option(command, &args->methods);
  command
      ->add_option("--protocols", args->protocols,
                   "How prompts meet the cache: query-aware (context and question prefilled "
                   "together), context-first (the context prefilled, and compressed where the "
                   "method compresses after a prompt, before the question), multi-turn (each "
                   "follow-up question of niah_multikey/multiquery answered in turn)")
      ->delimiter(',')
      ->capture_default_str();
  command
      ->add_option("--budgets", args->budgets,
                   "Budget levels, tokens per KV head, applied to every method at once: prefill "
                   "base_budget and critiprefill_budget, decode budget K (and sparse_threshold "
                   "unless --sparse-threshold is given)")
      ->check(token_count())
      ->delimiter(',')
      ->capture_default_str();
  command
      ->add_option("--words", args->words,
                   "Word pools: all (the evaluation's) or heldout (words never seen in training)")
      ->capture_default_str();
  command->add_option("--text-dir", args->text_dir,
                      "Folder with janeausten/persuasion.txt, the haystack (default: "
                      "shared/assets/text found above the current directory or the executable)");
  add_report_outputs(command, &args->outputs);
  args->run.add_to(command);
  args->attention.add_to(command);
  command->callback([args, command] { run_eval(*args, command); });

  // The report again from an eval's --json file, with no model: the markdown, JSON and plots as
  // this build draws them (after the report's code changed, or to pick the plots up later).
  auto report_args = std::make_shared<std::pair<std::vector<std::string>, ReportOutputs>>();
  CLI::App* report_command = app.add_subcommand(
      "eval-report",
      "The report of an earlier `eval` from its --json file, drawn again; several files (shards "
      "of one evaluation, run with --first-sample) are merged into one report");
  report_command
      ->add_option("reports", report_args->first,
                   "JSON files written by `entropyinfer eval --json`")
      ->required();
  add_report_outputs(report_command, &report_args->second);
  report_command->callback([report_args] {
    report_args->second.check();
    std::vector<eval::EvalReport> shards;
    for (const std::string& path : report_args->first) {
      const nlohmann::json json = read_json_file(path, "eval report");
      try {
        shards.push_back(eval::eval_report_from_json(json));
      } catch (const Error& error) {
        throw Error(std::string(error.what()) + " (in '" + path + "')");
      }
    }
    report_args->second.write(eval::merge_eval_reports(shards));
  });
}

}  // namespace entropyinfer::cli

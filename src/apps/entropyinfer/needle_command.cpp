// `entropyinfer needle`: the long-context demo. One needle question over a long document (a
// niah_single sample of training/TASKS.md, built from a seed), answered greedily under each
// attention method, with the answer, the time to first token and the fraction of full attention's
// work each method did.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "apps/entropyinfer/model_commands.h"
#include "attention/entropy_prefill.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "core/user_file.h"
#include "eval/ruler_tasks.h"
#include "model/model_config.h"

namespace entropyinfer::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kDefaultModel = "models/needle-llama-11m";

struct NeedleArgs {
  std::string model;
  std::string length = "16384";
  int index = 0;
  uint64_t seed = 0;
  std::vector<std::string> methods = {"full", "entropy+latent"};
  std::string budget;
  std::string text_dir;
  std::string json_path;
  DeviceFlags run;
  AttentionOptions attention;
};

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * fraction);
  return text;
}

// Seconds as people read them: milliseconds under one second (a GPU answers the demo's question in
// a few), else seconds.
std::string seconds(double value) {
  char text[32];
  if (value < 1) {
    std::snprintf(text, sizeof(text), "%.1f ms", 1e3 * value);
  } else {
    std::snprintf(text, sizeof(text), value < 10 ? "%.2f s" : "%.1f s", value);
  }
  return text;
}

// The model folder: -m if given, else the shipped model found above the current directory or the
// executable.
std::string find_model(const std::string& given) {
  std::string folder = given;
  if (folder.empty()) {
    const std::optional<fs::path> found = find_above_cwd_or_executable(kDefaultModel);
    if (!found) {
      throw Error(std::string("the default model ") + kDefaultModel +
                  " was not found in the current directory, the executable's, or a parent of "
                  "either: pass -m <model folder>");
    }
    std::error_code error;
    const fs::path relative = fs::relative(*found, fs::current_path(), error);
    folder = error || relative.empty() ? found->string() : relative.string();
  }
  if (!fs::is_directory(folder)) {
    throw Error(
        "model folder '" + folder +
        "' does not exist (needle needs a Hugging Face folder with task_words.json, such as "
        "the shipped " +
        kDefaultModel + ")");
  }
  return folder;
}

struct Haystack {
  eval::RulerSources sources;
  std::string description;  // what the document is made of, for the header
  std::string note;         // said once, when the text was not found
};

// Persuasion as in eval; without --text-dir and with no shared assets in sight, RULER's noise
// haystack, which needs no file.
Haystack load_haystack(const std::string& model, const std::string& given_text_dir) {
  Haystack haystack;
  std::string text_dir = given_text_dir;
  if (text_dir.empty()) {
    const auto found = find_above_cwd_or_executable(fs::path("shared") / "assets" / "text");
    if (found && fs::exists(*found / "janeausten" / "persuasion.txt")) text_dir = found->string();
  }
  if (text_dir.empty()) {
    haystack.sources = eval::load_ruler_noise_sources(model);
    haystack.description = "RULER's noise haystack, one line repeated";
    haystack.note =
        "janeausten/persuasion.txt was not found (no shared/assets/text above the current "
        "directory or the executable), so the document is RULER's noise haystack; pass "
        "--text-dir for the Persuasion one";
  } else {
    haystack.sources = eval::load_ruler_sources(model, text_dir);
    haystack.description = "Jane Austen's Persuasion";
  }
  return haystack;
}

// Where the sample's one needle is: its sentence and how many tokens of the prompt come before it.
struct NeedlePlace {
  std::string sentence;
  std::string question;
  int tokens_before = 0;  // BOS included
  int document_tokens = 0;
};

NeedlePlace locate_needle(const eval::RulerSample& sample, const Tokenizer& tokenizer) {
  const std::string& prompt = sample.prompt;
  if (sample.needles.size() != 1 || !prompt.ends_with(sample.question)) {
    throw Error("needle expects a niah_single sample: one needle, the question last");
  }
  NeedlePlace place;
  place.sentence = sample.needles[0];
  place.question = sample.question;
  const size_t question_at = prompt.size() - sample.question.size();
  size_t at = prompt.starts_with(place.sentence) ? 0 : prompt.find("\n" + place.sentence);
  if (at == std::string::npos)
    throw Error("the needle '" + place.sentence + "' is not in the prompt");
  if (at > 0) ++at;  // past the newline
  auto tokens = [&](const std::string& text) {
    return 1 + static_cast<int>(tokenizer.encode(text, EncodeOptions{}).size());
  };
  place.tokens_before = at > 0 ? tokens(prompt.substr(0, at)) : 1;
  place.document_tokens = question_at > 0 ? tokens(prompt.substr(0, question_at - 1)) : 1;
  return place;
}

// Why a sparse prefill read every key anyway (no sparse segment in so short a prompt), or empty.
std::string dense_prefill_reason(const AttentionConfig& config, int64_t prompt_tokens,
                                 bool budget_given) {
  if (config.prefill == PrefillMethod::kFull) return "";
  const PrefillParams& p = config.prefill_params;
  const int64_t segments = (prompt_tokens + p.segment_size - 1) / p.segment_size;
  for (int64_t s = 0; s < segments; ++s) {
    if (segment_is_sparse(s, segments, p.segment_size, p.sparse_threshold)) return "";
  }
  return "no sparse segment: segments of " + std::to_string(p.segment_size) +
         " starting before sparse_threshold " + std::to_string(p.sparse_threshold) +
         " and the last one run dense" +
         (budget_given ? std::string() : "; --budget B moves the threshold to B");
}

// The decode cache after the answer, or why it was not compressed.
std::string describe_decode_cache(const AttentionConfig& config, const WorkFractions& work,
                                  int decode_steps) {
  if (config.decode == DecodeMethod::kFull) return "decode cache: all kept (decode full)";
  const std::string method = decode_method_name(config.decode);
  if (work.compressed) return "decode cache: " + method + " kept " + percent(work.cache_kept);
  if (config.decode == DecodeMethod::kLatent) {
    return "decode cache: not compressed (latent compresses after G = " +
           std::to_string(config.decode_params.gap) + " decode steps; this answer took " +
           std::to_string(decode_steps) + ")";
  }
  return "decode cache: not compressed";
}

struct MethodResult {
  std::string method;
  AttentionConfig config;
  std::string answer;
  bool correct = false;
  double first_token_seconds = 0;
  double total_seconds = 0;
  int generated_tokens = 0;
  WorkFractions prefill_work;
  WorkFractions final_work;
  std::string prefill_note;
  std::string cache_line;
};

// Progress of one prefill on stderr: a line updated in place on a terminal, one line in a log.
class PrefillStatus {
 public:
  PrefillStatus(size_t tokens, const std::string& method)
      : terminal_(isatty(STDERR_FILENO) != 0),
        text_("prefilling " + std::to_string(tokens) + " tokens with " + method + "...") {
    std::fprintf(stderr, terminal_ ? "%s" : "%s\n", text_.c_str());
    std::fflush(stderr);
  }
  LanguageModel::ProgressCallback callback() {
    return [this](int64_t done, int64_t total) {
      if (!terminal_) return;
      std::fprintf(stderr, "\r%s %3d%%\033[K", text_.c_str(),
                   static_cast<int>(100 * done / std::max<int64_t>(total, 1)));
      std::fflush(stderr);
    };
  }
  ~PrefillStatus() {
    if (terminal_) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool terminal_;
  std::string text_;
};

void run_needle(const NeedleArgs& args, CLI::App* command) {
  if (!args.json_path.empty()) check_output_file(args.json_path, "--json file");
  // Everything the flags can get wrong is checked before the model loads.
  args.run.check();
  const int length = parse_token_count("--length", args.length);
  reject_flags(command, {"--prefill", "--decode"},
               "needle runs the methods named by --methods (prefill[+decode])");
  const bool budget_given = command->get_option("--budget")->count() > 0;
  if (budget_given) {
    reject_flags(command, {"--base-budget", "--critiprefill-budget", "--decode-budget"},
                 "--budget already sets every method's budget; give one or the other");
  }
  const AttentionConfig base = args.attention.resolve();
  std::vector<AttentionConfig> configs = parse_methods_flag(args.methods, base);
  if (budget_given) {
    const int budget = parse_token_count("--budget", args.budget);
    const bool threshold_given = sparse_threshold_given(command);
    for (size_t m = 0; m < configs.size(); ++m) {
      if (!has_budget(configs[m])) continue;
      configs[m] =
          checked_budget_level(configs[m], budget, !threshold_given, "--budget", args.methods[m]);
    }
  }
  const std::string model_folder = find_model(args.model);
  const ModelConfig model_config = load_hf_config(model_folder + "/config.json");
  if (length > model_config.max_position_embeddings) {
    throw Error("--length " + std::to_string(length) + ": more than the model's " +
                std::to_string(model_config.max_position_embeddings) + "-token context");
  }
  args.run.apply_threads();

  const Haystack haystack = load_haystack(model_folder, args.text_dir);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(model_folder);
  eval::RulerSample sample;
  try {
    sample = eval::make_ruler_sample(eval::RulerTask::kNiahSingle, length, args.index, args.seed,
                                     *tokenizer, haystack.sources);
  } catch (const Error& error) {
    throw Error(
        "--length " + std::to_string(length) +
        " is too short: the needle and the question do not fit in the " +
        std::to_string(length - eval::ruler_generation_tokens(eval::RulerTask::kNiahSingle)) +
        " tokens left beside the answer's (" + error.what() + ")");
  }
  const std::vector<int32_t> ids = prompt_token_ids(*tokenizer, sample.prompt);
  const NeedlePlace place = locate_needle(sample, *tokenizer);
  const std::string expected = eval::ruler_word_list(sample.answers);
  if (!haystack.note.empty()) std::fprintf(stderr, "note: %s\n", haystack.note.c_str());

  ModelWeights weights = args.run.load(model_folder);
  const std::vector<int32_t> stop_ids = stop_token_ids(weights.config, *tokenizer);
  // Answers are at most a few dozen tokens.
  const std::unique_ptr<LanguageModel> model =
      open_language_model(args.run, weights, length, configs.front(), /*decode_room=*/64);
  const std::string device_name = model->device_name();

  const double depth = static_cast<double>(place.tokens_before - 1) /
                       static_cast<double>(std::max(place.document_tokens - 1, 1));
  std::printf("model     %s (%s, %d layers, %d/%d heads, %d-token context) on %s\n",
              model_folder.c_str(), model_config.architecture.c_str(), model_config.num_layers,
              model_config.num_heads, model_config.num_kv_heads,
              model_config.max_position_embeddings, device_name.c_str());
  std::printf("document  %zu prompt tokens of %s (niah_single sample %d, seed %llu)\n", ids.size(),
              haystack.description.c_str(), args.index, static_cast<unsigned long long>(args.seed));
  std::printf("needle    \"%s\" at token %d, %.0f%% into the document\n", place.sentence.c_str(),
              place.tokens_before, 100.0 * depth);
  std::printf("question  \"%s\" -> expected \"%s\"\n", place.question.c_str(), expected.c_str());
  std::fflush(stdout);

  // A short prompt first, so that the first timed method does not pay for the threads' start. On
  // the GPU each method first runs the whole prompt once: the matrix products set up each shape
  // (the prompt's last, shorter chunk among them) and pick their cuBLASLt algorithms on first use,
  // which would otherwise land in whichever method meets a shape first.
  const bool gpu = args.run.device == "cuda";
  const size_t warm_tokens = gpu ? ids.size() : std::min<size_t>(ids.size(), 64);
  for (size_t m = 0; m < (gpu ? configs.size() : 1); ++m) {
    model->set_attention(configs[m]);
    model->reset();
    model->forward_greedy(std::span<const int32_t>(ids.data(), warm_tokens));
  }

  size_t name_width = 0;
  for (const std::string& method : args.methods) name_width = std::max(name_width, method.size());
  std::vector<MethodResult> results;
  for (size_t m = 0; m < configs.size(); ++m) {
    MethodResult result;
    result.method = args.methods[m];
    result.config = configs[m];
    model->set_attention(result.config);
    std::vector<int32_t> generated;
    int decode_steps = 0;
    {
      PrefillStatus status(ids.size(), result.method);
      model->set_progress_callback(status.callback());
      const auto start = Clock::now();
      model->reset();
      int32_t token = model->forward_greedy(ids);
      result.first_token_seconds = seconds_since(start);
      model->set_progress_callback(nullptr);
      result.prefill_work = work_fractions(model->attention_work());
      // At most the task's G tokens, stopping at EOS or at the end of the answer's line.
      for (int step = 0; step < sample.max_new_tokens; ++step) {
        if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) break;
        if (token >= 0 && token < tokenizer->vocab_size()) generated.push_back(token);
        result.answer = tokenizer->decode(generated);
        if (result.answer.find('\n') != std::string::npos) break;
        if (step + 1 == sample.max_new_tokens) break;
        token = model->forward_greedy(std::span<const int32_t>(&token, 1));
        ++decode_steps;
      }
      result.total_seconds = seconds_since(start);
    }
    result.answer = result.answer.substr(0, result.answer.find('\n'));
    result.generated_tokens = static_cast<int>(generated.size());
    result.correct = eval::ruler_score(sample.task, result.answer, sample.answers) == 1.0;
    result.final_work = work_fractions(model->attention_work());
    result.prefill_note =
        dense_prefill_reason(result.config, static_cast<int64_t>(ids.size()), budget_given);
    result.cache_line = describe_decode_cache(result.config, result.final_work, decode_steps);

    std::printf("%-*s  \"%s\" %s | first token %s | prefill attention work %s%s | %s\n",
                static_cast<int>(name_width), result.method.c_str(), result.answer.c_str(),
                result.correct ? "right" : "WRONG", seconds(result.first_token_seconds).c_str(),
                percent(result.prefill_work.prefill_keys).c_str(),
                result.prefill_note.empty() ? "" : (" (" + result.prefill_note + ")").c_str(),
                result.cache_line.c_str());
    std::fflush(stdout);
    results.push_back(std::move(result));
  }

  // Time to first token against full attention (or, without it, against the first method).
  const auto reference = std::find_if(results.begin(), results.end(), [](const MethodResult& r) {
    return r.config.prefill == PrefillMethod::kFull && r.config.decode == DecodeMethod::kFull;
  });
  const MethodResult& baseline = reference != results.end() ? *reference : results.front();
  std::ostringstream summary;
  summary << "time to first token:";
  for (size_t i = 0; i < results.size(); ++i) {
    const MethodResult& result = results[i];
    summary << (i ? ", " : " ") << result.method << " " << seconds(result.first_token_seconds);
    if (&result != &baseline && result.first_token_seconds > 0) {
      const double speedup = baseline.first_token_seconds / result.first_token_seconds;
      char ratio[96];
      if (speedup >= 0.995 && speedup < 1.005) {
        std::snprintf(ratio, sizeof(ratio), " (as fast as %s)", baseline.method.c_str());
      } else {
        std::snprintf(ratio, sizeof(ratio), " (%.2fx %s than %s)",
                      speedup >= 1 ? speedup : 1 / speedup, speedup >= 1 ? "faster" : "slower",
                      baseline.method.c_str());
      }
      summary << ratio;
    }
  }
  std::printf("%s\n", summary.str().c_str());
  std::fflush(stdout);

  if (!args.json_path.empty()) {
    nlohmann::json json;
    json["model"] = model_folder;
    json["device"] = device_name;
    json["length"] = length;
    json["prompt_tokens"] = ids.size();
    json["index"] = args.index;
    json["seed"] = args.seed;
    json["haystack"] = haystack.sources.noise_haystack ? "noise" : "persuasion";
    json["needle"] = place.sentence;
    json["needle_token"] = place.tokens_before;
    json["needle_depth"] = depth;
    json["question"] = place.question;
    json["answers"] = sample.answers;
    for (const MethodResult& result : results) {
      nlohmann::json entry;
      entry["method"] = result.method;
      entry["attention"] = attention_config_to_json(result.config);
      entry["answer"] = result.answer;
      entry["correct"] = result.correct;
      entry["generated_tokens"] = result.generated_tokens;
      entry["first_token_seconds"] = result.first_token_seconds;
      entry["total_seconds"] = result.total_seconds;
      entry["prefill_keys_fraction"] = result.prefill_work.prefill_keys;
      entry["compressed"] = result.final_work.compressed;
      entry["cache_kept_fraction"] = result.final_work.cache_kept;
      json["methods"].push_back(std::move(entry));
    }
    // A model can generate bytes that are not UTF-8 (a token that ends mid-character).
    write_user_file(args.json_path, "--json file",
                    json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void register_needle(CLI::App& app) {
  auto args = std::make_shared<NeedleArgs>();
  CLI::App* command = app.add_subcommand(
      "needle",
      "Long-context demo: one needle question over a long document, answered with each attention "
      "method (answer, time to first token, fraction of attention work)");
  command->add_option("-m,--model", args->model,
                      std::string("Hugging Face model folder with task_words.json (default: ") +
                          kDefaultModel + " above the current directory or the executable)");
  command->add_option("--length", args->length, "Prompt length in tokens (16384 or 16k)")
      ->check(token_count())
      ->capture_default_str();
  command->add_option("--index", args->index, "Which niah_single sample (TASKS.md section 2)")
      ->check(integer_in(0, 1000000))
      ->capture_default_str();
  command->add_option("--seed", args->seed, "Base seed of the sample")
      ->check(seed_value())
      ->capture_default_str();
  add_methods_option(command, &args->methods);
  command
      ->add_option("--budget", args->budget,
                   "Tokens per KV head for every method, as eval applies a budget level: prefill "
                   "base_budget "
                   "and critiprefill_budget, decode budget K, and sparse_threshold unless "
                   "--sparse-threshold "
                   "is given (default: the released parameters)")
      ->check(token_count());
  command->add_option("--text-dir", args->text_dir,
                      "Folder with janeausten/persuasion.txt, the haystack (default: "
                      "shared/assets/text found above the current directory or the executable; "
                      "without it, RULER's noise haystack)");
  command->add_option("--json", args->json_path, "Write the sample and every method's result");
  args->run.add_to(command);
  args->attention.add_to(command);
  command->callback([args, command] { run_needle(*args, command); });
}

}  // namespace entropyinfer::cli

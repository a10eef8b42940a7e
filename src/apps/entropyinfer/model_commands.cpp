#include "apps/entropyinfer/model_commands.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "apps/entropyinfer/cli_common.h"
#include "core/error.h"
#include "core/json_reader.h"
#include "core/user_file.h"
#include "model/quantize_weights.h"

namespace entropyinfer::cli {
namespace {

namespace fs = std::filesystem;

}  // namespace

WorkFractions work_fractions(const AttentionWork& work) {
  WorkFractions fractions;
  if (work.prefill_keys_dense > 0) {
    fractions.prefill_keys =
        static_cast<double>(work.prefill_keys_read) / static_cast<double>(work.prefill_keys_dense);
  }
  if (work.compressed && work.cache_entries_before > 0) {
    fractions.cache_kept = static_cast<double>(work.cache_entries_after) /
                           static_cast<double>(work.cache_entries_before);
  }
  fractions.compressed = work.compressed;
  return fractions;
}

void DeviceFlags::add_to(CLI::App* command) {
  command->add_option("--device", device, "cpu or cuda (CUDA builds)")->capture_default_str();
  command->add_option("--threads", threads, "CPU threads (default: OpenMP's)")
      ->check(integer_in(1, kMaxThreads));
  command->add_option("--chunk", chunk_tokens, "cuda: prompt tokens per matrix-product pass")
      ->check(integer_in(1, kMaxTokenCount))
      ->capture_default_str();
  command
      ->add_option("--weights", weights,
                   "as-stored, or fp8: the projections quantized at load (E4M3, one scale per "
                   "output channel, inputs quantized per token)")
      ->check(CLI::IsMember({"as-stored", "fp8"}))
      ->capture_default_str();
  command
      ->add_option("--kv-cache", kv_cache,
                   "auto (the executor's own precision: fp32 on cpu, bf16 on cuda), or fp8: "
                   "E4M3 with one scale per cached row of each head")
      ->check(CLI::IsMember({"auto", "fp8"}))
      ->capture_default_str();
  command
      ->add_option("--prompt-attention", prompt_attention,
                   "cuda: the precision of prompt attention: auto (FP8 for dense attention with "
                   "--kv-cache fp8, on Hopper), bf16, or fp8 (also the sparse methods' "
                   "block-sparse attention; Hopper, head_dim 64 or 128)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}))
      ->capture_default_str();
}

ModelWeights DeviceFlags::load(const std::string& path) const {
  ModelWeights loaded = load_model_with_progress(path);
  if (weights == "fp8") quantize_weights_fp8(loaded);
  return loaded;
}

void DeviceFlags::check() const {
  const Device parsed = parse_device(device);
  parse_prompt_attention(prompt_attention);
  if (parsed == Device::kCpu && prompt_attention != "auto") {
    throw Error("--prompt-attention " + prompt_attention +
                " needs --device cuda (the CPU attends in fp32)");
  }
  check_device(parsed);
}

void DeviceFlags::apply_threads() const {
  if (threads > 0) omp_set_num_threads(threads);
}

std::unique_ptr<LanguageModel> open_language_model(const DeviceFlags& flags, ModelWeights& weights,
                                                   int context, const AttentionConfig& first,
                                                   int decode_room) {
  flags.check();
  EngineOptions options;
  options.device = parse_device(flags.device);
  options.context_length = context;
  options.attention = first;
  options.chunk_tokens = flags.chunk_tokens;
  options.decode_room = decode_room;
  options.fp8_kv_cache = flags.fp8_kv_cache();
  options.prompt_attention = parse_prompt_attention(flags.prompt_attention);
  options.upload_progress = [last_percent = -1](int64_t done, int64_t total) mutable {
    // A terminal gets a line that updates in place; a log gets only the final line.
    const int percent = static_cast<int>(100 * done / std::max<int64_t>(total, 1));
    const bool finished = done == total;
    if ((isatty(STDERR_FILENO) && percent != last_percent) || finished) {
      std::fprintf(stderr, "\ruploading to the GPU: %3d%% of %.1f MiB%s", percent,
                   total / 1048576.0, finished ? "\n" : "");
      std::fflush(stderr);
    }
    last_percent = percent;
  };
  std::unique_ptr<LanguageModel> model = make_language_model(weights, options);
  const std::string memory = model->memory_description();
  if (!memory.empty()) std::fprintf(stderr, "%s\n", memory.c_str());
  if (options.device == Device::kCuda) weights = ModelWeights{};  // the GPU holds its own copy
  return model;
}

std::vector<int32_t> stop_token_ids(const ModelConfig& config, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids(config.eos_token_ids.begin(), config.eos_token_ids.end());
  for (int32_t id : tokenizer.eos_ids()) ids.push_back(id);
  return ids;
}

void add_methods_option(CLI::App* command, std::vector<std::string>* methods) {
  command
      ->add_option("--methods", *methods,
                   "Attention methods, prefill[+decode] each (prefill: full, entropy, "
                   "critiprefill; decode: full, latent, snapkv, adakv, streaming, pyramidkv)")
      ->delimiter(',')
      ->capture_default_str();
}

std::vector<AttentionConfig> parse_methods_flag(const std::vector<std::string>& methods,
                                                const AttentionConfig& base) {
  if (methods.empty()) throw Error("--methods: give at least one method");
  std::vector<AttentionConfig> configs;
  std::set<std::string> seen;
  for (const std::string& method : methods) {
    if (!seen.insert(method).second) throw Error("--methods: '" + method + "' is given twice");
    try {
      configs.push_back(with_methods(method, base));
    } catch (const Error& error) {
      throw Error("--methods: '" + method + "': " + error.what());
    }
  }
  return configs;
}

bool has_budget(const AttentionConfig& config) {
  return config.prefill != PrefillMethod::kFull || config.decode != DecodeMethod::kFull;
}

AttentionConfig at_budget_level(AttentionConfig config, int budget, bool scale_threshold) {
  config.prefill_params.base_budget = budget;
  config.prefill_params.critiprefill_budget = budget;
  config.decode_params.budget = budget;
  if (scale_threshold) config.prefill_params.sparse_threshold = budget;
  return config;
}

AttentionConfig checked_budget_level(const AttentionConfig& config, int budget,
                                     bool scale_threshold, const std::string& flag,
                                     const std::string& method) {
  const AttentionConfig level = at_budget_level(config, budget, scale_threshold);
  try {
    level.validate();
  } catch (const Error& error) {
    throw Error(flag + " " + std::to_string(budget) + " with '" + method + "': " + error.what());
  }
  return level;
}

void reject_flags(CLI::App* command, std::initializer_list<const char*> flags,
                  const std::string& why) {
  for (const char* flag : flags) {
    if (command->get_option(flag)->count() > 0) throw Error(std::string(flag) + ": " + why);
  }
}

std::vector<int32_t> prompt_token_ids(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int32_t> ids;
  if (const std::optional<int32_t> bos = tokenizer.bos_id()) ids.push_back(*bos);
  EncodeOptions encode;
  encode.add_bos = false;
  encode.parse_special = false;
  for (int32_t id : tokenizer.encode(prompt, encode)) ids.push_back(id);
  return ids;
}

bool sparse_threshold_given(CLI::App* command) {
  bool given = command->get_option("--sparse-threshold")->count() > 0;
  if (const CLI::Option* file = command->get_option("--attention-config"); file->count() > 0) {
    // The file is read again, and its errors reported, by load_attention_config.
    const nlohmann::json json = read_json_file(file->as<std::string>(), "attention config");
    given = given || (json.is_object() &&
                      (json.contains("sparse_threshold") ||
                       (json.contains("prefill_params") && json["prefill_params"].is_object() &&
                        json["prefill_params"].contains("sparse_threshold"))));
  }
  return given;
}

std::optional<fs::path> find_above_cwd_or_executable(const fs::path& relative) {
  std::vector<fs::path> starts = {fs::current_path()};
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  if (!error) starts.push_back(executable.parent_path());
  for (fs::path folder : starts) {
    while (true) {
      const fs::path candidate = folder / relative;
      if (fs::is_directory(candidate)) return candidate;
      if (folder == folder.parent_path() || folder.empty()) break;
      folder = folder.parent_path();
    }
  }
  return std::nullopt;
}

std::string find_text_dir(const std::string& given) {
  if (!given.empty()) return given;
  if (const auto found = find_above_cwd_or_executable(fs::path("shared") / "assets" / "text")) {
    return found->string();
  }
  throw Error(
      "no shared/assets/text folder found above the current directory or the executable: pass "
      "--text-dir (the folder holding janeausten/persuasion.txt)");
}

}  // namespace entropyinfer::cli

// What the commands that run a model share: the --device flags and opening the model on that
// device (engine/language_model.h), the --methods and budget-level rules, token counts written as
// 4096 or 4k, and finding the shared assets and the shipped model beside the checkout.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "apps/entropyinfer/flag_checks.h"
#include "attention/attention_config.h"
#include "engine/language_model.h"
#include "model/model_weights.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::cli {

// Work of the last generation as fractions of full attention's.
struct WorkFractions {
  double prefill_keys = 1.0;  // keys the prefill read / keys full causal attention reads
  double cache_kept = 1.0;    // decode cache entries after / before compression (1 without it)
  bool compressed = false;    // whether the decode policy has compressed the cache yet
};

// The work fractions of what a model's attention policies did in its last generation.
WorkFractions work_fractions(const AttentionWork& work);

// --device, --threads, --chunk, --weights and --kv-cache, which every command that runs a model
// takes alike.
struct DeviceFlags {
  // Far above any CPU this runs on; OpenMP crashes creating 100,000 threads.
  static constexpr int kMaxThreads = 1024;
  std::string device = "cpu";
  int threads = 0;                         // CPU threads; 0 leaves OpenMP's default
  int chunk_tokens = kDefaultChunkTokens;  // cuda: prompt tokens per matrix-product pass
  std::string weights = "as-stored";       // or "fp8": quantized at load
  std::string kv_cache = "auto";           // the executor's own precision, or "fp8"
  std::string prompt_attention = "auto";   // cuda: auto, bf16 or fp8

  void add_to(CLI::App* command);
  // The model at `path` (with load progress on stderr), quantized as --weights says.
  ModelWeights load(const std::string& path) const;
  // Error for a device other than "cpu" or "cuda", for cuda in a build without the CUDA backend,
  // for a --chunk below 1, and for --prompt-attention other than auto on the CPU.
  void check() const;
  // Sets OpenMP's thread count when --threads was given.
  void apply_threads() const;
  bool fp8_kv_cache() const { return kv_cache == "fp8"; }
};

// The model on `flags.device` (checked by DeviceFlags::check) through make_language_model, sized
// for prompts plus answers of at most `context` tokens with room for `decode_room` tokens after a
// compression, starting with attention `first`. The CPU executor reads `weights`, which must
// outlive it; the GPU keeps its own copy, and `weights` is emptied. Says on stderr what it does.
std::unique_ptr<LanguageModel> open_language_model(const DeviceFlags& flags, ModelWeights& weights,
                                                   int context, const AttentionConfig& first,
                                                   int decode_room);

// The ids that end a generation: the model's EOS ids and the tokenizer's.
std::vector<int32_t> stop_token_ids(const ModelConfig& config, const Tokenizer& tokenizer);

// "4096" or "4k" -> 4096; anything else is an Error naming the flag.

// Adds --methods (comma-separated "prefill[+decode]" entries) to `command`, filling `methods`.
void add_methods_option(CLI::App* command, std::vector<std::string>* methods);

// --methods: "prefill[+decode]" each (e.g. full, entropy+latent), none twice, each on `base`;
// Error naming the bad entry.
std::vector<AttentionConfig> parse_methods_flag(const std::vector<std::string>& methods,
                                                const AttentionConfig& base);

// Whether the method limits the work at all (full attention has no budget).
bool has_budget(const AttentionConfig& config);

// Matched budgets: at level B every method keeps B tokens per KV head (prefill base_budget and
// critiprefill_budget, decode budget K), and sparse prefill segments start at B when
// `scale_threshold` (the released threshold of 4096 would leave every 4k prompt dense).
AttentionConfig at_budget_level(AttentionConfig config, int budget, bool scale_threshold);

// at_budget_level, validated: an Error names `flag` (--budget or --budgets), the budget and the
// method.
AttentionConfig checked_budget_level(const AttentionConfig& config, int budget,
                                     bool scale_threshold, const std::string& flag,
                                     const std::string& method);

// An Error "<flag>: <why>" for the first of `flags` that was given on the command line.
void reject_flags(CLI::App* command, std::initializer_list<const char*> flags,
                  const std::string& why);

// A task prompt as the model reads it (training/TASKS.md): BOS, then the prompt's ids without
// parsing special tokens.
std::vector<int32_t> prompt_token_ids(const Tokenizer& tokenizer, const std::string& prompt);

// Whether the user set sparse_threshold, by flag or in the --attention-config file; if not, the
// budget level sets it.
bool sparse_threshold_given(CLI::App* command);

// The folder `relative` under the current directory, the executable's, or one of their parents (the
// shared assets live beside the checkout, at ../shared/assets; the shipped models inside it).
std::optional<std::filesystem::path> find_above_cwd_or_executable(
    const std::filesystem::path& relative);

// --text-dir if given, else shared/assets/text found above the current directory or the
// executable; Error when there is none.
std::string find_text_dir(const std::string& given);

}  // namespace entropyinfer::cli

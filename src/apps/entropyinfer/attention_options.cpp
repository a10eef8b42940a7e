#include "apps/entropyinfer/attention_options.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "apps/entropyinfer/flag_checks.h"
#include "core/error.h"
#include "engine/transformer.h"

namespace entropyinfer::cli {
namespace {

struct FlagSpec {
  const char* flag;
  const char* key;  // as attention_config_from_json reads it
  const char* help;
  enum Kind { kString, kInt, kDouble } kind;
};

constexpr FlagSpec kValueFlags[] = {
    {"--prefill", "prefill", "Prefill method: full, entropy, critiprefill", FlagSpec::kString},
    {"--decode", "decode", "Decode method: full, latent, snapkv, adakv, streaming, pyramidkv",
     FlagSpec::kString},
    {"--segment-size", "segment_size", "Query segment length S (tokens)", FlagSpec::kInt},
    {"--block-size", "block_size", "Key block length b (tokens)", FlagSpec::kInt},
    {"--sparse-threshold", "sparse_threshold", "Segments starting before this stay dense",
     FlagSpec::kInt},
    {"--base-budget", "base_budget", "Base prefill budget (tokens)", FlagSpec::kInt},
    {"--entropy-threshold", "entropy_threshold", "e_t: rigid-head entropy threshold",
     FlagSpec::kDouble},
    {"--delta", "delta", "delta_t of the budget recursion", FlagSpec::kDouble},
    {"--alpha", "alpha", "alpha of the budget recursion", FlagSpec::kDouble},
    {"--budget-cap-factor", "budget_cap_factor", "Budgets are capped at this many times the base",
     FlagSpec::kInt},
    {"--dense-layers", "dense_layers", "The first layers run dense", FlagSpec::kInt},
    {"--critiprefill-budget", "critiprefill_budget", "CritiPrefill's fixed budget (tokens)",
     FlagSpec::kInt},
    {"--decode-budget", "budget", "K: cache entries kept per head", FlagSpec::kInt},
    {"--window", "window", "W: observation window (queries), always kept", FlagSpec::kInt},
    {"--decode-gap", "gap", "G: generated tokens before the latent compression", FlagSpec::kInt},
    {"--pooling", "pooling", "Score smoothing: avgpool, maxpool, none", FlagSpec::kString},
    {"--pool-kernel", "pool_kernel", "Pooling kernel size (odd)", FlagSpec::kInt},
    {"--aggregation", "aggregation", "GQA group score aggregation: mean, max", FlagSpec::kString},
    {"--sink-tokens", "sink_tokens", "StreamingLLM attention sinks", FlagSpec::kInt},
    {"--adakv-floor", "adakv_floor", "AdaKV per-head floor (fraction of K - W)", FlagSpec::kDouble},
    {"--pyramid-beta", "pyramid_beta", "PyramidKV budget slope", FlagSpec::kDouble},
};

constexpr std::pair<const char*, const char*> kBooleanFlags[] = {
    {"--share-segment-budget", "share_segment_budget"},
    {"--per-segment-rigid", "per_segment_rigid"},
    {"--per-query-head", "per_query_head"},
};

}  // namespace

void AttentionOptions::add_to(CLI::App* command) {
  command->add_option("--attention-config", config_path_,
                      "JSON file of attention parameters (flags override it)");
  for (const FlagSpec& spec : kValueFlags) {
    CLI::Option* option = command->add_option(spec.flag, spec.help)->group("Attention policies");
    options_.emplace_back(spec.key, option);
  }
  for (const auto& [flag, key] : kBooleanFlags) {
    CLI::Option* option = command->add_flag(std::string(flag))
                              ->description(std::string("Sets ") + key)
                              ->group("Attention policies");
    flags_.emplace_back(key, option);
  }
}

AttentionConfig AttentionOptions::resolve() const {
  nlohmann::json json = nlohmann::json::object();
  if (!config_path_.empty()) {
    json = attention_config_to_json(load_attention_config(config_path_));
    // Flatten nested sections so that flag keys override them.
    for (const char* section : {"prefill_params", "decode_params"}) {
      if (json.contains(section)) {
        for (const auto& [key, value] : json[section].items()) json[key] = value;
        json.erase(section);
      }
    }
  }
  for (size_t i = 0; i < options_.size(); ++i) {
    const auto& [key, option] = options_[i];
    if (option->count() == 0) continue;
    const std::string text = option->as<std::string>();
    // Only the syntax is checked here; each parameter's range is the config's own rule.
    const char* flag = kValueFlags[i].flag;
    switch (kValueFlags[i].kind) {
      case FlagSpec::kString:
        json[key] = text;
        break;
      case FlagSpec::kInt:
        json[key] = parse_integer_flag(flag, text, INT32_MIN, INT32_MAX);
        break;
      case FlagSpec::kDouble:
        json[key] = parse_number_flag(flag, text, -HUGE_VAL, HUGE_VAL);
        break;
    }
  }
  for (const auto& [key, option] : flags_) {
    if (option->count() > 0) json[key] = true;
  }
  AttentionConfig config = attention_config_from_json(json);
  config.validate();
  return config;
}

std::string describe_attention_work(const AttentionConfig& config, const AttentionWork& work) {
  char line[512];
  const double fraction =
      work.prefill_keys_dense > 0
          ? static_cast<double>(work.prefill_keys_read) / work.prefill_keys_dense
          : 1.0;
  int written = std::snprintf(line, sizeof(line),
                              "attention: prefill %s read %.1f%% of full attention's keys",
                              prefill_method_name(config.prefill).c_str(), 100.0 * fraction);
  if (config.decode != DecodeMethod::kFull) {
    if (work.compressed) {
      std::snprintf(line + written, sizeof(line) - written,
                    " | decode %s kept %lld of %lld cache entries, cache %.2f MiB -> %.2f MiB",
                    decode_method_name(config.decode).c_str(),
                    static_cast<long long>(work.cache_entries_after),
                    static_cast<long long>(work.cache_entries_before),
                    work.cache_bytes_before / 1048576.0, work.cache_bytes_after / 1048576.0);
    } else {
      std::snprintf(line + written, sizeof(line) - written, " | decode %s: no compression yet",
                    decode_method_name(config.decode).c_str());
    }
  }
  return line;
}

}  // namespace entropyinfer::cli

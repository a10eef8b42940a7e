// `entropyinfer bench-work`: the work each attention policy does on a long prompt, measured by
// running it: the fraction of full attention's key reads each prefill method performs, and the
// cache each decode method keeps (entries and bytes, before and after compression). Times are
// printed beside the work.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "core/error.h"
#include "core/user_file.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "model/random_model.h"

namespace entropyinfer::cli {
namespace {

struct BenchWorkArgs {
  std::string model;
  std::string random_model = "heads-32x8x128";
  int tokens = 16384;
  std::string json_path;
  AttentionOptions attention;  // parameters (the methods are iterated over)
};

void run_bench_work(const BenchWorkArgs& args) {
  if (!args.json_path.empty()) check_output_file(args.json_path, "--json file");
  const AttentionConfig base = args.attention.resolve();
  ModelWeights weights = args.model.empty()
                             ? make_random_model(random_model_config(args.random_model), 99)
                             : load_model_with_progress(args.model);
  const ModelConfig& config = weights.config;
  const std::string model_name = args.model.empty() ? "random " + args.random_model : args.model;
  if (args.tokens < 2) throw Error("--tokens must be at least 2");
  const int decode_steps = base.decode_params.gap + 2;
  std::mt19937 generator(5);
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  std::vector<int32_t> prompt(args.tokens);
  for (int32_t& id : prompt) id = token(generator);

  const std::pair<PrefillMethod, DecodeMethod> runs[] = {
      {PrefillMethod::kFull, DecodeMethod::kFull},
      {PrefillMethod::kEntropy, DecodeMethod::kLatent},
      {PrefillMethod::kCritiPrefill, DecodeMethod::kSnapKV},
      {PrefillMethod::kEntropy, DecodeMethod::kAdaKV},
      {PrefillMethod::kEntropy, DecodeMethod::kStreamingLLM},
      {PrefillMethod::kEntropy, DecodeMethod::kPyramidKV},
  };
  nlohmann::json results = nlohmann::json::array();
  std::ostringstream table;
  table << "| prefill | decode | key reads vs full (all layers) | key reads vs full (sparse "
           "layers) | "
           "rigid heads | prefill s | cache entries before -> after | cache MiB before -> after |\n"
           "|---|---|---|---|---|---|---|---|\n";
  for (const auto& [prefill, decode] : runs) {
    AttentionConfig attention = base;
    attention.prefill = prefill;
    attention.decode = decode;
    attention.validate();
    std::fprintf(stderr, "%s + %s ...\n", prefill_method_name(prefill).c_str(),
                 decode_method_name(decode).c_str());
    Transformer model(weights, args.tokens + decode_steps, attention);
    model.set_record_plans(true);
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> logits = model.forward(prompt);
    const double prefill_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int step = 0; step < decode_steps; ++step) {
      int32_t next = argmax(logits);
      logits = model.forward(std::span(&next, 1));
    }
    int64_t sparse_read = 0, sparse_dense = 0;
    int rigid = 0, classified = 0;
    for (const LayerPrefillPlan& plan : model.recorded_plans()) {
      if (plan.dense) continue;
      sparse_read += plan.keys_read();
      sparse_dense += plan.keys_read_dense();
      for (uint8_t flag : plan.rigid_head) {
        ++classified;
        rigid += flag;
      }
    }
    const AttentionWork& work = model.attention_work();
    const double all_fraction =
        work.prefill_keys_dense > 0
            ? static_cast<double>(work.prefill_keys_read) / work.prefill_keys_dense
            : 1.0;
    const double sparse_fraction =
        sparse_dense > 0 ? static_cast<double>(sparse_read) / sparse_dense : 1.0;
    const int64_t entries_before = work.compressed ? work.cache_entries_before
                                                   : static_cast<int64_t>(config.num_layers) *
                                                         config.num_kv_heads * model.position();
    const int64_t entries_after = work.compressed ? work.cache_entries_after : entries_before;
    const double bytes_before = work.compressed ? work.cache_bytes_before : model.kv_cache_bytes();
    const double bytes_after = work.compressed ? work.cache_bytes_after : model.kv_cache_bytes();
    char row[512];
    std::snprintf(row, sizeof(row),
                  "| %s | %s | %.3f | %.3f | %d / %d | %.1f | %lld -> %lld | %.1f -> %.1f |\n",
                  prefill_method_name(prefill).c_str(), decode_method_name(decode).c_str(),
                  all_fraction, sparse_fraction, rigid, classified, prefill_seconds,
                  static_cast<long long>(entries_before), static_cast<long long>(entries_after),
                  bytes_before / 1048576.0, bytes_after / 1048576.0);
    table << row;
    results.push_back({{"prefill", prefill_method_name(prefill)},
                       {"decode", decode_method_name(decode)},
                       {"key_read_fraction_all_layers", all_fraction},
                       {"key_read_fraction_sparse_layers", sparse_fraction},
                       {"rigid_heads", rigid},
                       {"classified_heads", classified},
                       {"prefill_seconds", prefill_seconds},
                       {"cache_entries_before", entries_before},
                       {"cache_entries_after", entries_after},
                       {"cache_bytes_before", bytes_before},
                       {"cache_bytes_after", bytes_after}});
  }
  std::printf(
      "%s: %d layers, %d query heads, %d KV heads, head size %d; %d-token prompt, %d decode "
      "steps\n\n%s",
      model_name.c_str(), config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim,
      args.tokens, decode_steps, table.str().c_str());
  if (!args.json_path.empty()) {
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const nlohmann::json document = {{"date", date},
                                     {"model", model_name},
                                     {"prompt_tokens", args.tokens},
                                     {"decode_steps", decode_steps},
                                     {"attention_parameters", attention_config_to_json(base)},
                                     {"results", results},
                                     {"markdown", table.str()}};
    write_user_file(args.json_path, "--json file", document.dump(2) + "\n");
  }
}

}  // namespace

void register_bench_work(CLI::App& app) {
  auto args = std::make_shared<BenchWorkArgs>();
  CLI::App* command = app.add_subcommand(
      "bench-work", "Fraction of attention work and cache each policy keeps on a long prompt");
  command->add_option("-m,--model", args->model,
                      "Model folder or checkpoint (default: a random model)");
  command->add_option("--random-model", args->random_model, "Random-weight shape")
      ->capture_default_str();
  command->add_option("--tokens", args->tokens, "Prompt length")
      ->check(integer_in(1, kMaxTokenCount))
      ->capture_default_str();
  command->add_option("--json", args->json_path, "Also write JSON here");
  args->attention.add_to(command);
  command->callback([args] { run_bench_work(*args); });
}

}  // namespace entropyinfer::cli

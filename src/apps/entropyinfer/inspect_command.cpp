// `entropyinfer inspect`: run a prefill with a sparse method and write what it decided, per layer,
// KV head and segment: the entropy of the block estimate, the rigid/dynamic class, the budget and
// the blocks read, as JSON, plus heatmaps of entropy and budget (SVG).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/model_commands.h"
#include "core/error.h"
#include "core/svg_heatmap.h"
#include "core/user_file.h"
#include "engine/language_model.h"

namespace entropyinfer::cli {
namespace {

struct InspectArgs {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string prompt_file;
  std::string out_dir = "inspect";
  bool no_blocks = false;
  AttentionOptions attention;
  DeviceFlags device;
};

void run_inspect(const InspectArgs& args) {
  AttentionConfig attention = args.attention.resolve();
  if (attention.prefill == PrefillMethod::kFull) {
    throw Error(
        "inspect shows a sparse prefill's decisions: pass --prefill entropy or critiprefill");
  }
  args.device.check();
  args.device.apply_threads();
  const std::string text = read_prompt(args.prompt, args.prompt_file);
  // Before the prefill, which can take minutes: an output path that cannot be written is refused
  // now.
  prepare_output_folder(args.out_dir, "output folder");
  ModelWeights weights = args.device.load(args.model);
  std::unique_ptr<Tokenizer> tokenizer = find_tokenizer(args.model, args.tokenizer);
  EncodeOptions encode;
  encode.add_bos = true;
  const std::vector<int32_t> prompt = tokenizer->encode(text, encode);
  if (weights.config.max_position_embeddings > 0 &&
      static_cast<int64_t>(prompt.size()) > weights.config.max_position_embeddings) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens, more than the model's " +
                std::to_string(weights.config.max_position_embeddings) + "-token context");
  }
  const ModelConfig config = weights.config;
  const std::unique_ptr<LanguageModel> model = open_language_model(
      args.device, weights, static_cast<int>(prompt.size()), attention, /*decode_room=*/1);
  model->set_record_plans(true);
  model->set_progress_callback(prefill_progress_printer());
  model->forward(prompt);
  const std::vector<LayerPrefillPlan>& plans = model->recorded_plans();

  nlohmann::json layers = nlohmann::json::array();
  int segments = 0;
  for (const LayerPrefillPlan& plan : plans) segments = std::max(segments, plan.num_segments);
  const int rows = config.num_layers * config.num_kv_heads;
  const double blank = std::numeric_limits<double>::quiet_NaN();
  Heatmap entropy_map{"Block-estimate entropy per (layer, KV head) and query segment",
                      "query segment",
                      "layer / KV head",
                      rows,
                      std::max(segments, 1),
                      {},
                      {},
                      "entropy (nats)"};
  Heatmap budget_map{"Budget (tokens) per (layer, KV head) and query segment",
                     "query segment",
                     "layer / KV head",
                     rows,
                     std::max(segments, 1),
                     {},
                     {},
                     "budget (tokens)"};
  entropy_map.values.assign(static_cast<size_t>(rows) * entropy_map.columns, blank);
  budget_map.values.assign(entropy_map.values.size(), blank);
  int rigid_heads = 0, classified_heads = 0;
  int64_t segments_below = 0, examined_segments = 0, budget_tokens = 0;
  for (size_t layer = 0; layer < plans.size(); ++layer) {
    const LayerPrefillPlan& plan = plans[layer];
    nlohmann::json heads = nlohmann::json::array();
    for (int head = 0; head < plan.num_kv_heads && !plan.dense; ++head) {
      const bool rigid = !plan.rigid_head.empty() && plan.rigid_head[head] != 0;
      if (!plan.rigid_head.empty()) {
        ++classified_heads;
        rigid_heads += rigid ? 1 : 0;
      }
      nlohmann::json head_segments = nlohmann::json::array();
      for (int segment = 0; segment < plan.num_segments; ++segment) {
        const int row = head * plan.num_segments + segment;
        nlohmann::json entry = {{"segment", segment},
                                {"sparse", plan.segment_sparse[segment] != 0}};
        const size_t cell = (layer * config.num_kv_heads + head) * entropy_map.columns + segment;
        if (!plan.entropy.empty()) {
          entry["entropy"] = plan.entropy[row];
          // Segment 0 is not examined by the rigid test.
          if (segment >= 1) {
            ++examined_segments;
            if (plan.entropy[row] < attention.prefill_params.entropy_threshold) ++segments_below;
          }
          // The method's +1e-9 inside the log makes a one-block distribution's entropy -1e-9; the
          // map shows it as the 0 it stands for (the JSON keeps the computed value).
          entropy_map.values[cell] = std::max(0.0, static_cast<double>(plan.entropy[row]));
        }
        if (!plan.budget_tokens.empty()) {
          entry["budget_tokens"] = plan.budget_tokens[row];
          budget_tokens += plan.budget_tokens[row];
          budget_map.values[cell] = plan.budget_tokens[row];
        }
        const int32_t begin = plan.row_offsets.empty() ? 0 : plan.row_offsets[row];
        const int32_t end = plan.row_offsets.empty() ? 0 : plan.row_offsets[row + 1];
        entry["blocks_read"] = end - begin;
        if (!args.no_blocks) {
          entry["blocks"] = std::vector<int32_t>(plan.block_indices.begin() + begin,
                                                 plan.block_indices.begin() + end);
        }
        head_segments.push_back(std::move(entry));
      }
      heads.push_back(
          {{"kv_head", head}, {"class", rigid ? "rigid" : "dynamic"}, {"segments", head_segments}});
    }
    layers.push_back({{"layer", layer},
                      {"dense", plan.dense},
                      {"keys_read", plan.keys_read()},
                      {"keys_dense", plan.keys_read_dense()},
                      {"heads", heads}});
  }
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (int head = 0; head < config.num_kv_heads; ++head) {
      const std::string label = "L" + std::to_string(layer) + " h" + std::to_string(head);
      entropy_map.row_labels.push_back(label);
      budget_map.row_labels.push_back(label);
    }
  }
  const AttentionWork& work = model->attention_work();
  const nlohmann::json document = {
      {"model", args.model},
      {"prompt_tokens", prompt.size()},
      {"attention", attention_config_to_json(attention)},
      {"segment_size", attention.prefill_params.segment_size},
      {"block_size", attention.prefill_params.block_size},
      {"rigid_heads", rigid_heads},
      {"classified_heads", classified_heads},
      {"segments_below_threshold", segments_below},
      {"segments_examined", examined_segments},
      {"budget_tokens", budget_tokens},
      {"fraction_of_full_attention_keys",
       work.prefill_keys_dense > 0
           ? static_cast<double>(work.prefill_keys_read) / work.prefill_keys_dense
           : 1.0},
      {"layers", layers}};
  const std::filesystem::path out(args.out_dir);
  write_user_file((out / "plans.json").string(), "plans", document.dump(1) + "\n");
  write_heatmap_svg(entropy_map, (out / "entropy.svg").string());
  write_heatmap_svg(budget_map, (out / "budget.svg").string());
  std::printf("%zu prompt tokens, %d layers x %d KV heads, %d segments of %d tokens\n",
              prompt.size(), config.num_layers, config.num_kv_heads, segments,
              attention.prefill_params.segment_size);
  std::printf("rigid heads: %d of %d classified (layer, KV head) pairs\n", rigid_heads,
              classified_heads);
  std::printf(
      "segment estimates below e_t: %lld of %lld (segments after the first); budget tokens, "
      "summed over heads and segments: %lld\n",
      static_cast<long long>(segments_below), static_cast<long long>(examined_segments),
      static_cast<long long>(budget_tokens));
  std::printf("%s\n", describe_attention_work(attention, work).c_str());
  std::printf("wrote %s, %s, %s\n", (out / "plans.json").c_str(), (out / "entropy.svg").c_str(),
              (out / "budget.svg").c_str());
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* command = app.add_subcommand(
      "inspect", "Write a sparse prefill's per-head decisions as JSON and heatmaps");
  command->add_option("-m,--model", args->model, "Model folder or llama2.c checkpoint")->required();
  command->add_option("--tokenizer", args->tokenizer, "Tokenizer file");
  command->add_option("-p,--prompt", args->prompt, "Prompt text");
  command->add_option("-f,--prompt-file", args->prompt_file, "Read the prompt from a file");
  command->add_option("-o,--out", args->out_dir, "Output folder")->capture_default_str();
  command->add_flag("--no-blocks", args->no_blocks, "Leave the block lists out of the JSON");
  args->attention.add_to(command);
  args->device.add_to(command);
  command->callback([args] { run_inspect(*args); });
}

}  // namespace entropyinfer::cli

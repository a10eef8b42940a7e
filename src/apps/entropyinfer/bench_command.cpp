// `entropyinfer bench`: prefill and decode speed on the CPU backend, printed next to the physical
// floor measured in the same run (decode must stream every weight once per token, so memory
// bandwidth bounds it). Markdown table on stdout, JSON on request.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/bench_cuda.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "apps/entropyinfer/model_commands.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "core/user_file.h"
#include "engine/transformer.h"
#include "model/quantize_weights.h"
#include "model/random_model.h"

namespace entropyinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string model;
  std::string random_model;
  std::vector<int> prompt_tokens = {128, 512};
  int decode_tokens = 32;
  int repetitions = 3;
  std::string json_path;
  DeviceFlags device;
  // --device cuda only:
  std::vector<std::string> methods = {"full"};
  std::string markdown_path;
  bool stage_times = false;
  std::string gemm_tuning;  // empty: the engine's default (burst)
  int profile_decode_step = -1;
  bool profile_prefill = false;
  AttentionOptions attention;
};

// The flags as given, for the results' record.
std::string describe_command(const BenchArgs& args) {
  std::ostringstream text;
  text << "entropyinfer bench --device " << args.device.device;
  if (!args.model.empty()) text << " --model " << args.model;
  if (!args.random_model.empty()) text << " --random-model " << args.random_model;
  text << " -p ";
  for (size_t i = 0; i < args.prompt_tokens.size(); ++i)
    text << (i ? "," : "") << args.prompt_tokens[i];
  text << " -n " << args.decode_tokens << " -r " << args.repetitions << " --methods ";
  for (size_t i = 0; i < args.methods.size(); ++i) text << (i ? "," : "") << args.methods[i];
  if (args.stage_times) text << " --stage-times";
  if (!args.gemm_tuning.empty()) text << " --gemm-tuning " << args.gemm_tuning;
  if (args.device.chunk_tokens != kDefaultChunkTokens)
    text << " --chunk " << args.device.chunk_tokens;
  if (args.device.weights != "as-stored") text << " --weights " << args.device.weights;
  if (args.device.kv_cache != "auto") text << " --kv-cache " << args.device.kv_cache;
  if (args.device.prompt_attention != "auto")
    text << " --prompt-attention " << args.device.prompt_attention;
  if (args.profile_decode_step >= 0) text << " --profile-decode-step " << args.profile_decode_step;
  if (args.profile_prefill) text << " --profile-prefill";
  return text.str();
}

void run_bench_on_cuda(const BenchArgs& args) {
  CudaBenchArgs cuda_args;
  cuda_args.model = args.model;
  cuda_args.random_model = args.random_model;
  cuda_args.prompt_tokens = args.prompt_tokens;
  cuda_args.decode_tokens = args.decode_tokens;
  cuda_args.repetitions = args.repetitions;
  cuda_args.chunk_tokens = args.device.chunk_tokens;
  cuda_args.stage_times = args.stage_times;
  cuda_args.gemm_tuning = args.gemm_tuning.empty() ? "burst" : args.gemm_tuning;
  cuda_args.weights = args.device.weights;
  cuda_args.kv_cache = args.device.kv_cache;
  cuda_args.prompt_attention = args.device.prompt_attention;
  cuda_args.profile_decode_step = args.profile_decode_step;
  cuda_args.profile_prefill = args.profile_prefill;
  cuda_args.methods = args.methods;
  cuda_args.base = args.attention.resolve();
  cuda_args.json_path = args.json_path;
  cuda_args.markdown_path = args.markdown_path;
  cuda_args.command_line = describe_command(args);
  run_cuda_bench(cuda_args);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Copy bandwidth (bytes read + bytes written per second) over buffers far larger than the caches,
// all threads, best of several passes.
double measure_copy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::unique_ptr<char[]> source(new char[bytes]);
  std::unique_ptr<char[]> destination(new char[bytes]);
  std::memset(source.get(), 1, bytes);
  std::memset(destination.get(), 2, bytes);
  double best = 0.0;
  for (int pass = 0; pass < 6; ++pass) {
    const auto start = Clock::now();
#pragma omp parallel
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads());
      const size_t slice = bytes / threads;
      const size_t begin = slice * static_cast<size_t>(omp_get_thread_num());
      std::memcpy(destination.get() + begin, source.get() + begin, slice);
    }
    best = std::max(best, 2.0 * bytes / seconds_since(start));
  }
  return best;
}

// Bytes a single decode step must read: every matrix once, as stored (the embedding table only one
// row).
double weight_bytes_per_token(const ModelWeights& weights) {
  double total = static_cast<double>(weights.lm_head.byte_size()) + weights.final_norm.byte_size();
  for (const LayerWeights& layer : weights.layers) {
    for (const WeightView* view :
         {&layer.attn_norm, &layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.q_bias,
          &layer.k_bias, &layer.v_bias, &layer.o_proj, &layer.o_bias, &layer.q_norm, &layer.k_norm,
          &layer.mlp_norm, &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      total += static_cast<double>(view->byte_size());
    }
  }
  return total;
}

// What is wrong with the flags both devices share, before any model is built or bandwidth measured.
void check_common_flags(const BenchArgs& args) {
  if (args.model.empty() == args.random_model.empty()) {
    throw Error("give exactly one of --model or --random-model");
  }
  // Each flag's own range is checked where the flags are declared (flag_checks.h).
  if (args.prompt_tokens.empty()) throw Error("-p/--prompt-tokens: give at least one length");
  if (!args.gemm_tuning.empty() && gemm_tuning_index(args.gemm_tuning) < 0) {
    throw Error("--gemm-tuning must be heuristic, burst or sustained, not '" + args.gemm_tuning +
                "'");
  }
  if (args.profile_decode_step >= args.decode_tokens) {
    throw Error("--profile-decode-step must name one of the " + std::to_string(args.decode_tokens) +
                " decode steps (0.." + std::to_string(args.decode_tokens - 1) + "), not " +
                std::to_string(args.profile_decode_step));
  }
}

void run_bench(const BenchArgs& args) {
  if (!args.json_path.empty()) check_output_file(args.json_path, "--json file");
  if (!args.markdown_path.empty()) check_output_file(args.markdown_path, "--markdown file");
  check_common_flags(args);
  if (parse_device(args.device.device) == Device::kCuda) {
    run_bench_on_cuda(args);
    return;
  }
  args.device.check();
  args.device.apply_threads();
  if (args.methods.size() != 1 || args.methods[0] != "full") {
    throw Error(
        "--methods: the CPU bench measures full attention (bench-work measures the policies' "
        "work)");
  }
  if (args.stage_times)
    throw Error("--stage-times: the breakdown is of GPU prefills (--device cuda)");
  if (!args.gemm_tuning.empty())
    throw Error("--gemm-tuning: it chooses cuBLASLt algorithms (--device cuda)");
  if (args.profile_decode_step >= 0)
    throw Error("--profile-decode-step: it brackets a GPU decode step (--device cuda)");
  if (args.profile_prefill)
    throw Error("--profile-prefill: it brackets a GPU prefill (--device cuda)");
  ModelWeights weights = args.model.empty()
                             ? make_random_model(random_model_config(args.random_model), 1234)
                             : load_model_with_progress(args.model);
  if (args.device.weights == "fp8") quantize_weights_fp8(weights);
  const ModelConfig& config = weights.config;
  const std::string model_name = args.model.empty() ? "random " + args.random_model : args.model;
  std::fprintf(stderr, "measuring memory copy bandwidth...\n");
  const double bandwidth = measure_copy_bandwidth();
  const double weight_bytes = weight_bytes_per_token(weights);

  nlohmann::json results = nlohmann::json::array();
  std::ostringstream table;
  table << "| model | params (M) | prompt | prefill tok/s | decode tok/s | decode ms/token | "
           "floor tok/s | decode / floor |\n|---|---|---|---|---|---|---|---|\n";
  std::mt19937 generator(7);
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  for (int prompt_length : args.prompt_tokens) {
    if (prompt_length + args.decode_tokens > config.max_position_embeddings) {
      throw Error("prompt of " + std::to_string(prompt_length) + " tokens plus " +
                  std::to_string(args.decode_tokens) + " decoded does not fit the model's " +
                  std::to_string(config.max_position_embeddings) + "-token context");
    }
    std::vector<int32_t> prompt(prompt_length);
    for (int32_t& id : prompt) id = token(generator);
    Transformer model(weights, prompt_length + args.decode_tokens, {}, args.device.fp8_kv_cache());
    std::vector<double> prefill_times, decode_times;
    for (int repetition = 0; repetition <= args.repetitions; ++repetition) {  // first is warm-up
      model.reset();
      auto start = Clock::now();
      std::vector<float> logits = model.forward(prompt);
      const double prefill = seconds_since(start);
      int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      start = Clock::now();
      for (int step = 0; step < args.decode_tokens; ++step) {
        logits = model.forward(std::span(&next, 1));
        next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      const double decode = seconds_since(start);
      if (repetition > 0) {
        prefill_times.push_back(prefill);
        decode_times.push_back(decode);
      }
    }
    const double prefill_rate = prompt_length / median(prefill_times);
    const double decode_rate = args.decode_tokens / median(decode_times);
    // KV bytes read by the average decode step (fp32 keys and values of every layer, an FP8
    // cache's too: the CPU reference stores its rows widened).
    const double kv_bytes = 2.0 * config.num_layers * config.num_kv_heads * config.head_dim *
                            sizeof(float) * (prompt_length + args.decode_tokens / 2.0);
    // The floor: every byte a step must read, moved at the copy bandwidth (bytes read plus bytes
    // written per second, the figure a memory system's peak is quoted in).
    const double floor_rate = bandwidth / (weight_bytes + kv_bytes);
    char row[512];
    std::snprintf(row, sizeof(row), "| %s | %.1f | %d | %.1f | %.1f | %.2f | %.1f | %.2f |\n",
                  model_name.c_str(), config.parameter_count() / 1e6, prompt_length, prefill_rate,
                  decode_rate, 1000.0 / decode_rate, floor_rate, decode_rate / floor_rate);
    table << row;
    results.push_back({{"prompt_tokens", prompt_length},
                       {"decode_tokens", args.decode_tokens},
                       {"prefill_tokens_per_s", prefill_rate},
                       {"decode_tokens_per_s", decode_rate},
                       {"decode_ms_per_token", 1000.0 / decode_rate},
                       {"decode_floor_tokens_per_s", floor_rate},
                       {"decode_fraction_of_floor", decode_rate / floor_rate},
                       {"prefill_seconds_median", median(prefill_times)},
                       {"decode_seconds_median", median(decode_times)}});
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "\nmemory copy bandwidth %.2f GB/s (read+write); weights read per decode token %.1f MiB; "
      "%d threads\n",
      bandwidth / 1e9, weight_bytes / 1048576.0, omp_get_max_threads());
  if (!args.json_path.empty()) {
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    nlohmann::json document = {{"date", date},
                               {"model", model_name},
                               {"parameters", config.parameter_count()},
                               {"threads", omp_get_max_threads()},
                               {"kv_cache", args.device.fp8_kv_cache() ? "fp8" : "fp32"},
                               {"copy_bandwidth_bytes_per_s", bandwidth},
                               {"weight_bytes_per_token", weight_bytes},
                               {"results", results},
                               {"markdown", table.str()}};
    write_user_file(args.json_path, "--json file", document.dump(2) + "\n");
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* command = app.add_subcommand("bench", "Measure prefill and decode speed");
  command->add_option("-m,--model", args->model, "Model folder or llama2.c checkpoint");
  command->add_option("--random-model", args->random_model,
                      "A random-weight model of a named shape instead (llama-100m)");
  command->add_option("-p,--prompt-tokens", args->prompt_tokens, "Prompt lengths to measure")
      ->check(integer_in(1, kMaxTokenCount))
      ->delimiter(',');
  command->add_option("-n,--decode-tokens", args->decode_tokens, "Tokens decoded per measurement")
      ->check(integer_in(1, kMaxTokenCount))
      ->capture_default_str();
  command
      ->add_option("-r,--repetitions", args->repetitions, "Timed repetitions (median is reported)")
      ->check(integer_in(1, 1000000))
      ->capture_default_str();
  command->add_option("--json", args->json_path, "Also write the results as JSON to this file");
  command
      ->add_option("--methods", args->methods,
                   "cuda: attention methods, prefill[+decode] each, e.g. "
                   "full,entropy+latent,critiprefill+snapkv")
      ->delimiter(',');
  command->add_option("--markdown", args->markdown_path,
                      "cuda: also write the table (with date, GPU and command) to this file");
  command->add_flag("--stage-times", args->stage_times,
                    "cuda: after the timed runs, one more prefill per row with its GPU time broken "
                    "down by part (products, pointwise kernels, estimate, attention...)");
  args->device.add_to(command);
  command->add_option(
      "--gemm-tuning", args->gemm_tuning,
      "cuda: how whole-chunk products pick their cuBLASLt algorithm: heuristic, "
      "burst (fastest of eight in a short burst; the default) or sustained (fastest "
      "of eight at the power cap)");
  command
      ->add_option("--profile-decode-step", args->profile_decode_step,
                   "cuda: bracket decode step N of each row's first repetition with "
                   "cudaProfilerStart/Stop (for a profiler run with --profile-from-start off)")
      ->check(integer_in(0, kMaxTokenCount));
  command->add_flag("--profile-prefill", args->profile_prefill,
                    "cuda: bracket each row's first timed prefill with cudaProfilerStart/Stop");
  args->attention.add_to(command);
  command->callback([args] { run_bench(*args); });
}

}  // namespace entropyinfer::cli

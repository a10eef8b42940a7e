#include "apps/entropyinfer/bench_cuda.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/stopwatch.h"
#include "core/user_file.h"

#ifdef ENTROPYINFER_WITH_CUDA
#include <cuda_profiler_api.h>

#include "apps/entropyinfer/cli_common.h"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_info.h"
#include "engine/cuda/cuda_transformer.h"
#include "model/quantize_weights.h"
#include "model/random_model.h"
#endif

namespace entropyinfer::cli {

#ifndef ENTROPYINFER_WITH_CUDA

void run_cuda_bench(const CudaBenchArgs&) {
  throw Error(
      "--device cuda: this build has no CUDA backend (configure with -DENTROPYINFER_CUDA=ON)");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Bytes one decode step reads besides the cache: every matrix once (the embedding table one row):
// bf16, or FP8 projections (a byte each and a float per row) with the bf16 classifier.
double weight_bytes_per_token(const ModelConfig& c, bool fp8_projections) {
  const double hidden = c.hidden_size, q = double{1} * c.num_heads * c.head_dim;
  const double kv = double{1} * c.num_kv_heads * c.head_dim;
  const double per_layer = (q + 2 * kv) * hidden + hidden * q + 3.0 * c.intermediate_size * hidden;
  const double rows_per_layer = q + 2 * kv + hidden + 2.0 * c.intermediate_size + hidden;
  const double projections = fp8_projections ? c.num_layers * (per_layer + 4.0 * rows_per_layer)
                                             : 2.0 * c.num_layers * per_layer;
  return projections + 2.0 * c.vocab_size * hidden;
}

std::string mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", bytes / 1048576.0);
  return text;
}

}  // namespace

void run_cuda_bench(const CudaBenchArgs& args) {
  if (cuda::device_count() == 0) throw Error("--device cuda: no CUDA device is present");
  // The model, lengths, counts and chunk were checked with the CPU bench's flags (bench_command).
  if (args.methods.empty()) throw Error("--methods: give at least one method");
  // "<method>@layer" runs full attention layer by layer too (sparse methods always do).
  std::vector<AttentionConfig> methods;
  std::vector<bool> layer_major;
  for (const std::string& method : args.methods) {
    const size_t at = method.find('@');
    if (at != std::string::npos && method.substr(at) != "@layer") {
      throw Error("--methods: unknown suffix in '" + method + "' (known: @layer)");
    }
    methods.push_back(with_methods(method.substr(0, at), args.base));
    layer_major.push_back(at != std::string::npos);
  }
  const int longest = *std::max_element(args.prompt_tokens.begin(), args.prompt_tokens.end());

  cuda::CudaModelOptions options;
  options.context_length = longest + args.decode_tokens;
  options.chunk_tokens = args.chunk_tokens;
  options.decode_room = args.decode_tokens + 16;
  const int tuning = gemm_tuning_index(args.gemm_tuning);
  if (tuning < 0) throw Error("--gemm-tuning: unknown mode '" + args.gemm_tuning + "'");
  using GemmTuning = cuda::CudaModelOptions::GemmTuning;
  static_assert(static_cast<int>(GemmTuning::kHeuristic) == 0 &&
                    static_cast<int>(GemmTuning::kSustained) == 2,
                "kGemmTuningModes lists the modes in the enum's order");
  options.gemm_tuning = static_cast<GemmTuning>(tuning);
  std::fprintf(stderr, "measuring the GPU's copy bandwidth...\n");
  // Best of the timed copies: the floors below are what the GPU can do at most.
  const double bandwidth = cuda::measure_copy_bandwidth().best_bytes_per_second;
  const auto load_start = Clock::now();
  std::unique_ptr<cuda::CudaTransformer> model;
  std::string model_name;
  const bool fp8 = args.weights == "fp8";
  if (!fp8 && args.weights != "as-stored") {
    throw Error("--weights must be as-stored or fp8, not '" + args.weights + "'");
  }
  options.fp8_weights = fp8;  // random weights; a loaded model takes its weights' format
  const bool fp8_kv_cache = args.kv_cache == "fp8";
  if (!fp8_kv_cache && args.kv_cache != "auto") {
    throw Error("--kv-cache must be auto or fp8, not '" + args.kv_cache + "'");
  }
  options.fp8_kv_cache = fp8_kv_cache;
  options.prompt_attention = parse_prompt_attention(args.prompt_attention);
  if (args.random_model.empty()) {
    ModelWeights weights = load_model_with_progress(args.model);
    if (fp8) quantize_weights_fp8(weights);
    std::fprintf(stderr, "uploading to the GPU...\n");
    model = std::make_unique<cuda::CudaTransformer>(weights, options);
    model_name = args.model;
  } else {
    const ModelConfig config = random_model_config(args.random_model);
    std::fprintf(stderr, "drawing random weights of %s on the GPU...\n", args.random_model.c_str());
    model = std::make_unique<cuda::CudaTransformer>(config, 1234, options);
    model_name = "random " + args.random_model;
  }
  const double load_seconds = seconds_since(load_start);
  const ModelConfig& config = model->config();
  const double weight_bytes = weight_bytes_per_token(config, model->memory_plan().fp8_weights);
  std::fprintf(stderr, "%s on %s: %s\n", model_name.c_str(), cuda::device_name().c_str(),
               model->memory_plan().describe().c_str());

  nlohmann::json results = nlohmann::json::array();
  std::ostringstream table;
  table << "| prompt | method | prefill s | prompt tok/s | keys read | estimate ms | "
           "decode ms/token (full cache) | decode ms/token (compressed) | decode / floor | "
           "cache MiB before -> after | e2e s (+"
        << args.decode_tokens << ") | peak GPU MiB |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const int total_runs =
      static_cast<int>(methods.size() * args.prompt_tokens.size()) * args.repetitions;
  int runs_done = 0;
  const auto bench_start = Clock::now();
  for (size_t m = 0; m < methods.size(); ++m) {
    const AttentionConfig& attention = methods[m];
    model->set_attention(attention, layer_major[m]);
    // Warm-up under this method: cuBLASLt's choices (tuned on a whole chunk's first run), the
    // GEMV configurations, kernel attributes, the graphs.
    model->warm_up();
    for (const int prompt_length : args.prompt_tokens) {
      const std::vector<int32_t> prompt = random_prompt(prompt_length, config.vocab_size, 2);
      std::vector<double> prefill_s, full_ms, compressed_ms, e2e_s;
      cuda::CudaAttentionWork work;
      size_t peak = 0;
      for (int repetition = 0; repetition < args.repetitions; ++repetition) {
        model->reset();
        cuda::check(cudaDeviceSynchronize(), "before the prefill");
        cuda::reset_peak_allocated_device_bytes();
        const bool profiled_prefill = repetition == 0 && args.profile_prefill;
        if (profiled_prefill) cuda::check(cudaProfilerStart(), "cudaProfilerStart");
        const auto start = Clock::now();
        int32_t token = model->forward_greedy(prompt);  // ends with a copy to the host
        const double prefill = seconds_since(start);
        if (profiled_prefill) cuda::check(cudaProfilerStop(), "cudaProfilerStop");
        double decode_total = 0;
        for (int step = 0; step < args.decode_tokens; ++step) {
          const bool compressed_before = model->attention_work().compressed;
          const bool profiled = repetition == 0 && step == args.profile_decode_step;
          if (profiled) cuda::check(cudaProfilerStart(), "cudaProfilerStart");
          const auto step_start = Clock::now();
          token = model->forward_greedy(std::span<const int32_t>(&token, 1));
          const double seconds = seconds_since(step_start);
          if (profiled) cuda::check(cudaProfilerStop(), "cudaProfilerStop");
          decode_total += seconds;
          // A step that compressed the cache is in e2e only.
          if (compressed_before) {
            compressed_ms.push_back(1e3 * seconds);
          } else if (!model->attention_work().compressed) {
            full_ms.push_back(1e3 * seconds);
          }
        }
        prefill_s.push_back(prefill);
        e2e_s.push_back(prefill + decode_total);
        work = model->attention_work();
        peak = std::max(peak, cuda::peak_allocated_device_bytes());
        ++runs_done;
        std::fprintf(stderr, "[%d/%d] %d tokens, %s: prefill %.3f s, e2e %.3f s (%.0f s elapsed)\n",
                     runs_done, total_runs, prompt_length, args.methods[m].c_str(), prefill,
                     prefill + decode_total, seconds_since(bench_start));
        if (work.compressed) {
          std::fprintf(stderr, "  compression %.1f ms, of which %.1f ms allocating and freeing\n",
                       work.compression_ms, work.compression_memory_ms);
        }
      }
      nlohmann::json stage_ms = nlohmann::json::object();
      if (args.stage_times) {
        // Separate from the timed runs: the events between the parts cost a little time.
        model->reset();
        model->set_stage_timing(true);
        model->forward_greedy(prompt);
        model->set_stage_timing(false);
        double total = 0;
        std::string parts;
        for (const auto& [stage, ms] : model->attention_work().prefill_stage_ms) {
          stage_ms[stage] = ms;
          total += ms;
          char part[96];
          std::snprintf(part, sizeof(part), "%s%s %.0f ms", parts.empty() ? "" : ", ",
                        stage.c_str(), ms);
          parts += part;
        }
        std::fprintf(stderr, "  prefill by part (%.0f ms of GPU time): %s\n", total, parts.c_str());
      }
      const double keys_fraction =
          work.prefill_keys_dense > 0
              ? static_cast<double>(work.prefill_keys_read) / work.prefill_keys_dense
              : 1.0;
      // Floors: every weight once plus the cache the step reads, at the copy bandwidth.
      // A key and a value: bf16, or FP8 codes with a float scale each.
      const double kv_row_bytes =
          fp8_kv_cache ? 2.0 * (config.head_dim + 4.0) : 2.0 * 2.0 * config.head_dim;
      const double full_kv = kv_row_bytes * config.num_layers * config.num_kv_heads *
                             (prompt_length + args.decode_tokens / 2.0);
      const double full_floor_ms = 1e3 * (weight_bytes + full_kv) / bandwidth;
      const double compressed_kv =
          kv_row_bytes *
          (static_cast<double>(work.cache_entries_after) +
           double{1} * config.num_layers * config.num_kv_heads * args.decode_tokens / 2.0);
      const double compressed_floor_ms = 1e3 * (weight_bytes + compressed_kv) / bandwidth;
      const double full_decode = median(full_ms), compressed_decode = median(compressed_ms);
      const double ratio =
          work.compressed ? compressed_decode / compressed_floor_ms : full_decode / full_floor_ms;
      char row[768];
      std::snprintf(
          row, sizeof(row),
          "| %d | %s | %.3f | %.0f | %.3f | %.1f | %s | %s | %.2f | %s | %.3f | %s |\n",
          prompt_length, args.methods[m].c_str(), median(prefill_s),
          prompt_length / median(prefill_s), keys_fraction, work.estimate_ms,
          full_ms.empty() ? "-" : std::to_string(full_decode).substr(0, 5).c_str(),
          compressed_ms.empty() ? "-" : std::to_string(compressed_decode).substr(0, 5).c_str(),
          ratio,
          work.compressed
              ? (mib(work.cache_bytes_before) + " -> " + mib(work.cache_bytes_after)).c_str()
              : mib(static_cast<double>(model->kv_cache_bytes())).c_str(),
          median(e2e_s), mib(static_cast<double>(peak)).c_str());
      table << row;
      results.push_back({{"prompt_tokens", prompt_length},
                         {"method", args.methods[m]},
                         {"attention", attention_config_to_json(attention)},
                         {"prefill_seconds", prefill_s},
                         {"prefill_seconds_median", median(prefill_s)},
                         {"prompt_tokens_per_second", prompt_length / median(prefill_s)},
                         {"prefill_keys_read", work.prefill_keys_read},
                         {"prefill_keys_dense", work.prefill_keys_dense},
                         {"prefill_keys_fraction", keys_fraction},
                         {"estimate_ms", work.estimate_ms},
                         {"prefill_attention_ms", work.prefill_attention_ms},
                         {"decode_tokens", args.decode_tokens},
                         {"decode_ms_full_cache_median", full_decode},
                         {"decode_ms_compressed_median", compressed_decode},
                         {"decode_steps_full_cache", full_ms.size()},
                         {"decode_steps_compressed", compressed_ms.size()},
                         {"decode_floor_ms_full_cache", full_floor_ms},
                         {"decode_floor_ms_compressed", compressed_floor_ms},
                         {"decode_ratio_to_floor", ratio},
                         {"compressed", work.compressed},
                         {"compression_ms", work.compression_ms},
                         {"compression_memory_ms", work.compression_memory_ms},
                         {"cache_entries_before", work.cache_entries_before},
                         {"cache_entries_after", work.cache_entries_after},
                         {"cache_bytes_before", work.cache_bytes_before},
                         {"cache_bytes_after", work.cache_bytes_after},
                         {"e2e_seconds", e2e_s},
                         {"e2e_seconds_median", median(e2e_s)},
                         {"peak_gpu_bytes", peak},
                         {"prefill_stage_ms", stage_ms}});
    }
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "\n%s, %s; GPU copy bandwidth %.0f GB/s (read+write); weights read per decode token %.0f "
      "MiB; model ready in %.1f s\n",
      model_name.c_str(), cuda::device_name().c_str(), bandwidth / 1e9, weight_bytes / 1048576.0,
      load_seconds);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  if (!args.json_path.empty()) {
    const nlohmann::json document = {{"date", date},
                                     {"device", cuda::device_name()},
                                     {"model", model_name},
                                     {"parameters", config.parameter_count()},
                                     {"command", args.command_line},
                                     {"copy_bandwidth_bytes_per_s", bandwidth},
                                     {"weight_bytes_per_token", weight_bytes},
                                     {"chunk_tokens", args.chunk_tokens},
                                     {"gemm_tuning", args.gemm_tuning},
                                     {"weights", fp8 ? "fp8" : "as-stored"},
                                     {"kv_cache", fp8_kv_cache ? "fp8" : "bf16"},
                                     {"prompt_attention", args.prompt_attention},
                                     {"results", results},
                                     {"markdown", table.str()}};
    write_user_file(args.json_path, "--json file", document.dump(2) + "\n");
  }
  if (!args.markdown_path.empty()) {
    std::ostringstream file;
    file << "# entropyinfer bench, " << date << ", " << cuda::device_name() << "\n\n"
         << "`" << args.command_line << "`\n\n"
         << model_name << "; GPU copy bandwidth " << static_cast<int>(bandwidth / 1e9)
         << " GB/s (read+write). keys read: fraction of full causal attention's key reads in "
            "the prefill. Floors: weight bytes plus the cache read per step, over the copy "
            "bandwidth.\n\n"
         << table.str();
    write_user_file(args.markdown_path, "--markdown file", file.str());
  }
}

#endif

}  // namespace entropyinfer::cli

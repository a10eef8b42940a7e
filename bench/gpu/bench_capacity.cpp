// Capacity: the longest prompt one GPU holds, per attention method, on a model of a real shape with
// random weights. Measured, not computed: for each method the largest context (a multiple of
// --step) for which the engine accepts its memory plan against the free memory AND allocates every
// buffer (weights, cache, activations) is found by constructing the engine; the next step up must
// be refused by the engine. Then a prompt runs in that engine, followed by a few decoded tokens:
// the whole context when its predicted prefill time (from two calibration prompts in the same
// engine) is within --max-prefill-seconds, else the longest prompt that is, and the report says
// which.
//
// Methods compressing right after the prompt (SnapKV, AdaKV, PyramidKV, StreamingLLM) run with
// compress_during_prefill, so only one layer's full cache exists at a time. The model's
// max_position_embeddings is raised to the context tried: capacity is a property of memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "attention/decode_policy.h"
#include "bench_common.h"
#include "core/error.h"
#include "engine/cuda/cuda_transformer.h"
#include "model/random_model.h"

namespace entropyinfer::bench {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(separator, begin), text.size());
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// The decode methods compress_during_prefill accepts: those that compress right after the prompt.
bool compresses_after_prompt(const AttentionConfig& attention) {
  return attention.decode != DecodeMethod::kFull &&
         make_decode_policy(attention)->compress_after_generated() == 0;
}

struct Attempt {
  std::unique_ptr<cuda::CudaTransformer> model;
  std::string refusal;  // the engine's error when it refused
};

Attempt construct(const ModelConfig& shape, int64_t context, const cuda::CudaModelOptions& base) {
  ModelConfig config = shape;
  config.max_position_embeddings = static_cast<int>(context);
  cuda::CudaModelOptions options = base;
  options.context_length = static_cast<int>(context);
  Attempt attempt;
  try {
    attempt.model = std::make_unique<cuda::CudaTransformer>(config, 1234, options);
  } catch (const Error& error) {
    attempt.refusal = error.what();
  }
  return attempt;
}

}  // namespace

int run_capacity_bench(int argc, char** argv) {
  std::string shape_name = "llama-3.1-8b", json_path;
  std::vector<std::string> methods = {"full", "entropy+snapkv"};
  int64_t step = 65536, max_context = int64_t{1} << 23;
  int decode_tokens = 8, chunk_tokens = 16384, calibration_tokens = 32768;
  double max_prefill_seconds = 400;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      shape_name = value;
    } else if (flag == "--methods") {
      methods = split(value, ',');
    } else if (flag == "--step") {
      step = std::stoll(value);
    } else if (flag == "--max-context") {
      max_context = std::stoll(value);
    } else if (flag == "--decode-tokens") {
      decode_tokens = std::stoi(value);
    } else if (flag == "--chunk") {
      chunk_tokens = std::stoi(value);
    } else if (flag == "--calibration-tokens") {
      calibration_tokens = std::stoi(value);
    } else if (flag == "--max-prefill-seconds") {
      max_prefill_seconds = std::stod(value);
    } else if (flag == "--json") {
      json_path = value;
    } else {
      return false;
    }
    return true;
  });
  if (step < 1024 || max_context < step || max_context > (int64_t{1} << 30) || decode_tokens < 1) {
    throw Error(
        "capacity: need --step >= 1024, --max-context >= --step (at most 2^30) and "
        "--decode-tokens >= 1");
  }
  std::cout << std::unitbuf;  // progress reaches the log even when the time limit cuts the run
  const ModelConfig shape = random_model_config(shape_name);
  nlohmann::json report;
  report["device"] = cuda::device_name();
  report["shape"] = shape_name;
  report["step"] = step;
  report["decode_tokens"] = decode_tokens;
  report["max_prefill_seconds"] = max_prefill_seconds;
  {
    const auto [free_bytes, total_bytes] = cuda::device_memory();
    report["gpu_memory_total_bytes"] = total_bytes;
    report["gpu_memory_free_bytes_at_start"] = free_bytes;
  }

  // Written after every method, so that a call cut short by its time limit keeps what it measured.
  auto save = [&] {
    if (json_path.empty()) return;
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  };
  for (const std::string& method : methods) {
    const AttentionConfig attention = with_methods(method, AttentionConfig{});
    cuda::CudaModelOptions options;
    options.chunk_tokens = chunk_tokens;
    options.attention = attention;
    options.decode_room = decode_tokens + 16;
    options.compress_during_prefill = compresses_after_prompt(attention);
    std::cout << "== " << method
              << (options.compress_during_prefill ? " (compressing during the prefill)" : "")
              << "\n";

    // Largest accepted multiple of step: doubling, then bisection, each probe a real construction.
    int64_t accepted = 0, refused = max_context + step;
    std::string refusal;
    for (int64_t context = step; context <= max_context; context *= 2) {
      Attempt attempt = construct(shape, context, options);
      std::cout << "  context " << context << ": "
                << (attempt.model ? "accepted" : "refused: " + attempt.refusal) << "\n";
      if (!attempt.model) {
        refused = context;
        refusal = attempt.refusal;
        break;
      }
      accepted = context;
    }
    while (refused - accepted > step) {
      const int64_t middle = (accepted + refused) / 2 / step * step;
      if (middle <= accepted) break;
      Attempt attempt = construct(shape, middle, options);
      std::cout << "  context " << middle << ": "
                << (attempt.model ? "accepted" : "refused: " + attempt.refusal) << "\n";
      if (attempt.model) {
        accepted = middle;
      } else {
        refused = middle;
        refusal = attempt.refusal;
      }
    }
    nlohmann::json entry = {{"method", method},
                            {"compress_during_prefill", options.compress_during_prefill},
                            {"context_accepted", accepted},
                            {"context_refused", refused},
                            {"refusal", refusal}};
    if (accepted == 0) {
      std::cout << "  not even " << step << " tokens fit\n";
      report["methods"].push_back(entry);
      save();
      continue;
    }

    Attempt engine = construct(shape, accepted, options);
    if (!engine.model)
      throw Error("context " + std::to_string(accepted) +
                  " was accepted and then refused: " + engine.refusal);
    cuda::CudaTransformer& model = *engine.model;
    entry["memory_plan"] = model.memory_plan().describe();
    entry["gpu_memory_used_after_allocation_bytes"] = used_gpu_bytes();
    const int64_t full_prompt = accepted - decode_tokens;

    // Calibration in the same engine: two prompts, 4x apart, fit t(n) = a n + b n^2 (the
    // per-token work plus the attention that grows with the prefix; b >= 0). A power law through
    // the same two points under-predicted long prompts: the quadratic part only dominates later.
    const int64_t calibration = std::min<int64_t>(calibration_tokens, full_prompt / 4);
    if (calibration < 1024) throw Error("capacity: the accepted context is too short to calibrate");
    model.reset();
    model.forward_greedy(random_prompt(4096, shape.vocab_size, 6));  // warm-up: cuBLASLt choices
    double calibration_seconds[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      model.reset();
      const auto tokens = random_prompt(calibration << (2 * i), shape.vocab_size, 7);
      const auto start = std::chrono::steady_clock::now();
      model.forward_greedy(tokens);
      calibration_seconds[i] = seconds_since(start);
    }
    const double c = static_cast<double>(calibration);
    double quadratic =
        std::max(0.0, (calibration_seconds[1] - 4 * calibration_seconds[0]) / (12 * c * c));
    double linear = (calibration_seconds[1] - quadratic * 16 * c * c) / (4 * c);
    if (linear < 0) {  // all quadratic
      linear = 0;
      quadratic = calibration_seconds[1] / (16 * c * c);
    }
    auto predict = [&](double n) { return linear * n + quadratic * n * n; };
    const double predicted = predict(static_cast<double>(full_prompt));
    int64_t prompt = full_prompt;
    if (predicted > max_prefill_seconds) {
      const double n =
          quadratic > 0
              ? (-linear + std::sqrt(linear * linear + 4 * quadratic * max_prefill_seconds)) /
                    (2 * quadratic)
              : max_prefill_seconds / linear;
      prompt = static_cast<int64_t>(n) / 1024 * 1024;
      prompt = std::clamp<int64_t>(prompt, 4 * calibration, full_prompt);
    }
    std::cout << "  calibration: " << calibration << " and " << 4 * calibration << " tokens in "
              << calibration_seconds[0] << " and " << calibration_seconds[1] << " s (t = " << linear
              << " n + " << quadratic << " n^2); the " << full_prompt
              << "-token prompt predicted at " << predicted << " s; running " << prompt
              << " tokens\n";
    model.reset();
    cuda::check(cudaDeviceSynchronize(), "before prefill");
    auto start = std::chrono::steady_clock::now();
    int32_t token = model.forward_greedy(random_prompt(prompt, shape.vocab_size, 8));
    const double prefill_seconds = seconds_since(start);
    const size_t used_after_prefill = used_gpu_bytes();
    std::vector<double> steps;
    for (int i = 0; i < decode_tokens; ++i) {
      start = std::chrono::steady_clock::now();
      token = model.forward_greedy(std::span<const int32_t>(&token, 1));
      steps.push_back(seconds_since(start));
    }
    std::sort(steps.begin(), steps.end());
    const cuda::CudaAttentionWork& work = model.attention_work();
    entry["calibration_tokens"] = {calibration, 4 * calibration};
    entry["calibration_seconds"] = {calibration_seconds[0], calibration_seconds[1]};
    entry["prefill_time_model"] = {{"linear_seconds_per_token", linear},
                                   {"quadratic_seconds_per_token2", quadratic}};
    entry["whole_context_prompt_tokens"] = full_prompt;
    entry["predicted_whole_prompt_seconds"] = predicted;
    entry["prompt_tokens_run"] = prompt;
    entry["ran_whole_context"] = prompt == full_prompt;
    entry["prefill_seconds"] = prefill_seconds;
    entry["decode_median_ms"] = 1e3 * steps[steps.size() / 2];
    entry["gpu_memory_used_after_prefill_bytes"] = used_after_prefill;
    entry["kv_cache_bytes_after_prefill"] = model.kv_cache_bytes();
    entry["keys_read_fraction"] =
        work.prefill_keys_dense > 0
            ? static_cast<double>(work.prefill_keys_read) / work.prefill_keys_dense
            : 1.0;
    std::cout << "  accepted " << accepted << " tokens (" << model.memory_plan().describe()
              << "), refused " << refused << "; ran " << prompt << " prompt tokens in "
              << prefill_seconds << " s, decode " << 1e3 * steps[steps.size() / 2]
              << " ms/token, KV cache now " << model.kv_cache_bytes() / (1024.0 * 1024 * 1024)
              << " GiB\n";
    report["methods"].push_back(entry);
    save();
  }
  return 0;
}

}  // namespace entropyinfer::bench

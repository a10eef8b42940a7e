// Whole-model speed of the CUDA transformer on a model of a real shape with random weights (bf16,
// or FP8 projections with --weights fp8; a bf16 or, with --kv-cache fp8, FP8 cache; batch 1):
// prefill seconds and prompt tokens/s at each prompt length, decode ms/token at each context with
// its memory-bandwidth floor (weight bytes read per token plus the K/V bytes, over the device copy
// bandwidth measured in the same run), and the GPU memory in use. --kernel-trace FILE also
// records the kernels of a few decode steps per context as they run (kernel_trace.h) into FILE.
#include <chrono>
#include <fstream>
#include <iostream>
#include <numeric>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/flash_attention.h"
#include "bench_common.h"
#include "engine/cuda/cuda_transformer.h"
#include "kernel_trace.h"
#include "model/random_model.h"

namespace entropyinfer::bench {

int run_model_bench(int argc, char** argv) {
  std::string shape = "llama-3.1-8b", json_path;
  std::vector<int64_t> prefill_lengths = {16384, 32768, 65536, 131072};
  std::vector<int64_t> decode_contexts = {32768, 131072};
  int decode_tokens = 32, chunk_tokens = 16384;
  std::string kernel_trace_path, prefill_attention;  // prefill_attention empty: as the cache
  bool fp8 = false, fp8_cache = false;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      shape = value;
    } else if (flag == "--prefill") {
      prefill_lengths = parse_list(value);
    } else if (flag == "--decode-contexts") {
      decode_contexts = parse_list(value);
    } else if (flag == "--decode-tokens") {
      decode_tokens = std::stoi(value);
    } else if (flag == "--chunk") {
      chunk_tokens = std::stoi(value);
    } else if (flag == "--weights") {
      if (value != "fp8" && value != "bf16") throw std::invalid_argument("--weights: bf16 or fp8");
      fp8 = value == "fp8";
    } else if (flag == "--kv-cache") {
      if (value != "fp8" && value != "bf16") throw std::invalid_argument("--kv-cache: bf16 or fp8");
      fp8_cache = value == "fp8";
    } else if (flag == "--prefill-attention") {
      if (value != "fp8" && value != "bf16")
        throw std::invalid_argument("--prefill-attention: bf16 or fp8");
      prefill_attention = value;
    } else if (flag == "--json") {
      json_path = value;
    } else if (flag == "--kernel-trace") {
      kernel_trace_path = value;
    } else {
      return false;
    }
    return true;
  });
  const ModelConfig config = random_model_config(shape);
  nlohmann::json report;
  report["device"] = cuda::device_name();
  report["shape"] = shape;
  report["chunk_tokens"] = chunk_tokens;
  const double copy_gbps = cuda::measure_copy_bandwidth().median_bytes_per_second / 1e9;
  report["copy_bandwidth_gbps"] = copy_gbps;

  // Before the model captures its decode graph, so that the graph's kernels are recorded too.
  if (!kernel_trace_path.empty()) enable_kernel_trace();

  cuda::CudaModelOptions options;
  options.chunk_tokens = chunk_tokens;
  options.fp8_weights = fp8;
  options.fp8_kv_cache = fp8_cache;
  using PromptAttention = cuda::CudaModelOptions::PromptAttention;
  options.prompt_attention = prefill_attention.empty()    ? PromptAttention::kAuto
                             : prefill_attention == "fp8" ? PromptAttention::kFp8
                                                          : PromptAttention::kBf16;
  report["weights"] = fp8 ? "fp8" : "bf16";
  report["kv_cache"] = fp8_cache ? "fp8" : "bf16";
  const auto load_start = std::chrono::steady_clock::now();
  cuda::CudaTransformer model(config, 1234, options);
  report["load_seconds"] = seconds_since(load_start);
  report["memory_plan"] = model.memory_plan().describe();
  report["prompt_attention"] = model.memory_plan().fp8_prompt_attention ? "fp8" : "bf16";
  std::cout << "model " << shape << ": " << model.memory_plan().describe() << ", copy bandwidth "
            << copy_gbps << " GB/s\n";

  // Warm-up: cuBLASLt's algorithm choices, module loading, both attention paths.
  model.reset();
  model.forward_greedy(random_prompt(chunk_tokens + 100, config.vocab_size, 1));
  model.forward_greedy(std::vector<int32_t>{17});
  cuda::check(cudaDeviceSynchronize(), "warm-up");

  for (const int64_t length : prefill_lengths) {
    if (length > model.context_length()) continue;
    const auto tokens = random_prompt(length, config.vocab_size, 2);
    model.reset();
    cuda::check(cudaDeviceSynchronize(), "before prefill");
    const auto start = std::chrono::steady_clock::now();
    model.forward_greedy(tokens);  // ends with a device-to-host copy: the GPU is done
    const double seconds = seconds_since(start);
    report["prefill"].push_back({{"tokens", length},
                                 {"seconds", seconds},
                                 {"tokens_per_second", static_cast<double>(length) / seconds},
                                 {"gpu_memory_used_bytes", used_gpu_bytes()}});
    std::cout << "prefill " << length << ": " << seconds << " s, " << length / seconds
              << " tokens/s\n";
  }

  // Bytes one decode step must read: every weight matrix except the embedding table (one row of
  // it), plus the norms, plus keys and values of the whole context.
  const int64_t hidden = config.hidden_size, q_width = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_width = int64_t{config.num_kv_heads} * config.head_dim;
  // FP8 projections: a byte per weight and a float per row; the classifier stays bf16.
  const double projection_weights = static_cast<double>(config.num_layers) *
                                    ((q_width + 2 * kv_width) * hidden + hidden * q_width +
                                     3.0 * config.intermediate_size * hidden);
  const double projection_rows =
      static_cast<double>(config.num_layers) *
      (q_width + 2 * kv_width + 2.0 * hidden + 2.0 * config.intermediate_size);
  const double weight_bytes =
      (fp8 ? projection_weights + 4.0 * projection_rows : 2.0 * projection_weights) +
      2.0 * static_cast<double>(config.vocab_size) * hidden;
  report["decode_weight_bytes"] = weight_bytes;
  for (const int64_t context : decode_contexts) {
    if (context > model.context_length()) continue;
    const int64_t prefix = context - decode_tokens;
    model.reset();
    int32_t token = model.forward_greedy(random_prompt(prefix, config.vocab_size, 3));
    std::vector<double> times;
    // With --kernel-trace the last few steps are traced instead of timed.
    const int traced_steps = kernel_trace_path.empty() ? 0 : std::min(4, decode_tokens / 2);
    std::vector<std::vector<KernelRecord>> traces;
    for (int step = 0; step < decode_tokens; ++step) {
      if (step >= decode_tokens - traced_steps) {
        traces.push_back(trace_kernels(
            [&] { token = model.forward_greedy(std::span<const int32_t>(&token, 1)); }));
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      token = model.forward_greedy(std::span<const int32_t>(&token, 1));
      times.push_back(seconds_since(start));
    }
    if (!traces.empty()) {
      std::cout << "kernels of a decode step at " << context << ":\n";
      nlohmann::json summary = summarize_kernel_traces(traces, std::cout);
      summary["context"] = context;
      report["decode_kernels"].push_back(summary);
    }
    std::sort(times.begin(), times.end());
    const double median_ms = 1e3 * times[times.size() / 2];
    // K and V of every row: bf16, or a byte per element and a float per row of each head.
    const double row_bytes = fp8_cache ? static_cast<double>(kv_width) + 4.0 * config.num_kv_heads
                                       : 2.0 * static_cast<double>(kv_width);
    const double kv_bytes =
        2.0 * config.num_layers * row_bytes * static_cast<double>(prefix + decode_tokens / 2);
    // The floor reads each byte once at the copy bandwidth (which counts bytes read plus written).
    const double floor_ms = 1e3 * (weight_bytes + kv_bytes) / (copy_gbps * 1e9);
    report["decode"].push_back({{"context", context},
                                {"tokens", decode_tokens},
                                {"median_ms_per_token", median_ms},
                                {"floor_ms", floor_ms},
                                {"ratio_to_floor", median_ms / floor_ms},
                                {"kv_bytes", kv_bytes},
                                {"gpu_memory_used_bytes", used_gpu_bytes()}});
    std::cout << "decode at " << context << ": " << median_ms << " ms/token (floor " << floor_ms
              << " ms, " << median_ms / floor_ms << "x)\n";
  }
  // Where decode time goes: each single-token product of the shape (in-house GEMV and cuBLASLt), in
  // GB/s of weights read, rotating over enough copies of each matrix that none is served from L2.
  {
    cuda::Blas blas;
    const int64_t intermediate = config.intermediate_size, vocab = config.vocab_size;
    struct Product {
      const char* name;
      int64_t in, out;
      bool fp32_accumulate;
    };
    const Product products[] = {{"qkv", hidden, q_width + 2 * kv_width, false},
                                {"o (fp32 +=)", q_width, hidden, true},
                                {"gate_up", hidden, 2 * intermediate, false},
                                {"down (fp32 +=)", intermediate, hidden, true},
                                {"lm_head (fp32)", hidden, vocab, false}};
    cuda::DeviceBuffer<cuda::bf16> x(static_cast<size_t>(std::max(hidden, intermediate)));
    cuda::fill_uniform(x.data(), static_cast<int64_t>(x.size()), 5, 1.0f, nullptr);
    cuda::DeviceBuffer<float> y_fp32(static_cast<size_t>(vocab));
    cuda::DeviceBuffer<cuda::bf16> y_bf16(static_cast<size_t>(2 * intermediate));
    for (const Product& product : products) {
      const size_t bytes = static_cast<size_t>(product.in * product.out) * sizeof(cuda::bf16);
      const int copies = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / bytes + 1));
      cuda::DeviceBuffer<cuda::bf16> weights(static_cast<size_t>(copies) * product.in *
                                             product.out);
      cuda::fill_uniform(weights.data(), static_cast<int64_t>(weights.size()), 6, 0.01f, nullptr);
      for (bool gemv : {true, false}) {
        blas.set_gemv(gemv);
        int next = 0;
        const Timing timing = time_runs(
            [&] {
              const cuda::bf16* w =
                  weights.data() + static_cast<size_t>(next) * product.in * product.out;
              next = (next + 1) % copies;
              if (product.fp32_accumulate || product.out == vocab) {
                blas.linear(x.data(), 1, product.in, w, product.out, y_fp32.data(),
                            product.fp32_accumulate);
              } else {
                blas.linear(x.data(), 1, product.in, w, product.out, y_bf16.data());
              }
            },
            nullptr, 3, 20, 200, 200);
        const double gbps = static_cast<double>(bytes) / (timing.median_ms * 1e-3) / 1e9;
        report["decode_products"].push_back({{"product", product.name},
                                             {"in", product.in},
                                             {"out", product.out},
                                             {"path", gemv ? "gemv" : "cublaslt"},
                                             {"median_us", timing.median_ms * 1e3},
                                             {"gbps", gbps},
                                             {"fraction_of_copy", gbps / copy_gbps}});
        std::cout << "decode product " << product.name << " (" << (gemv ? "gemv" : "cuBLASLt")
                  << "): " << timing.median_ms * 1e3 << " us, " << gbps << " GB/s\n";
      }
    }
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  }
  if (!kernel_trace_path.empty()) {
    std::ofstream file(kernel_trace_path);
    file << report["decode_kernels"].dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

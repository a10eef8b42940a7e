// The model's four linear products at the prefill chunk size, through the engine's Blas (cuBLASLt,
// or the in-house GEMV for one token): TFLOP/s per product and the seconds they add up to over a
// whole prompt. With random weights about 3.1 s of a 128k-token Llama-3.1-8B prefill is spent
// outside attention in both full and sparse prefill; this says how much of that the products are,
// and, next to bench/gpu/matmul_reference.py (torch on the same shapes, same call), whether the
// engine's algorithm choice leaves speed behind. For one token (decoding) each product runs through
// the in-house GEMV and through cuBLASLt, with the weight bytes per second next to the copy
// bandwidth measured in the same run, and the GEMV kernel's configurations are swept. Each product
// also runs in FP8 (weights quantized per row, inputs per token), against the bf16 one.
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "model/random_model.h"

namespace entropyinfer::bench {

int run_gemm_bench(int argc, char** argv) {
  std::string shape_name = "llama-3.1-8b", json_path;
  std::vector<int64_t> token_counts = {16384, 1};
  int64_t prompt_tokens = 131072;
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (flag == "--shape") {
      shape_name = value;
    } else if (flag == "--tokens") {
      token_counts = parse_list(value);
    } else if (flag == "--prompt") {
      prompt_tokens = std::stoll(value);
    } else if (flag == "--json") {
      json_path = value;
    } else {
      return false;
    }
    return true;
  });
  for (const int64_t tokens : token_counts) {
    if (tokens < 1) throw std::invalid_argument("gemm: --tokens must be positive");
  }
  const ModelConfig config = random_model_config(shape_name);
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = int64_t{config.num_heads} * config.head_dim;
  const int64_t kv_width = int64_t{config.num_kv_heads} * config.head_dim;
  struct Product {
    const char* name;
    int64_t in, out;
    bool accumulate;  // fp32 output added to the residual stream, as the engine runs it
  };
  const std::vector<Product> products = {
      {"qkv", hidden, q_width + 2 * kv_width, false},
      {"o", q_width, hidden, true},
      {"gate_up", hidden, 2 * int64_t{config.intermediate_size}, false},
      {"down", int64_t{config.intermediate_size}, hidden, true},
  };

  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cuda::Blas blas(stream), tuned_blas(stream), sustained_blas(stream);
  tuned_blas.set_autotune(8);
  sustained_blas.set_autotune(8, 1, cuda::Blas::TuneLoad::kSustained);
  nlohmann::json report;
  report["device"] = cuda::device_name();
  report["shape"] = shape_name;
  report["prompt_tokens"] = prompt_tokens;
  report["flops_formula"] = "2 * tokens * in * out";
  const double copy_gbps = cuda::measure_copy_bandwidth().median_bytes_per_second / 1e9;
  report["copy_bandwidth_gbps"] = copy_gbps;
  std::cout << "copy bandwidth " << copy_gbps << " GB/s (read + write)\n";
  for (const int64_t tokens : token_counts) {
    double prompt_seconds = 0;      // the four products of every layer over the whole prompt
    double fp8_prompt_seconds = 0;  // the same in FP8
    for (const Product& product : products) {
      cuda::DeviceBuffer<cuda::bf16> x(static_cast<size_t>(tokens * product.in));
      cuda::DeviceBuffer<cuda::bf16> w(static_cast<size_t>(product.in * product.out));
      cuda::fill_uniform(x.data(), tokens * product.in, 1, 1.0f, stream);
      cuda::fill_uniform(w.data(), product.in * product.out, 2, 0.02f, stream);
      cuda::DeviceBuffer<float> y_float;
      cuda::DeviceBuffer<cuda::bf16> y_bf16;
      if (product.accumulate) {
        y_float.allocate(static_cast<size_t>(tokens * product.out));
        cuda::check(
            cudaMemsetAsync(y_float.data(), 0, sizeof(float) * tokens * product.out, stream),
            "cudaMemsetAsync");
      } else {
        y_bf16.allocate(static_cast<size_t>(tokens * product.out));
      }
      // One token: the in-house GEMV (what decoding runs), then cuBLASLt for comparison. More
      // tokens: cuBLASLt's heuristic choice (what the engine runs), then the fastest of its first
      // eight candidates (Blas::set_autotune).
      struct Variant {
        const char* kernel;
        cuda::Blas* engine;
        bool gemv;
      };
      const std::vector<Variant> variants =
          tokens == 1
              ? std::vector<Variant>{{"gemv", &blas, true}, {"cublaslt", &blas, false}}
              : std::vector<Variant>{{"cublaslt", &blas, true},
                                     {"cublaslt-autotuned", &tuned_blas, true},
                                     {"cublaslt-autotuned-sustained", &sustained_blas, true}};
      for (const Variant& variant : variants) {
        cuda::Blas& engine = *variant.engine;
        engine.set_gemv(variant.gemv);
        const char* kernel = variant.kernel;
        const Timing timing = time_runs(
            [&] {
              if (product.accumulate) {
                engine.linear(x.data(), tokens, product.in, w.data(), product.out, y_float.data(),
                              true);
              } else {
                engine.linear(x.data(), tokens, product.in, w.data(), product.out, y_bf16.data());
              }
            },
            stream);
        const double flops = 2.0 * static_cast<double>(tokens) * product.in * product.out;
        const double tflops = flops / (timing.median_ms * 1e-3) / 1e12;
        const double weight_gbps = 2.0 * product.in * product.out / (timing.median_ms * 1e-3) / 1e9;
        if (variant.engine == &blas && variant.gemv) {  // what the engine runs
          prompt_seconds += timing.median_ms * 1e-3 * config.num_layers *
                            (static_cast<double>(prompt_tokens) / static_cast<double>(tokens));
        }
        std::cout << "tokens " << tokens << ", " << product.name << " (" << product.in << " -> "
                  << product.out << (product.accumulate ? ", fp32 accumulate" : ", bf16") << ", "
                  << kernel << "): " << timing.median_ms << " ms, " << tflops << " TFLOP/s, "
                  << weight_gbps << " GB/s of weights, " << weight_gbps / copy_gbps
                  << " of the copy bandwidth (" << timing.runs << " runs)\n";
        report["results"].push_back({{"tokens", tokens},
                                     {"product", product.name},
                                     {"kernel", kernel},
                                     {"in", product.in},
                                     {"out", product.out},
                                     {"fp32_accumulate", product.accumulate},
                                     {"median_ms", timing.median_ms},
                                     {"min_ms", timing.min_ms},
                                     {"runs", timing.runs},
                                     {"tflops", tflops},
                                     {"weight_gbps", weight_gbps},
                                     {"weight_share_of_copy_bandwidth", weight_gbps / copy_gbps}});
      }
      blas.set_gemv(true);
      {
        // FP8 (core/fp8.h): the same weights quantized per row; each run quantizes x per token
        // (a kernel of its own ahead of cuBLASLt's FP8 product, or inside the FP8 GEMV) and
        // applies both scales, what the engine's FP8 products cost.
        cuda::DeviceBuffer<uint8_t> codes(static_cast<size_t>(product.in * product.out));
        cuda::DeviceBuffer<float> scales(static_cast<size_t>(product.out));
        cuda::quantize_weight_rows_fp8(w.data(), product.out, product.in, codes.data(),
                                       scales.data(), stream);
        cuda::DeviceMatrix matrix;
        matrix.codes = codes.data();
        matrix.scales = scales.data();
        matrix.in = product.in;
        matrix.activations.kind = Fp8Activations::Kind::kDynamicPerToken;
        blas.reserve_fp8_inputs(tokens, product.in);
        // The engine's own path (the GEMV at one row, the small-batch kernel at 2-8 rows where
        // the shape allows, else cuBLASLt with per-row scales, or unscaled plus a scaling kernel
        // up to 64 rows where separate scaling is on; all with fast accumulation), then for
        // several rows each cuBLASLt form the engine did not take, and cuBLASLt with fp32
        // promotion, for comparison.
        const bool small_batch =
            cuda::Blas::fp8_small_batch_applies(tokens, product.in, product.out);
        const bool separate =
            !small_batch && blas.fp8_separate_scaling_applies(tokens, matrix, product.out);
        for (const int variant : {0, 1, 2, 3}) {
          if (variant > 0 && tokens == 1) break;
          if (variant == 1 && (separate || tokens > cuda::Blas::kFp8SeparateScalingMaxRows))
            continue;  // the engine's path already is this, or it does not apply
          if (variant == 2 && !small_batch && !separate) continue;  // the engine's path is this
          const bool fast = variant != 3;
          blas.set_fp8_fast_accumulation(fast);
          blas.set_fp8_small_batch(variant == 0);
          blas.set_fp8_separate_scaling(variant <= 1);
          const Timing timing = time_runs(
              [&] {
                if (product.accumulate) {
                  blas.linear(x.data(), tokens, product.in, matrix, product.out, y_float.data(),
                              true);
                } else {
                  blas.linear(x.data(), tokens, product.in, matrix, product.out, y_bf16.data());
                }
              },
              stream);
          const char* kernel = variant == 0   ? (tokens == 1   ? "fp8-gemv"
                                                 : small_batch ? "fp8-small-batch"
                                                 : separate    ? "fp8-cublaslt-separate-scaling"
                                                               : "fp8-cublaslt")
                               : variant == 1 ? "fp8-cublaslt-separate-scaling"
                               : variant == 2 ? "fp8-cublaslt"
                                              : "fp8-cublaslt-precise";
          const double flops = 2.0 * static_cast<double>(tokens) * product.in * product.out;
          const double tflops = flops / (timing.median_ms * 1e-3) / 1e12;
          const double weight_gbps =
              1.0 * product.in * product.out / (timing.median_ms * 1e-3) / 1e9;
          if (variant == 0) {  // what the engine runs
            fp8_prompt_seconds +=
                timing.median_ms * 1e-3 * config.num_layers *
                (static_cast<double>(prompt_tokens) / static_cast<double>(tokens));
          }
          std::cout << "tokens " << tokens << ", " << product.name << " (" << kernel
                    << "): " << timing.median_ms << " ms, " << tflops << " TFLOP/s, " << weight_gbps
                    << " GB/s of weights, " << weight_gbps / copy_gbps << " of the copy bandwidth ("
                    << timing.runs << " runs)\n";
          report["results"].push_back(
              {{"tokens", tokens},
               {"product", product.name},
               {"kernel", kernel},
               {"in", product.in},
               {"out", product.out},
               {"fp32_accumulate", product.accumulate},
               {"median_ms", timing.median_ms},
               {"min_ms", timing.min_ms},
               {"runs", timing.runs},
               {"tflops", tflops},
               {"weight_gbps", weight_gbps},
               {"weight_share_of_copy_bandwidth", weight_gbps / copy_gbps}});
        }
        blas.set_fp8_fast_accumulation(true);
        blas.set_fp8_small_batch(true);
        blas.set_fp8_separate_scaling(true);
      }
      if (tokens > 1) {
        // Every candidate, timed both ways: a short burst (median of 9) and sustained (the mean
        // over 60 ms of back-to-back runs after 60 ms of them), where the power cap sets the clock.
        const auto burst =
            blas.time_candidates(x.data(), tokens, product.in, w.data(), product.out,
                                 product.accumulate, 8, cuda::Blas::TuneLoad::kBurst);
        const auto sustained =
            blas.time_candidates(x.data(), tokens, product.in, w.data(), product.out,
                                 product.accumulate, 8, cuda::Blas::TuneLoad::kSustained);
        const int burst_choice =
            tuned_blas.chosen_candidate(tokens, product.in, product.out, product.accumulate);
        const int sustained_choice =
            sustained_blas.chosen_candidate(tokens, product.in, product.out, product.accumulate);
        std::cout << "  candidates of " << product.name << " (ms burst / sustained; burst tuning "
                  << "chose " << burst_choice << ", sustained tuning " << sustained_choice << "):";
        for (size_t c = 0; c < burst.size(); ++c) {
          std::cout << " [" << c << "] " << burst[c] << " / " << sustained[c];
          report["candidates"].push_back(
              {{"tokens", tokens},
               {"product", product.name},
               {"candidate", c},
               {"burst_ms", burst[c]},
               {"sustained_ms", sustained[c]},
               {"chosen_by_burst", burst_choice == static_cast<int>(c)},
               {"chosen_by_sustained", sustained_choice == static_cast<int>(c)}});
        }
        std::cout << "\n";
      }
      if (tokens == 1) {
        // The GEMV's configurations (loads in flight per lane, threads per block), fp32 output.
        cuda::DeviceBuffer<float> y(static_cast<size_t>(product.out));
        cuda::check(cudaMemsetAsync(y.data(), 0, sizeof(float) * product.out, stream),
                    "cudaMemsetAsync");
        for (const int in_flight : {4, 8, 16}) {
          for (const int threads : {128, 256, 512}) {
            const Timing timing = time_runs(
                [&] {
                  cuda::gemv_with_config(x.data(), w.data(), product.in, product.out, y.data(),
                                         product.accumulate, in_flight, threads, stream);
                },
                stream);
            const double weight_gbps =
                2.0 * product.in * product.out / (timing.median_ms * 1e-3) / 1e9;
            std::cout << "  gemv " << product.name << ", " << in_flight << " in flight, " << threads
                      << " threads: " << timing.median_ms << " ms, " << weight_gbps / copy_gbps
                      << " of the copy bandwidth\n";
            report["gemv_configurations"].push_back(
                {{"product", product.name},
                 {"in_flight", in_flight},
                 {"threads", threads},
                 {"median_ms", timing.median_ms},
                 {"weight_gbps", weight_gbps},
                 {"weight_share_of_copy_bandwidth", weight_gbps / copy_gbps}});
          }
        }
      }
    }
    std::cout << "tokens " << tokens << ": the four products of " << config.num_layers
              << " layers over a " << prompt_tokens << "-token prompt take " << prompt_seconds
              << " s at these rates\n";
    std::cout << "tokens " << tokens << ": in FP8 they take " << fp8_prompt_seconds << " s ("
              << prompt_seconds / fp8_prompt_seconds << "x the bf16 products' rate)\n";
    report["prompt_seconds"].push_back({{"tokens", tokens},
                                        {"seconds", prompt_seconds},
                                        {"fp8_seconds", fp8_prompt_seconds},
                                        {"fp8_speedup", prompt_seconds / fp8_prompt_seconds}});
  }
  cudaStreamDestroy(stream);
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

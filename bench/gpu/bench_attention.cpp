// Attention kernels at long lengths: causal prefill TFLOP/s of each in-house kernel (FLOPs counted
// as 4 * n^2 * head_dim * q_heads / 2, the causal half, as for the torch SDPA reference), and
// split-KV decode of one token over an n-token cache (bf16, and the FP8 cache) in GB/s of K/V
// read, next to the device copy bandwidth. "fp8" is flash_prefill_fp8 over keys staged once
// (stage_fp8_keys, timed on its own: a prefill stages each layer once).
#include <cmath>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/flash_attention.h"
#include "backends/cuda/kv_cache_fp8.h"
#include "backends/cuda/ragged_decode.h"
#include "bench_common.h"

namespace entropyinfer::bench {

int run_attention_bench(int argc, char** argv) {
  AttentionBenchShape dims({8192, 32768, 131072});
  std::string json_path;
  std::string kernel_names = "wgmma,wgmma_simple,mma,fp8";
  for_each_flag(argc, argv, [&](const std::string& flag, const std::string& value) {
    if (dims.take_flag(flag, value)) return true;
    if (flag == "--kernels") {
      kernel_names = value;
    } else if (flag == "--json") {
      json_path = value;
    } else {
      return false;
    }
    return true;
  });

  nlohmann::json report;
  dims.report_to(report);
  report["flops_formula"] = "4 * n^2 * head_dim * q_heads / 2 (causal)";
  const double copy_gbps = cuda::measure_copy_bandwidth().median_bytes_per_second / 1e9;
  report["copy_bandwidth_gbps"] = copy_gbps;
  std::cout << "device " << report["device"].get<std::string>() << ", copy bandwidth " << copy_gbps
            << " GB/s\n";

  std::vector<std::pair<std::string, cuda::FlashKernel>> kernels;
  const std::string listed = "," + kernel_names + ",";
  if (listed.find(",wgmma,") != std::string::npos && cuda::wgmma_attention_available()) {
    kernels.emplace_back("wgmma", cuda::FlashKernel::kWgmma);
  }
  if (listed.find(",wgmma_simple,") != std::string::npos && cuda::wgmma_attention_available()) {
    kernels.emplace_back("wgmma_simple", cuda::FlashKernel::kWgmmaSimple);
  }
  if (listed.find(",mma,") != std::string::npos)
    kernels.emplace_back("mma", cuda::FlashKernel::kMma);

  cudaStream_t stream = nullptr;
  for (const int64_t n : dims.lengths) {
    AttentionInputs inputs(n, dims, stream);
    const double flops = 4.0 * static_cast<double>(n) * n * dims.head_dim * dims.q_heads / 2.0;
    for (const auto& [name, kernel] : kernels) {
      const Timing timing = time_runs([&] { inputs.prefill(kernel, stream); }, stream);
      const double tflops = flops / (timing.median_ms * 1e-3) / 1e12;
      report["prefill"].push_back({{"kernel", name},
                                   {"tokens", n},
                                   {"median_ms", timing.median_ms},
                                   {"min_ms", timing.min_ms},
                                   {"runs", timing.runs},
                                   {"tflops", tflops}});
      std::cout << "prefill " << name << " n=" << n << ": " << timing.median_ms << " ms, " << tflops
                << " TFLOP/s (" << timing.runs << " runs)\n";
    }

    if (listed.find(",fp8,") != std::string::npos && cuda::fp8_attention_available() &&
        cuda::fp8_attention_supports_head_dim(dims.head_dim)) {
      Fp8StagedInputs fp8(inputs, stream);
      const Timing staging = time_runs([&] { fp8.stage(inputs, stream); }, stream);
      const Timing timing = time_runs(
          [&] {
            cuda::flash_prefill_fp8(inputs.q.data(), fp8.buffers.view, inputs.shape,
                                    inputs.out.data(), stream);
          },
          stream);
      const double tflops = flops / (timing.median_ms * 1e-3) / 1e12;
      report["prefill"].push_back({{"kernel", "fp8"},
                                   {"tokens", n},
                                   {"median_ms", timing.median_ms},
                                   {"min_ms", timing.min_ms},
                                   {"runs", timing.runs},
                                   {"tflops", tflops},
                                   {"staging_median_ms", staging.median_ms}});
      std::cout << "prefill fp8 n=" << n << ": " << timing.median_ms << " ms, " << tflops
                << " TFLOP/s (" << timing.runs << " runs), staging " << staging.median_ms
                << " ms\n";
    }

    // Decode: the last position queries the whole cache.
    cuda::FlashShape decode = inputs.shape;
    decode.tokens = 1;
    decode.first_position = n - 1;
    const int splits = cuda::flash_decode_splits(decode);
    cuda::DeviceBuffer<float> workspace(
        std::max<size_t>(1, cuda::flash_decode_workspace_floats(decode, splits)));
    const Timing timing = time_runs(
        [&] {
          cuda::flash_decode(inputs.q.data(), inputs.k.data(), inputs.v.data(), decode,
                             inputs.out.data(), workspace.data(), workspace.size(), stream, splits);
        },
        stream, 3, 20, 200, 300);
    const double bytes = 2.0 * static_cast<double>(inputs.kv_count) * sizeof(cuda::bf16);
    const double gbps = bytes / (timing.median_ms * 1e-3) / 1e9;
    report["decode"].push_back({{"context", n},
                                {"splits", splits},
                                {"median_us", timing.median_ms * 1e3},
                                {"kv_gbps", gbps},
                                {"fraction_of_copy", gbps / copy_gbps}});
    std::cout << "decode n=" << n << " splits=" << splits << ": " << timing.median_ms * 1e3
              << " us, " << gbps << " GB/s of K/V (" << 100.0 * gbps / copy_gbps << "% of copy)\n";

    // The same decode over the FP8 cache (ragged_decode with equal lengths), its bytes being the
    // codes and one scale per row of keys and of values.
    {
      cuda::DeviceBuffer<uint8_t> key_codes(inputs.kv_count), value_codes(inputs.kv_count);
      const size_t rows = static_cast<size_t>(dims.kv_heads) * n;
      cuda::DeviceBuffer<float> key_scales(rows), value_scales(rows);
      cuda::DeviceBuffer<int32_t> lengths(static_cast<size_t>(dims.kv_heads));
      const cuda::Fp8KvCache cache{key_codes.data(), value_codes.data(), key_scales.data(),
                                   value_scales.data()};
      cuda::quantize_kv_rows(inputs.k.data(), inputs.v.data(), dims.kv_heads, n, dims.head_dim, 0,
                             n, cache, lengths.data(), stream);
      cuda::RaggedShape ragged;
      ragged.q_heads = dims.q_heads;
      ragged.kv_heads = dims.kv_heads;
      ragged.head_dim = dims.head_dim;
      ragged.cache_stride = n;
      ragged.max_length = n;
      ragged.fp8 = true;
      const int fp8_splits = cuda::ragged_decode_splits(ragged);
      cuda::DeviceBuffer<float> fp8_workspace(
          std::max<size_t>(1, cuda::ragged_decode_workspace_floats(ragged, fp8_splits)));
      const Timing fp8_timing = time_runs(
          [&] {
            cuda::ragged_decode(inputs.q.data(), cache, lengths.data(), ragged, inputs.out.data(),
                                fp8_workspace.data(), fp8_workspace.size(), stream, fp8_splits);
          },
          stream, 3, 20, 200, 300);
      const double fp8_bytes = static_cast<double>(rows) * 2.0 * (dims.head_dim + sizeof(float));
      const double fp8_gbps = fp8_bytes / (fp8_timing.median_ms * 1e-3) / 1e9;
      report["decode_fp8"].push_back({{"context", n},
                                      {"splits", fp8_splits},
                                      {"median_us", fp8_timing.median_ms * 1e3},
                                      {"kv_gbps", fp8_gbps},
                                      {"fraction_of_copy", fp8_gbps / copy_gbps}});
      std::cout << "decode FP8 cache n=" << n << " splits=" << fp8_splits << ": "
                << fp8_timing.median_ms * 1e3 << " us, " << fp8_gbps << " GB/s of K/V ("
                << 100.0 * fp8_gbps / copy_gbps << "% of copy)\n";
    }
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

// Attention kernels at long lengths: causal prefill TFLOP/s of each in-house kernel (FLOPs counted
// as 4 * n^2 * head_dim * q_heads / 2, the causal half, as for the torch SDPA reference), and
// split-KV decode of one token over an n-token cache in GB/s of K/V read, next to the device copy
// bandwidth.
#include <cmath>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/flash_attention.h"
#include "bench_common.h"

namespace entropyinfer::bench {

int run_attention_bench(int argc, char** argv) {
  AttentionBenchShape dims({8192, 32768, 131072});
  std::string json_path;
  std::string kernel_names = "wgmma,wgmma_simple,mma";
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
  }
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace entropyinfer::bench

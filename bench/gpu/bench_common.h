// Timing helpers of the GPU benchmarks: CUDA events around each run after warm-up, medians, and the
// device-to-device copy bandwidth that memory-bound results are read against.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::bench {

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
};

// Runs `work` (which enqueues on `stream`) `warmup` times, then at least min_runs and until
// min_total_ms of measured time or max_runs; each run timed alone with events.
inline Timing time_runs(const std::function<void()>& work, cudaStream_t stream, int warmup = 2,
                        int min_runs = 5, int max_runs = 50, double min_total_ms = 1500) {
  cudaEvent_t start, stop;
  cuda::check(cudaEventCreate(&start), "cudaEventCreate");
  cuda::check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) work();
  cuda::check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < max_runs &&
         (static_cast<int>(times.size()) < min_runs || total < min_total_ms)) {
    cuda::check(cudaEventRecord(start, stream), "cudaEventRecord");
    work();
    cuda::check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop), "timed run");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
    total += ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  Timing timing;
  timing.runs = static_cast<int>(times.size());
  timing.median_ms = times.size() % 2
                         ? times[times.size() / 2]
                         : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
  timing.min_ms = times.front();
  return timing;
}

// Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.
inline double copy_bandwidth_gbps(size_t bytes = size_t{2} << 30) {
  cuda::DeviceBuffer<uint8_t> source(bytes), target(bytes);
  cuda::check(cudaMemset(source.data(), 1, bytes), "cudaMemset");
  const Timing timing = time_runs(
      [&] {
        cuda::check(
            cudaMemcpyAsync(target.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, nullptr),
            "copy");
      },
      nullptr, 2, 10, 20, 0);
  return 2.0 * static_cast<double>(bytes) / (timing.median_ms * 1e-3) / 1e9;
}

inline std::string device_name() {
  cudaDeviceProp properties{};
  int device = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  cuda::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

inline std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    values.push_back(std::stoll(text.substr(begin, end - begin)));
    begin = end + 1;
  }
  return values;
}

int run_attention_bench(int argc, char** argv);
int run_model_bench(int argc, char** argv);

}  // namespace entropyinfer::bench

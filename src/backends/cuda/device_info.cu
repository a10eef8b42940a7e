#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_info.h"

namespace entropyinfer::cuda {

std::string device_name() {
  cudaDeviceProp properties{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return properties.name;
}

CopyBandwidth measure_copy_bandwidth(size_t bytes) {
  constexpr int kWarmupCopies = 2;
  constexpr int kTimedCopies = 10;
  DeviceBuffer<uint8_t> source(bytes), target(bytes);
  check(cudaMemset(source.data(), 1, bytes), "cudaMemset");
  auto copy = [&] {
    check(cudaMemcpyAsync(target.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, nullptr),
          "copy");
  };
  for (int i = 0; i < kWarmupCopies; ++i) copy();
  check(cudaStreamSynchronize(nullptr), "warm-up");
  EventStopwatch stopwatch;
  std::vector<double> times_ms;
  for (int i = 0; i < kTimedCopies; ++i) times_ms.push_back(stopwatch.time_ms(nullptr, copy));
  std::sort(times_ms.begin(), times_ms.end());
  const size_t middle = times_ms.size() / 2;
  const double median_ms =
      times_ms.size() % 2 ? times_ms[middle] : 0.5 * (times_ms[middle - 1] + times_ms[middle]);
  const double moved = 2.0 * static_cast<double>(bytes);
  CopyBandwidth bandwidth;
  bandwidth.median_bytes_per_second = moved / (median_ms * 1e-3);
  bandwidth.best_bytes_per_second = moved / (times_ms.front() * 1e-3);
  return bandwidth;
}

}  // namespace entropyinfer::cuda

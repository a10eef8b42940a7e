// What the benchmarks (entropyinfer bench --device cuda, entropyinfer_gpu_bench) report about the
// GPU they ran on: its name, and its device-to-device copy bandwidth, the ceiling that memory-bound
// results are read against. Host code compiled by the plain C++ compiler may include this header.
#pragma once

#include <cstddef>
#include <string>

namespace entropyinfer::cuda {

// The current device's name (cudaDeviceProp::name).
std::string device_name();

struct CopyBandwidth {
  // Bytes read plus bytes written per second.
  double median_bytes_per_second = 0;
  double best_bytes_per_second = 0;
};

// Copies `bytes` from one device buffer to another on the default stream: 2 warm-up copies, then 10
// copies each timed alone with CUDA events.
CopyBandwidth measure_copy_bandwidth(size_t bytes = size_t{2} << 30);

}  // namespace entropyinfer::cuda

#include <algorithm>
#include <atomic>
#include <string>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}

void check_launch(const char* kernel_name) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  throw Error(std::string("CUDA kernel ") + kernel_name +
              " failed to launch: " + cudaGetErrorString(status));
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later queries start clean
    return 0;
  }
  return count;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  return capture != cudaStreamCaptureStatusNone;
}

std::pair<size_t, size_t> device_memory() {
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return {free_bytes, total_bytes};
}

int compute_capability() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
        "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

int multiprocessor_count() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  return count;
}

namespace {
std::atomic<size_t> allocated_bytes{0};
std::atomic<size_t> peak_bytes{0};
}  // namespace

size_t allocated_device_bytes() { return allocated_bytes.load(); }
size_t peak_allocated_device_bytes() { return peak_bytes.load(); }
void reset_peak_allocated_device_bytes() { peak_bytes.store(allocated_bytes.load()); }

void device_free(void* pointer, size_t bytes) noexcept {
  if (pointer == nullptr) return;
  cudaFree(pointer);
  allocated_bytes.fetch_sub(bytes);
}

void* device_allocate(size_t bytes) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status == cudaSuccess) {
    const size_t now = allocated_bytes.fetch_add(bytes) + bytes;
    size_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
    return pointer;
  }
  cudaGetLastError();
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  auto gib = [](size_t value) {
    return std::to_string(static_cast<double>(value) / (1 << 30)).substr(0, 6);
  };
  throw Error("GPU allocation of " + gib(bytes) + " GiB failed (" + cudaGetErrorString(status) +
              "); " + gib(free_bytes) + " GiB of " + gib(total_bytes) + " GiB are free");
}

EventStopwatch::EventStopwatch() {
  check(cudaEventCreate(&start_), "cudaEventCreate");
  const cudaError_t status = cudaEventCreate(&stop_);
  if (status != cudaSuccess) cudaEventDestroy(start_);
  check(status, "cudaEventCreate");
}

EventStopwatch::~EventStopwatch() {
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
}

float EventStopwatch::time_ms(cudaStream_t stream, const std::function<void()>& work) {
  check(cudaEventRecord(start_, stream), "cudaEventRecord");
  work();
  check(cudaEventRecord(stop_, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  return ms;
}

}  // namespace entropyinfer::cuda

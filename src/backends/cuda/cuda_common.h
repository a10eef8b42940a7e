// What every CUDA source of the engine shares: error checks that turn CUDA failures into
// entropyinfer::Error (one message naming the call and CUDA's reason), owned device buffers, and
// the bf16 type. Host code compiled by the plain C++ compiler may include this header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "core/error.h"

namespace entropyinfer::cuda {

using bf16 = __nv_bfloat16;

// Throws Error("<what>: <CUDA's message>") unless status is cudaSuccess.
void check(cudaError_t status, const char* what);

// Throws if the last kernel launch failed (bad configuration, no kernel image for this GPU, ...).
void check_launch(const char* kernel_name);

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// Free and total bytes of the current device.
std::pair<size_t, size_t> device_memory();

// Compute capability of the current device as major * 10 + minor (90 for Hopper).
int compute_capability();

// Number of multiprocessors of the current device.
int multiprocessor_count();

// Whether `stream` is being captured into a CUDA graph (work that synchronises must wait).
bool stream_capturing(cudaStream_t stream);

// Throws Error naming the bytes asked for and the bytes free. Every allocation of the engine goes
// through here (DeviceBuffer does), so that its current and peak GPU memory can be reported.
void* device_allocate(size_t bytes);
void device_free(void* pointer, size_t bytes) noexcept;
size_t allocated_device_bytes();
size_t peak_allocated_device_bytes();
void reset_peak_allocated_device_bytes();  // the peak restarts from what is allocated now

// Times one piece of GPU work at a time with a pair of CUDA events: time_ms records the start on
// `stream`, calls `work` (which enqueues there), records the stop and waits for it.
class EventStopwatch {
 public:
  EventStopwatch();
  ~EventStopwatch();
  EventStopwatch(const EventStopwatch&) = delete;
  EventStopwatch& operator=(const EventStopwatch&) = delete;
  float time_ms(cudaStream_t stream, const std::function<void()>& work);

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Device memory of `count` elements of T, freed on destruction. Allocation failures throw Error
// naming the size asked for and what is free.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { allocate(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }

  void allocate(size_t count);
  void release() noexcept {
    if (data_ != nullptr) device_free(data_, count_ * sizeof(T));
    data_ = nullptr;
    count_ = 0;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void upload(const T* host, size_t count, size_t offset = 0) {
    check(cudaMemcpy(data_ + offset, host, count * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy to device");
  }
  void download(T* host, size_t count, size_t offset = 0) const {
    check(cudaMemcpy(host, data_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost),
          "cudaMemcpy to host");
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

template <typename T>
void DeviceBuffer<T>::allocate(size_t count) {
  release();
  if (count == 0) return;
  data_ = static_cast<T*>(device_allocate(count * sizeof(T)));
  count_ = count;
}

}  // namespace entropyinfer::cuda

// Helpers of the GPU tests: the skip when no GPU is present, random inputs rounded to bf16 (so that
// the CPU reference sees exactly what the GPU sees), bf16 transfers and error measures.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "core/half.h"

#define ENTROPYINFER_REQUIRE_GPU()                                                 \
  do {                                                                             \
    if (::entropyinfer::cuda::device_count() == 0) {                               \
      GTEST_SKIP() << "no CUDA device here; the GPU tests run on the GPU machine " \
                      "(scripts/gpu_round.sh)";                                    \
    }                                                                              \
  } while (0)

namespace entropyinfer::gpu_test {

// Values drawn from N(0, sigma) (or U(-scale, scale) with uniform), rounded to bf16.
inline std::vector<float> random_bf16_values(size_t count, uint32_t seed, float scale = 1.0f,
                                             bool uniform = false) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_real_distribution<float> flat(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) {
    value = bf16_to_f32(f32_to_bf16(uniform ? flat(generator) : normal(generator)));
  }
  return values;
}

inline std::vector<float> random_floats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> flat(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = flat(generator);
  return values;
}

inline cuda::DeviceBuffer<cuda::bf16> upload_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  cuda::DeviceBuffer<cuda::bf16> buffer(values.size());
  buffer.upload(reinterpret_cast<const cuda::bf16*>(bits.data()), bits.size());
  return buffer;
}

inline std::vector<float> download_bf16(const cuda::DeviceBuffer<cuda::bf16>& buffer) {
  std::vector<uint16_t> bits(buffer.size());
  buffer.download(reinterpret_cast<cuda::bf16*>(bits.data()), bits.size());
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_f32(bits[i]);
  return values;
}

inline cuda::DeviceBuffer<float> upload_floats(const std::vector<float>& values) {
  cuda::DeviceBuffer<float> buffer(values.size());
  buffer.upload(values.data(), values.size());
  return buffer;
}

inline std::vector<float> download_floats(const cuda::DeviceBuffer<float>& buffer) {
  std::vector<float> values(buffer.size());
  buffer.download(values.data(), values.size());
  return values;
}

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer<T>& buffer) {
  std::vector<T> values(buffer.size());
  buffer.download(values.data(), values.size());
  return values;
}

// Fills a bf16 buffer with NaN, so that any element a kernel fails to write shows up.
inline void poison(cuda::DeviceBuffer<cuda::bf16>& buffer) {
  cuda::check(cudaMemset(buffer.data(), 0xff, buffer.bytes()), "cudaMemset");
}

struct Difference {
  double max_abs_error = 0;
  double relative_l2 = 0;  // |actual - expected| / |expected|
  int64_t non_finite = 0;  // NaN or infinite values in actual
  int64_t worst_index = -1;
};

inline Difference compare(const std::vector<float>& actual, const std::vector<float>& expected) {
  Difference d;
  double error_squares = 0, reference_squares = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!std::isfinite(actual[i])) {
      ++d.non_finite;
      continue;
    }
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (error > d.max_abs_error) {
      d.max_abs_error = error;
      d.worst_index = static_cast<int64_t>(i);
    }
    error_squares += error * error;
    reference_squares += static_cast<double>(expected[i]) * expected[i];
  }
  d.relative_l2 = reference_squares > 0 ? std::sqrt(error_squares / reference_squares)
                                        : std::sqrt(error_squares);
  return d;
}

// Largest |actual - expected| - relative * |expected| (<= absolute passes).
inline double worst_excess(const std::vector<float>& actual, const std::vector<float>& expected,
                           double relative) {
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!std::isfinite(actual[i])) return INFINITY;
    const double excess =
        std::fabs(static_cast<double>(actual[i]) - expected[i]) - relative * std::fabs(expected[i]);
    if (excess > worst) worst = excess;
  }
  return worst;
}

}  // namespace entropyinfer::gpu_test

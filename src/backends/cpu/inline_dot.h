// A dot product meant to be inlined into the CPU kernels' inner loops, where the enclosing
// function's target clone (AVX2 or the portable default) decides the vector width.
#pragma once

#include <cstdint>

namespace entropyinfer::cpu {

inline float inline_dot(const float* a, const float* b, int64_t size) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < size; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace entropyinfer::cpu

// The entropy rule's budget arithmetic (docs/method.md sections 2.6 and 2.7), written once for the
// CPU policy (entropy_prefill.cpp) and the GPU's budget kernel (prefill_estimate.cu), which include
// it as host and as device code. Products and sums are rounded one at a time, never fused into a
// multiply-add, so that equal entropies give equal budgets on both to the last bit.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ENTROPYINFER_HOST_DEVICE __host__ __device__
#else
#define ENTROPYINFER_HOST_DEVICE
#endif

namespace entropyinfer::entropy_budget {

ENTROPYINFER_HOST_DEVICE inline double multiply(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

ENTROPYINFER_HOST_DEVICE inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// std::clamp's comparisons, in its order (std::clamp itself is not device code).
ENTROPYINFER_HOST_DEVICE inline double clamp(double value, double low, double high) {
  return value < low ? low : (high < value ? high : value);
}

// B[s] of a dynamic head for segment s >= 1, from B[s-1] and the entropies of segments s and s-1:
// the relative entropy change (delta itself at s = 1, where there is no earlier change), clamped
// to [0, 1 + delta], moves the budget by alpha * base per unit above delta, within [base, cap].
ENTROPYINFER_HOST_DEVICE inline double next_budget(double previous_budget, double entropy,
                                                   double previous_entropy, int64_t segment,
                                                   double base, double cap, double delta,
                                                   double alpha) {
  double ratio = delta;
  if (segment >= 2) ratio = (entropy - previous_entropy) / (previous_entropy + 1e-9);
  ratio = clamp(ratio, 0.0, 1.0 + delta);
  return clamp(add(previous_budget, multiply(multiply(alpha, base), ratio - delta)), base, cap);
}

// The budget of segment s >= 1: the base for a rigid head, and with the per-segment variant
// (PrefillParams::per_segment_rigid) for a segment whose own entropy is below the threshold;
// otherwise next_budget.
ENTROPYINFER_HOST_DEVICE inline double segment_budget(bool rigid_head, bool per_segment_rigid,
                                                      double threshold, double previous_budget,
                                                      double entropy, double previous_entropy,
                                                      int64_t segment, double base, double cap,
                                                      double delta, double alpha) {
  if (rigid_head || (per_segment_rigid && entropy < threshold)) return base;
  return next_budget(previous_budget, entropy, previous_entropy, segment, base, cap, delta, alpha);
}

// Key blocks a budget of `budget_tokens` buys among `visible` blocks of `block_size` tokens.
ENTROPYINFER_HOST_DEVICE inline int64_t budget_blocks(double budget_tokens, int block_size,
                                                      int64_t visible) {
  const auto blocks = static_cast<int64_t>(floor(budget_tokens / block_size));
  return blocks < 0 ? 0 : (blocks > visible ? visible : blocks);
}

}  // namespace entropyinfer::entropy_budget

// FP8 (OCP E4M3) quantization: the rounding, the scale rules for weights and activations, and how
// a product applies them. The loader, the CPU reference products and the CUDA kernels all follow
// these definitions (the CUDA ones are tested bit for bit against them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/half.h"

namespace entropyinfer {

inline constexpr float kFp8E4M3Max = 448.0f;
// The smallest dynamic activation scale (vLLM's bound): a row of zeros still gets a finite scale,
// and a tiny one is not blown up past what its codes can hold.
inline constexpr float kFp8MinActivationScale = 1.0f / (kFp8E4M3Max * 512.0f);

// fp32 -> E4M3, rounding to nearest even and saturating at +-448 (what PyTorch's clamp-then-cast
// and CUDA's __NV_SATFINITE conversion do). NaN stays NaN.
inline uint8_t f32_to_fp8_e4m3(float value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return static_cast<uint8_t>(sign | 0x7f);
  if (magnitude >= kFp8E4M3Max) return static_cast<uint8_t>(sign | 0x7e);
  if (magnitude < 0x1p-6f) {
    // Subnormals step by 2^-9; a count of 8 is the smallest normal, 0x08, as encoded.
    return static_cast<uint8_t>(sign | static_cast<int>(std::nearbyint(magnitude * 0x1p9f)));
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  // magnitude = (1 + m / 8) * 2^(exponent - 1), m rounded to nearest even over eighths.
  int mantissa = static_cast<int>(std::nearbyint((fraction * 2.0f - 1.0f) * 8.0f));
  int biased = exponent - 1 + 7;
  if (mantissa == 8) {
    mantissa = 0;
    ++biased;
  }
  return static_cast<uint8_t>(sign | (biased << 3) | mantissa);
}

// The value x takes after quantization with `scale`: fp8(x / scale) * scale.
inline float fp8_round_trip(float x, float scale) {
  return fp8_e4m3_to_f32(f32_to_fp8_e4m3(x / scale)) * scale;
}

// The scale of a weight row (or tensor) whose largest magnitude is `amax`: the largest maps to 448;
// an all-zero row gets 1.
inline float fp8_weight_scale(float amax) { return amax > 0.0f ? amax / kFp8E4M3Max : 1.0f; }

// The FP8 KV cache's rule (EngineOptions::fp8_kv_cache): every cached row (one token's key, or
// value, of one KV head; `width` = head_dim floats) is quantized on its own, with the weight rule's
// scale from the row's largest magnitude, and each element is held as fp8_round_trip(x, scale).
// The CUDA kernels follow it bit for bit from their bf16 inputs.
inline float fp8_kv_row_scale(const float* row, int width) {
  float amax = 0.0f;
  for (int i = 0; i < width; ++i) amax = std::max(amax, std::fabs(row[i]));
  return fp8_weight_scale(amax);
}

// The row's codes (`width` of them) under that rule; returns its scale.
inline float fp8_kv_quantize_row(const float* row, int width, uint8_t* codes) {
  const float scale = fp8_kv_row_scale(row, width);
  for (int i = 0; i < width; ++i) codes[i] = f32_to_fp8_e4m3(row[i] / scale);
  return scale;
}

// The row replaced, in place, by what the FP8 cache reads back from it.
inline void fp8_kv_round_trip_row(float* row, int width) {
  const float scale = fp8_kv_row_scale(row, width);
  for (int i = 0; i < width; ++i) row[i] = fp8_round_trip(row[i], scale);
}

// How an FP8 product quantizes its input rows before multiplying, as the checkpoint's
// quantization_config says.
struct Fp8Activations {
  enum class Kind {
    kNone,             // weights only: the input is used as it is
    kDynamicPerToken,  // each row's own scale, from its largest magnitude, at run time
    kStaticPerTensor,  // one calibrated scale per product (the checkpoint's input_scale)
  };
  Kind kind = Kind::kNone;
  // kDynamicPerToken: a row's largest magnitude is clamped to this before its scale is taken
  // (fbgemm_fp8's activation_scale_ub); 0 means no bound.
  float upper_bound = 0.0f;

  std::string describe() const {
    switch (kind) {
      case Kind::kNone:
        return "none";
      case Kind::kDynamicPerToken:
        return upper_bound > 0.0f ? "dynamic per-token, bound " + std::to_string(upper_bound)
                                  : "dynamic per-token";
      case Kind::kStaticPerTensor:
        return "static per-tensor";
    }
    return "";
  }
};

// A dynamic row scale from the row's largest magnitude.
inline float fp8_dynamic_scale(float amax, float upper_bound) {
  if (upper_bound > 0.0f) amax = std::min(amax, upper_bound);
  return std::max(amax / kFp8E4M3Max, kFp8MinActivationScale);
}

}  // namespace entropyinfer

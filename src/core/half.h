// The element types found in checkpoints, and conversions between fp32 and the 16-bit ones.
#pragma once

#include <cstdint>
#include <cstring>

namespace entropyinfer {

// The element types this engine reads and computes with. kF8E4M3 (OCP FP8 E4M3, "F8_E4M3" in
// safetensors) only as stored in a checkpoint: the loader widens such matrices with their scales,
// so no weight view holds it.
enum class TensorDtype { kF32, kBF16, kF16, kF8E4M3 };

inline float bf16_to_f32(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Round-to-nearest-even, as PyTorch does when it casts fp32 to bf16.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float f16_to_f32(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0) {
    if (mantissa == 0) {
      out = sign;
    } else {  // subnormal: renormalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      out = sign | (static_cast<uint32_t>(127 - 15 - shift + 1) << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else {
    out = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof(value));
  return value;
}

// OCP FP8 E4M3 (the "fn" variant PyTorch calls float8_e4m3fn): 1 sign, 4 exponent (bias 7) and 3
// mantissa bits, subnormals below 2^-6, no infinities, S.1111.111 is NaN; 448 is the largest.
inline float fp8_e4m3_to_f32(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = __builtin_nanf("");
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;
  } else {
    magnitude = (1.0f + static_cast<float>(mantissa) / 8.0f) * __builtin_ldexpf(1.0f, exponent - 7);
  }
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

}  // namespace entropyinfer

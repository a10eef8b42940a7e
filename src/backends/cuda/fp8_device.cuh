// E4M3 conversions on the device that follow core/fp8.h bit for bit, shared by the FP8 products,
// the FP8 KV cache and FP8 attention's staging.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "core/fp8.h"

namespace entropyinfer::cuda::fp8 {

// Round to nearest even, saturating at +-448: f32_to_fp8_e4m3.
__device__ __forceinline__ uint8_t to_e4m3(float value) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float e4m3_value(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// Two codes (the low one first) as an fp16 pair, exactly: every E4M3 value is an fp16 value.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_codes) {
  const __half2_raw pair =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(pair.x) | (static_cast<uint32_t>(pair.y) << 16);
}

// fp8_weight_scale with IEEE division, as the host's: the largest magnitude maps to 448, a zero
// row gets 1.
__device__ __forceinline__ float row_scale(float amax) {
  return amax > 0.0f ? __fdiv_rn(amax, kFp8E4M3Max) : 1.0f;
}

// The largest of amax and the magnitudes of eight packed bf16 values.
__device__ __forceinline__ float bf16_max_magnitude(const uint4& packed, float amax) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 values = __bfloat1622float2(pairs[i]);
    amax = fmaxf(amax, fmaxf(fabsf(values.x), fabsf(values.y)));
  }
  return amax;
}

// Eight bf16 values as E4M3 codes of value / scale, packed in 8 bytes.
__device__ __forceinline__ uint2 quantize8(const uint4& packed, float scale) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  uint8_t codes[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 values = __bfloat1622float2(pairs[i]);
    codes[2 * i] = to_e4m3(__fdiv_rn(values.x, scale));
    codes[2 * i + 1] = to_e4m3(__fdiv_rn(values.y, scale));
  }
  uint2 out;
  memcpy(&out, codes, sizeof(out));
  return out;
}

}  // namespace entropyinfer::cuda::fp8

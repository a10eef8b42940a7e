// Row rules that more than one kernel applies: block reductions, the RMSNorm of an fp32 row as
// rms_norm's vector kernel computes it, and SwiGLU of a bf16 pair. Fused kernels (an FP8 product's
// input quantization after a norm or SwiGLU) call these, so that they write the same bits as the
// unfused kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

namespace entropyinfer::cuda::row_ops {

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / 32;
  value = lane < warps ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Largest value over a block of blockDim.x threads (a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_max(float value) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Threads of a block that normalizes one fp32 row with kVectors float4s per thread: each keeps its
// loads in registers between the sum of squares and the scaling (one read of the row).
constexpr int kRowNormThreads = 128;

// The RMSNorm of one fp32 row of `size` (a multiple of 4, at most 4 * kRowNormThreads * kVectors)
// times `weight`, rounded to bf16: thread i's v-th result is float4 i + v * kRowNormThreads of the
// row, as four bf16 packed in a uint2 (zeros past the row). Every thread of the block must call it.
template <int kVectors>
__device__ __forceinline__ void rms_norm_row(const float* x, const float* weight, int64_t size,
                                             float eps, uint2 (&out)[kVectors]) {
  const float4* row = reinterpret_cast<const float4*>(x);
  const float4* weights = reinterpret_cast<const float4*>(weight);
  const int vectors = static_cast<int>(size / 4);
  float4 values[kVectors];
  float squares = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = threadIdx.x + v * kRowNormThreads;
    values[v] = index < vectors ? row[index] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    squares += values[v].x * values[v].x + values[v].y * values[v].y + values[v].z * values[v].z +
               values[v].w * values[v].w;
  }
  const float inverse_rms = rsqrtf(block_sum(squares) / static_cast<float>(size) + eps);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = threadIdx.x + v * kRowNormThreads;
    const float4 w = index < vectors ? weights[index] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const __nv_bfloat162 low =
        __floats2bfloat162_rn(values[v].x * inverse_rms * w.x, values[v].y * inverse_rms * w.y);
    const __nv_bfloat162 high =
        __floats2bfloat162_rn(values[v].z * inverse_rms * w.z, values[v].w * inverse_rms * w.w);
    out[v].x = *reinterpret_cast<const unsigned*>(&low);
    out[v].y = *reinterpret_cast<const unsigned*>(&high);
  }
}

// float4s per thread that rms_norm_row needs for a row of `size`: the fewest of 2, 4, 8 or 16
// that cover it, or 0 where it does not apply (a size not a multiple of 4, operands not aligned
// for its float4 loads and 8-byte stores, or a row wider than 16 float4s per thread).
inline int rms_norm_row_vectors(const float* x, const float* weight, int64_t size,
                                const void* out) {
  const bool aligned = size % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(weight) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (!aligned) return 0;
  for (const int vectors : {2, 4, 8, 16}) {
    if (size <= int64_t{4} * kRowNormThreads * vectors) return vectors;
  }
  return 0;
}

// silu(gate) * up for a pair, rounded to bf16.
__device__ __forceinline__ __nv_bfloat162 swiglu_pair(__nv_bfloat162 gate, __nv_bfloat162 up) {
  const float2 g = __bfloat1622float2(gate);
  const float2 u = __bfloat1622float2(up);
  return __floats2bfloat162_rn(g.x / (1.0f + __expf(-g.x)) * u.x,
                               g.y / (1.0f + __expf(-g.y)) * u.y);
}

}  // namespace entropyinfer::cuda::row_ops

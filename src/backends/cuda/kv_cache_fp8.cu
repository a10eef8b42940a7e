// Bulk quantization and widening of FP8 KV cache rows (kv_cache_fp8.h): one warp per row of keys
// or values.
#include <string>

#include "backends/cuda/dependent_launch.cuh"
#include "backends/cuda/fp8_device.cuh"
#include "backends/cuda/kv_cache_fp8.h"

namespace entropyinfer::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block
constexpr int kMaxHeadDim = 512;  // 16 elements per lane

__device__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// blockIdx.y: cache; blockIdx.z: 0 keys, 1 values; warp w of block x: row first + x * 8 + w.
__global__ void quantize_kv_rows_kernel(bf16* keys, bf16* values, int64_t stride, int head_dim,
                                        int64_t first, int64_t count, Fp8KvCache cache,
                                        int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const bool is_value = blockIdx.z == 1;
  if (lengths != nullptr && index == 0 && !is_value && lane == 0) {
    lengths[blockIdx.y] = static_cast<int32_t>(first + count);
  }
  if (index >= count) return;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * stride + first + index;
  bf16* staged = (is_value ? values : keys) + row * head_dim;
  uint8_t* codes = (is_value ? cache.value_codes : cache.key_codes) + row * head_dim;
  float elements[kMaxHeadDim / 32];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxHeadDim / 32; ++i) {
    const int e = lane + 32 * i;
    elements[i] = e < head_dim ? __bfloat162float(staged[e]) : 0.0f;
    amax = fmaxf(amax, fabsf(elements[i]));
  }
  const float scale = fp8::row_scale(warp_max(amax));
#pragma unroll
  for (int i = 0; i < kMaxHeadDim / 32; ++i) {
    const int e = lane + 32 * i;
    if (e >= head_dim) break;
    const uint8_t code = fp8::to_e4m3(__fdiv_rn(elements[i], scale));
    codes[e] = code;
    staged[e] = __float2bfloat16(fp8::e4m3_value(code) * scale);
  }
  if (lane == 0) (is_value ? cache.value_scales : cache.key_scales)[row] = scale;
}

__global__ void dequantize_kv_rows_kernel(Fp8KvCache cache, int64_t stride, int head_dim,
                                          int64_t first, int64_t count, bf16* keys, bf16* values) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (index >= count) return;
  const bool is_value = blockIdx.z == 1;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * stride + first + index;
  const uint8_t* codes = (is_value ? cache.value_codes : cache.key_codes) + row * head_dim;
  const float scale = (is_value ? cache.value_scales : cache.key_scales)[row];
  bf16* staged = (is_value ? values : keys) + row * head_dim;
  for (int e = lane; e < head_dim; e += 32) {
    staged[e] = __float2bfloat16(fp8::e4m3_value(codes[e]) * scale);
  }
}

void check_rows(const char* what, int64_t caches, int64_t stride, int64_t head_dim, int64_t first,
                int64_t count, const Fp8KvCache& cache, const bf16* keys, const bf16* values) {
  if (caches <= 0 || caches > 65535 || head_dim <= 0 || head_dim > kMaxHeadDim || first < 0 ||
      count < 0 || first + count > stride) {
    throw Error(std::string(what) + ": rows [" + std::to_string(first) + ", " +
                std::to_string(first + count) + ") of " + std::to_string(caches) +
                " caches of stride " + std::to_string(stride) + " and head_dim " +
                std::to_string(head_dim) + " are out of range");
  }
  if (cache.key_codes == nullptr || cache.value_codes == nullptr || cache.key_scales == nullptr ||
      cache.value_scales == nullptr || keys == nullptr || values == nullptr) {
    throw Error(std::string(what) + ": null pointer");
  }
}

dim3 grid_of(int64_t caches, int64_t count) {
  return dim3(static_cast<unsigned>((count + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned>(caches), 2);
}

}  // namespace

void quantize_kv_rows(bf16* keys, bf16* values, int64_t caches, int64_t stride, int64_t head_dim,
                      int64_t first, int64_t count, const Fp8KvCache& cache, int32_t* lengths,
                      cudaStream_t stream) {
  check_rows("FP8 cache quantization", caches, stride, head_dim, first, count, cache, keys, values);
  // An empty span still sets the lengths: one block per cache.
  launch_dependent("quantize_kv_rows_kernel", quantize_kv_rows_kernel,
                   grid_of(caches, std::max<int64_t>(count, 1)), dim3(32 * kRowsPerBlock), 0,
                   stream, keys, values, stride, static_cast<int>(head_dim), first, count, cache,
                   lengths);
}

void dequantize_kv_rows(const Fp8KvCache& cache, int64_t caches, int64_t stride, int64_t head_dim,
                        int64_t first, int64_t count, bf16* keys, bf16* values,
                        cudaStream_t stream) {
  check_rows("FP8 cache widening", caches, stride, head_dim, first, count, cache, keys, values);
  if (count == 0) return;
  launch_dependent("dequantize_kv_rows_kernel", dequantize_kv_rows_kernel, grid_of(caches, count),
                   dim3(32 * kRowsPerBlock), 0, stream, cache, stride, static_cast<int>(head_dim),
                   first, count, keys, values);
}

}  // namespace entropyinfer::cuda

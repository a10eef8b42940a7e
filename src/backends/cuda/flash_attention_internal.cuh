// Shared between the attention kernels: their parameters and the PTX wrappers (cp.async, ldmatrix,
// mma.sync, exp2) both kernel files use. Internal to the CUDA backend.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda::detail {

struct FlashParams {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* out = nullptr;
  // Split-KV partial results (both null when the kernel writes `out` directly):
  // partial_out [splits][tokens * q_heads][head_dim] normalised by its own sum, partial_lse
  // [splits][tokens * q_heads] its log2-sum-exp2 of scaled scores.
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int64_t q_token_stride = 0;
  int64_t out_token_stride = 0;
  int64_t cache_stride = 0;
  int tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int group = 0;  // q_heads / kv_heads
  int rows = 0;   // tokens * group: the packed (token, head-in-group) rows of one KV head
  int first_position = 0;
  // When set, first_position is read from here at run time (a captured CUDA graph replays at every
  // position); the launch's split count must then cover the largest position.
  const int* device_position = nullptr;
  int splits = 1;
  float scale_log2 = 0.0f;  // softmax scale times log2(e)
};

// Launches the sm_90a kernel; defined in flash_attention_wgmma.cu.
void launch_wgmma_prefill(const FlashParams& params, int head_dim, bool pipelined,
                          cudaStream_t stream);
bool wgmma_kernel_compiled();

// ------------------------------------------------------------------------------------------------
// Device helpers

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte asynchronous copy global -> shared; bytes < 16 zero-fills the rest (0 writes zeros only).
__device__ __forceinline__ void cp_async_16(uint32_t shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b for one m16n8k16 tile: bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// Where packed row `row` of KV head `kv_head` lives in a [tokens][q_heads][head_dim] tensor.
__device__ __forceinline__ int64_t packed_row_offset(int row, int group, int kv_head,
                                                     int64_t token_stride, int head_dim) {
  const int token = row / group;
  const int head = kv_head * group + (row - token * group);
  return token * token_stride + static_cast<int64_t>(head) * head_dim;
}

}  // namespace entropyinfer::cuda::detail

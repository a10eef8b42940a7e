// Hopper (sm_90a) building blocks of the warp-specialised attention kernels: the 128-byte-swizzled
// shared-memory layout and its wgmma descriptors, named barriers, and the fences and waits around
// asynchronous matrix instructions. Internal to the CUDA backend; only compiled for sm_90a.
#pragma once

#include <cstdint>

namespace entropyinfer::cuda::detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `rows` rows: column blocks of
// [rows][128 bytes], chunk index XOR (row mod 8) inside each 1024-byte group of 8 rows.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk, int rows) {
  return (chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

// wgmma shared-memory matrix descriptor with the 128-byte swizzle.
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t address, uint32_t leading_bytes,
                                                     uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Makes this thread's ordinary shared-memory writes (cp.async included) visible to the tensor
// cores.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across the asynchronous
// matrix instructions that own them until the wait.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}

// The same for A-operand fragments held in registers.
template <int kCount>
__device__ __forceinline__ void fence_fragments(uint32_t (&registers)[kCount][4]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    asm volatile(""
                 : "+r"(registers[i][0]), "+r"(registers[i][1]), "+r"(registers[i][2]),
                   "+r"(registers[i][3])::"memory");
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace entropyinfer::cuda::detail

// Programmatic dependent launch (sm_90), for the chain of small kernels a decode step is made of.
//
// A kernel launched with launch_dependent() may be scheduled while the kernel before it in the
// stream still runs, as soon as every block of that kernel has called allow_dependent_launch() (or
// finished). Its blocks then sit in wait_for_prerequisite_grids() until the kernel before has
// finished and its writes are visible, so the launch latency between the two is hidden and the
// ordering is that of an ordinary launch. The rule for every kernel launched this way: call
// wait_for_prerequisite_grids() before touching any memory another kernel writes or reads (the
// single-token products read their weights, which no kernel writes, before it). Both instructions
// are no-ops when the kernel was launched in the ordinary way or before sm_90.
#pragma once

#include <utility>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda {

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(arguments...) with the programmatic-serialization
// attribute; throws Error naming `what` when the launch fails.
template <typename... Parameters, typename... Arguments>
void launch_dependent(const char* what, void (*kernel)(Parameters...), dim3 grid, dim3 block,
                      size_t shared_bytes, cudaStream_t stream, Arguments&&... arguments) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...), what);
}

}  // namespace entropyinfer::cuda

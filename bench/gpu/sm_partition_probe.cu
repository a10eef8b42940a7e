// Can a decode step's weight stream run beside a prefill slice's products if each gets its own
// multiprocessors? The server's slices (compute-bound bf16 GEMMs) fill every multiprocessor, so a
// decode step on a second stream waits for them; here green contexts split the GPU into k
// multiprocessors for a memory stream (the decode step's weights) and the rest for GEMMs (the
// slice), and the probe times, in one process:
//   each alone on the whole GPU, each alone on its partition, and both at once on theirs.
// "Both at once" against "one after the other on the whole GPU" is what the server would gain.
// Standalone, outside the CMake build; on the GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/probe bench/gpu/sm_partition_probe.cu -lcublas -lcuda
//   /tmp/probe 16 24 32
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      std::printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define DK(x)                                                   \
  do {                                                          \
    CUresult r = (x);                                           \
    if (r != CUDA_SUCCESS) {                                    \
      const char* text = nullptr;                               \
      cuGetErrorString(r, &text);                               \
      std::printf("driver %s at %d: %s\n", #x, __LINE__, text); \
      std::exit(1);                                             \
    }                                                           \
  } while (0)
#define BK(x)                                                                  \
  do {                                                                         \
    cublasStatus_t s = (x);                                                    \
    if (s != CUBLAS_STATUS_SUCCESS) {                                          \
      std::printf("cuBLAS %s at %d: %d\n", #x, __LINE__, static_cast<int>(s)); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// Reads `words` 16-byte words, each once, with loads that skip L1, and keeps a checksum so that
// nothing is optimised away: what a decode step's GEMVs do to the weights.
__global__ void stream_kernel(const uint4* data, size_t words, unsigned* checksum) {
  unsigned sum = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 w = __ldcs(data + i);
    sum ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (sum == 0x12345678u) atomicAdd(checksum, 1u);
}

__global__ void fill_kernel(uint4* data, size_t words) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const unsigned h = static_cast<unsigned>(i) * 2654435761u;
    data[i] = make_uint4(h, h ^ 0x9e3779b9u, h + 7, h >> 3);
  }
}

struct Work {
  // The slice: `gemms` bf16 products of [m x k] by [k x n], fp32 accumulation.
  int m = 8192, k = 4096, n = 14336, gemms = 4;
  // The decode step's weights: `passes` reads of a buffer larger than L2.
  size_t stream_bytes = size_t{4} << 30;
  int passes = 4;
};

struct Buffers {
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
  uint4* stream = nullptr;
  unsigned* checksum = nullptr;
};

void enqueue_gemms(cublasHandle_t handle, const Work& work, const Buffers& buffers,
                   cudaStream_t stream) {
  BK(cublasSetStream(handle, stream));
  const float alpha = 1.0f, beta = 0.0f;
  for (int i = 0; i < work.gemms; ++i) {
    BK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, work.n, work.m, work.k, &alpha, buffers.b,
                    CUDA_R_16BF, work.k, buffers.a, CUDA_R_16BF, work.k, &beta, buffers.c,
                    CUDA_R_16BF, work.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void enqueue_stream(const Work& work, const Buffers& buffers, int multiprocessors,
                    cudaStream_t stream) {
  const size_t words = work.stream_bytes / 16;
  for (int pass = 0; pass < work.passes; ++pass) {
    stream_kernel<<<multiprocessors * 8, 256, 0, stream>>>(buffers.stream, words, buffers.checksum);
  }
  CK(cudaGetLastError());
}

// Median wall time in ms of `run` (which enqueues and synchronises), after one warm-up.
double median_ms(const std::function<void()>& run, int repeats = 5) {
  run();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char** argv) {
  std::vector<unsigned> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(static_cast<unsigned>(std::atoi(argv[i])));
  if (counts.empty()) counts = {16, 24, 32};

  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  DK(cuInit(0));
  CUdevice device;
  DK(cuDeviceGet(&device, 0));
  cudaDeviceProp properties{};
  CK(cudaGetDeviceProperties(&properties, 0));

  Work work;
  Buffers buffers;
  CK(cudaMalloc(&buffers.a, sizeof(__nv_bfloat16) * work.m * work.k));
  CK(cudaMalloc(&buffers.b, sizeof(__nv_bfloat16) * work.k * work.n));
  CK(cudaMalloc(&buffers.c, sizeof(__nv_bfloat16) * work.m * work.n));
  CK(cudaMalloc(&buffers.stream, work.stream_bytes));
  CK(cudaMalloc(&buffers.checksum, sizeof(unsigned)));
  CK(cudaMemset(buffers.a, 0x3c, sizeof(__nv_bfloat16) * work.m * work.k));  // about 0.01
  CK(cudaMemset(buffers.b, 0x3c, sizeof(__nv_bfloat16) * work.k * work.n));
  fill_kernel<<<1024, 256>>>(buffers.stream, work.stream_bytes / 16);
  CK(cudaDeviceSynchronize());
  cublasHandle_t handle;
  BK(cublasCreate(&handle));

  cudaStream_t whole;
  CK(cudaStreamCreateWithFlags(&whole, cudaStreamNonBlocking));
  const int all = properties.multiProcessorCount;
  const double gemm_flops = 2.0 * work.m * work.k * static_cast<double>(work.n) * work.gemms;
  const double stream_bytes = static_cast<double>(work.stream_bytes) * work.passes;
  const double gemm_whole = median_ms([&] {
    enqueue_gemms(handle, work, buffers, whole);
    CK(cudaStreamSynchronize(whole));
  });
  const double stream_whole = median_ms([&] {
    enqueue_stream(work, buffers, all, whole);
    CK(cudaStreamSynchronize(whole));
  });
  std::printf("%s, %d multiprocessors\n", properties.name, all);
  std::printf(
      "whole GPU: GEMMs %.2f ms (%.0f TFLOP/s), stream %.2f ms (%.0f GB/s), one after "
      "the other %.2f ms\n",
      gemm_whole, gemm_flops / gemm_whole / 1e9, stream_whole, stream_bytes / stream_whole / 1e6,
      gemm_whole + stream_whole);

  CUdevResource sm_all;
  DK(cuDeviceGetDevResource(device, &sm_all, CU_DEV_RESOURCE_TYPE_SM));
  std::printf("SM resource: %u multiprocessors, partitions of at least %u, aligned to %u\n",
              sm_all.sm.smCount, sm_all.sm.minSmPartitionSize, sm_all.sm.smCoscheduledAlignment);
  for (const unsigned count : counts) {
    CUdevResource group, rest;
    unsigned groups = 1;
    DK(cuDevSmResourceSplitByCount(&group, &groups, &sm_all, &rest, 0, count));
    if (groups != 1) {
      std::printf("%u multiprocessors: no split\n", count);
      continue;
    }
    CUdevResourceDesc small_desc, rest_desc;
    DK(cuDevResourceGenerateDesc(&small_desc, &group, 1));
    DK(cuDevResourceGenerateDesc(&rest_desc, &rest, 1));
    CUgreenCtx small_context, rest_context;
    DK(cuGreenCtxCreate(&small_context, small_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
    DK(cuGreenCtxCreate(&rest_context, rest_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
    CUstream small_stream, rest_stream;
    DK(cuGreenCtxStreamCreate(&small_stream, small_context, CU_STREAM_NON_BLOCKING, 0));
    DK(cuGreenCtxStreamCreate(&rest_stream, rest_context, CU_STREAM_NON_BLOCKING, 0));
    const int small = static_cast<int>(group.sm.smCount), large = static_cast<int>(rest.sm.smCount);
    // Work goes to a green context's stream with that context current, as the runtime launches
    // into the current context; the memory is the primary context's, which green contexts share.
    CUcontext primary, small_current, rest_current;
    DK(cuCtxGetCurrent(&primary));
    DK(cuCtxFromGreenCtx(&small_current, small_context));
    DK(cuCtxFromGreenCtx(&rest_current, rest_context));
    const auto gemms = [&] {
      DK(cuCtxSetCurrent(rest_current));
      enqueue_gemms(handle, work, buffers, rest_stream);
      DK(cuCtxSetCurrent(primary));
    };
    const auto stream = [&] {
      DK(cuCtxSetCurrent(small_current));
      enqueue_stream(work, buffers, small, small_stream);
      DK(cuCtxSetCurrent(primary));
    };
    const double gemm_alone = median_ms([&] {
      gemms();
      DK(cuStreamSynchronize(rest_stream));
    });
    const double stream_alone = median_ms([&] {
      stream();
      DK(cuStreamSynchronize(small_stream));
    });
    const double both = median_ms([&] {
      gemms();
      stream();
      DK(cuStreamSynchronize(rest_stream));
      DK(cuStreamSynchronize(small_stream));
    });
    std::printf(
        "stream on %d, GEMMs on %d: GEMMs alone %.2f ms, stream alone %.2f ms (%.0f GB/s), "
        "both at once %.2f ms: %.2fx one after the other on the whole GPU\n",
        small, large, gemm_alone, stream_alone, stream_bytes / stream_alone / 1e6, both,
        (gemm_whole + stream_whole) / both);
    CK(cudaDeviceSynchronize());
    DK(cuStreamDestroy(small_stream));
    DK(cuStreamDestroy(rest_stream));
    DK(cuGreenCtxDestroy(small_context));
    DK(cuGreenCtxDestroy(rest_context));
  }
  return 0;
}

// FP8 products (core/fp8.h) on Hopper: quantizing product inputs and weight rows to E4M3, the
// single-token FP8 GEMV, a tensor-core kernel for a few rows (decode batches), and cuBLASLt's FP8
// matmul with one scale per weight row and one per input row applied in its epilogue.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/cuda/cublaslt_library.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.cuh"
#include "backends/cuda/fp8_device.cuh"
#include "backends/cuda/row_ops.cuh"

namespace entropyinfer::cuda {
namespace {

constexpr int kQuantizeThreads = 256;

enum ActivationKind : int { kNoQuantization = 0, kDynamicPerToken = 1, kStaticPerTensor = 2 };

int kind_of(const Fp8Activations& scheme) {
  switch (scheme.kind) {
    case Fp8Activations::Kind::kDynamicPerToken:
      return kDynamicPerToken;
    case Fp8Activations::Kind::kStaticPerTensor:
      return kStaticPerTensor;
    case Fp8Activations::Kind::kNone:
      break;
  }
  return kNoQuantization;
}

using row_ops::block_max;

using fp8::bf16_max_magnitude;
using fp8::e4m3_value;
using fp8::quantize8;
using fp8::to_e4m3;

// fp8_dynamic_scale, with IEEE division as the host's.
__device__ __forceinline__ float dynamic_scale(float amax, float upper_bound) {
  if (upper_bound > 0.0f) amax = fminf(amax, upper_bound);
  return fmaxf(__fdiv_rn(amax, kFp8E4M3Max), kFp8MinActivationScale);
}

// One block per row. kVector: width and the row stride are multiples of 8 and x is 16-byte aligned,
// so rows go by 16-byte loads. kind: kDynamicPerToken or kStaticPerTensor; kWeights takes the
// weight rule (amax / 448, 1 for a zero row) instead of the activations' one.
template <bool kVector, bool kWeights>
__global__ void quantize_rows_kernel(const bf16* x, int64_t width, int64_t x_stride, int kind,
                                     float upper_bound, float static_scale, uint8_t* codes,
                                     float* scales) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t row = blockIdx.x;
  const bf16* in = x + row * x_stride;
  uint8_t* out = codes + row * width;
  float scale = static_scale;
  if (kWeights || kind == kDynamicPerToken) {
    float amax = 0.0f;
    if constexpr (kVector) {
      const uint4* packed = reinterpret_cast<const uint4*>(in);
      for (int64_t i = threadIdx.x; i < width / 8; i += blockDim.x)
        amax = bf16_max_magnitude(packed[i], amax);
    } else {
      for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
        amax = fmaxf(amax, fabsf(__bfloat162float(in[i])));
    }
    amax = block_max(amax);
    if constexpr (kWeights) {
      scale = fp8::row_scale(amax);
    } else {
      scale = dynamic_scale(amax, upper_bound);
    }
  }
  if constexpr (kVector) {
    const uint4* packed = reinterpret_cast<const uint4*>(in);
    uint2* packed_out = reinterpret_cast<uint2*>(out);
    for (int64_t i = threadIdx.x; i < width / 8; i += blockDim.x)
      packed_out[i] = quantize8(packed[i], scale);
  } else {
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
      out[i] = to_e4m3(__fdiv_rn(__bfloat162float(in[i]), scale));
  }
  if (threadIdx.x == 0) scales[row] = scale;
}

template <bool kWeights>
void launch_quantize_rows(const bf16* x, int64_t rows, int64_t width, int64_t x_stride, int kind,
                          float upper_bound, float static_scale, uint8_t* codes, float* scales,
                          cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  if (rows > 0x7fffffff) throw Error("FP8 quantization: too many rows");
  const bool vector = width % 8 == 0 && x_stride % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  auto* kernel =
      vector ? quantize_rows_kernel<true, kWeights> : quantize_rows_kernel<false, kWeights>;
  launch_dependent("FP8 quantization", kernel, dim3(static_cast<unsigned>(rows)),
                   dim3(kQuantizeThreads), 0, stream, x, width, x_stride, kind, upper_bound,
                   static_scale, codes, scales);
}

// Sum of 16 products: E4M3 weights packed in one 16-byte word, against the GEMV's fp16 inputs in
// two. The products are exact in fp16 (kGemvInputShift); their sum of 16 rounds to fp16 (2^-11
// relative) before it joins the fp32 sum: a fifth of the instructions of widening both operands
// to fp32, which left the GEMV bound by issue rather than by memory.
__device__ __forceinline__ float dot16(const uint4& weights, const uint4& low, const uint4& high) {
  const __nv_fp8x2_storage_t* w2 = reinterpret_cast<const __nv_fp8x2_storage_t*>(&weights);
  const __half2* x_low = reinterpret_cast<const __half2*>(&low);
  const __half2* x_high = reinterpret_cast<const __half2*>(&high);
  __half2 sum = __float2half2_rn(0.0f);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 w = __half2(__nv_cvt_fp8x2_to_halfraw2(w2[i], __NV_E4M3));
    sum = __hfma2(w, i < 4 ? x_low[i] : x_high[i - 4], sum);
  }
  const float2 pair = __half22float2(sum);
  return pair.x + pair.y;
}

// The FP8 GEMV multiplies in fp16: a weight code's value (at most 448) times an input code's value
// scaled by kGemvInputShift (at most 1.75) is exact, and a sum of 16 such products stays far
// below fp16's largest value (65504).
constexpr float kGemvInputShift = 1.0f / 256.0f;

// Two bf16 values of a product's input quantized with `scale`, as the fp16 values their codes
// stand for times kGemvInputShift (exact in fp16): what the FP8 GEMV multiplies.
__device__ __forceinline__ uint32_t gemv_input_pair(uint32_t bf16_pair, float scale) {
  const float2 values = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bf16_pair));
  const __half2 halves =
      __floats2half2_rn(e4m3_value(to_e4m3(__fdiv_rn(values.x, scale))) * kGemvInputShift,
                        e4m3_value(to_e4m3(__fdiv_rn(values.y, scale))) * kGemvInputShift);
  return *reinterpret_cast<const uint32_t*>(&halves);
}

__device__ __forceinline__ float bf16_pair_max_magnitude(uint32_t bf16_pair, float amax) {
  const float2 values = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bf16_pair));
  return fmaxf(amax, fmaxf(fabsf(values.x), fabsf(values.y)));
}

// One input row quantized as an FP8 product's input (gemv_input_pair), with its scale: what the
// FP8 GEMV multiplies. One block; 16-byte loads.
__global__ void quantize_row_decoded_kernel(const bf16* x, int64_t width, int kind,
                                            float upper_bound, float static_scale, __half* out,
                                            float* scale_out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const uint4* input = reinterpret_cast<const uint4*>(x);
  uint4* output = reinterpret_cast<uint4*>(out);
  const int64_t words = width / 8;
  float scale = static_scale;
  if (kind == kDynamicPerToken) {
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
      amax = bf16_max_magnitude(input[i], amax);
    scale = dynamic_scale(block_max(amax), upper_bound);
  }
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
    const uint4 word = input[i];
    output[i] = make_uint4(gemv_input_pair(word.x, scale), gemv_input_pair(word.y, scale),
                           gemv_input_pair(word.z, scale), gemv_input_pair(word.w, scale));
  }
  if (threadIdx.x == 0) *scale_out = scale;
}

// The RMSNorm of one fp32 row (row_ops::rms_norm_row, the rms_norm kernel's arithmetic), written
// to `normed`, and those bf16 values quantized as quantize_row_decoded_kernel does: a decode step's
// norm and its FP8 GEMV's input in one launch instead of two.
template <int kVectors>
__global__ void __launch_bounds__(row_ops::kRowNormThreads)
    rms_norm_quantize_row_kernel(const float* x, const float* weight, int64_t size, float eps,
                                 int kind, float upper_bound, float static_scale, bf16* normed,
                                 __half* out, float* scale_out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  uint2 values[kVectors];
  row_ops::rms_norm_row<kVectors>(x, weight, size, eps, values);
  const int vectors = static_cast<int>(size / 4);
  float scale = static_scale;
  if (kind == kDynamicPerToken) {
    float amax = 0.0f;  // the zeros past the row change nothing
#pragma unroll
    for (int v = 0; v < kVectors; ++v)
      amax = bf16_pair_max_magnitude(values[v].y, bf16_pair_max_magnitude(values[v].x, amax));
    scale = dynamic_scale(block_max(amax), upper_bound);
  }
  uint2* normed_row = reinterpret_cast<uint2*>(normed);
  uint2* output = reinterpret_cast<uint2*>(out);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = threadIdx.x + v * row_ops::kRowNormThreads;
    if (index >= vectors) break;
    normed_row[index] = values[v];
    output[index] =
        make_uint2(gemv_input_pair(values[v].x, scale), gemv_input_pair(values[v].y, scale));
  }
  if (threadIdx.x == 0) *scale_out = scale;
}

// SwiGLU of one row (gate and up, bf16, row_ops::swiglu_pair), written to `activation`, and those
// values quantized as quantize_row_decoded_kernel does: one launch instead of two. kChunks 16-byte
// chunks (eight values) per thread stay in registers between the largest magnitude and the codes.
constexpr int kSwigluQuantizeThreads = 512;

template <int kChunks>
__global__ void __launch_bounds__(kSwigluQuantizeThreads)
    swiglu_quantize_row_kernel(const uint4* gate, const uint4* up, int64_t chunks, int kind,
                               float upper_bound, float static_scale, uint4* activation, uint4* out,
                               float* scale_out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  uint4 values[kChunks];
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t index = threadIdx.x + static_cast<int64_t>(c) * kSwigluQuantizeThreads;
    values[c] = make_uint4(0, 0, 0, 0);
    if (index >= chunks) continue;
    const uint4 g = gate[index], u = up[index];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&values[c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) r2[i] = row_ops::swiglu_pair(g2[i], u2[i]);
    amax = bf16_max_magnitude(values[c], amax);
  }
  const float scale =
      kind == kDynamicPerToken ? dynamic_scale(block_max(amax), upper_bound) : static_scale;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t index = threadIdx.x + static_cast<int64_t>(c) * kSwigluQuantizeThreads;
    if (index >= chunks) break;
    const uint4 word = values[c];
    activation[index] = word;
    out[index] = make_uint4(gemv_input_pair(word.x, scale), gemv_input_pair(word.y, scale),
                            gemv_input_pair(word.z, scale), gemv_input_pair(word.w, scale));
  }
  if (threadIdx.x == 0) *scale_out = scale;
}

// y[o] (+)= x_scale * w_scale[o] * sum_k q(x)[k] * code(o, k): one warp per output row, x being
// the quantized input's values times kGemvInputShift (quantize_row_decoded_kernel).
// The weights are requested before waiting for the kernel that writes x, and stream through with
// 16-byte loads (16 codes) that skip L1; x (small, shared by all rows) stays cached.
// With kQuantizes, x is the bf16 row itself: every block quantizes it into shared memory as
// quantize_row_decoded_kernel would (the same scale and values), which spares a decode step the
// launch of that kernel for products whose input no other kernel prepares.
template <typename Out, bool kAccumulate, int kInFlight, bool kQuantizes>
__global__ void fp8_gemv_kernel(const void* __restrict__ x, const float* __restrict__ x_scale,
                                const uint8_t* __restrict__ w, const float* __restrict__ w_scales,
                                int64_t in, int64_t out, Out* __restrict__ y, int kind,
                                float upper_bound, float static_scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Rows past the end still take part in the block's quantization below.
  const bool has_row = row < out;
  const uint4* weights = reinterpret_cast<const uint4*>(w + (has_row ? row : 0) * in);
  const int64_t chunks = has_row ? in / 16 : 0;
  int64_t c = lane;
  uint4 w_chunk[kInFlight];
  bool full = c + 32 * (kInFlight - 1) < chunks;
  if (full) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) w_chunk[u] = __ldcs(weights + c + 32 * u);
  }
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const uint4* input = reinterpret_cast<const uint4*>(x);
  float scale;
  if constexpr (kQuantizes) {
    extern __shared__ uint4 decoded_row[];  // in / 8 chunks of fp16 values
    const int64_t words = in / 8;
    scale = static_scale;
    if (kind == kDynamicPerToken) {
      float amax = 0.0f;
      for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
        amax = bf16_max_magnitude(input[i], amax);
      scale = dynamic_scale(block_max(amax), upper_bound);
    }
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
      const uint4 word = input[i];
      decoded_row[i] = make_uint4(gemv_input_pair(word.x, scale), gemv_input_pair(word.y, scale),
                                  gemv_input_pair(word.z, scale), gemv_input_pair(word.w, scale));
    }
    __syncthreads();
    input = decoded_row;
  } else {
    scale = *x_scale;
  }
  const auto input_chunk = [&](int64_t index) {
    if constexpr (kQuantizes) {
      return input[index];
    } else {
      return __ldg(input + index);
    }
  };
  float sum = 0.0f;
  while (full) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t chunk = c + 32 * u;
      sum += dot16(w_chunk[u], input_chunk(2 * chunk), input_chunk(2 * chunk + 1));
    }
    c += 32 * kInFlight;
    full = c + 32 * (kInFlight - 1) < chunks;
    if (full) {
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) w_chunk[u] = __ldcs(weights + c + 32 * u);
    }
  }
  // The last chunks (fewer than kInFlight per lane) requested together, not one round trip each.
#pragma unroll
  for (int u = 0; u < kInFlight - 1; ++u) {
    w_chunk[u] = c + 32 * u < chunks ? __ldcs(weights + c + 32 * u) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kInFlight - 1; ++u) {
    const int64_t chunk = c + 32 * u;
    if (chunk < chunks)
      sum += dot16(w_chunk[u], input_chunk(2 * chunk), input_chunk(2 * chunk + 1));
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane != 0 || !has_row) return;
  const float value = sum * (scale * (1.0f / kGemvInputShift)) * w_scales[row];
  if constexpr (std::is_same_v<Out, float>) {
    y[row] = kAccumulate ? y[row] + value : value;
  } else {
    y[row] = __float2bfloat16(value);
  }
}

constexpr int kFp8GemvThreads = 256;
constexpr int kFp8GemvInFlight = 8;
constexpr int kQuantizeRowThreads = 512;
// The widest input a GEMV block quantizes into its own shared memory (fp16 values, 2 bytes each).
constexpr int64_t kGemvQuantizedInputMax = 8192;

dim3 fp8_gemv_grid(int64_t out) {
  const int warps = kFp8GemvThreads / 32;
  return dim3(static_cast<unsigned>((out + warps - 1) / warps));
}

// The GEMV from an input row already quantized into `decoded` and `scale`.
template <typename Out, bool kAccumulate>
void launch_fp8_gemv_decoded(const __half* decoded, const float* scale, const DeviceMatrix& w,
                             int64_t in, int64_t out, Out* y, cudaStream_t stream) {
  launch_dependent("FP8 GEMV", fp8_gemv_kernel<Out, kAccumulate, kFp8GemvInFlight, false>,
                   fp8_gemv_grid(out), dim3(kFp8GemvThreads), 0, stream,
                   static_cast<const void*>(decoded), scale, w.codes, w.scales, in, out, y,
                   kNoQuantization, 0.0f, 0.0f);
}

// The GEMV of the bf16 row x: quantized by each block where it fits in shared memory, else by
// quantize_row_decoded_kernel into `decoded` and `scale` first.
template <typename Out, bool kAccumulate>
void launch_fp8_gemv(const bf16* x, const DeviceMatrix& w, int64_t in, int64_t out, Out* y,
                     __half* decoded, float* scale, cudaStream_t stream) {
  if (in <= kGemvQuantizedInputMax) {
    launch_dependent(
        "FP8 GEMV quantizing its input", fp8_gemv_kernel<Out, kAccumulate, kFp8GemvInFlight, true>,
        fp8_gemv_grid(out), dim3(kFp8GemvThreads), sizeof(__half) * in, stream,
        static_cast<const void*>(x), static_cast<const float*>(nullptr), w.codes, w.scales, in, out,
        y, kind_of(w.activations), w.activations.upper_bound, w.input_scale);
    return;
  }
  launch_dependent("FP8 GEMV input", quantize_row_decoded_kernel, dim3(1),
                   dim3(kQuantizeRowThreads), 0, stream, x, in, kind_of(w.activations),
                   w.activations.upper_bound, w.input_scale, decoded, scale);
  launch_fp8_gemv_decoded<Out, kAccumulate>(decoded, scale, w, in, out, y, stream);
}

using NormQuantizeKernel = void (*)(const float*, const float*, int64_t, float, int, float, float,
                                    bf16*, __half*, float*);

// rms_norm_quantize_row_kernel wherever rms_norm runs its vector kernel, with as many float4s per
// thread (row_ops::rms_norm_row_vectors), so that both compute the same bits; nullptr elsewhere.
NormQuantizeKernel rms_norm_quantize_kernel_for(const float* x, const float* weight, int64_t size,
                                                const bf16* normed) {
  switch (row_ops::rms_norm_row_vectors(x, weight, size, normed)) {
    case 2:
      return rms_norm_quantize_row_kernel<2>;
    case 4:
      return rms_norm_quantize_row_kernel<4>;
    case 8:
      return rms_norm_quantize_row_kernel<8>;
    case 16:
      return rms_norm_quantize_row_kernel<16>;
    default:
      return nullptr;
  }
}

using SwigluQuantizeKernel = void (*)(const uint4*, const uint4*, int64_t, int, float, float,
                                      uint4*, uint4*, float*);

// swiglu_quantize_row_kernel with just enough chunks per thread for `width` values, or nullptr.
SwigluQuantizeKernel swiglu_quantize_kernel_for(const bf16* gate, const bf16* up, int64_t width,
                                                const bf16* activation) {
  const bool aligned = width % 8 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(up) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(activation) % 16 == 0;
  if (!aligned) return nullptr;
  static const std::pair<int, SwigluQuantizeKernel> kernels[] = {
      {1, swiglu_quantize_row_kernel<1>},
      {2, swiglu_quantize_row_kernel<2>},
      {4, swiglu_quantize_row_kernel<4>},
      {8, swiglu_quantize_row_kernel<8>}};
  for (const auto& [chunks, kernel] : kernels) {
    if (width <= int64_t{8} * kSwigluQuantizeThreads * chunks) return kernel;
  }
  return nullptr;
}

// Products of a few rows (a small decode batch): y[t][o] (+)= x_scale[t] * w_scale[o] *
// sum_k q(x)[t][k] * code(o, k), on the tensor cores through mma.sync m16n8k32 (E4M3 in, fp32
// sums). A block owns kSmallBatchRowsPerBlock output rows and all kTiles * 8 input rows; its
// warps split k in 64-byte chunks (chunk c to warp c % warps) and add their sums through shared
// memory. cuBLASLt's FP8 matmul reads the weights at 0.14-0.59 of the copy bandwidth at 2-8 rows,
// no faster than bf16 there; this kernel streams them with 16-byte loads as the GEMV does, and is
// 1.1-1.8x faster than it at 2 and 8 rows on the H200. With 4 or 8 tiles (32 or 64 rows; its
// results as exact there) it was the slower, its input loads growing with the rows, so batches
// past one tile stay with cuBLASLt.
//
// Operand layout: mma's A fragment gives lane (g = lane / 4, t = lane % 4) columns t*4..t*4+3 and
// 16+t*4..16+t*4+3 of rows g and g+8; B the same columns of input row g. A sum over k does not
// depend on the order of k, so each lane instead loads 16 contiguous bytes (t*16..t*16+15 of a
// 64-byte chunk) of its weight rows and of its input row, and both operands take bytes 0-3 and
// 4-7 of them for the first mma of the chunk, 8-11 and 12-15 for the second: A and B pair the
// same k in every product.
constexpr int kSmallBatchRowsPerBlock = 16;
constexpr int kSmallBatchWarps = 8;
constexpr int kSmallBatchMaxRows = 8;   // one mma column tile
constexpr int kSmallBatchChunk = 64;    // bytes of k per lane group per step
constexpr int kSmallBatchInFlight = 4;  // chunks each warp loads before its products

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // E4M3 tensor-core products need sm_89 or later; FP8 products need Hopper anyway
#endif
}

template <typename Out, bool kAccumulate, int kTiles>
__global__ void __launch_bounds__(kSmallBatchWarps * 32)
    fp8_small_batch_kernel(const uint8_t* __restrict__ x, const float* __restrict__ x_scales,
                           int tokens, const uint8_t* __restrict__ w,
                           const float* __restrict__ w_scales, int64_t in, int64_t out,
                           Out* __restrict__ y, int64_t y_stride) {
  __shared__ float sums[kSmallBatchWarps][kSmallBatchRowsPerBlock][kTiles * 8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, in_group = lane % 4;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kSmallBatchRowsPerBlock;
  const uint8_t* row_low = w + (first_row + group) * in + in_group * 16;
  const uint8_t* row_high = row_low + 8 * in;
  const int64_t chunks = in / kSmallBatchChunk;
  constexpr int64_t kStep = kSmallBatchWarps * kSmallBatchInFlight;  // chunks per warp step
  // Loads the weights of the chunks base + u * kSmallBatchWarps (zeros past the last).
  auto load = [&](int64_t base, uint4(&low)[kSmallBatchInFlight],
                  uint4(&high)[kSmallBatchInFlight]) {
#pragma unroll
    for (int u = 0; u < kSmallBatchInFlight; ++u) {
      const int64_t chunk = base + static_cast<int64_t>(u) * kSmallBatchWarps;
      if (chunk < chunks) {
        low[u] = __ldcs(reinterpret_cast<const uint4*>(row_low + chunk * kSmallBatchChunk));
        high[u] = __ldcs(reinterpret_cast<const uint4*>(row_high + chunk * kSmallBatchChunk));
      } else {
        low[u] = high[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  float c[kTiles][4] = {};
  uint4 low[kSmallBatchInFlight], high[kSmallBatchInFlight];
  // The weights do not depend on the kernel that quantizes x: their first loads go out before
  // waiting for it, and each step's loads before the previous step's products.
  load(warp, low, high);
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  for (int64_t base = warp; base < chunks; base += kStep) {
    uint4 next_low[kSmallBatchInFlight], next_high[kSmallBatchInFlight];
    load(base + kStep, next_low, next_high);
#pragma unroll
    for (int u = 0; u < kSmallBatchInFlight; ++u) {
      const int64_t chunk = base + static_cast<int64_t>(u) * kSmallBatchWarps;
      if (chunk >= chunks) break;
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        const int token = tile * 8 + group;
        uint4 b = make_uint4(0, 0, 0, 0);
        if (token < tokens) {
          b = __ldg(reinterpret_cast<const uint4*>(x + token * in + chunk * kSmallBatchChunk +
                                                   in_group * 16));
        }
        mma_e4m3(c[tile], low[u].x, high[u].x, low[u].y, high[u].y, b.x, b.y);
        mma_e4m3(c[tile], low[u].z, high[u].z, low[u].w, high[u].w, b.z, b.w);
      }
    }
#pragma unroll
    for (int u = 0; u < kSmallBatchInFlight; ++u) {
      low[u] = next_low[u];
      high[u] = next_high[u];
    }
  }
  // c[tile]: rows group and group + 8, input rows tile * 8 + in_group * 2 + {0, 1}.
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    const int column = tile * 8 + in_group * 2;
    sums[warp][group][column] = c[tile][0];
    sums[warp][group][column + 1] = c[tile][1];
    sums[warp][group + 8][column] = c[tile][2];
    sums[warp][group + 8][column + 1] = c[tile][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kSmallBatchRowsPerBlock * tokens; i += blockDim.x) {
    const int row = i % kSmallBatchRowsPerBlock, token = i / kSmallBatchRowsPerBlock;
    float sum = 0.0f;
#pragma unroll
    for (int other = 0; other < kSmallBatchWarps; ++other) sum += sums[other][row][token];
    const int64_t o = first_row + row;
    const float value = sum * x_scales[token] * w_scales[o];
    Out* target = y + token * y_stride + o;
    if constexpr (std::is_same_v<Out, float>) {
      *target = kAccumulate ? *target + value : value;
    } else {
      *target = __float2bfloat16(value);
    }
  }
}

template <typename Out, bool kAccumulate>
void launch_fp8_small_batch(const uint8_t* x, const float* x_scales, int64_t tokens,
                            const DeviceMatrix& w, int64_t in, int64_t out, Out* y,
                            int64_t y_stride, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(out / kSmallBatchRowsPerBlock));
  const dim3 block(kSmallBatchWarps * 32);
  launch_dependent("FP8 small batch",
                   fp8_small_batch_kernel<Out, kAccumulate, kSmallBatchMaxRows / 8>, grid, block, 0,
                   stream, x, x_scales, static_cast<int>(tokens), w.codes, w.scales, in, out, y,
                   y_stride);
}

// y[t][o] (+)= raw[t][o] * weight_scales[o] * input_scales[t]: the scales of an FP8 product that
// cuBLASLt ran unscaled. Four outputs a thread (out is a multiple of 4).
template <typename Out, bool kAccumulate>
__global__ void apply_fp8_scales_kernel(const float* __restrict__ raw,
                                        const float* __restrict__ weight_scales,
                                        const float* __restrict__ input_scales, int64_t out,
                                        Out* __restrict__ y, int64_t y_stride) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (o >= out) return;
  const int64_t t = blockIdx.y;
  const float input_scale = input_scales[t];
  const float4 sums = *reinterpret_cast<const float4*>(raw + t * out + o);
  const float4 scales = *reinterpret_cast<const float4*>(weight_scales + o);
  const float values[4] = {sums.x * scales.x * input_scale, sums.y * scales.y * input_scale,
                           sums.z * scales.z * input_scale, sums.w * scales.w * input_scale};
  Out* target = y + t * y_stride + o;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<Out, float>) {
      target[i] = kAccumulate ? target[i] + values[i] : values[i];
    } else {
      target[i] = __float2bfloat16(values[i]);
    }
  }
}

template <typename Out, bool kAccumulate>
void launch_apply_fp8_scales(const float* raw, const float* weight_scales,
                             const float* input_scales, int64_t tokens, int64_t out, Out* y,
                             int64_t y_stride, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const dim3 grid(static_cast<unsigned>((out / 4 + kThreads - 1) / kThreads),
                  static_cast<unsigned>(tokens));
  launch_dependent("FP8 product scales", apply_fp8_scales_kernel<Out, kAccumulate>, grid,
                   dim3(kThreads), 0, stream, raw, weight_scales, input_scales, out, y, y_stride);
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Runs launch<Out, kAccumulate>(y) for a product's output form: rounded into bf16, written as
// fp32, or added to fp32 (bf16 outputs are never accumulated into).
template <typename Launch>
void with_output_form(void* y, bool fp32_out, bool accumulate, Launch&& launch) {
  if (!fp32_out) {
    launch.template operator()<bf16, false>(static_cast<bf16*>(y));
  } else if (accumulate) {
    launch.template operator()<float, true>(static_cast<float*>(y));
  } else {
    launch.template operator()<float, false>(static_cast<float*>(y));
  }
}

}  // namespace

void quantize_rows_fp8(const bf16* x, int64_t rows, int64_t width, int64_t x_stride,
                       const Fp8Activations& scheme, float static_scale, uint8_t* codes,
                       float* scales, cudaStream_t stream) {
  if (scheme.kind == Fp8Activations::Kind::kNone) {
    throw Error("FP8 quantization: the product's inputs are not quantized (weights-only FP8)");
  }
  launch_quantize_rows<false>(x, rows, width, x_stride == 0 ? width : x_stride, kind_of(scheme),
                              scheme.upper_bound, static_scale, codes, scales, stream);
}

void quantize_weight_rows_fp8(const bf16* w, int64_t rows, int64_t width, uint8_t* codes,
                              float* scales, cudaStream_t stream) {
  launch_quantize_rows<true>(w, rows, width, width, kDynamicPerToken, 0.0f, 0.0f, codes, scales,
                             stream);
}

// ---------------------------------------------------------------------------------------------------
// Blas's FP8 products

struct Blas::Fp8Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t weight_layout = nullptr, input_layout = nullptr, output_layout = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  ~Fp8Plan() {
    if (output_layout) lt::api().MatrixLayoutDestroy(output_layout);
    if (input_layout) lt::api().MatrixLayoutDestroy(input_layout);
    if (weight_layout) lt::api().MatrixLayoutDestroy(weight_layout);
    if (operation) lt::api().MatmulDescDestroy(operation);
  }
};

bool Blas::fp8_small_batch_applies(int64_t tokens, int64_t in, int64_t out) {
  return tokens >= 2 && tokens <= kSmallBatchMaxRows && in % kSmallBatchChunk == 0 &&
         out % kSmallBatchRowsPerBlock == 0;
}

void Blas::delete_fp8_plan(Fp8Plan* plan) { delete plan; }

bool Blas::fp8_separate_scaling_applies(int64_t tokens, const DeviceMatrix& w, int64_t out) const {
  return separate_scaling_ && tokens >= 2 && tokens <= kFp8SeparateScalingMaxRows && out % 4 == 0 &&
         aligned16(w.scales);
}

Blas::Fp8Plan& Blas::fp8_plan_for(int64_t tokens, int64_t in, int64_t out, int64_t y_stride,
                                  bool fp32_out, bool separate_scaling, const float* weight_scales,
                                  const float* input_scales) {
  if (separate_scaling) fp32_out = true, y_stride = out;
  const auto key = std::make_tuple(tokens, in, out, y_stride, fp32_out, fp8_fast_accumulation_,
                                   separate_scaling);
  if (auto found = fp8_plans_.find(key); found != fp8_plans_.end()) return *found->second;
  auto* plan = new Fp8Plan;
  try {
    // Column-major, as the bf16 products: y^T (out x tokens) = W^T (op T of in x out) * q(x)^T.
    // FP8 operands need this "TN" form. Each output (o, t) is scaled by the weights' scale of row
    // o and the input's of row t (outer-vector scaling, cuBLASLt 12.9 and later on Hopper).
    check_blas(lt::api().MatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    const int32_t outer_vector = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
      check_blas(lt::api().MatmulDescSetAttribute(plan->operation, attribute, value, bytes),
                 "cublasLtMatmulDescSetAttribute");
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
    set(CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep));
    const int8_t fast_accumulation = fp8_fast_accumulation_ ? 1 : 0;
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation, sizeof(fast_accumulation));
    if (!separate_scaling) {
      set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer_vector, sizeof(outer_vector));
      set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer_vector, sizeof(outer_vector));
      // The heuristic refuses vector scale modes until the scale pointers are set (cuBLASLt
      // 13.1); each product sets its own before it runs.
      set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &weight_scales, sizeof(weight_scales));
      set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &input_scales, sizeof(input_scales));
    }
    check_blas(lt::api().MatrixLayoutCreate(&plan->weight_layout, CUDA_R_8F_E4M3, in, out, in),
               "cublasLtMatrixLayoutCreate");
    check_blas(lt::api().MatrixLayoutCreate(&plan->input_layout, CUDA_R_8F_E4M3, in, tokens, in),
               "cublasLtMatrixLayoutCreate");
    check_blas(
        lt::api().MatrixLayoutCreate(&plan->output_layout, fp32_out ? CUDA_R_32F : CUDA_R_16BF, out,
                                     tokens, y_stride),
        "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t preference = nullptr;
    check_blas(lt::api().MatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const uint64_t workspace_bytes = workspace_.bytes();
    lt::api().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof(workspace_bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = lt::api().MatmulAlgoGetHeuristic(
        handle_, plan->operation, plan->weight_layout, plan->input_layout, plan->output_layout,
        plan->output_layout, preference, 1, &result, &found);
    lt::api().MatmulPreferenceDestroy(preference);
    check_blas(status, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) {
      throw Error(std::string("cuBLASLt has no FP8 algorithm ") +
                  (separate_scaling ? "without scales" : "with per-row scales") + " for a " +
                  std::to_string(tokens) + "x" + std::to_string(in) + "x" + std::to_string(out) +
                  " product (it needs cuBLAS 12.9 or later and a Hopper GPU)");
    }
    plan->algorithm = result.algo;
  } catch (...) {
    delete plan;
    throw;
  }
  fp8_plans_.emplace(key, plan);
  return *plan;
}

void Blas::reserve_fp8_inputs(int64_t tokens, int64_t width) {
  // At least one row in fp16, for the GEMV.
  const size_t codes =
      static_cast<size_t>(std::max<int64_t>(tokens, 2)) * static_cast<size_t>(width);
  if (fp8_inputs_.size() < codes) fp8_inputs_.allocate(codes);
  if (fp8_input_scales_.size() < static_cast<size_t>(tokens))
    fp8_input_scales_.allocate(static_cast<size_t>(tokens));
}

void Blas::linear_fp8(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
                      void* y, bool fp32_out, bool accumulate, int64_t y_stride) {
  if (tokens == 0 || out == 0) return;
  if (y_stride == 0) y_stride = out;
  if (in % 16 != 0 || !aligned16(x) || !aligned16(w.codes)) {
    throw Error("FP8 product: the input width " + std::to_string(in) +
                " must be a multiple of 16 and the operands 16-byte aligned");
  }
  if (w.activations.kind == Fp8Activations::Kind::kNone) {
    throw Error("FP8 product: weights-only FP8 matrices run widened to bf16 on the GPU");
  }
  if (!fp8_inputs_ready(tokens, in)) {
    throw Error("FP8 product: the input scratch for " + std::to_string(tokens) + " rows of " +
                std::to_string(in) + " was not reserved before graph capture");
  }
  if (tokens == 1 && gemv_) {
    auto* decoded = reinterpret_cast<__half*>(fp8_inputs_.data());
    float* scale = fp8_input_scales_.data();
    with_output_form(y, fp32_out, accumulate, [&]<typename Out, bool kAccumulate>(Out* out_rows) {
      launch_fp8_gemv<Out, kAccumulate>(x, w, in, out, out_rows, decoded, scale, stream_);
    });
    return;
  }
  quantize_rows_fp8(x, tokens, in, in, w.activations, w.input_scale, fp8_inputs_.data(),
                    fp8_input_scales_.data(), stream_);
  if (small_batch_ && fp8_small_batch_applies(tokens, in, out)) {
    const uint8_t* codes_in = fp8_inputs_.data();
    const float* scales_in = fp8_input_scales_.data();
    with_output_form(y, fp32_out, accumulate, [&]<typename Out, bool kAccumulate>(Out* out_rows) {
      launch_fp8_small_batch<Out, kAccumulate>(codes_in, scales_in, tokens, w, in, out, out_rows,
                                               y_stride, stream_);
    });
    return;
  }
  const float* weight_scales = w.scales;
  const float* input_scales = fp8_input_scales_.data();
  // Separate scaling: the matmul writes unscaled fp32 sums into scratch, then a kernel scales
  // them into y. Otherwise cuBLASLt applies both scale vectors in its epilogue.
  const bool separate = fp8_separate_scaling_applies(tokens, w, out);
  float* unscaled = nullptr;
  if (separate) {
    const size_t sum_count = static_cast<size_t>(tokens) * static_cast<size_t>(out);
    if (fp8_unscaled_outputs_.size() < sum_count) {
      if (stream_capturing(stream_)) {
        throw Error("FP8 product: the scratch for " + std::to_string(tokens) + " rows of " +
                    std::to_string(out) + " sums was not reserved before graph capture");
      }
      fp8_unscaled_outputs_.allocate(static_cast<size_t>(kFp8SeparateScalingMaxRows) *
                                     static_cast<size_t>(out));
    }
    unscaled = fp8_unscaled_outputs_.data();
  }
  Fp8Plan& plan =
      fp8_plan_for(tokens, in, out, y_stride, fp32_out, separate, weight_scales, input_scales);
  if (!separate) {
    check_blas(
        lt::api().MatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                         &weight_scales, sizeof(weight_scales)),
        "cublasLtMatmulDescSetAttribute");
    check_blas(
        lt::api().MatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                         &input_scales, sizeof(input_scales)),
        "cublasLtMatmulDescSetAttribute");
  }
  void* sums = separate ? static_cast<void*>(unscaled) : y;
  const float alpha = 1.0f, beta = accumulate && !separate ? 1.0f : 0.0f;
  check_blas(lt::api().Matmul(handle_, plan.operation, &alpha, w.codes, plan.weight_layout,
                              fp8_inputs_.data(), plan.input_layout, &beta, sums,
                              plan.output_layout, sums, plan.output_layout, &plan.algorithm,
                              workspace_.data(), workspace_.bytes(), stream_),
             "cublasLtMatmul (FP8)");
  if (!separate) return;
  with_output_form(y, fp32_out, accumulate, [&]<typename Out, bool kAccumulate>(Out* out_rows) {
    launch_apply_fp8_scales<Out, kAccumulate>(unscaled, weight_scales, input_scales, tokens, out,
                                              out_rows, y_stride, stream_);
  });
}

bool Blas::fp8_gemv_runs(int64_t tokens, int64_t in, const DeviceMatrix& w) {
  if (tokens != 1 || !gemv_ || !w.fp8() || w.activations.kind == Fp8Activations::Kind::kNone ||
      in % 16 != 0 || !aligned16(w.codes)) {
    return false;
  }
  return fp8_inputs_ready(1, in);  // where not, linear_fp8 names the missing reserve
}

bool Blas::fp8_inputs_ready(int64_t tokens, int64_t in) {
  // The GEMV's input is the quantized row's values in fp16: twice the bytes of its codes.
  const size_t codes =
      static_cast<size_t>(tokens) * static_cast<size_t>(in) * (tokens == 1 ? 2 : 1);
  if (fp8_inputs_.size() >= codes && fp8_input_scales_.size() >= static_cast<size_t>(tokens)) {
    return true;
  }
  if (stream_capturing(stream_)) return false;
  reserve_fp8_inputs(tokens, in);
  return true;
}

void Blas::normed_linear(const float* x, const float* norm_weight, float eps, bf16* normed,
                         int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out, bf16* y) {
  const NormQuantizeKernel fused = out > 0 && fp8_gemv_runs(tokens, in, w)
                                       ? rms_norm_quantize_kernel_for(x, norm_weight, in, normed)
                                       : nullptr;
  if (fused == nullptr) {
    rms_norm(x, norm_weight, tokens, in, eps, normed, stream_);
    linear(normed, tokens, in, w, out, y);
    return;
  }
  auto* decoded = reinterpret_cast<__half*>(fp8_inputs_.data());
  float* scale = fp8_input_scales_.data();
  launch_dependent("RMSNorm and FP8 GEMV input", fused, dim3(1), dim3(row_ops::kRowNormThreads), 0,
                   stream_, x, norm_weight, in, eps, kind_of(w.activations),
                   w.activations.upper_bound, w.input_scale, normed, decoded, scale);
  launch_fp8_gemv_decoded<bf16, false>(decoded, scale, w, in, out, y, stream_);
}

void Blas::swiglu_linear(const bf16* gate, const bf16* up, int64_t tokens, int64_t in,
                         int64_t in_stride, bf16* activation, const DeviceMatrix& w, int64_t out,
                         float* y, bool accumulate) {
  const SwigluQuantizeKernel fused = out > 0 && fp8_gemv_runs(tokens, in, w)
                                         ? swiglu_quantize_kernel_for(gate, up, in, activation)
                                         : nullptr;
  if (fused == nullptr) {
    swiglu(gate, up, tokens, in, in_stride, activation, stream_);
    linear(activation, tokens, in, w, out, y, accumulate);
    return;
  }
  auto* decoded = reinterpret_cast<__half*>(fp8_inputs_.data());
  float* scale = fp8_input_scales_.data();
  launch_dependent("SwiGLU and FP8 GEMV input", fused, dim3(1), dim3(kSwigluQuantizeThreads), 0,
                   stream_, reinterpret_cast<const uint4*>(gate),
                   reinterpret_cast<const uint4*>(up), in / 8, kind_of(w.activations),
                   w.activations.upper_bound, w.input_scale, reinterpret_cast<uint4*>(activation),
                   reinterpret_cast<uint4*>(decoded), scale);
  with_output_form(y, true, accumulate, [&]<typename Out, bool kAccumulate>(Out* out_rows) {
    launch_fp8_gemv_decoded<Out, kAccumulate>(decoded, scale, w, in, out, out_rows, stream_);
  });
}

void Blas::linear(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
                  bf16* y, int64_t y_stride) {
  if (!w.fp8()) return linear(x, tokens, in, w.values, out, y, y_stride);
  linear_fp8(x, tokens, in, w, out, y, false, false, y_stride);
}

void Blas::linear(const bf16* x, int64_t tokens, int64_t in, const DeviceMatrix& w, int64_t out,
                  float* y, bool accumulate, int64_t y_stride) {
  if (!w.fp8()) return linear(x, tokens, in, w.values, out, y, accumulate, y_stride);
  linear_fp8(x, tokens, in, w, out, y, true, accumulate, y_stride);
}

}  // namespace entropyinfer::cuda

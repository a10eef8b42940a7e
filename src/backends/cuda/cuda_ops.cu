#include <algorithm>
#include <cfloat>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/cublaslt_library.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.cuh"
#include "backends/cuda/row_ops.cuh"

namespace entropyinfer::cuda {

void check_blas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string(what) + " failed: " + lt::api().GetStatusString(status));
}

namespace {

// Rows beyond this many are strided over by the kernels that put rows on the grid's y.
constexpr int64_t kMaxGridY = 65535;

unsigned blocks_for(int64_t count, int threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

using row_ops::block_sum;
using row_ops::kRowNormThreads;

__device__ inline float load_float(const float* x) { return *x; }
__device__ inline float load_float(const bf16* x) { return __bfloat162float(*x); }

template <typename In>
__global__ void rms_norm_kernel(const In* x, const float* weight, int64_t size, float eps,
                                bf16* out, int64_t x_stride, int64_t out_stride) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const In* row = x + blockIdx.x * x_stride;
  bf16* out_row = out + blockIdx.x * out_stride;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    const float value = load_float(row + i);
    squares += value * value;
  }
  const float inverse_rms = rsqrtf(block_sum(squares) / static_cast<float>(size) + eps);
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    out_row[i] = __float2bfloat16(load_float(row + i) * inverse_rms * weight[i]);
  }
}

// fp32 rows of up to 512 * kVectors floats, kRowNormThreads per row (row_ops::rms_norm_row): many
// small blocks fit on each multiprocessor. The one-block-per-row kernel above, with 512 threads and
// a second read of the row, was bound by its reduction's latency at prefill sizes.
template <int kVectors>
__global__ void rms_norm_vector_kernel(const float* x, const float* weight, int64_t size, float eps,
                                       bf16* out, int64_t x_stride, int64_t out_stride) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  uint2 normed[kVectors];
  row_ops::rms_norm_row<kVectors>(x + blockIdx.x * x_stride, weight, size, eps, normed);
  uint2* out_row = reinterpret_cast<uint2*>(out + blockIdx.x * out_stride);
  const int vectors = static_cast<int>(size / 4);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int index = threadIdx.x + v * kRowNormThreads;
    if (index >= vectors) break;
    out_row[index] = normed[v];
  }
}

using RowNormKernel = void (*)(const float*, const float*, int64_t, float, bf16*, int64_t, int64_t);

// The vector kernel for contiguous rows of `size` (row_ops::rms_norm_row_vectors), or nullptr.
RowNormKernel rms_norm_vector_kernel_for(const float* x, const float* weight, int64_t size,
                                         const bf16* out) {
  switch (row_ops::rms_norm_row_vectors(x, weight, size, out)) {
    case 2:
      return rms_norm_vector_kernel<2>;
    case 4:
      return rms_norm_vector_kernel<4>;
    case 8:
      return rms_norm_vector_kernel<8>;
    case 16:
      return rms_norm_vector_kernel<16>;
    default:
      return nullptr;
  }
}

int norm_threads(int64_t size) {
  if (size >= 2048) return 512;
  if (size >= 512) return 256;
  return 64;
}

// One warp per (token, head).
__global__ void head_rms_norm_kernel(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                     int64_t token_stride, const float* weight, float eps) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= tokens * heads) return;
  bf16* head = x + (warp / heads) * token_stride + (warp % heads) * head_dim;
  float squares = 0.0f;
  for (int64_t i = lane; i < head_dim; i += 32) {
    const float value = __bfloat162float(head[i]);
    squares += value * value;
  }
  for (int offset = 16; offset > 0; offset >>= 1)
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  const float inverse_rms = rsqrtf(squares / static_cast<float>(head_dim) + eps);
  for (int64_t i = lane; i < head_dim; i += 32) {
    head[i] = __float2bfloat16(__bfloat162float(head[i]) * inverse_rms * weight[i]);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] += y[i];
}

template <typename T>
__global__ void add_bias_kernel(T* y, const float* bias, int64_t rows, int64_t width,
                                int64_t stride) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  T* element = y + (i / width) * stride + i % width;
  if constexpr (std::is_same_v<T, float>) {
    *element += bias[i % width];
  } else {
    *element = __float2bfloat16(__bfloat162float(*element) + bias[i % width]);
  }
}

__global__ void swiglu_kernel(const bf16* gate, const bf16* up, int64_t rows, int64_t width,
                              int64_t in_stride, bf16* out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  const int64_t row = i / width, column = i % width;
  const __nv_bfloat162 pair =
      row_ops::swiglu_pair(__bfloat162bfloat162(gate[row * in_stride + column]),
                           __bfloat162bfloat162(up[row * in_stride + column]));
  out[i] = __low2bfloat16(pair);
}

// Eight columns per thread (16-byte loads and store), rows along the grid's y (strided past its
// limit): no 64-bit division per element, an eighth of the memory instructions of the kernel above.
__global__ void swiglu_vector_kernel(const uint4* gate, const uint4* up, int64_t rows,
                                     int64_t chunks, int64_t in_stride_chunks, uint4* out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= chunks) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const uint4 g = gate[row * in_stride_chunks + chunk];
    const uint4 u = up[row * in_stride_chunks + chunk];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
    uint4 result;
    __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&result);
#pragma unroll
    for (int i = 0; i < 4; ++i) r2[i] = row_ops::swiglu_pair(g2[i], u2[i]);
    out[row * chunks + chunk] = result;
  }
}

// Four pairs per thread, rows (tokens) along the grid's y: 8-byte loads of each half (16 bytes of
// adjacent pairs) and float4 angles, for rotary halves that are a multiple of 4 wide.
// With q_out, the first q_heads heads are written there (rows q_out_stride apart) instead of in
// place; the caller ensures the rotation covers whole heads.
__global__ void rope_vector_kernel(bf16* x, int64_t tokens, int heads, int head_dim,
                                   int64_t token_stride, const float* cos, const float* sin,
                                   int half, bool adjacent_pairs, const int* device_position,
                                   bf16* q_out, int64_t q_out_stride, int q_heads) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int groups = half / 4;
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= heads * groups) return;
  const int head_index = item / groups;
  const int pair = (item % groups) * 4;
  const int64_t offset = device_position != nullptr ? *device_position : 0;
  const bool elsewhere = q_out != nullptr && head_index < q_heads;
  for (int64_t token = blockIdx.y; token < tokens; token += gridDim.y) {
    const bf16* head = x + token * token_stride + static_cast<int64_t>(head_index) * head_dim;
    bf16* target = elsewhere
                       ? q_out + token * q_out_stride + static_cast<int64_t>(head_index) * head_dim
                       : x + token * token_stride + static_cast<int64_t>(head_index) * head_dim;
    const int64_t angle_row = (token + offset) * half + pair;
    const float4 c = *reinterpret_cast<const float4*>(cos + angle_row);
    const float4 s = *reinterpret_cast<const float4*>(sin + angle_row);
    float a[4], b[4];
    if (adjacent_pairs) {
      uint4 packed = *reinterpret_cast<const uint4*>(head + 2 * pair);
      const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 v = __bfloat1622float2(p2[i]);
        a[i] = v.x;
        b[i] = v.y;
      }
    } else {
      uint2 first = *reinterpret_cast<const uint2*>(head + pair);
      uint2 second = *reinterpret_cast<const uint2*>(head + pair + half);
      const __nv_bfloat162* f2 = reinterpret_cast<const __nv_bfloat162*>(&first);
      const __nv_bfloat162* s2 = reinterpret_cast<const __nv_bfloat162*>(&second);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float2 fa = __bfloat1622float2(f2[i]), fb = __bfloat1622float2(s2[i]);
        a[2 * i] = fa.x;
        a[2 * i + 1] = fa.y;
        b[2 * i] = fb.x;
        b[2 * i + 1] = fb.y;
      }
    }
    const float cs[4] = {c.x, c.y, c.z, c.w}, sn[4] = {s.x, s.y, s.z, s.w};
    float ra[4], rb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ra[i] = a[i] * cs[i] - b[i] * sn[i];
      rb[i] = b[i] * cs[i] + a[i] * sn[i];
    }
    if (adjacent_pairs) {
      uint4 packed;
      __nv_bfloat162* p2 = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
      for (int i = 0; i < 4; ++i) p2[i] = __floats2bfloat162_rn(ra[i], rb[i]);
      *reinterpret_cast<uint4*>(target + 2 * pair) = packed;
    } else {
      uint2 first, second;
      __nv_bfloat162* f2 = reinterpret_cast<__nv_bfloat162*>(&first);
      __nv_bfloat162* s2 = reinterpret_cast<__nv_bfloat162*>(&second);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        f2[i] = __floats2bfloat162_rn(ra[2 * i], ra[2 * i + 1]);
        s2[i] = __floats2bfloat162_rn(rb[2 * i], rb[2 * i + 1]);
      }
      *reinterpret_cast<uint2*>(target + pair) = first;
      *reinterpret_cast<uint2*>(target + pair + half) = second;
    }
  }
}

// One thread per rotated pair.
__global__ void rope_kernel(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim,
                            int64_t token_stride, const float* cos, const float* sin, int64_t half,
                            bool adjacent_pairs, const int* device_position) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * heads * half) return;
  const int64_t pair = i % half;
  const int64_t head_index = (i / half) % heads;
  const int64_t token = i / (half * heads);
  bf16* head = x + token * token_stride + head_index * head_dim;
  const int64_t first = adjacent_pairs ? 2 * pair : pair;
  const int64_t second = adjacent_pairs ? 2 * pair + 1 : pair + half;
  const int64_t row = token + (device_position != nullptr ? *device_position : 0);
  const float c = cos[row * half + pair], s = sin[row * half + pair];
  const float a = __bfloat162float(head[first]), b = __bfloat162float(head[second]);
  head[first] = __float2bfloat16(a * c - b * s);
  head[second] = __float2bfloat16(b * c + a * s);
}

// One thread per 8 elements (16 bytes) when head_dim allows, else per element.
template <typename Chunk>
__global__ void append_kv_kernel(const Chunk* keys, const Chunk* values, int64_t tokens,
                                 int64_t token_stride, int64_t kv_heads, int64_t head_chunks,
                                 Chunk* key_cache, Chunk* value_cache, int64_t cache_stride,
                                 int64_t first_position, const int* device_position) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * kv_heads * head_chunks) return;
  const int64_t chunk = i % head_chunks;
  const int64_t head = (i / head_chunks) % kv_heads;
  const int64_t token = i / (head_chunks * kv_heads);
  const int64_t source = token * token_stride + head * head_chunks + chunk;
  if (device_position != nullptr) first_position = *device_position;
  const int64_t target = (head * cache_stride + first_position + token) * head_chunks + chunk;
  key_cache[target] = keys[source];
  value_cache[target] = values[source];
}

__global__ void embedding_kernel(const bf16* table, const int32_t* ids, int64_t tokens,
                                 int64_t hidden, float* out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  out[i] = __bfloat162float(table[static_cast<int64_t>(ids[i / hidden]) * hidden + i % hidden]);
}

// (value, index) pairs ordered as std::max_element reads a row: the larger value wins, and of equal
// values the smaller index.
struct ArgmaxCandidate {
  float value;
  int64_t index;  // count (past every real index) until a value is seen
  int unusable;   // bit 0: a NaN or +inf was seen; bit 1: a value above -inf was seen
};

__device__ __forceinline__ bool beats(float value, int64_t index, const ArgmaxCandidate& best,
                                      int64_t count) {
  return value > best.value || (value == best.value && index < best.index) || best.index == count;
}

// The block's best over [begin, end) of `row`, in thread 0 (blockDim.x a multiple of 32).
__device__ ArgmaxCandidate block_argmax(const float* row, int64_t begin, int64_t end,
                                        int64_t count) {
  ArgmaxCandidate best{-FLT_MAX, count, 0};
  int non_finite = 0, above_minus_infinity = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float value = row[i];
    non_finite |= isnan(value) || value == INFINITY;
    above_minus_infinity |= value > -INFINITY;
    if (value > best.value || best.index == count) best = {value, i, 0};
  }
  // Every thread reaches these block-wide votes; the result is kept by thread 0 below.
  const int flags =
      (__syncthreads_or(non_finite) ? 1 : 0) | (__syncthreads_or(above_minus_infinity) ? 2 : 0);
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best.value, offset);
    const int64_t other_index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    if (other_index != count && beats(other, other_index, best, count))
      best = {other, other_index, 0};
  }
  __shared__ ArgmaxCandidate warp_best[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (warp_best[w].index != count && beats(warp_best[w].value, warp_best[w].index, best, count))
        best = warp_best[w];
    }
  }
  best.unusable = flags;
  return best;
}

// With a workspace, a row is cut into gridDim.x slices, one block each (a single block over a
// 128k-entry vocabulary took 54 us of every decode step). Each block leaves its slice's best in
// the row's partials; the last block of the row to finish (its arrival counter) combines them in
// slice order and sets the counter back to 0 for the next launch, so the kernel needs no memset
// and can sit in a captured graph.
__global__ void argmax_kernel(const float* x, int64_t count, int32_t* out,
                              ArgmaxCandidate* partials, unsigned* arrivals) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int row_index = blockIdx.y;
  const float* row = x + row_index * count;
  const int slices = static_cast<int>(gridDim.x);
  const int64_t slice_length = (count + slices - 1) / slices;
  const int64_t begin = min(count, blockIdx.x * slice_length);
  const int64_t end = min(count, begin + slice_length);
  const ArgmaxCandidate best = block_argmax(row, begin, end, count);
  // -1 for a row no token can honestly be picked from (a NaN or +inf, or nothing above -inf); the
  // host then finds and names the culprit.
  auto result_of = [](int64_t index, int flags) {
    return (flags & 1) != 0 || (flags & 2) == 0 ? -1 : static_cast<int32_t>(index);
  };
  if (slices == 1) {
    if (threadIdx.x == 0) out[row_index] = result_of(best.index, best.unusable);
    return;
  }
  volatile ArgmaxCandidate* row_partials = partials + static_cast<int64_t>(row_index) * slices;
  __shared__ bool last_block;
  if (threadIdx.x == 0) {
    row_partials[blockIdx.x].value = best.value;
    row_partials[blockIdx.x].index = best.index;
    row_partials[blockIdx.x].unusable = best.unusable;
    __threadfence();  // the partial is visible before the arrival that counts it
    last_block = atomicAdd(&arrivals[row_index], 1u) == static_cast<unsigned>(slices - 1);
  }
  __syncthreads();
  if (!last_block || threadIdx.x != 0) return;
  __threadfence();
  ArgmaxCandidate result{-FLT_MAX, count, 0};
  int flags = 0;
  for (int slice = 0; slice < slices; ++slice) {
    const float value = row_partials[slice].value;
    const int64_t index = row_partials[slice].index;
    flags |= row_partials[slice].unusable;
    if (index != count && beats(value, index, result, count)) result = {value, index, 0};
  }
  out[row_index] = result_of(result.index, flags);
  arrivals[row_index] = 0;
}

__global__ void to_bf16_kernel(const float* x, int64_t count, bf16* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2bfloat16(x[i]);
}

__global__ void to_float_kernel(const bf16* x, int64_t count, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __bfloat162float(x[i]);
}

// splitmix64 of (seed, index): independent uniform bits per element.
__device__ inline float uniform_at(uint64_t seed, int64_t index, float scale) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(index) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float unit = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return (2.0f * unit - 1.0f) * scale;
}

template <typename T>
__global__ void fill_uniform_kernel(T* x, int64_t count, uint64_t seed, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, float>) {
      x[i] = uniform_at(seed, i, scale);
    } else {
      x[i] = __float2bfloat16(uniform_at(seed, i, scale));
    }
  }
}

// Sum of the products of 8 bf16 pairs packed in two 16-byte words.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(a2[i]);
    const float2 y = __bfloat1622float2(b2[i]);
    sum = fmaf(x.x, y.x, fmaf(x.y, y.y, sum));
  }
  return sum;
}

// y[o] (+)= sum_k x[k] * w[o][k]: one warp per output row; the weights stream through with 16-byte
// loads that skip L1, kInFlight in flight per lane; x (small, shared by all rows) stays cached.
template <typename Out, bool kAccumulate, int kInFlight>
__global__ void gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t in,
                            int64_t out, Out* __restrict__ y) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= out) return;
  const uint4* weights = reinterpret_cast<const uint4*>(w + row * in);
  const uint4* input = reinterpret_cast<const uint4*>(x);
  const int64_t chunks = in / 8;
  float sum = 0.0f;
  int64_t c = lane;
  // The first weights are requested before waiting for the kernel that writes x.
  uint4 w_chunk[kInFlight];
  bool full = c + 32 * (kInFlight - 1) < chunks;
  if (full) {
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) w_chunk[u] = __ldcs(weights + c + 32 * u);
  }
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  while (full) {
    uint4 x_chunk[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) x_chunk[u] = __ldg(input + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) sum += dot8(w_chunk[u], x_chunk[u]);
    c += 32 * kInFlight;
    full = c + 32 * (kInFlight - 1) < chunks;
    if (full) {
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) w_chunk[u] = __ldcs(weights + c + 32 * u);
    }
  }
  for (; c < chunks; c += 32) sum += dot8(__ldcs(weights + c), __ldg(input + c));
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane != 0) return;
  if constexpr (std::is_same_v<Out, float>) {
    y[row] = kAccumulate ? y[row] + sum : sum;
  } else {
    y[row] = __float2bfloat16(sum);
  }
}

bool gemv_fits(const bf16* x, int64_t in, const bf16* w) {
  return in % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// What Blas::linear runs untuned: eight loads in flight per lane, 256 threads per block.
constexpr int kGemvInFlight = 8;
constexpr int kGemvThreads = 256;

// Launches a single-token product as a dependent launch (dependent_launch.cuh): it streams weights
// that no kernel writes, so it starts on them before the kernel ahead has finished.
template <typename Out, bool kAccumulate, int kInFlight = kGemvInFlight>
void launch_gemv(const bf16* x, const bf16* w, int64_t in, int64_t out, Out* y, cudaStream_t stream,
                 int threads = kGemvThreads) {
  const int warps = threads / 32;
  const dim3 grid(static_cast<unsigned>((out + warps - 1) / warps));
  launch_dependent("gemv launch", gemv_kernel<Out, kAccumulate, kInFlight>, grid, dim3(threads), 0,
                   stream, x, w, in, out, y);
}

template <int kInFlight>
void launch_gemv_float(const bf16* x, const bf16* w, int64_t in, int64_t out, float* y,
                       bool accumulate, int threads, cudaStream_t stream) {
  if (accumulate) {
    launch_gemv<float, true, kInFlight>(x, w, in, out, y, stream, threads);
  } else {
    launch_gemv<float, false, kInFlight>(x, w, in, out, y, stream, threads);
  }
}

// The GEMV of one configuration (in_flight 4, 8 or 16) for either output type.
template <typename Out>
void launch_gemv_configured(const bf16* x, const bf16* w, int64_t in, int64_t out, Out* y,
                            bool accumulate, int in_flight, int threads, cudaStream_t stream) {
  if constexpr (std::is_same_v<Out, float>) {
    switch (in_flight) {
      case 4:
        return launch_gemv_float<4>(x, w, in, out, y, accumulate, threads, stream);
      case 16:
        return launch_gemv_float<16>(x, w, in, out, y, accumulate, threads, stream);
      default:
        return launch_gemv_float<8>(x, w, in, out, y, accumulate, threads, stream);
    }
  } else {
    switch (in_flight) {
      case 4:
        return launch_gemv<bf16, false, 4>(x, w, in, out, y, stream, threads);
      case 16:
        return launch_gemv<bf16, false, 16>(x, w, in, out, y, stream, threads);
      default:
        return launch_gemv<bf16, false, 8>(x, w, in, out, y, stream, threads);
    }
  }
}

// The configurations a GEMV shape is tuned over (bench_gemm's sweep on the H200 found 4 in flight
// 12-25% faster on the 4096-row products, and 8 or 16 best on the 28672-row one).
constexpr std::pair<int, int> kGemvConfigurations[] = {{8, 256}, {4, 128},  {4, 256}, {4, 512},
                                                       {8, 128}, {16, 128}, {16, 256}};

constexpr int kThreads = 256;

}  // namespace

// ---------------------------------------------------------------------------------------------------
// cuBLASLt

constexpr int kTuneRuns = 9;
constexpr float kTuneMargin = 0.03f;

namespace {

// The median of kTuneRuns timed runs of `launch` (a candidate, already run once untimed).
float median_run_ms(EventStopwatch& stopwatch, cudaStream_t stream,
                    const std::function<void()>& launch) {
  float times[kTuneRuns];
  for (float& ms : times) ms = stopwatch.time_ms(stream, launch);
  std::sort(times, times + kTuneRuns);
  return times[kTuneRuns / 2];
}

// Which of the timed choices (ms each; negative for one that did not run) to keep: the first that
// ran, unless a later one is faster by kTuneMargin. With three runs and no margin an earlier
// version picked a cuBLASLt candidate 8% slower than the heuristic's first choice in steady use.
// -1 when none ran.
int fastest_with_margin(const std::vector<float>& times) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(times.size()); ++i) {
    const float ms = times[static_cast<size_t>(i)];
    if (ms < 0) continue;
    if (best < 0 || ms < times[static_cast<size_t>(best)] * (1.0f - kTuneMargin)) best = i;
  }
  return best;
}

// Sustained timing: back-to-back runs for kSustainedMs untimed, then the mean over as many again,
// timed as one span. Long enough for the GPU's power limiter to have pulled the clock down when the
// product draws more than the cap allows, as it does through a long prefill.
constexpr float kSustainedMs = 60.0f;

float sustained_run_ms(EventStopwatch& stopwatch, cudaStream_t stream,
                       const std::function<void()>& launch) {
  const float one_ms = std::max(stopwatch.time_ms(stream, launch), 1e-3f);
  const int runs = std::clamp(static_cast<int>(kSustainedMs / one_ms) + 1, 3, 2000);
  for (int i = 0; i < runs; ++i) launch();
  const float total_ms = stopwatch.time_ms(stream, [&] {
    for (int i = 0; i < runs; ++i) launch();
  });
  return total_ms / static_cast<float>(runs);
}

}  // namespace

struct Blas::Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t weight_layout = nullptr, input_layout = nullptr, output_layout = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  // When autotuning: the heuristic's list, until the first run has timed it. A fixed array: nvcc's
  // front end fails on std::vector<cublasLtMatmulAlgo_t> (an internal error in its destructor).
  static constexpr int kMaxCandidates = 16;
  cublasLtMatmulAlgo_t candidates[kMaxCandidates] = {};
  int candidate_count = 0;
  int chosen = 0;           // index in the heuristic's list of the algorithm that runs
  size_t output_bytes = 0;  // of the whole output, its row stride included
  ~Plan() {
    if (output_layout) lt::api().MatrixLayoutDestroy(output_layout);
    if (input_layout) lt::api().MatrixLayoutDestroy(input_layout);
    if (weight_layout) lt::api().MatrixLayoutDestroy(weight_layout);
    if (operation) lt::api().MatmulDescDestroy(operation);
  }
};

Blas::Blas(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace_bytes) {
  check_blas(lt::api().Create(&handle_), "cublasLtCreate");
}

Blas::~Blas() {
  for (auto& [key, plan] : plans_) delete plan;
  for (auto& [key, plan] : fp8_plans_) delete_fp8_plan(plan);
  if (handle_) lt::api().Destroy(handle_);
}

Blas::Plan& Blas::plan_for(int64_t tokens, int64_t in, int64_t out, int64_t y_stride, bool fp32_out,
                           int sweep_candidates) {
  // A sweep's plan has a key of its own (a negative stride, which no product uses), so that the
  // plans products run are left as they are.
  const bool sweep = sweep_candidates > 0;
  const auto key = std::make_tuple(tokens, in, out, sweep ? int64_t{-1} : y_stride, fp32_out);
  if (auto found = plans_.find(key); found != plans_.end()) return *found->second;
  auto* plan = new Plan;
  try {
    // Column-major view: y^T (out x tokens) = W (in x out, stored row-major as [out][in])^T * x^T.
    check_blas(lt::api().MatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    check_blas(lt::api().MatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                &transpose, sizeof(transpose)),
               "cublasLtMatmulDescSetAttribute");
    check_blas(lt::api().MatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep,
                                                sizeof(keep)),
               "cublasLtMatmulDescSetAttribute");
    check_blas(lt::api().MatrixLayoutCreate(&plan->weight_layout, CUDA_R_16BF, in, out, in),
               "cublasLtMatrixLayoutCreate");
    check_blas(lt::api().MatrixLayoutCreate(&plan->input_layout, CUDA_R_16BF, in, tokens, in),
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
    const int asked = sweep                            ? sweep_candidates
                      : tokens >= autotune_min_tokens_ ? autotune_candidates_
                                                       : 1;
    const int wanted = std::clamp(asked, 1, Plan::kMaxCandidates);
    cublasLtMatmulHeuristicResult_t results[Plan::kMaxCandidates] = {};
    int found = 0;
    const cublasStatus_t status = lt::api().MatmulAlgoGetHeuristic(
        handle_, plan->operation, plan->weight_layout, plan->input_layout, plan->output_layout,
        plan->output_layout, preference, wanted, results, &found);
    lt::api().MatmulPreferenceDestroy(preference);
    check_blas(status, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) {
      throw Error("cuBLASLt has no algorithm for a " + std::to_string(tokens) + "x" +
                  std::to_string(in) + "x" + std::to_string(out) + " bf16 product");
    }
    plan->algorithm = results[0].algo;
    plan->output_bytes = static_cast<size_t>(y_stride) * static_cast<size_t>(tokens) *
                         (fp32_out ? sizeof(float) : sizeof(bf16));
    if (found > 1) {
      for (int i = 0; i < found; ++i) plan->candidates[i] = results[i].algo;
      plan->candidate_count = found;
    }
  } catch (...) {
    delete plan;
    throw;
  }
  plans_.emplace(key, plan);
  return *plan;
}

// Each candidate once untimed, then timed as the load asks (the median of kTuneRuns runs, or the
// sustained mean), all writing a scratch output with beta 0 (an accumulating product must not add
// its candidates' results to y). A candidate that refuses the operands gets -1.
std::vector<float> Blas::time_plan_candidates(const Plan& plan, int count, const bf16* x,
                                              const bf16* w, void* scratch, TuneLoad load) {
  EventStopwatch stopwatch;
  const float alpha = 1.0f, beta = 0.0f;
  std::vector<float> times(static_cast<size_t>(count), -1.0f);
  for (int candidate = 0; candidate < count; ++candidate) {
    const cublasLtMatmulAlgo_t& algorithm = plan.candidates[candidate];
    auto launch = [&] {
      return lt::api().Matmul(handle_, plan.operation, &alpha, w, plan.weight_layout, x,
                              plan.input_layout, &beta, scratch, plan.output_layout, scratch,
                              plan.output_layout, &algorithm, workspace_.data(), workspace_.bytes(),
                              stream_);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    times[static_cast<size_t>(candidate)] =
        load == TuneLoad::kSustained ? sustained_run_ms(stopwatch, stream_, [&] { launch(); })
                                     : median_run_ms(stopwatch, stream_, [&] { launch(); });
  }
  check(cudaStreamSynchronize(stream_), "autotune");
  return times;
}

// The heuristic's first choice stays unless another is faster by kTuneMargin (fastest_with_margin).
void Blas::tune(Plan& plan, const bf16* x, const bf16* w) {
  const int count = std::exchange(plan.candidate_count, 0);  // tuned at most once, whatever happens
  if (stream_capturing(stream_)) return;  // tuning synchronises: never inside a graph capture
  DeviceBuffer<uint8_t> scratch;
  try {
    scratch.allocate(plan.output_bytes);
  } catch (const Error&) {
    cudaGetLastError();  // no room to tune: keep the heuristic's choice
    return;
  }
  const int chosen =
      fastest_with_margin(time_plan_candidates(plan, count, x, w, scratch.data(), autotune_load_));
  if (chosen < 0) return;  // none ran: the heuristic's choice stays
  plan.algorithm = plan.candidates[chosen];
  plan.chosen = chosen;
}

std::vector<float> Blas::time_candidates(const bf16* x, int64_t tokens, int64_t in, const bf16* w,
                                         int64_t out, bool fp32_out, int candidates,
                                         TuneLoad load) {
  Plan& plan = plan_for(tokens, in, out, out, fp32_out, std::max(1, candidates));
  if (plan.candidate_count == 0) {  // the heuristic offered one algorithm
    plan.candidates[0] = plan.algorithm;
    plan.candidate_count = 1;
  }
  DeviceBuffer<uint8_t> scratch(plan.output_bytes);
  return time_plan_candidates(plan, plan.candidate_count, x, w, scratch.data(), load);
}

int Blas::chosen_candidate(int64_t tokens, int64_t in, int64_t out, bool fp32_out) const {
  const auto found = plans_.find(std::make_tuple(tokens, in, out, out, fp32_out));
  return found == plans_.end() ? -1 : found->second->chosen;
}

void Blas::run(Plan& plan, const bf16* x, const bf16* w, void* y, bool accumulate) {
  if (plan.candidate_count > 0) tune(plan, x, w);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_blas(
      lt::api().Matmul(handle_, plan.operation, &alpha, w, plan.weight_layout, x, plan.input_layout,
                       &beta, y, plan.output_layout, y, plan.output_layout, &plan.algorithm,
                       workspace_.data(), workspace_.bytes(), stream_),
      "cublasLtMatmul");
}

void Blas::linear(const bf16* x, int64_t tokens, int64_t in, const bf16* w, int64_t out, bf16* y,
                  int64_t y_stride) {
  if (tokens == 0) return;
  if (y_stride == 0) y_stride = out;
  if (tokens == 1 && gemv_ && gemv_fits(x, in, w)) {
    const auto [in_flight, threads] = gemv_configuration(x, in, w, out, false, false);
    launch_gemv_configured<bf16>(x, w, in, out, y, false, in_flight, threads, stream_);
    return;
  }
  run(plan_for(tokens, in, out, y_stride, false), x, w, y, false);
}

void Blas::linear(const bf16* x, int64_t tokens, int64_t in, const bf16* w, int64_t out, float* y,
                  bool accumulate, int64_t y_stride) {
  if (tokens == 0) return;
  if (y_stride == 0) y_stride = out;
  if (tokens == 1 && gemv_ && gemv_fits(x, in, w)) {
    const auto [in_flight, threads] = gemv_configuration(x, in, w, out, true, accumulate);
    launch_gemv_configured<float>(x, w, in, out, y, accumulate, in_flight, threads, stream_);
    return;
  }
  run(plan_for(tokens, in, out, y_stride, true), x, w, y, accumulate);
}

// The shape's GEMV configuration: measured on its first run outside graph capture when tuning is
// on (the median of kTuneRuns per configuration, into a scratch output so y is written once), the
// default otherwise. Every configuration sums each row in the same order (a lane's chunks in
// turn, then the warp's butterfly), so the choice changes the speed, not the result.
std::pair<int, int> Blas::gemv_configuration(const bf16* x, int64_t in, const bf16* w, int64_t out,
                                             bool fp32_out, bool accumulate) {
  const auto key = std::make_tuple(in, out, fp32_out, accumulate);
  if (auto found = gemv_configurations_.find(key); found != gemv_configurations_.end())
    return found->second;
  const std::pair<int, int> fallback{kGemvInFlight, kGemvThreads};
  if (!tune_gemv_ || stream_capturing(stream_)) return fallback;  // tuned on an eager run
  DeviceBuffer<float> scratch;
  try {
    scratch.allocate(static_cast<size_t>(out));
  } catch (const Error&) {
    cudaGetLastError();
    return fallback;
  }
  EventStopwatch stopwatch;
  std::vector<float> times;
  for (const auto& [in_flight, threads] : kGemvConfigurations) {
    auto launch = [&, in_flight = in_flight, threads = threads] {
      if (fp32_out) {
        launch_gemv_configured<float>(x, w, in, out, scratch.data(), false, in_flight, threads,
                                      stream_);
      } else {
        launch_gemv_configured<bf16>(x, w, in, out, reinterpret_cast<bf16*>(scratch.data()), false,
                                     in_flight, threads, stream_);
      }
    };
    launch();
    times.push_back(median_run_ms(stopwatch, stream_, launch));
  }
  check(cudaStreamSynchronize(stream_), "GEMV tuning");
  // The default is listed first, so it stays unless another is faster by the margin.
  const std::pair<int, int> best = kGemvConfigurations[fastest_with_margin(times)];
  gemv_configurations_.emplace(key, best);
  return best;
}

void gemv_with_config(const bf16* x, const bf16* w, int64_t in, int64_t out, float* y,
                      bool accumulate, int in_flight, int threads, cudaStream_t stream) {
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    throw Error("gemv: " + std::to_string(threads) +
                " threads per block; need a multiple of 32 up to 1024");
  }
  if (!gemv_fits(x, in, w)) {
    throw Error("gemv: the input width " + std::to_string(in) +
                " must be a multiple of 8 and both operands 16-byte aligned");
  }
  if (out == 0) return;
  if (in_flight != 4 && in_flight != 8 && in_flight != 16) {
    throw Error("gemv: " + std::to_string(in_flight) + " loads in flight; need 4, 8 or 16");
  }
  launch_gemv_configured<float>(x, w, in, out, y, accumulate, in_flight, threads, stream);
}

// ---------------------------------------------------------------------------------------------------
// Elementwise and row ops

void rms_norm(const float* x, const float* weight, int64_t rows, int64_t size, float eps, bf16* out,
              cudaStream_t stream) {
  if (rows == 0) return;
  const RowNormKernel vector_kernel = rms_norm_vector_kernel_for(x, weight, size, out);
  launch_dependent("rms_norm", vector_kernel ? vector_kernel : rms_norm_kernel<float>,
                   dim3(static_cast<unsigned>(rows)),
                   dim3(vector_kernel ? kRowNormThreads : norm_threads(size)), 0, stream, x, weight,
                   size, eps, out, size, size);
}

void rms_norm(const bf16* x, const float* weight, int64_t rows, int64_t size, float eps, bf16* out,
              cudaStream_t stream, int64_t x_stride, int64_t out_stride) {
  if (rows == 0) return;
  launch_dependent("rms_norm", rms_norm_kernel<bf16>, dim3(static_cast<unsigned>(rows)),
                   dim3(norm_threads(size)), 0, stream, x, weight, size, eps, out,
                   x_stride ? x_stride : size, out_stride ? out_stride : size);
}

void head_rms_norm(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                   const float* weight, float eps, cudaStream_t stream) {
  const int64_t warps = tokens * heads;
  if (warps == 0) return;
  launch_dependent("head_rms_norm", head_rms_norm_kernel, dim3(blocks_for(warps * 32, kThreads)),
                   dim3(kThreads), 0, stream, x, tokens, heads, head_dim, token_stride, weight,
                   eps);
}

void add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(x, y, count);
  check_launch("add_inplace");
}

void add_bias(bf16* y, const float* bias, int64_t rows, int64_t width, int64_t stride,
              cudaStream_t stream) {
  if (rows * width == 0) return;
  launch_dependent("add_bias", add_bias_kernel<bf16>, dim3(blocks_for(rows * width, kThreads)),
                   dim3(kThreads), 0, stream, y, bias, rows, width, stride);
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t width, int64_t stride,
              cudaStream_t stream) {
  if (rows * width == 0) return;
  launch_dependent("add_bias", add_bias_kernel<float>, dim3(blocks_for(rows * width, kThreads)),
                   dim3(kThreads), 0, stream, y, bias, rows, width, stride);
}

void swiglu(const bf16* gate, const bf16* up, int64_t rows, int64_t width, int64_t in_stride,
            bf16* out, cudaStream_t stream) {
  if (rows * width == 0) return;
  const bool vectors =
      width % 8 == 0 && in_stride % 8 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(up) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vectors) {
    const int64_t chunks = width / 8;
    const dim3 grid(blocks_for(chunks, kThreads),
                    static_cast<unsigned>(std::min<int64_t>(rows, kMaxGridY)));
    launch_dependent("swiglu", swiglu_vector_kernel, grid, dim3(kThreads), 0, stream,
                     reinterpret_cast<const uint4*>(gate), reinterpret_cast<const uint4*>(up), rows,
                     chunks, in_stride / 8, reinterpret_cast<uint4*>(out));
    return;
  }
  launch_dependent("swiglu", swiglu_kernel, dim3(blocks_for(rows * width, kThreads)),
                   dim3(kThreads), 0, stream, gate, up, rows, width, in_stride, out);
}

namespace {

bool rope_vectors_fit(const bf16* x, int64_t heads, int64_t head_dim, int64_t token_stride,
                      const float* cos, const float* sin, int64_t half) {
  return half % 4 == 0 && head_dim % 8 == 0 && token_stride % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(cos) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(sin) % 16 == 0 && heads * half < (1 << 30);
}

void launch_rope_vectors(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t token_stride, const float* cos, const float* sin, int64_t half,
                         bool adjacent_pairs, cudaStream_t stream, const int* device_position,
                         bf16* q_out, int64_t q_out_stride, int64_t q_heads) {
  const dim3 grid(blocks_for(heads * half / 4, kThreads),
                  static_cast<unsigned>(std::min<int64_t>(tokens, kMaxGridY)));
  launch_dependent("apply_rope", rope_vector_kernel, grid, dim3(kThreads), 0, stream, x, tokens,
                   static_cast<int>(heads), static_cast<int>(head_dim), token_stride, cos, sin,
                   static_cast<int>(half), adjacent_pairs, device_position, q_out, q_out_stride,
                   static_cast<int>(q_heads));
}

}  // namespace

void apply_rope_queries_out(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim,
                            int64_t token_stride, const float* cos, const float* sin,
                            int64_t rotary_dim, bool adjacent_pairs, int64_t q_heads, bf16* q_out,
                            int64_t q_out_stride, cudaStream_t stream) {
  if (tokens * heads == 0) return;
  const int64_t half = rotary_dim / 2;
  const bool direct = rotary_dim == head_dim && q_out_stride % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(q_out) % 16 == 0 &&
                      rope_vectors_fit(x, heads, head_dim, token_stride, cos, sin, half);
  if (direct) {
    launch_rope_vectors(x, tokens, heads, head_dim, token_stride, cos, sin, half, adjacent_pairs,
                        stream, nullptr, q_out, q_out_stride, q_heads);
    return;
  }
  // Partial rotation or unaligned rows: rotate in place, then copy the queries out.
  apply_rope(x, tokens, heads, head_dim, token_stride, cos, sin, rotary_dim, adjacent_pairs,
             stream);
  check(cudaMemcpy2DAsync(q_out, sizeof(bf16) * q_out_stride, x, sizeof(bf16) * token_stride,
                          sizeof(bf16) * q_heads * head_dim, tokens, cudaMemcpyDeviceToDevice,
                          stream),
        "rotated queries");
}

void apply_rope(bf16* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t token_stride,
                const float* cos, const float* sin, int64_t rotary_dim, bool adjacent_pairs,
                cudaStream_t stream, const int* device_position) {
  const int64_t half = rotary_dim / 2;
  const int64_t pairs = tokens * heads * half;
  if (pairs == 0) return;
  if (rope_vectors_fit(x, heads, head_dim, token_stride, cos, sin, half)) {
    launch_rope_vectors(x, tokens, heads, head_dim, token_stride, cos, sin, half, adjacent_pairs,
                        stream, device_position, nullptr, 0, 0);
    return;
  }
  launch_dependent("apply_rope", rope_kernel, dim3(blocks_for(pairs, kThreads)), dim3(kThreads), 0,
                   stream, x, tokens, heads, head_dim, token_stride, cos, sin, half, adjacent_pairs,
                   device_position);
}

void append_kv(const bf16* keys, const bf16* values, int64_t tokens, int64_t token_stride,
               int64_t kv_heads, int64_t head_dim, bf16* key_cache, bf16* value_cache,
               int64_t cache_stride, int64_t first_position, cudaStream_t stream,
               const int* device_position) {
  if (tokens == 0) return;
  const bool aligned = head_dim % 8 == 0 && token_stride % 8 == 0 &&
                       reinterpret_cast<uintptr_t>(keys) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(values) % 16 == 0;
  if (aligned) {
    const int64_t chunks = head_dim / 8;
    launch_dependent(
        "append_kv", append_kv_kernel<uint4>,
        dim3(blocks_for(tokens * kv_heads * chunks, kThreads)), dim3(kThreads), 0, stream,
        reinterpret_cast<const uint4*>(keys), reinterpret_cast<const uint4*>(values), tokens,
        token_stride / 8, kv_heads, chunks, reinterpret_cast<uint4*>(key_cache),
        reinterpret_cast<uint4*>(value_cache), cache_stride, first_position, device_position);
  } else {
    launch_dependent("append_kv", append_kv_kernel<bf16>,
                     dim3(blocks_for(tokens * kv_heads * head_dim, kThreads)), dim3(kThreads), 0,
                     stream, keys, values, tokens, token_stride, kv_heads, head_dim, key_cache,
                     value_cache, cache_stride, first_position, device_position);
  }
}

void embedding(const bf16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
               cudaStream_t stream) {
  if (tokens == 0) return;
  launch_dependent("embedding", embedding_kernel, dim3(blocks_for(tokens * hidden, kThreads)),
                   dim3(kThreads), 0, stream, table, ids, tokens, hidden, out);
}

ArgmaxWorkspace::ArgmaxWorkspace(int64_t rows)
    : rows_(rows),
      partials_(static_cast<size_t>(rows) * kSlices * sizeof(ArgmaxCandidate)),
      arrivals_(static_cast<size_t>(rows)) {
  check(cudaMemset(arrivals_.data(), 0, arrivals_.bytes()), "argmax workspace");
}

void argmax_rows(const float* x, int64_t rows, int64_t count, int32_t* out, cudaStream_t stream,
                 ArgmaxWorkspace* workspace) {
  if (rows == 0) return;
  // Slices of at least 1024 entries, when a workspace holds the rows' partials.
  const bool split = workspace != nullptr && rows <= workspace->rows();
  const int slices =
      split ? static_cast<int>(std::clamp<int64_t>(count / 1024, 1, ArgmaxWorkspace::kSlices)) : 1;
  launch_dependent("argmax_rows", argmax_kernel,
                   dim3(static_cast<unsigned>(slices), static_cast<unsigned>(rows)),
                   dim3(slices == 1 ? 1024 : 256), 0, stream, x, count, out,
                   split ? reinterpret_cast<ArgmaxCandidate*>(workspace->partials()) : nullptr,
                   split ? workspace->arrivals() : nullptr);
}

void fill_uniform(bf16* x, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65536));
  fill_uniform_kernel<bf16><<<blocks, kThreads, 0, stream>>>(x, count, seed, scale);
  check_launch("fill_uniform");
}

void fill_uniform(float* x, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
  if (count == 0) return;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65536));
  fill_uniform_kernel<float><<<blocks, kThreads, 0, stream>>>(x, count, seed, scale);
  check_launch("fill_uniform");
}

void to_bf16(const float* x, int64_t count, bf16* out, cudaStream_t stream) {
  if (count == 0) return;
  to_bf16_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(x, count, out);
  check_launch("to_bf16");
}

void to_float(const bf16* x, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  to_float_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(x, count, out);
  check_launch("to_float");
}

}  // namespace entropyinfer::cuda

// The GPU prefill estimate. Kernels, in the order estimate() enqueues them:
//   1. query_midpoint_kernel: (qmax + qmin) / 2 of every (query head, segment), one CTA each;
//      skipped when prefill_qkv_epilogue recorded every midpoint (record_fused).
//   2. score_mma_kernel: the criticality triangle of every KV head, a small GEMM on the tensor
//      cores over shared-memory tiles of midpoints (split into exact bf16 parts) and key extrema,
//      with the max / group mean in the epilogue (score_row_kernel instead for group sizes the
//      tiles are not built for).
//   3. entropy_kernel (entropy rule only): softmax entropy of every row in double, CTA per row.
//   4. budget_kernel: one CTA; one thread per KV head runs the rigid test and the budget recursion,
//      then budgets become block counts and a block-wide scan turns them into row_offsets.
//   5. select_kernel: one CTA per sparse row; radix select of the keep-th largest score, then one
//      scan in index order writes the chosen blocks ascending.
// record_key_blocks runs key_extrema_kernel as keys enter the cache (or prefill_qkv_epilogue takes
// the extrema itself: record_fused).
//
// Equality with the CPU (attention/entropy_prefill.cpp) is by construction where the arithmetic
// allows: extrema and midpoints are exact (bf16 inputs, the same fp32 operations), the group sum
// and its division follow the CPU's order, the budget recursion uses the CPU's double operations
// without contraction into fused multiply-adds, and ties rank by block index as the CPU does. The
// only difference is the order in which the (exact) products of the dot products are summed.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <string>

#include "attention/entropy_budget.h"
#include "backends/cuda/flash_attention_internal.cuh"  // ldmatrix and mma.sync wrappers
#include "backends/cuda/prefill_estimate.h"
#include "core/half.h"

namespace entropyinfer::cuda {
namespace {

constexpr int kDimSlice = 16;  // head_dim is padded to this: whole mma k-steps
constexpr int kPad = 128;      // midpoint rows and key blocks are padded to this: every tile fits
constexpr int kMaxHeadDim = 512;
constexpr int kRowThreads = 256;
constexpr int kSelectThreads = 512;
constexpr int kBudgetThreads = 1024;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Score entries of the rows s = 1 .. segments - 1 of one KV head (row s has s * S/b entries).
int64_t triangle_entries(int64_t segments, int64_t blocks_per_segment) {
  return segments < 2 ? 0 : blocks_per_segment * segments * (segments - 1) / 2;
}

// Where row s starts inside a KV head's triangle.
__host__ __device__ inline int64_t triangle_row(int64_t segment, int64_t blocks_per_segment) {
  return blocks_per_segment * segment * (segment - 1) / 2;
}

struct Layout {
  int group = 1;
  int padded_dim = 0;
  int64_t max_segments = 0;
  int64_t max_blocks = 0;
  int64_t block_stride = 0;
  int64_t row_stride = 0;
  int64_t score_entries = 0;  // all KV heads
  int64_t max_rows = 0;
  int64_t selected_capacity = 0;  // block indices the largest plan can hold
};

// Validates the shapes and parameters and sizes every buffer.
Layout make_layout(int num_q_heads, int num_kv_heads, int head_dim, int64_t max_tokens,
                   const PrefillParams& params) {
  const auto fail = [](const std::string& what) { throw Error("GPU prefill estimate: " + what); };
  if (num_kv_heads <= 0 || num_q_heads <= 0 || num_q_heads % num_kv_heads != 0) {
    fail("query heads (" + std::to_string(num_q_heads) +
         ") must be a positive multiple of KV heads (" + std::to_string(num_kv_heads) + ")");
  }
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    fail("head_dim " + std::to_string(head_dim) + " is outside 1.." + std::to_string(kMaxHeadDim));
  }
  if (max_tokens < 0) fail("max_tokens " + std::to_string(max_tokens) + " is negative");
  const int S = params.segment_size, b = params.block_size;
  if (S <= 0 || b <= 0 || S % b != 0) {
    fail("segment_size (" + std::to_string(S) + ") must be a positive multiple of block_size (" +
         std::to_string(b) + ")");
  }
  if (params.base_budget < 0 || params.budget_cap_factor < 1 || params.critiprefill_budget < 0) {
    fail("base_budget and critiprefill_budget must be >= 0 and budget_cap_factor >= 1");
  }
  Layout layout;
  layout.group = num_q_heads / num_kv_heads;
  layout.padded_dim = static_cast<int>(round_up(head_dim, kDimSlice));
  layout.max_segments = count_segments(max_tokens, S);
  layout.max_blocks = (max_tokens + b - 1) / b;
  if (layout.max_segments > 65535) {
    fail(std::to_string(layout.max_segments) + " segments exceed the 65535 a launch grid holds");
  }
  layout.block_stride = round_up(std::max<int64_t>(1, layout.max_blocks), kPad);
  layout.row_stride = round_up(std::max<int64_t>(1, layout.max_segments * layout.group), kPad);
  const int64_t blocks_per_segment = S / b;
  layout.score_entries = num_kv_heads * triangle_entries(layout.max_segments, blocks_per_segment);
  layout.max_rows = num_kv_heads * layout.max_segments;
  // Budgets never exceed the cap (entropy rule) or the fixed budget (CritiPrefill).
  const double largest_budget = std::max(
      {static_cast<double>(params.budget_cap_factor) * params.base_budget,
       static_cast<double>(params.base_budget), static_cast<double>(params.critiprefill_budget)});
  const auto largest_keep = static_cast<int64_t>(std::floor(largest_budget / b));
  int64_t per_head = 0;
  for (int64_t s = 0; s < layout.max_segments; ++s) {
    per_head += std::min(s * blocks_per_segment, largest_keep);
  }
  layout.selected_capacity = num_kv_heads * per_head;
  if (layout.selected_capacity > INT32_MAX || layout.max_blocks > INT32_MAX) {
    fail("a plan for " + std::to_string(max_tokens) + " tokens would not fit 32-bit block offsets");
  }
  return layout;
}

// --- small block-wide helpers (blockDim.x a multiple of 32, at most 1024) ---

// Every thread gets op over the block's values; the partials are combined in a fixed order, so
// the result does not depend on timing.
template <typename T, typename Op>
__device__ T block_reduce(T value, Op op) {
  __shared__ T partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  T result = partial[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) result = op(result, partial[w]);
  return result;
}

// Exclusive prefix sum of `value` over the threads of the block in thread order; `total` gets the
// sum of all of them. Every thread must call it.
template <typename T>
__device__ T block_exclusive_scan(T value, T& total) {
  __shared__ T warp_totals[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);
  T inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  __syncthreads();  // warp_totals may still be read by a previous call
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    T running = lane < warps ? warp_totals[lane] : T(0);
    for (int offset = 1; offset < 32; offset <<= 1) {
      const T other = __shfl_up_sync(0xffffffffu, running, offset);
      if (lane >= offset) running += other;
    }
    if (lane < warps) warp_totals[lane] = running;  // now inclusive over warps
  }
  __syncthreads();
  total = warp_totals[warps - 1];
  return (warp == 0 ? T(0) : warp_totals[warp - 1]) + inclusive - value;
}

// --- 0. key-block extrema ---

// One CTA per (32 key blocks, 32 dimensions, KV head); 256 threads. A warp reads one key row's 32
// dimensions at a time; the tile is transposed in shared memory so that the blocks of one
// dimension are written contiguously (the layout the score tiles load).
__global__ __launch_bounds__(256) void key_extrema_kernel(
    const bf16* key_cache, int64_t cache_stride, int head_dim, int block_size, int64_t first_block,
    int64_t num_blocks, int64_t end_token, bf16* extrema, int padded_dim, int64_t block_stride) {
  __shared__ float tile[2][32][33];  // [max, min][dimension][block]
  const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
  const int head = blockIdx.z;
  const int64_t tile_block = static_cast<int64_t>(blockIdx.x) * 32;  // relative to first_block
  const int tile_dim = blockIdx.y * 32;
  const bf16* head_keys = key_cache + static_cast<int64_t>(head) * cache_stride * head_dim;

  const int dim = tile_dim + lane;
  for (int local = row; local < 32; local += 8) {
    float high = -FLT_MAX, low = FLT_MAX;
    if (dim < head_dim && tile_block + local < num_blocks) {
      const int64_t begin = (first_block + tile_block + local) * block_size;
      const int64_t end = min(begin + block_size, end_token);
      for (int64_t token = begin; token < end; ++token) {
        const float value = __bfloat162float(head_keys[token * head_dim + dim]);
        high = fmaxf(high, value);
        low = fminf(low, value);
      }
    }
    tile[0][lane][local] = high;
    tile[1][lane][local] = low;
  }
  __syncthreads();
  if (tile_block + lane >= num_blocks) return;
  const int64_t block = first_block + tile_block + lane;
  for (int local_dim = row; local_dim < 32; local_dim += 8) {
    const int d = tile_dim + local_dim;
    if (d >= head_dim) break;
    for (int kind = 0; kind < 2; ++kind) {
      extrema[((static_cast<int64_t>(head) * 2 + kind) * padded_dim + d) * block_stride + block] =
          __float2bfloat16(tile[kind][local_dim][lane]);
    }
  }
}

// --- 1. query midpoints ---

// One CTA per (segment, query head). Threads form row groups of head_dim / V lanes; each lane
// keeps the extrema of V consecutive dimensions over the rows of its group (V = 8: one 16-byte
// load per row), and the groups are combined through shared memory. The midpoint is written to
// the score kernel's layout [kv_head][dimension][segment * group + member].
template <int V>
__global__ void query_midpoint_kernel(const bf16* queries, int64_t q_token_stride,
                                      int64_t num_tokens, int head_dim, int segment_size,
                                      int first_segment, int group, float* midpoints,
                                      int padded_dim, int64_t row_stride) {
  __shared__ float shared_max[2048];
  __shared__ float shared_min[2048];
  const int segment = first_segment + blockIdx.x;
  const int q_head = blockIdx.y;
  const int lanes = head_dim / V;
  const int row_groups = static_cast<int>(blockDim.x) / lanes;
  const int lane = threadIdx.x % lanes, row_group = threadIdx.x / lanes;

  float high[V], low[V];
  for (int e = 0; e < V; ++e) {
    high[e] = -FLT_MAX;
    low[e] = FLT_MAX;
  }
  if (row_group < row_groups) {
    const int64_t begin = static_cast<int64_t>(segment) * segment_size;
    const int64_t end = min(begin + segment_size, num_tokens);
    const bf16* column = queries + static_cast<int64_t>(q_head) * head_dim + lane * V;
    for (int64_t token = begin + row_group; token < end; token += row_groups) {
      const bf16* source = column + token * q_token_stride;
      if constexpr (V == 8) {
        const uint4 packed = *reinterpret_cast<const uint4*>(source);
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
        for (int p = 0; p < 4; ++p) {
          const float2 values = __bfloat1622float2(pairs[p]);
          high[2 * p] = fmaxf(high[2 * p], values.x);
          low[2 * p] = fminf(low[2 * p], values.x);
          high[2 * p + 1] = fmaxf(high[2 * p + 1], values.y);
          low[2 * p + 1] = fminf(low[2 * p + 1], values.y);
        }
      } else {
        for (int e = 0; e < V; ++e) {
          const float value = __bfloat162float(source[e]);
          high[e] = fmaxf(high[e], value);
          low[e] = fminf(low[e], value);
        }
      }
    }
  }
  for (int e = 0; e < V; ++e) {
    shared_max[threadIdx.x * V + e] = high[e];
    shared_min[threadIdx.x * V + e] = low[e];
  }
  __syncthreads();
  const int kv_head = q_head / group, member = q_head % group;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float column_max = -FLT_MAX, column_min = FLT_MAX;
    for (int r = 0; r < row_groups; ++r) {
      const int index = (r * lanes + d / V) * V + d % V;
      column_max = fmaxf(column_max, shared_max[index]);
      column_min = fminf(column_min, shared_min[index]);
    }
    // The CPU's expression, operation for operation: the midpoint is bit-identical.
    midpoints[(static_cast<int64_t>(kv_head) * padded_dim + d) * row_stride +
              static_cast<int64_t>(segment) * group + member] = 0.5f * (column_max + column_min);
  }
}

// --- 2. criticality scores ---

// One CTA per (16 segments, 64 key blocks, KV head) on the tensor cores, 4 warps of 16 blocks
// each. The dot products must come out as fp32 sums of exact products, as on the CPU, so each fp32
// midpoint m is split into three bf16 parts, m = hi + mid + lo exactly (24 significant bits in
// three 8-bit pieces; the key extrema are bf16 already): every bf16 x bf16 product is exact, and
// the mma sums them in fp32. Only the order of the sum differs from the CPU's, as it did with the
// fp32 FMA tiles this replaced (26.5 ms of kernel time at 130,816 tokens; the whole estimate went
// from 73 to 61 ms in the timed prefill).
//
// Shared-memory tiles per slice of 64 dimensions: the midpoint parts as rows member * 16 +
// segment (so that member g of 16 segments is one m16 tile and a thread holds all G members of
// its scores), and the extrema as [kind][dimension][block], read as the col-major B operand
// through ldmatrix.trans. The epilogue takes the max of the kmax and kmin products per member
// and the group mean in the CPU's order. Tiles wholly right of the causal edge exit at once.
constexpr int kMmaSegments = 16;
constexpr int kMmaBlocks = 64;
constexpr int kMmaThreads = 128;
constexpr int kMmaSlice = 64;
constexpr int kMmaPitch = kMmaSlice + 8;    // bf16 per midpoint row: conflict-free ldmatrix
constexpr int kMmaBPitch = kMmaBlocks + 8;  // bf16 per extrema row

template <int G>
__global__ __launch_bounds__(kMmaThreads) void score_mma_kernel(
    const float* midpoints, int64_t row_stride, const bf16* extrema, int64_t block_stride,
    int padded_dim, int num_segments, int blocks_per_segment, float* scores,
    int64_t score_head_stride) {
  constexpr int ROWS = kMmaSegments * G;
  __shared__ __align__(16) bf16 parts[3][ROWS][kMmaPitch];
  __shared__ __align__(16) bf16 kinds[2][kMmaSlice][kMmaBPitch];

  const int head = blockIdx.z;
  const int first_segment = blockIdx.y * kMmaSegments;
  const int last_segment = min(first_segment + kMmaSegments, num_segments) - 1;
  const int64_t first_block = static_cast<int64_t>(blockIdx.x) * kMmaBlocks;
  if (first_block >= static_cast<int64_t>(last_segment) * blocks_per_segment) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const float* tile_midpoints = midpoints + static_cast<int64_t>(head) * padded_dim * row_stride +
                                static_cast<int64_t>(first_segment) * G;
  const int64_t kind_stride = static_cast<int64_t>(padded_dim) * block_stride;
  const bf16* tile_extrema = extrema + head * 2 * kind_stride + first_block;

  float acc[G][2][2][4];  // [member][kind][n8 tile][fragment]
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < 16; ++i) (&acc[g][0][0][0])[i] = 0.0f;
  }

  for (int slice = 0; slice < padded_dim; slice += kMmaSlice) {
    const int dims = min(kMmaSlice, padded_dim - slice);  // a multiple of 16
    __syncthreads();                                      // the previous slice's fragments are read
    bool has_mid = false, has_lo = false;
    for (int i = threadIdx.x; i < dims * ROWS; i += kMmaThreads) {
      const int d = i / ROWS, r = i % ROWS;
      const float m = tile_midpoints[static_cast<int64_t>(slice + d) * row_stride + r];
      const bf16 hi = __float2bfloat16(m);
      const float rest = m - __bfloat162float(hi);
      const bf16 mid = __float2bfloat16(rest);
      const bf16 lo = __float2bfloat16(rest - __bfloat162float(mid));
      const int row = (r % G) * kMmaSegments + r / G;
      parts[0][row][d] = hi;
      parts[1][row][d] = mid;
      parts[2][row][d] = lo;
      has_mid |= __bfloat162float(mid) != 0.0f;
      has_lo |= __bfloat162float(lo) != 0.0f;
    }
    for (int i = threadIdx.x; i < 2 * dims * (kMmaBlocks / 8); i += kMmaThreads) {
      const int kind = i / (dims * (kMmaBlocks / 8)), rest = i % (dims * (kMmaBlocks / 8));
      const int d = rest / (kMmaBlocks / 8), block8 = rest % (kMmaBlocks / 8);
      *reinterpret_cast<uint4*>(&kinds[kind][d][block8 * 8]) = *reinterpret_cast<const uint4*>(
          tile_extrema + kind * kind_stride + static_cast<int64_t>(slice + d) * block_stride +
          block8 * 8);
    }
    // A part that is zero across the slice adds exact zeros: skip its products. The sum of two
    // bf16 extrema whose exponents differ by at most 8 fits in 16 significant bits, so the lowest
    // part is zero for most slices.
    const bool any_mid = __syncthreads_or(has_mid) != 0;
    const bool any_lo = __syncthreads_or(has_lo) != 0;
    const int parts_used = any_lo ? 3 : (any_mid ? 2 : 1);
    for (int k0 = 0; k0 < dims; k0 += 16) {
      uint32_t b[2][4];  // per kind: (b0, b1) of n8 tile 0, then of n8 tile 1
#pragma unroll
      for (int kind = 0; kind < 2; ++kind) {
        const int k = k0 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int n = warp * 16 + (lane >> 4) * 8;
        detail::ldmatrix_x4_trans(b[kind], detail::shared_address(&kinds[kind][k][n]));
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int part = 0; part < 3; ++part) {
          if (part >= parts_used) break;
          uint32_t a[4];
          detail::ldmatrix_x4(
              a, detail::shared_address(&parts[part][g * 16 + (lane & 15)][k0 + (lane >> 4) * 8]));
#pragma unroll
          for (int kind = 0; kind < 2; ++kind) {
            detail::mma_bf16_16816(acc[g][kind][0], a, b[kind][0], b[kind][1]);
            detail::mma_bf16_16816(acc[g][kind][1], a, b[kind][2], b[kind][3]);
          }
        }
      }
    }
  }

  // Fragment (n8 tile t, element e): segment lane / 4 (+ 8 for e >= 2), block
  // t * 8 + 2 * (lane % 4) + e % 2 of this warp's 16.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int segment = first_segment + lane / 4 + (e >= 2 ? 8 : 0);
    if (segment >= num_segments) continue;
    const int64_t visible = static_cast<int64_t>(segment) * blocks_per_segment;
    float* row = scores + head * score_head_stride + triangle_row(segment, blocks_per_segment);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int64_t block = first_block + warp * 16 + t * 8 + 2 * (lane % 4) + e % 2;
      if (block >= visible) continue;
      float sum = 0.0f;
#pragma unroll
      for (int g = 0; g < G; ++g) sum += fmaxf(acc[g][0][t][e], acc[g][1][t][e]);
      row[block] = sum / static_cast<float>(G);
    }
  }
}

// Any group size: one thread per score, the dot products read straight from global memory.
__global__ void score_row_kernel(const float* midpoints, int64_t row_stride, const bf16* extrema,
                                 int64_t block_stride, int padded_dim, int group,
                                 int blocks_per_segment, float* scores, int64_t score_head_stride) {
  const int head = blockIdx.z;
  const int segment = blockIdx.y;
  const int64_t block = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (block >= static_cast<int64_t>(segment) * blocks_per_segment) return;
  const int64_t kind_stride = static_cast<int64_t>(padded_dim) * block_stride;
  const bf16* high = extrema + head * 2 * kind_stride + block;
  const bf16* low = high + kind_stride;
  const float* head_midpoints = midpoints + static_cast<int64_t>(head) * padded_dim * row_stride +
                                static_cast<int64_t>(segment) * group;
  float sum = 0.0f;
  for (int g = 0; g < group; ++g) {
    float dot_max = 0.0f, dot_min = 0.0f;
    for (int d = 0; d < padded_dim; ++d) {
      const float m = head_midpoints[d * row_stride + g];
      dot_max = fmaf(m, __bfloat162float(high[d * block_stride]), dot_max);
      dot_min = fmaf(m, __bfloat162float(low[d * block_stride]), dot_min);
    }
    sum += fmaxf(dot_max, dot_min);
  }
  scores[head * score_head_stride + triangle_row(segment, blocks_per_segment) + block] =
      sum / static_cast<float>(group);
}

// --- 3. entropy ---

// One CTA per (segment, KV head): H = -sum p log(p + 1e-9) of the softmax of the row, in double
// with the max subtracted first, as block_entropy(). Segment 0 sees no block: H = 0.
__global__ __launch_bounds__(kRowThreads) void entropy_kernel(const float* scores,
                                                              int64_t score_head_stride,
                                                              int blocks_per_segment,
                                                              int num_segments, double* entropy) {
  const int segment = blockIdx.x, head = blockIdx.y;
  double* out = entropy + static_cast<int64_t>(head) * num_segments + segment;
  const int64_t count = static_cast<int64_t>(segment) * blocks_per_segment;
  if (count == 0) {
    if (threadIdx.x == 0) *out = 0.0;
    return;
  }
  const float* row = scores + head * score_head_stride + triangle_row(segment, blocks_per_segment);
  float largest = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) largest = fmaxf(largest, row[j]);
  largest = block_reduce(largest, [](float x, float y) { return fmaxf(x, y); });
  const double shift = largest;
  const auto add = [](double x, double y) { return x + y; };
  double total = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    total += exp(static_cast<double>(row[j]) - shift);
  }
  total = block_reduce(total, add);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const double p = exp(static_cast<double>(row[j]) - shift) / total;
    sum += p * log(p + 1e-9);
  }
  sum = block_reduce(sum, add);
  if (threadIdx.x == 0) *out = -sum;
}

// --- 4. budgets and row offsets ---

struct BudgetSettings {
  int num_kv_heads;
  int num_segments;
  int segment_size;
  int block_size;
  int first_sparse;  // sparse segments are [first_sparse, end_sparse)
  int end_sparse;
  int64_t num_tokens;
  bool entropy_rule;
  bool share;
  bool per_segment_rigid;
  double base;
  double cap;
  double delta;
  double alpha;
  double entropy_threshold;
  double fixed_budget;
};

// One CTA. Each KV head gets a warp: the rigid test is a vote over the head's segments, and the
// recursion, sequential by nature, runs in all 32 lanes alike while the entropies arrive 32 at a
// time in one coalesced load (one dependent global load per segment would cost ~0.3 us each). The
// arithmetic is the CPU policy's own (entropy_budget.h), so equal entropies give equal budgets to
// the last bit.
__global__ __launch_bounds__(kBudgetThreads) void budget_kernel(
    BudgetSettings settings, const double* entropy, double* budgets, int32_t* budget_tokens,
    int32_t* keep, uint8_t* rigid_head, uint8_t* segment_sparse, int32_t* row_offsets,
    unsigned long long* keys_read) {
  const int segments = settings.num_segments;
  const int64_t rows = static_cast<int64_t>(settings.num_kv_heads) * segments;
  if (settings.entropy_rule) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warps = static_cast<int>(blockDim.x / 32);
    for (int head = warp; head < settings.num_kv_heads; head += warps) {
      const double* head_entropy = entropy + static_cast<int64_t>(head) * segments;
      double* head_budgets = budgets + static_cast<int64_t>(head) * segments;
      bool rigid = true;  // the same in every lane
      for (int first = 1; first < segments; first += 32) {
        const int s = first + lane;
        rigid = __all_sync(0xffffffffu,
                           s >= segments || head_entropy[s] < settings.entropy_threshold) &&
                rigid;
      }
      if (lane == 0) {
        rigid_head[head] = rigid ? 1 : 0;
        head_budgets[0] = settings.base;
      }
      double previous = settings.base, previous_entropy = 0.0;
      for (int first = 1; first < segments; first += 32) {
        const double lane_entropy = first + lane < segments ? head_entropy[first + lane] : 0.0;
        const int steps = min(32, segments - first);
        for (int i = 0; i < steps; ++i) {
          const int s = first + i;
          const double current = __shfl_sync(0xffffffffu, lane_entropy, i);
          const double budget = entropy_budget::segment_budget(
              rigid, settings.per_segment_rigid, settings.entropy_threshold, previous, current,
              previous_entropy, s, settings.base, settings.cap, settings.delta, settings.alpha);
          if (lane == i) head_budgets[s] = budget;
          previous = budget;
          previous_entropy = current;
        }
      }
    }
  } else {
    for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
      budgets[row] = settings.fixed_budget;
    }
  }
  __syncthreads();
  if (settings.entropy_rule && settings.share) {
    for (int s = threadIdx.x; s < segments; s += blockDim.x) {
      double shared = 0.0;
      for (int h = 0; h < settings.num_kv_heads; ++h) {
        const double budget = budgets[static_cast<int64_t>(h) * segments + s];
        shared = shared < budget ? budget : shared;
      }
      for (int h = 0; h < settings.num_kv_heads; ++h) {
        budgets[static_cast<int64_t>(h) * segments + s] = shared;
      }
    }
    __syncthreads();
  }
  for (int s = threadIdx.x; s < segments; s += blockDim.x) {
    segment_sparse[s] = s >= settings.first_sparse && s < settings.end_sparse ? 1 : 0;
  }

  // Block counts, their prefix sum (row_offsets) and keys_read(), chunk by chunk of rows.
  const int blocks_per_segment = settings.segment_size / settings.block_size;
  unsigned long long read = 0;
  int32_t carried = 0;
  for (int64_t first_row = 0; first_row < rows; first_row += blockDim.x) {
    const int64_t row = first_row + threadIdx.x;
    int32_t kept = 0;
    if (row < rows) {
      const int s = static_cast<int>(row % segments);
      const double budget = budgets[row];
      budget_tokens[row] = static_cast<int32_t>(floor(budget));
      const int64_t start = static_cast<int64_t>(s) * settings.segment_size;
      const int64_t length = min(settings.num_tokens, start + settings.segment_size) - start;
      int64_t segment_read = length * (length + 1) / 2;
      if (s >= settings.first_sparse && s < settings.end_sparse) {
        const int64_t visible = static_cast<int64_t>(s) * blocks_per_segment;
        kept = static_cast<int32_t>(
            entropy_budget::budget_blocks(budget, settings.block_size, visible));
        segment_read += length * kept * settings.block_size;
      } else {
        segment_read += length * start;
      }
      keep[row] = kept;
      read += static_cast<unsigned long long>(segment_read);
    }
    int32_t chunk_total = 0;
    const int32_t before = block_exclusive_scan(kept, chunk_total);
    if (row < rows) row_offsets[row] = carried + before;
    carried += chunk_total;
  }
  read = block_reduce(read, [](unsigned long long x, unsigned long long y) { return x + y; });
  if (threadIdx.x == 0) {
    row_offsets[rows] = carried;
    *keys_read = read;
  }
}

// --- 5. top-k selection ---

// Scores as unsigned keys whose order is the floats' order; -0 maps with +0 because the CPU's
// comparisons see them equal.
__device__ inline uint32_t order_key(float score) {
  const uint32_t bits = score == 0.0f ? 0u : __float_as_uint(score);
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// One CTA per sparse (segment, KV head) row. The CPU keeps the first `keep` blocks in the order
// (score desc, index asc). A radix select over the keys, 8 bits a pass from the top, narrows
// (prefix, mask) until the `need` blocks still to take all share the prefix and either all blocks
// with it are taken or the key is complete (then the rest are exact ties, taken in index order).
// One scan in index order then writes every block above the prefix and the first `need` equal to
// it, ascending, with no sort.
__global__ __launch_bounds__(kSelectThreads) void select_kernel(
    const float* scores, int64_t score_head_stride, int blocks_per_segment, int num_segments,
    int first_sparse, const int32_t* keep, const int32_t* row_offsets, int32_t* block_indices) {
  constexpr int kWarps = kSelectThreads / 32;
  __shared__ unsigned histogram[kWarps][256];
  __shared__ unsigned chosen_digit, chosen_need, chosen_count;
  const int segment = first_sparse + blockIdx.x, head = blockIdx.y;
  const int64_t row_index = static_cast<int64_t>(head) * num_segments + segment;
  const int count = segment * blocks_per_segment;
  const int wanted = keep[row_index];
  int32_t* out = block_indices + row_offsets[row_index];
  if (wanted <= 0) return;
  if (wanted >= count) {
    for (int j = threadIdx.x; j < count; j += blockDim.x) out[j] = j;
    return;
  }
  const float* row = scores + head * score_head_stride + triangle_row(segment, blocks_per_segment);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  uint32_t prefix = 0, mask = 0;
  unsigned need = static_cast<unsigned>(wanted);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kWarps * 256; i += blockDim.x) (&histogram[0][0])[i] = 0;
    __syncthreads();
    for (int first = 0; first < count; first += blockDim.x) {
      const int j = first + threadIdx.x;
      const uint32_t key = j < count ? order_key(row[j]) : 0u;
      const bool counted = j < count && (key & mask) == prefix;
      const unsigned digit = counted ? (key >> shift) & 255u : 256u;
      // Lanes with the same digit add once: the top digits of nearby scores are mostly equal.
      const unsigned peers = __match_any_sync(0xffffffffu, digit);
      if (counted && lane == __ffs(peers) - 1) atomicAdd(&histogram[warp][digit], __popc(peers));
    }
    __syncthreads();
    // Thread t looks at digit 255 - t: a scan in thread order counts the blocks above each digit.
    unsigned bin = 0;
    if (threadIdx.x < 256) {
      for (int w = 0; w < kWarps; ++w) bin += histogram[w][255 - threadIdx.x];
    }
    unsigned total = 0;
    const unsigned above = block_exclusive_scan(bin, total);
    if (threadIdx.x < 256 && above < need && need <= above + bin) {
      chosen_digit = 255u - threadIdx.x;
      chosen_need = need - above;
      chosen_count = bin;
    }
    __syncthreads();
    prefix |= chosen_digit << shift;
    mask |= 255u << shift;
    need = chosen_need;
    const bool settled = chosen_need == chosen_count;
    __syncthreads();  // chosen_* and the histogram are read before the next pass writes them
    if (settled) break;
  }

  // Greater and equal counts travel packed in one scan (a chunk holds at most 512 of each).
  unsigned greater_before_chunk = 0, equal_before_chunk = 0;
  for (int first = 0; first < count; first += blockDim.x) {
    const int j = first + threadIdx.x;
    const uint32_t key = j < count ? order_key(row[j]) & mask : 0u;
    const unsigned greater = j < count && key > prefix ? 1u : 0u;
    const unsigned equal = j < count && key == prefix ? 1u : 0u;
    unsigned chunk_total = 0;
    const unsigned before = block_exclusive_scan(greater | (equal << 16), chunk_total);
    const unsigned greater_before = greater_before_chunk + (before & 0xffffu);
    const unsigned equal_before = equal_before_chunk + (before >> 16);
    if (greater != 0 || (equal != 0 && equal_before < need)) {
      out[greater_before + min(equal_before, need)] = j;
    }
    greater_before_chunk += chunk_total & 0xffffu;
    equal_before_chunk += chunk_total >> 16;
  }
}

// --- work accounting ---

__global__ void add_keys_read_kernel(unsigned long long* keys_read,
                                     unsigned long long* keys_read_dense,
                                     const unsigned long long* plan_keys,
                                     unsigned long long dense_keys) {
  if (keys_read != nullptr) *keys_read += plan_keys != nullptr ? *plan_keys : dense_keys;
  if (keys_read_dense != nullptr) *keys_read_dense += dense_keys;
}

template <int G>
void launch_score_tiles(const float* midpoints, int64_t row_stride, const bf16* extrema,
                        int64_t block_stride, int padded_dim, int num_segments,
                        int blocks_per_segment, int num_kv_heads, float* scores,
                        int64_t score_head_stride, cudaStream_t stream) {
  const int64_t widest_row = static_cast<int64_t>(num_segments - 1) * blocks_per_segment;
  const dim3 grid(static_cast<unsigned>((widest_row + kMmaBlocks - 1) / kMmaBlocks),
                  static_cast<unsigned>((num_segments + kMmaSegments - 1) / kMmaSegments),
                  static_cast<unsigned>(num_kv_heads));
  score_mma_kernel<G><<<grid, kMmaThreads, 0, stream>>>(
      midpoints, row_stride, extrema, block_stride, padded_dim, num_segments, blocks_per_segment,
      scores, score_head_stride);
  check_launch("score_mma_kernel");
}

}  // namespace

size_t PrefillEstimator::device_bytes(int num_q_heads, int num_kv_heads, int head_dim,
                                      int64_t max_tokens, const PrefillParams& params) {
  const Layout l = make_layout(num_q_heads, num_kv_heads, head_dim, max_tokens, params);
  const auto at_least_one = [](int64_t count) {
    return static_cast<size_t>(std::max<int64_t>(1, count));
  };
  size_t bytes = 0;
  bytes += sizeof(bf16) * at_least_one(int64_t{num_kv_heads} * 2 * l.padded_dim * l.block_stride);
  bytes += sizeof(float) * at_least_one(int64_t{num_kv_heads} * l.padded_dim * l.row_stride);
  bytes += sizeof(float) * at_least_one(l.score_entries);
  bytes += 2 * sizeof(double) * at_least_one(l.max_rows);   // entropy, budgets
  bytes += 2 * sizeof(int32_t) * at_least_one(l.max_rows);  // tokens, keep
  bytes += sizeof(uint8_t) * (at_least_one(num_kv_heads) + at_least_one(l.max_segments));
  bytes += sizeof(int32_t) * at_least_one(l.max_rows + 1);       // row_offsets
  bytes += sizeof(int32_t) * at_least_one(l.selected_capacity);  // block_indices
  bytes += sizeof(unsigned long long);
  return bytes;
}

PrefillEstimator::PrefillEstimator(int num_q_heads, int num_kv_heads, int head_dim,
                                   int64_t max_tokens, const PrefillParams& params, BudgetRule rule)
    : num_q_heads_(num_q_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      max_tokens_(max_tokens),
      params_(params),
      rule_(rule) {
  const Layout l = make_layout(num_q_heads, num_kv_heads, head_dim, max_tokens, params);
  group_ = l.group;
  padded_dim_ = l.padded_dim;
  block_stride_ = l.block_stride;
  row_stride_ = l.row_stride;
  const auto at_least_one = [](int64_t count) {
    return static_cast<size_t>(std::max<int64_t>(1, count));
  };
  key_extrema_.allocate(at_least_one(int64_t{num_kv_heads} * 2 * padded_dim_ * block_stride_));
  midpoints_.allocate(at_least_one(int64_t{num_kv_heads} * padded_dim_ * row_stride_));
  scores_.allocate(at_least_one(l.score_entries));
  entropy_.allocate(at_least_one(l.max_rows));
  budgets_.allocate(at_least_one(l.max_rows));
  budget_tokens_.allocate(at_least_one(l.max_rows));
  keep_.allocate(at_least_one(l.max_rows));
  rigid_head_.allocate(at_least_one(num_kv_heads));
  segment_sparse_.allocate(at_least_one(l.max_segments));
  row_offsets_.allocate(at_least_one(l.max_rows + 1));
  block_indices_.allocate(at_least_one(l.selected_capacity));
  keys_read_.allocate(1);
  // The padding of head_dim must be zeros (it enters the dot products), and padded rows and blocks
  // are read by edge tiles (their scores are dropped, but they should be numbers).
  check(cudaMemset(key_extrema_.data(), 0, key_extrema_.bytes()), "estimator memset");
  check(cudaMemset(midpoints_.data(), 0, midpoints_.bytes()), "estimator memset");
}

void PrefillEstimator::check_record_range(int64_t first, int64_t count) const {
  const int b = params_.block_size;
  if (first < 0 || count < 0 || first % b != 0 || first + count > max_tokens_) {
    throw Error("GPU prefill estimate: key blocks [" + std::to_string(first) + ", " +
                std::to_string(first + count) + ") must start at a multiple of block_size (" +
                std::to_string(b) + ") and end within max_tokens (" + std::to_string(max_tokens_) +
                ")");
  }
  if (first != 0 && first > recorded_tokens_) {
    throw Error("GPU prefill estimate: key blocks from " + std::to_string(first) +
                " would leave a gap after the " + std::to_string(recorded_tokens_) +
                " keys recorded so far");
  }
}

PrefillQkvStats PrefillEstimator::fused_stats() {
  PrefillQkvStats stats;
  stats.query_midpoints = midpoints_.data();
  stats.midpoint_row_stride = row_stride_;
  stats.key_extrema = key_extrema_.data();
  stats.block_stride = block_stride_;
  stats.padded_dim = padded_dim_;
  stats.segment_size = params_.segment_size;
  stats.block_size = params_.block_size;
  return stats;
}

void PrefillEstimator::record_fused(int64_t first, int64_t count) {
  check_record_range(first, count);
  if (first % params_.segment_size != 0) {
    throw Error("GPU prefill estimate: fused statistics from token " + std::to_string(first) +
                " must start at a multiple of segment_size (" +
                std::to_string(params_.segment_size) + ")");
  }
  recorded_tokens_ = first == 0 ? count : std::max(recorded_tokens_, first + count);
  if (first == 0 || first == fused_query_tokens_) fused_query_tokens_ = first + count;
}

void PrefillEstimator::record_key_blocks(const bf16* key_cache, int64_t cache_stride, int64_t first,
                                         int64_t count, cudaStream_t stream) {
  check_record_range(first, count);
  if (cache_stride < first + count) {
    throw Error("GPU prefill estimate: key cache stride " + std::to_string(cache_stride) +
                " is shorter than the keys recorded (" + std::to_string(first + count) + ")");
  }
  recorded_tokens_ = first == 0 ? count : std::max(recorded_tokens_, first + count);
  if (first == 0) fused_query_tokens_ = 0;
  if (count == 0) return;
  if (key_cache == nullptr) throw Error("GPU prefill estimate: null key cache");
  const int b = params_.block_size;
  const int64_t first_block = first / b;
  const int64_t num_blocks = (first + count + b - 1) / b - first_block;
  const dim3 grid(static_cast<unsigned>((num_blocks + 31) / 32),
                  static_cast<unsigned>((head_dim_ + 31) / 32),
                  static_cast<unsigned>(num_kv_heads_));
  key_extrema_kernel<<<grid, 256, 0, stream>>>(key_cache, cache_stride, head_dim_, b, first_block,
                                               num_blocks, first + count, key_extrema_.data(),
                                               padded_dim_, block_stride_);
  check_launch("key_extrema_kernel");
}

DevicePrefillPlan PrefillEstimator::estimate(const bf16* queries, int64_t q_token_stride,
                                             int64_t num_tokens, int layer, cudaStream_t stream) {
  const int S = params_.segment_size, b = params_.block_size;
  if (num_tokens < 0 || num_tokens > max_tokens_) {
    throw Error("GPU prefill estimate: " + std::to_string(num_tokens) + " tokens are outside 0.." +
                std::to_string(max_tokens_) + " (max_tokens)");
  }
  const int segments = static_cast<int>(count_segments(num_tokens, S));
  int first_sparse = segments, end_sparse = segments;
  for (int s = 0; s < segments; ++s) {
    if (segment_is_sparse(s, segments, S, params_.sparse_threshold)) {
      first_sparse = std::min(first_sparse, s);
      end_sparse = s + 1;
    }
  }
  if (first_sparse == segments) end_sparse = segments;  // no sparse segment

  DevicePrefillPlan view;
  view.num_tokens = num_tokens;
  view.num_kv_heads = num_kv_heads_;
  view.segment_size = S;
  view.block_size = b;
  view.num_segments = segments;
  last_tokens_ = num_tokens;
  last_segments_ = segments;
  last_dense_ = layer < params_.dense_layers || first_sparse >= end_sparse;
  if (last_dense_) return view;

  if (queries == nullptr || q_token_stride < static_cast<int64_t>(num_q_heads_) * head_dim_) {
    throw Error("GPU prefill estimate: queries need a token stride of at least " +
                std::to_string(num_q_heads_ * head_dim_) + " (got " +
                std::to_string(q_token_stride) + ")");
  }
  const int64_t needed_keys = static_cast<int64_t>(segments - 1) * S;
  if (recorded_tokens_ < needed_keys) {
    throw Error("GPU prefill estimate: only " + std::to_string(recorded_tokens_) +
                " keys are recorded; the plan of " + std::to_string(num_tokens) +
                " tokens needs the blocks of the first " + std::to_string(needed_keys));
  }
  const int blocks_per_segment = S / b;
  const int64_t score_head_stride = triangle_entries(segments, blocks_per_segment);
  const bool entropy_rule = rule_ == BudgetRule::kEntropy;

  // 1. Midpoints of segments 1.. (segment 0 sees no block), unless prefill_qkv_epilogue has
  // written them for every token.
  if (fused_query_tokens_ < num_tokens) {
    const dim3 grid(static_cast<unsigned>(segments - 1), static_cast<unsigned>(num_q_heads_));
    const bool vectors = head_dim_ % 8 == 0 && q_token_stride % 8 == 0 &&
                         reinterpret_cast<uintptr_t>(queries) % 16 == 0;
    if (vectors) {
      query_midpoint_kernel<8><<<grid, 256, 0, stream>>>(queries, q_token_stride, num_tokens,
                                                         head_dim_, S, 1, group_, midpoints_.data(),
                                                         padded_dim_, row_stride_);
    } else {
      query_midpoint_kernel<1>
          <<<grid, kMaxHeadDim, 0, stream>>>(queries, q_token_stride, num_tokens, head_dim_, S, 1,
                                             group_, midpoints_.data(), padded_dim_, row_stride_);
    }
    check_launch("query_midpoint_kernel");
  }

  // 2. Scores of every row s >= 1 (CritiPrefill reads only the sparse ones; the others are few).
  switch (group_) {
    case 1:
      launch_score_tiles<1>(midpoints_.data(), row_stride_, key_extrema_.data(), block_stride_,
                            padded_dim_, segments, blocks_per_segment, num_kv_heads_,
                            scores_.data(), score_head_stride, stream);
      break;
    case 2:
      launch_score_tiles<2>(midpoints_.data(), row_stride_, key_extrema_.data(), block_stride_,
                            padded_dim_, segments, blocks_per_segment, num_kv_heads_,
                            scores_.data(), score_head_stride, stream);
      break;
    case 4:
      launch_score_tiles<4>(midpoints_.data(), row_stride_, key_extrema_.data(), block_stride_,
                            padded_dim_, segments, blocks_per_segment, num_kv_heads_,
                            scores_.data(), score_head_stride, stream);
      break;
    case 8:
      launch_score_tiles<8>(midpoints_.data(), row_stride_, key_extrema_.data(), block_stride_,
                            padded_dim_, segments, blocks_per_segment, num_kv_heads_,
                            scores_.data(), score_head_stride, stream);
      break;
    default: {
      const int64_t widest_row = static_cast<int64_t>(segments - 1) * blocks_per_segment;
      const dim3 grid(static_cast<unsigned>((widest_row + 255) / 256),
                      static_cast<unsigned>(segments), static_cast<unsigned>(num_kv_heads_));
      score_row_kernel<<<grid, 256, 0, stream>>>(
          midpoints_.data(), row_stride_, key_extrema_.data(), block_stride_, padded_dim_, group_,
          blocks_per_segment, scores_.data(), score_head_stride);
      check_launch("score_row_kernel");
    }
  }

  // 3. Entropy of every row.
  if (entropy_rule) {
    const dim3 grid(static_cast<unsigned>(segments), static_cast<unsigned>(num_kv_heads_));
    entropy_kernel<<<grid, kRowThreads, 0, stream>>>(scores_.data(), score_head_stride,
                                                     blocks_per_segment, segments, entropy_.data());
    check_launch("entropy_kernel");
  }

  // 4. Budgets, block counts and row offsets.
  BudgetSettings settings{};
  settings.num_kv_heads = num_kv_heads_;
  settings.num_segments = segments;
  settings.segment_size = S;
  settings.block_size = b;
  settings.first_sparse = first_sparse;
  settings.end_sparse = end_sparse;
  settings.num_tokens = num_tokens;
  settings.entropy_rule = entropy_rule;
  settings.share = params_.share_segment_budget;
  settings.per_segment_rigid = params_.per_segment_rigid;
  settings.base = params_.base_budget;
  settings.cap = static_cast<double>(params_.budget_cap_factor) * settings.base;
  settings.delta = params_.delta;
  settings.alpha = params_.alpha;
  settings.entropy_threshold = params_.entropy_threshold;
  settings.fixed_budget = static_cast<double>(params_.critiprefill_budget);
  budget_kernel<<<1, kBudgetThreads, 0, stream>>>(
      settings, entropy_.data(), budgets_.data(), budget_tokens_.data(), keep_.data(),
      rigid_head_.data(), segment_sparse_.data(), row_offsets_.data(), keys_read_.data());
  check_launch("budget_kernel");

  // 5. The blocks of every sparse row.
  {
    const dim3 grid(static_cast<unsigned>(end_sparse - first_sparse),
                    static_cast<unsigned>(num_kv_heads_));
    select_kernel<<<grid, kSelectThreads, 0, stream>>>(
        scores_.data(), score_head_stride, blocks_per_segment, segments, first_sparse, keep_.data(),
        row_offsets_.data(), block_indices_.data());
    check_launch("select_kernel");
  }

  view.dense = false;
  view.segment_sparse = segment_sparse_.data();
  view.row_offsets = row_offsets_.data();
  view.block_indices = block_indices_.data();
  return view;
}

void PrefillEstimator::accumulate_keys_read(unsigned long long* keys_read,
                                            unsigned long long* keys_read_dense,
                                            cudaStream_t stream) const {
  const auto dense_keys = static_cast<unsigned long long>(num_kv_heads_) *
                          static_cast<unsigned long long>(last_tokens_) *
                          static_cast<unsigned long long>(last_tokens_ + 1) / 2;
  add_keys_read_kernel<<<1, 1, 0, stream>>>(keys_read, keys_read_dense,
                                            last_dense_ ? nullptr : keys_read_.data(), dense_keys);
  check_launch("add_keys_read_kernel");
}

namespace {

template <typename T>
std::vector<T> download_async(const T* device, size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  if (count != 0) {
    check(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream),
          "estimate download");
  }
  return host;
}

}  // namespace

LayerPrefillPlan PrefillEstimator::download_last(cudaStream_t stream) const {
  LayerPrefillPlan plan;
  plan.dense = last_dense_;
  plan.num_tokens = last_tokens_;
  plan.num_kv_heads = num_kv_heads_;
  plan.segment_size = params_.segment_size;
  plan.block_size = params_.block_size;
  plan.num_segments = last_segments_;
  if (last_dense_) return plan;
  const size_t rows = static_cast<size_t>(num_kv_heads_) * last_segments_;
  check(cudaStreamSynchronize(stream), "estimate download");
  plan.segment_sparse = download_async(segment_sparse_.data(), last_segments_, stream);
  plan.row_offsets = download_async(row_offsets_.data(), rows + 1, stream);
  plan.budget_tokens = download_async(budget_tokens_.data(), rows, stream);
  std::vector<double> entropy;
  if (rule_ == BudgetRule::kEntropy) {
    entropy = download_async(entropy_.data(), rows, stream);
    plan.rigid_head = download_async(rigid_head_.data(), num_kv_heads_, stream);
  }
  check(cudaStreamSynchronize(stream), "estimate download");
  plan.block_indices = download_async(block_indices_.data(), plan.row_offsets.back(), stream);
  check(cudaStreamSynchronize(stream), "estimate download");
  plan.entropy.assign(entropy.begin(), entropy.end());
  return plan;
}

HeadExtrema PrefillEstimator::download_key_extrema(int64_t num_tokens, cudaStream_t stream) const {
  if (num_tokens < 0 || num_tokens > recorded_tokens_) {
    throw Error("GPU prefill estimate: keys [0, " + std::to_string(num_tokens) +
                ") are not all recorded (" + std::to_string(recorded_tokens_) + " are)");
  }
  HeadExtrema extrema;
  extrema.num_heads = num_kv_heads_;
  extrema.num_groups = (num_tokens + params_.block_size - 1) / params_.block_size;
  extrema.head_dim = head_dim_;
  check(cudaStreamSynchronize(stream), "extrema download");
  std::vector<uint16_t> bits(key_extrema_.size());
  key_extrema_.download(reinterpret_cast<bf16*>(bits.data()), bits.size());
  const size_t size = static_cast<size_t>(num_kv_heads_) * extrema.num_groups * head_dim_;
  extrema.max.resize(size);
  extrema.min.resize(size);
  for (int h = 0; h < num_kv_heads_; ++h) {
    for (int64_t block = 0; block < extrema.num_groups; ++block) {
      for (int d = 0; d < head_dim_; ++d) {
        const size_t host = (static_cast<size_t>(h) * extrema.num_groups + block) * head_dim_ + d;
        for (int kind = 0; kind < 2; ++kind) {
          const size_t device =
              ((static_cast<size_t>(h) * 2 + kind) * padded_dim_ + d) * block_stride_ + block;
          (kind == 0 ? extrema.max : extrema.min)[host] = bf16_to_f32(bits[device]);
        }
      }
    }
  }
  return extrema;
}

}  // namespace entropyinfer::cuda

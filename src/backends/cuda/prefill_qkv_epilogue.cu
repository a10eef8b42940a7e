#include <cfloat>
#include <string>

#include "backends/cuda/dependent_launch.cuh"
#include "backends/cuda/prefill_qkv_epilogue.h"

namespace entropyinfer::cuda {
namespace {

constexpr int kThreads = 256;
// Rows per CTA without statistics; with them a CTA covers one segment.
constexpr int kPlainTileRows = 256;
// Shared floats per extrema kind: (kThreads / lanes) row groups x head_dim, lanes = head_dim / 8.
constexpr int kSharedPerKind = kThreads * 8;

struct EpilogueArgs {
  const bf16* qkv;
  PrefillQkvShape shape;
  const float* cos;
  const float* sin;
  bf16* q_out;
  bf16* key_cache;
  bf16* value_cache;
  PrefillQkvStats stats;
  bool with_stats;
  int tile_rows;
};

// Four bf16 from 8 bytes, and back.
__device__ __forceinline__ void unpack4(const uint2& packed, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  const float2 low = __bfloat1622float2(pairs[0]), high = __bfloat1622float2(pairs[1]);
  out[0] = low.x;
  out[1] = low.y;
  out[2] = high.x;
  out[3] = high.y;
}

__device__ __forceinline__ uint2 pack4(const float* values) {
  uint2 packed;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
  pairs[0] = __floats2bfloat162_rn(values[0], values[1]);
  pairs[1] = __floats2bfloat162_rn(values[2], values[3]);
  return packed;
}

// The dimension that value e (0..7) of a lane's row slice lies in: the lane rotates pairs
// lane*4 .. lane*4+3. Halves layout: e < 4 is a pair's first element (dimension p), e >= 4 its
// second (p + half). Adjacent layout: the lane's 8 dimensions are consecutive.
__device__ __forceinline__ int slice_dim(int lane, int e, int half, bool adjacent) {
  return adjacent ? lane * 8 + e : (e < 4 ? lane * 4 + e : half + lane * 4 + (e - 4));
}

// One row slice of a head as loaded: the 8 values of 4 rotation pairs (adjacent layout: the 16
// bytes of 8 consecutive dimensions; halves layout: x, y the pairs' first elements, z, w their
// second) and the 4 pairs' angles.
struct RowSlice {
  uint4 data;
  float4 cos, sin;
};

__device__ __forceinline__ RowSlice load_slice(const bf16* source, const float* cos,
                                               const float* sin, int lane, int half,
                                               bool adjacent) {
  RowSlice slice;
  if (adjacent) {
    slice.data = *reinterpret_cast<const uint4*>(source + lane * 8);
  } else {
    const uint2 first = *reinterpret_cast<const uint2*>(source + lane * 4);
    const uint2 second = *reinterpret_cast<const uint2*>(source + half + lane * 4);
    slice.data = make_uint4(first.x, first.y, second.x, second.y);
  }
  slice.cos = *reinterpret_cast<const float4*>(cos + lane * 4);
  slice.sin = *reinterpret_cast<const float4*>(sin + lane * 4);
  return slice;
}

// Rotates a loaded slice and writes it to `target` as bf16; `rotated` receives the 8 values as
// written (bf16-rounded), in slice_dim order.
__device__ __forceinline__ void rotate_store(const RowSlice& slice, bf16* target, int lane,
                                             int half, bool adjacent, float* rotated) {
  float a[4], b[4];
  if (adjacent) {
    float packed[8];
    unpack4(make_uint2(slice.data.x, slice.data.y), packed);
    unpack4(make_uint2(slice.data.z, slice.data.w), packed + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a[i] = packed[2 * i];
      b[i] = packed[2 * i + 1];
    }
  } else {
    unpack4(make_uint2(slice.data.x, slice.data.y), a);
    unpack4(make_uint2(slice.data.z, slice.data.w), b);
  }
  const float cs[4] = {slice.cos.x, slice.cos.y, slice.cos.z, slice.cos.w};
  const float sn[4] = {slice.sin.x, slice.sin.y, slice.sin.z, slice.sin.w};
  float ra[4], rb[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // apply_rope's expressions, rounded to bf16 as they are stored.
    ra[i] = __bfloat162float(__float2bfloat16(a[i] * cs[i] - b[i] * sn[i]));
    rb[i] = __bfloat162float(__float2bfloat16(b[i] * cs[i] + a[i] * sn[i]));
  }
  if (adjacent) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rotated[2 * i] = ra[i];
      rotated[2 * i + 1] = rb[i];
    }
    const uint2 low = pack4(rotated), high = pack4(rotated + 4);
    *reinterpret_cast<uint4*>(target + lane * 8) = make_uint4(low.x, low.y, high.x, high.y);
  } else {
    *reinterpret_cast<uint2*>(target + lane * 4) = pack4(ra);
    *reinterpret_cast<uint2*>(target + half + lane * 4) = pack4(rb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      rotated[i] = ra[i];
      rotated[4 + i] = rb[i];
    }
  }
}

// Rows a thread loads before it rotates and stores any of them. The stores could alias the loads
// as far as the compiler knows, so without the batch each row's loads would wait for the previous
// row's stores: one row in flight per thread.
constexpr int kBatch = 4;

// Rotates rows first, first + step, ... (kBatch of them, those before end) of one head's slice
// into target_head and folds the values written into high/low.
__device__ __forceinline__ void rotate_batch(const EpilogueArgs& args, const bf16* source_head,
                                             bf16* target_head, int64_t target_stride,
                                             int64_t first, int64_t step, int64_t end, int lane,
                                             float* high, float* low) {
  const PrefillQkvShape& s = args.shape;
  const int half = s.head_dim / 2;
  RowSlice rows[kBatch];
#pragma unroll
  for (int r = 0; r < kBatch; ++r) {
    const int64_t token = first + r * step;
    if (token < end) {
      rows[r] = load_slice(source_head + token * s.token_stride, args.cos + token * half,
                           args.sin + token * half, lane, half, s.adjacent_pairs);
    }
  }
#pragma unroll
  for (int r = 0; r < kBatch; ++r) {
    const int64_t token = first + r * step;
    if (token >= end) break;
    float rotated[8];
    rotate_store(rows[r], target_head + token * target_stride, lane, half, s.adjacent_pairs,
                 rotated);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      high[e] = fmaxf(high[e], rotated[e]);
      low[e] = fminf(low[e], rotated[e]);
    }
  }
}

// Grid: (tiles of tile_rows tokens, q_heads + 2 * kv_heads). A CTA works on one head of one tile:
// query heads rotate into q_out (and reduce their tile, one segment, to midpoints), key heads
// rotate into the key cache (and reduce each block of block_size rows to its extrema), value heads
// are copied. Each thread owns a slice of 8 dimensions (4 rotation pairs) of rows group,
// group + groups, ... (queries) or of whole key blocks.
__global__ __launch_bounds__(kThreads, 2) void prefill_qkv_epilogue_kernel(EpilogueArgs args) {
  __shared__ float shared_max[kSharedPerKind];
  __shared__ float shared_min[kSharedPerKind];
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const PrefillQkvShape& s = args.shape;
  const int D = s.head_dim, half = D / 2;
  const int head = blockIdx.y;
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * args.tile_rows;
  const int64_t tile_end = min(tile_begin + args.tile_rows, s.tokens);

  if (head >= s.q_heads + s.kv_heads) {  // a value head: 16-byte copies
    const int kv = head - s.q_heads - s.kv_heads;
    const int chunks = D / 8;
    const bf16* source = args.qkv + static_cast<int64_t>(s.q_heads + s.kv_heads + kv) * D;
    bf16* target =
        args.value_cache + (static_cast<int64_t>(kv) * s.cache_stride + s.first_position) * D;
    for (int64_t i = threadIdx.x; i < (tile_end - tile_begin) * chunks; i += kThreads) {
      const int64_t token = tile_begin + i / chunks;
      const int chunk = static_cast<int>(i % chunks);
      *reinterpret_cast<uint4*>(target + token * D + chunk * 8) =
          *reinterpret_cast<const uint4*>(source + token * s.token_stride + chunk * 8);
    }
    return;
  }

  const int lanes = D / 8;
  const int groups = kThreads / lanes;
  const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
  // When lanes does not divide kThreads, the last threads have no row group; they still meet the
  // barriers.
  const bool has_group = group < groups;
  const bool is_query = head < s.q_heads;
  const int kv = is_query ? head / (s.q_heads / s.kv_heads) : head - s.q_heads;
  const bf16* source_head = args.qkv + static_cast<int64_t>(head) * D;
  bf16* target_head =
      is_query
          ? args.q_out + static_cast<int64_t>(head) * D
          : args.key_cache + (static_cast<int64_t>(kv) * s.cache_stride + s.first_position) * D;
  const int64_t target_stride = is_query ? s.q_out_stride : D;
  if (is_query || !args.with_stats) {
    float high[8], low[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      high[e] = -FLT_MAX;
      low[e] = FLT_MAX;
    }
    for (int64_t first = tile_begin + group; has_group && first < tile_end;
         first += kBatch * groups) {
      rotate_batch(args, source_head, target_head, target_stride, first, groups, tile_end, lane,
                   high, low);
    }
    if (!args.with_stats) return;
    for (int e = 0; e < 8 && has_group; ++e) {
      const int d = slice_dim(lane, e, half, s.adjacent_pairs);
      shared_max[group * D + d] = high[e];
      shared_min[group * D + d] = low[e];
    }
    __syncthreads();
    const int group_size = s.q_heads / s.kv_heads, member = head % group_size;
    const int64_t segment = (s.first_position + tile_begin) / args.stats.segment_size;
    for (int d = threadIdx.x; d < D; d += kThreads) {
      float column_max = -FLT_MAX, column_min = FLT_MAX;
      for (int g = 0; g < groups; ++g) {
        column_max = fmaxf(column_max, shared_max[g * D + d]);
        column_min = fminf(column_min, shared_min[g * D + d]);
      }
      // The CPU's expression: the midpoint is bit-identical.
      args.stats.query_midpoints[(static_cast<int64_t>(kv) * args.stats.padded_dim + d) *
                                     args.stats.midpoint_row_stride +
                                 segment * group_size + member] = 0.5f * (column_max + column_min);
    }
    return;
  }

  // A key head with statistics: each row group takes whole blocks, a pass of `groups` blocks at a
  // time, and the pass's extrema leave through shared memory so that each (kind, dimension) row of
  // consecutive blocks is written contiguously.
  const int b = args.stats.block_size;
  const int64_t first_block = (s.first_position + tile_begin) / b;
  const int64_t tile_blocks = (tile_end - tile_begin + b - 1) / b;
  for (int64_t pass = 0; pass < tile_blocks; pass += groups) {
    const int64_t block = pass + group;
    float high[8], low[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      high[e] = -FLT_MAX;
      low[e] = FLT_MAX;
    }
    if (has_group && block < tile_blocks) {
      const int64_t begin = tile_begin + block * b;
      const int64_t end = min(begin + b, tile_end);
      for (int64_t first = begin; first < end; first += kBatch) {
        rotate_batch(args, source_head, target_head, target_stride, first, 1, end, lane, high, low);
      }
    }
    for (int e = 0; e < 8 && has_group; ++e) {
      const int d = slice_dim(lane, e, half, s.adjacent_pairs);
      shared_max[d * groups + group] = high[e];
      shared_min[d * groups + group] = low[e];
    }
    __syncthreads();
    const int64_t pass_blocks = min(static_cast<int64_t>(groups), tile_blocks - pass);
    for (int i = threadIdx.x; i < 2 * D * groups; i += kThreads) {
      const int g = i % groups, d = (i / groups) % D, kind = i / (groups * D);
      if (g >= pass_blocks) continue;
      const float value = kind == 0 ? shared_max[d * groups + g] : shared_min[d * groups + g];
      args.stats.key_extrema[((static_cast<int64_t>(kv) * 2 + kind) * args.stats.padded_dim + d) *
                                 args.stats.block_stride +
                             first_block + pass + g] = __float2bfloat16(value);
    }
    __syncthreads();
  }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool prefill_qkv_epilogue_fits(const bf16* qkv, const PrefillQkvShape& shape, int rotary_dim,
                               const float* cos, const float* sin, const bf16* q_out,
                               const PrefillQkvStats* stats) {
  const int D = shape.head_dim;
  if (D <= 0 || D % 8 != 0 || D > 256 || rotary_dim != D) return false;
  if (shape.q_heads <= 0 || shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    return false;
  }
  if (shape.token_stride % 8 != 0 || shape.q_out_stride % 8 != 0) return false;
  if (!aligned16(qkv) || !aligned16(cos) || !aligned16(sin) || !aligned16(q_out)) return false;
  if (stats != nullptr) {
    if (stats->segment_size <= 0 || stats->block_size <= 0 ||
        stats->segment_size % stats->block_size != 0 ||
        shape.first_position % stats->segment_size != 0 || stats->padded_dim < D) {
      return false;
    }
  }
  return true;
}

void prefill_qkv_epilogue(const bf16* qkv, const PrefillQkvShape& shape, const float* cos,
                          const float* sin, bf16* q_out, bf16* key_cache, bf16* value_cache,
                          const PrefillQkvStats* stats, cudaStream_t stream) {
  if (!prefill_qkv_epilogue_fits(qkv, shape, shape.head_dim, cos, sin, q_out, stats)) {
    throw Error("prefill q/k/v epilogue: the shape does not fit the fused pass (head_dim " +
                std::to_string(shape.head_dim) + ", first position " +
                std::to_string(shape.first_position) + ")");
  }
  if (key_cache == nullptr || value_cache == nullptr ||
      shape.cache_stride < shape.first_position + shape.tokens) {
    throw Error("prefill q/k/v epilogue: the caches hold " + std::to_string(shape.cache_stride) +
                " rows, fewer than the " + std::to_string(shape.first_position + shape.tokens) +
                " this call fills");
  }
  if (!aligned16(key_cache) || !aligned16(value_cache)) {
    throw Error("prefill q/k/v epilogue: the caches must be 16-byte aligned");
  }
  if (shape.tokens == 0) return;
  EpilogueArgs args{};
  args.qkv = qkv;
  args.shape = shape;
  args.cos = cos;
  args.sin = sin;
  args.q_out = q_out;
  args.key_cache = key_cache;
  args.value_cache = value_cache;
  args.with_stats = stats != nullptr;
  if (stats != nullptr) args.stats = *stats;
  args.tile_rows = stats != nullptr ? stats->segment_size : kPlainTileRows;
  const int64_t tiles = (shape.tokens + args.tile_rows - 1) / args.tile_rows;
  if (tiles > INT32_MAX) throw Error("prefill q/k/v epilogue: too many tokens in one call");
  const dim3 grid(static_cast<unsigned>(tiles),
                  static_cast<unsigned>(shape.q_heads + 2 * shape.kv_heads));
  launch_dependent("prefill_qkv_epilogue", prefill_qkv_epilogue_kernel, grid, dim3(kThreads), 0,
                   stream, args);
}

}  // namespace entropyinfer::cuda

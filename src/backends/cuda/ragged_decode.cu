// Split-KV decode attention over per-head caches of different lengths (see ragged_decode.h). The
// tile loop follows flash_decode's warp kernel (flash_attention.cu), with the causal mask replaced
// by each cache's run-time length and the rows of a tile being the query heads that read the cache.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/flash_attention_internal.cuh"
#include "backends/cuda/fp8_device.cuh"
#include "backends/cuda/ragged_decode.h"
#include "backends/cuda/row_ops.cuh"

namespace entropyinfer::cuda {
namespace {

constexpr int kBlockN = 32;  // keys per tile
static_assert(kBlockN == kPagedRows, "a page holds one key tile");
constexpr int kStages = 4;  // tiles in flight per warp: three loads overlap each tile's math
constexpr int kRows = 16;   // query rows of one mma tile

template <int kHeadDim>
struct RaggedTile {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kKvTileBytes = kBlockN * kRowBytes;
  static constexpr int kSharedBytes = kRows * kRowBytes + 2 * kStages * kKvTileBytes;  // Q, K, V
};

using detail::swizzled;

struct RaggedParams {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* out = nullptr;
  const int32_t* lengths = nullptr;
  // Split partial results (null with one split): partial_out [splits][q_heads][head_dim]
  // normalised by its own sum, partial_lse [splits][q_heads] its log2-sum-exp2 of scaled scores.
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int64_t cache_stride = 0;
  int q_heads = 0;
  // Paged layout (paged_decode): `batch` sequences of `caches` caches each; cache c of sequence b
  // is entry b * caches + c of lengths and of page_tables, whose key tile i (kBlockN rows) lives in
  // page page_tables[entry * max_pages + i] of the k and v pools. Without page tables: one
  // sequence, cache c at c * cache_stride rows.
  const int32_t* page_tables = nullptr;
  int64_t max_pages = 0;
  int caches = 1;
  int64_t q_stride = 0;  // elements from one sequence's queries to the next's
  int total_heads = 0;   // batch * q_heads: the output rows and the partial slots per split
  int group = 1;
  int rows = 1;  // query heads per cache: group, or 1 when per_query_head
  bool per_query_head = false;
  int splits = 1;
  float scale_log2 = 0.0f;
  // FP8 caches (kv_cache_fp8.h): codes in place of k and v, and one scale per row, at the row's
  // index (entry's cache at cache * cache_stride, or page * kBlockN in the paged layout).
  const uint8_t* k_codes = nullptr;
  const uint8_t* v_codes = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
};

__device__ __forceinline__ int query_head_of(const RaggedParams& p, int cache, int row) {
  return p.per_query_head ? cache : cache * p.group + row;
}

template <int kHeadDim>
__global__ void __launch_bounds__(32) ragged_decode_kernel(const RaggedParams p) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  using Tile = RaggedTile<kHeadDim>;
  constexpr int kChunks = Tile::kChunks;
  constexpr int kTilesN = kBlockN / 8;   // 8-key column tiles of S
  constexpr int kTilesD = kHeadDim / 8;  // 8-wide column tiles of O
  extern __shared__ __align__(128) uint8_t shared[];
  const uint32_t q_tile = detail::shared_address(shared);
  const uint32_t k_tiles = q_tile + kRows * Tile::kRowBytes;
  const uint32_t v_tiles = k_tiles + kStages * Tile::kKvTileBytes;

  const int row0 = blockIdx.x * kRows;
  const int entry = blockIdx.y;
  const int sequence = entry / p.caches;
  const int cache = entry % p.caches;
  const int split = blockIdx.z;
  const int lane = threadIdx.x;
  const bf16* q_sequence = p.q + static_cast<int64_t>(sequence) * p.q_stride;
  const int first_head = sequence * p.q_heads;

  // Each split takes an equal share of its own cache's tiles, so short heads finish early.
  const int length = min(max(p.lengths[entry], 0), static_cast<int>(p.cache_stride));
  const int total_blocks = (length + kBlockN - 1) / kBlockN;
  const int blocks_per_split = (total_blocks + p.splits - 1) / p.splits;
  const int block_begin = min(total_blocks, split * blocks_per_split);
  const int block_end = min(total_blocks, block_begin + blocks_per_split);

  const bf16* k_head = p.k + static_cast<int64_t>(cache) * p.cache_stride * kHeadDim;
  const bf16* v_head = p.v + static_cast<int64_t>(cache) * p.cache_stride * kHeadDim;
  const int32_t* pages = p.page_tables != nullptr
                             ? p.page_tables + static_cast<int64_t>(entry) * p.max_pages
                             : nullptr;

  for (int index = lane; index < kRows * kChunks; index += 32) {
    const int r = index / kChunks, c = index % kChunks;
    const int row = row0 + r;
    const bool valid = row < p.rows;
    const bf16* source =
        valid ? q_sequence + static_cast<int64_t>(query_head_of(p, cache, row)) * kHeadDim + c * 8
              : p.q;
    detail::cp_async_16(swizzled<kHeadDim>(q_tile, r, c), source, valid ? 16 : 0);
  }
  auto load_kv = [&](int block, int stage) {
    const uint32_t k_tile = k_tiles + stage * Tile::kKvTileBytes;
    const uint32_t v_tile = v_tiles + stage * Tile::kKvTileBytes;
    // The tile's first row: a page of its own, or the block's place in the contiguous cache.
    const int64_t first_row = pages != nullptr ? static_cast<int64_t>(pages[block]) * kBlockN
                                               : static_cast<int64_t>(block) * kBlockN;
    const bf16* k_rows = (pages != nullptr ? p.k : k_head) + first_row * kHeadDim;
    const bf16* v_rows = (pages != nullptr ? p.v : v_head) + first_row * kHeadDim;
    for (int index = lane; index < kBlockN * kChunks; index += 32) {
      const int r = index / kChunks, c = index % kChunks;
      const int key = block * kBlockN + r;
      const bool valid = key < length;  // rows past the length are zeros, so 0 * V stays finite
      const int64_t offset = static_cast<int64_t>(valid ? r : 0) * kHeadDim + c * 8;
      detail::cp_async_16(swizzled<kHeadDim>(k_tile, r, c), k_rows + offset, valid ? 16 : 0);
      detail::cp_async_16(swizzled<kHeadDim>(v_tile, r, c), v_rows + offset, valid ? 16 : 0);
    }
  };
  // Group s of the prologue holds block_begin + s (the first also the queries); the group committed
  // in iteration i holds block i + kStages - 1.
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (block_begin + stage < block_end) load_kv(block_begin + stage, stage);
    detail::cp_async_commit();
  }

  // This thread's two rows, g and g + 8.
  const int g = lane / 4, t = lane % 4;
  const int row_a = row0 + g, row_b = row_a + 8;

  float o[kTilesD][4];
#pragma unroll
  for (int i = 0; i < kTilesD; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  uint32_t qa[kHeadDim / 16][4];

  for (int block = block_begin; block < block_end; ++block) {
    const int stage = (block - block_begin) % kStages;
    if (block + kStages - 1 < block_end) {
      load_kv(block + kStages - 1, (block - block_begin + kStages - 1) % kStages);
    }
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncthreads();
    if (block == block_begin) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        detail::ldmatrix_x4(qa[kk], swizzled<kHeadDim>(q_tile, lane & 15, 2 * kk + (lane >> 4)));
      }
    }
    const uint32_t k_tile = k_tiles + stage * Tile::kKvTileBytes;
    const uint32_t v_tile = v_tiles + stage * Tile::kKvTileBytes;

    float s[kTilesN][4];
    detail::tile_scores<kHeadDim, kTilesN>(s, qa, k_tile, lane);
    if ((block + 1) * kBlockN > length) {  // the cache's last, partial tile
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        const int key = block * kBlockN + 8 * j + 2 * t;
        if (key >= length) s[j][0] = s[j][2] = -INFINITY;
        if (key + 1 >= length) s[j][1] = s[j][3] = -INFINITY;
      }
    }
    // Every tile holds at least one key below the length, so each row's maximum is finite.
    detail::softmax_and_accumulate<kHeadDim, kTilesN>(s, o, v_tile, lane, p.scale_log2, max_a,
                                                      max_b, sum_a, sum_b);
    __syncthreads();  // the next iteration's loads overwrite the stage read here
  }
  detail::cp_async_wait<0>();

  float inverse_a, inverse_b;  // zeros for an empty cache or split
  detail::finish_row_sums(sum_a, sum_b, inverse_a, inverse_b);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? row_a : row_b;
    if (row >= p.rows) continue;
    const int head = first_head + query_head_of(p, cache, row);
    const float inverse = half == 0 ? inverse_a : inverse_b;
    if (p.partial_out == nullptr) {
      bf16* out = p.out + static_cast<int64_t>(head) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kTilesD; ++i) {
        *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t) =
            detail::pack_bf16(o[i][2 * half] * inverse, o[i][2 * half + 1] * inverse);
      }
    } else {
      const int64_t slot = static_cast<int64_t>(split) * p.total_heads + head;
      float* out = p.partial_out + slot * kHeadDim;
#pragma unroll
      for (int i = 0; i < kTilesD; ++i) {
        *reinterpret_cast<float2*>(out + 8 * i + 2 * t) =
            make_float2(o[i][2 * half] * inverse, o[i][2 * half + 1] * inverse);
      }
      if (t == 0) {
        const float sum = half == 0 ? sum_a : sum_b;
        const float row_max = half == 0 ? max_a : max_b;
        p.partial_lse[slot] = sum > 0.0f ? row_max + log2f(sum) : -INFINITY;
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// FP8 caches. One block per (16 query rows, cache entry, split), its warps each running the tile
// loop above over a share of the split's tiles, on 32-key tiles of codes (half the bytes of bf16)
// and their row scales, three stages deep. Fragments are read straight
// from shared memory instead of through ldmatrix: the sums over head dimensions and over keys do
// not depend on their order, so each lane's elements of an mma fragment are made contiguous bytes
// by permuting the head dimensions (the queries' fragments permuted alike, the outputs written back
// to their own dimensions).
//   Q K^T, k-step s: lane (g, t)'s four elements of a key row are the bytes at t * D/4 + 4 s.
//   P V, output tile i, column g: dimension g * D/8 + i, so a lane reads D/8 bytes of each row.
template <int kHeadDim>
struct Fp8RaggedTile {
  // Three stages: a tile is half the bytes of bf16's, and the shared memory saved lets a third more
  // warps share each multiprocessor.
  static constexpr int kStages = 3;
  static constexpr int kChunks = kHeadDim / 16;  // 16-byte chunks per row of codes
  static constexpr int kTileBytes = kBlockN * kHeadDim;
  static constexpr int kScaleBytes = kBlockN * 4;
  static constexpr int kStageBytes = 2 * kTileBytes + 2 * kScaleBytes;  // K, V codes; their scales
  // Warps per block, each with its own stages and a contiguous share of the split's tiles: the
  // block combines their rows before writing, so a split's partial stands for kWarps warps' keys
  // and the merge reads a kWarps-th of what one-warp splits would leave it.
  static constexpr int kWarps = 4;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kSharedBytes = kWarps * kWarpBytes;
  // The combination's rows ([kWarps][kRows][kCombineStride] floats, then [kWarps][kRows] sums),
  // in the stage memory once every warp is past its tiles; odd stride against bank conflicts.
  static constexpr int kCombineStride = kHeadDim + 1;
  static_assert(kWarps * kRows * (kCombineStride + 1) * 4 <= kSharedBytes);
  // Chunk placement. Keys: a lane reads its D/4 bytes of rows 8j + g, two rows per 8-lane phase;
  // moving odd rows' 128-byte chunks by one spreads them over all banks. Values: the four rows of
  // one lane-quad (keys 2t, 2t + 1, ...) hold the same column, moved by ((row / 2) mod 4) * 2.
  __device__ static int key_chunk(int row, int chunk) {
    return kHeadDim == 128 ? chunk ^ (row & 1) : chunk;
  }
  __device__ static int value_chunk(int row, int chunk) {
    return kHeadDim == 128 ? chunk ^ (((row >> 1) & 3) << 1) : chunk;
  }
};

__device__ __forceinline__ uint32_t pack_f16(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <int kHeadDim>
__global__ void __launch_bounds__(32 * Fp8RaggedTile<kHeadDim>::kWarps)
    ragged_decode_fp8_kernel(const RaggedParams p) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  using Tile = Fp8RaggedTile<kHeadDim>;
  constexpr int kStages = Tile::kStages;
  constexpr int kChunks = Tile::kChunks;
  constexpr int kTilesN = kBlockN / 8;         // 8-key column tiles of S
  constexpr int kTilesD = kHeadDim / 8;        // 8-wide column tiles of O
  constexpr int kSteps = kHeadDim / 16;        // k-steps of Q K^T
  constexpr int kLaneKeyBytes = kHeadDim / 4;  // a lane's bytes of a key row
  constexpr int kLaneValueBytes = kHeadDim / 8;
  constexpr int kWarps = Tile::kWarps;
  extern __shared__ __align__(128) uint8_t shared[];

  const int row0 = blockIdx.x * kRows;
  const int entry = blockIdx.y;
  const int sequence = entry / p.caches;
  const int cache = entry % p.caches;
  const int split = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const bf16* q_sequence = p.q + static_cast<int64_t>(sequence) * p.q_stride;
  const int first_head = sequence * p.q_heads;
  uint8_t* const warp_shared = shared + warp * Tile::kWarpBytes;

  // The warp's share: part split * kWarps + warp of the cache's tiles cut into splits * kWarps.
  const int length = min(max(p.lengths[entry], 0), static_cast<int>(p.cache_stride));
  const int total_blocks = (length + kBlockN - 1) / kBlockN;
  const int parts = p.splits * kWarps;
  const int blocks_per_part = (total_blocks + parts - 1) / parts;
  const int block_begin = min(total_blocks, (split * kWarps + warp) * blocks_per_part);
  const int block_end = min(total_blocks, block_begin + blocks_per_part);
  const int32_t* pages = p.page_tables != nullptr
                             ? p.page_tables + static_cast<int64_t>(entry) * p.max_pages
                             : nullptr;

  // Lane l copies chunk l % kChunks of rows l / kChunks + i * (32 / kChunks): the chunk, and so
  // both swizzles' row parities, stay the same for every i.
  constexpr int kRowStep = 32 / kChunks;
  constexpr int kCopies = kBlockN / kRowStep;
  const int copy_chunk = lane % kChunks, copy_row = lane / kChunks;
  const uint32_t k_copy_offset = copy_row * kHeadDim + (Tile::key_chunk(copy_row, copy_chunk) << 4);
  const uint8_t* k_codes = p.k_codes + copy_chunk * 16;
  const uint8_t* v_codes = p.v_codes + copy_chunk * 16;
  auto load_kv = [&](int block, int stage) {
    const uint32_t k_tile = detail::shared_address(warp_shared + stage * Tile::kStageBytes);
    const uint32_t v_tile = k_tile + Tile::kTileBytes;
    const uint32_t scales = v_tile + Tile::kTileBytes;
    const int64_t first_row =
        pages != nullptr ? static_cast<int64_t>(pages[block]) * kBlockN
                         : static_cast<int64_t>(cache) * p.cache_stride + int64_t{block} * kBlockN;
    const int valid_rows = min(kBlockN, length - block * kBlockN);  // later rows are zeros
    const uint8_t* k_rows = k_codes + first_row * kHeadDim;
    const uint8_t* v_rows = v_codes + first_row * kHeadDim;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int r = copy_row + i * kRowStep;
      const bool valid = r < valid_rows;
      const int64_t offset = static_cast<int64_t>(valid ? r : 0) * kHeadDim;
      detail::cp_async_16(k_tile + k_copy_offset + i * kRowStep * kHeadDim, k_rows + offset,
                          valid ? 16 : 0);
      detail::cp_async_16(v_tile + r * kHeadDim + (Tile::value_chunk(r, copy_chunk) << 4),
                          v_rows + offset, valid ? 16 : 0);
    }
    {  // a key scale and a value scale per lane
      static_assert(kBlockN == 32);
      const bool valid = lane < valid_rows;
      const int64_t row = first_row + (valid ? lane : 0);
      detail::cp_async_4(scales + 4 * lane, p.k_scales + row, valid ? 4 : 0);
      detail::cp_async_4(scales + Tile::kScaleBytes + 4 * lane, p.v_scales + row, valid ? 4 : 0);
    }
  };
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (block_begin + stage < block_end) load_kv(block_begin + stage, stage);
    detail::cp_async_commit();
  }

  // The queries as fp16 A fragments in the permuted dimension order: rows g and g + 8.
  uint32_t qa[kSteps][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + g + 8 * half;
    const bool valid = row < p.rows;
    const bf16* source = q_sequence +
                         static_cast<int64_t>(valid ? query_head_of(p, cache, row) : 0) * kHeadDim +
                         t * kLaneKeyBytes;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      uint2 packed = make_uint2(0, 0);
      if (valid) packed = *reinterpret_cast<const uint2*>(source + 4 * step);
      const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
      const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
      qa[step][half] = pack_f16(low.x, low.y);
      qa[step][2 + half] = pack_f16(high.x, high.y);
    }
  }

  float o[kTilesD][4];
#pragma unroll
  for (int i = 0; i < kTilesD; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  float value_reference = 0.0f;  // the largest value scale seen: O is kept in its units

  for (int block = block_begin; block < block_end; ++block) {
    const int stage = (block - block_begin) % kStages;
    if (block + kStages - 1 < block_end) {
      load_kv(block + kStages - 1, (block - block_begin + kStages - 1) % kStages);
    }
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncwarp();  // the warps of a block run different numbers of tiles
    const uint8_t* k_tile = warp_shared + stage * Tile::kStageBytes;
    const uint8_t* v_tile = k_tile + Tile::kTileBytes;
    const float* key_scales = reinterpret_cast<const float*>(v_tile + Tile::kTileBytes);
    const float* value_scales = key_scales + kBlockN;

    float s[kTilesN][4];
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      const int r = 8 * j + g;
      uint32_t words[kSteps];
#pragma unroll
      for (int c = 0; c < kLaneKeyBytes / 16; ++c) {
        const uint4 chunk = *reinterpret_cast<const uint4*>(
            k_tile + r * kHeadDim + (Tile::key_chunk(r, t * (kLaneKeyBytes / 16) + c) << 4));
        words[4 * c] = chunk.x;
        words[4 * c + 1] = chunk.y;
        words[4 * c + 2] = chunk.z;
        words[4 * c + 3] = chunk.w;
      }
#pragma unroll
      for (int step = 0; step < kSteps; ++step) {
        detail::mma_f16_16816(s[j], qa[step], fp8::e4m3x2_to_f16x2(words[step]),
                              fp8::e4m3x2_to_f16x2(words[step] >> 16));
      }
    }
    // Scores of codes times their keys' scales; keys past the length masked.
    float value_max = 0.0f;
    float value_scale[kTilesN][2];
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const int column = 8 * j + 2 * t;
      const float2 key_scale = *reinterpret_cast<const float2*>(key_scales + column);
      value_scale[j][0] = value_scales[column];
      value_scale[j][1] = value_scales[column + 1];
      value_max = fmaxf(value_max, fmaxf(value_scale[j][0], value_scale[j][1]));
      const int key = block * kBlockN + column;
      s[j][0] = key < length ? s[j][0] * key_scale.x : -INFINITY;
      s[j][2] = key < length ? s[j][2] * key_scale.x : -INFINITY;
      s[j][1] = key + 1 < length ? s[j][1] * key_scale.y : -INFINITY;
      s[j][3] = key + 1 < length ? s[j][3] * key_scale.y : -INFINITY;
    }
    // The online softmax, with O's unit (the value scale reference) raised alongside its maximum.
    float block_max_a = -INFINITY, block_max_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      block_max_a = fmaxf(block_max_a, fmaxf(s[j][0], s[j][1]));
      block_max_b = fmaxf(block_max_b, fmaxf(s[j][2], s[j][3]));
    }
    const float new_max_a = fmaxf(max_a, detail::quad_max(block_max_a) * p.scale_log2);
    const float new_max_b = fmaxf(max_b, detail::quad_max(block_max_b) * p.scale_log2);
    const float new_reference = fmaxf(value_reference, detail::quad_max(value_max));
    const float unit_rescale = value_reference > 0.0f ? value_reference / new_reference : 1.0f;
    const float inverse_reference = 1.0f / new_reference;  // a tile holds a key: its scale is > 0
    const float reference_a = new_max_a == -INFINITY ? 0.0f : new_max_a;
    const float reference_b = new_max_b == -INFINITY ? 0.0f : new_max_b;
    const float rescale_a = detail::fast_exp2(max_a - reference_a);
    const float rescale_b = detail::fast_exp2(max_b - reference_b);
    max_a = new_max_a;
    max_b = new_max_b;
    value_reference = new_reference;
    float row_sum_a = 0.0f, row_sum_b = 0.0f;
    uint32_t pa[kTilesN / 2][4];
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const float p0 = detail::fast_exp2(s[j][0] * p.scale_log2 - reference_a);
      const float p1 = detail::fast_exp2(s[j][1] * p.scale_log2 - reference_a);
      const float p2 = detail::fast_exp2(s[j][2] * p.scale_log2 - reference_b);
      const float p3 = detail::fast_exp2(s[j][3] * p.scale_log2 - reference_b);
      row_sum_a += p0 + p1;
      row_sum_b += p2 + p3;
      const float w0 = value_scale[j][0] * inverse_reference;
      const float w1 = value_scale[j][1] * inverse_reference;
      pa[j / 2][(j % 2) * 2] = pack_f16(p0 * w0, p1 * w1);
      pa[j / 2][(j % 2) * 2 + 1] = pack_f16(p2 * w0, p3 * w1);
    }
    sum_a = sum_a * rescale_a + row_sum_a;  // this lane's share; finish_row_sums adds the quad's
    sum_b = sum_b * rescale_b + row_sum_b;
    const float o_rescale_a = rescale_a * unit_rescale, o_rescale_b = rescale_b * unit_rescale;
#pragma unroll
    for (int i = 0; i < kTilesD; ++i) {
      o[i][0] *= o_rescale_a;
      o[i][1] *= o_rescale_a;
      o[i][2] *= o_rescale_b;
      o[i][3] *= o_rescale_b;
    }
    // O += P' V: k-step kk covers keys 16 kk .. 16 kk + 15; the lane reads keys 2t, 2t + 1, 2t + 8
    // and 2t + 9 of it at its column g's bytes.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t rows[4][kLaneValueBytes / 4];
#pragma unroll
      for (int which = 0; which < 4; ++which) {
        const int r = 16 * kk + 2 * t + (which & 1) + 8 * (which >> 1);
        const uint8_t* row = v_tile + r * kHeadDim;
        if constexpr (kLaneValueBytes == 16) {
          const uint4 chunk = *reinterpret_cast<const uint4*>(row + (Tile::value_chunk(r, g) << 4));
          rows[which][0] = chunk.x;
          rows[which][1] = chunk.y;
          rows[which][2] = chunk.z;
          rows[which][3] = chunk.w;
        } else {
          const uint2 half = *reinterpret_cast<const uint2*>(row + kLaneValueBytes * g);
          rows[which][0] = half.x;
          rows[which][1] = half.y;
        }
      }
      // A fragment of P for this k-step: n-tiles 2 kk and 2 kk + 1 of S.
      const uint32_t a[4] = {pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]};
#pragma unroll
      for (int word = 0; word < kLaneValueBytes / 4; ++word) {
        // Bytes b of the word for keys (2t, 2t + 1) and (2t + 8, 2t + 9), paired low key first.
        const uint32_t low01 = __byte_perm(rows[0][word], rows[1][word], 0x5140);
        const uint32_t low23 = __byte_perm(rows[0][word], rows[1][word], 0x7362);
        const uint32_t high01 = __byte_perm(rows[2][word], rows[3][word], 0x5140);
        const uint32_t high23 = __byte_perm(rows[2][word], rows[3][word], 0x7362);
        const uint32_t pairs[2][2] = {{low01, high01}, {low23, high23}};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t low = pairs[b / 2][0] >> (16 * (b % 2));
          const uint32_t high = pairs[b / 2][1] >> (16 * (b % 2));
          detail::mma_f16_16816(o[4 * word + b], a, fp8::e4m3x2_to_f16x2(low),
                                fp8::e4m3x2_to_f16x2(high));
        }
      }
    }
    __syncwarp();  // the next iteration's loads overwrite the stage read here
  }
  detail::cp_async_wait<0>();

  float inverse_a, inverse_b;  // zeros for an empty cache or part
  detail::finish_row_sums(sum_a, sum_b, inverse_a, inverse_b);
  // Each warp's rows, normalised, and their log2-sum-exp2 go to the stage memory; the block then
  // weighs its warps as ragged_merge_kernel weighs splits.
  __syncthreads();  // every warp is past its last tile
  constexpr int kStride = Tile::kCombineStride;
  float* const warp_rows = reinterpret_cast<float*>(shared);     // [kWarps][kRows][kStride]
  float* const warp_lse = warp_rows + kWarps * kRows * kStride;  // [kWarps][kRows]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (row0 + r >= p.rows) continue;
    const float factor = (half == 0 ? inverse_a : inverse_b) * value_reference;
    float* const target = warp_rows + (warp * kRows + r) * kStride;
#pragma unroll
    for (int i = 0; i < kTilesD; ++i) {
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        target[(2 * t + column) * kLaneValueBytes + i] = o[i][2 * half + column] * factor;
      }
    }
    if (t == 0) {
      const float sum = half == 0 ? sum_a : sum_b;
      const float row_max = half == 0 ? max_a : max_b;
      warp_lse[warp * kRows + r] = sum > 0.0f ? row_max + log2f(sum) : -INFINITY;
    }
  }
  __syncthreads();
  const int rows = min(kRows, p.rows - row0);
  for (int e = threadIdx.x; e < rows * kHeadDim; e += kWarps * 32) {
    const int r = e / kHeadDim, dim = e % kHeadDim;
    float best = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) best = fmaxf(best, warp_lse[w * kRows + r]);
    float total = 0.0f, value = 0.0f;  // zeros when every warp's share was empty
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = best == -INFINITY ? 0.0f : exp2f(warp_lse[w * kRows + r] - best);
      total += weight;
      value += weight * warp_rows[(w * kRows + r) * kStride + dim];
    }
    value = total > 0.0f ? value / total : 0.0f;
    const int head = first_head + query_head_of(p, cache, row0 + r);
    if (p.partial_out == nullptr) {
      p.out[static_cast<int64_t>(head) * kHeadDim + dim] = __float2bfloat16(value);
    } else {
      const int64_t slot = static_cast<int64_t>(split) * p.total_heads + head;
      p.partial_out[slot * kHeadDim + dim] = value;
      if (dim == 0) p.partial_lse[slot] = total > 0.0f ? best + log2f(total) : -INFINITY;
    }
  }
}

// Threads per output element of the merge: each sums every kMergeParts-th split, so that the
// chain of dependent loads per thread is that much shorter.
constexpr int kMergeParts = 4;

// One block of kMergeParts * head_dim threads per query head: out = sum_s 2^(lse_s - max) O_s /
// sum_s 2^(lse_s - max), zeros when every split was empty (an empty cache).
__global__ void ragged_merge_kernel(const float* partial_out, const float* partial_lse, int splits,
                                    int q_heads, int head_dim, bf16* out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  extern __shared__ float weights[];  // [splits], then the parts' sums [kMergeParts][head_dim]
  float* part_sums = weights + splits;
  const int head = blockIdx.x;
  // Every thread loads at most a few of the sums at once, rather than one warp a chain of them.
  float best = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    weights[s] = partial_lse[static_cast<int64_t>(s) * q_heads + head];
    best = fmaxf(best, weights[s]);
  }
  best = row_ops::block_max(best);
  float sum = 0.0f;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    weights[s] = best == -INFINITY ? 0.0f : exp2f(weights[s] - best);  // 0 for empty splits
    sum += weights[s];
  }
  const float total = row_ops::block_sum(sum);  // its barriers publish the weights
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  const int e = threadIdx.x % head_dim, part = threadIdx.x / head_dim;
  float value = 0.0f;  // an empty split's partial output is zeros with weight 0
#pragma unroll 4
  for (int s = part; s < splits; s += kMergeParts) {
    value += weights[s] * partial_out[(static_cast<int64_t>(s) * q_heads + head) * head_dim + e];
  }
  part_sums[part * head_dim + e] = value;
  __syncthreads();
  if (part == 0) {
    for (int other = 1; other < kMergeParts; ++other) value += part_sums[other * head_dim + e];
    out[static_cast<int64_t>(head) * head_dim + e] = __float2bfloat16(value * inverse);
  }
}

// One block per cache: every thread reads the old length before thread 0 stores the new one.
__global__ void ragged_append_kernel(const bf16* k, const bf16* v, int head_dim,
                                     int64_t cache_stride, int group, bool per_query_head,
                                     bf16* key_cache, bf16* value_cache, int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int cache = blockIdx.x;
  const int kv_head = per_query_head ? cache / group : cache;
  const int row = lengths[cache];
  __syncthreads();
  if (row < 0 || row >= cache_stride) return;  // full: the caller broke its guarantee
  const int64_t target = (static_cast<int64_t>(cache) * cache_stride + row) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    key_cache[target + e] = k[static_cast<int64_t>(kv_head) * head_dim + e];
    value_cache[target + e] = v[static_cast<int64_t>(kv_head) * head_dim + e];
  }
  if (threadIdx.x == 0) lengths[cache] = row + 1;
}

// One warp quantizes a row of head_dim bf16 values into `codes` and its scale into `scale`, as
// quantize_kv_rows does.
__device__ void quantize_row_in_warp(const bf16* source, int head_dim, int lane, uint8_t* codes,
                                     float* scale) {
  float amax = 0.0f;
  for (int e = lane; e < head_dim; e += 32) amax = fmaxf(amax, fabsf(__bfloat162float(source[e])));
  for (int offset = 16; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float row_scale = fp8::row_scale(amax);
  for (int e = lane; e < head_dim; e += 32) {
    codes[e] = fp8::to_e4m3(__fdiv_rn(__bfloat162float(source[e]), row_scale));
  }
  if (lane == 0) *scale = row_scale;
}

// ragged_append_kernel into FP8 caches: one warp quantizes the key row, another the value row.
__global__ void ragged_append_fp8_kernel(const bf16* k, const bf16* v, int head_dim,
                                         int64_t cache_stride, int group, bool per_query_head,
                                         Fp8KvCache cache_rows, int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int cache = blockIdx.x;
  const int kv_head = per_query_head ? cache / group : cache;
  const int row = lengths[cache];
  __syncthreads();
  if (row < 0 || row >= cache_stride) return;  // full: the caller broke its guarantee
  const bool is_value = threadIdx.x >= 32;
  const int64_t target = static_cast<int64_t>(cache) * cache_stride + row;
  quantize_row_in_warp(
      (is_value ? v : k) + static_cast<int64_t>(kv_head) * head_dim, head_dim, threadIdx.x % 32,
      (is_value ? cache_rows.value_codes : cache_rows.key_codes) + target * head_dim,
      (is_value ? cache_rows.value_scales : cache_rows.key_scales) + target);
  __syncthreads();
  if (threadIdx.x == 0) lengths[cache] = row + 1;
}

// Where the append of entry blockIdx.x (entry b * caches + c: cache c of sequence b) goes: the
// entry's length before it (`row`), the pool row it fills (`pool_row`, in its page) and the offset
// of its key and value in the fused rows (`source`). Every thread of the block calls it; false
// when the entry is full (the caller broke its guarantee).
struct PagedAppendSlot {
  int row = 0;
  int64_t pool_row = 0, source = 0;
};
__device__ bool paged_append_slot(int64_t row_stride, int head_dim, int caches, int group,
                                  bool per_query_head, const int32_t* page_tables,
                                  int64_t max_pages, const int32_t* lengths,
                                  PagedAppendSlot& slot) {
  const int entry = blockIdx.x;
  const int sequence = entry / caches;
  const int cache = entry % caches;
  const int kv_head = per_query_head ? cache / group : cache;
  slot.row = lengths[entry];
  __syncthreads();  // every thread has read the length before thread 0 writes the new one
  if (slot.row < 0 || slot.row >= max_pages * kBlockN) return false;
  const int64_t page = page_tables[static_cast<int64_t>(entry) * max_pages + slot.row / kBlockN];
  slot.pool_row = page * kBlockN + slot.row % kBlockN;
  slot.source =
      static_cast<int64_t>(sequence) * row_stride + static_cast<int64_t>(kv_head) * head_dim;
  return true;
}

// paged_append_kernel into FP8 pages: one warp per row, as ragged_append_fp8_kernel.
__global__ void paged_append_fp8_kernel(const bf16* k, const bf16* v, int64_t row_stride,
                                        int head_dim, int caches, int group, bool per_query_head,
                                        const int32_t* page_tables, int64_t max_pages,
                                        Fp8KvCache pool, int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  PagedAppendSlot slot;
  if (!paged_append_slot(row_stride, head_dim, caches, group, per_query_head, page_tables,
                         max_pages, lengths, slot)) {
    return;
  }
  const bool is_value = threadIdx.x >= 32;
  quantize_row_in_warp((is_value ? v : k) + slot.source, head_dim, threadIdx.x % 32,
                       (is_value ? pool.value_codes : pool.key_codes) + slot.pool_row * head_dim,
                       (is_value ? pool.value_scales : pool.key_scales) + slot.pool_row);
  __syncthreads();
  if (threadIdx.x == 0) lengths[blockIdx.x] = slot.row + 1;
}

// One block per (sequence, cache) entry, as ragged_append_kernel, into the entry's pages.
__global__ void paged_append_kernel(const bf16* k, const bf16* v, int64_t row_stride, int head_dim,
                                    int caches, int group, bool per_query_head,
                                    const int32_t* page_tables, int64_t max_pages, bf16* key_pool,
                                    bf16* value_pool, int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  PagedAppendSlot slot;
  if (!paged_append_slot(row_stride, head_dim, caches, group, per_query_head, page_tables,
                         max_pages, lengths, slot)) {
    return;
  }
  const int64_t target = slot.pool_row * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    key_pool[target + e] = k[slot.source + e];
    value_pool[target + e] = v[slot.source + e];
  }
  if (threadIdx.x == 0) lengths[blockIdx.x] = slot.row + 1;
}

// One page of one cache per block: rows [page * kBlockN, +kBlockN) of cache blockIdx.y that are
// below its length, 16 bytes per thread and step.
__global__ void paged_store_kernel(const bf16* keys, const bf16* values, int64_t cache_stride,
                                   int head_dim, const int32_t* lengths, const int32_t* page_table,
                                   int64_t max_pages, bf16* key_pool, bf16* value_pool) {
  const int cache = blockIdx.y;
  const int64_t page_index = blockIdx.x;
  const int64_t first = page_index * kBlockN;
  const int64_t rows = min(static_cast<int64_t>(kBlockN), lengths[cache] - first);
  if (rows <= 0) return;
  const int64_t page = page_table[cache * max_pages + page_index];
  const int chunks = head_dim / 8;  // uint4 per row
  const uint4* key_rows =
      reinterpret_cast<const uint4*>(keys + (cache * cache_stride + first) * head_dim);
  const uint4* value_rows =
      reinterpret_cast<const uint4*>(values + (cache * cache_stride + first) * head_dim);
  uint4* key_target = reinterpret_cast<uint4*>(key_pool + page * kBlockN * head_dim);
  uint4* value_target = reinterpret_cast<uint4*>(value_pool + page * kBlockN * head_dim);
  for (int64_t i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    key_target[i] = key_rows[i];
    value_target[i] = value_rows[i];
  }
}

// paged_store_kernel for FP8 caches: a row's codes are head_dim bytes, its scales one float each.
__global__ void paged_store_fp8_kernel(Fp8KvCache cache, int64_t cache_stride, int head_dim,
                                       const int32_t* lengths, const int32_t* page_table,
                                       int64_t max_pages, Fp8KvCache pool) {
  const int cache_index = blockIdx.y;
  const int64_t page_index = blockIdx.x;
  const int64_t first = page_index * kBlockN;
  const int64_t rows = min(static_cast<int64_t>(kBlockN), lengths[cache_index] - first);
  if (rows <= 0) return;
  const int64_t page = page_table[cache_index * max_pages + page_index];
  const int64_t source_row = cache_index * cache_stride + first;
  const int chunks = head_dim / 16;  // uint4 per row of codes
  const uint4* key_rows = reinterpret_cast<const uint4*>(cache.key_codes + source_row * head_dim);
  const uint4* value_rows =
      reinterpret_cast<const uint4*>(cache.value_codes + source_row * head_dim);
  uint4* key_target = reinterpret_cast<uint4*>(pool.key_codes + page * kBlockN * head_dim);
  uint4* value_target = reinterpret_cast<uint4*>(pool.value_codes + page * kBlockN * head_dim);
  for (int64_t i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
    key_target[i] = key_rows[i];
    value_target[i] = value_rows[i];
  }
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    pool.key_scales[page * kBlockN + r] = cache.key_scales[source_row + r];
    pool.value_scales[page * kBlockN + r] = cache.value_scales[source_row + r];
  }
}

void check_shape(const RaggedShape& shape, bool decode) {
  if (shape.kv_heads <= 0 || shape.q_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("ragged decode: " + std::to_string(shape.q_heads) + " query heads cannot share " +
                std::to_string(shape.kv_heads) + " KV heads");
  }
  if (decode ? shape.head_dim != 64 && shape.head_dim != 128
             : shape.head_dim <= 0 || shape.head_dim > 1024) {
    throw Error("ragged decode: head_dim " + std::to_string(shape.head_dim) +
                " is not supported (64 or 128)");
  }
  if (shape.cache_stride <= 0 || shape.cache_stride >= (int64_t{1} << 31) || shape.max_length < 0 ||
      shape.max_length > shape.cache_stride) {
    throw Error("ragged decode: max length " + std::to_string(shape.max_length) +
                " must lie in [0, cache stride " + std::to_string(shape.cache_stride) +
                "] (stride below 2^31)");
  }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// The decode kernel of a head size and storage, with its shared memory.
template <int kHeadDim, bool kFp8>
struct DecodeKernel {
  static constexpr auto function =
      kFp8 ? ragged_decode_fp8_kernel<kHeadDim> : ragged_decode_kernel<kHeadDim>;
  static constexpr int shared_bytes =
      kFp8 ? Fp8RaggedTile<kHeadDim>::kSharedBytes : RaggedTile<kHeadDim>::kSharedBytes;
  static constexpr int threads = kFp8 ? 32 * Fp8RaggedTile<kHeadDim>::kWarps : 32;
};

template <int kHeadDim, bool kFp8>
void configure_kernel() {
  using Kernel = DecodeKernel<kHeadDim, kFp8>;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(Kernel::function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               Kernel::shared_bytes),
          "cudaFuncSetAttribute(ragged_decode_kernel)");
    return true;
  }();
  (void)configured;
}

template <int kHeadDim, bool kFp8>
int blocks_per_multiprocessor() {
  using Kernel = DecodeKernel<kHeadDim, kFp8>;
  static const int blocks = [] {
    configure_kernel<kHeadDim, kFp8>();
    int count = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, Kernel::function, Kernel::threads,
                                                        Kernel::shared_bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(1, count);
  }();
  return blocks;
}

int64_t row_blocks(const RaggedShape& shape) {
  const int64_t rows = shape.per_query_head ? 1 : shape.q_heads / shape.kv_heads;
  return (rows + kRows - 1) / kRows;
}

template <int kHeadDim, bool kFp8>
void launch_decode(const RaggedParams& params, int64_t caches, int64_t blocks_x,
                   cudaStream_t stream) {
  using Kernel = DecodeKernel<kHeadDim, kFp8>;
  configure_kernel<kHeadDim, kFp8>();
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(caches), params.splits);
  launch_dependent(kFp8 ? "ragged_decode_fp8_kernel" : "ragged_decode_kernel", Kernel::function,
                   grid, dim3(Kernel::threads), Kernel::shared_bytes, stream, params);
}

}  // namespace

int64_t ragged_cache_count(const RaggedShape& shape) {
  return shape.per_query_head ? shape.q_heads : shape.kv_heads;
}

void ragged_append(const bf16* k, const bf16* v, const RaggedShape& shape, bf16* key_cache,
                   bf16* value_cache, int32_t* lengths, cudaStream_t stream) {
  check_shape(shape, false);
  if (shape.fp8) throw Error("ragged append: a shape marked fp8 needs FP8 caches");
  if (k == nullptr || v == nullptr || key_cache == nullptr || value_cache == nullptr ||
      lengths == nullptr) {
    throw Error("ragged append: null pointer");
  }
  const int64_t caches = ragged_cache_count(shape);
  launch_dependent("ragged_append_kernel", ragged_append_kernel,
                   dim3(static_cast<unsigned>(caches)), dim3(128), 0, stream, k, v,
                   static_cast<int>(shape.head_dim), shape.cache_stride,
                   static_cast<int>(shape.q_heads / shape.kv_heads), shape.per_query_head,
                   key_cache, value_cache, lengths);
}

void ragged_append(const bf16* k, const bf16* v, const RaggedShape& shape, const Fp8KvCache& cache,
                   int32_t* lengths, cudaStream_t stream) {
  check_shape(shape, false);
  if (!shape.fp8) throw Error("ragged append: FP8 caches need a shape marked fp8");
  if (k == nullptr || v == nullptr || cache.key_codes == nullptr || cache.value_codes == nullptr ||
      cache.key_scales == nullptr || cache.value_scales == nullptr || lengths == nullptr) {
    throw Error("ragged append: null pointer");
  }
  const int64_t caches = ragged_cache_count(shape);
  launch_dependent(
      "ragged_append_fp8_kernel", ragged_append_fp8_kernel, dim3(static_cast<unsigned>(caches)),
      dim3(64), 0, stream, k, v, static_cast<int>(shape.head_dim), shape.cache_stride,
      static_cast<int>(shape.q_heads / shape.kv_heads), shape.per_query_head, cache, lengths);
}

namespace {

// Splits for `entries` caches of up to shape.max_length rows (see ragged_decode_splits).
int decode_splits(const RaggedShape& shape, int64_t entries, int requested) {
  check_shape(shape, true);
  const int64_t key_blocks = std::max<int64_t>(1, (shape.max_length + kBlockN - 1) / kBlockN);
  int64_t splits = requested;
  if (splits <= 0) {
    // As many splits as fill every multiprocessor once (a partial second wave costs as much as a
    // full one), each split keeping at least two key tiles of the longest cache.
    const int per_multiprocessor =
        device_count() == 0 ? 1
        : shape.fp8         ? (shape.head_dim == 64 ? blocks_per_multiprocessor<64, true>()
                                                    : blocks_per_multiprocessor<128, true>())
                            : (shape.head_dim == 64 ? blocks_per_multiprocessor<64, false>()
                                                    : blocks_per_multiprocessor<128, false>());
    static const int multiprocessors = device_count() > 0 ? multiprocessor_count() : 1;
    const int64_t base = std::max<int64_t>(1, entries * row_blocks(shape));
    splits =
        std::max<int64_t>(1, static_cast<int64_t>(per_multiprocessor) * multiprocessors / base);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, key_blocks / 2));
  }
  // At most one split per key tile, and few enough for the merge's weights to sit in shared memory.
  return static_cast<int>(std::clamp<int64_t>(splits, 1, std::min<int64_t>(key_blocks, 4096)));
}

size_t workspace_floats_of(const RaggedShape& shape, int64_t sequences, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * sequences * shape.q_heads * (shape.head_dim + 1);
}

// The decode kernel (and the merge of its splits) over `sequences` x caches entries.
void run_decode(RaggedParams params, const RaggedShape& shape, int64_t sequences, float* workspace,
                size_t workspace_floats, cudaStream_t stream, int splits) {
  params.q_heads = static_cast<int>(shape.q_heads);
  params.total_heads = static_cast<int>(sequences * shape.q_heads);
  params.group = static_cast<int>(shape.q_heads / shape.kv_heads);
  params.per_query_head = shape.per_query_head;
  params.rows = shape.per_query_head ? 1 : params.group;
  params.caches = static_cast<int>(ragged_cache_count(shape));
  params.cache_stride = shape.cache_stride;
  const float scale =
      shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  params.scale_log2 = scale * 1.4426950408889634f;
  const int64_t entries = sequences * params.caches;
  splits = decode_splits(shape, entries, splits);
  if (splits > 1) {
    const size_t needed = workspace_floats_of(shape, sequences, splits);
    if (workspace == nullptr || workspace_floats < needed) {
      throw Error("ragged decode: " + std::to_string(splits) + " splits need a workspace of " +
                  std::to_string(needed) + " floats, got " + std::to_string(workspace_floats));
    }
    params.splits = splits;
    params.partial_out = workspace;
    params.partial_lse =
        workspace + static_cast<size_t>(splits) * params.total_heads * shape.head_dim;
  }
  const int64_t blocks_x = row_blocks(shape);
  if (shape.fp8) {
    if (shape.head_dim == 128) {
      launch_decode<128, true>(params, entries, blocks_x, stream);
    } else {
      launch_decode<64, true>(params, entries, blocks_x, stream);
    }
  } else if (shape.head_dim == 128) {
    launch_decode<128, false>(params, entries, blocks_x, stream);
  } else {
    launch_decode<64, false>(params, entries, blocks_x, stream);
  }
  if (splits > 1) {
    launch_dependent("ragged_merge_kernel", ragged_merge_kernel,
                     dim3(static_cast<unsigned>(params.total_heads)),
                     dim3(static_cast<unsigned>(kMergeParts * shape.head_dim)),
                     sizeof(float) * (splits + kMergeParts * shape.head_dim), stream,
                     params.partial_out, params.partial_lse, splits, params.total_heads,
                     static_cast<int>(shape.head_dim), params.out);
  }
}

bool has_fp8_pools(const Fp8KvCache& pool) {
  return pool.key_codes != nullptr && pool.value_codes != nullptr && pool.key_scales != nullptr &&
         pool.value_scales != nullptr;
}

void check_paged(const RaggedShape& shape, const PagedCaches& caches) {
  const bool pools =
      shape.fp8 ? has_fp8_pools(caches.fp8) : caches.keys != nullptr && caches.values != nullptr;
  if (caches.batch <= 0 || caches.max_pages <= 0 || caches.page_tables == nullptr ||
      caches.lengths == nullptr || !pools) {
    throw Error(
        std::string("paged decode: needs at least one sequence, page tables, lengths and ") +
        (shape.fp8 ? "FP8 pools (codes and scales)" : "bf16 pools"));
  }
  if (shape.cache_stride != caches.max_pages * kPagedRows) {
    throw Error("paged decode: the shape's cache stride must be max_pages * " +
                std::to_string(kPagedRows) + " rows");
  }
  if (caches.batch * ragged_cache_count(shape) > 65535) {
    throw Error("paged decode: at most 65535 (sequence, cache) entries per launch");
  }
}

}  // namespace

int ragged_decode_splits(const RaggedShape& shape, int requested) {
  return decode_splits(shape, ragged_cache_count(shape), requested);
}

size_t ragged_decode_workspace_floats(const RaggedShape& shape, int splits) {
  return workspace_floats_of(shape, 1, splits);
}

int paged_decode_splits(const RaggedShape& shape, int batch, int requested) {
  return decode_splits(shape, static_cast<int64_t>(batch) * ragged_cache_count(shape), requested);
}

size_t paged_decode_workspace_floats(const RaggedShape& shape, int batch, int splits) {
  return workspace_floats_of(shape, batch, splits);
}

void paged_append(const bf16* k, const bf16* v, int64_t row_stride, const RaggedShape& shape,
                  const PagedCaches& caches, cudaStream_t stream) {
  check_shape(shape, false);
  check_paged(shape, caches);
  if (k == nullptr || v == nullptr) throw Error("paged append: null pointer");
  const int64_t entries = caches.batch * ragged_cache_count(shape);
  if (shape.fp8) {
    launch_dependent("paged_append_fp8_kernel", paged_append_fp8_kernel,
                     dim3(static_cast<unsigned>(entries)), dim3(64), 0, stream, k, v, row_stride,
                     static_cast<int>(shape.head_dim), static_cast<int>(ragged_cache_count(shape)),
                     static_cast<int>(shape.q_heads / shape.kv_heads), shape.per_query_head,
                     caches.page_tables, caches.max_pages, caches.fp8, caches.lengths);
    return;
  }
  launch_dependent("paged_append_kernel", paged_append_kernel, dim3(static_cast<unsigned>(entries)),
                   dim3(128), 0, stream, k, v, row_stride, static_cast<int>(shape.head_dim),
                   static_cast<int>(ragged_cache_count(shape)),
                   static_cast<int>(shape.q_heads / shape.kv_heads), shape.per_query_head,
                   caches.page_tables, caches.max_pages, caches.keys, caches.values,
                   caches.lengths);
}

void paged_decode(const bf16* q, int64_t q_stride, const RaggedShape& shape,
                  const PagedCaches& caches, bf16* out, float* workspace, size_t workspace_floats,
                  cudaStream_t stream, int splits) {
  check_shape(shape, true);
  check_paged(shape, caches);
  if (q == nullptr || out == nullptr) throw Error("paged decode: null pointer");
  const void* key_pool = shape.fp8 ? static_cast<const void*>(caches.fp8.key_codes) : caches.keys;
  const void* value_pool =
      shape.fp8 ? static_cast<const void*>(caches.fp8.value_codes) : caches.values;
  if (!aligned16(q) || q_stride % 8 != 0 || !aligned16(key_pool) || !aligned16(value_pool) ||
      !aligned16(out)) {
    throw Error("paged decode: queries, pools and output must start on 16-byte boundaries");
  }
  RaggedParams params;
  params.q = q;
  params.q_stride = q_stride;
  if (shape.fp8) {
    params.k_codes = caches.fp8.key_codes;
    params.v_codes = caches.fp8.value_codes;
    params.k_scales = caches.fp8.key_scales;
    params.v_scales = caches.fp8.value_scales;
  } else {
    params.k = caches.keys;
    params.v = caches.values;
  }
  params.out = out;
  params.lengths = caches.lengths;
  params.page_tables = caches.page_tables;
  params.max_pages = caches.max_pages;
  run_decode(params, shape, caches.batch, workspace, workspace_floats, stream, splits);
}

void paged_store(const bf16* keys, const bf16* values, int64_t cache_stride, int64_t caches,
                 int64_t head_dim, const int32_t* lengths, const int32_t* page_table,
                 int64_t max_pages, bf16* key_pool, bf16* value_pool, cudaStream_t stream) {
  if (caches <= 0 || max_pages <= 0 || caches > 65535 || head_dim % 8 != 0 || cache_stride <= 0) {
    throw Error("paged store: needs caches in [1, 65535], pages and a head_dim multiple of 8");
  }
  if (keys == nullptr || values == nullptr || lengths == nullptr || page_table == nullptr ||
      key_pool == nullptr || value_pool == nullptr || !aligned16(keys) || !aligned16(values) ||
      !aligned16(key_pool) || !aligned16(value_pool)) {
    throw Error("paged store: null or unaligned pointer");
  }
  paged_store_kernel<<<dim3(static_cast<unsigned>(max_pages), static_cast<unsigned>(caches)), 128,
                       0, stream>>>(keys, values, cache_stride, static_cast<int>(head_dim), lengths,
                                    page_table, max_pages, key_pool, value_pool);
  check(cudaGetLastError(), "paged_store_kernel");
}

void paged_store(const Fp8KvCache& cache, int64_t cache_stride, int64_t caches, int64_t head_dim,
                 const int32_t* lengths, const int32_t* page_table, int64_t max_pages,
                 const Fp8KvCache& pool, cudaStream_t stream) {
  if (caches <= 0 || max_pages <= 0 || caches > 65535 || head_dim % 16 != 0 || cache_stride <= 0) {
    throw Error("paged store: needs caches in [1, 65535], pages and a head_dim multiple of 16");
  }
  if (!has_fp8_pools(cache) || !has_fp8_pools(pool) || lengths == nullptr ||
      page_table == nullptr || !aligned16(cache.key_codes) || !aligned16(cache.value_codes) ||
      !aligned16(pool.key_codes) || !aligned16(pool.value_codes)) {
    throw Error("paged store: null or unaligned pointer");
  }
  paged_store_fp8_kernel<<<dim3(static_cast<unsigned>(max_pages), static_cast<unsigned>(caches)),
                           128, 0, stream>>>(cache, cache_stride, static_cast<int>(head_dim),
                                             lengths, page_table, max_pages, pool);
  check(cudaGetLastError(), "paged_store_fp8_kernel");
}

void ragged_decode(const bf16* q, const Fp8KvCache& cache, const int32_t* lengths,
                   const RaggedShape& shape, bf16* out, float* workspace, size_t workspace_floats,
                   cudaStream_t stream, int splits) {
  check_shape(shape, true);
  if (!shape.fp8) throw Error("ragged decode: FP8 caches need a shape marked fp8");
  if (q == nullptr || cache.key_codes == nullptr || cache.value_codes == nullptr ||
      cache.key_scales == nullptr || cache.value_scales == nullptr || lengths == nullptr ||
      out == nullptr) {
    throw Error("ragged decode: null pointer");
  }
  if (!aligned16(q) || !aligned16(cache.key_codes) || !aligned16(cache.value_codes)) {
    throw Error("ragged decode: queries and codes must start on 16-byte boundaries");
  }
  RaggedParams params;
  params.q = q;
  params.k_codes = cache.key_codes;
  params.v_codes = cache.value_codes;
  params.k_scales = cache.key_scales;
  params.v_scales = cache.value_scales;
  params.out = out;
  params.lengths = lengths;
  run_decode(params, shape, 1, workspace, workspace_floats, stream, splits);
}

void ragged_decode(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                   const int32_t* lengths, const RaggedShape& shape, bf16* out, float* workspace,
                   size_t workspace_floats, cudaStream_t stream, int splits) {
  check_shape(shape, true);
  if (shape.fp8) throw Error("ragged decode: a shape marked fp8 needs FP8 caches");
  if (q == nullptr || key_cache == nullptr || value_cache == nullptr || lengths == nullptr ||
      out == nullptr) {
    throw Error("ragged decode: null pointer");
  }
  if (!aligned16(q) || !aligned16(key_cache) || !aligned16(value_cache) || !aligned16(out)) {
    throw Error("ragged decode: queries, caches and output must start on 16-byte boundaries");
  }
  RaggedParams params;
  params.q = q;
  params.k = key_cache;
  params.v = value_cache;
  params.out = out;
  params.lengths = lengths;
  run_decode(params, shape, 1, workspace, workspace_floats, stream, splits);
}

}  // namespace entropyinfer::cuda

// Split-KV decode attention over per-head caches of different lengths (see ragged_decode.h). The
// tile loop follows flash_decode's warp kernel (flash_attention.cu), with the causal mask replaced
// by each cache's run-time length and the rows of a tile being the query heads that read the cache.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/flash_attention_internal.cuh"
#include "backends/cuda/ragged_decode.h"

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

// One block of head_dim threads per query head: out = sum_s 2^(lse_s - max) O_s / sum_s 2^(lse_s
// - max), zeros when every split was empty (an empty cache).
__global__ void ragged_merge_kernel(const float* partial_out, const float* partial_lse, int splits,
                                    int q_heads, int head_dim, bf16* out) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  extern __shared__ float weights[];  // [splits]
  __shared__ float total;
  const int head = blockIdx.x;
  if (threadIdx.x < 32) {
    float best = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) {
      best = fmaxf(best, partial_lse[static_cast<int64_t>(s) * q_heads + head]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, offset));
    }
    float sum = 0.0f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float lse = partial_lse[static_cast<int64_t>(s) * q_heads + head];
      const float weight = best == -INFINITY ? 0.0f : exp2f(lse - best);  // 0 for empty splits
      weights[s] = weight;
      sum += weight;
    }
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) total = sum;
  }
  __syncthreads();
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float value = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (weights[s] != 0.0f) {
        value +=
            weights[s] * partial_out[(static_cast<int64_t>(s) * q_heads + head) * head_dim + e];
      }
    }
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

// One block per (sequence, cache) entry, as ragged_append_kernel, into the entry's pages.
__global__ void paged_append_kernel(const bf16* k, const bf16* v, int64_t row_stride, int head_dim,
                                    int caches, int group, bool per_query_head,
                                    const int32_t* page_tables, int64_t max_pages, bf16* key_pool,
                                    bf16* value_pool, int32_t* lengths) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  const int entry = blockIdx.x;
  const int sequence = entry / caches;
  const int cache = entry % caches;
  const int kv_head = per_query_head ? cache / group : cache;
  const int row = lengths[entry];
  __syncthreads();
  if (row < 0 || row >= max_pages * kBlockN) return;  // full: the caller broke its guarantee
  const int64_t page = page_tables[static_cast<int64_t>(entry) * max_pages + row / kBlockN];
  const int64_t target = (page * kBlockN + row % kBlockN) * head_dim;
  const int64_t source =
      static_cast<int64_t>(sequence) * row_stride + static_cast<int64_t>(kv_head) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    key_pool[target + e] = k[source + e];
    value_pool[target + e] = v[source + e];
  }
  if (threadIdx.x == 0) lengths[entry] = row + 1;
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

template <int kHeadDim>
void configure_kernel() {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(ragged_decode_kernel<kHeadDim>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               RaggedTile<kHeadDim>::kSharedBytes),
          "cudaFuncSetAttribute(ragged_decode_kernel)");
    return true;
  }();
  (void)configured;
}

template <int kHeadDim>
int blocks_per_multiprocessor() {
  static const int blocks = [] {
    configure_kernel<kHeadDim>();
    int count = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, ragged_decode_kernel<kHeadDim>, 32,
                                                        RaggedTile<kHeadDim>::kSharedBytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(1, count);
  }();
  return blocks;
}

int64_t row_blocks(const RaggedShape& shape) {
  const int64_t rows = shape.per_query_head ? 1 : shape.q_heads / shape.kv_heads;
  return (rows + kRows - 1) / kRows;
}

template <int kHeadDim>
void launch_decode(const RaggedParams& params, int64_t caches, int64_t blocks_x,
                   cudaStream_t stream) {
  configure_kernel<kHeadDim>();
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(caches), params.splits);
  launch_dependent("ragged_decode_kernel", ragged_decode_kernel<kHeadDim>, grid, dim3(32),
                   RaggedTile<kHeadDim>::kSharedBytes, stream, params);
}

}  // namespace

int64_t ragged_cache_count(const RaggedShape& shape) {
  return shape.per_query_head ? shape.q_heads : shape.kv_heads;
}

void ragged_append(const bf16* k, const bf16* v, const RaggedShape& shape, bf16* key_cache,
                   bf16* value_cache, int32_t* lengths, cudaStream_t stream) {
  check_shape(shape, false);
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

namespace {

// Splits for `entries` caches of up to shape.max_length rows (see ragged_decode_splits).
int decode_splits(const RaggedShape& shape, int64_t entries, int requested) {
  check_shape(shape, true);
  const int64_t key_blocks = std::max<int64_t>(1, (shape.max_length + kBlockN - 1) / kBlockN);
  int64_t splits = requested;
  if (splits <= 0) {
    // As many splits as fill every multiprocessor once (a partial second wave costs as much as a
    // full one), each split keeping at least two key tiles of the longest cache.
    const int per_multiprocessor = device_count() == 0    ? 1
                                   : shape.head_dim == 64 ? blocks_per_multiprocessor<64>()
                                                          : blocks_per_multiprocessor<128>();
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
  if (shape.head_dim == 128) {
    launch_decode<128>(params, entries, row_blocks(shape), stream);
  } else {
    launch_decode<64>(params, entries, row_blocks(shape), stream);
  }
  if (splits > 1) {
    launch_dependent("ragged_merge_kernel", ragged_merge_kernel,
                     dim3(static_cast<unsigned>(params.total_heads)),
                     dim3(static_cast<unsigned>(shape.head_dim)), sizeof(float) * splits, stream,
                     params.partial_out, params.partial_lse, splits, params.total_heads,
                     static_cast<int>(shape.head_dim), params.out);
  }
}

void check_paged(const RaggedShape& shape, const PagedCaches& caches) {
  if (caches.batch <= 0 || caches.max_pages <= 0 || caches.page_tables == nullptr ||
      caches.lengths == nullptr || caches.keys == nullptr || caches.values == nullptr) {
    throw Error("paged decode: needs at least one sequence, page tables, lengths and pools");
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
  if (!aligned16(q) || q_stride % 8 != 0 || !aligned16(caches.keys) || !aligned16(caches.values) ||
      !aligned16(out)) {
    throw Error("paged decode: queries, pools and output must start on 16-byte boundaries");
  }
  RaggedParams params;
  params.q = q;
  params.q_stride = q_stride;
  params.k = caches.keys;
  params.v = caches.values;
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

void ragged_decode(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                   const int32_t* lengths, const RaggedShape& shape, bf16* out, float* workspace,
                   size_t workspace_floats, cudaStream_t stream, int splits) {
  check_shape(shape, true);
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

// FlashAttention-2 style kernel on mma.sync tensor-core instructions, split-KV decoding with a
// log-sum-exp merge, block-sparse prefill, and the dispatch between these and the Hopper kernel.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"
#include "backends/cuda/flash_attention_internal.cuh"

namespace entropyinfer::cuda {
namespace {

using detail::FlashParams;
using detail::swizzled;

// Prefill: 4 warps of 16 rows on 64-key tiles, double-buffered. Decode: one warp per (KV head,
// split) on 32-key tiles four stages deep, so that each warp keeps three tiles of loads in flight.
constexpr int kPrefillWarps = 4;
constexpr int kPrefillBlockN = 64;
constexpr int kPrefillStages = 2;
constexpr int kDecodeWarps = 1;
constexpr int kDecodeBlockN = 32;
constexpr int kDecodeStages = 4;

template <int kHeadDim, int kWarps, int kMmaBlockN, int kStages>
struct MmaTile {
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kKvTileBytes = kMmaBlockN * kRowBytes;
  static constexpr int kSharedBytes = kBlockM * kRowBytes + 2 * kStages * kKvTileBytes;  // Q, K, V
};

// kSparse: block-sparse prefill over each tile's virtual key sequence (detail::SparseKeys), one
// split; the grid is then one-dimensional, row blocks latest first with the KV heads of each side
// by side.
template <int kHeadDim, int kWarps, int kMmaBlockN, int kStages, bool kSparse = false>
__global__ void __launch_bounds__(32 * kWarps)
    flash_mma_kernel(const detail::KernelParams<kSparse> p) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  using Tile = MmaTile<kHeadDim, kWarps, kMmaBlockN, kStages>;
  constexpr int kBlockM = Tile::kBlockM, kChunks = Tile::kChunks, kThreads = Tile::kThreads;
  constexpr int kTilesN = kMmaBlockN / 8;                           // 8-key column tiles of S
  constexpr int kTilesD = kHeadDim / 8;                             // 8-wide column tiles of O
  constexpr int kLoadsPerThread = kMmaBlockN * kChunks / kThreads;  // 16-byte K (and V) copies
  static_assert(!kSparse || kMmaBlockN * kChunks % kThreads == 0);
  extern __shared__ __align__(128) uint8_t shared[];
  const uint32_t q_tile = detail::shared_address(shared);
  const uint32_t k_tiles = q_tile + kBlockM * Tile::kRowBytes;
  const uint32_t v_tiles = k_tiles + kStages * Tile::kKvTileBytes;

  const int2 origin = detail::prefill_tile_origin<kSparse>(p.kv_heads, kBlockM);
  const int kv_head = origin.x, row0 = origin.y;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = p.group;

  const int last_row = min(row0 + kBlockM, p.rows) - 1;
  const int first_position = p.device_position != nullptr ? *p.device_position : p.first_position;
  const int min_position = first_position + row0 / group;
  const int max_position = first_position + last_row / group;
  // Key slots: position x sits in slot x + shift (0 when dense), so the masks and the tile count
  // below read the same for both.
  detail::SparseKeys keys;
  int shift = 0;
  if constexpr (kSparse) {
    keys = detail::sparse_keys(p, kv_head, min_position, max_position);
    shift = keys.shift();
    if (threadIdx.x == 0 && split == 0)
      detail::count_tile_keys(p, keys, p.group, row0, last_row, first_position);
  }
  const int total_blocks = (max_position + shift + kMmaBlockN) / kMmaBlockN;
  const int blocks_per_split = (total_blocks + p.splits - 1) / p.splits;
  const int block_begin = split * blocks_per_split;
  const int block_end = min(total_blocks, block_begin + blocks_per_split);

  const bf16* k_head = p.k + static_cast<int64_t>(kv_head) * p.cache_stride * kHeadDim;
  const bf16* v_head = p.v + static_cast<int64_t>(kv_head) * p.cache_stride * kHeadDim;

  for (int index = threadIdx.x; index < kBlockM * kChunks; index += kThreads) {
    const int r = index / kChunks, c = index % kChunks;
    const int row = row0 + r;
    const bool valid = row < p.rows;
    const bf16* source =
        valid ? p.q + detail::packed_row_offset(row, group, kv_head, p.q_token_stride, kHeadDim) +
                    c * 8
              : p.q;
    detail::cp_async_16(swizzled<kHeadDim>(q_tile, r, c), source, valid ? 16 : 0);
  }
  auto load_kv = [&](int block, int stage) {
    const uint32_t k_tile = k_tiles + stage * Tile::kKvTileBytes;
    const uint32_t v_tile = v_tiles + stage * Tile::kKvTileBytes;
    for (int index = threadIdx.x; index < kMmaBlockN * kChunks; index += kThreads) {
      const int r = index / kChunks, c = index % kChunks;
      const int key = block * kMmaBlockN + r;
      const bool valid =
          key <= max_position;  // later rows are masked; zero-filled so 0 * V stays finite
      const int64_t offset = static_cast<int64_t>(valid ? key : 0) * kHeadDim + c * 8;
      detail::cp_async_16(swizzled<kHeadDim>(k_tile, r, c), k_head + offset, valid ? 16 : 0);
      detail::cp_async_16(swizzled<kHeadDim>(v_tile, r, c), v_head + offset, valid ? 16 : 0);
    }
  };
  // Sparse: the cache rows of this thread's copies of a tile, looked up one tile before its copies
  // are issued so that the index loads overlap a tile's products.
  int next_rows[kSparse ? kLoadsPerThread : 1];
  auto fetch_rows = [&](int block) {
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      next_rows[i] = keys.key_row(block * kMmaBlockN + (threadIdx.x + i * kThreads) / kChunks);
    }
  };
  auto load_sparse_kv = [&](int stage) {
    const uint32_t k_tile = k_tiles + stage * Tile::kKvTileBytes;
    const uint32_t v_tile = v_tiles + stage * Tile::kKvTileBytes;
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int index = threadIdx.x + i * kThreads;
      const int r = index / kChunks, c = index % kChunks;
      const bool valid = next_rows[i] >= 0;  // slots past the end: zero-filled and masked
      const int64_t offset = static_cast<int64_t>(valid ? next_rows[i] : 0) * kHeadDim + c * 8;
      detail::cp_async_16(swizzled<kHeadDim>(k_tile, r, c), k_head + offset, valid ? 16 : 0);
      detail::cp_async_16(swizzled<kHeadDim>(v_tile, r, c), v_head + offset, valid ? 16 : 0);
    }
  };
  // Group s of the prologue holds block_begin + s (the first also the queries); the group committed
  // in iteration i holds block i + kStages - 1.
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (block_begin + stage < block_end) {
      if constexpr (kSparse) {
        fetch_rows(block_begin + stage);
        load_sparse_kv(stage);
      } else {
        load_kv(block_begin + stage, stage);
      }
    }
    detail::cp_async_commit();
  }
  if constexpr (kSparse) {
    if (block_begin + kStages - 1 < block_end) fetch_rows(block_begin + kStages - 1);
  }

  // This thread's two rows (g and g + 8 of its warp's 16).
  const int g = lane / 4, t = lane % 4;
  const int row_a = row0 + warp * 16 + g, row_b = row_a + 8;
  const int position_a = first_position + row_a / group + shift;  // last slot row a sees
  const int position_b = first_position + row_b / group + shift;

  float o[kTilesD][4];
#pragma unroll
  for (int i = 0; i < kTilesD; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  uint32_t qa[kHeadDim / 16][4];

  for (int block = block_begin; block < block_end; ++block) {
    const int stage = (block - block_begin) % kStages;
    // Refills the stage the previous iteration read (every thread passed its closing barrier).
    if (block + kStages - 1 < block_end) {
      if constexpr (kSparse) {
        load_sparse_kv((block - block_begin + kStages - 1) % kStages);
        if (block + kStages < block_end) fetch_rows(block + kStages);
      } else {
        load_kv(block + kStages - 1, (block - block_begin + kStages - 1) % kStages);
      }
    }
    detail::cp_async_commit();
    detail::cp_async_wait<kStages - 1>();
    __syncthreads();
    if (block == block_begin) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        detail::ldmatrix_x4(
            qa[kk], swizzled<kHeadDim>(q_tile, warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      }
    }
    const uint32_t k_tile = k_tiles + stage * Tile::kKvTileBytes;
    const uint32_t v_tile = v_tiles + stage * Tile::kKvTileBytes;

    float s[kTilesN][4];
    detail::tile_scores<kHeadDim, kTilesN>(s, qa, k_tile, lane);

    if ((block + 1) * kMmaBlockN - 1 > min_position + shift) {  // a slot past some row's last
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        const int key = block * kMmaBlockN + 8 * j + 2 * t;
        if (key > position_a) s[j][0] = -INFINITY;
        if (key + 1 > position_a) s[j][1] = -INFINITY;
        if (key > position_b) s[j][2] = -INFINITY;
        if (key + 1 > position_b) s[j][3] = -INFINITY;
      }
    }
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
    const float inverse = half == 0 ? inverse_a : inverse_b;
    if (p.partial_out == nullptr) {
      bf16* out =
          p.out + detail::packed_row_offset(row, group, kv_head, p.out_token_stride, kHeadDim);
#pragma unroll
      for (int i = 0; i < kTilesD; ++i) {
        *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t) =
            detail::pack_bf16(o[i][2 * half] * inverse, o[i][2 * half + 1] * inverse);
      }
    } else {
      const int token = row / group;
      const int64_t global_row =
          static_cast<int64_t>(token) * p.q_heads + kv_head * group + (row - token * group);
      const int64_t all_rows = static_cast<int64_t>(p.tokens) * p.q_heads;
      float* out = p.partial_out + (split * all_rows + global_row) * kHeadDim;
#pragma unroll
      for (int i = 0; i < kTilesD; ++i) {
        *reinterpret_cast<float2*>(out + 8 * i + 2 * t) =
            make_float2(o[i][2 * half] * inverse, o[i][2 * half + 1] * inverse);
      }
      if (t == 0) {
        const float sum = half == 0 ? sum_a : sum_b;
        const float row_max = half == 0 ? max_a : max_b;
        p.partial_lse[split * all_rows + global_row] =
            sum > 0.0f ? row_max + log2f(sum) : -INFINITY;
      }
    }
  }
}

// One block per (token, query head), one thread per output element:
// out = sum_s 2^(lse_s - max) * O_s / sum_s 2^(lse_s - max).
__global__ void merge_splits_kernel(const FlashParams p, int head_dim) {
  wait_for_prerequisite_grids();
  allow_dependent_launch();
  extern __shared__ float weights[];  // [splits]
  __shared__ float total;
  const int64_t row = blockIdx.x;
  const int64_t all_rows = static_cast<int64_t>(p.tokens) * p.q_heads;
  if (threadIdx.x < 32) {
    float best = -INFINITY;
    for (int s = threadIdx.x; s < p.splits; s += 32)
      best = fmaxf(best, p.partial_lse[s * all_rows + row]);
    for (int offset = 16; offset > 0; offset >>= 1) {
      best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, offset));
    }
    float sum = 0.0f;
    for (int s = threadIdx.x; s < p.splits; s += 32) {
      const float weight = exp2f(p.partial_lse[s * all_rows + row] - best);  // 0 for empty splits
      weights[s] = weight;
      sum += weight;
    }
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) total = sum;
  }
  __syncthreads();
  const int64_t token = row / p.q_heads, head = row % p.q_heads;
  bf16* out = p.out + token * p.out_token_stride + head * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float value = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      if (weights[s] != 0.0f)
        value += weights[s] * p.partial_out[(s * all_rows + row) * head_dim + e];
    }
    out[e] = __float2bfloat16(value / total);
  }
}

template <int kHeadDim, int kWarps, int kBlockN, int kStages, bool kSparse = false>
void configure_mma() {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(flash_mma_kernel<kHeadDim, kWarps, kBlockN, kStages, kSparse>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               MmaTile<kHeadDim, kWarps, kBlockN, kStages>::kSharedBytes),
          "cudaFuncSetAttribute(flash_mma_kernel)");
    return true;
  }();
  (void)configured;
}

// Blocks of the decode kernel that fit one multiprocessor at once.
template <int kHeadDim>
int decode_blocks_per_multiprocessor() {
  static const int blocks = [] {
    configure_mma<kHeadDim, kDecodeWarps, kDecodeBlockN, kDecodeStages>();
    int count = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &count, flash_mma_kernel<kHeadDim, kDecodeWarps, kDecodeBlockN, kDecodeStages>,
              32 * kDecodeWarps,
              MmaTile<kHeadDim, kDecodeWarps, kDecodeBlockN, kDecodeStages>::kSharedBytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return std::max(1, count);
  }();
  return blocks;
}

template <int kHeadDim, int kWarps, int kBlockN, int kStages, bool kSparse = false>
void launch_mma(const detail::KernelParams<kSparse>& params, cudaStream_t stream) {
  using Tile = MmaTile<kHeadDim, kWarps, kBlockN, kStages>;
  configure_mma<kHeadDim, kWarps, kBlockN, kStages, kSparse>();
  const int64_t row_blocks =
      (static_cast<int64_t>(params.rows) + Tile::kBlockM - 1) / Tile::kBlockM;
  const dim3 grid = kSparse
                        ? dim3(static_cast<unsigned>(row_blocks * params.kv_heads))
                        : dim3(static_cast<unsigned>(row_blocks), params.kv_heads, params.splits);
  launch_dependent(kSparse ? "flash_mma_kernel (block-sparse)" : "flash_mma_kernel",
                   flash_mma_kernel<kHeadDim, kWarps, kBlockN, kStages, kSparse>, grid,
                   dim3(Tile::kThreads), Tile::kSharedBytes, stream, params);
}

FlashParams make_params(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                        const FlashShape& shape, bf16* out) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    throw Error("attention: head_dim " + std::to_string(shape.head_dim) +
                " is not supported (64 or 128)");
  }
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("attention: " + std::to_string(shape.q_heads) + " query heads cannot share " +
                std::to_string(shape.kv_heads) + " KV heads");
  }
  if (shape.first_position + shape.tokens > shape.cache_stride) {
    throw Error("attention: positions up to " +
                std::to_string(shape.first_position + shape.tokens) +
                " exceed the cache stride of " + std::to_string(shape.cache_stride));
  }
  FlashParams p;
  p.q_token_stride = shape.q_token_stride ? shape.q_token_stride : shape.q_heads * shape.head_dim;
  p.out_token_stride =
      shape.out_token_stride ? shape.out_token_stride : shape.q_heads * shape.head_dim;
  if (p.q_token_stride % 8 != 0 || p.out_token_stride % 2 != 0) {
    throw Error(
        "attention: query rows must start on 16-byte boundaries and output rows on 4-byte ones "
        "(strides " +
        std::to_string(p.q_token_stride) + " and " + std::to_string(p.out_token_stride) +
        " elements)");
  }
  p.q = q;
  p.k = key_cache;
  p.v = value_cache;
  p.out = out;
  p.cache_stride = shape.cache_stride;
  p.tokens = static_cast<int>(shape.tokens);
  p.q_heads = static_cast<int>(shape.q_heads);
  p.kv_heads = static_cast<int>(shape.kv_heads);
  p.group = static_cast<int>(shape.q_heads / shape.kv_heads);
  p.rows = static_cast<int>(shape.tokens * p.group);
  p.first_position = static_cast<int>(shape.first_position);
  p.device_position = shape.device_position;
  const float scale =
      shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  return p;
}

}  // namespace

bool wgmma_attention_available() {
  static const bool available =
      detail::wgmma_kernel_compiled() && device_count() > 0 && compute_capability() == 90;
  return available;
}

void flash_prefill(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                   const FlashShape& shape, bf16* out, cudaStream_t stream, FlashKernel kernel) {
  if (shape.tokens == 0) return;
  const FlashParams params = make_params(q, key_cache, value_cache, shape, out);
  if (kernel == FlashKernel::kAuto)
    kernel = wgmma_attention_available() ? FlashKernel::kWgmma : FlashKernel::kMma;
  if (kernel == FlashKernel::kWgmma || kernel == FlashKernel::kWgmmaSimple) {
    if (!wgmma_attention_available()) {
      throw Error("attention: the wgmma kernel needs a Hopper GPU and a build for sm_90a");
    }
    detail::launch_wgmma_prefill(params, static_cast<int>(shape.head_dim),
                                 kernel == FlashKernel::kWgmma, stream);
    return;
  }
  if (shape.head_dim == 128) {
    launch_mma<128, kPrefillWarps, kPrefillBlockN, kPrefillStages>(params, stream);
  } else {
    launch_mma<64, kPrefillWarps, kPrefillBlockN, kPrefillStages>(params, stream);
  }
}

namespace detail {

SparsePlanFields sparse_plan_fields(const FlashShape& shape, const DevicePrefillPlan& plan,
                                    unsigned long long* keys_read, const std::string& prefix) {
  if (plan.num_kv_heads != shape.kv_heads ||
      shape.first_position + shape.tokens > plan.num_tokens) {
    throw Error(prefix + "the plan describes " + std::to_string(plan.num_tokens) + " tokens and " +
                std::to_string(plan.num_kv_heads) + " KV heads, the call positions " +
                std::to_string(shape.first_position) + " .. " +
                std::to_string(shape.first_position + shape.tokens - 1) + " and " +
                std::to_string(shape.kv_heads));
  }
  if (plan.segment_size > 0 && shape.first_position % plan.segment_size != 0) {
    throw Error(prefix + "queries must start on a segment: first_position " +
                std::to_string(shape.first_position) + " is not a multiple of " +
                std::to_string(plan.segment_size));
  }
  if (plan.segment_size <= 0 || plan.block_size <= 0 ||
      plan.num_segments != (plan.num_tokens + plan.segment_size - 1) / plan.segment_size) {
    throw Error(prefix + "the plan has segment size " + std::to_string(plan.segment_size) +
                ", block size " + std::to_string(plan.block_size) + " and " +
                std::to_string(plan.num_segments) + " segments for " +
                std::to_string(plan.num_tokens) + " tokens");
  }
  if (plan.segment_sparse == nullptr || plan.row_offsets == nullptr ||
      plan.block_indices == nullptr) {
    throw Error(prefix + "a sparse plan needs its segment, row and block arrays");
  }
  SparsePlanFields fields;
  fields.segment_sparse = plan.segment_sparse;
  fields.row_offsets = plan.row_offsets;
  fields.block_indices = plan.block_indices;
  fields.segment_size = plan.segment_size;
  fields.block_size = plan.block_size;
  fields.num_segments = plan.num_segments;
  fields.keys_read = keys_read;
  return fields;
}

bool sparse_tile_rows_fit(const DevicePrefillPlan& plan, int64_t group, int64_t tile_rows) {
  return static_cast<int64_t>(plan.segment_size) * group % tile_rows == 0;
}

std::string sparse_tile_rows_rule(const DevicePrefillPlan& plan, int64_t group) {
  return "segment_size * (q_heads / kv_heads) = " + std::to_string(plan.segment_size) + " * " +
         std::to_string(group) + " = " + std::to_string(plan.segment_size * group) +
         " packed rows per segment must be a multiple of ";
}

}  // namespace detail

void flash_prefill_block_sparse(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                                const FlashShape& shape, const DevicePrefillPlan& plan, bf16* out,
                                cudaStream_t stream, FlashKernel kernel,
                                unsigned long long* keys_read) {
  const std::string prefix = "block-sparse attention: ";
  if (shape.device_position != nullptr) {
    throw Error(prefix + "runs prompt queries: device_position must be null");
  }
  if (plan.dense) {
    flash_prefill(q, key_cache, value_cache, shape, out, stream, kernel);
    return;
  }
  const detail::SparsePlanFields fields =
      detail::sparse_plan_fields(shape, plan, keys_read, prefix);
  if (shape.tokens == 0) return;
  detail::SparseFlashParams params;
  static_cast<FlashParams&>(params) = make_params(q, key_cache, value_cache, shape, out);
  static_cast<detail::SparsePlanFields&>(params) = fields;

  // Every tile of packed rows must lie in one segment, since its rows share one key sequence.
  constexpr int kWgmmaRows = 128;
  constexpr int kMmaRows = 16 * kPrefillWarps;
  const std::string constraint = detail::sparse_tile_rows_rule(plan, params.group);
  if (kernel == FlashKernel::kAuto) {
    if (wgmma_attention_available() &&
        detail::sparse_tile_rows_fit(plan, params.group, kWgmmaRows)) {
      kernel = FlashKernel::kWgmma;
    } else if (detail::sparse_tile_rows_fit(plan, params.group, kMmaRows)) {
      kernel = FlashKernel::kMma;
    } else {
      throw Error(prefix + "no kernel runs this shape: " + constraint + std::to_string(kMmaRows) +
                  " (mma kernel) or " + std::to_string(kWgmmaRows) +
                  " (wgmma kernel), so that every tile of rows lies in one segment");
    }
  }
  if (kernel == FlashKernel::kWgmma || kernel == FlashKernel::kWgmmaSimple) {
    if (!wgmma_attention_available()) {
      throw Error("attention: the wgmma kernel needs a Hopper GPU and a build for sm_90a");
    }
    if (!detail::sparse_tile_rows_fit(plan, params.group, kWgmmaRows)) {
      throw Error(prefix + "the wgmma kernel cannot run this shape: " + constraint +
                  std::to_string(kWgmmaRows));
    }
    detail::launch_wgmma_sparse_prefill(params, static_cast<int>(shape.head_dim),
                                        kernel == FlashKernel::kWgmma, stream);
    return;
  }
  if (!detail::sparse_tile_rows_fit(plan, params.group, kMmaRows)) {
    throw Error(prefix + "the mma kernel cannot run this shape: " + constraint +
                std::to_string(kMmaRows));
  }
  if (shape.head_dim == 128) {
    launch_mma<128, kPrefillWarps, kPrefillBlockN, kPrefillStages, true>(params, stream);
  } else {
    launch_mma<64, kPrefillWarps, kPrefillBlockN, kPrefillStages, true>(params, stream);
  }
}

int flash_decode_splits(const FlashShape& shape, int requested_splits) {
  const int64_t group = shape.kv_heads > 0 ? shape.q_heads / shape.kv_heads : 1;
  const int64_t row_blocks = (shape.tokens * group + 16 * kDecodeWarps - 1) / (16 * kDecodeWarps);
  const int64_t key_blocks =
      (shape.first_position + shape.tokens + kDecodeBlockN - 1) / kDecodeBlockN;
  int64_t splits = requested_splits;
  if (splits <= 0) {
    // As many splits as fill every multiprocessor exactly once (a second, partial wave would cost
    // as long as a full one), each split keeping at least two key tiles.
    const int per_multiprocessor = device_count() == 0    ? 1
                                   : shape.head_dim == 64 ? decode_blocks_per_multiprocessor<64>()
                                                          : decode_blocks_per_multiprocessor<128>();
    static const int multiprocessors = device_count() > 0 ? multiprocessor_count() : 1;
    const int64_t base = std::max<int64_t>(1, shape.kv_heads * row_blocks);
    splits =
        std::max<int64_t>(1, static_cast<int64_t>(per_multiprocessor) * multiprocessors / base);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, key_blocks / 2));
  }
  // At most one split per key tile, and few enough for the merge's weights to sit in shared memory.
  splits =
      std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, std::min<int64_t>(key_blocks, 4096)));
  return static_cast<int>(splits);
}

size_t flash_decode_workspace_floats(const FlashShape& shape, int splits) {
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(shape.tokens) * shape.q_heads;
  return static_cast<size_t>(splits) * rows * (shape.head_dim + 1);
}

void flash_decode(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                  const FlashShape& shape, bf16* out, float* workspace, size_t workspace_floats,
                  cudaStream_t stream, int splits) {
  if (shape.tokens == 0) return;
  FlashParams params = make_params(q, key_cache, value_cache, shape, out);
  splits = flash_decode_splits(shape, splits);
  if (splits > 1) {
    const size_t needed = flash_decode_workspace_floats(shape, splits);
    if (workspace == nullptr || workspace_floats < needed) {
      throw Error("attention: split-KV decoding needs a workspace of " + std::to_string(needed) +
                  " floats, got " + std::to_string(workspace_floats));
    }
    params.splits = splits;
    params.partial_out = workspace;
    params.partial_lse =
        workspace + static_cast<size_t>(splits) * shape.tokens * shape.q_heads * shape.head_dim;
  }
  if (shape.head_dim == 128) {
    launch_mma<128, kDecodeWarps, kDecodeBlockN, kDecodeStages>(params, stream);
  } else {
    launch_mma<64, kDecodeWarps, kDecodeBlockN, kDecodeStages>(params, stream);
  }
  if (splits > 1) {
    const int64_t rows = shape.tokens * shape.q_heads;
    launch_dependent("merge_splits_kernel", merge_splits_kernel, dim3(static_cast<unsigned>(rows)),
                     dim3(static_cast<unsigned>(shape.head_dim)), sizeof(float) * splits, stream,
                     params, static_cast<int>(shape.head_dim));
  }
}

}  // namespace entropyinfer::cuda

// Shared between the attention kernels: their parameters and the PTX wrappers (cp.async, ldmatrix,
// mma.sync, exp2) both kernel files use. Internal to the CUDA backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/dependent_launch.cuh"
#include "backends/cuda/device_plans.h"
#include "backends/cuda/flash_attention.h"

namespace entropyinfer::cuda::detail {

struct FlashParams {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* out = nullptr;
  // Split-KV partial results (both null when the kernel writes `out` directly):
  // partial_out [splits][tokens * q_heads][head_dim] normalised by its own sum, partial_lse
  // [splits][tokens * q_heads] its log2-sum-exp2 of scaled scores.
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  int64_t q_token_stride = 0;
  int64_t out_token_stride = 0;
  int64_t cache_stride = 0;
  int tokens = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int group = 0;  // q_heads / kv_heads
  int rows = 0;   // tokens * group: the packed (token, head-in-group) rows of one KV head
  int first_position = 0;
  // When set, first_position is read from here at run time (a captured CUDA graph replays at every
  // position); the launch's split count must then cover the largest position.
  const int* device_position = nullptr;
  int splits = 1;
  float scale_log2 = 0.0f;  // softmax scale times log2(e)
};

// A block-sparse prefill plan as the kernels read it: the DevicePrefillPlan's arrays (device
// memory; rows r = kv_head * num_segments + segment of the CSR list of selected key blocks).
struct SparsePlanFields {
  const uint8_t* segment_sparse = nullptr;
  const int32_t* row_offsets = nullptr;
  const int32_t* block_indices = nullptr;
  int segment_size = 0;
  int block_size = 0;
  int num_segments = 0;
  // When set, each tile adds the (packed row, key) pairs its mask admits: the keys it read.
  unsigned long long* keys_read = nullptr;
};

// The block-sparse prefill's parameters. A type of its own so that the dense kernels' parameters,
// and hence their code, stay as they are.
struct SparseFlashParams : FlashParams, SparsePlanFields {};

template <bool kSparse>
using KernelParams = std::conditional_t<kSparse, SparseFlashParams, FlashParams>;

// Launch the sm_90a kernels (dense, and block-sparse with segment_size * group a multiple of 128);
// defined in flash_attention_wgmma.cu.
void launch_wgmma_prefill(const FlashParams& params, int head_dim, bool pipelined,
                          cudaStream_t stream);
void launch_wgmma_sparse_prefill(const SparseFlashParams& params, int head_dim, bool pipelined,
                                 cudaStream_t stream);
bool wgmma_kernel_compiled();

// Checks a block-sparse prefill call against its (not dense) plan and returns the plan's fields for
// the kernels; Error naming the mismatch. Every tile of kTileRows packed rows must lie in one
// segment: segment_size * group must be a multiple of tile_rows, which check_sparse_tile_rows tests
// (`kernel` names the kernel in its message).
SparsePlanFields sparse_plan_fields(const FlashShape& shape, const DevicePrefillPlan& plan,
                                    unsigned long long* keys_read, const std::string& prefix);
bool sparse_tile_rows_fit(const DevicePrefillPlan& plan, int64_t group, int64_t tile_rows);
std::string sparse_tile_rows_rule(const DevicePrefillPlan& plan, int64_t group);

// ------------------------------------------------------------------------------------------------
// Device helpers

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte asynchronous copy global -> shared; bytes < 16 zero-fills the rest (0 writes zeros only).
__device__ __forceinline__ void cp_async_16(uint32_t shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(bytes)
               : "memory");
}
// The same for 8 bytes (both addresses 8-byte aligned).
__device__ __forceinline__ void cp_async_8(uint32_t shared, const void* global, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(shared), "l"(global),
               "r"(bytes)
               : "memory");
}
// The same for 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async_4(uint32_t shared, const void* global, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b for one m16n8k16 tile: bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with fp16 operands.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// Rows of kHeadDim bf16, each 16-byte chunk moved by (row mod 8): the 8 rows one ldmatrix reads hit
// 8 different bank groups.
template <int kHeadDim>
__device__ __forceinline__ uint32_t swizzled(uint32_t tile, int row, int chunk) {
  return tile + row * (kHeadDim * 2) + ((chunk ^ (row & 7)) << 4);
}

// The two halves of one key tile's work for a warp of 16 query rows in mma.sync attention (the
// prefill kernel and the ragged decode kernel alike; each masks the scores in between). A thread
// holds rows g and g + 8 of the warp's 16 (its "a" and "b" rows) and, per 8-key column tile, the
// four scores of columns 2t and 2t + 1 of both.
//
// Scores S = Q K^T of the tile (kTilesN 8-key column tiles) from the warp's Q fragments `qa` and
// the swizzled K tile in shared memory.
template <int kHeadDim, int kTilesN>
__device__ __forceinline__ void tile_scores(float (&s)[kTilesN][4],
                                            const uint32_t (&qa)[kHeadDim / 16][4], uint32_t k_tile,
                                            int lane) {
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kTilesN / 2; ++np) {
      uint32_t b[4];
      const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(b, swizzled<kHeadDim>(k_tile, key, 2 * kk + ((lane >> 3) & 1)));
      mma_bf16_16816(s[2 * np], qa[kk], b[0], b[1]);
      mma_bf16_16816(s[2 * np + 1], qa[kk], b[2], b[3]);
    }
  }
}

// The online softmax over the tile's (masked) scores, then O += P V from the swizzled V tile: the
// running maxima (already scaled by scale_log2) and sums of both rows are updated, O rescaled. A
// row that has seen only masked keys keeps max -inf and exponentiates against 0 (all terms 0).
template <int kHeadDim, int kTilesN>
__device__ __forceinline__ void softmax_and_accumulate(float (&s)[kTilesN][4],
                                                       float (&o)[kHeadDim / 8][4], uint32_t v_tile,
                                                       int lane, float scale_log2, float& max_a,
                                                       float& max_b, float& sum_a, float& sum_b) {
  constexpr int kTilesD = kHeadDim / 8;
  float block_max_a = -INFINITY, block_max_b = -INFINITY;
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) {
    block_max_a = fmaxf(block_max_a, fmaxf(s[j][0], s[j][1]));
    block_max_b = fmaxf(block_max_b, fmaxf(s[j][2], s[j][3]));
  }
  const float new_max_a = fmaxf(max_a, quad_max(block_max_a) * scale_log2);
  const float new_max_b = fmaxf(max_b, quad_max(block_max_b) * scale_log2);
  const float reference_a = new_max_a == -INFINITY ? 0.0f : new_max_a;
  const float reference_b = new_max_b == -INFINITY ? 0.0f : new_max_b;
  const float rescale_a = fast_exp2(max_a - reference_a);
  const float rescale_b = fast_exp2(max_b - reference_b);
  max_a = new_max_a;
  max_b = new_max_b;
  float block_sum_a = 0.0f, block_sum_b = 0.0f;
#pragma unroll
  for (int j = 0; j < kTilesN; ++j) {
    s[j][0] = fast_exp2(fmaf(s[j][0], scale_log2, -reference_a));
    s[j][1] = fast_exp2(fmaf(s[j][1], scale_log2, -reference_a));
    s[j][2] = fast_exp2(fmaf(s[j][2], scale_log2, -reference_b));
    s[j][3] = fast_exp2(fmaf(s[j][3], scale_log2, -reference_b));
    block_sum_a += s[j][0] + s[j][1];
    block_sum_b += s[j][2] + s[j][3];
  }
  sum_a = sum_a * rescale_a + block_sum_a;
  sum_b = sum_b * rescale_b + block_sum_b;
#pragma unroll
  for (int i = 0; i < kTilesD; ++i) {
    o[i][0] *= rescale_a;
    o[i][1] *= rescale_a;
    o[i][2] *= rescale_b;
    o[i][3] *= rescale_b;
  }
#pragma unroll
  for (int kk = 0; kk < kTilesN / 2; ++kk) {
    const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                            pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                            pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kTilesD / 2; ++dp) {
      uint32_t b[4];
      const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
      ldmatrix_x4_trans(b, swizzled<kHeadDim>(v_tile, key, 2 * dp + (lane >> 4)));
      mma_bf16_16816(o[2 * dp], pa, b[0], b[1]);
      mma_bf16_16816(o[2 * dp + 1], pa, b[2], b[3]);
    }
  }
}

// Where packed row `row` of KV head `kv_head` lives in a [tokens][q_heads][head_dim] tensor.
__device__ __forceinline__ int64_t packed_row_offset(int row, int group, int kv_head,
                                                     int64_t token_stride, int head_dim) {
  const int token = row / group;
  const int head = kv_head * group + (row - token * group);
  return token * token_stride + static_cast<int64_t>(head) * head_dim;
}

// The keys one tile of packed rows reads under a block-sparse plan, as a virtual sequence of slots:
// first the selected blocks of its (KV head, segment) row in plan order (slot j is key
// blocks[j / block_size] * block_size + j % block_size), then its own run of consecutive keys
// own_start .. last_position (the segment's start, or 0 in a dense segment, up to the tile's last
// token). Selected keys lie before the segment and are visible to every row; own keys are causal.
// Hence key position x of the own run sits in slot x + shift, and a row at position `pos` sees
// exactly the slots 0 .. pos + shift: the kernels mask slots as the dense kernels mask positions.
// Dense kernels are the special case shift 0 (no selected keys, own run from 0).
struct SparseKeys {
  const int32_t* blocks = nullptr;  // the row's block indices
  int selected = 0;                 // keys in the selected blocks (count * block_size)
  int block_size = 1;
  int own_start = 0;
  int last_position = 0;

  __host__ __device__ __forceinline__ int shift() const { return selected - own_start; }
  __host__ __device__ __forceinline__ int last_slot() const { return last_position + shift(); }
  // The cache row of `slot`, or -1 for a slot past the end (read as zeros and masked). A selected
  // key outside 0 .. own_start - 1 (an invalid plan) also reads as -1: no read outside the prompt.
  __host__ __device__ __forceinline__ int key_row(int slot) const {
    if (slot < selected) {
      const int64_t row =
          static_cast<int64_t>(blocks[slot / block_size]) * block_size + slot % block_size;
      return row >= 0 && row < own_start ? static_cast<int>(row) : -1;
    }
    return slot <= last_slot() ? slot - shift() : -1;
  }
};

// The sequence of the tile whose packed rows start at token first_token and end at last_token
// (both in one segment; the plan is not dense). Rows of dense segments are empty in the plan, but
// only segment_sparse decides: a dense segment reads all keys 0 .. last_token.
__host__ __device__ __forceinline__ SparseKeys sparse_keys(const SparsePlanFields& p, int kv_head,
                                                           int first_token, int last_token) {
  const int segment = first_token / p.segment_size;
  const int row = kv_head * p.num_segments + segment;
  // Three independent loads: the tile's first K/V copies wait for them.
  const bool sparse = p.segment_sparse[segment] != 0;
  const int begin = p.row_offsets[row];
  const int end = p.row_offsets[row + 1];
  SparseKeys keys;
  keys.blocks = p.block_indices + begin;
  keys.block_size = p.block_size;
  keys.selected = sparse && end > begin ? (end - begin) * p.block_size : 0;
  keys.own_start = sparse ? segment * p.segment_size : 0;
  keys.last_position = last_token;
  return keys;
}

// Which key slot each fp32 score of a wgmma consumer thread holds. The accumulator of S holds, per
// 8-column tile j, columns 8j + 2t and 8j + 2t + 1 (t: the thread's place in its quad); slot() is
// the slot of the first, the second is the next slot. In natural order column n is slot n.
struct NaturalKeyOrder {
  __device__ __forceinline__ static int slot(int j, int t) { return 8 * j + 2 * t; }
};

// The online softmax of a thread of a wgmma consumer warpgroup (both prefill kernels). Its fp32
// scores hold, per 8-column tile j, the slots KeyOrder::slot(j, t) and the next of its rows a
// (s[4j], s[4j+1]) and b (s[4j+2], s[4j+3]). update() masks the slots past each row's last (when
// `masked`), moves the rows' running maxima (scores times scale_a / scale_b) and sums, and
// exponentiates the scores in place; rescale() then scales O by the factors that update() left.
// kExponentShift raises every exponent and so every weight and sum by 2^kExponentShift (the FP8
// kernel's 8 keeps its weights normal in E4M3; O and the sums carry it alike).
template <int kExponentShift, class KeyOrder = NaturalKeyOrder>
struct WgmmaRowSoftmax {
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  float rescale_a = 1.0f, rescale_b = 1.0f;

  template <int kCount>
  __device__ __forceinline__ void update(float (&s)[kCount], int first_slot, bool masked,
                                         int last_a, int last_b, int t, float scale_a,
                                         float scale_b) {
    constexpr int kTilesN = kCount / 4;
    if (masked) {
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        const int key = first_slot + KeyOrder::slot(j, t);
        if (key > last_a) s[4 * j] = -INFINITY;
        if (key + 1 > last_a) s[4 * j + 1] = -INFINITY;
        if (key > last_b) s[4 * j + 2] = -INFINITY;
        if (key + 1 > last_b) s[4 * j + 3] = -INFINITY;
      }
    }
    float block_max_a = -INFINITY, block_max_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      block_max_a = fmaxf(block_max_a, fmaxf(s[4 * j], s[4 * j + 1]));
      block_max_b = fmaxf(block_max_b, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    const float new_max_a = fmaxf(max_a, quad_max(block_max_a) * scale_a);
    const float new_max_b = fmaxf(max_b, quad_max(block_max_b) * scale_b);
    const float reference_a = new_max_a == -INFINITY ? 0.0f : new_max_a;
    const float reference_b = new_max_b == -INFINITY ? 0.0f : new_max_b;
    rescale_a = fast_exp2(max_a - reference_a);
    rescale_b = fast_exp2(max_b - reference_b);
    max_a = new_max_a;
    max_b = new_max_b;
    float offset_a = -reference_a, offset_b = -reference_b;
    if constexpr (kExponentShift != 0) {
      offset_a = static_cast<float>(kExponentShift) - reference_a;
      offset_b = static_cast<float>(kExponentShift) - reference_b;
    }
    float block_sum_a = 0.0f, block_sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      s[4 * j] = fast_exp2(fmaf(s[4 * j], scale_a, offset_a));
      s[4 * j + 1] = fast_exp2(fmaf(s[4 * j + 1], scale_a, offset_a));
      s[4 * j + 2] = fast_exp2(fmaf(s[4 * j + 2], scale_b, offset_b));
      s[4 * j + 3] = fast_exp2(fmaf(s[4 * j + 3], scale_b, offset_b));
      block_sum_a += s[4 * j] + s[4 * j + 1];
      block_sum_b += s[4 * j + 2] + s[4 * j + 3];
    }
    sum_a = sum_a * rescale_a + block_sum_a;
    sum_b = sum_b * rescale_b + block_sum_b;
  }

  // O in the same layout (per 8-column tile i: o[4i], o[4i+1] of row a, o[4i+2], o[4i+3] of b).
  template <int kCount>
  __device__ __forceinline__ void rescale(float (&o)[kCount]) const {
#pragma unroll
    for (int i = 0; i < kCount / 4; ++i) {
      o[4 * i] *= rescale_a;
      o[4 * i + 1] *= rescale_a;
      o[4 * i + 2] *= rescale_b;
      o[4 * i + 3] *= rescale_b;
    }
  }
};

// After the last key tile: a thread's two rows' softmax sums, reduced over their quad in place, and
// their inverses (0 for a row that saw no key, so that it writes zeros).
__device__ __forceinline__ void finish_row_sums(float& sum_a, float& sum_b, float& inverse_a,
                                                float& inverse_b) {
  sum_a = quad_sum(sum_a);
  sum_b = quad_sum(sum_b);
  inverse_a = sum_a > 0.0f ? 1.0f / sum_a : 0.0f;
  inverse_b = sum_b > 0.0f ? 1.0f / sum_b : 0.0f;
}

// The KV head and first packed row of a prefill CTA's tile. Row blocks of one KV head run side by
// side and share its K/V in L2, latest (longest) rows first; dense grids are (row blocks, KV
// heads), sparse ones one-dimensional with the KV heads of each row block adjacent.
template <bool kSparse>
__device__ __forceinline__ int2 prefill_tile_origin(int kv_heads, int block_m) {
  const int block = static_cast<int>(blockIdx.x), blocks = static_cast<int>(gridDim.x);
  if constexpr (kSparse) {
    return make_int2(block % kv_heads, (blocks / kv_heads - 1 - block / kv_heads) * block_m);
  } else {
    return make_int2(static_cast<int>(blockIdx.y), (blocks - 1 - block) * block_m);
  }
}

// The (packed row, key) pairs a sparse tile's mask admits: a row at position pos sees slots
// 0 .. pos + shift. Added once per tile to p.keys_read when counting; each kernel calls it from
// one thread.
__device__ __forceinline__ void count_tile_keys(const SparsePlanFields& p, const SparseKeys& keys,
                                                int group, int row0, int last_row,
                                                int first_position) {
  if (p.keys_read == nullptr) return;
  unsigned long long pairs = 0;
  for (int row = row0; row <= last_row; ++row)
    pairs += static_cast<unsigned long long>(first_position + row / group + keys.shift() + 1);
  atomicAdd(p.keys_read, pairs);
}

}  // namespace entropyinfer::cuda::detail

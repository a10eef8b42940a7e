// FP8 causal prefill on Hopper (flash_prefill_fp8): the pipeline of flash_attention_wgmma.cu (two
// consumer warpgroups of 64 packed query rows, a producer warpgroup streaming 128-key tiles
// through three shared-memory stages, ping-pong between the consumers) with E4M3 operands:
// wgmma m64n128k32 for S = Q K^T from shared memory, and for O += P V with P from registers and
// the transposed values from shared memory. Every tile row is 128 bytes, one 128-byte swizzle
// atom, so every operand tile has one layout and one descriptor form: with head_dim 128 the rows
// of Q and K are full; with head_dim 64 they use their first 64 bytes (two k32 steps instead of
// four) and the transposed value tile its first 64 rows.
//
// The values are staged transposed within runs of 8 keys ([run][head_dim][8]): a run's codes for
// one head-dim column are 8 contiguous bytes, and a run's columns lie next to each other, so a
// warp's copies of one run read whole sectors whether a tile streams every run (dense) or gathers
// the runs of its selected blocks (block-sparse).
//
// The block-sparse variant (flash_prefill_block_sparse_fp8) runs the same pipeline over a tile's
// virtual key sequence (detail::SparseKeys), as the bf16 wgmma kernel does: the producer looks each
// slot's staged row up in a small table it fills one tile ahead. Its values are copied a run at a
// time, so selected blocks and segments must be multiples of 8 keys.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cuda/flash_attention.h"
#include "backends/cuda/flash_attention_internal.cuh"
#include "backends/cuda/fp8_device.cuh"
#include "backends/cuda/row_ops.cuh"
#include "backends/cuda/wgmma_device.cuh"

namespace entropyinfer::cuda {
namespace detail {
namespace {

constexpr int kRowBytes = 128;  // every tile row: one swizzle atom wide
constexpr int kBlockM = 128;    // packed query rows per CTA
constexpr int kBlockN = 128;    // keys per tile
constexpr int kKeyGroup = 32;  // keys of one k32 step of P V: a tile's key rows permute within them
constexpr int kValueRun = 8;   // keys of one staged run of values, and of one value copy
constexpr int kConsumerThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kConsumerThreads + kProducerThreads;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kStages = 3;
constexpr int kTileBytes = kBlockN * kRowBytes;  // one byte per code
constexpr int kQBytes = kBlockM * kRowBytes;
constexpr int kStageBytes = 2 * kTileBytes;  // K tile, then the transposed V tile
constexpr int kScalesBytes = kBlockM * 4;    // each query row's scale
constexpr int kSharedBytes = kQBytes + kStages * kStageBytes + kScalesBytes + 1024;
constexpr int kTableBytes = 2 * kBlockN * 4;  // sparse: the producer's two tiles of staged rows
constexpr int kSparseSharedBytes = kSharedBytes + kTableBytes;
// Named barriers as in the bf16 kernel: full (per stage and warpgroup), empty (per stage), query
// (per warpgroup), table (sparse), schedule (per warpgroup).
constexpr int kFullBarrier = 1;
constexpr int kEmptyBarrier = 1 + 2 * kStages;
constexpr int kQueryBarrier = 1 + 3 * kStages;
constexpr int kTableBarrier = 3 + 3 * kStages;
constexpr int kScheduleBarrier = 4 + 3 * kStages;
static_assert(kScheduleBarrier + 1 < 16, "a CTA has 16 named barriers");

// The slot whose key a tile's key row n holds. An 8-bit wgmma A fragment gives thread t of a quad
// columns 4t .. 4t+3 and 16 + 4t .. 19 + 4t of each group of 32, while its fp32 scores of S sit in
// columns 8j + 2t, 8j + 2t + 1 of the 8-column tiles j: with the keys of each group of 32 loaded
// in this order, the thread's scores are its A fragment's columns of P as they stand, so P needs
// no shuffle between threads and the values keep their natural order. A bijection on each group
// of 32, with slot(n + 16) = slot(n) + 16.
__host__ __device__ __forceinline__ int slot_of_key_row(int n) {
  const int group = n & ~(kKeyGroup - 1), tile = (n >> 3) & 3, t = (n >> 1) & 3;
  return group + 16 * (tile >> 1) + 4 * t + 2 * (tile & 1) + (n & 1);
}

// The slots of a consumer thread's scores (WgmmaRowSoftmax's KeyOrder) under that order.
struct Fp8KeyOrder {
  __device__ __forceinline__ static int slot(int j, int t) {
    return slot_of_key_row(8 * j + 2 * t);
  }
};

__device__ __forceinline__ float scale_of(float amax) { return fp8::row_scale(amax); }

struct Fp8FlashParams {
  const bf16* q = nullptr;
  const uint8_t* k = nullptr;
  const uint8_t* vt = nullptr;
  const float* amax = nullptr;
  bf16* out = nullptr;
  int64_t q_token_stride = 0;
  int64_t out_token_stride = 0;
  int64_t stride = 0;
  int kv_heads = 0;
  int group = 0;
  int rows = 0;
  int first_position = 0;
  float scale_log2 = 0.0f;
};

struct Fp8SparseParams : Fp8FlashParams, SparsePlanFields {};

template <bool kSparse>
using Fp8KernelParams = std::conditional_t<kSparse, Fp8SparseParams, Fp8FlashParams>;

// Largest |key| and |value| per KV head: each block strides over one head's elements 8 at a time
// and adds one atomic per maximum (per warp, a 128k-token head's atomics on one address queued up).
constexpr int kAmaxThreads = 256;
constexpr int kAmaxBlocksPerHead = 64;

template <int kHeadDim>
__global__ void __launch_bounds__(kAmaxThreads)
    staged_amax_kernel(const bf16* keys, const bf16* values, int64_t cache_stride, int64_t count,
                       int kv_heads, float* amax) {
  const int head = blockIdx.y;
  const int64_t offset = static_cast<int64_t>(head) * cache_stride * kHeadDim;
  const uint4* key_vectors = reinterpret_cast<const uint4*>(keys + offset);
  const uint4* value_vectors = reinterpret_cast<const uint4*>(values + offset);
  float key_max = 0.0f, value_max = 0.0f;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * kAmaxThreads + threadIdx.x; v < count / 8;
       v += static_cast<int64_t>(gridDim.x) * kAmaxThreads) {
    key_max = fp8::bf16_max_magnitude(key_vectors[v], key_max);
    value_max = fp8::bf16_max_magnitude(value_vectors[v], value_max);
  }
  key_max = row_ops::block_max(key_max);
  value_max = row_ops::block_max(value_max);
  // Non-negative floats order as their bit patterns do.
  if (threadIdx.x == 0) {
    atomicMax(reinterpret_cast<int*>(amax) + head, __float_as_int(key_max));
    atomicMax(reinterpret_cast<int*>(amax) + kv_heads + head, __float_as_int(value_max));
  }
}

// One group of 32 keys of one KV head per block of head_dim threads. The group's keys and values
// are contiguous in the cache: each thread loads 8 elements at a time (four times), writes the
// keys' codes in place, and puts the values' codes in shared memory, from which each thread then
// gathers 8 keys of one column, a run of the transposed layout. Keys past `keys` stage as zeros.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim)
    stage_fp8_keys_kernel(const bf16* keys, const bf16* values, int64_t cache_stride, int64_t count,
                          Fp8StagedKeys staged) {
  constexpr int kVectors = kKeyGroup / 8;  // 8-element loads per thread (kHeadDim threads)
  __shared__ __align__(16) uint8_t value_codes_by_key[kKeyGroup * kHeadDim];
  const int head = blockIdx.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kKeyGroup;
  const int64_t group_offset = (static_cast<int64_t>(head) * cache_stride + first) * kHeadDim;
  uint4 key_loads[kVectors], value_loads[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int element = 8 * (threadIdx.x + i * kHeadDim);
    const bool staged_key = first + element / kHeadDim < count;
    key_loads[i] = staged_key ? *reinterpret_cast<const uint4*>(keys + group_offset + element)
                              : make_uint4(0, 0, 0, 0);
    value_loads[i] = staged_key ? *reinterpret_cast<const uint4*>(values + group_offset + element)
                                : make_uint4(0, 0, 0, 0);
  }
  const float key_scale = scale_of(staged.amax[head]);
  const float value_scale = scale_of(staged.amax[staged.kv_heads + head]);
  uint8_t* key_codes =
      staged.keys + (static_cast<int64_t>(head) * staged.stride + first) * kHeadDim;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int element = 8 * (threadIdx.x + i * kHeadDim);
    *reinterpret_cast<uint2*>(key_codes + element) = fp8::quantize8(key_loads[i], key_scale);
    *reinterpret_cast<uint2*>(value_codes_by_key + element) =
        fp8::quantize8(value_loads[i], value_scale);
  }
  __syncthreads();
  // Run r of the group, column d: the 8 codes of keys 8r .. 8r+7 in column d.
  uint8_t* value_codes =
      staged.values + (static_cast<int64_t>(head) * staged.stride + first) * kHeadDim;
  const int d = threadIdx.x;
#pragma unroll
  for (int run = 0; run < kKeyGroup / kValueRun; ++run) {
    uint32_t words[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < kValueRun; ++k) {
      words[k / 4] |=
          static_cast<uint32_t>(value_codes_by_key[(kValueRun * run + k) * kHeadDim + d])
          << (8 * (k % 4));
    }
    *reinterpret_cast<uint2*>(value_codes + run * kValueRun * kHeadDim + d * kValueRun) =
        make_uint2(words[0], words[1]);
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Four codes, `a` in the lowest byte (cvt puts its first source in the upper byte of a pair).
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  uint16_t low, high;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(low) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(high) : "f"(d), "f"(c));
  return static_cast<uint32_t>(low) | (static_cast<uint32_t>(high) << 16);
}

// D (64 x 128, fp32) = (scale_d ? D : 0) + A * B; A and B K-major E4M3 in shared memory.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                         int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ENTROPYINFER_WGMMA_D64
      "%64, %65, p, 1, 1;\n}\n"
      : ENTROPYINFER_WGMMA_D64_OPERANDS(d)
      : "l"(a), "l"(b), "r"(scale_d));
}

// D (64 x 128, fp32) += A * B; A E4M3 in registers (per warp the m16n8k32 8-bit A layout), B
// K-major E4M3 in shared memory.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float (&d)[64], const uint32_t (&a)[4],
                                                         uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ENTROPYINFER_WGMMA_D64
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : ENTROPYINFER_WGMMA_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// D (64 x 64, fp32) += A * B, the same operands with 64 columns (head_dim 64).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_rs(float (&d)[32], const uint32_t (&a)[4],
                                                        uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " ENTROPYINFER_WGMMA_D32
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : ENTROPYINFER_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

__device__ __forceinline__ void hand_over_stage(int stage) {
  named_barrier_arrive(kFullBarrier + 2 * stage, kProducerThreads + 128);
  named_barrier_arrive(kFullBarrier + 2 * stage + 1, kProducerThreads + 128);
}

// A producer thread's share of a value tile: 16 runs of 8 keys in each head-dim row, 8 rows per
// pass. Thread p copies run 2 * (p / 16) + p % 2 of rows (p / 2) % 8 + 8 * pass, so a half-warp
// writes the two 8-byte halves of one swizzled chunk in each of 8 rows (every bank once) and reads
// 64 contiguous bytes of each of two runs.
struct ValueCopyLane {
  int run;          // of the tile's 16
  int row;          // the head-dim row of the first pass
  uint32_t offset;  // of the copy in the tile; passes add 8 rows
};
constexpr int kValueRowsPerPass = 8;

__device__ __forceinline__ ValueCopyLane value_copy_lane(int producer) {
  const int run = 2 * (producer / 16) + producer % 2;
  const int row = (producer / 2) % kValueRowsPerPass;
  return {run, row,
          static_cast<uint32_t>(row * kRowBytes + (((run >> 1) ^ row) << 4) + (run & 1) * 8)};
}

// Copies the run of staged values that starts at `run` (staged codes of the thread's first row
// in that run, ValueCopyLane::row) into the tile; `bytes` 0 fills zeros.
template <int kHeadDim>
__device__ __forceinline__ void copy_value_run(uint32_t v_tile, const ValueCopyLane& lane,
                                               const uint8_t* run, int bytes) {
#pragma unroll 4
  for (int pass = 0; pass < kHeadDim / kValueRowsPerPass; ++pass) {
    cp_async_8(v_tile + lane.offset + pass * kValueRowsPerPass * kRowBytes,
               run + pass * kValueRowsPerPass * kValueRun, bytes);
  }
}

// Staged rows are padded with zeros to a multiple of the tile, so every copy is whole.
template <int kHeadDim>
__device__ __forceinline__ void producer_loop(const Fp8FlashParams& p, uint32_t stage_tiles,
                                              int kv_head, int blocks) {
  constexpr int kKeyChunks = kHeadDim / 16;                       // 16-byte chunks of a key row
  constexpr int kKeyRowsPerPass = kProducerThreads / kKeyChunks;  // 16 or 32
  const int producer = threadIdx.x - kConsumerThreads;
  const int key_lane = producer / kKeyChunks, key_chunk = producer % kKeyChunks;
  // Passes advance by 16 or 32 rows, which moves this thread's slot by as much.
  const uint8_t* k_thread =
      p.k + (static_cast<int64_t>(kv_head) * p.stride + slot_of_key_row(key_lane)) * kHeadDim +
      key_chunk * 16;
  const uint32_t key_offset = key_lane * kRowBytes + ((key_chunk ^ (key_lane & 7)) << 4);
  const ValueCopyLane value = value_copy_lane(producer);
  const uint8_t* v_thread =
      p.vt + (static_cast<int64_t>(kv_head) * p.stride + kValueRun * value.run) * kHeadDim +
      value.row * kValueRun;
  for (int block = 0; block < blocks; ++block) {
    const int stage = block % kStages;
    if (block >= kStages) named_barrier_sync(kEmptyBarrier + stage, kThreads);
    const uint32_t k_tile = stage_tiles + stage * kStageBytes;
    const uint32_t v_tile = k_tile + kTileBytes;
    const int64_t key0 = static_cast<int64_t>(block) * kBlockN;
#pragma unroll 4
    for (int pass = 0; pass < kBlockN / kKeyRowsPerPass; ++pass) {
      cp_async_16(k_tile + key_offset + pass * kKeyRowsPerPass * kRowBytes,
                  k_thread + (key0 + pass * kKeyRowsPerPass) * kHeadDim, 16);
    }
    copy_value_run<kHeadDim>(v_tile, value, v_thread + key0 * kHeadDim, 8);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    hand_over_stage(stage);
  }
}

// The sparse producer: each thread first writes the staged row of one slot of the tile into a
// shared table (looked up one tile ahead; two halves, as in the bf16 kernel), then key row n of the
// tile copies the row of slot slot_of_key_row(n), and each run of 8 slots (8 consecutive slots of
// one selected block or of the own run, hence one staged run of values) copies that run.
template <int kHeadDim>
__device__ __forceinline__ void sparse_producer_loop(const Fp8SparseParams& p, uint32_t stage_tiles,
                                                     int* table, int kv_head, int blocks,
                                                     const SparseKeys& keys) {
  constexpr int kKeyChunks = kHeadDim / 16;                       // 16-byte chunks of a key row
  constexpr int kKeyRowsPerPass = kProducerThreads / kKeyChunks;  // 16 or 32
  const int producer = threadIdx.x - kConsumerThreads;
  const int key_lane = producer / kKeyChunks, key_chunk = producer % kKeyChunks;
  const int key_slot = slot_of_key_row(key_lane);
  const uint8_t* k_thread =
      p.k + static_cast<int64_t>(kv_head) * p.stride * kHeadDim + key_chunk * 16;
  const uint32_t key_offset = key_lane * kRowBytes + ((key_chunk ^ (key_lane & 7)) << 4);
  const ValueCopyLane value = value_copy_lane(producer);
  const uint8_t* v_thread =
      p.vt + static_cast<int64_t>(kv_head) * p.stride * kHeadDim + value.row * kValueRun;
  int next_row = keys.key_row(producer);
  for (int block = 0; block < blocks; ++block) {
    const int stage = block % kStages;
    int* rows = table + (block & 1) * kBlockN;
    rows[producer] = next_row;
    named_barrier_sync(kTableBarrier, kProducerThreads);
    if (block >= kStages) named_barrier_sync(kEmptyBarrier + stage, kThreads);
    if (block + 1 < blocks) next_row = keys.key_row((block + 1) * kBlockN + producer);
    const uint32_t k_tile = stage_tiles + stage * kStageBytes;
    const uint32_t v_tile = k_tile + kTileBytes;
#pragma unroll 4
    for (int pass = 0; pass < kBlockN / kKeyRowsPerPass; ++pass) {
      // Slots past the end (row -1) are masked; zero-filled so that 0 * V stays finite.
      const int row = rows[pass * kKeyRowsPerPass + key_slot];
      cp_async_16(k_tile + key_offset + pass * kKeyRowsPerPass * kRowBytes,
                  k_thread + static_cast<int64_t>(row >= 0 ? row : 0) * kHeadDim,
                  row >= 0 ? 16 : 0);
    }
    // A run's first slot decides for the run: the slots after it are masked where they lie past
    // the end, and their staged codes are finite.
    const int run_row = rows[value.run * kValueRun];
    copy_value_run<kHeadDim>(v_tile, value,
                             v_thread + static_cast<int64_t>(run_row >= 0 ? run_row : 0) * kHeadDim,
                             run_row >= 0 ? 8 : 0);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    hand_over_stage(stage);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int kHeadDim, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1) flash_fp8_kernel(const Fp8KernelParams<kSparse> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTilesD = kHeadDim / 8;
  extern __shared__ __align__(1024) uint8_t shared_raw[];
  const uint32_t base = shared_address(shared_raw);
  const uint32_t q_tile = (base + 1023u) & ~1023u;
  const uint32_t stage_tiles = q_tile + kQBytes;
  float* q_scales =
      reinterpret_cast<float*>(shared_raw + (stage_tiles + kStages * kStageBytes - base));

  const int2 origin = prefill_tile_origin<kSparse>(p.kv_heads, kBlockM);
  const int kv_head = origin.x, row0 = origin.y;
  const int group = p.group;
  const int last_row = min(row0 + kBlockM, p.rows) - 1;
  const int min_position = p.first_position + row0 / group;
  const int max_position = p.first_position + last_row / group;
  // Key slots: position x sits in slot x + shift (0 when dense), as in the bf16 kernels.
  SparseKeys keys;
  int shift = 0;
  if constexpr (kSparse) {
    keys = sparse_keys(p, kv_head, min_position, max_position);
    shift = keys.shift();
    if (threadIdx.x == 0) count_tile_keys(p, keys, group, row0, last_row, p.first_position);
  }
  const int blocks = (max_position + shift + kBlockN) / kBlockN;

  if (threadIdx.x >= kConsumerThreads) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if constexpr (kSparse) {
      sparse_producer_loop<kHeadDim>(
          p, stage_tiles,
          reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(q_scales) + kScalesBytes), kv_head,
          blocks, keys);
    } else {
      producer_loop<kHeadDim>(p, stage_tiles, kv_head, blocks);
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));

  const int warpgroup = threadIdx.x / 128;
  const int thread_in_group = threadIdx.x % 128;
  const int warp_in_group = thread_in_group / 32;
  const int lane = threadIdx.x % 32, t = lane % 4;

  // Q: two threads per row, half a row each, quantized with the row's scale into the swizzled
  // tile; the scale goes to shared memory for the softmax.
  {
    constexpr int kHalf = kHeadDim / 2;
    const int r = warpgroup * 64 + thread_in_group / 2, half = thread_in_group % 2;
    const int row = row0 + r;
    float x[kHalf];
    if (row < p.rows) {
      const uint4* source = reinterpret_cast<const uint4*>(
          p.q + packed_row_offset(row, group, kv_head, p.q_token_stride, kHeadDim) + half * kHalf);
#pragma unroll
      for (int i = 0; i < kHalf / 8; ++i) {
        const uint4 u = source[i];
        const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[8 * i + j] = __bfloat162float(e[j]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kHalf; ++i) x[i] = 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const float scale = scale_of(amax);
#pragma unroll
    for (int c = 0; c < kHalf / 16; ++c) {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float* v = x + 16 * c + 4 * i;
        w[i] = pack_e4m3x4(__fdiv_rn(v[0], scale), __fdiv_rn(v[1], scale), __fdiv_rn(v[2], scale),
                           __fdiv_rn(v[3], scale));
      }
      const uint32_t address = q_tile + sw128_offset(r, half * (kHalf / 16) + c, kBlockM);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(w[0]),
                   "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
    if (half == 0) q_scales[r] = scale;
  }
  fence_proxy_async();
  named_barrier_sync(kQueryBarrier + warpgroup, 128);

  const int local_a = warpgroup * 64 + warp_in_group * 16 + lane / 4;
  const int row_a = row0 + local_a, row_b = row_a + 8;
  const int position_a = p.first_position + row_a / group + shift;  // last slot row a sees
  const int position_b = p.first_position + row_b / group + shift;
  const uint32_t q_rows = q_tile + warpgroup * 64 * kRowBytes;
  const float key_scale = scale_of(p.amax[kv_head]);
  const float value_scale = scale_of(p.amax[p.kv_heads + kv_head]);
  // Each row's softmax scale with its dequantization folded in.
  const float scale_a = p.scale_log2 * key_scale * q_scales[local_a];
  const float scale_b = p.scale_log2 * key_scale * q_scales[local_a + 8];

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  float s[kBlockN / 2];
  uint32_t pa[kBlockN / 32][4];
  WgmmaRowSoftmax<8, Fp8KeyOrder> rows;

  auto issue_scores = [&](int block) {
    const uint32_t k_tile = stage_tiles + (block % kStages) * kStageBytes;
    named_barrier_sync(kFullBarrier + 2 * (block % kStages) + warpgroup, kProducerThreads + 128);
    fence_registers(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 32; ++kk) {
      const uint64_t a = sw128_descriptor(q_rows + kk * 32, 16, 1024);
      const uint64_t b = sw128_descriptor(k_tile + kk * 32, 16, 1024);
      wgmma_m64n128k32_e4m3_ss(s, a, b, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto issue_values = [&](int block) {
    const uint32_t v_tile = stage_tiles + (block % kStages) * kStageBytes + kTileBytes;
    fence_registers(o);
    fence_fragments(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) {
      const uint64_t b = sw128_descriptor(v_tile + kk * 32, 16, 1024);
      if constexpr (kHeadDim == 128) {
        wgmma_m64n128k32_e4m3_rs(o, pa[kk], b);
      } else {
        wgmma_m64n64k32_e4m3_rs(o, pa[kk], b);
      }
    }
    wgmma_commit();
  };
  auto release = [&](int block) {
    if (block + kStages < blocks) named_barrier_arrive(kEmptyBarrier + block % kStages, kThreads);
  };
  // Per-row scales; the weights come out 256 times too large (exponents shifted by 8), and so do
  // the sums, so that P's E4M3 codes stay normal.
  auto softmax = [&](int block) {
    rows.update(s, block * kBlockN, (block + 1) * kBlockN - 1 > min_position + shift, position_a,
                position_b, t, scale_a, scale_b);
  };
  // Rescale O, and pack S into P's A fragments: per group of 32, a thread's scores in columns 2t,
  // 2t+1, 8+2t, 9+2t (and 16 more) hold slots 4t .. 4t+3 (and 16 more), its A columns.
  auto rescale_and_pack = [&] {
    rows.rescale(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 32; ++kk) {
      const float* v = s + 16 * kk;
      pa[kk][0] = pack_e4m3x4(v[0], v[1], v[4], v[5]);
      pa[kk][1] = pack_e4m3x4(v[2], v[3], v[6], v[7]);
      pa[kk][2] = pack_e4m3x4(v[8], v[9], v[12], v[13]);
      pa[kk][3] = pack_e4m3x4(v[10], v[11], v[14], v[15]);
    }
  };

  auto take_turn = [&] { named_barrier_sync(kScheduleBarrier + warpgroup, 256); };
  auto end_turn = [&] { named_barrier_arrive(kScheduleBarrier + 1 - warpgroup, 256); };
  if (warpgroup == 1) end_turn();
  take_turn();
  issue_scores(0);
  end_turn();
  wgmma_wait<0>();
  fence_registers(s);
  softmax(0);
  rescale_and_pack();
  for (int block = 1; block < blocks; ++block) {
    take_turn();
    issue_scores(block);
    issue_values(block - 1);
    end_turn();
    wgmma_wait<1>();
    fence_registers(s);
    softmax(block);
    wgmma_wait<0>();
    fence_registers(o);
    fence_fragments(pa);
    release(block - 1);
    rescale_and_pack();
  }
  take_turn();
  issue_values(blocks - 1);
  if (warpgroup == 0) end_turn();
  wgmma_wait<0>();
  fence_registers(o);
  fence_fragments(pa);

  float inverse_a, inverse_b;
  finish_row_sums(rows.sum_a, rows.sum_b, inverse_a, inverse_b);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? row_a : row_b;
    if (row >= p.rows) continue;
    const float factor = (half == 0 ? inverse_a : inverse_b) * value_scale;
    bf16* out = p.out + packed_row_offset(row, group, kv_head, p.out_token_stride, kHeadDim);
#pragma unroll
    for (int i = 0; i < kTilesD; ++i) {
      *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t) =
          pack_bf16(o[4 * i + 2 * half] * factor, o[4 * i + 2 * half + 1] * factor);
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

}  // namespace
}  // namespace detail

int64_t fp8_staged_stride(int64_t keys) {
  return (keys + detail::kBlockN - 1) / detail::kBlockN * detail::kBlockN;
}

size_t fp8_staged_code_bytes(int64_t kv_heads, int64_t head_dim, int64_t keys) {
  return static_cast<size_t>(2 * kv_heads * head_dim * fp8_staged_stride(keys));
}

void Fp8StagingBuffers::allocate(int64_t kv_heads, int64_t head_dim, int64_t keys) {
  codes.allocate(fp8_staged_code_bytes(kv_heads, head_dim, keys));
  amax.allocate(static_cast<size_t>(2 * kv_heads));
  view.kv_heads = kv_heads;
  view.stride = fp8_staged_stride(keys);
  view.keys = codes.data();
  view.values = codes.data() + kv_heads * view.stride * head_dim;
  view.amax = amax.data();
}

bool fp8_attention_available() { return wgmma_attention_available(); }

bool fp8_attention_supports_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

namespace {

template <int kHeadDim>
void launch_staging(const bf16* key_cache, const bf16* value_cache, int64_t cache_stride,
                    int64_t keys, const Fp8StagedKeys& staged, cudaStream_t stream) {
  const int64_t count = keys * kHeadDim;
  const int64_t vector_blocks = (count / 8 + detail::kAmaxThreads - 1) / detail::kAmaxThreads;
  const dim3 amax_grid(
      static_cast<unsigned>(std::min<int64_t>(vector_blocks, detail::kAmaxBlocksPerHead)),
      static_cast<unsigned>(staged.kv_heads));
  detail::staged_amax_kernel<kHeadDim><<<amax_grid, detail::kAmaxThreads, 0, stream>>>(
      key_cache, value_cache, cache_stride, count, static_cast<int>(staged.kv_heads), staged.amax);
  check_launch("staged_amax_kernel");
  const dim3 grid(static_cast<unsigned>(staged.stride / detail::kKeyGroup),
                  static_cast<unsigned>(staged.kv_heads));
  detail::stage_fp8_keys_kernel<kHeadDim>
      <<<grid, kHeadDim, 0, stream>>>(key_cache, value_cache, cache_stride, keys, staged);
  check_launch("stage_fp8_keys_kernel");
}

// Whether the sparse producer's runs of value copies stay inside one staged stretch of keys.
bool value_runs_fit(const DevicePrefillPlan& plan) {
  return plan.block_size % detail::kValueRun == 0 && plan.segment_size % detail::kValueRun == 0;
}

}  // namespace

void stage_fp8_keys(const bf16* key_cache, const bf16* value_cache, int64_t cache_stride,
                    int64_t head_dim, int64_t keys, const Fp8StagedKeys& staged,
                    cudaStream_t stream) {
  const std::string prefix = "FP8 attention staging: ";
  if (!fp8_attention_supports_head_dim(head_dim))
    throw Error(prefix + "head_dim " + std::to_string(head_dim) + " (64 or 128 are supported)");
  if (keys <= 0 || keys > cache_stride || staged.stride < fp8_staged_stride(keys) ||
      staged.stride % detail::kBlockN != 0 || staged.kv_heads <= 0) {
    throw Error(prefix + std::to_string(keys) + " keys do not fit cache stride " +
                std::to_string(cache_stride) + " and staged stride " +
                std::to_string(staged.stride));
  }
  check(cudaMemsetAsync(staged.amax, 0, sizeof(float) * 2 * staged.kv_heads, stream),
        "FP8 staging amax");
  if (head_dim == 128) {
    launch_staging<128>(key_cache, value_cache, cache_stride, keys, staged, stream);
  } else {
    launch_staging<64>(key_cache, value_cache, cache_stride, keys, staged, stream);
  }
}

namespace {

// The dense kernel's parameters for a call, checked; Error naming what does not fit.
detail::Fp8FlashParams fp8_params(const bf16* q, const Fp8StagedKeys& staged,
                                  const FlashShape& shape, bf16* out, const std::string& prefix) {
  if (!fp8_attention_available()) throw Error(prefix + "needs a Hopper GPU and a build for sm_90a");
  if (!fp8_attention_supports_head_dim(shape.head_dim))
    throw Error(prefix + "head_dim " + std::to_string(shape.head_dim) +
                " (64 or 128 are supported)");
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0 ||
      shape.kv_heads != staged.kv_heads) {
    throw Error(prefix + std::to_string(shape.q_heads) + " query heads over " +
                std::to_string(shape.kv_heads) +
                " KV heads (staged: " + std::to_string(staged.kv_heads) + ")");
  }
  if (shape.device_position != nullptr) throw Error(prefix + "runs prompt queries only");
  if (shape.first_position + shape.tokens > staged.stride)
    throw Error(prefix + "queries see keys past the staged " + std::to_string(staged.stride));
  detail::Fp8FlashParams p;
  p.q = q;
  p.k = staged.keys;
  p.vt = staged.values;
  p.amax = staged.amax;
  p.out = out;
  const int64_t width = shape.q_heads * shape.head_dim;
  p.q_token_stride = shape.q_token_stride != 0 ? shape.q_token_stride : width;
  p.out_token_stride = shape.out_token_stride != 0 ? shape.out_token_stride : width;
  p.stride = staged.stride;
  p.kv_heads = static_cast<int>(shape.kv_heads);
  p.group = static_cast<int>(shape.q_heads / shape.kv_heads);
  p.rows = static_cast<int>(shape.tokens * p.group);
  p.first_position = static_cast<int>(shape.first_position);
  const float scale =
      shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  return p;
}

template <int kHeadDim, bool kSparse>
void launch_fp8(const detail::Fp8KernelParams<kSparse>& p, cudaStream_t stream) {
  constexpr int kSharedBytes = kSparse ? detail::kSparseSharedBytes : detail::kSharedBytes;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(detail::flash_fp8_kernel<kHeadDim, kSparse>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
          "cudaFuncSetAttribute(flash_fp8_kernel)");
    return true;
  }();
  (void)configured;
  const int64_t row_blocks = (static_cast<int64_t>(p.rows) + detail::kBlockM - 1) / detail::kBlockM;
  const dim3 grid = kSparse ? dim3(static_cast<unsigned>(row_blocks * p.kv_heads))
                            : dim3(static_cast<unsigned>(row_blocks), p.kv_heads);
  detail::flash_fp8_kernel<kHeadDim, kSparse><<<grid, detail::kThreads, kSharedBytes, stream>>>(p);
  check_launch(kSparse ? "flash_fp8_kernel (block-sparse)" : "flash_fp8_kernel");
}

template <bool kSparse>
void launch_fp8(const detail::Fp8KernelParams<kSparse>& p, int64_t head_dim, cudaStream_t stream) {
  head_dim == 128 ? launch_fp8<128, kSparse>(p, stream) : launch_fp8<64, kSparse>(p, stream);
}

}  // namespace

void flash_prefill_fp8(const bf16* q, const Fp8StagedKeys& staged, const FlashShape& shape,
                       bf16* out, cudaStream_t stream) {
  const detail::Fp8FlashParams p = fp8_params(q, staged, shape, out, "FP8 attention: ");
  if (shape.tokens == 0) return;
  launch_fp8<false>(p, shape.head_dim, stream);
}

bool fp8_block_sparse_fits(const DevicePrefillPlan& plan, int64_t q_heads, int64_t kv_heads) {
  if (plan.dense) return true;
  return kv_heads > 0 && value_runs_fit(plan) &&
         detail::sparse_tile_rows_fit(plan, q_heads / kv_heads, detail::kBlockM);
}

void flash_prefill_block_sparse_fp8(const bf16* q, const Fp8StagedKeys& staged,
                                    const FlashShape& shape, const DevicePrefillPlan& plan,
                                    bf16* out, cudaStream_t stream, unsigned long long* keys_read) {
  const std::string prefix = "FP8 block-sparse attention: ";
  if (plan.dense) {
    flash_prefill_fp8(q, staged, shape, out, stream);
    return;
  }
  detail::Fp8SparseParams p;
  static_cast<detail::Fp8FlashParams&>(p) = fp8_params(q, staged, shape, out, prefix);
  static_cast<detail::SparsePlanFields&>(p) =
      detail::sparse_plan_fields(shape, plan, keys_read, prefix);
  if (!value_runs_fit(plan)) {
    throw Error(prefix + "block size " + std::to_string(plan.block_size) + " and segment size " +
                std::to_string(plan.segment_size) + " must be multiples of " +
                std::to_string(detail::kValueRun) + " (values are copied in runs of " +
                std::to_string(detail::kValueRun) + " keys)");
  }
  if (!detail::sparse_tile_rows_fit(plan, p.group, detail::kBlockM)) {
    throw Error(prefix + detail::sparse_tile_rows_rule(plan, p.group) +
                std::to_string(detail::kBlockM) +
                ", so that every tile of rows lies in one segment");
  }
  if (shape.tokens == 0) return;
  launch_fp8<true>(p, shape.head_dim, stream);
}

}  // namespace entropyinfer::cuda

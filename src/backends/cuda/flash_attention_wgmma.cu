// Hopper (sm_90a) causal prefill: FlashAttention with wgmma. One CTA computes 128 packed query rows
// of one KV head: two consumer warpgroups own 64 rows each and a producer warp streams 128-key K
// and V tiles through a ring of shared-memory stages. Tiles sit in the 128-byte-swizzled layout the
// wgmma descriptors name: S = Q K^T reads both operands from shared memory (K-major); O += P V
// takes P from registers (the accumulator layout of S converts to the A-operand layout in place)
// and V N-major from shared memory. Named barriers hand stages between producer and consumers
// ("full" per stage and warpgroup, "empty" per stage). In the pipelined kernel the two warpgroups
// take turns to issue their products (ping-pong), so that one's softmax overlaps the other's
// matrix products.
//
// The block-sparse variant (kSparse) runs the same pipeline over a tile's virtual key sequence
// (detail::SparseKeys): the producer looks each slot's cache row up in a small table it fills one
// tile ahead, and the consumers mask slots exactly as the dense kernel masks positions.
#include <string>

#include "backends/cuda/flash_attention_internal.cuh"
#include "backends/cuda/wgmma_device.cuh"

namespace entropyinfer::cuda::detail {
namespace {

constexpr int kBlockM = 128;  // query rows per CTA: two warpgroups of 64
constexpr int kBlockN = 128;  // keys per tile
constexpr int kConsumerThreads = 256;
constexpr int kProducerThreads = 128;  // a whole warpgroup, so that it can give its registers away
constexpr int kThreads = kConsumerThreads + kProducerThreads;
// 128 * 40 + 256 * 232 <= 65536 registers of a multiprocessor.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kStages = 3;

template <int kHeadDim>
struct WgmmaLayout {
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K tile, then V tile
  static constexpr int kSharedBytes =
      kQBytes + kStages * kStageBytes + 1024;  // + room to align to 1024
  // Named barrier ids (0 is __syncthreads'; 16 in all).
  // + 2 * stage + warpgroup: the producer filled the stage. One per warpgroup, so that a
  // warpgroup waits for the data alone and the two can run half an iteration apart.
  static constexpr int kFullBarrier = 1;
  static constexpr int kEmptyBarrier =
      1 + 2 * kStages;  // + stage: both warpgroups are done with it
  static constexpr int kQueryBarrier = 1 + 3 * kStages;  // + warpgroup: its Q rows are in place
  // Sparse only: the producer's table of cache rows, two tiles of kBlockN ints after the stages
  // (231424 bytes in all for head_dim 128, within the 232448 a block may have).
  static constexpr int kTableBarrier = 3 + 3 * kStages;  // the producer wrote the next table
  // + warpgroup: that warpgroup's turn to issue its matrix products (the pipelined kernel).
  static constexpr int kScheduleBarrier = 4 + 3 * kStages;
  static_assert(kScheduleBarrier + 1 < 16, "a CTA has 16 named barriers");
  static constexpr int kTableBytes = 2 * kBlockN * 4;
  static constexpr int kSparseSharedBytes = kSharedBytes + kTableBytes;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// D (64 x 128, fp32) = (scale_d ? D : 0) + A * B; A and B K-major bf16 in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b,
                                                    int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ENTROPYINFER_WGMMA_D64
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : ENTROPYINFER_WGMMA_D64_OPERANDS(d)
      : "l"(a), "l"(b), "r"(scale_d));
}

// D (64 x 128, fp32) += A * B; A bf16 in registers (per warp the m16n8k16 A layout), B N-major
// (transposed) bf16 in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], const uint32_t (&a)[4],
                                                       uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ENTROPYINFER_WGMMA_D64
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : ENTROPYINFER_WGMMA_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// D (64 x 64, fp32) += A * B; A bf16 in registers (per warp the m16n8k16 A layout), B N-major
// (transposed) bf16 in shared memory.
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float (&d)[32], const uint32_t (&a)[4],
                                                      uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ENTROPYINFER_WGMMA_D32
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : ENTROPYINFER_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// Both warpgroups' "full" barriers of a stage: 128 producer threads and one warpgroup each.
template <int kHeadDim>
__device__ __forceinline__ void hand_over_stage(int stage) {
  named_barrier_arrive(WgmmaLayout<kHeadDim>::kFullBarrier + 2 * stage, kProducerThreads + 128);
  named_barrier_arrive(WgmmaLayout<kHeadDim>::kFullBarrier + 2 * stage + 1, kProducerThreads + 128);
}

template <int kHeadDim>
__device__ __forceinline__ void producer_loop(const FlashParams& p, uint32_t stage_tiles,
                                              int kv_head, int blocks, int max_position) {
  using Layout = WgmmaLayout<kHeadDim>;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowsPerPass =
      kProducerThreads / kChunks;  // rows one pass of 16-byte copies covers
  const int producer = threadIdx.x - kConsumerThreads;
  const int lane_row = producer / kChunks, chunk = producer % kChunks;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * p.cache_stride * kHeadDim;
  const bf16* k_thread = p.k + head_offset + lane_row * kHeadDim + chunk * 8;
  const bf16* v_thread = p.v + head_offset + lane_row * kHeadDim + chunk * 8;
  // Passes advance by a multiple of 8 rows, so this thread's swizzled column never changes.
  const uint32_t thread_offset =
      (chunk >> 3) * kBlockN * 128 + lane_row * 128 + (((chunk & 7) ^ (lane_row & 7)) << 4);
  for (int block = 0; block < blocks; ++block) {
    const int stage = block % kStages;
    if (block >= kStages) named_barrier_sync(Layout::kEmptyBarrier + stage, kThreads);
    const uint32_t k_tile = stage_tiles + stage * Layout::kStageBytes + thread_offset;
    const uint32_t v_tile = k_tile + Layout::kTileBytes;
    const int64_t block_offset = static_cast<int64_t>(block) * kBlockN * kHeadDim;
    const bool whole = (block + 1) * kBlockN - 1 <= max_position;
#pragma unroll 4  // fully unrolled, the addresses would not fit the producer's few registers
    for (int pass = 0; pass < kBlockN / kRowsPerPass; ++pass) {
      const uint32_t offset = pass * kRowsPerPass * 128;
      const int64_t source = block_offset + static_cast<int64_t>(pass) * kRowsPerPass * kHeadDim;
      // Keys past the last position are masked; zero-filled so that 0 * V stays finite.
      const bool valid = whole || block * kBlockN + pass * kRowsPerPass + lane_row <= max_position;
      cp_async_16(k_tile + offset, valid ? k_thread + source : p.k, valid ? 16 : 0);
      cp_async_16(v_tile + offset, valid ? v_thread + source : p.v, valid ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    hand_over_stage<kHeadDim>(stage);
  }
}

// The sparse producer: slot s of a tile may come from anywhere before the segment, so each thread
// first writes the cache row of one slot of the tile into a shared table (looked up one tile ahead,
// so that the index load overlaps the previous tile's copies), and every pass reads its rows there.
// The table has two halves: a half is rewritten two tiles later, after every producer thread has
// passed the next tile's table barrier, hence after it finished reading.
template <int kHeadDim>
__device__ __forceinline__ void sparse_producer_loop(const FlashParams& p, uint32_t stage_tiles,
                                                     int* table, int kv_head, int blocks,
                                                     const SparseKeys& keys) {
  using Layout = WgmmaLayout<kHeadDim>;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowsPerPass = kProducerThreads / kChunks;
  constexpr int kPasses = kBlockN / kRowsPerPass;
  constexpr int kBatch = 4;  // table reads issued together before their copies
  const int producer = threadIdx.x - kConsumerThreads;
  const int lane_row = producer / kChunks, chunk = producer % kChunks;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * p.cache_stride * kHeadDim + chunk * 8;
  const bf16* k_thread = p.k + head_offset;
  const bf16* v_thread = p.v + head_offset;
  const uint32_t thread_offset =
      (chunk >> 3) * kBlockN * 128 + lane_row * 128 + (((chunk & 7) ^ (lane_row & 7)) << 4);
  int next_row = keys.key_row(producer);
  for (int block = 0; block < blocks; ++block) {
    const int stage = block % kStages;
    int* rows = table + (block & 1) * kBlockN;
    rows[producer] = next_row;
    named_barrier_sync(Layout::kTableBarrier, kProducerThreads);
    if (block >= kStages) named_barrier_sync(Layout::kEmptyBarrier + stage, kThreads);
    if (block + 1 < blocks) next_row = keys.key_row((block + 1) * kBlockN + producer);
    const uint32_t k_tile = stage_tiles + stage * Layout::kStageBytes + thread_offset;
    const uint32_t v_tile = k_tile + Layout::kTileBytes;
#pragma unroll 1
    for (int batch = 0; batch < kPasses; batch += kBatch) {
      int row[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) row[i] = rows[(batch + i) * kRowsPerPass + lane_row];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const uint32_t offset = (batch + i) * kRowsPerPass * 128;
        // Slots past the end (row -1) are masked; zero-filled so that 0 * V stays finite.
        const bool valid = row[i] >= 0;
        const int64_t source = static_cast<int64_t>(valid ? row[i] : 0) * kHeadDim;
        cp_async_16(k_tile + offset, k_thread + source, valid ? 16 : 0);
        cp_async_16(v_tile + offset, v_thread + source, valid ? 16 : 0);
      }
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    hand_over_stage<kHeadDim>(stage);
  }
}

// Hands registers from the producer warpgroup (which needs few) to the consumers (which hold S, P
// and O).
__device__ __forceinline__ void producer_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
}
__device__ __forceinline__ void consumer_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// kPipelined: each warpgroup issues S(j+1) = Q K(j+1)^T and O += P(j) V(j) before the softmax of
// S(j+1), so that the softmax runs while the tensor cores work (FlashAttention-3's intra-warpgroup
// overlap); otherwise each step waits for its own products. kSparse: block-sparse prefill (see
// SparseKeys); the grid is then one-dimensional, row blocks latest first with the KV heads of each
// side by side (the last, densest segment starts first; the CTAs of one segment share its blocks).
template <int kHeadDim, bool kPipelined, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_kernel(const KernelParams<kSparse> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Layout = WgmmaLayout<kHeadDim>;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kTilesD = kHeadDim / 8;  // 8-wide column tiles of O
  extern __shared__ __align__(1024) uint8_t shared_raw[];
  const uint32_t q_tile = (shared_address(shared_raw) + 1023u) & ~1023u;
  const uint32_t stage_tiles = q_tile + Layout::kQBytes;

  const int2 origin = prefill_tile_origin<kSparse>(p.kv_heads, kBlockM);
  const int kv_head = origin.x, row0 = origin.y;
  const int group = p.group;
  const int last_row = min(row0 + kBlockM, p.rows) - 1;
  const int min_position = p.first_position + row0 / group;
  const int max_position = p.first_position + last_row / group;
  // Key slots: position x sits in slot x + shift (0 when dense), so the masks and the tile count
  // below read the same for both.
  SparseKeys keys;
  int shift = 0;
  if constexpr (kSparse) {
    keys = sparse_keys(p, kv_head, min_position, max_position);
    shift = keys.shift();
    if (threadIdx.x == 0) count_tile_keys(p, keys, group, row0, last_row, p.first_position);
  }
  const int blocks = (max_position + shift + kBlockN) / kBlockN;

  if (threadIdx.x >= kConsumerThreads) {
    producer_registers();
    if constexpr (kSparse) {
      const uint32_t table = stage_tiles + kStages * Layout::kStageBytes;
      sparse_producer_loop<kHeadDim>(
          p, stage_tiles, reinterpret_cast<int*>(shared_raw + (table - shared_address(shared_raw))),
          kv_head, blocks, keys);
    } else {
      producer_loop<kHeadDim>(p, stage_tiles, kv_head, blocks, max_position);
    }
    return;
  }
  consumer_registers();

  const int warpgroup = threadIdx.x / 128;
  const int thread_in_group = threadIdx.x % 128;
  const int warp_in_group = thread_in_group / 32;
  const int lane = threadIdx.x % 32, t = lane % 4;

  for (int index = thread_in_group; index < 64 * kChunks; index += 128) {
    const int r = warpgroup * 64 + index / kChunks, c = index % kChunks;
    const int row = row0 + r;
    const bool valid = row < p.rows;
    const bf16* source =
        valid ? p.q + packed_row_offset(row, group, kv_head, p.q_token_stride, kHeadDim) + c * 8
              : p.q;
    cp_async_16(q_tile + sw128_offset(r, c, kBlockM), source, valid ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  named_barrier_sync(Layout::kQueryBarrier + warpgroup, 128);

  const int row_a = row0 + warpgroup * 64 + warp_in_group * 16 + lane / 4, row_b = row_a + 8;
  const int position_a = p.first_position + row_a / group + shift;  // last slot row a sees
  const int position_b = p.first_position + row_b / group + shift;
  const uint32_t q_rows = q_tile + warpgroup * 64 * 128;

  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  float s[kBlockN / 2];
  uint32_t pa[kBlockN / 16][4];
  WgmmaRowSoftmax<0> rows;

  // S = Q K(block)^T, issued asynchronously once the producer has filled the block's stage.
  auto issue_scores = [&](int block) {
    const uint32_t k_tile = stage_tiles + (block % kStages) * Layout::kStageBytes;
    named_barrier_sync(Layout::kFullBarrier + 2 * (block % kStages) + warpgroup,
                       kProducerThreads + 128);
    fence_registers(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint32_t offset = (kk & 3) * 32;  // 16-element K slices inside a 128-byte row
      const uint64_t a = sw128_descriptor(q_rows + (kk >> 2) * kBlockM * 128 + offset, 16, 1024);
      const uint64_t b = sw128_descriptor(k_tile + (kk >> 2) * kBlockN * 128 + offset, 16, 1024);
      wgmma_m64n128k16_ss(s, a, b, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // O += P V(block), asynchronously.
  auto issue_values = [&](int block) {
    const uint32_t v_tile =
        stage_tiles + (block % kStages) * Layout::kStageBytes + Layout::kTileBytes;
    fence_registers(o);
    fence_fragments(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      // Keys 16kk.. of V: 8-key groups 1024 bytes apart, 64-column blocks kBlockN * 128 bytes
      // apart.
      const uint64_t b = sw128_descriptor(v_tile + kk * 16 * 128, kBlockN * 128, 1024);
      if constexpr (kHeadDim == 128) {
        wgmma_m64n128k16_rs_tb(o, pa[kk], b);
      } else {
        wgmma_m64n64k16_rs_tb(o, pa[kk], b);
      }
    }
    wgmma_commit();
  };
  auto release = [&](int block) {
    if (block + kStages < blocks)
      named_barrier_arrive(Layout::kEmptyBarrier + block % kStages, kThreads);
  };
  // Online softmax of S in place: mask, new running maxima, exponentials, sums; the factors that
  // rescale O are kept for when O is free.
  auto softmax = [&](int block) {
    rows.update(s, block * kBlockN, (block + 1) * kBlockN - 1 > min_position + shift, position_a,
                position_b, t, p.scale_log2, p.scale_log2);
  };
  // Once no product reads O and P: rescale O, and turn S into the next P (bf16 A fragments).
  auto rescale_and_pack = [&] {
    rows.rescale(o);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  if constexpr (kPipelined) {
    // Ping-pong (FlashAttention-3): the warpgroups take turns to issue their products, so that
    // one's products run on the tensor cores while the other computes its softmax. A turn ends
    // with the other warpgroup's barrier; warpgroup 0 has the first turn, and warpgroup 1 does not
    // hand over after its last, which nobody would wait for.
    auto take_turn = [&] { named_barrier_sync(Layout::kScheduleBarrier + warpgroup, 256); };
    auto end_turn = [&] { named_barrier_arrive(Layout::kScheduleBarrier + 1 - warpgroup, 256); };
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
      wgmma_wait<1>();  // the scores are in; P V of the previous block may still run
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
  } else {
    for (int block = 0; block < blocks; ++block) {
      issue_scores(block);
      wgmma_wait<0>();
      fence_registers(s);
      softmax(block);
      rescale_and_pack();
      issue_values(block);
      wgmma_wait<0>();
      fence_registers(o);
      fence_fragments(pa);
      release(block);
    }
  }

  float inverse_a, inverse_b;  // zeros for an empty cache or split
  finish_row_sums(rows.sum_a, rows.sum_b, inverse_a, inverse_b);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? row_a : row_b;
    if (row >= p.rows) continue;
    const float inverse = half == 0 ? inverse_a : inverse_b;
    bf16* out = p.out + packed_row_offset(row, group, kv_head, p.out_token_stride, kHeadDim);
#pragma unroll
    for (int i = 0; i < kTilesD; ++i) {
      *reinterpret_cast<uint32_t*>(out + 8 * i + 2 * t) =
          pack_bf16(o[4 * i + 2 * half] * inverse, o[4 * i + 2 * half + 1] * inverse);
    }
  }
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

template <int kHeadDim, bool kPipelined, bool kSparse>
void launch(const KernelParams<kSparse>& params, cudaStream_t stream) {
  using Layout = WgmmaLayout<kHeadDim>;
  constexpr int kSharedBytes = kSparse ? Layout::kSparseSharedBytes : Layout::kSharedBytes;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(flash_wgmma_kernel<kHeadDim, kPipelined, kSparse>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes),
          "cudaFuncSetAttribute(flash_wgmma_kernel)");
    return true;
  }();
  (void)configured;
  const int64_t row_blocks = (static_cast<int64_t>(params.rows) + kBlockM - 1) / kBlockM;
  const dim3 grid = kSparse ? dim3(static_cast<unsigned>(row_blocks * params.kv_heads))
                            : dim3(static_cast<unsigned>(row_blocks), params.kv_heads);
  flash_wgmma_kernel<kHeadDim, kPipelined, kSparse>
      <<<grid, kThreads, kSharedBytes, stream>>>(params);
  check_launch(kSparse ? "flash_wgmma_kernel (block-sparse)" : "flash_wgmma_kernel");
}

template <bool kSparse>
void launch_any(const KernelParams<kSparse>& params, int head_dim, bool pipelined,
                cudaStream_t stream) {
  if (head_dim == 128) {
    pipelined ? launch<128, true, kSparse>(params, stream)
              : launch<128, false, kSparse>(params, stream);
  } else {
    pipelined ? launch<64, true, kSparse>(params, stream)
              : launch<64, false, kSparse>(params, stream);
  }
}

}  // namespace

bool wgmma_kernel_compiled() {
#if defined(ENTROPYINFER_HAS_SM90A)
  return true;
#else
  return false;
#endif
}

void launch_wgmma_prefill(const FlashParams& params, int head_dim, bool pipelined,
                          cudaStream_t stream) {
  launch_any<false>(params, head_dim, pipelined, stream);
}

void launch_wgmma_sparse_prefill(const SparseFlashParams& params, int head_dim, bool pipelined,
                                 cudaStream_t stream) {
  launch_any<true>(params, head_dim, pipelined, stream);
}

}  // namespace entropyinfer::cuda::detail

// In-house attention kernels over a head-major bf16 KV cache, the CUDA counterpart of
// cpu::causal_attention (same shapes and meaning, window excepted):
//   q:   bf16 queries of `tokens` new tokens at positions first_position..; query head h of
//        token t at q + t * q_token_stride + h * head_dim
//   key_cache / value_cache: bf16, per KV head a [cache_stride, head_dim] slab; rows 0 ..
//        first_position + tokens - 1 must be filled
//   out: bf16, head h of token t at out + t * out_token_stride + h * head_dim
// Query t sees keys 0 .. first_position + t. Softmax in fp32 with the log2 trick, fp32
// accumulation, the score matrix is never materialised. The query heads that share a KV head are
// packed into the rows of one tile (row r = token r / group, head r % group), so every K/V tile
// read serves the whole group.
//
// Kernels:
//   kMma:   FlashAttention-2 style, mma.sync m16n8k16 tensor-core instructions (sm_80 and later),
//           4 warps x 16 rows, K/V tiles of 64 keys double-buffered with cp.async.
//   kWgmma: Hopper (sm_90a): two consumer warpgroups of 64 rows issue wgmma on 128-key tiles that
//           a producer warpgroup streams into 128-byte-swizzled shared memory (cp.async, named
//           barriers, three stages); each consumer overlaps its softmax with its next products.
//   kWgmmaSimple: the same without that overlap (each step waits for its products), kept as the
//           reference the overlapped schedule is tested and measured against.
// Block-sparse prefill (flash_prefill_block_sparse) runs the same prefill kernels over a
// virtual key sequence per tile of rows: the selected blocks of its (KV head, segment) row, read
// straight from the cache, then the segment's own keys; work follows the keys read.
// Decode: split-KV flash-decoding (one warp per KV head and split, 32-key tiles four stages
// deep); each split writes fp32 partial outputs and their log-sum-exp, and a second kernel merges
// the splits.
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"
#include "backends/cuda/device_plans.h"

namespace entropyinfer::cuda {

struct FlashShape {
  int64_t tokens = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 64 or 128
  int64_t first_position = 0;
  int64_t cache_stride = 0;
  int64_t q_token_stride = 0;    // 0 means q_heads * head_dim
  int64_t out_token_stride = 0;  // 0 means q_heads * head_dim
  float scale = 0.0f;            // 0 means 1 / sqrt(head_dim)
  // flash_decode only: when set, the kernels read first_position from this device int when they
  // run, so that one captured CUDA graph serves every position. first_position must then be the
  // largest position the launch will see (it sizes the splits and is checked against cache_stride).
  const int* device_position = nullptr;
};

enum class FlashKernel { kAuto, kMma, kWgmma, kWgmmaSimple };

// True when the library holds the sm_90a kernel and the current device can run it.
bool wgmma_attention_available();

// Causal attention of `tokens` queries (a whole prompt, or one chunk of it after first_position
// cached tokens). kAuto picks kWgmma where available. Throws Error on unsupported shapes (head_dim
// not 64 or 128, q_heads not a multiple of kv_heads) or when kWgmma is asked for and unavailable.
void flash_prefill(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                   const FlashShape& shape, bf16* out, cudaStream_t stream,
                   FlashKernel kernel = FlashKernel::kAuto);

// Causal attention of the prompt queries at positions first_position .. first_position+tokens-1
// (the whole prompt, or a range of it that starts on a segment) under `plan`, which describes the
// whole prompt: exactly cpu::block_sparse_attention's semantics. A query of a sparse segment
// attends to every key of its (KV head, segment) row's selected blocks (all end before the
// segment) plus its own segment's keys up to itself; a query of a dense segment, or every query
// when plan.dense, attends causally to all keys. plan.dense -> same as flash_prefill.
//
// A tile of packed rows must lie in one segment: segment_size * (q_heads / kv_heads) must be a
// multiple of 128 for kWgmma / kWgmmaSimple and of 64 for kMma (kAuto takes kWgmma where it is
// available and fits, else kMma; Error when none fits). block_size may be any positive value. The
// plan's arrays are read on the device when the kernel runs (no host synchronisation), so their
// contents are not validated here: block indices must satisfy the plan's invariants
// (cpu::block_sparse_attention checks them); a selected key outside 0 .. segment start - 1 reads as
// zeros rather than memory outside the prompt. Throws Error for a plan whose shape does not match
// the call. With keys_read set, the kernel adds to that device counter the (query, key) pairs its
// masks admitted, summed over query heads: the keys it actually read (a dense plan adds nothing).
void flash_prefill_block_sparse(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                                const FlashShape& shape, const DevicePrefillPlan& plan, bf16* out,
                                cudaStream_t stream, FlashKernel kernel = FlashKernel::kAuto,
                                unsigned long long* keys_read = nullptr);

// FP8 prefill attention (Hopper, head_dim 64 or 128), as FlashAttention-3 runs it in FP8: the
// layer's keys and values are staged once as E4M3 codes with one scale per KV head
// (stage_fp8_keys), the queries are quantized per (token, head) row as each tile loads them, and
// both products run on the FP8 tensor cores: S = Q K^T, then O += P V with the softmax weights P
// scaled by 256 and rounded to E4M3 (the scale keeps weights down to 2^-14 of the row's maximum in
// E4M3's normal range). Scores, maxima, sums and O stay fp32. FP8's P V product takes its B operand
// K-major, so the values are staged transposed within runs of 8 keys, keys contiguous: the dense
// and the block-sparse kernels both copy whole runs.
struct Fp8StagedKeys {
  uint8_t* keys = nullptr;    // [kv_heads][stride][head_dim]
  uint8_t* values = nullptr;  // [kv_heads][stride / 8][head_dim][8]
  float* amax = nullptr;      // [2][kv_heads]: the largest |key| and |value| of each KV head
  int64_t kv_heads = 0;
  int64_t stride = 0;  // key rows, a multiple of 128; those past the staged keys hold zeros
};
// Key rows a staging of `keys` keys holds, and the bytes of its codes (keys and values).
int64_t fp8_staged_stride(int64_t keys);
size_t fp8_staged_code_bytes(int64_t kv_heads, int64_t head_dim, int64_t keys);
// Device memory for a staging of up to `keys` keys, and the view of it the kernels take.
struct Fp8StagingBuffers {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> amax;
  Fp8StagedKeys view;

  Fp8StagingBuffers() = default;
  Fp8StagingBuffers(int64_t kv_heads, int64_t head_dim, int64_t keys) {
    allocate(kv_heads, head_dim, keys);
  }
  void allocate(int64_t kv_heads, int64_t head_dim, int64_t keys);
};
// True when the library holds the FP8 kernel and the current device can run it.
bool fp8_attention_available();
bool fp8_attention_supports_head_dim(int64_t head_dim);  // 64 or 128
// Quantizes keys 0 .. keys-1 of every KV head of a bf16 cache (the layout flash_prefill reads) into
// `staged`, whose stride must cover them. Error for another head_dim or a short stride.
void stage_fp8_keys(const bf16* key_cache, const bf16* value_cache, int64_t cache_stride,
                    int64_t head_dim, int64_t keys, const Fp8StagedKeys& staged,
                    cudaStream_t stream);
// flash_prefill over staged keys (the shape's cache_stride is ignored; every key a query sees must
// be staged). Error for an unsupported shape or where fp8_attention_available() is false.
void flash_prefill_fp8(const bf16* q, const Fp8StagedKeys& staged, const FlashShape& shape,
                       bf16* out, cudaStream_t stream);
// flash_prefill_block_sparse over staged keys, in FP8 as flash_prefill_fp8 (the same semantics,
// plan checks and key count); plan.dense runs flash_prefill_fp8. It copies the values of 8 keys at
// a time (a staged run), so block and segment sizes must be multiples of 8, and segment_size *
// (q_heads / kv_heads) a multiple of 128: fp8_block_sparse_fits says whether a plan qualifies
// (Error if not).
bool fp8_block_sparse_fits(const DevicePrefillPlan& plan, int64_t q_heads, int64_t kv_heads);
void flash_prefill_block_sparse_fp8(const bf16* q, const Fp8StagedKeys& staged,
                                    const FlashShape& shape, const DevicePrefillPlan& plan,
                                    bf16* out, cudaStream_t stream,
                                    unsigned long long* keys_read = nullptr);

// Split-KV decoding for few queries (one new token per sequence, or a handful) over a long cache.
// splits 0 picks a count that fills the GPU. The workspace holds the partial results: at least
// flash_decode_workspace_floats(shape, splits) floats (zero when splits resolves to 1).
int flash_decode_splits(const FlashShape& shape, int requested_splits = 0);
size_t flash_decode_workspace_floats(const FlashShape& shape, int splits);
void flash_decode(const bf16* q, const bf16* key_cache, const bf16* value_cache,
                  const FlashShape& shape, bf16* out, float* workspace, size_t workspace_floats,
                  cudaStream_t stream, int splits = 0);

}  // namespace entropyinfer::cuda

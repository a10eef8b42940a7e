// The q/k/v epilogue of a layer-by-layer prefill in one pass over the fused q/k/v rows: RoPE on the
// query heads (written to the prompt-wide query rows), RoPE on the key heads written straight into
// the key cache, the value heads copied into the value cache, and, for a sparse prefill, the
// statistics EntropyInfer's estimate reads (docs/method.md 2.1-2.2): the segment midpoints of the
// rotated queries and the block extrema of the rotated keys.
//
// It does what apply_rope_queries_out, append_kv, PrefillEstimator::record_key_blocks and the
// estimate's midpoint kernel do one after the other (and gives the same bits: the extrema are
// taken of the bf16 values written, and max/min do not depend on order), without reading the
// keys back from the cache or the queries back from their rows. The CPU reference is the same
// chain: apply_rope (engine/rope.h), block_key_extrema and segment_query_extrema
// (attention/entropy_prefill.h).
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_common.h"

namespace entropyinfer::cuda {

// Where the statistics go: PrefillEstimator's layouts (see PrefillEstimator::fused_stats).
struct PrefillQkvStats {
  float* query_midpoints = nullptr;  // [kv_head][padded_dim][midpoint_row_stride]
  int64_t midpoint_row_stride = 0;   // row = segment * group + member
  bf16* key_extrema = nullptr;       // [kv_head][max, min][padded_dim][block_stride]
  int64_t block_stride = 0;
  int padded_dim = 0;
  int segment_size = 0;
  int block_size = 0;
};

struct PrefillQkvShape {
  int64_t tokens = 0;        // rows of this call
  int64_t token_stride = 0;  // elements between fused rows (q heads, then k heads, then v heads)
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  bool adjacent_pairs = false;  // rotate (x[2i], x[2i+1]) instead of (x[i], x[i + head_dim/2])
  int64_t q_out_stride = 0;     // elements between rows of q_out
  int64_t cache_stride = 0;     // rows per KV head in the caches
  int64_t first_position = 0;   // cache row (and angle row) of the call's first token
};

// Whether the fused pass handles this shape: full rotation, head_dim a multiple of 8 up to 256,
// 16-byte aligned rows and tables. With stats also: first_position a multiple of segment_size.
// Otherwise use the separate kernels. A call with stats must also end on a segment boundary or at
// the prompt's end (the caller's to know): a segment's midpoints are those of the rows one call
// sees.
bool prefill_qkv_epilogue_fits(const bf16* qkv, const PrefillQkvShape& shape, int rotary_dim,
                               const float* cos, const float* sin, const bf16* q_out,
                               const PrefillQkvStats* stats);

// cos/sin: the angle tables from the call's first token on ([tokens][head_dim / 2]). qkv is read
// only. stats may be null (no statistics). Throws Error when the shape does not fit.
void prefill_qkv_epilogue(const bf16* qkv, const PrefillQkvShape& shape, const float* cos,
                          const float* sin, bf16* q_out, bf16* key_cache, bf16* value_cache,
                          const PrefillQkvStats* stats, cudaStream_t stream);

}  // namespace entropyinfer::cuda

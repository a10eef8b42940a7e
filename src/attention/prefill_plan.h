// A prefill plan says, for one layer, which key blocks each (KV head, query segment) reads;
// backends run it. The layout is FlashInfer's block-sparse CSR: one row per (KV head, segment),
// row_offsets into a flat list of key-block indices. A segment that is not sparse reads everything
// before it densely; every segment always reads its own keys causally.
#pragma once

#include <cstdint>
#include <vector>

namespace entropyinfer {

struct LayerPrefillPlan {
  bool dense = true;  // the whole layer runs full attention (no rows below)
  int64_t num_tokens = 0;
  int num_kv_heads = 0;
  int segment_size = 0;
  int block_size = 0;
  int num_segments = 0;
  std::vector<uint8_t> segment_sparse;  // [num_segments]: 1 if this segment reads only its blocks
  // CSR over rows r = kv_head * num_segments + segment, rows of dense segments empty.
  std::vector<int32_t> row_offsets;    // [num_kv_heads * num_segments + 1]
  std::vector<int32_t> block_indices;  // ascending within a row; block j = keys [j*b, (j+1)*b)
  // What the estimate saw, for inspection (filled by estimating policies; empty otherwise).
  std::vector<float> entropy;          // [num_kv_heads * num_segments]
  std::vector<int32_t> budget_tokens;  // [num_kv_heads * num_segments]
  std::vector<uint8_t> rigid_head;     // [num_kv_heads]

  // Keys read by the plan and by full causal attention (per KV head summed), for work accounting.
  int64_t keys_read() const;
  int64_t keys_read_dense() const;
};

// Inputs of a prefill estimate for one layer: queries and keys after RoPE.
struct PrefillInputs {
  const float* queries = nullptr;  // [num_tokens, num_q_heads, head_dim], token-major
  const float* keys = nullptr;     // per KV head a slab [key_stride, head_dim]
  int64_t key_stride = 0;          // rows between KV heads in `keys`
  int64_t num_tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int layer = 0;
};

}  // namespace entropyinfer

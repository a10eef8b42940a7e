// A decode plan says, for one layer, which cache entries of each head survive the one-time
// compression.
#pragma once

#include <cstdint>
#include <vector>

namespace entropyinfer {

struct LayerDecodePlan {
  // One list per KV head (or per query head when DecodeParams::per_query_head), ascending cache
  // indices.
  std::vector<std::vector<int32_t>> kept;
  bool per_query_head = false;

  // Entries kept over all lists: the rows of K (and of V) the compressed cache stores, so the
  // per-query-head layout's memory cost (g times the per-KV-head one) can be reported.
  int64_t kept_entries() const {
    int64_t total = 0;
    for (const auto& list : kept) total += static_cast<int64_t>(list.size());
    return total;
  }
};

// Inputs of a compression decision for one layer.
struct DecodeInputs {
  // The observation window's queries after RoPE, [window_tokens, num_q_heads, head_dim], oldest
  // first; the last one is at the newest cache position.
  const float* window_queries = nullptr;
  int window_tokens = 0;
  const float* keys = nullptr;  // per KV head a slab [key_stride, head_dim]
  int64_t key_stride = 0;
  int64_t cache_length = 0;  // entries per head before compression (same for all heads)
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int layer = 0;
  int num_layers = 0;
};

}  // namespace entropyinfer

// Decode attention over compressed caches whose heads keep different numbers of entries.
#pragma once

#include <cstdint>

namespace entropyinfer::cpu {

struct CompressedDecodeShape {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  // false: one cache per KV head (kv_heads caches, GQA group q_heads / kv_heads shares one);
  // true: one cache per query head (q_heads caches), the released layout.
  bool per_query_head = false;
};

// One new query token per query head (q: [q_heads, head_dim]) over per-head caches: cache c holds
// lengths[c] rows of keys at key_heads[c] and values at value_heads[c], each [lengths[c],
// head_dim], rows contiguous. The new token's own key and value must already be appended. Every
// query sees all entries of its cache (they all precede it). out: [q_heads, head_dim]; a head whose
// cache is empty gets zeros.
void compressed_decode_attention(const float* q, const float* const* key_heads,
                                 const float* const* value_heads, const int64_t* lengths,
                                 const CompressedDecodeShape& shape, float* out);

}  // namespace entropyinfer::cpu

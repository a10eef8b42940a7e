// A decode-time cache for the tests of the decode policies: `length` keys per KV head and the
// observation window's queries. Shared by tests/test_decode_policies.cpp (CPU) and
// tests/gpu/test_cuda_decode_compression.cpp; each fills queries and keys with its own random
// values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/decode_plan.h"

namespace entropyinfer::decode_test {

struct DecodeCache {
  // The shape, without values: queries and keys are the caller's to fill.
  DecodeCache(int64_t cache_length, int window, int query_heads, int key_heads, int head_size,
              int64_t key_stride)
      : q_heads(query_heads),
        kv_heads(key_heads),
        head_dim(head_size),
        window_tokens(window),
        length(cache_length),
        stride(key_stride) {}

  size_t query_count() const { return static_cast<size_t>(window_tokens) * q_heads * head_dim; }
  size_t key_count() const { return static_cast<size_t>(kv_heads) * stride * head_dim; }

  DecodeInputs inputs(int layer = 0, int num_layers = 1) const {
    return DecodeInputs{.window_queries = queries.data(),
                        .window_tokens = window_tokens,
                        .keys = keys.data(),
                        .key_stride = stride,
                        .cache_length = length,
                        .num_q_heads = q_heads,
                        .num_kv_heads = kv_heads,
                        .head_dim = head_dim,
                        .layer = layer,
                        .num_layers = num_layers};
  }

  int q_heads = 0, kv_heads = 0, head_dim = 0, window_tokens = 0;
  // Rows per KV head in `keys`: more than `length`, so that reading past the cache reads other
  // values rather than the next head's.
  int64_t length = 0, stride = 0;
  std::vector<float> queries;  // [window_tokens, q_heads, head_dim]
  std::vector<float> keys;     // [kv_heads, stride, head_dim]
};

}  // namespace entropyinfer::decode_test

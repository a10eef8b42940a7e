#include "attention/prefill_plan.h"

#include <algorithm>

namespace entropyinfer {

// Both counts are (query, key) pairs per KV head, summed over KV heads: the attention work of one
// query head of each group. Full causal attention reads t + 1 keys for the query at position t.
int64_t LayerPrefillPlan::keys_read_dense() const {
  return static_cast<int64_t>(num_kv_heads) * num_tokens * (num_tokens + 1) / 2;
}

int64_t LayerPrefillPlan::keys_read() const {
  if (dense || num_segments == 0) return keys_read_dense();
  int64_t total = 0;
  for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
    for (int segment = 0; segment < num_segments; ++segment) {
      const int64_t start = static_cast<int64_t>(segment) * segment_size;
      const int64_t end = std::min<int64_t>(num_tokens, start + segment_size);
      const int64_t length = end - start;
      // Every query reads its own segment causally: 1 + 2 + ... + length.
      int64_t segment_total = length * (length + 1) / 2;
      if (segment_sparse[segment]) {
        const int row = kv_head * num_segments + segment;
        const int64_t blocks = row_offsets[row + 1] - row_offsets[row];
        segment_total +=
            length * blocks * block_size;  // selected blocks all lie before the segment
      } else {
        segment_total += length * start;
      }
      total += segment_total;
    }
  }
  return total;
}

}  // namespace entropyinfer

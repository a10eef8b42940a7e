#include "engine/prefill_work.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace entropyinfer {

PrefillWork::PrefillWork(const ModelConfig& config) {
  const double hidden = config.hidden_size;
  const double q = static_cast<double>(config.num_heads) * config.head_dim;
  const double kv = static_cast<double>(config.num_kv_heads) * config.head_dim;
  const double qkv = hidden * (q + 2 * kv);
  const double rest = q * hidden + 3.0 * hidden * config.intermediate_size;
  const double total = std::max(qkv + rest, 1.0);
  qkv_per_token_ = qkv / total;
  // q.k and p.v: head_dim multiply-adds each, per query head.
  per_key_ = 2.0 * q / total;
}

double PrefillWork::attention(int64_t first, int64_t end) const {
  if (end <= first) return 0;
  // Queries at positions first .. end-1 see first+1 .. end keys.
  const double a = static_cast<double>(first), b = static_cast<double>(end);
  return per_key_ * (b * (b + 1) - a * (a + 1)) / 2;
}

double PrefillWork::sparse_attention(std::span<const uint8_t> segment_sparse,
                                     std::span<const int32_t> row_offsets, int kv_heads,
                                     int segment_size, int block_size, int64_t first,
                                     int64_t end) const {
  const int64_t segments = static_cast<int64_t>(segment_sparse.size());
  if (kv_heads <= 0 || segment_size <= 0 || block_size <= 0 ||
      static_cast<int64_t>(row_offsets.size()) != kv_heads * segments + 1 ||
      end > segments * segment_size) {
    throw Error("prefill work: a plan of " + std::to_string(segments) + " segments and " +
                std::to_string(row_offsets.size()) +
                " row offsets does not describe queries up to " + std::to_string(end) + " over " +
                std::to_string(kv_heads) + " KV heads");
  }
  double pairs = 0;  // (query, key) pairs summed over KV heads, each for its group's query heads
  for (int64_t begin = first; begin < end;) {
    const int64_t segment = begin / segment_size;
    const int64_t start = segment * segment_size;
    const int64_t stop = std::min(end, start + segment_size);
    const double queries = static_cast<double>(stop - begin);
    if (segment_sparse[static_cast<size_t>(segment)] == 0) {
      pairs += kv_heads * attention(begin, stop) / per_key_;
    } else {
      // Own-segment keys: the query at p reads p - start + 1 of them.
      const double a = static_cast<double>(begin - start), b = static_cast<double>(stop - start);
      const double own = (b * (b + 1) - a * (a + 1)) / 2;
      for (int head = 0; head < kv_heads; ++head) {
        const int64_t row = head * segments + segment;
        const double selected = static_cast<double>(row_offsets[static_cast<size_t>(row + 1)] -
                                                    row_offsets[static_cast<size_t>(row)]) *
                                block_size;
        pairs += queries * selected + own;
      }
    }
    begin = stop;
  }
  return pairs * per_key_ / kv_heads;
}

double PrefillWork::layer(int64_t tokens) const {
  return static_cast<double>(tokens) + attention(0, tokens);
}

}  // namespace entropyinfer

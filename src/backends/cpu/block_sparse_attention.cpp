#include "backends/cpu/block_sparse_attention.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/attention_tile.h"
#include "core/error.h"

namespace entropyinfer::cpu {
namespace {

void check_plan(const AttentionShape& shape, const LayerPrefillPlan& plan) {
  if (shape.first_position != 0 || shape.window != 0) {
    throw Error("block-sparse attention runs a whole prompt: first_position and window must be 0");
  }
  if (shape.kv_heads <= 0 || shape.q_heads % shape.kv_heads != 0) {
    throw Error("block-sparse attention: query heads must be a multiple of KV heads");
  }
  if (plan.dense) return;
  const std::string prefix = "block-sparse attention: the plan ";
  if (plan.num_tokens != shape.tokens || plan.num_kv_heads != shape.kv_heads) {
    throw Error(prefix + "describes " + std::to_string(plan.num_tokens) + " tokens and " +
                std::to_string(plan.num_kv_heads) + " KV heads, the call " +
                std::to_string(shape.tokens) + " and " + std::to_string(shape.kv_heads));
  }
  if (plan.segment_size <= 0 || plan.block_size <= 0 ||
      plan.num_segments != (plan.num_tokens + plan.segment_size - 1) / plan.segment_size ||
      static_cast<int64_t>(plan.segment_sparse.size()) != plan.num_segments ||
      static_cast<int64_t>(plan.row_offsets.size()) !=
          static_cast<int64_t>(plan.num_kv_heads) * plan.num_segments + 1 ||
      plan.row_offsets.back() != static_cast<int32_t>(plan.block_indices.size())) {
    throw Error(prefix + "has inconsistent segment or row sizes");
  }
  for (int kv_head = 0; kv_head < plan.num_kv_heads; ++kv_head) {
    for (int segment = 0; segment < plan.num_segments; ++segment) {
      const int row = kv_head * plan.num_segments + segment;
      const int64_t start = static_cast<int64_t>(segment) * plan.segment_size;
      if (plan.row_offsets[row] > plan.row_offsets[row + 1]) {
        throw Error(prefix + "has decreasing row offsets");
      }
      for (int32_t k = plan.row_offsets[row]; k < plan.row_offsets[row + 1]; ++k) {
        const int64_t block = plan.block_indices[k];
        if (block < 0 || (block + 1) * plan.block_size > start) {
          throw Error(prefix + "selects block " + std::to_string(block) + " for segment " +
                      std::to_string(segment) + ", which does not end before the segment");
        }
      }
    }
  }
}

}  // namespace

int64_t block_sparse_attention(const float* q, const float* key_cache, const float* value_cache,
                               const AttentionShape& shape, const LayerPrefillPlan& plan,
                               float* out) {
  check_plan(shape, plan);
  if (plan.dense) {
    causal_attention(q, key_cache, value_cache, shape, out);
    return static_cast<int64_t>(shape.kv_heads) * shape.tokens * (shape.tokens + 1) / 2;
  }
  const int64_t group = shape.q_heads / shape.kv_heads;
  const int64_t head_dim = shape.head_dim;
  const int64_t segments = plan.num_segments;
  // Each segment's queries in the tiles causal_attention uses (consecutive tokens times the KV
  // head's query group), so sparse and dense attention run the same kernel and read each selected
  // key once per tile.
  const int64_t tile_tokens = attention_tile_tokens(group);
  const int64_t segment_tiles = (plan.segment_size + tile_tokens - 1) / tile_tokens;
  const int64_t items = segments * shape.kv_heads * segment_tiles;
  int64_t keys_read = 0;
#pragma omp parallel reduction(+ : keys_read)
  {
    AttentionTileState state;
    std::vector<KeyRange> ranges;
    // Late dense segments cost the most; handing items out last segment first balances the cores.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t segment = segments - 1 - item / (shape.kv_heads * segment_tiles);
      const int64_t kv_head = item / segment_tiles % shape.kv_heads;
      const int64_t start = segment * plan.segment_size;
      const int64_t end = std::min<int64_t>(shape.tokens, start + plan.segment_size);
      const int64_t first_token = start + item % segment_tiles * tile_tokens;
      if (first_token >= end) continue;  // past the end of a short last segment
      const int64_t tokens = std::min(tile_tokens, end - first_token);
      // Keys before the segment: the selected blocks (adjacent ones merged) or everything.
      ranges.clear();
      if (plan.segment_sparse[segment]) {
        const int64_t row = kv_head * segments + segment;
        for (int32_t k = plan.row_offsets[row]; k < plan.row_offsets[row + 1]; ++k) {
          const int64_t first = static_cast<int64_t>(plan.block_indices[k]) * plan.block_size;
          if (!ranges.empty() && ranges.back().first + ranges.back().count == first) {
            ranges.back().count += plan.block_size;
          } else {
            ranges.push_back({first, plan.block_size});
          }
        }
      } else if (start > 0) {
        ranges.push_back({0, start});
      }
      // The segment's own keys up to the tile's last query; the tile masks them causally.
      ranges.push_back({start, first_token + tokens - start});
      const QueryTile tile = attention_query_tile(q, shape, first_token, tokens, kv_head);
      const int64_t kv_offset = kv_head * shape.cache_stride * head_dim;
      begin_attention_tile(tile, state);
      for (const KeyRange& range : ranges) {
        attend_key_range(key_cache + kv_offset, value_cache + kv_offset, range, state);
      }
      // Every token of the tile saw the earlier ranges whole and the last one up to itself.
      for (size_t r = 0; r + 1 < ranges.size(); ++r) keys_read += tokens * ranges[r].count;
      keys_read += tokens * (first_token - start) + tokens * (tokens + 1) / 2;
      finish_attention_tile(state, group, out + attention_tile_offset(shape, first_token, kv_head),
                            tile.token_stride);
    }
  }
  return keys_read;
}

}  // namespace entropyinfer::cpu

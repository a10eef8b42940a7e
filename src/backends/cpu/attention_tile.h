// FlashAttention-style tiles for the CPU attention kernels. A tile is a run of consecutive query
// tokens times the query heads of one GQA group, which share one KV head: its keys and values are
// read once per tile instead of once per query and head, and an online softmax (running max and
// sum per row, the output rescaled when the max grows) means no score row over the whole context is
// ever stored.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_ops.h"

namespace entropyinfer::cpu {

// A run of consecutive key positions [first, first + count).
struct KeyRange {
  int64_t first = 0;
  int64_t count = 0;
};

// The queries of one tile. Row r of the tile is token r / heads, head r % heads.
struct QueryTile {
  const float* queries = nullptr;  // token 0's first head of the group
  int64_t token_stride = 0;        // floats from one token's queries to the next's
  int64_t tokens = 0;
  int64_t heads = 0;  // consecutive query heads that share the KV head
  int64_t head_dim = 0;
  // Token t sits at position first_position + t and sees keys up to that position; with window >
  // 0, only the last `window` of them.
  int64_t first_position = 0;
  int64_t window = 0;
  float scale = 0.0f;
};

// Query tokens per tile for GQA groups of `heads` query heads: about 96 rows, enough to reuse each
// key and value many times, few enough that the tile's queries, one key block's scores and the
// outputs stay in L1/L2.
int64_t attention_tile_tokens(int64_t heads);

// Tokens first_token .. first_token + tokens - 1 of the query heads that share KV head kv_head, for
// q laid out as cpu::causal_attention's ([tokens, q_heads, head_dim], query t at position
// shape.first_position + t).
QueryTile attention_query_tile(const float* q, const AttentionShape& shape, int64_t first_token,
                               int64_t tokens, int64_t kv_head);

// Floats from the start of q (or out) to the tile's first row.
int64_t attention_tile_offset(const AttentionShape& shape, int64_t first_token, int64_t kv_head);

// A tile's scratch and running softmax state; keep one per thread and reuse it (it grows to the
// largest tile). After attend_key_range calls, row r's unnormalised output is output[r * head_dim
// ...], its running max row_max[r] (-infinity while it has seen no visible key) and its sum of
// exponentials row_sum[r]: what split-key callers combine.
struct AttentionTileState {
  int64_t rows = 0;
  int64_t padded_rows = 0;  // rows rounded up to whole vectors
  int64_t head_dim = 0;
  bool rows_in_lanes = false;      // scores computed with rows along vector lanes (rows >= 8)
  std::vector<float> queries;      // scaled; [head_dim][padded_rows] or, few rows, [rows][head_dim]
  std::vector<float> scores;       // one key block: [key][padded_rows]
  std::vector<float> row_max;      // [padded_rows]
  std::vector<float> row_sum;      // [padded_rows]
  std::vector<float> rescale;      // [padded_rows], this block's factor for the earlier output
  std::vector<float> output;       // [rows][head_dim]
  std::vector<int32_t> first_key;  // [padded_rows], the first key position each row sees
  std::vector<int32_t> last_key;   // [padded_rows], the last one
  int64_t earliest_first_key = 0, latest_first_key = 0;
  int64_t earliest_last_key = 0, latest_last_key = 0;
};

// Loads the tile's queries and resets its softmax state.
void begin_attention_tile(const QueryTile& tile, AttentionTileState& state);

// Folds keys range.first .. range.first + range.count - 1 into the tile, masking per row the keys
// it does not see (after its position, or outside its window). keys and values are the KV head's
// [position, head_dim] rows. Ranges may come in any order and must not overlap.
void attend_key_range(const float* keys, const float* values, KeyRange range,
                      AttentionTileState& state);

// Writes the softmax-normalised output of every row to out + token * out_token_stride + head *
// head_dim. Every row must have seen at least one key.
void finish_attention_tile(const AttentionTileState& state, int64_t heads, float* out,
                           int64_t out_token_stride);

// Split keys: a tile may attend to its keys in parts, each begun afresh; a part's state is saved
// as [rows maxima, rows sums, rows x head_dim outputs] (rows * (head_dim + 2) floats) and the parts
// combined into the softmax over all of them, written like finish_attention_tile. A part of which a
// row sees no key weighs nothing for that row; every row must see a key in some part.
void save_attention_part(const AttentionTileState& state, float* part);
void combine_attention_parts(const float* parts, int64_t count, int64_t part_stride, int64_t tokens,
                             int64_t heads, int64_t head_dim, float* out, int64_t out_token_stride);

}  // namespace entropyinfer::cpu

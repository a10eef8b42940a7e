#include "backends/cpu/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/simd.h"

// The vector helpers below return vectors; they are always inlined into the cloned kernel, so the
// ABI difference GCC warns about between the AVX and the portable clone never arises.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace entropyinfer::cpu {
namespace {

// Keys per block: the block's scores ([64 keys][about 96 rows]) and its keys and values stay in
// L1/L2 while every row of the tile uses them (64 measured a little faster than 128 or 256).
constexpr int64_t kKeyBlock = 64;
constexpr int kLanes = 8;
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Scores of `Keys` consecutive keys against 8 * RowVectors rows that lie along the vector lanes:
// each step of d broadcasts one key element and multiplies it into whole vectors of queries, so the
// sums need no horizontal reduction. queries is [head_dim][padded_rows].
template <int Keys, int RowVectors>
[[gnu::always_inline]] inline void score_rows_in_lanes(const float* queries, int64_t padded_rows,
                                                       int64_t row0, const float* keys,
                                                       int64_t head_dim, float* scores) {
  Float8 acc[Keys][RowVectors] = {};
  for (int64_t d = 0; d < head_dim; ++d) {
    Float8 query[RowVectors];
    for (int v = 0; v < RowVectors; ++v) query[v] = load8(queries + d * padded_rows + row0 + 8 * v);
    for (int k = 0; k < Keys; ++k) {
      const float key = keys[k * head_dim + d];
      for (int v = 0; v < RowVectors; ++v) acc[k][v] += query[v] * key;
    }
  }
  for (int k = 0; k < Keys; ++k) {
    for (int v = 0; v < RowVectors; ++v) store8(scores + k * padded_rows + row0 + 8 * v, acc[k][v]);
  }
}

// 4 keys x 3 row vectors keeps 12 accumulators, 3 query vectors and one broadcast in the 16 AVX
// registers.
template <int Keys>
[[gnu::always_inline]] inline void score_keys_in_lanes(const AttentionTileState& state,
                                                       const float* keys, float* scores) {
  const int64_t vectors = state.padded_rows / kLanes;
  int64_t v = 0;
  for (; v + 3 <= vectors; v += 3) {
    score_rows_in_lanes<Keys, 3>(state.queries.data(), state.padded_rows, v * kLanes, keys,
                                 state.head_dim, scores);
  }
  if (vectors - v == 2) {
    score_rows_in_lanes<Keys, 2>(state.queries.data(), state.padded_rows, v * kLanes, keys,
                                 state.head_dim, scores);
  } else if (vectors - v == 1) {
    score_rows_in_lanes<Keys, 1>(state.queries.data(), state.padded_rows, v * kLanes, keys,
                                 state.head_dim, scores);
  }
}

// Scores of one query row against `Keys` consecutive keys, as dot products along head_dim with one
// accumulator per key; scores[k * score_stride] receives key k's.
template <int Keys>
[[gnu::always_inline]] inline void score_row_by_dots(const float* query, const float* keys,
                                                     int64_t head_dim, float* scores,
                                                     int64_t score_stride) {
  Float8 acc[Keys] = {};
  int64_t d = 0;
  for (; d + kLanes <= head_dim; d += kLanes) {
    const Float8 q = load8(query + d);
    for (int k = 0; k < Keys; ++k) acc[k] += load8(keys + k * head_dim + d) * q;
  }
  for (int k = 0; k < Keys; ++k) {
    float sum = horizontal_sum8(acc[k]);
    for (int64_t tail = d; tail < head_dim; ++tail) sum += query[tail] * keys[k * head_dim + tail];
    scores[k * score_stride] = sum;
  }
}

// scores[j][r] = q_r . k_j for the block's keys (the scale is folded into the queries).
[[gnu::always_inline]] inline void score_block(const AttentionTileState& state, const float* keys,
                                               int64_t count, float* scores) {
  const int64_t head_dim = state.head_dim;
  if (state.rows_in_lanes) {
    int64_t j = 0;
    for (; j + 4 <= count; j += 4) {
      score_keys_in_lanes<4>(state, keys + j * head_dim, scores + j * state.padded_rows);
    }
    for (; j < count; ++j) {
      score_keys_in_lanes<1>(state, keys + j * head_dim, scores + j * state.padded_rows);
    }
    return;
  }
  // Fewer rows than lanes (decode): dot products along head_dim, four keys at a time; the padding
  // lanes score 0 so that their softmax stays finite.
  for (int64_t j = 0; j < count; ++j) {
    std::fill(scores + j * state.padded_rows + state.rows, scores + (j + 1) * state.padded_rows,
              0.0f);
  }
  for (int64_t r = 0; r < state.rows; ++r) {
    const float* query = state.queries.data() + r * head_dim;
    int64_t j = 0;
    for (; j + 4 <= count; j += 4)
      score_row_by_dots<4>(query, keys + j * head_dim, head_dim, scores + j * state.padded_rows + r,
                           state.padded_rows);
    for (; j < count; ++j)
      score_row_by_dots<1>(query, keys + j * head_dim, head_dim, scores + j * state.padded_rows + r,
                           state.padded_rows);
  }
}

// Sets the scores of keys a row does not see to -infinity.
[[gnu::always_inline]] inline void mask_block(const AttentionTileState& state, int64_t first,
                                              int64_t count, float* scores) {
  for (int64_t v = 0; v < state.padded_rows; v += kLanes) {
    const Int8 first_key = *reinterpret_cast<const Int8*>(state.first_key.data() + v);
    const Int8 last_key = *reinterpret_cast<const Int8*>(state.last_key.data() + v);
    for (int64_t j = 0; j < count; ++j) {
      const Int8 key = splat8i(static_cast<int32_t>(first + j));
      float* lanes = scores + j * state.padded_rows + v;
      store8(lanes, (key < first_key) | (key > last_key) ? splat8(kMinusInfinity) : load8(lanes));
    }
  }
}

// Online softmax over one block: the running max grows to cover the block, the block's scores
// become exponentials relative to it, the running sums absorb them and `rescale` holds the factor
// that brings the earlier output to the new max.
[[gnu::always_inline]] inline void softmax_block(AttentionTileState& state, int64_t count,
                                                 float* scores) {
  for (int64_t v = 0; v < state.padded_rows; v += kLanes) {
    Float8 block_max = splat8(kMinusInfinity);
    for (int64_t j = 0; j < count; ++j) {
      block_max = max8(block_max, load8(scores + j * state.padded_rows + v));
    }
    const Float8 old_max = load8(state.row_max.data() + v);
    const Float8 new_max = max8(old_max, block_max);
    // A row that has seen no visible key yet keeps max -infinity; measuring from 0 instead keeps
    // its exponentials 0 rather than NaN.
    const Float8 reference = new_max == splat8(kMinusInfinity) ? splat8(0.0f) : new_max;
    Float8 sum = splat8(0.0f);
    for (int64_t j = 0; j < count; ++j) {
      float* lanes = scores + j * state.padded_rows + v;
      const Float8 weight = exp8(load8(lanes) - reference);
      store8(lanes, weight);
      sum += weight;
    }
    const Float8 rescale = exp8(old_max - reference);
    store8(state.rescale.data() + v, rescale);
    store8(state.row_sum.data() + v, load8(state.row_sum.data() + v) * rescale + sum);
    store8(state.row_max.data() + v, new_max);
  }
}

// output[r][d0 ..] = rescale[r] * output[r][d0 ..] + sum_j weights[j][r] * values[j][d0 ..] for
// Rows rows and 8 * DVectors dimensions; 4 x 3 fills the 16 AVX registers like the scores.
template <int Rows, int DVectors>
[[gnu::always_inline]] inline void accumulate_values(AttentionTileState& state, int64_t row0,
                                                     int64_t d0, const float* values, int64_t count,
                                                     const float* weights) {
  const int64_t head_dim = state.head_dim;
  Float8 acc[Rows][DVectors];
  for (int i = 0; i < Rows; ++i) {
    const float rescale = state.rescale[row0 + i];
    for (int v = 0; v < DVectors; ++v) {
      acc[i][v] = load8(state.output.data() + (row0 + i) * head_dim + d0 + 8 * v) * rescale;
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    Float8 value[DVectors];
    for (int v = 0; v < DVectors; ++v) value[v] = load8(values + j * head_dim + d0 + 8 * v);
    for (int i = 0; i < Rows; ++i) {
      const float weight = weights[j * state.padded_rows + row0 + i];
      for (int v = 0; v < DVectors; ++v) acc[i][v] += value[v] * weight;
    }
  }
  for (int i = 0; i < Rows; ++i) {
    for (int v = 0; v < DVectors; ++v) {
      store8(state.output.data() + (row0 + i) * head_dim + d0 + 8 * v, acc[i][v]);
    }
  }
}

template <int Rows>
[[gnu::always_inline]] inline void accumulate_rows(AttentionTileState& state, int64_t row0,
                                                   const float* values, int64_t count,
                                                   const float* weights) {
  const int64_t head_dim = state.head_dim;
  const int64_t vectors = head_dim / kLanes;
  int64_t v = 0;
  for (; v + 3 <= vectors; v += 3)
    accumulate_values<Rows, 3>(state, row0, v * kLanes, values, count, weights);
  if (vectors - v == 2) {
    accumulate_values<Rows, 2>(state, row0, v * kLanes, values, count, weights);
  } else if (vectors - v == 1) {
    accumulate_values<Rows, 1>(state, row0, v * kLanes, values, count, weights);
  }
  // Dimensions past the last whole vector (head sizes that are not a multiple of 8).
  for (int i = 0; i < Rows; ++i) {
    float* output = state.output.data() + (row0 + i) * head_dim;
    const float rescale = state.rescale[row0 + i];
    for (int64_t d = vectors * kLanes; d < head_dim; ++d) {
      float sum = output[d] * rescale;
      for (int64_t j = 0; j < count; ++j)
        sum += weights[j * state.padded_rows + row0 + i] * values[j * head_dim + d];
      output[d] = sum;
    }
  }
}

[[gnu::always_inline]] inline void accumulate_block(AttentionTileState& state, const float* values,
                                                    int64_t count, const float* weights) {
  int64_t r = 0;
  for (; r + 4 <= state.rows; r += 4) accumulate_rows<4>(state, r, values, count, weights);
  if (state.rows - r >= 2) {
    accumulate_rows<2>(state, r, values, count, weights);
    r += 2;
  }
  if (r < state.rows) accumulate_rows<1>(state, r, values, count, weights);
}

}  // namespace

int64_t attention_tile_tokens(int64_t heads) {
  constexpr int64_t kTileRows = 96;
  return std::max<int64_t>(1, kTileRows / std::max<int64_t>(1, heads));
}

int64_t attention_tile_offset(const AttentionShape& shape, int64_t first_token, int64_t kv_head) {
  const int64_t group = shape.q_heads / shape.kv_heads;
  return (first_token * shape.q_heads + kv_head * group) * shape.head_dim;
}

QueryTile attention_query_tile(const float* q, const AttentionShape& shape, int64_t first_token,
                               int64_t tokens, int64_t kv_head) {
  QueryTile tile;
  tile.queries = q + attention_tile_offset(shape, first_token, kv_head);
  tile.token_stride = shape.q_heads * shape.head_dim;
  tile.tokens = tokens;
  tile.heads = shape.q_heads / shape.kv_heads;
  tile.head_dim = shape.head_dim;
  tile.first_position = shape.first_position + first_token;
  tile.window = shape.window;
  tile.scale = shape.scale;
  return tile;
}

void begin_attention_tile(const QueryTile& tile, AttentionTileState& state) {
  const int64_t rows = tile.tokens * tile.heads;
  const int64_t head_dim = tile.head_dim;
  state.rows = rows;
  state.head_dim = head_dim;
  state.rows_in_lanes = rows >= kLanes;
  state.padded_rows = (rows + kLanes - 1) / kLanes * kLanes;
  if (state.rows_in_lanes) {
    state.queries.assign(static_cast<size_t>(head_dim * state.padded_rows), 0.0f);
  } else {
    state.queries.resize(static_cast<size_t>(rows * head_dim));
  }
  state.first_key.resize(static_cast<size_t>(state.padded_rows));
  state.last_key.resize(static_cast<size_t>(state.padded_rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t token = r / tile.heads;
    const float* query = tile.queries + token * tile.token_stride + (r % tile.heads) * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) {
      const float scaled = query[d] * tile.scale;
      if (state.rows_in_lanes) {
        state.queries[d * state.padded_rows + r] = scaled;
      } else {
        state.queries[r * head_dim + d] = scaled;
      }
    }
    const int64_t position = tile.first_position + token;
    state.last_key[r] = static_cast<int32_t>(position);
    state.first_key[r] = static_cast<int32_t>(
        tile.window > 0 ? std::max<int64_t>(0, position - tile.window + 1) : 0);
  }
  // Padding rows see every key; their scores are 0 and their outputs are never written.
  for (int64_t r = rows; r < state.padded_rows; ++r) {
    state.first_key[r] = 0;
    state.last_key[r] = std::numeric_limits<int32_t>::max();
  }
  state.earliest_first_key = state.first_key[0];
  state.latest_first_key = state.first_key[rows - 1];
  state.earliest_last_key = state.last_key[0];
  state.latest_last_key = state.last_key[rows - 1];
  state.scores.resize(static_cast<size_t>(kKeyBlock * state.padded_rows));
  state.row_max.assign(static_cast<size_t>(state.padded_rows), kMinusInfinity);
  state.row_sum.assign(static_cast<size_t>(state.padded_rows), 0.0f);
  state.rescale.resize(static_cast<size_t>(state.padded_rows));
  state.output.assign(static_cast<size_t>(rows * head_dim), 0.0f);
}

ENTROPYINFER_SIMD_CLONES void attend_key_range(const float* keys, const float* values,
                                               KeyRange range, AttentionTileState& state) {
  const int64_t head_dim = state.head_dim;
  // Keys no row sees (before every window or after every position) are never read.
  const int64_t begin = std::max(range.first, state.earliest_first_key);
  const int64_t end = std::min(range.first + range.count, state.latest_last_key + 1);
  float* scores = state.scores.data();
  for (int64_t first = begin; first < end; first += kKeyBlock) {
    const int64_t count = std::min(kKeyBlock, end - first);
    score_block(state, keys + first * head_dim, count, scores);
    // Only blocks that cross the causal diagonal or a window edge need a mask.
    if (first < state.latest_first_key || first + count - 1 > state.earliest_last_key) {
      mask_block(state, first, count, scores);
    }
    softmax_block(state, count, scores);
    accumulate_block(state, values + first * head_dim, count, scores);
  }
}

void finish_attention_tile(const AttentionTileState& state, int64_t heads, float* out,
                           int64_t out_token_stride) {
  for (int64_t r = 0; r < state.rows; ++r) {
    const float inverse_sum = 1.0f / state.row_sum[r];
    const float* output = state.output.data() + r * state.head_dim;
    float* result = out + (r / heads) * out_token_stride + (r % heads) * state.head_dim;
    for (int64_t d = 0; d < state.head_dim; ++d) result[d] = output[d] * inverse_sum;
  }
}

void save_attention_part(const AttentionTileState& state, float* part) {
  std::copy_n(state.row_max.data(), state.rows, part);
  std::copy_n(state.row_sum.data(), state.rows, part + state.rows);
  std::copy_n(state.output.data(), state.rows * state.head_dim, part + 2 * state.rows);
}

void combine_attention_parts(const float* parts, int64_t count, int64_t part_stride, int64_t tokens,
                             int64_t heads, int64_t head_dim, float* out,
                             int64_t out_token_stride) {
  const int64_t rows = tokens * heads;
  for (int64_t r = 0; r < rows; ++r) {
    float largest = kMinusInfinity;
    for (int64_t p = 0; p < count; ++p) largest = std::max(largest, parts[p * part_stride + r]);
    float* result = out + (r / heads) * out_token_stride + (r % heads) * head_dim;
    std::fill(result, result + head_dim, 0.0f);
    float sum = 0.0f;
    for (int64_t p = 0; p < count; ++p) {
      const float* part = parts + p * part_stride;
      if (part[r] == kMinusInfinity) continue;
      const float weight = std::exp(part[r] - largest);
      sum += weight * part[rows + r];
      const float* output = part + 2 * rows + r * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) result[d] += weight * output[d];
    }
    const float inverse_sum = 1.0f / sum;
    for (int64_t d = 0; d < head_dim; ++d) result[d] *= inverse_sum;
  }
}

}  // namespace entropyinfer::cpu
